"""Review 18: the suite restarted with its execution agent on another port (as `harness up --auto-ports` does when
the old port is taken). The CRS had recorded the VM's address at Reserve; `harness run` reads the reservation from
the CRS and must reach the VM where it is now. With its compute IRM down, the reservation reads as last known,
saying so. Real CRS, compute IRM and agent processes, restarted on one state directory."""

from __future__ import annotations

import subprocess
import sys

from harness.v1 import common_pb2, irm_pb2, irm_pb2_grpc
from services.tls import plain_channel
from tests.conftest import eventually, start_again

TENANT = "t"


def _cloud(suite, name: str, crs_address: str = "", moved_from: str = "") -> tuple[object, object, str]:
    """A CRS (at `crs_address`, else anywhere), a compute IRM and its agent on a port of its own (another than
    `moved_from`'s), wired; returned once the IRM's hosts are in the CRS."""
    crs = suite.start("crs", name=f"crs-{name}", address=crs_address or "127.0.0.1:0", heartbeat_interval_s=0.3)
    avoid = {int(moved_from.rsplit(":", 1)[1])} if moved_from else set()
    compute, agent = suite.compute_and_agent(compute=dict(crs_address=crs.address, heartbeat_interval_s=0.3),
                                             agent=dict(name=f"agent-{name}"), avoid=avoid)
    stub = irm_pb2_grpc.ResourceManagerStub(plain_channel(crs.address))
    eventually(lambda: stub.DiscoverResources(irm_pb2.DiscoverResourcesRequest()).resources,
               what="the compute IRM's hosts in the CRS")
    return crs, compute, agent.address


def _get(crs_address: str, res_id: str) -> irm_pb2.Reservation:
    stub = irm_pb2_grpc.ResourceManagerStub(plain_channel(crs_address))
    return stub.GetReservation(irm_pb2.GetReservationRequest(tenant=TENANT, reservation_id=res_id), timeout=10)


def test_harness_run_reaches_a_vm_whose_agent_moved_when_the_suite_restarted(suite) -> None:
    crs, compute, old_agent = _cloud(suite, "1")
    stub = irm_pb2_grpc.ResourceManagerStub(plain_channel(crs.address))
    res = stub.Reserve(irm_pb2.ReserveRequest(tenant=TENANT, request_id="r1", groups=[irm_pb2.ResourceGroup(
        name="w", resource_type="vm", count=1, attributes={"cores": common_pb2.AttributeRequest(number=1),
                                                           "memory_gb": common_pb2.AttributeRequest(number=0.25)})]),
        timeout=30)
    assert [r.address for g in res.groups for r in g.resources] == [old_agent]
    suite.stop_all()                                  # `harness down`

    # `harness up`: everything elsewhere, the agent too (its old port not chosen again, as if taken)
    crs, compute, agent = _cloud(suite, "2", moved_from=old_agent)
    assert agent != old_agent
    assert [r.address for g in _get(crs.address, res.id).groups for r in g.resources] == [agent]
    ran = subprocess.run([sys.executable, "-m", "services.cli", "run", res.id, "--crs", crs.address, "--tenant",
                          TENANT, "--", "echo", "hi"], capture_output=True, text=True, timeout=60)
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout == "hi\n"

    # The compute IRM down, and the CRS restarted (it has not heard from the IRM since): the address last
    # known -- the moved one, recorded when it was read -- with a note that it could not be confirmed.
    compute.stop()
    crs.stop()
    again = start_again(lambda: suite.start("crs", name="crs-3", address=crs.address, heartbeat_interval_s=0.3),
                        "the CRS")
    got = _get(again.address, res.id)
    assert [r.address for g in got.groups for r in g.resources] == [agent]
    assert any(n.startswith("compute: the addresses of its resources are as last known") for n in got.notes), \
        got.notes
