"""The CRS's error reasons (google.rpc.ErrorInfo, domain "harness.v1"): its own refusals (never fits, over the
price cap, capacity in use, a search that gave up, a manager down or not answering, a stream cap), and a
manager's refusal passed on to the tenant with the manager's reason kept. Over real gRPC servers (a CRS and a
compute IRM in this process) where the wire matters; decoded only with the google.rpc protos."""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

import irm_compute.store as compute_store
from cross_resource_scheduler import placement
from cross_resource_scheduler import service as crs_service
from cross_resource_scheduler.placement import PlacementRequest, Unschedulable, schedule
from cross_resource_scheduler.registry import ManagerState
from cross_resource_scheduler.service import Crs, CrsConfig
from cross_resource_scheduler.topology import TopologyModel
from cross_resource_scheduler.view import CapacityView
from harness.v1 import common_pb2, irm_pb2, irm_pb2_grpc
from irm_compute.service import ComputeConfig, ComputeIrm
from irm_compute.service import component as compute_component
from services import errors, server
from services.errors import FailedPrecondition, HarnessError
from services.tls import plain_channel
from services.watch import Broadcaster
from tests.conftest import eventually
from tests.unit.test_crs_placement import add
from tests.unit.test_crs_placement import group as demand
from tests.unit.test_crs_search import CORNER, DEFAULT, _corner_view
from tests.unit.test_crs_service_parse import _group, _specs
from tests.unit.test_error_reasons import (
    INVENTORY,
    Rich,
    _rich_details,
    group,
    refused,
    reserve_request,
    rich,
)

TIMEOUT = 30
T = "alice"
MANAGER = "compute-x"


# -- a CRS and a compute IRM over gRPC ------------------------------------------------------------------------------

@dataclass
class Cloud:
    crs: Crs
    irm: ComputeIrm
    rm: irm_pb2_grpc.ResourceManagerStub          # the CRS's, as a tenant calls it
    compute_rm: irm_pb2_grpc.ResourceManagerStub  # the compute IRM's own
    stops: list[Callable[[], None]]


def start_cloud(tmp_path: Path, patch: Callable[[ComputeIrm], None] | None = None) -> Cloud:
    """`patch`: changes the compute IRM's servicer before its server binds it."""
    stops: list[Callable[[], None]] = []
    crs_comp = crs_service.component(CrsConfig(state_dir=str(tmp_path / "crs"), address="127.0.0.1:0",
                                               heartbeat_interval_s=0.3, irm_timeout_s=10))
    crs_running = server.start("127.0.0.1:0", [crs_comp])
    stops.append(lambda: crs_running.stop(0))
    (tmp_path / "hosts.yaml").write_text(INVENTORY)
    comp = compute_component(ComputeConfig(
        name=MANAGER, state_dir=str(tmp_path / "compute"), address="127.0.0.1:0",
        inventory=str(tmp_path / "hosts.yaml"), crs_address=f"127.0.0.1:{crs_running.port}",
        heartbeat_interval_s=0.3))
    if patch is not None:
        patch(comp.extra["irm"])
    compute_running = server.start("127.0.0.1:0", [comp])
    stops.insert(0, lambda: compute_running.stop(0))
    crs_channel = plain_channel(f"127.0.0.1:{crs_running.port}")
    compute_channel = plain_channel(f"127.0.0.1:{compute_running.port}")
    stops[:0] = [crs_channel.close, compute_channel.close]
    crs: Crs = crs_comp.extra["crs"]
    rm = irm_pb2_grpc.ResourceManagerStub(crs_channel)
    eventually(lambda: len(rm.DiscoverResources(irm_pb2.DiscoverResourcesRequest(), timeout=TIMEOUT).resources) == 2
               and any(s.name == "vm" for s in rm.DescribeAllocationSpec(
                   irm_pb2.DescribeAllocationSpecRequest(), timeout=TIMEOUT).resource_types),
               what="the compute IRM's hosts and description in the CRS")
    return Cloud(crs, comp.extra["irm"], rm, irm_pb2_grpc.ResourceManagerStub(compute_channel), stops)


@pytest.fixture
def cloud(tmp_path: Path) -> Iterator[Cloud]:
    c = start_cloud(tmp_path)
    yield c
    for stop in c.stops:
        stop()


def test_the_crs_passes_on_a_managers_refusal_with_its_reason(tmp_path: Path) -> None:
    def patch(irm: ComputeIrm) -> None:
        def reserve(request, context):  # type: ignore[no-untyped-def]
            # What the compute IRM says of a pinned host that no longer matches the group (its inventory changed).
            raise FailedPrecondition("group 'g': host 'a' does not match the group's frequency or traits",
                                     reason="NEVER_FITS", metadata={"host": "a"})
        irm.Reserve = reserve  # type: ignore[method-assign]

    c = start_cloud(tmp_path, patch)
    try:
        e = refused(c.rm.Reserve, reserve_request("r", group(cores=2)))
        assert e.code() == grpc.StatusCode.FAILED_PRECONDITION
        got = rich(e)
        assert (got.reason, got.domain) == ("NEVER_FITS", "harness.v1")
        assert got.metadata == {"host": "a", "manager": MANAGER}     # the manager's own, and who said it
        assert e.details().startswith(f"manager {MANAGER!r}: group 'g': host 'a' does not match")
    finally:
        for stop in c.stops:
            stop()


def test_a_managers_capacity_in_use_reaches_the_tenant_with_its_retry_delay(cloud: Cloud, monkeypatch) -> None:
    # The compute IRM's hosts fill up without the CRS hearing of it (its capacity events are held back): the CRS
    # places on hosts its view shows free and the manager refuses each with CAPACITY_IN_USE and its own delay.
    monkeypatch.setattr(compute_store, "RETRY_LATER_S", 7.0)
    cloud.irm._publish = lambda touched: None  # type: ignore[method-assign]
    cloud.compute_rm.Reserve(reserve_request("fill", group("x", cores=16, placement=["a"]),
                                             group("y", cores=16, placement=["b"]), tenant="bob"), timeout=TIMEOUT)
    e = refused(cloud.rm.Reserve, reserve_request("r", group(cores=2)))
    assert e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    got = rich(e)
    assert got.reason == "CAPACITY_IN_USE" and got.metadata["manager"] == MANAGER
    assert got.retry_s == pytest.approx(7.0)                    # the manager's RetryInfo, not one of the CRS's
    assert "any more" in e.details()


def test_the_crs_says_never_fits_over_price_and_capacity_in_use_itself(cloud: Cloud) -> None:
    e = refused(cloud.rm.Reserve, reserve_request("big", group(count=40)))          # 32 cores in all
    assert e.code() == grpc.StatusCode.FAILED_PRECONDITION and rich(e).reason == "NEVER_FITS"
    e = refused(cloud.rm.QuotePrice, irm_pb2.QuotePriceRequest(tenant=T, groups=[group(count=40)]))
    assert e.code() == grpc.StatusCode.FAILED_PRECONDITION and rich(e).reason == "NEVER_FITS"

    e = refused(cloud.rm.Reserve, reserve_request("cheap", group(cores=4), max_price_per_minute=1e-6))
    assert e.code() == grpc.StatusCode.FAILED_PRECONDITION
    got = rich(e)
    assert got.reason == "OVER_PRICE" and float(got.metadata["maxPricePerMinute"]) == 0

    cloud.rm.Reserve(reserve_request("fill", group(cores=16, count=2)), timeout=TIMEOUT)
    e = refused(cloud.rm.Reserve, reserve_request("more", group(cores=2)))
    assert e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    got = rich(e)
    assert got.reason == "CAPACITY_IN_USE" and got.retry_s is not None and got.retry_s > 0


def test_a_crs_watch_beyond_the_stream_cap_is_stream_cap(cloud: Cloud) -> None:
    cloud.crs.watchers = Broadcaster(max_streams=0, full="WatchCapacity streams are open on this CRS")
    with pytest.raises(grpc.RpcError) as info:
        next(iter(cloud.rm.WatchCapacity(irm_pb2.WatchCapacityRequest(tenant=T), timeout=TIMEOUT)))
    assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and rich(info.value).reason == "STREAM_CAP"


# -- managers down or not answering (in-process; the status as the interceptor would send it) ------------------------

def _status(error: HarnessError) -> Rich:
    st = errors.to_status(error)
    return _rich_details(list(st.details), st.code)


@pytest.fixture
def crs(tmp_path: Path) -> Iterator[Crs]:
    c = Crs(CrsConfig(state_dir=str(tmp_path), irm_timeout_s=2))
    yield c
    c.registry.stop()
    c.db.dispose()


def _manager(crs: Crs, name: str, up: bool, address: str = "127.0.0.1:9") -> None:
    specs = [irm_pb2.ResourceTypeSpec(name="vm", attributes=list(_specs()["vm"].values()))]
    crs.registry.managers[name] = ManagerState(name, address, ["vm"], 0.0, specs=specs, up=up)


def test_a_type_whose_managers_are_down_is_manager_down(crs: Crs) -> None:
    _manager(crs, "compute-a", up=False)
    with pytest.raises(HarnessError) as info:
        crs.Reserve(irm_pb2.ReserveRequest(tenant=T, request_id="r", groups=[_group(2)]), None)
    got = _status(info.value)
    assert got.code == 14 and got.reason == "MANAGER_DOWN" and got.metadata == {"manager": "compute-a"}
    assert got.retry_s is not None


def test_a_manager_that_does_not_answer_is_manager_unavailable(crs: Crs) -> None:
    _manager(crs, "m", up=True, address="127.0.0.1:9")          # nothing listens there
    crs.view.upsert("m", common_pb2.PhysicalResource(
        id="h0", resource_type="vm", capacity={"cores": 8, "memory_gb": 32}, used={"cores": 0, "memory_gb": 0},
        location=common_pb2.Location(site="s", rack="r", host="h0"), generation=1))
    with pytest.raises(HarnessError) as info:
        crs.Reserve(irm_pb2.ReserveRequest(tenant=T, request_id="r", groups=[_group(2)]), None)
    got = _status(info.value)
    assert got.code == 14 and got.reason == "MANAGER_UNAVAILABLE" and got.metadata == {"manager": "m"}
    assert got.retry_s is not None


# -- placement's verdicts ---------------------------------------------------------------------------------------------

def test_placement_names_each_of_its_refusals(monkeypatch) -> None:
    rng = random.Random(1)
    view = _corner_view()
    with pytest.raises(Unschedulable) as info:                  # a group alone cannot fit the empty cloud
        schedule(PlacementRequest([demand("b", 9, 8)]), view, DEFAULT, TopologyModel(), rng)
    assert info.value.reason == "NEVER_FITS"

    full = CapacityView()
    add(full, "h1", cores=8, used=8)
    with pytest.raises(Unschedulable) as info:                  # fits once the 8 cores in use are released
        schedule(PlacementRequest([demand("a", 1, 4)]), full, DEFAULT, TopologyModel(), rng)
    assert info.value.reason == "CAPACITY_IN_USE"

    small = CapacityView()
    add(small, "h1", cores=2)
    add(small, "h2", cores=8, manager="away")
    small.set_down("away", True)
    with pytest.raises(Unschedulable) as info:                  # fits only on a down manager's host
        schedule(PlacementRequest([demand("a", 1, 4)]), small, DEFAULT, TopologyModel(), rng)
    assert info.value.reason == "MANAGER_DOWN" and info.value.down == ["away"]

    monkeypatch.setattr(placement, "SEARCH_BUDGET", 0)          # nothing proven: the search gave up
    refusals = []
    for seed in range(60):
        try:
            schedule(CORNER, view, DEFAULT, TopologyModel(), random.Random(seed))
        except Unschedulable as e:
            refusals.append(e.reason)
    assert refusals and set(refusals) == {"SEARCH_GAVE_UP"}


def test_a_search_that_gave_up_reaches_the_tenant_as_search_gave_up(crs: Crs, monkeypatch) -> None:
    specs = _specs()
    crs._specs = lambda: specs  # type: ignore[method-assign]
    crs.view.upsert("m", common_pb2.PhysicalResource(
        id="h0", resource_type="vm", capacity={"cores": 8, "memory_gb": 32}, used={"cores": 0, "memory_gb": 0},
        location=common_pb2.Location(site="s", rack="r", host="h0"), generation=1))

    def gave_up(*args, **kwargs):  # type: ignore[no-untyped-def]
        raise Unschedulable("no placement meeting the constraints was found in what is free now")

    monkeypatch.setattr(crs_service, "schedule", gave_up)
    with pytest.raises(HarnessError) as info:
        crs.QuotePrice(irm_pb2.QuotePriceRequest(tenant=T, groups=[_group(2)]), None)
    got = _status(info.value)
    assert got.code == 8 and got.reason == "SEARCH_GAVE_UP" and got.retry_s is None


def test_a_refusal_inside_a_reserve_batch_keeps_its_reason(cloud: Cloud) -> None:
    # The CRS batches concurrent reserves to one manager (ReserveBatch): each refusal carries the google.rpc
    # details its own Reserve would have, and the CRS's Refused passes them on as that call's error would.
    from cross_resource_scheduler.delegation import Refused

    reply = cloud.compute_rm.ReserveBatch(irm_pb2.ReserveBatchRequest(requests=[
        reserve_request("ok", group(cores=1)),
        reserve_request("dear", group(cores=4), max_price_per_minute=0.001),
    ]), timeout=TIMEOUT)
    assert reply.outcomes[0].HasField("reservation")
    err = reply.outcomes[1].error
    code = next(c for c in grpc.StatusCode if c.value[0] == err.code)
    refusal = Refused(code, err.message, [], list(err.details))
    assert errors.error_info(refusal) is not None and errors.error_info(refusal)[0] == "OVER_PRICE"
    passed_on = errors.from_rpc_error(f"manager {MANAGER!r}", refusal, "nothing was reserved")
    assert passed_on.code == grpc.StatusCode.FAILED_PRECONDITION and passed_on.reason == "OVER_PRICE"
