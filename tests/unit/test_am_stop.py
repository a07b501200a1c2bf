"""Stopping profiling or the service cancels the run in progress (its reservation released), and a restart
releases what runs interrupted by a crash left reserved, found by their deterministic CRS request ids.

The Application Manager runs in-process on SQLite; the back-end's `run` is stood in for by one that holds its
"reservation" until its cancellation event is set, as LocalBackend.run does.
"""

from __future__ import annotations

import threading
import time

import numpy as np

import examples
from application_manager import models as m
from application_manager import service as svc
from application_manager.local import LocalBackend, RunDetail
from application_manager.profilers.base import Observation
from harness.v1 import application_manager_pb2 as pb
from harness.v1 import irm_pb2


class _Ctx:
    def is_active(self) -> bool:
        return True

    def add_callback(self, callback) -> bool:  # noqa: ANN001 - the RPC never ends in these tests
        return True


class _Held:
    """A run that holds until cancelled (or 8 s pass, then measures): records request ids and cancellations."""

    def __init__(self) -> None:
        self.request_ids: list[str] = []
        self.started = threading.Event()
        self.cancelled: list[str] = []

    def __call__(self, backend, proposal, *, request_id="", timeout_s=0.0, cost_limit=0.0):  # noqa: ANN001, ANN204
        self.request_ids.append(request_id)
        self.started.set()
        end = time.monotonic() + 8.0
        while time.monotonic() < end:
            if backend.cancelled is not None and backend.cancelled.is_set():
                self.cancelled.append(request_id)
                return backend._cancelled_detail(proposal, None, None)
            time.sleep(0.05)
        return RunDetail(Observation(proposal.config, True, 1.0, 1.0, proposal.input))


def _am(tmp_path, monkeypatch, run) -> svc.ApplicationManager:  # noqa: ANN001
    monkeypatch.setattr(svc.ApplicationManager, "_offered_types", lambda self: {"vm"})
    monkeypatch.setattr(LocalBackend, "prices", lambda self: np.ones(len(self.space)))
    monkeypatch.setattr(LocalBackend, "run", lambda self, p, **kw: run(self, p, **kw))
    return svc.ApplicationManager(svc.AppManagerConfig(state_dir=str(tmp_path), crs_address="127.0.0.1:1"))


def _submit(am: svc.ApplicationManager) -> pb.Application:
    return am.SubmitApplication(pb.SubmitApplicationRequest(
        tenant="t", manifest_json=examples.manifest("rtm"), slo_json=examples.slo("rtm", rows=200, steps=20),
        app_dir="/x"), _Ctx())


def test_stop_profiling_cancels_the_run_in_progress_and_answers_stopped(tmp_path, monkeypatch):
    held = _Held()
    am = _am(tmp_path, monkeypatch, held)
    try:
        app = _submit(am)
        it = am.StartProfiling(pb.StartProfilingRequest(tenant="t", application_id=app.id, profiler="uniform",
                                                        max_runs=3), _Ctx())
        sid = next(it).session.id
        assert held.started.wait(5)
        t0 = time.monotonic()
        s = am.StopProfiling(pb.StopProfilingRequest(tenant="t", session_id=sid), _Ctx())
        assert time.monotonic() - t0 < 3.0, "StopProfiling waited for the run instead of cancelling it"
        list(it)
        assert s.state == pb.ProfilingSession.STATE_STOPPED, s.message
        # The reservation was made under the session's derived request id, and that run was cancelled.
        assert held.request_ids == [f"am-{sid}-1"] and held.cancelled == [f"am-{sid}-1"]
        model = am.GetModel(pb.GetModelRequest(tenant="t", application_id=app.id), _Ctx())
        (run,) = model.runs
        assert not run.ok and run.error.startswith("stopped:")   # recorded, saying why ...
        assert not model.frontier                                # ... but not a failure of the configuration
        assert am._observations(am._load("t", app.id)) == []     # nor seen by the next session
    finally:
        am.stop()


def test_stopping_the_service_cancels_the_runs_in_progress(tmp_path, monkeypatch):
    held = _Held()
    am = _am(tmp_path, monkeypatch, held)
    app = _submit(am)
    it = am.StartProfiling(pb.StartProfilingRequest(tenant="t", application_id=app.id, profiler="uniform",
                                                    max_runs=3), _Ctx())
    sid = next(it).session.id
    assert held.started.wait(5)

    held_exec = _Held()
    result: dict = {}
    # A second application, executed: its run is cancelled by the service stopping too.
    app2 = _submit(am)
    monkeypatch.setattr(LocalBackend, "run", lambda self, p, **kw: held_exec(self, p, **kw))
    am._refresh_model(am._load("t", app2.id), [{"config": am._load("t", app2.id).space.configs[0], "time_s": 1.0,
                                                "cost": 1.0}])
    th = threading.Thread(target=lambda: result.setdefault("e", am.ExecuteApplication(
        pb.ExecuteApplicationRequest(tenant="t", application_id=app2.id), _Ctx())))
    th.start()
    assert held_exec.started.wait(5)
    t0 = time.monotonic()
    am.stop()
    assert time.monotonic() - t0 < 5.0, "stop waited for the runs instead of cancelling them"
    th.join(5)
    list(it)
    assert held.cancelled == [f"am-{sid}-1"]
    e = result["e"]
    assert held_exec.cancelled == [f"am-{e.id}"] and e.state == pb.ApplicationExecution.STATE_FAILED


class _Crs:
    """ListReservations in pages of two; records releases."""

    def __init__(self, reservations: list[irm_pb2.Reservation]) -> None:
        self.reservations = reservations
        self.released: list[str] = []

    def ListReservations(self, req, timeout=None):  # noqa: ANN001, ANN201, N802
        mine = [r for r in self.reservations if r.tenant == req.tenant]
        start = int(req.page_token or 0)
        nxt = start + 2
        return irm_pb2.ListReservationsResponse(reservations=mine[start:nxt],
                                                next_page_token=str(nxt) if nxt < len(mine) else "")

    def ReleaseReservation(self, req, timeout=None):  # noqa: ANN001, ANN201, N802
        assert req.tenant == "t"
        self.released.append(req.reservation_id)
        return irm_pb2.Reservation(id=req.reservation_id)


def _leave_running(am: svc.ApplicationManager, app_id: str) -> tuple[str, str]:
    """What a crash mid-run leaves in the database: a session and an execution still "running"."""
    def add(s) -> None:  # type: ignore[no-untyped-def]
        s.add(m.Session(id="prof-aaaaaaaaaaaa", application_id=app_id, profiler="uniform", state="running", runs=2,
                        max_runs=5, spent=0.0, message="", params={}, started_at=1.0, ended_at=0.0))
        s.add(m.Execution(id="exec-bbbbbbbbbbbb", application_id=app_id, tenant="t", request_id=None,
                          state="running", config={}, slo="", predicted_time_s=0.0, predicted_cost=0.0,
                          started_at=1.0))
    am.db.transact(add)
    return "prof-aaaaaaaaaaaa", "exec-bbbbbbbbbbbb"


def test_a_restart_releases_the_reservations_interrupted_runs_left(tmp_path, monkeypatch):
    am = _am(tmp_path, monkeypatch, _Held())
    app = _submit(am)
    sid, eid = _leave_running(am, app.id)
    am.stop()
    active, released = irm_pb2.Reservation.STATE_ACTIVE, irm_pb2.Reservation.STATE_RELEASED
    crs = _Crs([
        irm_pb2.Reservation(id="r-other", tenant="t", request_id="user-1", state=active),
        irm_pb2.Reservation(id="r-run3", tenant="t", request_id=f"am-{sid}-3", state=active),
        irm_pb2.Reservation(id="r-old", tenant="t", request_id=f"am-{sid}-2", state=released),
        irm_pb2.Reservation(id="r-exec", tenant="t", request_id=f"am-{eid}", state=active),
        irm_pb2.Reservation(id="r-another-session", tenant="t", request_id="am-prof-cccccccccccc-1", state=active),
        irm_pb2.Reservation(id="r-tenant2", tenant="u", request_id=f"am-{sid}-3", state=active),
    ])
    monkeypatch.setattr(svc.irm_pb2_grpc, "ResourceManagerStub", lambda ch: crs)
    again = svc.ApplicationManager(svc.AppManagerConfig(state_dir=str(tmp_path), crs_address="127.0.0.1:1"))
    try:
        assert sorted(crs.released) == ["r-exec", "r-run3"]
        s = again.GetModel(pb.GetModelRequest(tenant="t", application_id=app.id), _Ctx()).sessions[0]
        assert s.state == pb.ProfilingSession.STATE_FAILED and "interrupted" in s.message
    finally:
        again.stop()


def test_a_restart_with_the_crs_away_still_starts_and_says_what_is_left(tmp_path, monkeypatch, caplog):
    am = _am(tmp_path, monkeypatch, _Held())
    app = _submit(am)
    _leave_running(am, app.id)
    am.stop()
    crs = _Crs([])
    crs.ListReservations = _raise_rpc  # type: ignore[method-assign]
    monkeypatch.setattr(svc.irm_pb2_grpc, "ResourceManagerStub", lambda ch: crs)
    again = svc.ApplicationManager(svc.AppManagerConfig(state_dir=str(tmp_path), crs_address="127.0.0.1:1"))
    try:
        assert any("could not release" in r.getMessage() for r in caplog.records)
    finally:
        again.stop()


def _raise_rpc(req, timeout=None):  # noqa: ANN001, ANN202
    import grpc

    class Unavailable(grpc.RpcError):
        def code(self):  # noqa: ANN202
            return grpc.StatusCode.UNAVAILABLE

    raise Unavailable()
