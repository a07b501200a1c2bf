"""A release the agent never heard of is still enforced: the agent checks its VMs with the compute IRM.

The compute IRM and an agent serve on loopback gRPC in this process (real services, real processes run by the
agent); the one fault is at the network edge: the IRM's single best-effort ReleaseVm to the agent is lost.
"""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import grpc
import pytest

from harness.v1 import agent_pb2, agent_pb2_grpc, common_pb2, irm_pb2, irm_pb2_grpc
from irm_compute import agent as agent_mod
from irm_compute import service as compute_service
from services import server as srv
from services.tls import plain_channel
from tests.conftest import eventually, on_a_free_port


class _Lost(grpc.RpcError):
    def code(self):  # noqa: ANN201
        return grpc.StatusCode.UNAVAILABLE


@pytest.fixture
def host(tmp_path: Path, monkeypatch):
    def agent_then_compute(compute_port: int) -> list[srv.Running]:
        # Each is configured with the other's address: the agent first, on port 0, then the compute IRM (whose
        # inventory names the agent's port) on the port the agent was given for it.
        agent = agent_mod.component(agent_mod.AgentConfig(
            address="127.0.0.1:0", compute_address=f"127.0.0.1:{compute_port}",
            work_dir=str(tmp_path / "work"), vm_check_interval_s=0.0))      # every Execute confirms its VM
        agent_run = srv.start("127.0.0.1:0", [agent])
        inv = tmp_path / "hosts.yaml"
        inv.write_text("hosts:\n  - {id: h1, site: s, rack: r, cores: 2, memory_gb: 2, "
                       f"agent: '127.0.0.1:{agent_run.port}'}}\n")
        compute = compute_service.component(compute_service.ComputeConfig(
            address=f"127.0.0.1:{compute_port}", name="c", database=f"sqlite:///{tmp_path / 'c.db'}",
            inventory=str(inv)))
        try:
            return [srv.start(f"127.0.0.1:{compute_port}", [compute]), agent_run]
        except OSError:
            compute.extra["irm"].db.dispose()
            agent_run.stop(0.5)
            raise

    running = on_a_free_port(agent_then_compute, "the compute IRM")
    compute_port, agent_port = (r.port for r in running)
    told: list[str] = []

    class Unreachable:                    # every ReleaseVm the IRM sends is lost on the way
        def __init__(self, channel) -> None:  # noqa: ANN001
            pass

        def ReleaseVm(self, request, timeout=None):  # noqa: ANN001, ANN201, N802
            told.append(request.vm_id)
            raise _Lost()

    monkeypatch.setattr(compute_service, "agent_pb2_grpc", SimpleNamespace(ExecutionAgentStub=Unreachable))
    yield (irm_pb2_grpc.ResourceManagerStub(plain_channel(f"127.0.0.1:{compute_port}")),
           agent_pb2_grpc.ExecutionAgentStub(plain_channel(f"127.0.0.1:{agent_port}")), told)
    for r in reversed(running):
        r.stop(0.5)


def reserve(irm, tenant: str, rid: str) -> irm_pb2.Reservation:  # noqa: ANN001
    return irm.Reserve(irm_pb2.ReserveRequest(tenant=tenant, request_id=rid, groups=[irm_pb2.ResourceGroup(
        name="g", resource_type="vm", count=1, attributes={"cores": common_pb2.AttributeRequest(number=2),
                                                           "memory_gb": common_pb2.AttributeRequest(number=1)})]))


def test_a_released_vms_execution_is_killed_and_new_ones_refused_though_the_agent_was_not_told(host):
    irm, agent, told = host
    res = reserve(irm, "t", "r")
    vm = res.groups[0].resources[0].id
    events = agent.Execute(agent_pb2.ExecuteRequest(tenant="t", vm_id=vm, argv=[sys.executable, "-c",
                                                                                "import time; time.sleep(60)"]))
    started = next(iter(events))
    assert started.HasField("started")
    irm.ReleaseReservation(irm_pb2.ReleaseReservationRequest(tenant="t", reservation_id=res.id))
    eventually(lambda: told == [vm], what="the IRM's one (lost) ReleaseVm")
    assert reserve(irm, "u", "r2").state == irm_pb2.Reservation.STATE_ACTIVE   # the host's cores are someone else's
    run = lambda: agent.GetExecution(agent_pb2.GetExecutionRequest(tenant="t", execution_id=started.started.execution_id))  # noqa: E731
    eventually(lambda: run().state != agent_pb2.Execution.STATE_RUNNING, what="the released VM's execution killed")
    with pytest.raises(grpc.RpcError) as e:
        list(agent.Execute(agent_pb2.ExecuteRequest(tenant="t", vm_id=vm, argv=[sys.executable, "-c", "pass"])))
    assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION and "released" in e.value.details()


def test_executions_on_a_vm_still_reserved_go_on_after_it_is_confirmed_again(host):
    irm, agent, _ = host
    vm = reserve(irm, "t", "r").groups[0].resources[0].id
    for i in range(3):          # each Execute re-confirms the cached VM with the compute IRM (interval 0)
        events = list(agent.Execute(agent_pb2.ExecuteRequest(tenant="t", vm_id=vm, argv=[
            sys.executable, "-c", f"print({i})"])))
        assert events[-1].exited.exit_code == 0
        assert b"".join(e.stdout for e in events if e.HasField("stdout")) == f"{i}\n".encode()
