"""A compute IRM restarted on an older or fresh database reports lower generations: the CRS takes its new
snapshot as the truth rather than keeping the old usage (and refusing fitting requests) for good.

Needs the registry to tell the view which events are the snapshot (CapacityView.upsert(snapshot=...))."""

from __future__ import annotations

from harness.v1 import common_pb2, irm_pb2, irm_pb2_grpc
from services.tls import plain_channel
from tests.conftest import eventually

ONE_HOST = """
hosts:
  - {id: h1, site: s, rack: r, cores: 4, memory_gb: 8, frequency_ghz: 2.2}
"""


def whole_host(rid: str) -> irm_pb2.ReserveRequest:
    return irm_pb2.ReserveRequest(tenant="t", request_id=rid, groups=[irm_pb2.ResourceGroup(
        name="g", resource_type="vm", count=1, attributes={
            "cores": common_pb2.AttributeRequest(number=4), "memory_gb": common_pb2.AttributeRequest(number=4)})])


def usage(stub: irm_pb2_grpc.ResourceManagerStub) -> dict[str, tuple[float, int]]:
    found = stub.DiscoverResources(irm_pb2.DiscoverResourcesRequest()).resources
    return {r.id: (r.used["cores"], r.generation) for r in found}


def test_the_crs_follows_a_manager_restarted_on_a_fresh_database(suite, tmp_path) -> None:
    crs = suite.start("crs", heartbeat_interval_s=0.3, heartbeat_timeout_s=1.5)
    inventory = tmp_path / "hosts.yaml"
    inventory.write_text(ONE_HOST)
    first = suite.start("compute", name="c", crs_address=crs.address, heartbeat_interval_s=0.3,
                        inventory=str(inventory), database=f"sqlite:///{tmp_path}/first.db")
    stub = irm_pb2_grpc.ResourceManagerStub(plain_channel(crs.address))
    eventually(lambda: "h1" in usage(stub), what="the CRS to see h1")
    for i in range(3):          # a few generations on, the host left full
        r = stub.Reserve(whole_host(f"r{i}"), timeout=30)
        if i < 2:
            stub.ReleaseReservation(irm_pb2.ReleaseReservationRequest(tenant="t", reservation_id=r.id))
    eventually(lambda: usage(stub).get("h1") == (4, 5), what="the CRS to see h1 full at generation 5")

    first.kill()
    suite.start("compute", name="c", crs_address=crs.address, heartbeat_interval_s=0.3,
                inventory=str(inventory), database=f"sqlite:///{tmp_path}/fresh.db")
    # h1 may be gone from the view meanwhile (the killed manager marked down before the new one registers).
    eventually(lambda: usage(stub).get("h1") == (0, 0), what="the CRS to take the fresh manager's h1 (empty, gen 0)")
    assert stub.Reserve(whole_host("after"), timeout=30).state == irm_pb2.Reservation.STATE_ACTIVE
