"""The compute IRM and its agents (review 12): GetMetrics within the caller's deadline whatever an agent
does, and an agent that runs only the VMs of its own host(s)."""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import pytest

from harness.v1 import agent_pb2, agent_pb2_grpc, common_pb2, irm_pb2, irm_pb2_grpc
from irm_compute.agent import AgentConfig
from irm_compute.agent import component as agent_component
from irm_compute.service import ComputeConfig, ComputeIrm
from irm_compute.service import component as compute_component
from services import server
from services.tls import plain_channel
from tests.conftest import on_a_free_port

T = "alice"
TIMEOUT = 30


def group(count: int, *hosts: str) -> irm_pb2.ResourceGroup:
    return irm_pb2.ResourceGroup(
        name="g", resource_type="vm", count=count, placement=list(hosts),
        attributes={"cores": common_pb2.AttributeRequest(number=1),
                    "memory_gb": common_pb2.AttributeRequest(number=0.5)})


# -- item 1: GetMetrics ----------------------------------------------------------------------------------

@dataclass
class FakeAgent(agent_pb2_grpc.ExecutionAgentServicer):
    """GetVmMetrics only: answers at once, or (hung) never until `release` is set."""

    hung: bool = False
    release: threading.Event = field(default_factory=threading.Event)
    calls: list[tuple[str, float]] = field(default_factory=list)   # (vm_id, seconds its caller gave it)
    refuses_token: bool = False     # as an agent whose control token differs from the IRM's

    def GetVmMetrics(self, request, context):  # noqa: N802, ANN001
        self.calls.append((request.vm_id, context.time_remaining()))
        if self.refuses_token:
            context.abort(grpc.StatusCode.UNAUTHENTICATED, "agent takes control calls from its control plane only")
        if self.hung:
            self.release.wait(TIMEOUT)
        return agent_pb2.GetVmMetricsResponse(series=[
            common_pb2.Series(name="cpu_percent", resource_id=request.vm_id,
                              samples=[common_pb2.Sample(time=1.0, value=50.0)])])


class Deadline:
    """A handler's context as gRPC gives it: `seconds` from now, active until then (or until cancelled)."""

    def __init__(self, seconds: float) -> None:
        self.at = time.monotonic() + seconds
        self.cancelled = False

    def time_remaining(self) -> float:
        return max(0.0, self.at - time.monotonic())

    def is_active(self) -> bool:
        return not self.cancelled and self.time_remaining() > 0


@dataclass
class MetricsCloud:
    irm: ComputeIrm
    hung: FakeAgent
    healthy: FakeAgent
    healthy_address: str = ""


@pytest.fixture
def metrics_cloud(tmp_path: Path) -> Iterator[MetricsCloud]:
    hung, healthy = FakeAgent(hung=True), FakeAgent()
    servers = [server.start("127.0.0.1:0", [server.Component(
        name="fake-agent", service_names=["harness.v1.ExecutionAgent"],
        register=lambda s, a=a: agent_pb2_grpc.add_ExecutionAgentServicer_to_server(a, s))])
        for a in (hung, healthy)]
    # host "a" (first by id, so a serial loop asks it first) has the hung agent
    (tmp_path / "hosts.yaml").write_text(
        "hosts:\n"
        f"  - {{id: a, cores: 8, memory_gb: 8, agent: '127.0.0.1:{servers[0].port}'}}\n"
        f"  - {{id: b, cores: 8, memory_gb: 8, agent: '127.0.0.1:{servers[1].port}'}}\n")
    irm = ComputeIrm(ComputeConfig(state_dir=str(tmp_path), inventory=str(tmp_path / "hosts.yaml")))
    try:
        yield MetricsCloud(irm, hung, healthy, f"127.0.0.1:{servers[1].port}")
    finally:
        hung.release.set()
        for s in servers:
            s.stop(0)
        irm.watchers.close()
        irm.db.dispose()


def test_a_hung_agent_is_asked_once_within_the_callers_deadline_and_the_others_still_answer(
        metrics_cloud: MetricsCloud) -> None:
    c = metrics_cloud
    res = c.irm.Reserve(irm_pb2.ReserveRequest(tenant=T, request_id="r", groups=[
        group(6, "a", "a", "a", "a", "b", "b")]), None)
    on_b = [r.id for r in res.groups[0].resources if r.physical_id == "b"]
    reply = c.irm.GetMetrics(irm_pb2.GetMetricsRequest(tenant=T, reservation_id=res.id), Deadline(2.0))
    # the hung agent: asked about one of its four VMs, and given no more than the caller had left
    assert len(c.hung.calls) == 1, c.hung.calls
    assert c.hung.calls[0][1] <= 2.0
    # the other agent answered for its VMs, although the hung one took the caller's whole deadline
    assert sorted(vm for vm, _ in c.healthy.calls) == sorted(on_b)
    assert sorted(s.resource_id for s in reply.series) == sorted(on_b)


def test_agents_refusing_the_irms_control_token_are_said_not_taken_for_empty_series(
        metrics_cloud: MetricsCloud) -> None:
    # Review 25: `harness metrics` printed {"series": []} with exit status 0 while the agent refused every call.
    from services.errors import CREDENTIALS_REFUSED, Unavailable

    c = metrics_cloud
    c.healthy.refuses_token = True
    res = c.irm.Reserve(irm_pb2.ReserveRequest(tenant=T, request_id="r", groups=[group(2, "b", "b")]), None)
    with pytest.raises(Unavailable) as e:
        c.irm.GetMetrics(irm_pb2.GetMetricsRequest(tenant=T, reservation_id=res.id), Deadline(5.0))
    assert e.value.reason == CREDENTIALS_REFUSED
    assert str(e.value) == (f"the execution agent of this reservation's VMs ({c.healthy_address}) refuses the compute "
                            "IRM's control token: no metrics can be read until the operator gives them the same "
                            "control_token")
    c.healthy.refuses_token = False
    reply = c.irm.GetMetrics(irm_pb2.GetMetricsRequest(tenant=T, reservation_id=res.id), Deadline(5.0))
    assert len(reply.series) == 2


def test_get_metrics_asks_no_agent_once_the_caller_is_gone(metrics_cloud: MetricsCloud) -> None:
    c = metrics_cloud
    res = c.irm.Reserve(irm_pb2.ReserveRequest(tenant=T, request_id="r", groups=[group(2, "b", "b")]), None)
    gone = Deadline(10.0)
    gone.cancelled = True
    assert list(c.irm.GetMetrics(irm_pb2.GetMetricsRequest(tenant=T, reservation_id=res.id), gone).series) == []
    assert c.healthy.calls == []
    # and with the caller still there, it does
    reply = c.irm.GetMetrics(irm_pb2.GetMetricsRequest(tenant=T, reservation_id=res.id), Deadline(10.0))
    assert sorted(s.resource_id for s in reply.series) == sorted(r.id for r in res.groups[0].resources)


# -- item 2: an agent runs the VMs of its own hosts only ------------------------------------------------------

@dataclass
class TwoHosts:
    rm: irm_pb2_grpc.ResourceManagerStub
    agents: dict[str, agent_pb2_grpc.ExecutionAgentStub]


@pytest.fixture
def two_hosts(tmp_path: Path) -> Iterator[TwoHosts]:
    def start_agent(name: str, hosts: str, compute_port: int) -> server.Running:
        cfg = AgentConfig(address="127.0.0.1:0", compute_address=f"127.0.0.1:{compute_port}",
                          work_dir=str(tmp_path / f"agent-{name}"), hosts=hosts)
        return server.start("127.0.0.1:0", [agent_component(cfg)])

    def agents_then_compute(compute_port: int) -> tuple[server.Running, dict[str, server.Running]]:
        # The compute IRM's inventory names h1's and h2's agents, which are configured with its address: those
        # agents first, on port 0, then the compute IRM on the port they were given for it.
        own = {h: start_agent(h, h, compute_port) for h in ("h1", "h2")}
        (tmp_path / "hosts.yaml").write_text("hosts:\n" + "".join(
            f"  - {{id: {h}, cores: 1, memory_gb: 2, agent: '127.0.0.1:{r.port}'}}\n" for h, r in own.items()))
        comp = compute_component(ComputeConfig(state_dir=str(tmp_path), address=f"127.0.0.1:{compute_port}",
                                               inventory=str(tmp_path / "hosts.yaml")))
        try:
            return server.start(f"127.0.0.1:{compute_port}", [comp]), own
        except OSError:
            comp.extra["irm"].db.dispose()
            for r in own.values():
                r.stop(0)
            raise

    compute, own = on_a_free_port(agents_then_compute, "the compute IRM")
    # h1's and h2's own agents, and one standing in for every host (hosts unset: the single-machine suite)
    agent_runs = {**own, "any": start_agent("any", "", compute.port)}
    running, channels = [compute, *agent_runs.values()], []
    agents = {}
    for name, r in agent_runs.items():
        channels.append(plain_channel(f"127.0.0.1:{r.port}"))
        agents[name] = agent_pb2_grpc.ExecutionAgentStub(channels[-1])
    channels.append(plain_channel(f"127.0.0.1:{compute.port}"))
    try:
        yield TwoHosts(irm_pb2_grpc.ResourceManagerStub(channels[-1]), agents)
    finally:
        for ch in channels:
            ch.close()
        for r in reversed(running):
            r.stop(0)


def run(agent: agent_pb2_grpc.ExecutionAgentStub, vm_id: str) -> agent_pb2.ExecutionExited:
    for ev in agent.Execute(agent_pb2.ExecuteRequest(tenant=T, vm_id=vm_id, argv=[sys.executable, "-c", "pass"]),
                            timeout=TIMEOUT):
        if ev.WhichOneof("event") == "exited":
            return ev.exited
    raise AssertionError("the execution's stream ended without its exit")


def test_an_agent_refuses_a_vm_reserved_on_another_host(two_hosts: TwoHosts) -> None:
    res = two_hosts.rm.Reserve(irm_pb2.ReserveRequest(tenant=T, request_id="r", groups=[group(1, "h1")]),
                               timeout=TIMEOUT)
    vm = res.groups[0].resources[0]
    with pytest.raises(grpc.RpcError) as info:
        run(two_hosts.agents["h2"], vm.id)
    assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert info.value.details() == (
        f"VM {vm.id} is reserved on host 'h1'; this agent serves host(s) h2: run it through the agent at the VM's "
        "address (its reservation gives it)")
    assert run(two_hosts.agents["h1"], vm.id).exit_code == 0
    assert run(two_hosts.agents["any"], vm.id).exit_code == 0
