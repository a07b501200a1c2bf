"""Defects a review of the Application Manager found, each pinned by a test that fails without its fix.

The Application Manager runs in-process on SQLite; the CRS is stood in for (offered types, prices) and a run is a
function of the configuration (`_quick`), as in tests/unit/test_am_stop.py.
"""

from __future__ import annotations

import copy
import json
import threading

import grpc
import numpy as np
import pytest
from sqlalchemy import func, select

import examples
from application_manager import models as m
from application_manager import service as svc
from application_manager.local import LocalBackend, RunDetail
from application_manager.manifest import parse_manifest
from application_manager.profilers import PROFILERS
from application_manager.profilers.base import BENCHMARK, Observation
from application_manager.space import from_manifest
from harness.v1 import application_manager_pb2 as pb
from harness.v1 import irm_pb2
from services import paging
from services.errors import FailedPrecondition, InvalidArgument, Unavailable


class _Ctx:
    def is_active(self) -> bool:
        return True

    def add_callback(self, callback) -> bool:  # noqa: ANN001 - the RPC never ends in these tests
        return True


def _quick(backend, proposal, *, request_id="", timeout_s=0.0, cost_limit=0.0):  # noqa: ANN001, ANN202
    cfg = backend.space.configs[proposal.config]
    t = 10.0 / (1 + sum(v for k, v in cfg.items() if k.startswith("%") and isinstance(v, int | float) and v < 100))
    return RunDetail(Observation(proposal.config, True, t, t * 0.01, proposal.input))


def _am(tmp_path, monkeypatch, run=_quick, **config) -> svc.ApplicationManager:  # noqa: ANN001
    monkeypatch.setattr(svc.ApplicationManager, "_offered_types", lambda self: {"vm"})
    monkeypatch.setattr(LocalBackend, "prices", lambda self: np.ones(len(self.space)))
    monkeypatch.setattr(LocalBackend, "run", lambda self, p, **kw: run(self, p, **kw))
    return svc.ApplicationManager(svc.AppManagerConfig(state_dir=str(tmp_path), crs_address="127.0.0.1:1",
                                                       **config))


def _submit(am: svc.ApplicationManager, manifest: str | None = None) -> pb.Application:
    """RTM (with its SLO), or `manifest` (with none)."""
    return am.SubmitApplication(pb.SubmitApplicationRequest(
        tenant="t", manifest_json=manifest or examples.manifest("rtm"),
        slo_json=examples.slo("rtm") if manifest is None else "{}", app_dir="/x"), _Ctx())


def _profile(am: svc.ApplicationManager, app: pb.Application, **kw) -> pb.ProfilingSession:  # noqa: ANN003
    request = pb.StartProfilingRequest(tenant="t", application_id=app.id, **{"profiler": "uniform", **kw})
    return list(am.StartProfiling(request, _Ctx()))[-1].session


# -- 1. one variable, one domain; a group's variable is no input parameter --------------------------------------
_TWO_GROUPS = {"Name": "A", "Modules": [{"ModuleName": "Main", "Parameters": [], "Implementations": [{
    "ImplementationName": "CPU", "Command": ["true"], "Resources": {"Groups": [
        {"GroupID": "m", "Role": "MASTER", "Type": "Machine",
         "Attributes": {"Cores": {"Var": "%x", "Values": [1, 2, 4]}, "Memory": 1024}},
        {"GroupID": "w", "Type": "Machine",
         "Attributes": {"Cores": 1, "Memory": {"Var": "%x", "Values": [1024, 2048]}}}]}}]}]}
_GROUPS = "manifest_json.Modules[0].Implementations[0].Resources.Groups"


def test_a_variable_chosen_from_two_domains_in_one_implementation_is_refused_at_submit(tmp_path, monkeypatch):
    am = _am(tmp_path, monkeypatch)
    try:
        with pytest.raises(InvalidArgument) as e:
            _submit(am, json.dumps(_TWO_GROUPS))
        assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT
        (v,) = e.value.violations
        assert v.field == f"{_GROUPS}[1].Attributes.Memory.Var"
        assert f"{_GROUPS}[0].Attributes.Cores from [1, 2, 4], but here from [1024, 2048]" in v.description
        assert "give both the same values, or give this one a name of its own" in v.description
        # One variable with one domain in both groups is one choice: accepted.
        same = copy.deepcopy(_TWO_GROUPS)
        same["Modules"][0]["Implementations"][0]["Resources"]["Groups"][1]["Attributes"] = {
            "Cores": {"Var": "%x", "Values": [4, 2, 1]}, "Memory": 1024}
        assert _submit(am, json.dumps(same)).configurations == 3
    finally:
        am.stop()


def test_a_group_variable_that_is_also_an_input_parameter_is_refused_at_submit():
    manifest = copy.deepcopy(_TWO_GROUPS)
    main = manifest["Modules"][0]
    main["Parameters"] = [{"Var": "%x", "Name": "input", "Type": "INT", "Values": [100, 200]}]
    main["Implementations"][0]["Resources"]["Groups"][1]["Attributes"]["Memory"] = 1024
    main["Implementations"][0]["Command"] = ["true", "%x"]
    with pytest.raises(InvalidArgument) as e:
        parse_manifest(json.dumps(manifest), "manifest_json")
    (v,) = e.value.violations
    assert v.field == f"{_GROUPS}[0].Attributes.Cores.Var"
    assert "%x is also an input parameter" in v.description and "a name of its own" in v.description


# -- 2. ListApplications' page stops at a byte budget ---------------------------------------------------------------
def test_a_page_of_large_applications_stays_within_a_clients_receive_limit_and_paging_goes_on(tmp_path, monkeypatch):
    am = _am(tmp_path, monkeypatch)
    try:
        data = json.loads(examples.manifest("rtm"))
        data["Author"] = "x" * (svc.MAX_MANIFEST_BYTES - 2000)     # within the manifest limit
        ids = [_submit(am, json.dumps(data)).id for _ in range(20)]
        seen, token, pages = [], "", 0
        while True:
            r = am.ListApplications(pb.ListApplicationsRequest(tenant="t", page_token=token), _Ctx())
            assert r.ByteSize() <= 4 * 1024 * 1024, f"page {pages} is {r.ByteSize()} bytes"
            seen += [a.id for a in r.applications]
            pages += 1
            token = r.next_page_token
            if not token:
                break
        assert pages > 1
        created = {i: am.GetApplication(pb.GetApplicationRequest(tenant="t", application_id=i), _Ctx()).created_at
                   for i in ids}
        assert seen == sorted(ids, key=lambda i: (created[i], i))      # each once, in the listing's order
        # An explicit small page is still a page of that size.
        r = am.ListApplications(pb.ListApplicationsRequest(tenant="t", page_size=2), _Ctx())
        assert [a.id for a in r.applications] == seen[:2] and r.next_page_token
        # The cut page's token is one services.paging reads back.
        first = am.ListApplications(pb.ListApplicationsRequest(tenant="t"), _Ctx())
        with am.db.read() as s:
            rows, _ = paging.page(s, select(m.Application), [m.Application.created_at, m.Application.id], 1,
                                  first.next_page_token)
        assert rows[0].id == seen[len(first.applications)]
    finally:
        am.stop()


# -- 3. extrapolated profiling with no successful benchmark run ----------------------------------------------------
def _refused(backend, proposal, *, request_id="", timeout_s=0.0, cost_limit=0.0):  # noqa: ANN001, ANN202
    return RunDetail(Observation(proposal.config, False, 0.0, 0.0, proposal.input,
                                 error="could not reserve: RESOURCE_EXHAUSTED: no host has room", transient=True))


def test_extrapolated_profiling_with_no_successful_benchmark_run_ends_saying_so(tmp_path, monkeypatch):
    am = _am(tmp_path, monkeypatch, _refused)
    try:
        app = _submit(am)
        s = _profile(am, app, profiler="extrapolated", max_runs=6)
        assert s.state == pb.ProfilingSession.STATE_DONE, s.message
        assert s.message.startswith("no benchmark run succeeded: ")
        assert "RESOURCE_EXHAUSTED" in s.message and "profile again when the cloud has room" in s.message
    finally:
        am.stop()


def test_the_extrapolated_profiler_proposes_nothing_more_when_every_benchmark_run_failed():
    manifest = parse_manifest(examples.manifest("rtm"))
    space = from_manifest(manifest, {}, {"vm"})
    p = PROFILERS["extrapolated"](space, np.random.default_rng(0), max_runs=6, has_benchmark=True)
    obs: list[Observation] = []
    while (proposal := p.propose(obs)) is not None:
        assert proposal.input == BENCHMARK
        obs.append(Observation(proposal.config, False, 1.0, 0.1, BENCHMARK, error="exit code 1: boom"))
    assert p.ended.startswith(f"no benchmark run succeeded: {len(obs)} run(s)") and "exit code 1: boom" in p.ended


# -- 4. GetModel stays bounded ---------------------------------------------------------------------------------------
def test_a_long_error_is_stored_bounded_keeping_its_kind_and_its_last_words(tmp_path, monkeypatch):
    mode = {"fail": False}
    long_error = "exit code 1: " + "E" * 5000 + " the last words"

    def run(backend, proposal, **kw):  # noqa: ANN001, ANN003, ANN202
        if mode["fail"]:
            return RunDetail(Observation(proposal.config, False, 1.0, 0.01, proposal.input, error=long_error))
        return _quick(backend, proposal, **kw)
    am = _am(tmp_path, monkeypatch, run)
    try:
        app = _submit(am)
        _profile(am, app, max_runs=3)
        mode["fail"] = True
        e = am.ExecuteApplication(pb.ExecuteApplicationRequest(tenant="t", application_id=app.id), _Ctx())
        model = am.GetModel(pb.GetModelRequest(tenant="t", application_id=app.id), _Ctx())
        for error in (e.error, model.runs[-1].error):
            assert len(error) <= 2000
            assert error.startswith("exit code 1: EEE") and error.endswith("E the last words")
            assert "characters left out" in error
    finally:
        am.stop()


def test_get_model_returns_the_most_recent_runs_and_says_how_many_it_left_out(tmp_path, monkeypatch):
    monkeypatch.setattr(svc, "MAX_MODEL_RUNS", 10, raising=False)
    am = _am(tmp_path, monkeypatch)
    try:
        app = _submit(am)
        cfg = from_manifest(parse_manifest(examples.manifest("rtm")), {}, {"vm"}).configs[0]
        am.db.transact(lambda s: s.add_all([m.Run(
            application_id=app.id, session_id="s", ordinal=i, config=cfg, input="production", ok=True, error="",
            time_s=1.0, cost=1.0, reason="", created_at=float(i)) for i in range(15)]))
        model = am.GetModel(pb.GetModelRequest(tenant="t", application_id=app.id), _Ctx())
        assert [r.ordinal for r in model.runs] == list(range(5, 15))
        assert model.runs_left_out == 5
    finally:
        am.stop()


def test_get_model_returns_the_most_recent_sessions_and_says_how_many_it_left_out(tmp_path, monkeypatch):
    monkeypatch.setattr(svc, "MAX_MODEL_SESSIONS", 4, raising=False)
    am = _am(tmp_path, monkeypatch)
    try:
        app = _submit(am)
        am.db.transact(lambda s: s.add_all([m.Session(
            id=f"prof-{i:02d}", application_id=app.id, profiler="bo", state="done", runs=0, max_runs=1, spent=0.0,
            message="", params={}, started_at=float(i), ended_at=float(i) + 0.5, owner="", heartbeat_at=0.0)
            for i in range(7)]))
        model = am.GetModel(pb.GetModelRequest(tenant="t", application_id=app.id), _Ctx())
        assert [x.id for x in model.sessions] == ["prof-03", "prof-04", "prof-05", "prof-06"]   # in order started
        assert model.sessions_left_out == 3
    finally:
        am.stop()


# -- 5. a crash right after a run is committed -----------------------------------------------------------------------
@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")    # the simulated death
def test_a_crash_right_after_a_run_is_committed_leaves_it_in_the_model(tmp_path, monkeypatch):
    am = _am(tmp_path, monkeypatch)
    app = _submit(am)
    real, dead = am.db.transact, threading.Event()

    def transact(fn, *a, **kw):  # noqa: ANN001, ANN002, ANN003, ANN202
        """The profiling thread's process dies at its first write once a run is in the database."""
        if not threading.current_thread().name.startswith("profile-"):
            return real(fn, *a, **kw)
        if dead.is_set():
            raise SystemExit("simulated process death")
        out = real(fn, *a, **kw)
        with am.db.read() as s:
            if s.scalar(select(func.count()).select_from(m.Run)):
                dead.set()
        return out
    monkeypatch.setattr(am.db, "transact", transact)
    it = am.StartProfiling(pb.StartProfilingRequest(tenant="t", application_id=app.id, profiler="uniform",
                                                    max_runs=2), _Ctx())
    sid = next(it).session.id
    am._sessions[sid].thread.join(30)
    assert dead.is_set()
    am.stop()
    # A new process on the same database.
    am2 = _am(tmp_path, monkeypatch)
    try:
        model = am2.GetModel(pb.GetModelRequest(tenant="t", application_id=app.id), _Ctx())
        assert [r.ok for r in model.runs] == [True]
        assert len(model.frontier) == 1, "the committed run is not in the model"
        e = am2.ExecuteApplication(pb.ExecuteApplicationRequest(tenant="t", application_id=app.id), _Ctx())
        assert e.state == pb.ApplicationExecution.STATE_SUCCEEDED
    finally:
        am2.stop()


# -- 6. StartProfiling while the service stops -------------------------------------------------------------------------
def test_start_profiling_while_the_service_stops_is_refused_unavailable(tmp_path, monkeypatch):
    started, cancel_seen, release = threading.Event(), threading.Event(), threading.Event()

    def held(backend, proposal, **kw):  # noqa: ANN001, ANN003, ANN202
        started.set()
        backend.cancelled.wait(30)
        cancel_seen.set()
        release.wait(30)          # winding down (modules stopping, the reservation released) takes a moment
        return backend._cancelled_detail(proposal, None, None)
    am = _am(tmp_path, monkeypatch, held)
    a1, a2 = _submit(am), _submit(am)
    it = am.StartProfiling(pb.StartProfilingRequest(tenant="t", application_id=a1.id, profiler="uniform",
                                                    max_runs=3), _Ctx())
    next(it)
    assert started.wait(30)
    stopper = threading.Thread(target=am.stop)
    stopper.start()
    try:
        assert cancel_seen.wait(30)       # stop() is under way: it cancelled the run and waits for it
        with pytest.raises(Unavailable) as e:
            next(am.StartProfiling(pb.StartProfilingRequest(tenant="t", application_id=a2.id, profiler="uniform",
                                                            max_runs=3), _Ctx()))
        assert e.value.code == grpc.StatusCode.UNAVAILABLE and "stopping" in e.value.message
    finally:
        release.set()
        stopper.join(60)
    assert not stopper.is_alive()
    with am.db.read() as s:
        assert s.scalars(select(m.Session.id).where(m.Session.application_id == a2.id)).all() == []


# -- 7. a release the restart sweep could not make is retried ----------------------------------------------------------
class _Crs:
    def __init__(self) -> None:
        self.up, self.released, self.listed = False, [], 0

    def ListReservations(self, req, timeout=None):  # noqa: ANN001, ANN201, N802
        if not self.up:
            class Down(grpc.RpcError):
                def code(self):  # noqa: ANN202
                    return grpc.StatusCode.UNAVAILABLE
            raise Down()
        self.listed += 1
        state = irm_pb2.Reservation.STATE_RELEASED if self.released else irm_pb2.Reservation.STATE_ACTIVE
        return irm_pb2.ListReservationsResponse(reservations=[irm_pb2.Reservation(
            id="r-run1", tenant="t", request_id="am-prof-aaaaaaaaaaaa-1", state=state)])

    def ReleaseReservation(self, req, timeout=None):  # noqa: ANN001, ANN201, N802
        self.released.append(req.reservation_id)
        return irm_pb2.Reservation(id=req.reservation_id)


def test_a_release_the_restart_sweep_could_not_make_is_retried_until_the_crs_confirms(tmp_path, monkeypatch):
    am = _am(tmp_path, monkeypatch)
    app = _submit(am)
    # What a kill -9 mid-run leaves: a running session owned by a process that is gone.
    am.db.transact(lambda s: s.add(m.Session(
        id="prof-aaaaaaaaaaaa", application_id=app.id, profiler="uniform", state="running", runs=0, max_runs=5,
        spent=0.0, message="", params={}, started_at=1.0, ended_at=0.0, owner="deadhost:1:x", heartbeat_at=0.0)))
    am.stop()
    crs = _Crs()
    monkeypatch.setattr(svc.irm_pb2_grpc, "ResourceManagerStub", lambda channel: crs)
    am2 = _am(tmp_path, monkeypatch, heartbeat_s=300.0)     # its start-up sweep finds the CRS out of reach
    try:
        s = am2.GetModel(pb.GetModelRequest(tenant="t", application_id=app.id), _Ctx()).sessions[0]
        assert s.state == pb.ProfilingSession.STATE_FAILED and crs.released == []
        crs.up = True
        am2._sweep()                                         # what the periodic sweep does
        assert crs.released == ["r-run1"]
        listed = crs.listed
        am2._sweep()                                         # confirmed: not asked again
        assert crs.listed == listed and crs.released == ["r-run1"]
    finally:
        am2.stop()


# -- 8. warm start past a stale application ----------------------------------------------------------------------------
def test_warm_start_leaves_out_an_application_todays_checks_refuse(tmp_path, monkeypatch):
    am = _am(tmp_path, monkeypatch)
    try:
        good, old = _submit(am), _submit(am)
        _profile(am, old, max_runs=2)

        def stale(s) -> None:  # noqa: ANN001 - accepted by an earlier, looser version: an SLO bound of 0
            s.get(m.Application, old.id).slo = json.dumps({"Manifest": "RTM",
                                                           "Objective": {"Constraints": ["%cost <= 0"]}})
        am.db.transact(stale)
        am._loaded.pop(old.id)
        s = _profile(am, good, profiler="bo", max_runs=2, warm_start=True)
        assert s.state == pb.ProfilingSession.STATE_DONE, s.message
        assert s.runs == 2
    finally:
        am.stop()


# -- 9. bounded caches --------------------------------------------------------------------------------------------------
def test_loaded_applications_are_bounded_least_recently_used_first(tmp_path, monkeypatch):
    monkeypatch.setattr(svc, "MAX_LOADED", 3, raising=False)
    am = _am(tmp_path, monkeypatch)
    try:
        apps = [_submit(am) for _ in range(5)]
        am.GetApplication(pb.GetApplicationRequest(tenant="t", application_id=apps[2].id), _Ctx())
        am.GetApplication(pb.GetApplicationRequest(tenant="t", application_id=apps[0].id), _Ctx())
        assert list(am._loaded) == [apps[4].id, apps[2].id, apps[0].id]
        # An evicted one is read again from the database.
        again = am.GetApplication(pb.GetApplicationRequest(tenant="t", application_id=apps[1].id), _Ctx())
        assert again.id == apps[1].id and again.configurations == apps[1].configurations
        assert len(am._loaded) == 3
    finally:
        am.stop()


def test_finished_sessions_leave_no_runner_behind_and_stay_readable(tmp_path, monkeypatch):
    am = _am(tmp_path, monkeypatch)
    try:
        app = _submit(am)
        first, second = _profile(am, app, max_runs=2), _profile(am, app, max_runs=2)
        assert am._sessions == {}
        s = am.StopProfiling(pb.StopProfilingRequest(tenant="t", session_id=first.id), _Ctx())
        assert s.state == pb.ProfilingSession.STATE_DONE and s.runs == 2
        model = am.GetModel(pb.GetModelRequest(tenant="t", application_id=app.id), _Ctx())
        assert [(x.id, x.state) for x in model.sessions] == [(first.id, pb.ProfilingSession.STATE_DONE),
                                                             (second.id, pb.ProfilingSession.STATE_DONE)]
    finally:
        am.stop()


# -- 10. a negative seed -------------------------------------------------------------------------------------------------
def test_a_negative_seed_is_refused_naming_the_field(tmp_path, monkeypatch):
    am = _am(tmp_path, monkeypatch)
    try:
        app = _submit(am)
        with pytest.raises(InvalidArgument) as e:
            next(am.StartProfiling(pb.StartProfilingRequest(tenant="t", application_id=app.id, seed=-1), _Ctx()))
        assert [(v.field, v.description) for v in e.value.violations] == [
            ("seed", "a whole number >= 0 (the same seed, the same choices), got -1")]
        with pytest.raises(FailedPrecondition):     # nothing was started: no model
            am.ExecuteApplication(pb.ExecuteApplicationRequest(tenant="t", application_id=app.id), _Ctx())
    finally:
        am.stop()
