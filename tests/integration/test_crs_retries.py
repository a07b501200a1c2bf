"""A placement retry at the CRS never activates on a part an earlier attempt took and gave back.

The CRS and two compute IRMs serve on loopback gRPC in this process (real services, real SQLite); the one
fault is injected at the delegation edge: compute-b refuses the first attempt as a stale view would make it.
"""

from __future__ import annotations

import grpc
import pytest

from cross_resource_scheduler import service as crs_service
from cross_resource_scheduler.delegation import Refused
from harness.v1 import common_pb2, irm_pb2, irm_pb2_grpc
from irm_compute import service as compute_service
from services import server as srv
from services.tls import plain_channel
from tests.conftest import eventually

INVENTORIES = {
    "compute-a": "hosts:\n  - {id: a-h1, site: site-a, rack: ra-1, cores: 8, memory_gb: 32, frequency_ghz: 2.2, "
                 "traits: [ssd]}\n",
    "compute-b": "hosts:\n  - {id: b-h1, site: site-b, rack: rb-1, cores: 8, memory_gb: 32, frequency_ghz: 2.6, "
                 "traits: [site-b]}\n",
}


def vm_group(name: str, cores: float, trait: str) -> irm_pb2.ResourceGroup:
    return irm_pb2.ResourceGroup(name=name, resource_type="vm", count=1, required_traits=[trait], attributes={
        "cores": common_pb2.AttributeRequest(number=cores), "memory_gb": common_pb2.AttributeRequest(number=8)})


@pytest.fixture
def cloud(tmp_path):
    running = []
    crs_comp = crs_service.component(crs_service.CrsConfig(
        address="127.0.0.1:0", database=f"sqlite:///{tmp_path / 'crs.db'}", heartbeat_interval_s=0.3,
        heartbeat_timeout_s=600, seed=1))
    r = srv.start("127.0.0.1:0", [crs_comp])
    running.append(r)
    crs_address = f"127.0.0.1:{r.port}"
    irms = {}
    for name, text in INVENTORIES.items():
        inv = tmp_path / f"{name}.yaml"
        inv.write_text(text)
        comp = compute_service.component(compute_service.ComputeConfig(
            address="127.0.0.1:0", name=name, database=f"sqlite:///{tmp_path / (name + '.db')}", inventory=str(inv),
            crs_address=crs_address, heartbeat_interval_s=0.3))
        ir = srv.start("127.0.0.1:0", [comp])
        running.append(ir)
        irms[name] = irm_pb2_grpc.ResourceManagerStub(plain_channel(f"127.0.0.1:{ir.port}"))
    stub = irm_pb2_grpc.ResourceManagerStub(plain_channel(crs_address))
    eventually(lambda: len(stub.DiscoverResources(irm_pb2.DiscoverResourcesRequest()).resources) == 2,
               what="both hosts in the CRS view")
    yield crs_comp.extra["crs"], stub, irms
    for r in reversed(running):
        r.stop(0.5)


def test_a_retried_placement_holds_every_part_it_reports(cloud):
    crs, stub, irms = cloud
    b = crs.registry.get("compute-b")
    real, asked = b.delegator.reserve, []

    def refuse_once(request, timeout):  # noqa: ANN001, ANN202
        asked.append(request.request_id)
        if len(asked) == 1:          # what compute-b answers when the CRS's view of it is stale
            raise Refused(grpc.StatusCode.RESOURCE_EXHAUSTED, "host b-h1 has no room any more; place again")
        return real(request, timeout)

    b.delegator.reserve = refuse_once
    res = stub.Reserve(irm_pb2.ReserveRequest(tenant="t", request_id="r1", groups=[
        vm_group("local", 4, "ssd"), vm_group("remote", 4, "site-b")]), timeout=30)
    assert res.state == irm_pb2.Reservation.STATE_ACTIVE and len(asked) == 2 and asked[0] != asked[1]
    local = next(g for g in res.groups if g.name == "local")
    part = irms["compute-a"].GetReservation(irm_pb2.GetReservationRequest(
        tenant="t", reservation_id=local.manager_reservation_id))
    # The first attempt's part at compute-a went back; the second took a new one, which the reservation holds.
    assert part.state == irm_pb2.Reservation.STATE_ACTIVE
    first = irms["compute-a"].GetReservation(irm_pb2.GetReservationRequest(
        tenant="t", request_id=crs_service.irm_request_id(res.id, 0, "compute-a")))
    assert first.state == irm_pb2.Reservation.STATE_RELEASED and first.id != part.id
    hosts = irms["compute-a"].DiscoverResources(irm_pb2.DiscoverResourcesRequest()).resources
    assert hosts[0].used["cores"] == 4
    # Released, nothing is left anywhere.
    stub.ReleaseReservation(irm_pb2.ReleaseReservationRequest(tenant="t", reservation_id=res.id), timeout=30)
    for irm in irms.values():
        assert all(h.used["cores"] == 0 for h in irm.DiscoverResources(irm_pb2.DiscoverResourcesRequest()).resources)
