"""API review 13 of the FPGA Orchestrator: a request_id reused for another request (CreateGroup, Reserve), a
reservation's virtual FPGA deleted or resized behind the reservation's back, Reserve's max_price_per_minute, and
what DescribeAllocationSpec tells a client of another language about `devices` and `design`.

An in-process FPGA-server bound to port 0 holds the parts; the Orchestrator's handlers are called in-process (the
domain errors they raise are what the server interceptor maps to statuses), over SQLite and PostgreSQL.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import grpc
import pytest

from harness.v1 import common_pb2, fpga_pb2, fpga_pb2_grpc, irm_pb2
from irm_fpga import server as fpga_server
from irm_fpga.models import Group, Reservation
from irm_fpga.orchestrator import Orchestrator, OrchestratorConfig
from irm_fpga.server import FpgaServerConfig
from services import client as rpc
from services import server as srv
from services.clock import VirtualClock
from services.errors import FailedPrecondition, HarnessError, InvalidArgument, PermissionDenied
from services.tls import plain_channel

PRICE = 0.05       # per device and minute (OrchestratorConfig's default)


@pytest.fixture
def server_address() -> Iterator[str]:
    comp = fpga_server.component(FpgaServerConfig(name="fpga-0", devices=4, reconfig_mean_s=0.0, reconfig_std_s=0.0))
    running = srv.start("127.0.0.1:0", [comp])
    address = f"127.0.0.1:{running.port}"
    try:
        yield address
    finally:
        running.stop(0)
        rpc.drop(address)


@pytest.fixture
def orch(server_address: str, db_url: str) -> Iterator[Orchestrator]:
    o = Orchestrator(OrchestratorConfig(servers=[server_address], database=db_url, autoscaler="none",
                                        reconcile_interval_s=0, price_per_device_minute=PRICE), VirtualClock(0.0))
    o.start(0)
    try:
        yield o
    finally:
        o.stop()


def held(address: str) -> dict[str, int]:
    """The parts the FPGA-server holds, asked of it directly: group -> devices."""
    stub = fpga_pb2_grpc.FpgaServerStub(plain_channel(address))
    return {p.group_id: p.target for p in stub.GetServer(fpga_pb2.GetServerRequest(), timeout=10).groups}


def fields(e: HarnessError) -> list[str]:
    return [v.field for v in e.violations]  # type: ignore[attr-defined]


def vfpga(devices: float = 1, count: int = 1, design: str | None = "sleep", name: str = "f") -> irm_pb2.ResourceGroup:
    attributes = {"devices": common_pb2.AttributeRequest(number=devices)}
    if design is not None:
        attributes["design"] = common_pb2.AttributeRequest(text=design)
    return irm_pb2.ResourceGroup(name=name, resource_type="vfpga", count=count, attributes=attributes)


def live_groups(o: Orchestrator) -> list[str]:
    with o.db.read() as s:
        return sorted(g.id for g in s.query(Group).filter(Group.deleted.is_(False)))


# -- 1. CreateGroup: a request_id reused for another request ---------------------------------------------


def test_create_group_refuses_a_request_id_reused_for_another_request(orch: Orchestrator, server_address: str):
    first = fpga_pb2.CreateGroupRequest(tenant="alice", request_id="k1", design="sleep", size=1)
    g = orch.CreateGroup(first, None)
    assert orch.CreateGroup(first, None).id == g.id                      # a retry: the same group
    others = [dict(design="fft"), dict(size=2), dict(max_size=3), dict(sharing=fpga_pb2.FpgaGroup.SHARING_SHARED),
              dict(scaling=fpga_pb2.FpgaGroup.SCALING_ELASTIC)]
    for change in others:
        request = fpga_pb2.CreateGroupRequest()
        request.CopyFrom(first)
        for k, v in change.items():
            setattr(request, k, v)
        with pytest.raises(InvalidArgument, match="reused with a different request") as e:
            orch.CreateGroup(request, None)
        assert fields(e.value) == ["request_id"], change
    assert live_groups(orch) == [g.id] and held(server_address) == {g.id: 1}   # nothing else made
    # Another tenant's request_id space is its own.
    assert orch.CreateGroup(fpga_pb2.CreateGroupRequest(tenant="bob", request_id="k1", design="fft", size=1),
                            None).id != g.id
    # Deleted, the group still answers a retry of its own request, and still refuses another one.
    orch.DeleteGroup(fpga_pb2.DeleteGroupRequest(tenant="alice", group_id=g.id), None)
    again = orch.CreateGroup(first, None)
    assert (again.id, again.deleted) == (g.id, True)
    with pytest.raises(InvalidArgument, match="reused"):
        orch.CreateGroup(fpga_pb2.CreateGroupRequest(tenant="alice", request_id="k1", design="sleep", size=2), None)


def test_a_group_recorded_before_requests_were_hashed_is_replayed_as_before(orch: Orchestrator):
    # A row from before the migration has request_hash "": any request under its id gets it (nothing to compare).
    orch.db.transact(lambda s: s.add(Group(id="fg-old", tenant="alice", request_id="old", design="sleep", size=1,
                                           min_size=1, max_size=1, parts={}, created_at=0.0, deleted=False)))
    with orch.db.read() as s:
        assert s.get(Group, "fg-old").request_hash == ""                 # the column's default
    got = orch.CreateGroup(fpga_pb2.CreateGroupRequest(tenant="alice", request_id="old", design="fft", size=2), None)
    assert (got.id, got.design, got.size) == ("fg-old", "sleep", 1)


def test_a_reservations_group_is_no_create_group_replay(orch: Orchestrator):
    r = orch.Reserve(irm_pb2.ReserveRequest(tenant="alice", request_id="res", groups=[vfpga()]), None)
    gid = r.groups[0].resources[0].id
    with orch.db.read() as s:
        request_id = s.get(Group, gid).request_id                        # "<reservation id>/f/0"
    with pytest.raises(InvalidArgument, match="reused") as e:
        orch.CreateGroup(fpga_pb2.CreateGroupRequest(tenant="alice", request_id=request_id, design="sleep", size=1),
                         None)
    assert fields(e.value) == ["request_id"]


def test_create_group_request_id_is_1_to_256_characters(orch: Orchestrator):
    for bad in ("", "x" * 257):
        with pytest.raises(InvalidArgument, match="1-256 characters") as e:
            orch.CreateGroup(fpga_pb2.CreateGroupRequest(tenant="alice", request_id=bad, design="sleep", size=1),
                             None)
        assert fields(e.value) == ["request_id"]
    longest = fpga_pb2.CreateGroupRequest(tenant="alice", request_id="x" * 256, design="sleep", size=1)
    assert orch.CreateGroup(longest, None).id == orch.CreateGroup(longest, None).id


# -- 2. a reservation's virtual FPGA is the reservation's --------------------------------------------------


def test_delete_or_resize_of_a_reservations_group_is_refused_naming_the_reservation(orch: Orchestrator,
                                                                                   server_address: str):
    r = orch.Reserve(irm_pb2.ReserveRequest(tenant="frank", request_id="vd1", groups=[vfpga(devices=2)]), None)
    gid = r.groups[0].resources[0].id
    assert held(server_address) == {gid: 2}
    with pytest.raises(FailedPrecondition) as e:
        orch.DeleteGroup(fpga_pb2.DeleteGroupRequest(tenant="frank", group_id=gid), None)
    assert e.value.code == grpc.StatusCode.FAILED_PRECONDITION
    assert f"release reservation {r.id!r} instead" in str(e.value)
    for size in (1, 3):
        with pytest.raises(FailedPrecondition, match=f"release reservation {r.id!r} instead"):
            orch.ResizeGroup(fpga_pb2.ResizeGroupRequest(tenant="frank", group_id=gid, size=size), None)
    # Nothing changed: the group holds its devices, and the reservation is active at its price.
    assert held(server_address) == {gid: 2}
    got = orch.GetReservation(irm_pb2.GetReservationRequest(tenant="frank", reservation_id=r.id), None)
    assert got.state == irm_pb2.Reservation.STATE_ACTIVE and got.price_per_minute == pytest.approx(2 * PRICE)
    assert [res.id for g in got.groups for res in g.resources] == [gid]
    # Another tenant is told it is not theirs, not which reservation holds it.
    with pytest.raises(PermissionDenied) as denied:
        orch.DeleteGroup(fpga_pb2.DeleteGroupRequest(tenant="mallory", group_id=gid), None)
    assert r.id not in str(denied.value)
    # Released, the reservation deletes it; a DeleteGroup after that answers the deleted group.
    orch.ReleaseReservation(irm_pb2.ReleaseReservationRequest(tenant="frank", reservation_id=r.id), None)
    assert held(server_address) == {}
    assert orch.DeleteGroup(fpga_pb2.DeleteGroupRequest(tenant="frank", group_id=gid), None).deleted


def test_a_group_whose_reservation_never_completed_can_still_be_deleted(orch: Orchestrator, server_address: str):
    # A crash inside Reserve leaves groups its reservation never got (a restart gives them back): not held.
    g = orch.create_group("frank", "fres-gone/f/0", "sleep", 1, min_size=1, max_size=1, reservation_id="fres-gone")
    assert orch.DeleteGroup(fpga_pb2.DeleteGroupRequest(tenant="frank", group_id=g.id), None).deleted
    assert held(server_address) == {}


# -- 3. Reserve's max_price_per_minute -------------------------------------------------------------------


def test_reserve_refuses_a_price_over_max_price_per_minute_and_reserves_nothing(orch: Orchestrator,
                                                                               server_address: str):
    groups = [vfpga(devices=2, name="a"), vfpga(devices=1, count=2, name="b")]
    quote = orch.QuotePrice(irm_pb2.QuotePriceRequest(tenant="carol", groups=groups), None)
    assert quote.price_per_minute == pytest.approx(4 * PRICE)
    for cap in (0.0, quote.price_per_minute - 0.001):
        with pytest.raises(FailedPrecondition, match="exceeds max_price_per_minute") as e:
            orch.Reserve(irm_pb2.ReserveRequest(tenant="carol", request_id="p1", groups=groups,
                                                max_price_per_minute=cap), None)
        assert e.value.reason == "OVER_PRICE"
        assert float(e.value.metadata["pricePerMinute"]) == pytest.approx(quote.price_per_minute)
    # Nothing reserved: no reservation, no group, no device held; the request_id stays unused.
    assert not orch.ListReservations(irm_pb2.ListReservationsRequest(tenant="carol", include_released=True),
                                     None).reservations
    assert live_groups(orch) == [] and held(server_address) == {}
    # A cap equal to the quote is met, and the reservation costs what was quoted.
    capped = irm_pb2.ReserveRequest(tenant="carol", request_id="p1", groups=groups,
                                    max_price_per_minute=quote.price_per_minute)
    r = orch.Reserve(capped, None)
    assert r.state == irm_pb2.Reservation.STATE_ACTIVE and r.price_per_minute == quote.price_per_minute
    assert {g.name: g.price_per_minute for g in r.groups} == {q.name: q.price_per_minute for q in quote.groups}
    assert orch.Reserve(capped, None).id == r.id                       # a retry: the same reservation


def test_reserve_refuses_a_negative_or_non_finite_max_price(orch: Orchestrator, server_address: str):
    for cap in (-0.01, math.inf, -math.inf, math.nan):
        with pytest.raises(InvalidArgument) as e:
            orch.Reserve(irm_pb2.ReserveRequest(tenant="carol", request_id="p2", groups=[vfpga()],
                                                max_price_per_minute=cap), None)
        assert fields(e.value) == ["max_price_per_minute"], cap
    # Reported with the groups' problems, in one answer.
    with pytest.raises(InvalidArgument) as e:
        orch.Reserve(irm_pb2.ReserveRequest(tenant="carol", request_id="p2", groups=[vfpga(design=None)],
                                            max_price_per_minute=-1), None)
    assert fields(e.value) == ["max_price_per_minute", "groups[0].attributes[design]"]
    assert live_groups(orch) == [] and held(server_address) == {}


def test_reserve_refuses_a_request_id_reused_for_another_request(orch: Orchestrator, server_address: str):
    first = irm_pb2.ReserveRequest(tenant="dave", request_id="r1", groups=[vfpga()])
    r = orch.Reserve(first, None)
    for other in (irm_pb2.ReserveRequest(tenant="dave", request_id="r1", groups=[vfpga(devices=2)]),
                  irm_pb2.ReserveRequest(tenant="dave", request_id="r1", groups=[vfpga()], max_price_per_minute=1.0)):
        with pytest.raises(InvalidArgument, match="reused with a different request") as e:
            orch.Reserve(other, None)
        assert fields(e.value) == ["request_id"]
    assert orch.Reserve(first, None).id == r.id
    assert held(server_address) == {r.groups[0].resources[0].id: 1}
    # A reservation recorded before requests were hashed is replayed whatever the request (nothing to compare).
    orch.db.transact(lambda s: s.add(Reservation(id="fres-old", tenant="dave", request_id="old", state="active",
                                                 price_per_minute=0.0, created_at=0.0, released_at=0.0, groups=[])))
    old = orch.Reserve(irm_pb2.ReserveRequest(tenant="dave", request_id="old", groups=[vfpga(devices=3)]), None)
    assert old.id == "fres-old"


# -- 4. DescribeAllocationSpec ---------------------------------------------------------------------------


def test_allocation_spec_says_devices_is_whole_and_design_required_as_reserve_does(orch: Orchestrator):
    (spec,) = orch.DescribeAllocationSpec(irm_pb2.DescribeAllocationSpecRequest(), None).resource_types
    attrs = {a.name: a for a in spec.attributes}
    assert attrs["devices"].integer and not attrs["devices"].required and attrs["devices"].HasField("default")
    assert attrs["design"].required and not attrs["design"].HasField("default") and not attrs["design"].integer
    # What Reserve does: no design, or a fractional device count, is refused naming the attribute.
    for group, field in ((vfpga(design=None), "groups[0].attributes[design]"),
                         (vfpga(devices=1.5), "groups[0].attributes[devices]")):
        with pytest.raises(InvalidArgument) as e:
            orch.Reserve(irm_pb2.ReserveRequest(tenant="erin", request_id="s1", groups=[group]), None)
        assert fields(e.value) == [field]


# -- Review 19: a reservation still being made, asked about by its request id ------------------------------


def test_get_reservation_by_request_id_of_one_being_made_is_pending_not_not_found(orch: Orchestrator,
                                                                                  monkeypatch) -> None:
    # The CRS's compensator asks by request id whether a Reserve it gave up on holds anything: NOT_FOUND while the
    # devices were still reconfiguring told it "nothing", and the reservation made a moment later was held for good.
    import threading

    from services.errors import RESERVATION_PENDING, Aborted, NotFound

    reached, go = threading.Event(), threading.Event()
    create = orch.create_group

    def slow_create(*a, **kw):  # type: ignore[no-untyped-def]
        reached.set()
        assert go.wait(30)
        return create(*a, **kw)

    monkeypatch.setattr(orch, "create_group", slow_create)
    request = irm_pb2.ReserveRequest(tenant="gina", request_id="slow", groups=[vfpga()])
    made: list[irm_pb2.Reservation] = []
    t = threading.Thread(target=lambda: made.append(orch.Reserve(request, None)))
    t.start()
    try:
        assert reached.wait(30)
        by_request = irm_pb2.GetReservationRequest(tenant="gina", request_id="slow")
        for call in (lambda: orch.GetReservation(by_request, None), lambda: orch.Reserve(request, None)):
            with pytest.raises(Aborted) as e:
                call()
            assert e.value.reason == RESERVATION_PENDING and e.value.retry_after_s and e.value.retry_after_s > 0
        with pytest.raises(NotFound):        # another tenant's id, and by reservation id: nothing given out yet
            orch.GetReservation(irm_pb2.GetReservationRequest(tenant="hank", request_id="slow"), None)
    finally:
        go.set()
        t.join(30)
    assert made and orch.GetReservation(by_request, None).id == made[0].id
