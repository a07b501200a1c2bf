"""Long calls cannot starve the Application Manager's short ones (review 15).

An ExecuteApplication call holds a gRPC worker thread until its run ends (up to days), a StartProfiling stream
until its session ends. With no cap they filled the server's 32 workers, and then StopProfiling, GetModel and
health checks queued behind them for as long. Now at most `max_long_calls` run at once (one more is
RESOURCE_EXHAUSTED, saying the limit, the setting and to retry), and the server has that many workers plus
CONTROL_WORKERS for the short calls.

Over the real gRPC server (port 0), the AM in this process; its runs go to a stand-in back-end that holds every
run until the test lets it go (or the run is cancelled), so calls are held deterministically. A second test runs
a real application through the CRS, compute IRM and agent processes: a session's duration bounds its run.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path

import grpc
import numpy as np
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

import examples
from application_manager import service as svc
from application_manager.local import CANCELLED, LocalBackend, RunDetail
from application_manager.profilers.base import Observation
from harness.v1 import application_manager_pb2 as pb
from harness.v1 import application_manager_pb2_grpc as pb_grpc
from services import server
from services.errors import STREAM_CAP, error_info, retry_delay_s
from services.tls import plain_channel
from tests.conftest import Suite, eventually

# More than the 32 workers a server had: without room for each, some of them would not even start.
CAP = 34
SESSIONS = 2                  # of the CAP long calls, StartProfiling streams (one per application)
LOOSE_SLO = json.dumps({"Objective": {"Constraints": ["%execution_time <= 10000000"]}})


class _HeldRuns:
    """LocalBackend.run that holds every run until `release` is set (or its run is cancelled)."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.inside = 0
        self._lock = threading.Lock()

    def run(self, backend, proposal, *, request_id="", timeout_s=0.0, cost_limit=0.0):  # noqa: ANN001, ANN201
        with self._lock:
            self.inside += 1
        try:
            # Wakes within 50 ms of either event: the test waits on what it observes, never on this period.
            while not self.release.wait(0.05):
                if backend.cancelled is not None and backend.cancelled.is_set():
                    return RunDetail(Observation(proposal.config, False, 0.0, 0.0, proposal.input,
                                                 error=backend.cancel_reason, transient=True), cancelled=True)
            return RunDetail(Observation(proposal.config, True, 1.0, 0.01, proposal.input, 50.0, 50.0))
        finally:
            with self._lock:
                self.inside -= 1


@pytest.fixture
def am_server(tmp_path, monkeypatch):
    held = _HeldRuns()
    monkeypatch.setattr(svc.ApplicationManager, "_offered_types", lambda self: {"vm"})
    monkeypatch.setattr(LocalBackend, "prices", lambda self: np.full(len(self.space), 0.01))
    monkeypatch.setattr(LocalBackend, "run", lambda self, proposal, **kw: held.run(self, proposal, **kw))
    component = svc.component(svc.AppManagerConfig(state_dir=str(tmp_path), crs_address="127.0.0.1:1",
                                                   max_long_calls=CAP))
    running = server.start("127.0.0.1:0", [component])
    channel = plain_channel(f"127.0.0.1:{running.port}")
    try:
        yield component.extra["am"], channel, held
    finally:
        held.release.set()
        channel.close()
        running.stop(0)


def _submit(stub: pb_grpc.ApplicationManagerStub) -> pb.Application:
    return stub.SubmitApplication(pb.SubmitApplicationRequest(
        tenant="t", manifest_json=examples.manifest("rtm"), slo_json=examples.slo("rtm", rows=400, steps=20),
        app_dir="/x"), timeout=30)


def test_with_every_long_call_held_short_calls_answer_and_one_more_long_call_is_refused(am_server):
    am, channel, held = am_server
    stub = pb_grpc.ApplicationManagerStub(channel)
    apps = [_submit(stub) for _ in range(SESSIONS + 1)]
    loaded = am._load("t", apps[0].id)
    am._refresh_model(loaded, [{"config": loaded.space.configs[0], "time_s": 10.0, "cost": 0.1}])

    streams = [stub.StartProfiling(pb.StartProfilingRequest(tenant="t", application_id=a.id, profiler="uniform",
                                                            max_runs=1), timeout=120) for a in apps[:SESSIONS]]
    sessions = [next(s).session.id for s in streams]
    executions = [stub.ExecuteApplication.future(pb.ExecuteApplicationRequest(
        tenant="t", application_id=apps[0].id, slo_json=LOOSE_SLO), timeout=120) for _ in range(CAP - SESSIONS)]
    # Every long call has a worker thread: each run has started (the sessions' runs on their own threads).
    eventually(lambda: held.inside == CAP, timeout=60, what=f"{CAP} runs held at once")

    # The short calls still find a thread at once ...
    health = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
    assert health.status == health_pb2.HealthCheckResponse.SERVING
    model = stub.GetModel(pb.GetModelRequest(tenant="t", application_id=apps[0].id), timeout=5)
    assert len(model.frontier) == 1

    # ... and one long call more is refused, saying the limit, the setting that raises it and to retry.
    for call in (lambda: stub.ExecuteApplication(pb.ExecuteApplicationRequest(
                     tenant="t", application_id=apps[0].id, slo_json=LOOSE_SLO), timeout=10),
                 lambda: next(stub.StartProfiling(pb.StartProfilingRequest(
                     tenant="t", application_id=apps[SESSIONS].id, profiler="uniform", max_runs=1), timeout=10))):
        with pytest.raises(grpc.RpcError) as e:
            call()
        assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        details = e.value.details()
        assert f"max_long_calls={CAP}" in details and "retry" in details and "--set max_long_calls" in details
        assert error_info(e.value) == (STREAM_CAP, {"max_long_calls": str(CAP)})
        assert retry_delay_s(e.value) and retry_delay_s(e.value) > 0
    # The refused StartProfiling started no session.
    assert not stub.GetModel(pb.GetModelRequest(tenant="t", application_id=apps[SESSIONS].id), timeout=5).sessions
    assert not any(f.done() for f in executions)

    # StopProfiling answers too, and stopping a session gives its stream's slot back.
    stub.StopProfiling(pb.StopProfilingRequest(tenant="t", session_id=sessions[0]), timeout=5)
    assert list(streams[0])[-1].session.state == pb.ProfilingSession.STATE_STOPPED
    freed = stub.ExecuteApplication.future(pb.ExecuteApplicationRequest(
        tenant="t", application_id=apps[0].id, slo_json=LOOSE_SLO), timeout=120)
    eventually(lambda: held.inside == CAP, timeout=30, what="the freed slot's execution running")

    held.release.set()
    for f in [*executions, freed]:
        assert f.result().state == pb.ApplicationExecution.STATE_SUCCEEDED
    assert list(streams[1])[-1].session.state == pb.ProfilingSession.STATE_DONE
    # Every slot came back: a long call is taken again.
    assert stub.ExecuteApplication(pb.ExecuteApplicationRequest(tenant="t", application_id=apps[0].id,
                                                                slo_json=LOOSE_SLO), timeout=30).state == \
        pb.ApplicationExecution.STATE_SUCCEEDED
    assert am._long_calls.open == 0


def test_a_cancelled_execution_gives_its_slot_back(am_server):
    am, channel, held = am_server
    stub = pb_grpc.ApplicationManagerStub(channel)
    app = _submit(stub)
    loaded = am._load("t", app.id)
    am._refresh_model(loaded, [{"config": loaded.space.configs[0], "time_s": 10.0, "cost": 0.1}])
    calls = [stub.ExecuteApplication.future(pb.ExecuteApplicationRequest(
        tenant="t", application_id=app.id, slo_json=LOOSE_SLO), timeout=120) for _ in range(CAP)]
    eventually(lambda: held.inside == CAP, timeout=60, what=f"{CAP} runs held at once")
    assert calls[0].cancel()
    eventually(lambda: am._long_calls.open == CAP - 1, what="the cancelled execution's slot given back")
    listed = stub.ListExecutions(pb.ListExecutionsRequest(tenant="t", application_id=app.id, page_size=100),
                                 timeout=10).executions
    assert sum(CANCELLED in x.error for x in listed) == 1
    held.release.set()
    assert all(c.result().state == pb.ApplicationExecution.STATE_SUCCEEDED for c in calls[1:])


# -- 2, end to end: a real application, a real agent --------------------------------------------------------------
@pytest.fixture(scope="module")
def cloud(tmp_path_factory):
    suite = Suite(str(tmp_path_factory.mktemp("am-review15")))
    try:
        crs, _ = suite.compute_cloud()
        am = suite.start("am", crs_address=crs.address)
        yield pb_grpc.ApplicationManagerStub(plain_channel(am.address))
    finally:
        suite.stop_all()


def test_a_sessions_duration_cuts_its_run_short_at_the_agent(cloud, tmp_path: Path):
    am = cloud
    manifest = {"Name": "Sleeper", "Modules": [{"ModuleName": "Main", "Parameters": [], "Implementations": [{
        "ImplementationName": "cpu", "Resources": {"Groups": [{
            "GroupID": "master", "Role": "MASTER", "Type": "Machine", "NumInstances": {"Value": 1},
            "Attributes": {"Memory": {"Value": 256}, "Cores": {"Value": 1}}}]},
        "Command": ["/bin/sleep", "600"], "ExecutionArgs": ""}]}]}
    app = am.SubmitApplication(pb.SubmitApplicationRequest(tenant="dur", manifest_json=json.dumps(manifest),
                                                           app_dir=str(tmp_path)), timeout=30)
    # The service's run_timeout_s is 600 s, as long as the program: only the session's 3 s can end it in time.
    events = list(am.StartProfiling(pb.StartProfilingRequest(tenant="dur", application_id=app.id,
                                                             profiler="uniform", max_runs=3, max_duration_s=3),
                                    timeout=120))
    session = events[-1].session
    assert (session.state, session.message) == (pb.ProfilingSession.STATE_DONE, "duration"), session
    assert session.ended_at - session.started_at < 60
    (run,) = am.GetModel(pb.GetModelRequest(tenant="dur", application_id=app.id), timeout=10).runs
    assert not run.ok and run.error.startswith("timeout: ") and "max_duration_s=3" in run.error, run
    # No failure of the configuration: there is no model of it, and the AM says none of its runs was measured.
    with pytest.raises(grpc.RpcError) as e:
        am.ExecuteApplication(pb.ExecuteApplicationRequest(tenant="dur", application_id=app.id), timeout=30)
    assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "could be measured" in e.value.details(), e.value.details()
