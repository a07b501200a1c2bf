"""An operator taking a manager out of the CRS for good (a decommissioned site): DeregisterManager, through the CRS's
gRPC API and `harness managers`. Real CRS, compute IRM and agent processes, with a control token."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import threading

import grpc
import pytest

from harness.v1 import common_pb2, irm_pb2, irm_pb2_grpc, registry_pb2, registry_pb2_grpc
from services import control
from services.tls import plain_channel
from tests.conftest import eventually, start_again

TOKEN = "s3cret-ops"
TENANT = "t"


def _vm() -> irm_pb2.ResourceGroup:
    return irm_pb2.ResourceGroup(name="w", resource_type="vm", count=1,
                                 attributes={"cores": common_pb2.AttributeRequest(number=1),
                                             "memory_gb": common_pb2.AttributeRequest(number=0.25)})


def _harness(*argv: str, token: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "HARNESS_CONTROL_TOKEN": token}
    return subprocess.run([sys.executable, "-m", "services.cli", *argv], env=env, capture_output=True, text=True,
                          timeout=60)


def _marked_down(registry: registry_pb2_grpc.ManagerRegistryStub, name: str) -> None:
    """Once the CRS has marked the stopped manager `name` down (a deregistration waits for that)."""
    eventually(lambda: [m.up for m in registry.ListManagers(registry_pb2.ListManagersRequest(), timeout=10).managers
                        if m.name == name] == [False], what=f"{name} marked down")


@pytest.fixture
def cloud(suite):
    crs = suite.start("crs", heartbeat_interval_s=0.3, heartbeat_timeout_s=1.0, control_token=TOKEN)
    compute, agent = suite.compute_and_agent(compute=dict(crs_address=crs.address, heartbeat_interval_s=0.3,
                                                          control_token=TOKEN),
                                             agent=dict(control_token=TOKEN))
    stub = irm_pb2_grpc.ResourceManagerStub(plain_channel(crs.address))
    hosts = eventually(lambda: stub.DiscoverResources(irm_pb2.DiscoverResourcesRequest()).resources,
                       what="the compute IRM's hosts in the CRS")
    return crs, compute, agent, stub, [h.id for h in hosts]


def _owed(state_dir) -> list[tuple[str, str]]:  # noqa: ANN001
    """The releases the CRS still owes managers (its compensation rows), read from its database."""
    with sqlite3.connect(state_dir / "crs.db") as db:
        return db.execute("SELECT manager, tenant FROM crs_compensations").fetchall()


def test_a_stopped_manager_is_taken_out_with_its_parts_given_up_only_when_the_operator_says(suite, cloud,
                                                                                            tmp_path) -> None:
    crs, compute, agent, stub, hosts = cloud
    registry = registry_pb2_grpc.ManagerRegistryStub(control.channel(plain_channel(crs.address), TOKEN))
    anyone = registry_pb2_grpc.ManagerRegistryStub(plain_channel(crs.address))
    take_out = registry_pb2.DeregisterManagerRequest(name="compute")

    with pytest.raises(grpc.RpcError) as e:
        anyone.DeregisterManager(take_out, timeout=10)
    assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED
    wrong = _harness("managers", "deregister", "compute", "--crs", crs.address, token="guess")
    assert wrong.returncode == 1 and "UNAUTHENTICATED" in wrong.stderr
    assert "this sent $HARNESS_CONTROL_TOKEN: set HARNESS_CONTROL_TOKEN to the CRS's" in wrong.stderr
    with pytest.raises(grpc.RpcError) as e:
        registry.DeregisterManager(registry_pb2.DeregisterManagerRequest(name="site-b"), timeout=10)
    assert e.value.code() == grpc.StatusCode.NOT_FOUND and "registered: compute" in e.value.details()
    with pytest.raises(grpc.RpcError) as e:
        registry.DeregisterManager(take_out, timeout=10)
    assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION and "is up (it heartbeated" in e.value.details()

    res = stub.Reserve(irm_pb2.ReserveRequest(tenant=TENANT, request_id="r1", groups=[_vm()]), timeout=30)
    compute.stop()
    agent.stop()
    _marked_down(registry, "compute")
    with pytest.raises(grpc.RpcError) as e:
        registry.DeregisterManager(take_out, timeout=10)
    assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert res.id in e.value.details() and "abandon_parts" in e.value.details()
    assert [m.name for m in registry.ListManagers(registry_pb2.ListManagersRequest()).managers] == ["compute"]

    # A watcher of the CRS (a CRS above would be one) sees the manager's resources leave.
    watch = irm_pb2_grpc.ResourceManagerStub(control.channel(plain_channel(crs.address), TOKEN)).WatchCapacity(
        irm_pb2.WatchCapacityRequest())
    removed: list[str] = []
    all_removed, synced = threading.Event(), threading.Event()

    def follow() -> None:
        try:
            for ev in watch:
                if ev.kind == irm_pb2.CapacityEvent.KIND_SNAPSHOT_END:
                    synced.set()
                elif ev.kind == irm_pb2.CapacityEvent.KIND_REMOVED:
                    removed.extend(r.id.rsplit("/", 1)[-1] for r in (ev.resource, *ev.more))
                    if len(removed) >= len(hosts):
                        all_removed.set()
        except grpc.RpcError:
            pass

    threading.Thread(target=follow, daemon=True).start()
    assert synced.wait(10), "the CRS's WatchCapacity snapshot"
    out = _harness("managers", "deregister", "compute", "--crs", crs.address, "--abandon-parts", token=TOKEN)
    assert out.returncode == 0, out.stderr
    reply = json.loads(out.stdout)
    assert reply["name"] == "compute" and reply["resources_removed"] == len(hosts)
    assert reply["abandoned_reservations"] == [res.id] and reply["releases_pending"] == 1     # the part given up
    assert all_removed.wait(10), removed
    watch.cancel()
    assert sorted(removed) == sorted(h.rsplit("/", 1)[-1] for h in hosts)
    assert list(stub.DiscoverResources(irm_pb2.DiscoverResourcesRequest()).resources) == []
    assert list(registry.ListManagers(registry_pb2.ListManagersRequest()).managers) == []

    got = stub.GetReservation(irm_pb2.GetReservationRequest(tenant=TENANT, reservation_id=res.id), timeout=10)
    assert got.state == irm_pb2.Reservation.STATE_ACTIVE
    assert [n for n in got.notes if n.startswith("compute: deregistered by the operator")], got.notes
    # Releasing it no longer asks the manager that is gone: the part given up stays owed to it, once, by its id.
    assert _owed(tmp_path) == [("compute", TENANT)]
    released = stub.ReleaseReservation(irm_pb2.ReleaseReservationRequest(tenant=TENANT, reservation_id=res.id),
                                       timeout=10)
    assert released.state == irm_pb2.Reservation.STATE_RELEASED
    assert _owed(tmp_path) == [("compute", TENANT)]

    # Gone for good: a restarted CRS does not know it either.
    crs.stop()
    again = suite.start("crs", address=crs.address, heartbeat_interval_s=0.3, heartbeat_timeout_s=1.0,
                        control_token=TOKEN)
    assert list(registry_pb2_grpc.ManagerRegistryStub(plain_channel(again.address))
                .ListManagers(registry_pb2.ListManagersRequest(), timeout=10).managers) == []
    # `harness managers` lists what is left (none), and says why a deregistration is refused.
    listed = _harness("managers", "--crs", again.address, token="")
    assert listed.returncode == 0 and json.loads(listed.stdout)["managers"] == []
    refused = _harness("managers", "deregister", "compute", "--crs", again.address, token=TOKEN)
    assert refused.returncode == 1 and "NOT_FOUND" in refused.stderr

    # The site brought back on its old database: it registers again, and the part given up is released at it
    # (its host held the VM for no reservation of the CRS's: capacity lost for good, in the operators' review).
    settings = dict(crs_address=again.address, heartbeat_interval_s=0.3, control_token=TOKEN)
    start_again(lambda: suite.start("agent", address=agent.address, compute_address=compute.address,
                                    control_token=TOKEN), "the agent")
    start_again(lambda: suite.start("compute", address=compute.address, agent_address=agent.address, **settings),
                "the compute IRM")
    crs_stub = irm_pb2_grpc.ResourceManagerStub(plain_channel(again.address))
    eventually(lambda: _owed(tmp_path) == [], what="the part given up released at the compute IRM back")
    back = eventually(lambda: crs_stub.DiscoverResources(irm_pb2.DiscoverResourcesRequest()).resources,
                      what="its hosts back in the CRS")
    eventually(lambda: all(r.used.get("cores", 0) == 0 for r in crs_stub.DiscoverResources(
        irm_pb2.DiscoverResourcesRequest()).resources), what="its hosts free")
    assert len(back) == len(hosts)


def test_parts_given_up_below_are_said_so_at_the_crs_above(suite) -> None:
    # The operators' review: the note stayed at the site CRS; the top showed the reservation as before, with the
    # gone agent's address and no word of it.
    top = suite.start("crs", name="top", heartbeat_interval_s=0.3, heartbeat_timeout_s=1.0, control_token=TOKEN)
    site = suite.start("crs", name="site-b", crs_address=top.address, heartbeat_interval_s=0.3,
                       heartbeat_timeout_s=1.0, control_token=TOKEN)
    compute, agent = suite.compute_and_agent(compute=dict(crs_address=site.address, heartbeat_interval_s=0.3,
                                                          control_token=TOKEN),
                                             agent=dict(control_token=TOKEN))
    stub = irm_pb2_grpc.ResourceManagerStub(plain_channel(top.address))
    eventually(lambda: stub.DiscoverResources(irm_pb2.DiscoverResourcesRequest()).resources, timeout=30,
               what="the site's hosts at the top")
    res = stub.Reserve(irm_pb2.ReserveRequest(tenant=TENANT, request_id="r1", groups=[_vm()]), timeout=60)
    compute.stop()
    agent.stop()
    _marked_down(registry_pb2_grpc.ManagerRegistryStub(plain_channel(site.address)), "compute")
    out = _harness("managers", "deregister", "compute", "--crs", site.address, "--abandon-parts", token=TOKEN)
    assert out.returncode == 0, out.stderr
    got = stub.GetReservation(irm_pb2.GetReservationRequest(tenant=TENANT, reservation_id=res.id), timeout=30)
    assert [n for n in got.notes if n.startswith("site-b: compute: deregistered by the operator")], got.notes
