"""The local back-end's translation of a configuration into a CRS request and a command line."""

from __future__ import annotations

import json
import threading

import grpc
import pytest

import examples
from application_manager import local
from application_manager.local import LocalBackend
from application_manager.manifest import parse_manifest
from application_manager.profilers.base import Proposal
from application_manager.slo import parse_slo
from application_manager.space import from_manifest
from harness.v1 import agent_pb2, irm_pb2


def backend(name: str, **params) -> LocalBackend:  # type: ignore[no-untyped-def]
    m = parse_manifest(examples.manifest(name))
    slo = parse_slo(examples.slo(name, **params), m)
    space = from_manifest(m, slo.parameters, {"vm"})
    # The channel is lazy: nothing connects until a call is made.
    return LocalBackend("127.0.0.1:1", "t", m, space, slo.parameters, "/apps/" + name, "/usr/bin/python3", 30)


def test_configuration_becomes_groups_and_argv():
    b = backend("rtm", rows=800, steps=40)
    i = b.space.index({"implementation": "RTM-CPU", "%master_cores": 2, "%master_mem": 512})
    groups, constraints = b.request(b.space.configs[i])
    assert len(groups) == 1 and groups[0].name == "master" and groups[0].resource_type == "vm"
    assert groups[0].attributes["cores"].number == 2 and groups[0].attributes["memory_gb"].number == 0.5
    assert constraints == []
    argv, env = b.argv_env(b.space.configs[i], "production")
    assert argv == ["/usr/bin/python3", "/apps/rtm/app.py", "800", "40"]
    assert env == {"OMP_NUM_THREADS": "2"}
    bench_argv, _ = b.argv_env(b.space.configs[i], "benchmark")
    assert bench_argv[2] == "100"  # the manifest's Benchmark input


def test_fpga_implementation_slot_and_distances():
    raw = json.loads(examples.manifest("option_pricing"))
    m = parse_manifest(raw)
    space = from_manifest(m, {}, {"vm", "vfpga"})  # once an FPGA IRM offers the type
    b = LocalBackend("127.0.0.1:1", "t", m, space, {"%million_options": 1}, "/a", "py", 30)
    i = next(k for k, c in enumerate(space.configs)
             if c["implementation"] == "BlackScholes-FPGA" and c["%fpga_devices"] == 4)
    groups, constraints = b.request(space.configs[i])
    dfe = next(g for g in groups if g.name == "dfe")
    assert dfe.resource_type == "vfpga" and dfe.attributes["design"].text == "black_scholes"
    assert dfe.attributes["devices"].number == 4
    assert [c.expression for c in constraints] == ["hops(host, dfe) <= 4"]
    assert b.argv_env(space.configs[i], "production")[0][-1] == "--fpga"
    assert len(from_manifest(m, {}, {"vm"})) == 6  # today: the CPU implementation only


class _Broken(grpc.RpcError):
    """What a stub raises when the agent's process or VM goes away mid-stream."""

    def code(self):  # noqa: ANN201
        return grpc.StatusCode.UNAVAILABLE

    def details(self):  # noqa: ANN201
        return "Socket closed"


class _Crs:
    def __init__(self) -> None:
        self.released: list[str] = []

    def Reserve(self, req, timeout=None):  # noqa: ANN001, ANN201, N802
        return irm_pb2.Reservation(id="r1", price_per_minute=6.0, groups=[irm_pb2.AllocatedGroup(
            name=g.name, resources=[irm_pb2.AllocatedResource(id="vm1", address="127.0.0.1:1")]) for g in req.groups])

    def ReleaseReservation(self, req, timeout=None):  # noqa: ANN001, ANN201, N802
        self.released.append(req.reservation_id)


class _DyingAgent:
    def __init__(self, channel) -> None:  # noqa: ANN001
        pass

    def Execute(self, req, timeout=None):  # noqa: ANN001, ANN201, N802
        yield agent_pb2.ExecuteEvent(started=agent_pb2.ExecutionStarted(execution_id="e1"))
        raise _Broken()


def test_an_agent_lost_mid_run_is_a_failed_run_that_cost_its_reservation(monkeypatch):
    crs = _Crs()
    monkeypatch.setattr(local.irm_pb2_grpc, "ResourceManagerStub", lambda ch: crs)
    monkeypatch.setattr(local.agent_pb2_grpc, "ExecutionAgentStub", _DyingAgent)
    b = backend("rtm", rows=800, steps=40)
    detail = b.run(Proposal(0))
    o = detail.observation
    assert not o.ok and o.error.startswith("the run was lost") and "UNAVAILABLE" in o.error
    assert o.time_s >= 0.0 and o.cost == pytest.approx(6.0 * o.time_s / 60.0)
    assert detail.reservation_id == "r1" and crs.released == ["r1"]


class _HeldAgent:
    """Runs each command until StopExecution stops it; the caller cancels as soon as the first one started."""

    cancel = threading.Event()
    held: dict[str, threading.Event] = {}
    stopped: list[str] = []

    def __init__(self, channel) -> None:  # noqa: ANN001
        pass

    def Execute(self, req, timeout=None):  # noqa: ANN001, ANN201, N802
        eid = f"e{len(self.held) + 1}"
        self.held[eid] = threading.Event()

        def events():  # type: ignore[no-untyped-def]
            yield agent_pb2.ExecuteEvent(started=agent_pb2.ExecutionStarted(execution_id=eid))
            self.cancel.set()          # the client goes away while the command runs
            assert self.held[eid].wait(timeout=30), "never stopped"
            yield agent_pb2.ExecuteEvent(exited=agent_pb2.ExecutionExited(exit_code=-15, reason="stopped"))
        return events()

    def StopExecution(self, req, timeout=None):  # noqa: ANN001, ANN201, N802
        self.stopped.append(req.execution_id)
        self.held[req.execution_id].set()


@pytest.fixture
def held_agent(monkeypatch):  # type: ignore[no-untyped-def]
    crs = _Crs()
    monkeypatch.setattr(local.irm_pb2_grpc, "ResourceManagerStub", lambda ch: crs)
    monkeypatch.setattr(local.agent_pb2_grpc, "ExecutionAgentStub", _HeldAgent)
    monkeypatch.setattr(_HeldAgent, "cancel", threading.Event())
    monkeypatch.setattr(_HeldAgent, "held", {})
    monkeypatch.setattr(_HeldAgent, "stopped", [])
    return crs


@pytest.mark.parametrize("name,params", [
    ("rtm", {"rows": 800, "steps": 40}),        # while the application runs
    ("wordcount", {"shards": 4}),               # while its service module starts, before it is ready
])
def test_a_cancelled_run_stops_its_modules_releases_its_reservation_and_says_why(held_agent, name, params):
    b = backend(name, **params)
    b.cancelled = _HeldAgent.cancel
    detail = b.run(Proposal(0))
    o = detail.observation
    assert detail.cancelled and not o.ok and o.error == local.CANCELLED
    assert _HeldAgent.stopped == ["e1"] and list(_HeldAgent.held) == ["e1"]    # nothing started after it
    assert detail.reservation_id == "r1" and held_agent.released == ["r1"]
    assert o.cost == pytest.approx(6.0 * o.time_s / 60.0)


def test_a_run_cancelled_before_it_starts_reserves_nothing(held_agent):
    b = backend("rtm", rows=800, steps=40)
    b.cancelled = threading.Event()
    b.cancelled.set()
    detail = b.run(Proposal(0))
    assert detail.cancelled and detail.observation.error == local.CANCELLED
    assert detail.reservation_id == "" and held_agent.released == [] and not _HeldAgent.held


class _EndedFromOutsideAgent:
    """Ends the run with the reason the test sets: the agent stopped, the VM released, or a program that failed."""

    reason = ""
    exit_code = -15

    def __init__(self, channel) -> None:  # noqa: ANN001
        pass

    def Execute(self, req, timeout=None):  # noqa: ANN001, ANN201, N802
        yield agent_pb2.ExecuteEvent(started=agent_pb2.ExecutionStarted(execution_id="e1"))
        yield agent_pb2.ExecuteEvent(exited=agent_pb2.ExecutionExited(exit_code=self.exit_code, reason=self.reason,
                                                                      wall_time_s=1.0))


@pytest.mark.parametrize("reason,exit_code,transient", [
    ("agent stopped", -15, True),           # a restart or deploy of the agent: not the configuration's doing
    ("vm released", -9, True),              # its reservation released under it
    ("stopped", -15, True),                 # someone stopped the execution
    ("memory limit exceeded", -9, False),   # the configuration's own failures stay so
    # The kernel's OOM killer, below the run's limit: the machine ran short (neighbours), not the configuration.
    ("out of memory: the kernel's OOM killer killed it (SIGKILL) at a peak of 84 MB of its 128 MB limit: this "
     "machine ran out of memory first (other VMs or processes on it)", -9, True),
    ("", 1, False),
])
def test_a_run_ended_from_outside_is_recorded_but_says_nothing_of_its_configuration(
        monkeypatch, reason: str, exit_code: int, transient: bool) -> None:
    from irm_compute import agent, sandbox

    assert {agent.AGENT_STOPPED, agent.RELEASED, sandbox.STOPPED} == local.ENDED_FROM_OUTSIDE
    assert sandbox.exit_reason(None, -9, 84.0, 128.0, b"", oom_killed=True).startswith(local.MACHINE_OUT_OF_MEMORY)
    monkeypatch.setattr(local.irm_pb2_grpc, "ResourceManagerStub", lambda ch: _Crs())
    monkeypatch.setattr(_EndedFromOutsideAgent, "reason", reason)
    monkeypatch.setattr(_EndedFromOutsideAgent, "exit_code", exit_code)
    monkeypatch.setattr(local.agent_pb2_grpc, "ExecutionAgentStub", _EndedFromOutsideAgent)
    o = backend("rtm", rows=800, steps=40).run(Proposal(0)).observation
    assert not o.ok and o.transient is transient and o.measured is not transient
    assert o.memory_bottleneck is (reason == "memory limit exceeded")   # a neighbour's shortage grows no memory
    # The stored error tells it too, for runs read back (a restart, another back-end's observations).
    assert local.transient_error(o.error) is transient


class _CredentialsRefused(grpc.RpcError):
    def __init__(self, code: grpc.StatusCode) -> None:
        self._code = code

    def code(self):  # noqa: ANN201
        return self._code

    def details(self):  # noqa: ANN201
        return "the call carries a delegation token this service does not accept"

    def trailing_metadata(self):  # noqa: ANN201
        return ()


@pytest.mark.parametrize("code", [grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED])
@pytest.mark.parametrize("where", ["crs", "agent"])
def test_a_credentials_refusal_says_nothing_of_the_configuration(monkeypatch, code, where) -> None:
    # Review 25: an operator's token mismatch (the AM's delegation token, the agent's) wrote the configurations it
    # was refused for off for good: later sessions never tried them again once the tokens agreed.
    class Crs(_Crs):
        def Reserve(self, req, timeout=None):  # noqa: ANN001, ANN201, N802
            if where == "crs":
                raise _CredentialsRefused(code)
            return super().Reserve(req, timeout)

    class Agent:
        def __init__(self, channel) -> None:  # noqa: ANN001
            pass

        def Execute(self, req, timeout=None):  # noqa: ANN001, ANN201, N802
            raise _CredentialsRefused(code)

    monkeypatch.setattr(local.irm_pb2_grpc, "ResourceManagerStub", lambda ch: Crs())
    monkeypatch.setattr(local.agent_pb2_grpc, "ExecutionAgentStub", Agent)
    o = backend("rtm", rows=800, steps=40).run(Proposal(0)).observation
    assert not o.ok and o.transient and not o.measured, o.error
    assert code.name in o.error and local.transient_error(o.error)
