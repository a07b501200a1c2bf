"""Two Application Manager processes on one database: each runs its own sessions, neither takes the other's
for interrupted while it lives, a stop asked through either reaches the one running the session, and the
sessions of one that dies are ended (their reservations released) by the other.

CRS, compute IRM, agent and both AMs are separate processes sharing the AMs' SQLite file; the application is
a real command that runs far longer than the tests wait, so only a stopped run ends within their bounds.
"""

from __future__ import annotations

from pathlib import Path

import grpc
import psutil
import pytest

from harness.v1 import application_manager_pb2 as pb
from harness.v1 import application_manager_pb2_grpc as pb_grpc
from harness.v1 import irm_pb2
from services.tls import plain_channel
from tests.conftest import Suite, eventually
from tests.integration.test_am_cancellation import ENDS_WITHIN_S, _no_reservation_left, _sleeper

HEARTBEAT_S = 0.3


@pytest.fixture(scope="module")
def cloud(tmp_path_factory):
    suite = Suite(str(tmp_path_factory.mktemp("am-replicas")))
    try:
        crs, c = suite.compute_cloud()

        def start_am(name: str):  # noqa: ANN202
            p = suite.start("am", name=name, crs_address=crs.address, heartbeat_s=HEARTBEAT_S)
            return p, pb_grpc.ApplicationManagerStub(plain_channel(p.address))
        yield {"crs": c, "start_am": start_am}
    finally:
        suite.stop_all()


def _session(am: pb_grpc.ApplicationManagerStub, tenant: str, app_id: str) -> pb.ProfilingSession:
    (s,) = am.GetModel(pb.GetModelRequest(tenant=tenant, application_id=app_id), timeout=10).sessions
    return s


def _profiling(am: pb_grpc.ApplicationManagerStub, crs, tenant: str, app: pb.Application, pid_file: Path):  # noqa: ANN001, ANN202
    """A session started on `am` whose first run is under way (its program running, its reservation held)."""
    stream = am.StartProfiling(pb.StartProfilingRequest(tenant=tenant, application_id=app.id, profiler="uniform",
                                                        max_runs=1), timeout=600)
    sid = next(stream).session.id
    pid = int(eventually(lambda: pid_file.exists() and pid_file.read_text().strip(), timeout=ENDS_WITHIN_S,
                         what="the run's program to be running"))
    assert crs.ListReservations(irm_pb2.ListReservationsRequest(tenant=tenant), timeout=10).reservations
    return stream, sid, pid


def test_a_second_am_leaves_the_first_ones_session_running_and_stops_it_when_asked(cloud, tmp_path):
    crs, tenant = cloud["crs"], "replica-stop"
    p1, am1 = cloud["start_am"]("am-first")
    try:
        app = _sleeper(am1, tenant, tmp_path)
        stream, sid, pid = _profiling(am1, crs, tenant, app, tmp_path / "pid")
        # Its start-up sweep is over once it serves: the first one's session was left running.
        p2, am2 = cloud["start_am"]("am-second")
        try:
            assert _session(am2, tenant, app.id).state == pb.ProfilingSession.STATE_RUNNING
            with pytest.raises(grpc.RpcError) as e:
                next(am2.StartProfiling(pb.StartProfilingRequest(tenant=tenant, application_id=app.id,
                                                                 profiler="uniform", max_runs=1), timeout=30))
            assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION and sid in e.value.details()

            answer = am2.StopProfiling(pb.StopProfilingRequest(tenant=tenant, session_id=sid), timeout=10)
            assert answer.state == pb.ProfilingSession.STATE_RUNNING and "AM process running it" in answer.message
            ended = eventually(lambda: (s := _session(am2, tenant, app.id)).state
                               != pb.ProfilingSession.STATE_RUNNING and s, timeout=ENDS_WITHIN_S,
                               what="the session to end")
            assert ended.state == pb.ProfilingSession.STATE_STOPPED, ended
            eventually(lambda: not psutil.pid_exists(pid), timeout=ENDS_WITHIN_S, what="the run's program to end")
            _no_reservation_left(crs, tenant)
            stream.cancel()
        finally:
            p2.stop()
    finally:
        p1.stop()


def test_the_sessions_of_an_am_that_dies_are_ended_by_the_other_and_their_reservations_released(cloud, tmp_path):
    crs, tenant = cloud["crs"], "replica-crash"
    p1, am1 = cloud["start_am"]("am-doomed")
    p2, am2 = cloud["start_am"]("am-survivor")
    try:
        app = _sleeper(am1, tenant, tmp_path)
        stream, sid, _ = _profiling(am1, crs, tenant, app, tmp_path / "pid")
        p1.kill()       # SIGKILL: no graceful stop, the run's reservation stays held
        stream.cancel()
        ended = eventually(lambda: (s := _session(am2, tenant, app.id)).state
                           != pb.ProfilingSession.STATE_RUNNING and s, timeout=ENDS_WITHIN_S,
                           what="the survivor to end the dead process's session")
        assert ended.state == pb.ProfilingSession.STATE_FAILED and "is gone" in ended.message, ended
        _no_reservation_left(crs, tenant)
        # The application is free again: the survivor profiles it.
        again = next(am2.StartProfiling(pb.StartProfilingRequest(tenant=tenant, application_id=app.id,
                                                                 profiler="uniform", max_runs=1), timeout=30))
        assert again.session.state == pb.ProfilingSession.STATE_RUNNING and again.session.id != sid
        am2.StopProfiling(pb.StopProfilingRequest(tenant=tenant, session_id=again.session.id), timeout=10)
    finally:
        p2.stop()
        p1.stop()
