"""Pinned groups (GroupDemand.pins: a CRS above's placement, sent down as ResourceGroup.placement) and what a CRS
above makes of what a CRS below offers and answers (cross_resource_scheduler.stacking)."""

from __future__ import annotations

from dataclasses import replace

import grpc
import pytest

from cross_resource_scheduler import service as crs_service
from cross_resource_scheduler.placement import Unschedulable
from cross_resource_scheduler.stacking import (
    REFUSED_BYTES,
    as_one_part,
    offered,
    refused_keys,
    refused_metadata,
)
from cross_resource_scheduler.view import CapacityView
from harness.v1 import common_pb2, irm_pb2
from services.errors import (
    CAPACITY_IN_USE,
    MANAGER_DOWN,
    NEVER_FITS,
    PIN_REFUSED,
    PIN_UNKNOWN,
    SEARCH_GAVE_UP,
    FailedPrecondition,
    ResourceExhausted,
    error_info,
    to_status,
)
from tests.unit.test_crs_placement import add, group, hosts, place
from tests.unit.test_crs_reserve import make_crs
from tests.unit.test_crs_service_parse import _group


@pytest.fixture
def view() -> CapacityView:
    v = CapacityView()
    for m in ("a", "b"):
        for h in ("h1", "h2"):                       # the same host ids at both managers
            add(v, h, cores=4, manager=m, site=f"site-{m}")
    add(v, "f1", manager="a", rtype="fpga")
    return v


def pinned(name: str, *pins: str, cores: float = 1, count: int | None = None):  # noqa: ANN201
    return replace(group(name, count or len(pins), cores), pins=pins)


def test_each_instance_goes_on_its_pin_whatever_the_weighers_prefer(view: CapacityView) -> None:
    p = place(view, [pinned("x", "b/h2", "a/h1", "b/h2", cores=2)], weighers={"pack": 1.0, "spread": 5.0})
    assert [n.key for n in p.nodes["x"]] == ["b/h2", "a/h1", "b/h2"]
    assert p.demand == {"b/h2": {"cores": 4.0, "memory_gb": 2.0}, "a/h1": {"cores": 2.0, "memory_gb": 1.0}}


def test_free_groups_are_placed_around_pinned_ones(view: CapacityView) -> None:
    # y must share x's host: the pin decides for both.
    p = place(view, [pinned("x", "b/h1"), group("y", 1)], ["same_host(x, y)"])
    assert hosts(p, "y") == ["h1"] and p.nodes["y"][0].key == "b/h1"
    p = place(view, [pinned("x", "a/h2"), group("y", 3)], ["different_host(x, y)", "different_host(y, y)"])
    assert "a/h2" not in {n.key for n in p.nodes["y"]} and len({n.key for n in p.nodes["y"]}) == 3


def test_a_pin_the_crs_does_not_know_is_placed_again_not_never(view: CapacityView) -> None:
    with pytest.raises(Unschedulable) as e:
        place(view, [pinned("x", "a/h9")])
    assert e.value.reason == PIN_UNKNOWN and not e.value.unresolvable and "'a/h9'" in str(e.value)


def test_a_pin_on_another_type_never_fits(view: CapacityView) -> None:
    with pytest.raises(Unschedulable) as e:
        place(view, [pinned("x", "a/f1")])
    assert e.value.reason == NEVER_FITS and "a fpga resource, not a vm" in str(e.value)


def test_a_pin_on_a_down_manager_is_retried_later(view: CapacityView) -> None:
    view.set_down("b", True)
    with pytest.raises(Unschedulable) as e:
        place(view, [pinned("x", "b/h1")])
    assert e.value.reason == MANAGER_DOWN and e.value.down == ["b"]


def test_a_pinned_resource_too_small_never_fits_and_one_in_use_fits_later(view: CapacityView) -> None:
    # Three 2-core instances on a 4-core host: never, whatever is free elsewhere. The others of its type would take
    # one such instance each: only the pin is named refused.
    with pytest.raises(Unschedulable) as e:
        place(view, [pinned("x", "a/h1", "a/h1", "a/h1", cores=2)])
    assert e.value.unresolvable and e.value.reason == PIN_REFUSED
    assert e.value.metadata == {"group": "x", "pin": "a/h1", "refused": "a/h1"}
    assert "3 instances pinned to a/h1, which has room for 2" in str(e.value)
    # In use now: refused, not moved to the free host next to it.
    add(view, "h1", cores=4, used=3, manager="a", site="site-a")
    with pytest.raises(Unschedulable) as e:
        place(view, [pinned("x", "a/h1", cores=2)])
    assert not e.value.unresolvable and e.value.reason == CAPACITY_IN_USE
    # The filters judge a pin as any candidate: a required trait it lacks never fits, nor on any other vm host here.
    with pytest.raises(Unschedulable) as e:
        place(view, [replace(group("x", 1, required=("gpu",)), pins=("a/h2",))])
    assert e.value.unresolvable and "'traits' filter" in str(e.value)
    assert e.value.reason == PIN_REFUSED and e.value.metadata["refused"] == "a/h2\na/*\nb/*"


def test_pins_that_break_the_groups_own_constraint_never_fit(view: CapacityView) -> None:
    # Each resource takes its instance: it is the request's own constraint that the pins break, not a refusal.
    with pytest.raises(Unschedulable) as e:
        place(view, [pinned("x", "a/h1", "a/h1")], ["different_host(x, x)"])
    assert e.value.unresolvable and e.value.reason == NEVER_FITS


def test_a_pin_a_filter_refuses_names_every_resource_of_its_type_that_refuses_it(view: CapacityView) -> None:
    add(view, "h3", cores=4, manager="a", site="site-a", traits=("gpu",))
    with pytest.raises(Unschedulable) as e:
        place(view, [replace(group("x", 1, required=("gpu",)), pins=("a/h2",))])
    assert e.value.reason == PIN_REFUSED and e.value.metadata["pin"] == "a/h2"
    # The pin first, then each manager all of whose resources of the type refuse it, then the others one by one.
    assert e.value.metadata["refused"].split("\n") == ["a/h2", "b/*", "a/h1"]


def test_a_refusal_claims_no_prefix_whose_down_resources_might_take_the_group() -> None:
    # A middle CRS: "low" offers a's hosts (up, without the trait) and b's (its manager down below, with it). All of
    # low's up hosts refuse the group, but b's might take it once b is back: "low/*" (all of low's) was claimed,
    # and the CRS above avoided every host of low's -- NEVER_FITS where the request would fit later.
    v = CapacityView()
    for hid in ("a/h1", "a/h2"):
        add(v, hid, manager="low")
    down = add(v, "b/h1", manager="low", traits=("gpu",)).to_proto()
    down.manager_down = True
    v.upsert("low", down)
    with pytest.raises(Unschedulable) as e:
        place(v, [replace(group("x", 1, required=("gpu",)), pins=("low/a/h2",))])
    assert e.value.reason == PIN_REFUSED
    assert e.value.metadata["refused"].split("\n") == ["low/a/h2", "low/a/*"]


def test_a_group_is_placed_clear_of_what_a_crs_below_refused(view: CapacityView) -> None:
    avoid = frozenset({"a/h1", "a/h2", "b/h1"})
    for seed in range(20):
        p = place(view, [replace(group("x", 1), avoid=avoid)], seed=seed)
        assert [n.key for n in p.nodes["x"]] == ["b/h2"]
    # The proofs judge a class of look-alikes by one member: a refused one must not stand for the others (here
    # the first of each class), or the busy a/h2 and b/h2 would be taken for never fitting.
    for m in ("a", "b"):
        add(view, "h2", cores=4, used=4, manager=m, site=f"site-{m}")
    with pytest.raises(Unschedulable) as e:
        place(view, [replace(group("x", 1), avoid=frozenset({"a/h1", "b/h1"}))])
    assert e.value.reason == CAPACITY_IN_USE and not e.value.unresolvable
    for m in ("a", "b"):
        add(view, "h2", cores=4, manager=m, site=f"site-{m}")
    with pytest.raises(Unschedulable) as e:
        place(view, [replace(group("x", 1), avoid=avoid | {"b/h2"})])
    assert e.value.removed_by == {"refused_below": 4}


# -- stacking.py -------------------------------------------------------------------------------------------------

def _resource(rid: str, manager: str) -> common_pb2.PhysicalResource:
    return common_pb2.PhysicalResource(id=rid, resource_type="vm", manager=manager)


def test_resources_a_crs_below_offers_are_known_by_their_managers_names() -> None:
    ev = irm_pb2.CapacityEvent(kind=irm_pb2.CapacityEvent.KIND_UPDATED, resource=_resource("h1", "compute-a"),
                               more=[_resource("h1", "compute-b"), _resource("h2", "crs-a"), _resource("h3", "")])
    out = offered("crs-a", ev)
    assert [r.id for r in (out.resource, *out.more)] == ["compute-a/h1", "compute-b/h1", "h2", "h3"]
    assert ev.resource.id == "h1"                                    # the event as it came is left alone
    own = irm_pb2.CapacityEvent(kind=irm_pb2.CapacityEvent.KIND_SNAPSHOT, resource=_resource("h1", "compute-a"))
    assert offered("compute-a", own) is own                          # a manager's own: as they are
    end = irm_pb2.CapacityEvent(kind=irm_pb2.CapacityEvent.KIND_SNAPSHOT_END)
    assert offered("crs-a", end) == end


def test_a_crs_below_s_reservation_is_one_part_of_it() -> None:
    reply = irm_pb2.Reservation(id="crs-res-1", groups=[
        irm_pb2.AllocatedGroup(name="x", manager="compute-a", manager_reservation_id="vm-res-7", resources=[
            irm_pb2.AllocatedResource(id="vm-1", physical_id="h1", physical_generation=4)]),
        irm_pb2.AllocatedGroup(name="y", manager="crs-a", manager_reservation_id="crs-res-1", resources=[
            irm_pb2.AllocatedResource(id="vm-2", physical_id="h2")])])
    x, y = as_one_part("crs-a", reply)
    assert (x.manager, x.manager_reservation_id) == ("crs-a", "crs-res-1")
    assert [(r.id, r.physical_id, r.physical_generation) for r in x.resources] == [("vm-1", "compute-a/h1", 4)]
    assert y == reply.groups[1]
    assert reply.groups[0].manager == "compute-a"                   # the reply itself is left alone
    direct = irm_pb2.Reservation(id="r", groups=[irm_pb2.AllocatedGroup(name="x", manager="compute-a",
                                                                        manager_reservation_id="r")])
    assert as_one_part("compute-a", direct) == list(direct.groups)


@pytest.mark.parametrize("seed", range(12))
def test_a_free_group_makes_way_for_a_pinned_one_on_look_alike_hosts(seed: int) -> None:
    # h1 and h2 alike: the free 4-core VM must take h2, whatever the seed, for the pinned one to have h1.
    v = CapacityView()
    add(v, "h1", cores=4)
    add(v, "h2", cores=4)
    p = place(v, [group("free", 1, 4), pinned("pin", "m/h1", cores=2)], seed=seed)
    assert [n.key for n in p.nodes["free"]] == ["m/h2"] and [n.key for n in p.nodes["pin"]] == ["m/h1"]


def test_a_large_pinned_group_is_judged_exactly_not_by_a_bounded_search() -> None:
    v = CapacityView()
    for i in range(100):
        add(v, f"h{i}", cores=64, memory=1024)
    add(v, "h0", cores=64, used=63, memory=1024)          # 1 core free, 10 instances pinned there
    pins = tuple(f"m/h{i % 100}" for i in range(1000))
    with pytest.raises(Unschedulable) as e:
        place(v, [pinned("x", *pins)])
    assert e.value.reason == CAPACITY_IN_USE and not e.value.unresolvable
    add(v, "h0", cores=64, memory=1024)
    assert len(place(v, [pinned("x", *pins)]).nodes["x"]) == 1000


def test_a_crs_below_saying_it_reserved_nothing_is_a_definite_refusal_not_a_part_in_doubt() -> None:
    import grpc
    from google.protobuf import any_pb2
    from google.rpc import error_details_pb2

    from cross_resource_scheduler.delegation import Refused
    from cross_resource_scheduler.refusals import definite
    from services.errors import DOMAIN, MANAGER_UNAVAILABLE

    def refused(code: grpc.StatusCode, reason: str = "") -> Refused:
        rich = []
        if reason:
            detail = any_pb2.Any()
            detail.Pack(error_details_pb2.ErrorInfo(reason=reason, domain=DOMAIN))
            rich.append(detail)
        return Refused(code, "nothing was reserved", rich=rich)

    assert definite(refused(grpc.StatusCode.UNAVAILABLE, MANAGER_DOWN))
    assert definite(refused(grpc.StatusCode.UNAVAILABLE, MANAGER_UNAVAILABLE))
    assert definite(refused(grpc.StatusCode.RESOURCE_EXHAUSTED, PIN_UNKNOWN))
    # Not answered (no reason: the transport's), or not yet decided: it may commit yet.
    assert not definite(refused(grpc.StatusCode.UNAVAILABLE))
    assert not definite(refused(grpc.StatusCode.DEADLINE_EXCEEDED))
    assert not definite(refused(grpc.StatusCode.ABORTED, "RESERVATION_PENDING"))


class _Relayed(grpc.RpcError):
    """An error as a peer's status carries it (services.errors.to_status: what a service sends)."""

    def __init__(self, error: FailedPrecondition) -> None:
        self._status = to_status(error)

    def rich_status(self):  # noqa: ANN201
        return self._status


def test_a_refusal_names_the_refused_resources_within_what_a_status_keeps() -> None:
    every = [f"a/h{i:04d}" for i in range(1000)] + ["b/h1", "b/h2"]
    said = refused_metadata("x", "a/h0007", every[:1000], every)
    assert said == {"group": "x", "pin": "a/h0007", "refused": "a/h0007\na/*"}
    lines = refused_metadata("x", "a/h0007", every[:900] + ["b/h1"], every)["refused"].split("\n")
    assert lines[0] == "a/h0007" and len("\n".join(lines).encode()) <= REFUSED_BYTES
    assert len(lines) > 20 and set(lines) <= set(every[:900]) | {"b/h1"}
    # Through a gRPC status and back (its ErrorInfo values are bounded): every line intact.
    status = FailedPrecondition("refused", reason=PIN_REFUSED, metadata=refused_metadata(
        "x" * 128, "a/h0007", every[:900], every))
    kept = error_info(_Relayed(status))[1]
    assert kept["refused"].split("\n") == lines[:len(kept["refused"].split("\n"))] and "[..." not in kept["refused"]
    assert kept["group"] == "x" * 128


def test_refused_resources_are_named_in_the_keys_of_the_crs_above(view: CapacityView) -> None:
    # The CRS below "a" refused its h1 and h2 (its keys are this CRS's ids under "a"); "<m>/*": all of m's.
    assert refused_keys("a", {"pin": "h2", "refused": "h2\nh1"}, view.of_type("vm")) == {"a/h1", "a/h2"}
    below = CapacityView()
    for rid in ("low/c/h1", "low/c/h2", "c2/h9"):
        add(below, rid, manager="mid")
    add(below, "low/c/h3", manager="other")
    assert refused_keys("mid", {"refused": "c2/h9\nlow/*"}, below.of_type("vm")) == {
        "mid/low/c/h1", "mid/low/c/h2", "mid/c2/h9"}
    # Names it does not know (cut, or gone since) are left out.
    assert refused_keys("a", {"refused": "h1\nh7\nzz/*"}, view.of_type("vm")) == {"a/h1"}


def _another_host(crs, manager: str, hid: str) -> None:  # noqa: ANN001
    """An 8-core host like make_crs's h0, of `manager`, in the CRS's view."""
    crs.view.upsert(manager, common_pb2.PhysicalResource(
        id=hid, resource_type="vm", capacity={"cores": 8, "memory_gb": 32}, used={"cores": 0, "memory_gb": 0},
        location=common_pb2.Location(site="s", rack="r", host=hid), generation=1))


@pytest.mark.parametrize("attempts", [1, 2])
def test_a_request_the_crss_below_refuse_at_every_attempt_gets_this_crss_verdict_clear_of_them(tmp_path,
                                                                                               attempts) -> None:
    # Two CRSs below (m, n), each refusing the group where it is put. Both refused (2 attempts): clear of them it
    # never fits here, as this CRS's own verdict says. One refused (1 attempt): n is left untried: not "never".
    crs = make_crs(tmp_path, place_attempts=attempts)
    _another_host(crs, "n", "h1")
    tried: list[str] = []

    def delegate(tenant, res_id, attempt, pinned, index):  # type: ignore[no-untyped-def]
        [(manager, parts)] = pinned.items()
        tried.append(manager)
        pin = parts[0].placement[0]
        raise crs_service._PinRefused(manager, FailedPrecondition(
            f"group 'g' is pinned to {pin}, which the 'site_policy' filter refuses for it",
            reason=PIN_REFUSED, metadata={"group": "g", "pin": pin, "refused": pin}))

    crs._delegate = delegate  # type: ignore[method-assign]
    try:
        if attempts == 2:
            with pytest.raises(FailedPrecondition) as never:
                crs.Reserve(irm_pb2.ReserveRequest(tenant="t", request_id="r1", groups=[_group(2)]), None)
            assert sorted(tried) == ["m", "n"]
            assert never.value.reason == NEVER_FITS and "refused_below removed 2" in str(never.value)
        else:
            with pytest.raises(ResourceExhausted) as untried:
                crs.Reserve(irm_pb2.ReserveRequest(tenant="t", request_id="r1", groups=[_group(2)]), None)
            assert len(tried) == 1 and untried.value.reason == SEARCH_GAVE_UP
            assert "refused the resources this CRS placed the request on, 1 time (" in str(untried.value)
            assert "'site_policy' filter" in str(untried.value) and untried.value.retry_after_s == 5.0
        assert not any(n.assumed for n in crs.view.nodes.values())  # nothing left assumed
    finally:
        crs.db.dispose()


def test_a_refusal_passed_up_claims_no_prefix_whose_down_resources_might_take_the_group(tmp_path) -> None:
    # A middle CRS pinned by the CRS above to low/a/h2; low (the CRS below) refuses all of its a's hosts. low's b is
    # down below: "low/*" would tell the CRS above that b's host refuses too.
    crs = make_crs(tmp_path)
    for hid in ("a/h1", "a/h2", "b/h1"):
        _another_host(crs, "low", hid)
    down = crs.view.nodes["low/b/h1"].to_proto()
    down.manager_down = True
    crs.view.upsert("low", down)

    def delegate(tenant, res_id, attempt, pinned, index):  # type: ignore[no-untyped-def]
        raise crs_service._PinRefused("low", FailedPrecondition(
            "group 'g' is pinned to a/h2, which the 'site_policy' filter refuses for it",
            reason=PIN_REFUSED, metadata={"group": "g", "pin": "a/h2", "refused": "a/h2\na/*"}))

    crs._delegate = delegate  # type: ignore[method-assign]
    pinned_group = _group(2)
    pinned_group.placement.append("low/a/h2")
    try:
        with pytest.raises(FailedPrecondition) as e:
            crs.Reserve(irm_pb2.ReserveRequest(tenant="t", request_id="r1", groups=[pinned_group]), None)
        assert e.value.reason == PIN_REFUSED
        assert e.value.metadata["refused"].split("\n") == ["low/a/h2", "low/a/*"]
    finally:
        crs.db.dispose()


def test_a_request_whose_pins_a_crs_below_no_longer_knows_each_time_is_told_to_retry(tmp_path) -> None:
    crs = make_crs(tmp_path, place_attempts=2)

    def delegate(tenant, res_id, attempt, pinned, index):  # type: ignore[no-untyped-def]
        raise ResourceExhausted("manager 'm': group 'g' is pinned to 'c/h0', which this CRS does not know (now)",
                                reason=PIN_UNKNOWN, retry_after_s=5.0)

    crs._delegate = delegate  # type: ignore[method-assign]
    try:
        with pytest.raises(ResourceExhausted) as e:
            crs.Reserve(irm_pb2.ReserveRequest(tenant="t", request_id="r1", groups=[_group(2)]), None)
        # The tenant pinned nothing: told that the CRSs below changed, and to retry (not to pin afresh).
        assert e.value.reason == PIN_UNKNOWN and e.value.retry_after_s == 5.0
        assert str(e.value).startswith("the CRSs below no longer knew resources this CRS placed the request on, 2 ")
    finally:
        crs.db.dispose()


def test_a_refusal_says_whole_irms_by_their_prefix_through_levels_and_cut_lists_differ_by_pin() -> None:
    # At a CRS over a CRS "low" (IRMs irm1, irm2) and an IRM of its own: all of irm2's refuse, one of irm1's.
    of_type = ["low/irm1/h1", "low/irm1/h2", *(f"low/irm2/h{i:02d}" for i in range(20)), "own/h1"]
    refused = ["low/irm1/h1", *(f"low/irm2/h{i:02d}" for i in range(20))]
    said = refused_metadata("x", "low/irm1/h1", refused, of_type)["refused"].split("\n")
    assert said == ["low/irm1/h1", "low/irm2/*"]
    # The CRS above this one ("mid") reads them as its own keys.
    above = CapacityView()
    for key in of_type:
        add(above, key, manager="mid")
    assert refused_keys("mid", {"refused": "\n".join(said)}, above.of_type("vm")) == {f"mid/{k}" for k in refused}
    # Too many single keys to list: each refusal lists those after its own pin.
    many = [f"a/h{i:03d}" for i in range(300)]
    first = refused_metadata("x", "a/h000", many[:200], many)["refused"].split("\n")
    later = refused_metadata("x", "a/h150", many[:200], many)["refused"].split("\n")
    assert first[1] == "a/h001" and later[1] == "a/h151" and not set(first[1:]) & set(later[1:])


class _Refusing:
    """A CRS below's QuotePrice: refuses (PIN_REFUSED) any call naming a host of site a, prices the others."""

    def __init__(self) -> None:
        self.calls: list[list[str]] = []

    def QuotePrice(self, request, timeout=None):  # noqa: N802, ANN001, ANN201
        pins = [g.placement[0] for g in request.groups]
        self.calls.append(pins)
        refused = [g for g in request.groups if g.placement[0].startswith("a/")]
        if refused:
            pin = refused[0].placement[0]
            raise _Relayed(FailedPrecondition("no batch work here", reason=PIN_REFUSED,
                                              metadata={"group": refused[0].name, "pin": pin, "refused": pin}))
        return irm_pb2.QuotePriceResponse(groups=[irm_pb2.GroupQuote(name=g.name, price_per_minute=1.5)
                                                  for g in request.groups])


def test_unit_prices_at_a_crs_below_refusing_some_hosts_price_the_others(tmp_path) -> None:
    # One call for every kind, refused because some kinds are on refused hosts: asked again without each refused
    # one, the others priced (all dropped, a capped Reserve found nothing cheaper and answered OVER_PRICE).
    crs = make_crs(tmp_path)
    try:
        below = _Refusing()
        state = crs_service.ManagerState("c", "127.0.0.1:9", ["vm"], 0.0)
        state.stub = lambda: below  # type: ignore[method-assign]
        ones = [irm_pb2.ResourceGroup(name=f"q{i}", resource_type="vm", count=1, placement=[pin])
                for i, pin in enumerate(["b/h1", "a/h1", "b/h2", "a/h2"])]
        assert crs._quoted(state, "t", ones) == {"q0": 1.5, "q2": 1.5}
        assert below.calls == [["b/h1", "a/h1", "b/h2", "a/h2"], ["b/h1", "b/h2", "a/h2"], ["b/h1", "b/h2"]]
    finally:
        crs.db.dispose()


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_quote_and_a_reserve_placing_again_after_a_refusal_land_alike(tmp_path, seed) -> None:
    # A CRS below refuses the first host each call tries; both then place again from the same basis (Reserve's own
    # assume and forget of its first try must not move it), and price what is then reserved.
    crs = make_crs(tmp_path, seed=seed)
    for i in range(1, 8):
        _another_host(crs, "m", f"h{i}")
    tries: list[list[str]] = []

    def refusing_first(manager: str, pins: list[str]) -> None:
        tries[-1].append(pins[0])
        if len(tries[-1]) == 1:
            raise crs_service._PinRefused(manager, FailedPrecondition(
                "refused", reason=PIN_REFUSED, metadata={"group": "g", "pin": pins[0], "refused": pins[0]}))

    def quote(tenant, groups, placement, consequence="nothing was reserved"):  # type: ignore[no-untyped-def]
        [(manager, parts)] = crs._pinned(groups, placement).items()
        refusing_first(manager, list(parts[0].placement))
        return irm_pb2.QuotePriceResponse(price_per_minute=1.0)

    def delegate(tenant, res_id, attempt, pinned, index):  # type: ignore[no-untyped-def]
        [(manager, parts)] = pinned.items()
        refusing_first(manager, list(parts[0].placement))
        return [irm_pb2.AllocatedGroup(name="g", manager=manager, manager_reservation_id="r")], [], {}

    crs._quote = quote  # type: ignore[method-assign]
    crs._delegate = delegate  # type: ignore[method-assign]
    try:
        tries.append([])
        crs.QuotePrice(irm_pb2.QuotePriceRequest(tenant="t", groups=[_group(2)]), None)
        tries.append([])
        crs.Reserve(irm_pb2.ReserveRequest(tenant="t", request_id="r1", groups=[_group(2)]), None)
        assert len(tries[0]) == 2 and tries[0] == tries[1]
    finally:
        crs.db.dispose()


def test_the_refused_pin_is_avoided_even_when_the_refusal_could_not_list_it(tmp_path) -> None:
    # A pin too long for the list (or a list the status left out): the CRS above still places clear of it.
    crs = make_crs(tmp_path, place_attempts=2)
    _another_host(crs, "m", "h1")
    tried: list[str] = []

    def delegate(tenant, res_id, attempt, pinned, index):  # type: ignore[no-untyped-def]
        [(manager, parts)] = pinned.items()
        tried.append(parts[0].placement[0])
        if len(tried) == 1:
            raise crs_service._PinRefused(manager, FailedPrecondition(
                "refused", reason=PIN_REFUSED, metadata={"group": "g", "pin": parts[0].placement[0]}))
        return [irm_pb2.AllocatedGroup(name="g", manager=manager, manager_reservation_id="r")], [], {}

    crs._delegate = delegate  # type: ignore[method-assign]
    try:
        for seed in range(4):       # whichever host it tries first, the second try is the other one
            tried.clear()
            crs.Reserve(irm_pb2.ReserveRequest(tenant="t", request_id=f"r{seed}", groups=[_group(2)]), None)
            assert len(tried) == 2 and tried[0] != tried[1]
    finally:
        crs.db.dispose()


def test_a_manager_refusing_this_crss_credentials_is_placed_around_or_named_for_the_operator(tmp_path) -> None:
    # A site whose tokens do not match (a rotation half done): the request fits elsewhere and is placed there; with
    # nowhere else, the answer is the operators' UNAVAILABLE naming that manager, not a verdict on the request.
    from tests.conftest import PeerError

    tried: list[str] = []

    def delegate(tenant, res_id, attempt, pinned, index):  # type: ignore[no-untyped-def]
        tried.append(",".join(sorted(pinned)))
        if "m" in pinned:
            raise crs_service._refused_by("m", PeerError(
                grpc.StatusCode.UNAUTHENTICATED,
                "tenant 't': the call carries a delegation token this service does not accept"), lambda p: p)
        return [irm_pb2.AllocatedGroup(name="g", resource_type="vm", manager=m, manager_reservation_id="r",
                                       resources=[irm_pb2.AllocatedResource(id="vm-1", physical_id="h1")])
                for m in pinned], [], {}

    crs = make_crs(tmp_path)                   # m's h0: 8 cores, the pack weigher's first choice
    crs.view.upsert("n", common_pb2.PhysicalResource(
        id="h1", resource_type="vm", capacity={"cores": 16, "memory_gb": 64}, used={"cores": 0, "memory_gb": 0},
        location=common_pb2.Location(site="s", rack="r", host="h1"), generation=1))
    crs._delegate = delegate  # type: ignore[method-assign]
    try:
        res = crs.Reserve(irm_pb2.ReserveRequest(tenant="t", request_id="r1", groups=[_group(2)]), None)
        assert tried == ["m", "n"] and [g.manager for g in res.groups] == ["n"]
    finally:
        crs.db.dispose()
    tried.clear()
    alone = make_crs(tmp_path / "alone")      # only m
    alone._delegate = delegate  # type: ignore[method-assign]
    try:
        with pytest.raises(crs_service.Unavailable) as e:
            alone.Reserve(irm_pb2.ReserveRequest(tenant="t", request_id="r2", groups=[_group(2)]), None)
        assert tried == ["m"]
        assert "manager 'm'" in str(e.value) and "same control and delegation tokens" in str(e.value)
        assert e.value.reason == "CREDENTIALS_REFUSED" and not any(n.assumed for n in alone.view.nodes.values())
    finally:
        alone.db.dispose()
