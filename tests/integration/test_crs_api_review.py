"""The CRS's answers when a manager is down, refuses a field, or is impersonated, and its cap on watch streams.

The CRS and compute IRMs serve on loopback gRPC in this process (real services, SQLite), as in
test_crs_retries.py: a manager is stopped, restarted or impersonated by stopping its server or calling the
registry directly.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from cross_resource_scheduler import service as crs_service
from harness.v1 import common_pb2, irm_pb2, irm_pb2_grpc, registry_pb2, registry_pb2_grpc
from irm_compute import service as compute_service
from services import server as srv
from services.errors import field_violations
from services.tls import plain_channel
from tests.conftest import eventually

INVENTORIES = {
    "compute-a": "hosts:\n  - {id: a-h1, site: site-a, rack: ra-1, cores: 8, memory_gb: 32, frequency_ghz: 2.2, "
                 "traits: [ssd]}\n",
    "compute-b": "hosts:\n  - {id: b-h1, site: site-b, rack: rb-1, cores: 8, memory_gb: 32, frequency_ghz: 2.6, "
                 "traits: [site-b]}\n",
}
# The size of the CRS's worker pool (services.server.create_server's default).
POOL = 32


def vm_group(name: str, cores: float, trait: str = "") -> irm_pb2.ResourceGroup:
    return irm_pb2.ResourceGroup(name=name, resource_type="vm", count=1,
                                 required_traits=[trait] if trait else [], attributes={
                                     "cores": common_pb2.AttributeRequest(number=cores),
                                     "memory_gb": common_pb2.AttributeRequest(number=1)})


@dataclass
class Cloud:
    tmp: Path
    crs: crs_service.Crs
    address: str
    stub: irm_pb2_grpc.ResourceManagerStub
    reg: registry_pb2_grpc.ManagerRegistryStub
    irms: dict[str, srv.Running] = field(default_factory=dict)
    running: list[srv.Running] = field(default_factory=list)

    def start_irm(self, name: str) -> str:
        """Start (or restart, on its database and a new port) compute IRM `name`; its address."""
        inv = self.tmp / f"{name}.yaml"
        inv.write_text(INVENTORIES[name])
        comp = compute_service.component(compute_service.ComputeConfig(
            address="127.0.0.1:0", name=name, database=f"sqlite:///{self.tmp / (name + '.db')}", inventory=str(inv),
            crs_address=self.address, heartbeat_interval_s=0.2))
        r = srv.start("127.0.0.1:0", [comp])
        self.running.append(r)
        self.irms[name] = r
        return f"127.0.0.1:{r.port}"

    def stop_irm(self, name: str) -> None:
        self.irms.pop(name).stop(0.5)

    def managers(self) -> dict[str, registry_pb2.ManagerInfo]:
        return {m.name: m for m in self.reg.ListManagers(registry_pb2.ListManagersRequest(), timeout=5).managers}

    def hosts(self) -> int:
        return len(self.stub.DiscoverResources(irm_pb2.DiscoverResourcesRequest(), timeout=5).resources)


@pytest.fixture
def make_cloud(tmp_path) -> Iterator:
    made: list[Cloud] = []

    def make(heartbeat_timeout_s: float = 600.0, irms: tuple[str, ...] = ()) -> Cloud:
        comp = crs_service.component(crs_service.CrsConfig(
            address="127.0.0.1:0", database=f"sqlite:///{tmp_path / 'crs.db'}", heartbeat_interval_s=0.2,
            heartbeat_timeout_s=heartbeat_timeout_s, seed=1))
        r = srv.start("127.0.0.1:0", [comp])
        address = f"127.0.0.1:{r.port}"
        ch = plain_channel(address)
        cloud = Cloud(tmp_path, comp.extra["crs"], address, irm_pb2_grpc.ResourceManagerStub(ch),
                      registry_pb2_grpc.ManagerRegistryStub(ch), running=[r])
        made.append(cloud)
        for name in irms:
            cloud.start_irm(name)
        eventually(lambda: cloud.hosts() == len(irms), what=f"the hosts of {irms} in the CRS's view")
        return cloud

    yield make
    for cloud in made:
        for r in reversed(cloud.running):
            r.stop(0.5)


def _error(call, request) -> grpc.RpcError:  # type: ignore[no-untyped-def]
    with pytest.raises(grpc.RpcError) as e:
        call(request, timeout=30)
    return e.value


# -- a type whose manager is down ------------------------------------------------------------------------------


def test_a_type_whose_manager_is_down_is_unavailable_and_an_unknown_type_invalid(make_cloud):
    cloud = make_cloud(heartbeat_timeout_s=1.0, irms=("compute-a",))
    cloud.stop_irm("compute-a")
    eventually(lambda: not cloud.managers()["compute-a"].up, what="compute-a marked down")

    for call, request in [
        (cloud.stub.Reserve, irm_pb2.ReserveRequest(tenant="t", request_id="r1", groups=[vm_group("g", 1)])),
        (cloud.stub.QuotePrice, irm_pb2.QuotePriceRequest(tenant="t", groups=[vm_group("g", 1)])),
    ]:
        e = _error(call, request)
        # Retryable: the type exists, its manager will be back.
        assert e.code() == grpc.StatusCode.UNAVAILABLE, e.details()
        assert "the manager of 'vm' (compute-a) is down; retry later" in e.details()
        assert field_violations(e) == []
    assert _error(cloud.stub.GetReservation, irm_pb2.GetReservationRequest(tenant="t", request_id="r1")).code() \
        == grpc.StatusCode.NOT_FOUND

    # Input no manager could take is refused now, against what compute-a last described, not after a retry.
    e = _error(cloud.stub.Reserve, irm_pb2.ReserveRequest(tenant="t", request_id="r2", groups=[vm_group("g", 64)]))
    assert e.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert [f for f, _ in field_violations(e)] == ["groups[0].attributes[cores]"]

    # A type no registered manager offers stays INVALID_ARGUMENT (never retry), naming the field.
    gpu = irm_pb2.ResourceGroup(name="g", resource_type="gpu", count=1)
    for call, request in [
        (cloud.stub.Reserve, irm_pb2.ReserveRequest(tenant="t", request_id="r3", groups=[gpu])),
        (cloud.stub.QuotePrice, irm_pb2.QuotePriceRequest(tenant="t", groups=[gpu])),
    ]:
        e = _error(call, request)
        assert e.code() == grpc.StatusCode.INVALID_ARGUMENT
        fields = dict(field_violations(e))
        assert list(fields) == ["groups[0].resource_type"] and "no manager provides 'gpu'" in fields[
            "groups[0].resource_type"]


# -- a manager's refusal of a field -------------------------------------------------------------------------------


def test_a_field_a_manager_refuses_is_named_in_the_tenants_request(make_cloud):
    cloud = make_cloud(irms=("compute-a", "compute-b"))
    b = irm_pb2_grpc.ResourceManagerStub(plain_channel(f"127.0.0.1:{cloud.irms['compute-b'].port}"))
    # 1.5 cores: whole cores only. Since review 25 the CRS refuses it itself (the managers describe cores as whole),
    # naming the field of the tenant's request, before placing; a manager's own refusal relayed with the tenant's
    # field path is tests/unit/test_crs_errors.py's.
    groups = [vm_group("remote", 2, "site-b"), vm_group("local", 1.5, "ssd")]
    for call, request in [
        (cloud.stub.QuotePrice, irm_pb2.QuotePriceRequest(tenant="t", groups=groups)),
        (cloud.stub.Reserve, irm_pb2.ReserveRequest(tenant="t", request_id="r1", groups=groups)),
        (cloud.stub.Reserve, irm_pb2.ReserveRequest(tenant="t", request_id="r2", groups=groups[1:])),
    ]:
        e = _error(call, request)
        assert e.code() == grpc.StatusCode.INVALID_ARGUMENT
        index = len(request.groups) - 1
        violations = field_violations(e)
        assert [f for f, _ in violations] == [f"groups[{index}].attributes[cores]"], violations
        assert "whole number" in violations[0][1] and "1.5" in violations[0][1]
        assert f"groups[{index}].attributes[cores]" in e.details()
    # compute-b's part of the refused reservation went back.
    assert b.ListReservations(irm_pb2.ListReservationsRequest(tenant="t"), timeout=5).reservations == []


# -- registering a name that is taken ---------------------------------------------------------------------------


def test_a_live_managers_name_is_not_taken_by_another_address(make_cloud):
    cloud = make_cloud(irms=("compute-a",))
    real = cloud.managers()["compute-a"].address
    e = _error(cloud.reg.RegisterManager, registry_pb2.RegisterManagerRequest(
        name="compute-a", address="127.0.0.1:9", resource_types=["vm"]))
    assert e.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert f"the manager named 'compute-a' is up at {real}" in e.details()
    kept = cloud.managers()["compute-a"]
    assert (kept.address, kept.up) == (real, True)
    res = cloud.stub.Reserve(irm_pb2.ReserveRequest(tenant="t", request_id="r1", groups=[vm_group("g", 1)]),
                             timeout=30)
    assert res.groups[0].manager == "compute-a" and res.state == irm_pb2.Reservation.STATE_ACTIVE
    # The manager itself, registering again where it is: as before, accepted.
    cloud.reg.RegisterManager(registry_pb2.RegisterManagerRequest(
        name="compute-a", address=real, resource_types=["vm"]), timeout=5)
    assert cloud.managers()["compute-a"].address == real


def test_a_manager_restarted_on_another_port_takes_its_name_back(make_cloud):
    # Heartbeats are not missed for 600 s: the old entry stays up, and only its silence lets the new address in.
    cloud = make_cloud(heartbeat_timeout_s=600.0, irms=("compute-a",))
    assert cloud.managers()["compute-a"].up
    cloud.stop_irm("compute-a")
    # (Should the same port come back, the registration is the idempotent one: still accepted.)
    new = cloud.start_irm("compute-a")
    eventually(lambda: cloud.managers()["compute-a"].address == new, what="compute-a registered at its new port")
    assert cloud.managers()["compute-a"].up
    eventually(lambda: cloud.hosts() == 1, what="compute-a's host followed at its new address")
    # Until it has described its types again a Reserve is UNAVAILABLE (retry later): wait for the description.
    eventually(lambda: [t.name for t in cloud.stub.DescribeAllocationSpec(
        irm_pb2.DescribeAllocationSpecRequest(tenant="t"), timeout=5).resource_types] == ["vm"],
        what="compute-a described vm again")
    res = cloud.stub.Reserve(irm_pb2.ReserveRequest(tenant="t", request_id="r1", groups=[vm_group("g", 1)]),
                             timeout=30)
    assert res.state == irm_pb2.Reservation.STATE_ACTIVE


# -- the cap on WatchCapacity streams ---------------------------------------------------------------------------


def test_watch_capacity_is_capped_well_below_the_worker_pool(make_cloud):
    cloud = make_cloud()
    cap = crs_service.MAX_WATCHES
    assert cap < POOL // 2
    def watch(tenant: str = "late"):  # type: ignore[no-untyped-def]
        return cloud.stub.WatchCapacity(irm_pb2.WatchCapacityRequest(tenant=tenant), timeout=60)

    streams = [watch(f"t{i}") for i in range(cap)]      # tenants of their own: one may hold 2
    try:
        # Each has its first message: each holds a worker now.
        assert all(next(s).kind == irm_pb2.CapacityEvent.KIND_SNAPSHOT_END for s in streams)
        for _ in range(POOL):          # as many again as the pool has workers: each refused at once
            e = _error(lambda r, timeout: next(cloud.stub.WatchCapacity(r, timeout=timeout)),
                       irm_pb2.WatchCapacityRequest(tenant="t"))
            assert e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert f"{cap} WatchCapacity streams are open on this CRS" in e.details()
            assert "DiscoverResources" in e.details()
        ch = plain_channel(cloud.address)
        assert health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=5).status == \
            health_pb2.HealthCheckResponse.SERVING
        assert list(cloud.stub.DescribeAllocationSpec(irm_pb2.DescribeAllocationSpecRequest(tenant="t"),
                                                      timeout=5).resource_types) == []   # no manager yet
        streams.pop().cancel()

        def opens() -> bool:
            s = watch()
            try:
                ok = next(s).kind == irm_pb2.CapacityEvent.KIND_SNAPSHOT_END
            except grpc.RpcError as err:
                assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
                s.cancel()
                return False
            streams.append(s)
            return ok

        eventually(opens, what="the slot of the cancelled stream taken by a new one")
        assert len(streams) == cap
    finally:
        for s in streams:
            s.cancel()
