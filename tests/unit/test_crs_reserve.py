"""Reserve's failure paths inside the CRS (in-process: the managers' side is stood in for)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from sqlalchemy import select

from cross_resource_scheduler import service as crs_service
from cross_resource_scheduler.models import Compensation, Manager, Reservation
from cross_resource_scheduler.registry import ManagerState
from cross_resource_scheduler.service import Crs, CrsConfig
from harness.v1 import common_pb2, irm_pb2
from services.errors import Aborted, Unavailable
from tests.unit.test_crs_service_parse import _group, _specs


def make_crs(tmp_path, clock=None, **config) -> Crs:  # type: ignore[no-untyped-def]
    """A CRS whose view holds one 8-core, 32 GB host `h0` of manager `m` (the specs stood in)."""
    c = Crs(CrsConfig(state_dir=str(tmp_path), **config), clock)
    specs = _specs()
    c._specs = lambda: specs  # type: ignore[method-assign]
    c.view.upsert("m", common_pb2.PhysicalResource(
        id="h0", resource_type="vm", capacity={"cores": 8, "memory_gb": 32}, used={"cores": 0, "memory_gb": 0},
        location=common_pb2.Location(site="s", rack="r", host="h0"), generation=1))
    return c


@pytest.fixture
def crs(tmp_path) -> Iterator[Crs]:
    c = make_crs(tmp_path)
    yield c
    c.db.dispose()


def _activation_fails(crs: Crs, monkeypatch) -> None:
    """The CRS's database refuses the activation (and only it)."""
    real_execute = crs.db.execute

    def execute(prepared, params, attempts=8):  # type: ignore[no-untyped-def]
        if prepared is crs_service._ACTIVATE:
            raise Unavailable("the database went away")
        return real_execute(prepared, params, attempts)

    monkeypatch.setattr(crs.db, "execute", execute)


def test_a_reservation_the_crs_cannot_record_is_given_back_at_the_managers(crs: Crs, monkeypatch) -> None:
    delegated: list[str] = []
    undone: list[tuple[str, str, str]] = []

    def delegate(tenant, res_id, attempt, pinned, index):  # type: ignore[no-untyped-def]
        delegated.append(res_id)
        group = irm_pb2.AllocatedGroup(name="g", manager="m", manager_reservation_id="irm-1")
        return [group], [], {}

    crs._delegate = delegate  # type: ignore[method-assign]
    crs._undo_or_remember = lambda m, t, rid, in_doubt=False: undone.append((m, t, rid))  # type: ignore[method-assign]
    _activation_fails(crs, monkeypatch)
    with pytest.raises(Unavailable):
        crs.Reserve(irm_pb2.ReserveRequest(tenant="t", request_id="r1", groups=[_group(2)]), None)
    assert len(delegated) == 1
    # What manager m holds for it is released (or remembered for retry), and no row is left.
    assert undone == [("m", "t", crs_service.irm_request_id(delegated[0], 0, "m"))]
    with crs.db.read() as s:
        assert list(s.scalars(select(Reservation))) == []


def _two_managers(crs: Crs) -> None:
    crs.view.upsert("n", common_pb2.PhysicalResource(
        id="h1", resource_type="vm", capacity={"cores": 8, "memory_gb": 32}, used={"cores": 0, "memory_gb": 0},
        location=common_pb2.Location(site="s", rack="r", host="h1"), generation=1))


def _delegating(crs: Crs, delegated: list[str]) -> None:
    def delegate(tenant, res_id, attempt, pinned, index):  # type: ignore[no-untyped-def]
        delegated.append(res_id)
        return [irm_pb2.AllocatedGroup(name=g.name, manager=m, manager_reservation_id=f"irm-{m}")
                for m, parts in pinned.items() for g in parts], [], {}

    crs._delegate = delegate  # type: ignore[method-assign]


def test_an_activation_that_landed_although_its_commit_answer_was_lost_keeps_its_parts(crs: Crs, monkeypatch) -> None:
    delegated: list[str] = []
    undone: list[str] = []
    _delegating(crs, delegated)
    crs._undo_or_remember = lambda m, t, rid, in_doubt=False: undone.append(m)  # type: ignore[method-assign]
    real_execute = crs.db.execute

    def execute(prepared, params, attempts=8):  # type: ignore[no-untyped-def]
        out = real_execute(prepared, params, attempts)
        if prepared is crs_service._ACTIVATE:
            raise Unavailable("connection lost while committing")  # ... after the commit landed
        return out

    monkeypatch.setattr(crs.db, "execute", execute)
    with pytest.raises(Unavailable):
        crs.Reserve(irm_pb2.ReserveRequest(tenant="t", request_id="r1", groups=[_group(2)]), None)
    assert undone == []  # it is active: nothing is taken from under it
    again = crs.Reserve(irm_pb2.ReserveRequest(tenant="t", request_id="r1", groups=[_group(2)]), None)
    assert again.id == delegated[0] and again.state == irm_pb2.Reservation.STATE_ACTIVE


def test_one_part_that_cannot_be_given_back_does_not_keep_the_others(crs: Crs, monkeypatch) -> None:
    _two_managers(crs)
    delegated: list[str] = []
    undone: list[str] = []
    _delegating(crs, delegated)
    original_place = crs._place

    def spread(req, priority, token, **kw):  # type: ignore[no-untyped-def]
        placement = original_place(req, priority, token, **kw)
        assert {n.manager for nodes in placement.nodes.values() for n in nodes} == {"m", "n"}
        return placement

    crs._place = spread  # type: ignore[method-assign]

    def undo(m, t, rid, in_doubt=False):  # type: ignore[no-untyped-def]
        if m == "m":
            raise RuntimeError("the compensation table is unreachable too")
        undone.append(m)

    crs._undo_or_remember = undo  # type: ignore[method-assign]
    _activation_fails(crs, monkeypatch)
    request = irm_pb2.ReserveRequest(tenant="t", request_id="r2", groups=[_group(6, count=2)], constraints=[
        irm_pb2.GroupConstraint(expression="different_host(g, g)")])
    with pytest.raises(Unavailable):
        crs.Reserve(request, None)
    assert undone == ["n"]


def test_a_reservation_left_pending_by_a_crash_is_looked_for_under_every_id_its_parts_may_have(tmp_path) -> None:
    # Which manager and which attempt it reached is unknown: every attempt's id, and the one id parts had
    # before ids were per attempt, at every known manager.
    db_path = str(tmp_path)
    first = Crs(CrsConfig(state_dir=db_path, place_attempts=2))
    first.db.transact(lambda s: (s.add(Manager(name="m", address="127.0.0.1:1", resource_types=["vm"],
                                               registered_at=0.0)),
                                 s.add(Reservation(id="crs-x", tenant="t", request_id="r", state="pending",
                                                   priority=0, price_per_minute=0.0, created_at=0.0,
                                                   released_at=0.0, allocation=b"", notes=[]))))
    first.db.dispose()
    again = Crs(CrsConfig(state_dir=db_path, place_attempts=2))
    try:
        again._recover()                                                # what start() does first
        with again.db.read() as s:
            asked = sorted(c.irm_request_id for c in s.scalars(select(Compensation)))
            assert list(s.scalars(select(Reservation))) == []
        assert asked == sorted([*(crs_service.irm_request_id("crs-x", a, "m") for a in range(8)), "crs-x@m"])
    finally:
        again.db.dispose()


def test_the_rows_of_a_manager_that_is_down_do_not_crowd_out_the_others(crs: Crs) -> None:
    # 23 releases whose manager did not answer leave 9 ids each: more than one round's 200 rows.
    for i in range(23):
        for rid in crs_service.part_request_ids(f"r{i}", "down", crs._attempts()):
            crs._remember("down", "t", rid)
    crs._remember("up", "t", "r99#0@up")          # e.g. an in-doubt Reserve holding devices at a healthy manager
    crs.registry.managers.update({
        "down": ManagerState("down", "127.0.0.1:1", ["vm"], 0.0, up=False),
        "up": ManagerState("up", "127.0.0.1:2", ["vm"], 0.0, up=True)})
    asked: list[str] = []
    crs.compensator.undo = lambda m, t, rid: asked.append(m) or "released"  # type: ignore[method-assign]
    crs._compensate_pending()
    assert asked == ["up"]
    with crs.db.read() as s:
        assert {c.manager for c in s.scalars(select(Compensation))} == {"down"}


class _GoneAfterDelegation:
    """A gRPC context whose caller leaves once the parts are delegated (its deadline passed meanwhile)."""

    def __init__(self) -> None:
        self.delegated = False

    def is_active(self) -> bool:
        return not self.delegated


def test_a_caller_gone_after_delegation_has_its_parts_given_back_even_if_the_database_fails(crs: Crs,
                                                                                            monkeypatch) -> None:
    # Never activated, so there is nothing to tell first: the parts go back whatever the database says (the
    # "cannot tell" of a failed activation would leave them held with no row naming them).
    context = _GoneAfterDelegation()
    delegated: list[str] = []
    _delegating(crs, delegated)
    inner = crs._delegate

    def delegate(*a):  # type: ignore[no-untyped-def]
        out = inner(*a)
        context.delegated = True
        return out

    crs._delegate = delegate  # type: ignore[method-assign]
    undone: list[tuple[str, str, str]] = []
    crs._undo_or_remember = lambda m, t, rid, in_doubt=False: undone.append((m, t, rid))  # type: ignore[method-assign]
    monkeypatch.setattr(crs.db, "fetch", lambda *a, **k: (_ for _ in ()).throw(Unavailable("the database went away")))
    with pytest.raises(Aborted, match="went away while its parts were reserved"):
        crs.Reserve(irm_pb2.ReserveRequest(tenant="t", request_id="r1", groups=[_group(2)]), context)
    assert undone == [("m", "t", crs_service.irm_request_id(delegated[0], 0, "m"))]


def test_unit_prices_ask_about_a_busy_host_kind_a_usage_filter_would_pass_when_empty(tmp_path) -> None:
    # Under max_price_per_minute the CRS quotes one host of each kind that could hold the group; a plug-in reading
    # node.used left a busy kind unquoted (then scored the dearest), unlike the never-fits proof's empty cloud.
    crs = make_crs(tmp_path, filters=["traits", "properties", "capacity", "tests.crs_plugin_examples:LowLoad"])
    try:
        crs.view.upsert("m", common_pb2.PhysicalResource(
            id="h0", resource_type="vm", capacity={"cores": 8, "memory_gb": 32}, used={"cores": 6, "memory_gb": 0},
            location=common_pb2.Location(site="s", rack="r", host="h0"), generation=2))
        asked: list[list[str]] = []

        class _Quotes:
            def QuotePrice(self, request, timeout=None):  # noqa: N802, ANN001, ANN201
                asked.append([p for g in request.groups for p in g.placement])
                return irm_pb2.QuotePriceResponse(groups=[irm_pb2.GroupQuote(name=g.name, price_per_minute=0.5)
                                                          for g in request.groups])

        state = crs.registry.managers["m"] = ManagerState("m", "127.0.0.1:9", ["vm"], crs.clock.now())
        state.stub = lambda: _Quotes()  # type: ignore[method-assign]
        groups = [_group(2)]
        prices = crs._unit_prices("t", groups, crs._parse(groups, []))
        assert asked == [["h0"]] and list(prices.values()) == [0.5]
    finally:
        crs.db.dispose()
