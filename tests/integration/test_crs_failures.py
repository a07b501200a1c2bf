"""All-or-nothing delegation when an IRM dies in the middle of a request."""

from __future__ import annotations

import grpc
import pytest

from harness.v1 import irm_pb2, irm_pb2_grpc
from services.tls import plain_channel
from tests.conftest import eventually
from tests.integration.test_crs_flow import INVENTORY_B, vm_group


def active(proc, tenant: str) -> list[irm_pb2.Reservation]:
    stub = irm_pb2_grpc.ResourceManagerStub(plain_channel(proc.address))
    return list(stub.ListReservations(irm_pb2.ListReservationsRequest(tenant=tenant)).reservations)


def test_irm_killed_mid_request_leaks_nothing(suite, tmp_path):
    crs = suite.start("crs", heartbeat_interval_s=0.3, heartbeat_timeout_s=1.5)
    inv_b = tmp_path / "b.yaml"
    inv_b.write_text(INVENTORY_B)
    a = suite.start("compute", name="compute-a", crs_address=crs.address, heartbeat_interval_s=0.3)
    # compute-b commits the reservation, then dies before answering (fault injection at the edge).
    b = suite.start("compute", name="compute-b", crs_address=crs.address, heartbeat_interval_s=0.3,
                    inventory=str(inv_b), fault="crash_after_commit")
    stub = irm_pb2_grpc.ResourceManagerStub(plain_channel(crs.address))
    eventually(lambda: len(stub.DiscoverResources(irm_pb2.DiscoverResourcesRequest()).resources) == 8)

    groups = [vm_group("local", 2, 2, 4, required_traits=["ssd"]),
              vm_group("remote", 1, 2, 4, required_traits=["site-b"])]
    request = irm_pb2.ReserveRequest(tenant="t", request_id="mid", groups=groups)
    with pytest.raises(grpc.RpcError) as e:
        stub.Reserve(request, timeout=30)
    assert e.value.code() == grpc.StatusCode.UNAVAILABLE
    assert "compute-b" in e.value.details() and "nothing was reserved" in e.value.details()
    assert b.proc.wait(10) == 137  # it really died after committing

    # compute-a's part was given back at once; the CRS holds nothing for the request.
    assert active(a, "t") == []
    with pytest.raises(grpc.RpcError) as e:
        stub.GetReservation(irm_pb2.GetReservationRequest(tenant="t", request_id="mid"))
    assert e.value.code() == grpc.StatusCode.NOT_FOUND

    # compute-b comes back (same database, new port): the CRS releases what it committed.
    b2 = suite.start("compute", name="compute-b", crs_address=crs.address, heartbeat_interval_s=0.3,
                     inventory=str(inv_b))
    held = irm_pb2_grpc.ResourceManagerStub(plain_channel(b2.address))
    leftover = held.ListReservations(irm_pb2.ListReservationsRequest(tenant="t", include_released=True))
    assert len(leftover.reservations) == 1  # the orphan committed before the crash
    eventually(lambda: active(b2, "t") == [], what="the orphan at compute-b released by the CRS")
    hosts = held.DiscoverResources(irm_pb2.DiscoverResourcesRequest()).resources
    assert all(h.used["cores"] == 0 for h in hosts)

    # And the same request now succeeds, once.
    eventually(lambda: len(stub.DiscoverResources(irm_pb2.DiscoverResourcesRequest()).resources) == 8)
    res = stub.Reserve(request, timeout=30)
    assert res.state == irm_pb2.Reservation.STATE_ACTIVE
    assert len(active(a, "t")) == 1 and len(active(b2, "t")) == 1


def test_vms_whose_memory_the_crs_sums_to_a_host_fit_that_host(suite, tmp_path):
    # The CRS sums memory_gb as asked (floats); the compute IRM keeps whole MiB per VM. 6 VMs of 1/6 GB are
    # 1.0 GB to the CRS: had the IRM rounded each up (171 MiB, 1026 > 1024), it would refuse the host the CRS
    # chose, every time it chose it, and the tenant get RESOURCE_EXHAUSTED on a cloud with room.
    inv = tmp_path / "inv.yaml"
    inv.write_text("hosts:\n"
                   "  - {id: h1, site: s, rack: r1, cores: 8, memory_gb: 1, frequency_ghz: 2.0}\n"
                   "  - {id: h2, site: s, rack: r1, cores: 8, memory_gb: 1, frequency_ghz: 2.0}\n")
    crs = suite.start("crs", heartbeat_interval_s=0.3)
    compute = suite.start("compute", crs_address=crs.address, heartbeat_interval_s=0.3, inventory=str(inv))
    stub = irm_pb2_grpc.ResourceManagerStub(plain_channel(crs.address))
    eventually(lambda: len(stub.DiscoverResources(irm_pb2.DiscoverResourcesRequest()).resources) == 2)
    res = stub.Reserve(irm_pb2.ReserveRequest(tenant="t", request_id="six", groups=[vm_group("w", 6, 1, 1 / 6)]),
                       timeout=60)
    assert res.state == irm_pb2.Reservation.STATE_ACTIVE
    vms = [r for g in res.groups for r in g.resources]
    assert len(vms) == 6 and all(r.attributes["memory_gb"] == 170 / 1024 for r in vms)
    # What the compute IRM accounts is what the CRS's view shows: no host over its capacity.
    direct = irm_pb2_grpc.ResourceManagerStub(plain_channel(compute.address))
    hosts = direct.DiscoverResources(irm_pb2.DiscoverResourcesRequest()).resources
    assert sum(h.used["memory_gb"] for h in hosts) == 6 * 170 / 1024
    assert all(h.used["memory_gb"] <= h.capacity["memory_gb"] for h in hosts)
