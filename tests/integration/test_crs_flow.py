"""The CRS and two compute IRMs as real processes, driven through gRPC."""

from __future__ import annotations

import grpc
import pytest

from cross_resource_scheduler.service import irm_request_id
from harness.v1 import common_pb2, irm_pb2, irm_pb2_grpc, registry_pb2, registry_pb2_grpc
from services.errors import field_violations
from services.tls import plain_channel
from tests.conftest import eventually

INVENTORY_B = """
hosts:
  - {id: b-h1, site: site-b, rack: rb-1, cores: 8, memory_gb: 32, frequency_ghz: 2.6, traits: [gpu-less, site-b]}
  - {id: b-h2, site: site-b, rack: rb-1, cores: 8, memory_gb: 32, frequency_ghz: 2.6, traits: [site-b]}
"""


def vm_group(name: str, count: int, cores: float, memory_gb: float, **kw) -> irm_pb2.ResourceGroup:
    return irm_pb2.ResourceGroup(
        name=name, resource_type="vm", count=count,
        attributes={"cores": common_pb2.AttributeRequest(number=cores),
                    "memory_gb": common_pb2.AttributeRequest(number=memory_gb)}, **kw)


@pytest.fixture
def cloud(suite, tmp_path):
    crs = suite.start("crs", heartbeat_interval_s=0.3, heartbeat_timeout_s=1.5)
    inv_b = tmp_path / "b.yaml"
    inv_b.write_text(INVENTORY_B)
    a = suite.start("compute", name="compute-a", crs_address=crs.address, heartbeat_interval_s=0.3)
    b = suite.start("compute", name="compute-b", crs_address=crs.address, heartbeat_interval_s=0.3,
                    inventory=str(inv_b))
    ch = plain_channel(crs.address)
    stub = irm_pb2_grpc.ResourceManagerStub(ch)
    reg = registry_pb2_grpc.ManagerRegistryStub(ch)
    # Both managers registered and their capacity streamed into the CRS.
    eventually(lambda: len(stub.DiscoverResources(irm_pb2.DiscoverResourcesRequest(tenant="t")).resources) == 8,
               what="8 hosts discovered through the CRS")
    yield {"crs": crs, "a": a, "b": b, "stub": stub, "reg": reg, "suite": suite}
    ch.close()


def irm_stub(proc) -> irm_pb2_grpc.ResourceManagerStub:
    return irm_pb2_grpc.ResourceManagerStub(plain_channel(proc.address))


def test_register_discover_quote_reserve_release(cloud):
    stub = cloud["stub"]
    managers = cloud["reg"].ListManagers(registry_pb2.ListManagersRequest()).managers
    assert sorted(m.name for m in managers) == ["compute-a", "compute-b"]
    assert all(m.up for m in managers)

    spec = stub.DescribeAllocationSpec(irm_pb2.DescribeAllocationSpecRequest(tenant="t"))
    assert {a.name for a in spec.resource_types[0].attributes} == {"cores", "memory_gb", "frequency_ghz"}

    groups = [
        vm_group("master", 1, 4, 8, required_traits=["ssd"]),
        vm_group("workers", 3, 2, 4),
    ]
    constraints = [
        irm_pb2.GroupConstraint(expression="hops(master, workers) <= 2"),
        irm_pb2.GroupConstraint(kind=irm_pb2.GroupConstraint.KIND_DIFFERENT_HOST, group_a="workers",
                                group_b="workers"),
    ]
    quote = stub.QuotePrice(irm_pb2.QuotePriceRequest(tenant="t1", groups=groups, constraints=constraints))
    # 0.0396/core scaled by frequency (2.2 GHz hosts in rack-1) + 0.0186/GB + 0.0417 base, per VM.
    assert quote.price_per_minute == pytest.approx(
        (0.0396 * 4 + 0.0186 * 8 + 0.0417) + 3 * (0.0396 * 2 + 0.0186 * 4 + 0.0417), rel=0.2)

    res = stub.Reserve(irm_pb2.ReserveRequest(tenant="t1", request_id="r-1", groups=groups,
                                              constraints=constraints))
    assert res.state == irm_pb2.Reservation.STATE_ACTIVE
    by_group = {g.name: g for g in res.groups}
    master = by_group["master"].resources[0]
    workers = [r for g in res.groups if g.name == "workers" for r in g.resources]
    assert len(workers) == 3
    # Constraints hold: workers on distinct hosts, all in the master's rack (<= 2 hops).
    assert len({w.physical_id for w in workers}) == 3
    assert all(w.location.rack == master.location.rack and w.location.site == master.location.site
               for w in workers)
    assert master.address  # the agent that runs it
    # A 4-core VM is bigger than this 2-CPU machine: the reservation says how it is confined.
    import os

    if len(os.sched_getaffinity(0)) < 4:
        assert any("cores per VM" in n and "confines each VM" in n for n in res.notes), res.notes
    assert res.price_per_minute == pytest.approx(sum(g.price_per_minute for g in res.groups))

    # The compute IRM holds exactly the same thing, under the CRS's derived request id (its first attempt's).
    irm = irm_stub(cloud["a"] if by_group["master"].manager == "compute-a" else cloud["b"])
    held = irm.GetReservation(irm_pb2.GetReservationRequest(
        tenant="t1", request_id=irm_request_id(res.id, 0, by_group["master"].manager)))
    assert sorted(r.id for g in held.groups for r in g.resources) == sorted(
        r.id for g in res.groups for r in g.resources)

    released = stub.ReleaseReservation(irm_pb2.ReleaseReservationRequest(tenant="t1", reservation_id=res.id))
    assert released.state == irm_pb2.Reservation.STATE_RELEASED
    again = stub.ReleaseReservation(irm_pb2.ReleaseReservationRequest(tenant="t1", reservation_id=res.id))
    assert again.state == irm_pb2.Reservation.STATE_RELEASED
    held = irm.GetReservation(irm_pb2.GetReservationRequest(tenant="t1", reservation_id=held.id))
    assert held.state == irm_pb2.Reservation.STATE_RELEASED


def test_idempotent_retry_and_tenant_isolation(cloud):
    stub = cloud["stub"]
    req = irm_pb2.ReserveRequest(tenant="alice", request_id="same", groups=[vm_group("g", 2, 1, 1)])
    first = stub.Reserve(req)
    second = stub.Reserve(req)
    assert first.id == second.id
    assert len(stub.ListReservations(irm_pb2.ListReservationsRequest(tenant="alice")).reservations) == 1

    with pytest.raises(grpc.RpcError) as e:
        stub.GetReservation(irm_pb2.GetReservationRequest(tenant="bob", reservation_id=first.id))
    assert e.value.code() == grpc.StatusCode.PERMISSION_DENIED
    with pytest.raises(grpc.RpcError) as e:
        stub.ReleaseReservation(irm_pb2.ReleaseReservationRequest(tenant="bob", reservation_id=first.id))
    assert e.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert stub.ListReservations(irm_pb2.ListReservationsRequest(tenant="bob")).reservations == []
    # Bob's own request with the same request id is a different reservation.
    bobs = stub.Reserve(irm_pb2.ReserveRequest(tenant="bob", request_id="same", groups=[vm_group("g", 1, 1, 1)]))
    assert bobs.id != first.id
    # Alice's is untouched.
    assert stub.GetReservation(irm_pb2.GetReservationRequest(tenant="alice", reservation_id=first.id)).state == \
        irm_pb2.Reservation.STATE_ACTIVE


def test_bad_input_gets_precise_statuses(cloud):
    stub = cloud["stub"]
    with pytest.raises(grpc.RpcError) as e:
        stub.Reserve(irm_pb2.ReserveRequest(tenant="t", request_id="x", groups=[
            irm_pb2.ResourceGroup(name="g", resource_type="vm", count=0,
                                  attributes={"cores": common_pb2.AttributeRequest(text="many"),
                                              "colour": common_pb2.AttributeRequest(number=1)})],
            constraints=[irm_pb2.GroupConstraint(expression="hops(g, nope) <= 1; drop table")]))
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    fields = dict(field_violations(e.value))
    assert "groups[0].count" in fields
    assert "groups[0].attributes[cores]" in fields
    assert "groups[0].attributes[colour]" in fields and "known" in fields["groups[0].attributes[colour]"]
    assert "constraints[0].expression" in fields

    with pytest.raises(grpc.RpcError) as e:
        stub.Reserve(irm_pb2.ReserveRequest(tenant="", request_id="x", groups=[vm_group("g", 1, 1, 1)]))
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "tenant" in e.value.details()

    # Outside every host's domain: INVALID_ARGUMENT saying the domain.
    with pytest.raises(grpc.RpcError) as e:
        stub.Reserve(irm_pb2.ReserveRequest(tenant="t", request_id="big", groups=[vm_group("g", 1, 64, 8)]))
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert dict(field_violations(e.value))["groups[0].attributes[cores]"] == "64 cores is outside [1, 32]"

    # No host with avx512 has 30 cores: unresolvable -> FAILED_PRECONDITION naming the filters.
    with pytest.raises(grpc.RpcError) as e:
        stub.Reserve(irm_pb2.ReserveRequest(tenant="t", request_id="big", groups=[
            vm_group("g", 1, 30, 8, required_traits=["avx512"])]))
    assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "traits removed 7" in e.value.details() and "capacity removed 1" in e.value.details()
    assert "cannot fit even on an empty cloud" in e.value.details()

    with pytest.raises(grpc.RpcError) as e:
        stub.GetReservation(irm_pb2.GetReservationRequest(tenant="t", reservation_id="crs-nope"))
    assert e.value.code() == grpc.StatusCode.NOT_FOUND

    # Services are still healthy after all that.
    assert len(stub.DiscoverResources(irm_pb2.DiscoverResourcesRequest()).resources) == 8


def test_capacity_exhaustion_is_resource_exhausted_and_names_filter(cloud):
    stub = cloud["stub"]
    # Site b has 2 hosts of 8 cores: fill them.
    g = vm_group("g", 2, 8, 16, required_traits=["site-b"])
    stub.Reserve(irm_pb2.ReserveRequest(tenant="t", request_id="fill", groups=[g]))
    with pytest.raises(grpc.RpcError) as e:
        stub.Reserve(irm_pb2.ReserveRequest(tenant="t", request_id="more", groups=[
            vm_group("g", 1, 1, 1, required_traits=["site-b"])]))
    assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "traits removed 6" in e.value.details() and "capacity removed 2" in e.value.details()


def test_silent_manager_is_marked_down_and_leaves_scheduling(cloud):
    stub, reg = cloud["stub"], cloud["reg"]
    cloud["b"].kill()
    eventually(lambda: any(m.name == "compute-b" and not m.up
                           for m in reg.ListManagers(registry_pb2.ListManagersRequest()).managers)
               or len(stub.DiscoverResources(irm_pb2.DiscoverResourcesRequest()).resources) == 6,
               what="compute-b marked down")
    assert len(stub.DiscoverResources(irm_pb2.DiscoverResourcesRequest()).resources) == 6
    with pytest.raises(grpc.RpcError) as e:
        stub.Reserve(irm_pb2.ReserveRequest(tenant="t", request_id="b", groups=[
            vm_group("g", 1, 1, 1, required_traits=["site-b"])]))
    # Only compute-b's hosts are in site b: come back when it is (README: UNAVAILABLE, retry later).
    assert e.value.code() == grpc.StatusCode.UNAVAILABLE and "compute-b" in e.value.details()
