"""All-or-nothing delegation when an IRM dies in the middle of a request."""

from __future__ import annotations

import grpc
import pytest

from harness.v1 import irm_pb2, irm_pb2_grpc
from tests.conftest import eventually
from tests.integration.test_crs_flow import INVENTORY_B, vm_group


def active(proc, tenant: str) -> list[irm_pb2.Reservation]:
    stub = irm_pb2_grpc.ResourceManagerStub(grpc.insecure_channel(proc.address))
    return list(stub.ListReservations(irm_pb2.ListReservationsRequest(tenant=tenant)).reservations)


def test_irm_killed_mid_request_leaks_nothing(suite, tmp_path):
    crs = suite.start("crs", heartbeat_interval_s=0.3, heartbeat_timeout_s=1.5)
    inv_b = tmp_path / "b.yaml"
    inv_b.write_text(INVENTORY_B)
    a = suite.start("compute", name="compute-a", crs_address=crs.address, heartbeat_interval_s=0.3)
    # compute-b commits the reservation, then dies before answering (fault injection at the edge).
    b = suite.start("compute", name="compute-b", crs_address=crs.address, heartbeat_interval_s=0.3,
                    inventory=str(inv_b), fault="crash_after_commit")
    stub = irm_pb2_grpc.ResourceManagerStub(grpc.insecure_channel(crs.address))
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
    held = irm_pb2_grpc.ResourceManagerStub(grpc.insecure_channel(b2.address))
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
