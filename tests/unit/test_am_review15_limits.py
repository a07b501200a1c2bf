"""Each run's time limit comes from what bounds it (review 15).

A profiling session's duration (max_duration_s) and budget (max_cost) bound each run, not only the gap between
runs: a run gets at most what is left of them, and one cut short there is no failure of its configuration; the
session then ends by that rule. An execution whose request names no timeout_s may take twice the model's time of
its configuration when that is more than run_timeout_s, and a timeout at a limit the caller did not choose takes
no configuration off the frontier. `max_long_calls` is checked at start-up and sizes the server's pool.

The application is a deterministic stand-in: it needs NEEDS_S seconds of the session's (virtual) clock, and is
killed at the limit it is given if that is less.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

import examples
from application_manager import service as svc
from application_manager.local import LocalBackend, RunDetail
from application_manager.profilers.base import Observation
from harness.v1 import application_manager_pb2 as pb
from harness.v1 import application_manager_pb2_grpc as pb_grpc
from services import config as cfg
from services.catalog import config_sections
from services.clock import VirtualClock

NEEDS_S = 100.0          # the stand-in application's run time
PRICE_PER_S = 0.01       # every configuration's quote
LOOSE_SLO = json.dumps({"Objective": {"Constraints": ["%execution_time <= 10000000"]}})


class _Ctx:
    def is_active(self) -> bool:
        return True

    def add_callback(self, callback) -> bool:  # noqa: ANN001
        return True


def _am(tmp_path, monkeypatch, run, clock=None, **config) -> svc.ApplicationManager:  # noqa: ANN001
    monkeypatch.setattr(svc.ApplicationManager, "_offered_types", lambda self: {"vm"})
    monkeypatch.setattr(LocalBackend, "prices", lambda self: np.full(len(self.space), PRICE_PER_S))
    monkeypatch.setattr(LocalBackend, "run", run)
    return svc.ApplicationManager(svc.AppManagerConfig(state_dir=str(tmp_path), crs_address="127.0.0.1:1",
                                                       **config), clock)


def _submit(am: svc.ApplicationManager) -> pb.Application:
    return am.SubmitApplication(pb.SubmitApplicationRequest(
        tenant="t", manifest_json=examples.manifest("rtm"), slo_json=examples.slo("rtm", rows=400, steps=20),
        app_dir="/x"), _Ctx())


def _slow_app(clock: VirtualClock, limits: list[float]):  # noqa: ANN202
    """LocalBackend.run of an application that needs NEEDS_S s: killed ("timeout", as the agent says) at a
    smaller limit, having held its reservation that long."""
    def run(self, proposal, *, request_id="", timeout_s=0.0, cost_limit=0.0):  # noqa: ANN001, ANN202
        limits.append(timeout_s)
        took = min(NEEDS_S, timeout_s)
        clock.advance(took)
        ok = took >= NEEDS_S
        return RunDetail(Observation(proposal.config, ok, took, took * PRICE_PER_S, proposal.input, 50.0, 50.0,
                                     "" if ok else "timeout"))
    return run


def _session(am: svc.ApplicationManager, app_id: str, **request) -> tuple[pb.ProfilingSession, pb.PerformanceModel]:
    events = list(am.StartProfiling(pb.StartProfilingRequest(tenant="t", application_id=app_id, profiler="uniform",
                                                             seed=1, **request), _Ctx()))
    return events[-1].session, am.GetModel(pb.GetModelRequest(tenant="t", application_id=app_id), _Ctx())


# -- 2: a session's duration and budget bound each run ---------------------------------------------------------
def test_a_run_gets_at_most_what_is_left_of_the_sessions_duration(tmp_path, monkeypatch):
    clock, limits = VirtualClock(1000.0), []
    am = _am(tmp_path, monkeypatch, _slow_app(clock, limits), clock)
    try:
        app = _submit(am)
        session, model = _session(am, app.id, max_runs=5, max_duration_s=130)
        # The first run had 130 s of the session left (less than run_timeout_s, 600) and took 100; the second
        # had 30 s left, not 600: the session ended 130 s after it began, not 700.
        assert limits == pytest.approx([130.0, 30.0])
        assert clock.now() == pytest.approx(1130.0)
        assert (session.state, session.message) == (pb.ProfilingSession.STATE_DONE, "duration")
        first, second = model.runs
        assert first.ok and first.execution_time_s == NEEDS_S
        assert not second.ok and second.error.startswith("timeout: ") and "max_duration_s=130" in second.error
        # Cut short by the session's rule, the run is no measurement of its configuration.
        measured = am._observations(am._load("t", app.id))
        assert [o.ok for o in measured] == [True]
    finally:
        am.stop()


def test_a_run_gets_at_most_what_is_left_of_the_sessions_budget(tmp_path, monkeypatch):
    clock, limits = VirtualClock(1000.0), []
    am = _am(tmp_path, monkeypatch, _slow_app(clock, limits), clock)
    try:
        app = _submit(am)
        # A run costs 1.0 (100 s at 0.01/s): the budget has room for one and a half.
        session, model = _session(am, app.id, max_runs=5, max_cost=1.5)
        assert limits == pytest.approx([150.0, 50.0])
        assert (session.state, session.message) == (pb.ProfilingSession.STATE_DONE, "budget")
        assert session.spent == pytest.approx(1.5)          # not 2.0: the budget was not overspent
        assert [r.ok for r in model.runs] == [True, False] and "max_cost=1.5" in model.runs[1].error
        assert [o.ok for o in am._observations(am._load("t", app.id))] == [True]
    finally:
        am.stop()


def test_a_timeout_at_run_timeout_s_still_fails_the_configuration_in_its_session(tmp_path, monkeypatch):
    clock, limits = VirtualClock(1000.0), []
    am = _am(tmp_path, monkeypatch, _slow_app(clock, limits), clock)
    try:
        app = _submit(am)
        # The session's rules leave more than run_timeout_s: the run is the configuration's, and too slow.
        session, model = _session(am, app.id, max_runs=1, max_duration_s=1000, max_cost=100, run_timeout_s=40)
        assert limits == pytest.approx([40.0])
        assert (session.state, session.message) == (pb.ProfilingSession.STATE_DONE, "iterations")
        assert [r.error for r in model.runs] == ["timeout: cut at 40 s, this session's run_timeout_s; a later "
                                                 "session may run it again"]
        # The bound was this caller's (session 24's review: one too small ruled configurations out for good): a
        # later session, with its own bound, may run it again.
        assert am._observations(am._load("t", app.id)) == []
    finally:
        am.stop()


def test_a_duration_that_runs_out_while_the_profiler_chooses_starts_no_run(tmp_path, monkeypatch):
    clock, limits = VirtualClock(1000.0), []
    am = _am(tmp_path, monkeypatch, _slow_app(clock, limits), clock)
    chooser = svc.PROFILERS["uniform"]

    class SlowChooser(chooser):  # type: ignore[misc, valid-type]
        def propose(self, obs):  # noqa: ANN001, ANN202
            clock.advance(40.0)           # choosing takes 40 s of the session's 130
            return super().propose(obs)

    monkeypatch.setitem(svc.PROFILERS, "uniform", SlowChooser)
    try:
        app = _submit(am)
        session, model = _session(am, app.id, max_runs=5, max_duration_s=150)
        # 40 s choosing, a run of 100 (it had 110 left), 40 s choosing again: 10 s past the duration, the
        # second run never started (an agent takes a limit of 0 or less as none at all).
        assert limits == pytest.approx([110.0])
        assert (session.state, session.message) == (pb.ProfilingSession.STATE_DONE, "duration")
        assert len(model.runs) == 1 and session.runs == 1
    finally:
        am.stop()


# -- 3: an execution's limit when the request names none -------------------------------------------------------
def _predicted(am: svc.ApplicationManager, app_id: str, time_s: float) -> dict:
    """The model predicts `time_s` for the space's first configuration (and knows no other)."""
    loaded = am._load("t", app_id)
    config = loaded.space.configs[0]
    am._refresh_model(loaded, [{"config": config, "time_s": time_s, "cost": 1.0}])
    return config


def _frontier(am: svc.ApplicationManager, app_id: str) -> list[tuple[dict, float]]:
    model = am.GetModel(pb.GetModelRequest(tenant="t", application_id=app_id), _Ctx())
    return [(dict(p.configuration.values), p.execution_time_s) for p in model.frontier]


@pytest.mark.parametrize("predicted_s, limit_s", [
    (1000.0, 2000.0),                    # twice the model's time, above run_timeout_s
    (100.0, 600.0),                      # run_timeout_s, above twice the model's time
    (5 * 86400.0, 7 * 86400.0),          # twice the model's time, capped at MAX_RUN_TIMEOUT_S
])
def test_an_execution_with_no_timeout_may_take_twice_the_models_time(tmp_path, monkeypatch, predicted_s, limit_s):
    limits: list[float] = []

    def run(self, proposal, *, request_id="", timeout_s=0.0, cost_limit=0.0):  # noqa: ANN001, ANN202
        limits.append(timeout_s)
        return RunDetail(Observation(proposal.config, True, predicted_s, 1.0, proposal.input, 50.0, 50.0))

    am = _am(tmp_path, monkeypatch, run)
    try:
        app = _submit(am)
        _predicted(am, app.id, predicted_s)
        ex = am.ExecuteApplication(pb.ExecuteApplicationRequest(tenant="t", application_id=app.id,
                                                                slo_json=LOOSE_SLO), _Ctx())
        assert ex.state == pb.ApplicationExecution.STATE_SUCCEEDED
        # The caller's own bound stands as given.
        am.ExecuteApplication(pb.ExecuteApplicationRequest(tenant="t", application_id=app.id, slo_json=LOOSE_SLO,
                                                           timeout_s=7.0), _Ctx())
        assert limits == [limit_s, 7.0]
    finally:
        am.stop()


def test_a_timeout_at_the_limit_drawn_from_the_model_says_so_and_fails_the_configuration(tmp_path, monkeypatch):
    limits: list[float] = []

    def run(self, proposal, *, request_id="", timeout_s=0.0, cost_limit=0.0):  # noqa: ANN001, ANN202
        limits.append(timeout_s)
        return RunDetail(Observation(proposal.config, False, timeout_s, 1.0, proposal.input, error="timeout"))

    am = _am(tmp_path, monkeypatch, run)
    try:
        app = _submit(am)
        _predicted(am, app.id, 1000.0)
        assert len(_frontier(am, app.id)) == 1
        ex = am.ExecuteApplication(pb.ExecuteApplicationRequest(tenant="t", application_id=app.id,
                                                                slo_json=LOOSE_SLO), _Ctx())
        assert ex.state == pb.ApplicationExecution.STATE_FAILED
        assert ex.error.startswith("timeout: the run took longer than 2000 s") and "timeout_s" in ex.error, ex.error
        # It took more than twice the model's time: a failure of the configuration as measured, as in profiling.
        assert [o.ok for o in am._observations(am._load("t", app.id))] == [False]
        assert limits == [2000.0]
    finally:
        am.stop()


def _times_out(self, proposal, *, request_id="", timeout_s=0.0, cost_limit=0.0):  # noqa: ANN001, ANN202
    """A run killed at whatever limit it was given."""
    return RunDetail(Observation(proposal.config, False, timeout_s, 1.0, proposal.input, error="timeout"))


def test_a_timeout_at_the_callers_own_limit_keeps_the_configuration_on_the_frontier(tmp_path, monkeypatch):
    am = _am(tmp_path, monkeypatch, _times_out)
    try:
        app = _submit(am)
        _predicted(am, app.id, 1000.0)
        before = _frontier(am, app.id)
        ex = am.ExecuteApplication(pb.ExecuteApplicationRequest(tenant="t", application_id=app.id,
                                                                slo_json=LOOSE_SLO, timeout_s=10), _Ctx())
        assert ex.state == pb.ApplicationExecution.STATE_FAILED
        assert _frontier(am, app.id) == before and am._observations(am._load("t", app.id)) == []
    finally:
        am.stop()


def test_an_explored_configuration_that_times_out_at_run_timeout_s_fails_as_in_profiling(tmp_path, monkeypatch):
    am = _am(tmp_path, monkeypatch, _times_out)
    try:
        app = _submit(am)
        # Online, nothing known of it: no model's time to derive a limit from; run_timeout_s is its bound, as in
        # a profiling session, where a run too slow for it fails its configuration.
        ex = am.ExecuteApplication(pb.ExecuteApplicationRequest(tenant="t", application_id=app.id, online=True),
                                   _Ctx())
        assert (ex.state, ex.error) == (pb.ApplicationExecution.STATE_FAILED, "timeout")
        assert [o.ok for o in am._observations(am._load("t", app.id))] == [False]
    finally:
        am.stop()


# -- 1: max_long_calls ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("value", [0, -1, svc.MAX_LONG_CALLS + 1])
def test_max_long_calls_out_of_range_stops_the_service_at_start_up_naming_it(tmp_path, value):
    with pytest.raises(ValueError, match=rf"max_long_calls {value}: .*1 to {svc.MAX_LONG_CALLS}"):
        svc.ApplicationManager(svc.AppManagerConfig(state_dir=str(tmp_path), crs_address="127.0.0.1:1",
                                                    max_long_calls=value))


def test_max_long_calls_is_a_setting_and_sizes_the_servers_pool(tmp_path, monkeypatch):
    conf = cfg.load(svc.AppManagerConfig, "am", overrides={"max_long_calls": "40", "state_dir": str(tmp_path),
                                                           "crs_address": "127.0.0.1:1"},
                    environ={}, sections=config_sections())
    assert conf.max_long_calls == 40
    with pytest.raises(cfg.ConfigError, match="max_long_calls"):
        cfg.load(svc.AppManagerConfig, "am", overrides={"max_long_calls": "many"}, environ={})
    monkeypatch.setattr(svc.ApplicationManager, "_offered_types", lambda self: {"vm"})
    component = svc.component(conf)
    try:
        # A thread for every long call, and CONTROL_WORKERS more for the short ones.
        assert component.max_workers == 40 + svc.CONTROL_WORKERS
    finally:
        component.stop()


# -- 3, from the command line ----------------------------------------------------------------------------------------
def test_harness_app_execute_sends_its_timeout_and_says_the_default_rule(capsys):
    from services import server
    from tests.unit.test_cli_input_errors import FakeAm, app

    fake = FakeAm()
    running = server.start("127.0.0.1:0", [server.Component(
        name="fake-am", register=lambda s: pb_grpc.add_ApplicationManagerServicer_to_server(fake, s),
        service_names=["harness.v1.ApplicationManager"])])
    try:
        address = f"127.0.0.1:{running.port}"
        assert app("execute", "app-1", "--timeout", "1800", "--am", address) == 0
        assert app("execute", "app-1", "--am", address) == 0
        # None given: 0, the AM's rule (run_timeout_s, or twice the model's time when longer).
        assert [r.timeout_s for r in fake.executed] == [1800.0, 0.0]
    finally:
        running.stop(0)
    capsys.readouterr()
    with pytest.raises(SystemExit):
        app("execute", "--help")
    help_text = " ".join(capsys.readouterr().out.split())
    assert "run_timeout_s" in help_text and "twice the time the model gives" in help_text
