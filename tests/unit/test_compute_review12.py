"""The compute IRM's answers to bad, impossible or leftover requests (review 12): each over gRPC, with the
status and the message a caller acts on."""

from __future__ import annotations

import queue
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

from harness.v1 import common_pb2, irm_pb2, irm_pb2_grpc
from irm_compute.service import ComputeConfig, ComputeIrm, component
from irm_compute.shapes import MAX_INSTANCES
from services import server
from services.errors import field_violations
from services.tls import plain_channel

TIMEOUT = 30
T = "alice"
INVENTORY = """
hosts:
  - {id: a, site: s1, rack: r1, cores: 16, memory_gb: 64, frequency_ghz: 2.2, agent: '127.0.0.1:1'}
  - {id: b, site: s1, rack: r2, cores: 16, memory_gb: 64, frequency_ghz: 3.0, agent: '127.0.0.1:2',
     traits: [fast]}
"""


@dataclass
class Cloud:
    irm: ComputeIrm
    rm: irm_pb2_grpc.ResourceManagerStub
    running: server.Running
    channel: grpc.Channel

    def stop(self) -> None:
        self.channel.close()
        self.running.stop(0)


def start_cloud(tmp_path: Path, inventory: str = INVENTORY) -> Cloud:
    (tmp_path / "hosts.yaml").write_text(inventory)
    comp = component(ComputeConfig(state_dir=str(tmp_path), address="127.0.0.1:0",
                                   inventory=str(tmp_path / "hosts.yaml")))
    running = server.start("127.0.0.1:0", [comp])
    channel = plain_channel(f"127.0.0.1:{running.port}")
    return Cloud(comp.extra["irm"], irm_pb2_grpc.ResourceManagerStub(channel), running, channel)


@pytest.fixture
def cloud(tmp_path: Path) -> Iterator[Cloud]:
    c = start_cloud(tmp_path)
    yield c
    c.stop()


def number(x: float) -> common_pb2.AttributeRequest:
    return common_pb2.AttributeRequest(number=x)


def span(lo: float, hi: float) -> common_pb2.AttributeRequest:
    return common_pb2.AttributeRequest(range=common_pb2.Range(min=lo, max=hi))


def group(name: str = "g", cores=1, memory_gb=1, count: int = 1, placement=(), **attrs) -> irm_pb2.ResourceGroup:
    a = {"cores": cores if isinstance(cores, common_pb2.AttributeRequest) else number(cores),
         "memory_gb": memory_gb if isinstance(memory_gb, common_pb2.AttributeRequest) else number(memory_gb),
         **attrs}
    return irm_pb2.ResourceGroup(name=name, resource_type="vm", count=count, attributes=a, placement=list(placement))


def reserve(rm, rid: str, *groups: irm_pb2.ResourceGroup, tenant: str = T, **kw) -> irm_pb2.Reservation:
    return rm.Reserve(irm_pb2.ReserveRequest(tenant=tenant, request_id=rid, groups=list(groups), **kw),
                      timeout=TIMEOUT)


def refused(call, request) -> grpc.RpcError:  # type: ignore[no-untyped-def]
    with pytest.raises(grpc.RpcError) as info:
        call(request, timeout=TIMEOUT)
    return info.value


# -- item 6: a range whose max is below its min --------------------------------------------------

@pytest.mark.parametrize("attr", ["cores", "memory_gb"])
def test_a_consumable_range_with_max_below_min_is_invalid_naming_the_field(cloud: Cloud, attr: str) -> None:
    g = group(**{attr: span(4, 2)})
    e = refused(cloud.rm.Reserve, irm_pb2.ReserveRequest(tenant=T, request_id="r", groups=[g]))
    assert e.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert field_violations(e) == [(f"groups[0].attributes[{attr}].range",
                                    "min must not exceed max (nor NaN), got min 4 and max 2")]
    assert reserve(cloud.rm, "ok", group(**{attr: span(2, 4)})).groups[0].resources[0].attributes[attr] == 2


# -- item 8: empty ids ------------------------------------------------------------------------------

def test_an_empty_reservation_id_is_invalid_not_unknown(cloud: Cloud) -> None:
    e = refused(cloud.rm.GetMetrics, irm_pb2.GetMetricsRequest(tenant=T))
    assert e.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert field_violations(e) == [("reservation_id", "required: the id Reserve answered")]
    e = refused(cloud.rm.GetReservation, irm_pb2.GetReservationRequest(tenant=T, reservation_id=""))
    assert e.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert [f for f, _ in field_violations(e)] == ["reservation_id"]
    assert "required" in e.details()
    e = refused(cloud.rm.GetReservation, irm_pb2.GetReservationRequest(tenant=T, request_id=""))
    assert e.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert [f for f, _ in field_violations(e)] == ["request_id"]


def test_an_empty_placement_entry_is_invalid_naming_it(cloud: Cloud) -> None:
    req = irm_pb2.ReserveRequest(tenant=T, request_id="r", groups=[
        group("x", placement=["a"]), group("y", count=2, placement=["b", ""])])
    e = refused(cloud.rm.Reserve, req)
    assert e.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert field_violations(e) == [("groups[1].placement[1]", "required: a host id (DiscoverResources lists them)")]


# -- item 9: QuotePrice checks what Reserve checks ----------------------------------------------------

def test_quote_refuses_constraints_as_reserve_does(cloud: Cloud) -> None:
    c = irm_pb2.GroupConstraint(kind=2, group_a="g", group_b="g")
    for call, req in ((cloud.rm.QuotePrice, irm_pb2.QuotePriceRequest(tenant=T, groups=[group()], constraints=[c])),
                      (cloud.rm.Reserve, irm_pb2.ReserveRequest(tenant=T, request_id="r", groups=[group()],
                                                                constraints=[c]))):
        e = refused(call, req)
        assert e.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert [f for f, _ in field_violations(e)] == ["constraints"]


def test_quote_refuses_pinned_hosts_as_reserve_does(cloud: Cloud) -> None:
    for g, code, words in ((group(placement=["nope"]), grpc.StatusCode.NOT_FOUND, "host 'nope' is not managed here"),
                           (group(placement=["a"], frequency_ghz=number(3.0)), grpc.StatusCode.FAILED_PRECONDITION,
                            "host 'a' (2.2 GHz")):
        quote = refused(cloud.rm.QuotePrice, irm_pb2.QuotePriceRequest(tenant=T, groups=[g]))
        res = refused(cloud.rm.Reserve, irm_pb2.ReserveRequest(tenant=T, request_id="r", groups=[g]))
        assert quote.code() == res.code() == code
        assert words in quote.details() and quote.details() == res.details()


def test_quote_and_reserve_cap_the_vms_of_one_request(cloud: Cloud) -> None:
    groups = [group(f"g{i}", count=1000) for i in range(MAX_INSTANCES // 1000 + 1)]
    want = [("groups", f"{len(groups) * 1000} VMs in one request; at most {MAX_INSTANCES} (all groups together): "
                       "split the request")]
    e = refused(cloud.rm.QuotePrice, irm_pb2.QuotePriceRequest(tenant=T, groups=groups))
    assert e.code() == grpc.StatusCode.INVALID_ARGUMENT and field_violations(e) == want
    e = refused(cloud.rm.Reserve, irm_pb2.ReserveRequest(tenant=T, request_id="r", groups=groups))
    assert e.code() == grpc.StatusCode.INVALID_ARGUMENT and field_violations(e) == want


def test_a_quote_of_more_than_fits_prices_the_rest_at_the_dearest_matching_host(cloud: Cloud) -> None:
    # 32 cores in all, 8 of them taken (fullest-first packing picks a by id): 8 fit on a (2.2 GHz), 16 on b
    # (3.0 GHz), 8 fit nowhere now and are priced at the dearest matching host (b).
    cloud.rm.Reserve(irm_pb2.ReserveRequest(tenant=T, request_id="taken", groups=[group(count=8)]), timeout=TIMEOUT)
    quote = cloud.rm.QuotePrice(irm_pb2.QuotePriceRequest(tenant=T, groups=[group(count=32)]), timeout=TIMEOUT)
    cost = cloud.irm.cost
    want = 8 * cost.price_per_minute(1, 1, 2.2) + 24 * cost.price_per_minute(1, 1, 3.0)
    assert quote.price_per_minute == pytest.approx(want)
    # More than fits even on empty hosts is refused as Reserve refuses it (review 25; it was priced so too).
    e = refused(cloud.rm.QuotePrice, irm_pb2.QuotePriceRequest(tenant=T, groups=[group(count=40)]))
    assert e.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "can never fit" in e.details() and "could hold at most 32 of them even empty" in e.details()


# -- item 5: never fits vs full now -----------------------------------------------------------------

def test_more_vms_than_every_matching_host_holds_is_failed_precondition(cloud: Cloud) -> None:
    e = refused(cloud.rm.Reserve, irm_pb2.ReserveRequest(tenant=T, request_id="r", groups=[group(count=40)]))
    assert e.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "can never fit" in e.details() and "could hold at most 32 of them even empty" in e.details()
    # the same shapes over two groups: each alone fits, together they cannot
    e = refused(cloud.rm.Reserve, irm_pb2.ReserveRequest(tenant=T, request_id="r", groups=[
        group("x", count=20), group("y", count=20)]))
    assert e.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "the unpinned groups need 40 cores / 40 GB together; the hosts matching them have 32 cores" in e.details()
    assert cloud.irm.store.overbooking() == [] and all(h.used_cores == 0 for h in cloud.irm.store.hosts())


def test_pinned_vms_beyond_one_host_are_failed_precondition(cloud: Cloud) -> None:
    e = refused(cloud.rm.Reserve, irm_pb2.ReserveRequest(tenant=T, request_id="r", groups=[
        group("x", cores=10, placement=["a"]), group("y", cores=10, placement=["a"])]))
    assert e.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "the VMs pinned to host 'a' need 20 cores / 2 GB together; it has 16 cores / 64 GB in all" in e.details()


def test_a_request_that_fits_once_others_release_stays_resource_exhausted(cloud: Cloud) -> None:
    reserve(cloud.rm, "hold", group(cores=10, placement=["a"]), tenant="bob")
    e = refused(cloud.rm.Reserve, irm_pb2.ReserveRequest(tenant=T, request_id="r", groups=[
        group(cores=10, placement=["a"])]))
    assert e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    e = refused(cloud.rm.Reserve, irm_pb2.ReserveRequest(tenant=T, request_id="r2", groups=[group(cores=10, count=2)]))
    assert e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "right now" in e.details()


# -- item 4: a watch of another type -----------------------------------------------------------------

def resources(events: list[irm_pb2.CapacityEvent]) -> list[str]:
    """The hosts the events name (a coalesced event carries several: `resource` and `more`)."""
    return [r.id for ev in events if ev.HasField("resource") for r in (ev.resource, *ev.more)]


class _Active:
    def is_active(self) -> bool:
        return True


@pytest.mark.parametrize(("resource_type", "updates"), [("fpga", []), ("vm", ["a"]), ("", ["a"])])
def test_a_watch_gets_live_events_of_its_resource_type_only(cloud: Cloud, resource_type: str,
                                                           updates: list[str]) -> None:
    stream = cloud.irm.WatchCapacity(irm_pb2.WatchCapacityRequest(tenant=T, resource_type=resource_type), _Active())
    snapshot = []
    while not snapshot or snapshot[-1].kind != irm_pb2.CapacityEvent.KIND_SNAPSHOT_END:
        snapshot.append(next(stream))                   # subscribed from here on
    assert resources(snapshot) == ([] if resource_type == "fpga" else ["a", "b"])
    reserve(cloud.rm, "r", group(placement=["a"]))
    cloud.irm.watchers.close()                          # ends the stream after what was published
    live = list(stream)
    assert resources(live) == updates
    assert all(ev.kind == irm_pb2.CapacityEvent.KIND_UPDATED and ev.resource.resource_type == "vm" for ev in live)


# -- item 7: ReserveBatch with a NUL in one request ----------------------------------------------------

def test_a_nul_in_one_batched_request_refuses_that_request_only(cloud: Cloud) -> None:
    R = irm_pb2.ReserveRequest  # noqa: N806
    out = cloud.rm.ReserveBatch(irm_pb2.ReserveBatchRequest(requests=[
        R(tenant=T, request_id="ok1", groups=[group()]),
        R(tenant="bob", request_id="bad\0id", groups=[group()]),
        R(tenant=T, request_id="ok2", groups=[group(name="n\0")]),
        R(tenant=T, request_id="ok3", groups=[group(placement=["b"])]),
    ]), timeout=TIMEOUT).outcomes
    assert [o.WhichOneof("result") for o in out] == ["reservation", "error", "error", "reservation"]
    nul = "must not contain a NUL character (\\x00)"
    for o, path in ((out[1], "request_id"), (out[2], "groups[0].name")):
        assert o.error.code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
        assert o.error.message == f"{path}: {nul}"
        assert [(v.field, v.description) for v in o.error.field_violations] == [(path, nul)]
    assert out[0].reservation.request_id == "ok1" and out[3].reservation.request_id == "ok3"
    assert out[3].reservation.groups[0].resources[0].physical_id == "b"
    got = cloud.rm.GetReservation(irm_pb2.GetReservationRequest(tenant=T, request_id="ok1"), timeout=TIMEOUT)
    assert got.id == out[0].reservation.id
    # every request bad: each its own error, nothing reserved
    out = cloud.rm.ReserveBatch(irm_pb2.ReserveBatchRequest(requests=[
        R(tenant="x\0", request_id="a", groups=[group()])]), timeout=TIMEOUT).outcomes
    assert [(o.error.code, o.error.message) for o in out] == [(grpc.StatusCode.INVALID_ARGUMENT.value[0],
                                                                f"tenant: {nul}")]


# -- item 3: hosts that left or shrank at restart --------------------------------------------------------

SHRUNK = """
hosts:
  - {id: a, site: s1, rack: r1, cores: 4, memory_gb: 8, frequency_ghz: 2.2, agent: '127.0.0.1:1'}
"""


def test_a_host_that_left_keeps_its_vms_reachable_and_a_shrunk_host_is_never_overbooked(tmp_path: Path) -> None:
    c = start_cloud(tmp_path)
    on_a = reserve(c.rm, "x1", group(cores=10, memory_gb=32, placement=["a"]))
    on_b = reserve(c.rm, "x2", group(cores=2, memory_gb=2, placement=["b"]))
    c.stop()
    c.irm.db.dispose()

    c = start_cloud(tmp_path, SHRUNK)             # a shrank below what it holds, b left
    try:
        [a] = c.rm.DiscoverResources(irm_pb2.DiscoverResourcesRequest(), timeout=TIMEOUT).resources
        assert (dict(a.capacity), dict(a.used)) == ({"cores": 10, "memory_gb": 32}, {"cores": 10, "memory_gb": 32})
        assert c.irm.store.overbooking() == []
        vm = c.rm.GetReservation(irm_pb2.GetReservationRequest(tenant=T, reservation_id=on_b.id),
                                 timeout=TIMEOUT).groups[0].resources[0]
        assert (vm.address, vm.location.rack, vm.location.host) == ("127.0.0.1:2", "r2", "b")
        # its agent is told of the release (once it knew the VM)
        told: queue.Queue[tuple[str, str]] = queue.Queue()

        class Agent:
            def __init__(self, address: str) -> None:
                self.address = address

            def ReleaseVm(self, request, timeout):  # noqa: N802, ANN001
                told.put((self.address, request.vm_id))

        c.irm._agent = Agent  # type: ignore[method-assign]
        assert c.irm.store.mark_seen(vm.id)
        c.rm.ReleaseReservation(irm_pb2.ReleaseReservationRequest(tenant=T, reservation_id=on_b.id),
                                timeout=TIMEOUT)
        assert told.get(timeout=10) == ("127.0.0.1:2", vm.id)
        c.rm.ReleaseReservation(irm_pb2.ReleaseReservationRequest(tenant=T, reservation_id=on_a.id),
                                timeout=TIMEOUT)
    finally:
        c.stop()
        c.irm.db.dispose()

    c = start_cloud(tmp_path, SHRUNK)             # drained: the inventory's size applies
    try:
        [a] = c.rm.DiscoverResources(irm_pb2.DiscoverResourcesRequest(), timeout=TIMEOUT).resources
        assert dict(a.capacity) == {"cores": 4, "memory_gb": 8}
    finally:
        c.stop()
        c.irm.db.dispose()
