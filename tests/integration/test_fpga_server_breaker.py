"""One FPGA-server that hangs (SIGSTOP: a stuck host, a partition; not one that refuses connections) costs the
Orchestrator and its job manager one timeout, not one per call for as long as it hangs; once it answers again
(and its back-off passed) it is used again.

FPGA-servers run as processes (the `suite` fixture); the Orchestrator with its job manager serves in this process,
as `component()` wires them.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Iterator
from typing import Any

import grpc
import pytest

from harness.v1 import fpga_jobs_pb2 as jp
from harness.v1 import fpga_jobs_pb2_grpc, fpga_pb2, fpga_pb2_grpc
from irm_fpga import orchestrator as orch_mod
from services import server as srv
from services.tls import plain_channel
from tests.conftest import eventually

FAST = {"reconfig_mean_s": 0.05, "reconfig_std_s": 0.0}
TIMEOUT_S = 3.0         # server_timeout_s
BOUND_S = 1.5           # an operation once the first timeout passed: well under one timeout


class Cloud:
    def __init__(self, suite, tmp: str, **config: Any) -> None:  # noqa: ANN001
        self.servers = {name: suite.start("fpga-server", name=name, devices=4, **FAST) for name in ("A", "B")}
        comp = orch_mod.component(orch_mod.OrchestratorConfig(
            address="127.0.0.1:0", database=f"sqlite:///{tmp}/orch.db", autoscaler="none",
            servers=[p.address for p in self.servers.values()], server_timeout_s=TIMEOUT_S, **config))
        self.running = srv.start("127.0.0.1:0", [comp])
        self.orch: orch_mod.Orchestrator = comp.extra["orchestrator"]
        ch = plain_channel(f"127.0.0.1:{self.running.port}")
        self.stub = fpga_pb2_grpc.FpgaOrchestratorStub(ch)
        self.jobs = fpga_jobs_pb2_grpc.FpgaJobsStub(ch)
        self.stopped: set[str] = set()

    def hang(self, name: str) -> None:
        pid = self.servers[name].proc.pid
        os.kill(pid, signal.SIGSTOP)
        self.stopped.add(name)
        # kill() returns before the stop takes: a thread the kernel has not yet told (the gRPC poller, woken by a
        # request) can still answer one. Hung means every thread stopped.
        eventually(lambda: all_threads_stopped(pid), timeout=30, interval=0.01, what=f"FPGA-server {name} stopped")

    def resume(self, name: str) -> None:
        os.kill(self.servers[name].proc.pid, signal.SIGCONT)
        self.stopped.discard(name)

    def close(self) -> None:
        for name in list(self.stopped):
            self.resume(name)
        self.running.stop(0)

    def listed(self) -> set[str]:
        return {s.name for s in self.stub.ListDevices(fpga_pb2.ListDevicesRequest(tenant="t"), timeout=60).servers}

    def create(self, request_id: str, size: int) -> fpga_pb2.FpgaGroup:
        return self.stub.CreateGroup(fpga_pb2.CreateGroupRequest(tenant="t", request_id=request_id, design="sleep",
                                                                 size=size), timeout=60)


@pytest.fixture
def make_cloud(suite) -> Iterator[Callable[..., Cloud]]:
    made: list[Cloud] = []

    def make(**config: Any) -> Cloud:
        made.append(Cloud(suite, suite.tmp, **config))
        return made[-1]
    yield make
    for c in made:
        c.close()


def all_threads_stopped(pid: int) -> bool:
    """Every thread of `pid` in state T (stopped), by /proc (the state follows the command name's last ')')."""
    tasks = os.listdir(f"/proc/{pid}/task")
    states = []
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                states.append(f.read().rsplit(")", 1)[1].split()[0])
        except FileNotFoundError:       # a thread that ended meanwhile
            continue
    return bool(states) and all(s == "T" for s in states)


def timed(call: Callable[[], Any]) -> tuple[Any, float]:
    t = time.monotonic()
    out = call()
    return out, time.monotonic() - t


def test_a_hung_server_costs_one_timeout_then_nothing_and_gets_placements_again_once_it_answers(make_cloud):
    # Back-off 6 s: the checks made while B hangs end well within it, even under load (past it, the next call would
    # try B, a probe with a deadline of up to PROBE_TIMEOUT_S, and take longer than BOUND_S).
    cloud = make_cloud(reconcile_interval_s=0, server_backoff_s=6.0, server_backoff_max_s=8.0)
    assert cloud.listed() == {"A", "B"}
    cloud.hang("B")
    listed, took = timed(cloud.listed)
    assert listed == {"A"} and took < 2 * TIMEOUT_S        # the first timeout (asked at once, not in turn)
    for _ in range(3):
        listed, took = timed(cloud.listed)
        assert listed == {"A"} and took < BOUND_S, f"ListDevices took {took:.1f} s with a server hung"
    g, took = timed(lambda: cloud.create("while-hung", 2))
    assert dict(g.parts) == {"A": 2} and took < BOUND_S
    # A call through the server's handle, as the job manager makes it: failed at once, as a real failed call.
    h = cloud.orch.servers["B"]
    with pytest.raises(grpc.RpcError) as e:
        t = time.monotonic()
        h.stub().GetMeasurements(fpga_pb2.GetMeasurementsRequest(), timeout=TIMEOUT_S)
    assert time.monotonic() - t < BOUND_S
    assert e.value.code() == grpc.StatusCode.UNAVAILABLE and "did not answer" in e.value.details()

    cloud.resume("B")
    # Once its back-off passes, it is tried again and answers: a group A has no room for goes to it. Each try
    # meanwhile is refused at once (RESOURCE_EXHAUSTED: 2 free on A), never a timeout's wait.
    resumed = time.monotonic()

    def placed_on_b() -> fpga_pb2.FpgaGroup | None:
        t = time.monotonic()
        try:
            return cloud.create("after", 4)
        except grpc.RpcError as e:
            assert e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, e
            return None
        finally:
            assert time.monotonic() - t < TIMEOUT_S
    g = eventually(placed_on_b, timeout=30, interval=0.2, what="a placement on B once it answers again")
    assert dict(g.parts) == {"B": 4}
    assert time.monotonic() - resumed < 8.0 + TIMEOUT_S      # within its back-off (at most the cap)
    assert cloud.listed() == {"A", "B"}


def test_the_job_api_is_not_held_up_by_a_hung_server(make_cloud):
    """The reviewer's scenario: EDF jobs over two servers, one SIGSTOPped (each call took 20-100 s before)."""
    cloud = make_cloud(jobs_policy="edf", jobs_control_period_s=0.2, server_backoff_s=60.0, server_backoff_max_s=60.0)
    jobs = cloud.jobs
    job = lambda rid, s: jp.RegisterJobRequest(tenant="alice", request_id=rid, design="sleep",  # noqa: E731
                                               deadline=jp.DeadlineGoal(deadline_s=s, size_actions=1000))
    a = jobs.RegisterJob(job("a", 100.0), timeout=60)
    b = jobs.RegisterJob(job("b", 200.0), timeout=60)
    assert a.devices == 8                                   # a group over both servers (4 devices each)
    cloud.hang("B")
    infos, took = timed(cloud.orch._server_infos)           # the first timeout
    assert set(infos) == {"A"}
    calls = [("GetJob", lambda: jobs.GetJob(jp.GetJobRequest(tenant="alice", job_id=a.id), timeout=60)),
             ("ListJobs", lambda: jobs.ListJobs(jp.ListJobsRequest(tenant="alice"), timeout=60)),
             ("ReportProgress", lambda: jobs.ReportProgress(jp.ReportProgressRequest(
                 tenant="alice", job_id=b.id, completed_actions=1), timeout=60)),
             ("RetireJob", lambda: jobs.RetireJob(jp.RetireJobRequest(tenant="alice", job_id=a.id), timeout=60)),
             ("ListJobs", lambda: jobs.ListJobs(jp.ListJobsRequest(tenant="alice"), timeout=60))]
    for name, call in calls:
        _, took = timed(call)
        assert took < BOUND_S, f"{name} took {took:.1f} s with a server hung"
    retired = jobs.GetJob(jp.GetJobRequest(tenant="alice", job_id=a.id), timeout=60)
    assert retired.state == jp.Job.STATE_RETIRED
