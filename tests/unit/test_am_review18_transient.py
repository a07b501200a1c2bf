"""A profiling session rides out the CRS restarting (or a manager down, or no room for now): runs refused through
no fault of their configuration do not use up max_runs, the next run waits -- longer after each refusal in a row,
never less than the CRS asked for -- a session whose cloud stays away ends saying why, and a stop during the wait is
prompt.

The runner is driven with a clock that the waits advance; the service runs in-process on SQLite with the real
LocalBackend.run, the CRS and the agent stood in for at the gRPC edge (tests.unit.test_am_review18_releases).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import grpc
import numpy as np
import pytest

from application_manager import local
from application_manager import service as svc
from application_manager.profilers import PROFILERS
from application_manager.profilers.base import Observation, Proposal
from application_manager.runner import Patience, StopRules, profile
from application_manager.space import from_records
from harness.v1 import application_manager_pb2 as pb
from services import errors
from services.clock import VirtualClock
from tests.conftest import eventually
from tests.unit.test_am_review18_releases import _Crs, _Ctx, _RpcError, _submit, crs  # noqa: F401 - a fixture

DOWN = "the manager of 'vm' (compute) is down"


def _space():  # noqa: ANN202
    return from_records(["cores"], [{"cores": c} for c in range(1, 21)])


def _refused(p: Proposal, retry_after_s: float | None = None) -> Observation:
    return Observation(p.config, False, 0.0, 0.0, p.input, error=f"could not reserve: UNAVAILABLE: {DOWN}",
                       transient=True, retry_after_s=retry_after_s)


def _ok(p: Proposal) -> Observation:
    return Observation(p.config, True, 10.0, 1.0, p.input, 50.0, 50.0)


def _virtual_waits() -> tuple[VirtualClock, list[float], Callable[[float], bool]]:
    """A virtual clock, the waits asked for, and a `wait` that records each and moves the clock on by it."""
    clock = VirtualClock(0.0)
    waits: list[float] = []

    def wait(seconds: float) -> bool:
        waits.append(seconds)
        clock.advance(seconds)
        return False
    return clock, waits, wait


def test_refused_runs_do_not_use_up_the_runs_and_the_next_one_waits_longer_each_time():
    s = _space()
    clock, waits, wait = _virtual_waits()

    # Down for three runs (the third refusal asking for 10 s), up for one, down for one, up again.
    outcomes = iter([None, None, 10.0, "ok", None, "ok"])

    def execute(p: Proposal) -> Observation:
        o = next(outcomes)
        return _ok(p) if o == "ok" else _refused(p, o)

    prof = PROFILERS["uniform"](s, np.random.default_rng(0), max_runs=2)
    obs, why = profile(prof, execute, StopRules(max_runs=2), clock=clock, wait=wait,
                       patience=Patience(first_s=1.0, max_s=4.0, give_up_s=100.0))
    assert why == "iterations" and sum(o.ok for o in obs) == 2 and len(obs) == 6
    # 1, 2, then the CRS's 10 over the 4 of the back-off; after a measured run the back-off starts over.
    assert waits == [1.0, 2.0, 10.0, 1.0]


def test_a_cloud_that_stays_down_ends_the_session_once_its_patience_runs_out():
    s = _space()
    clock, waits, wait = _virtual_waits()

    prof = PROFILERS["uniform"](s, np.random.default_rng(0), max_runs=50)
    obs, why = profile(prof, _refused, StopRules(max_runs=50), clock=clock, wait=wait,
                       patience=Patience(first_s=1.0, max_s=8.0, give_up_s=20.0))
    # 1 + 2 + 4 + 8 = 15 s waited; another 8 would end past 20 s: the session ends instead of waiting it.
    assert why == "transient" and waits == [1.0, 2.0, 4.0, 8.0] and len(obs) == 5
    assert clock.now() == 15.0


def test_the_configuration_the_cloud_could_not_run_is_run_again_once_it_is_back():
    s = _space()
    outcomes = iter(["away", "away", "ok", "no room", "ok"])
    tried: list[int] = []

    def execute(p: Proposal) -> Observation:
        tried.append(p.config)
        o = next(outcomes)
        if o == "no room":
            return Observation(p.config, False, 0.0, 0.0, p.input, transient=True,
                               error="could not reserve: RESOURCE_EXHAUSTED: no host has room")
        return _ok(p) if o == "ok" else _refused(p)

    prof = PROFILERS["uniform"](s, np.random.default_rng(0), max_runs=2)
    obs, why = profile(prof, execute, StopRules(max_runs=2), again=local.cloud_away)
    assert why == "iterations" and [o.ok for o in obs] == [False, False, True, False, True]
    # The CRS away: the same configuration once it is back; no room for one: the profiler's next.
    assert tried[0] == tried[1] == tried[2] and tried[3] != tried[4]


def test_without_a_clock_the_refusals_in_a_row_are_capped():
    prof = PROFILERS["uniform"](_space(), np.random.default_rng(0), max_runs=50)
    obs, why = profile(prof, _refused, StopRules(max_runs=50), patience=Patience(max_in_row=4))
    assert why == "transient" and len(obs) == 4


def _refusing(crs: _Crs, times: int, retry_after_s: float) -> list[float]:  # noqa: F811
    """`crs` refuses its next `times` Reserves as a CRS whose manager is down does (MANAGER_DOWN, RetryInfo);
    returns the (monotonic) times of every Reserve."""
    at: list[float] = []
    reserve = crs.Reserve
    left = {"n": times}

    def refusing(req, timeout=None):  # noqa: ANN001, ANN202
        at.append(time.monotonic())
        if left["n"]:
            left["n"] -= 1
            raise _RpcError(grpc.StatusCode.UNAVAILABLE, DOWN,
                            errors.Unavailable(DOWN, reason=errors.MANAGER_DOWN, retry_after_s=retry_after_s))
        return reserve(req, timeout)
    crs.Reserve = refusing  # type: ignore[method-assign]
    return at


def _am(tmp_path, **settings) -> svc.ApplicationManager:  # noqa: ANN001
    return svc.ApplicationManager(svc.AppManagerConfig(state_dir=str(tmp_path), crs_address="127.0.0.1:1",
                                                       **settings))


def test_a_session_waits_out_a_crs_restart_and_makes_its_runs(crs, tmp_path):  # noqa: F811
    at = _refusing(crs, 3, retry_after_s=0.2)
    am = _am(tmp_path, transient_backoff_s=0.01)
    try:
        app = _submit(am)
        events = list(am.StartProfiling(pb.StartProfilingRequest(tenant="t", application_id=app.id,
                                                                 profiler="uniform", max_runs=2), _Ctx()))
        s = events[-1].session
        assert s.state == pb.ProfilingSession.STATE_DONE and s.message == "iterations", s.message
        runs = am.GetModel(pb.GetModelRequest(tenant="t", application_id=app.id), _Ctx()).runs
        assert [r.ok for r in runs] == [False, False, False, True, True]
        assert all(DOWN in r.error for r in runs[:3])
        # The configuration the outage kept from running was run once the CRS was back, not given up for this session.
        assert len({r.configuration.summary for r in runs[:4]}) == 1
        # Every retry waited what the CRS asked for (0.2 s), not the 0.01 s of the back-off.
        assert len(at) == 5 and all(b - a >= 0.2 for a, b in zip(at[:3], at[1:4], strict=True))
    finally:
        am.stop()


def test_a_session_whose_cloud_stays_down_ends_failed_saying_why(crs, tmp_path):  # noqa: F811
    _refusing(crs, 1000, retry_after_s=0.0)
    am = _am(tmp_path, transient_backoff_s=0.01, transient_backoff_max_s=0.02, transient_give_up_s=0.2)
    try:
        app = _submit(am)
        t0 = time.monotonic()
        events = list(am.StartProfiling(pb.StartProfilingRequest(tenant="t", application_id=app.id,
                                                                 profiler="uniform", max_runs=3), _Ctx()))
        s = events[-1].session
        assert time.monotonic() - t0 < 10.0
        assert s.state == pb.ProfilingSession.STATE_FAILED and s.message.startswith("transient:"), s.message
        assert DOWN in s.message and "0 run(s) were measured" in s.message
        runs = am.GetModel(pb.GetModelRequest(tenant="t", application_id=app.id), _Ctx()).runs
        assert len(runs) > 3 and not any(r.ok for r in runs)      # more than max_runs tries, none measured
    finally:
        am.stop()


def test_stopping_a_session_during_its_wait_is_prompt(crs, tmp_path):  # noqa: F811
    at = _refusing(crs, 1000, retry_after_s=60.0)
    am = _am(tmp_path)
    try:
        app = _submit(am)
        it = am.StartProfiling(pb.StartProfilingRequest(tenant="t", application_id=app.id, profiler="uniform",
                                                        max_runs=3), _Ctx())
        sid = next(it).session.id
        eventually(lambda: am.GetModel(pb.GetModelRequest(tenant="t", application_id=app.id), _Ctx()).runs,
                   what="the first refused run recorded")
        t0 = time.monotonic()
        s = am.StopProfiling(pb.StopProfilingRequest(tenant="t", session_id=sid), _Ctx())
        assert time.monotonic() - t0 < svc.STOP_ANSWER_S + 1.0
        assert s.state == pb.ProfilingSession.STATE_STOPPED, s.message
        assert len(at) == 1          # it waited, as the CRS asked, instead of trying again at once
        list(it)
    finally:
        am.stop()


@pytest.mark.parametrize("name", ["transient_backoff_s", "transient_backoff_max_s", "transient_give_up_s"])
def test_the_patience_settings_are_checked(tmp_path, name):
    with pytest.raises(ValueError, match=name):
        _am(tmp_path, **{name: -1.0})
    with pytest.raises(ValueError, match=name):
        _am(tmp_path, **{name: float("nan")})


def test_the_runs_refusals_carry_the_crs_retry_advice(crs, monkeypatch):  # noqa: F811
    from tests.unit.test_am_local import backend

    _refusing(crs, 1, retry_after_s=7.0)
    o = backend("rtm", rows=800, steps=40).run(Proposal(0)).observation
    assert o.transient and o.retry_after_s == 7.0 and DOWN in o.error
    assert local.transient_error(o.error)


@pytest.mark.parametrize("error", ["the run was lost: the agent's stream ended", "machine out of memory: killed"])
def test_a_run_that_started_and_was_lost_is_not_run_again_as_the_clouds_failure(error):
    # Its configuration may be why (it took the agent or the machine's memory down): the profiler's next instead.
    o = Observation({"x": 1}, False, 0.0, 0.0, "in", transient=True, error=error)
    assert not local.cloud_away(o)
    assert local.cloud_away(Observation({"x": 1}, False, 0.0, 0.0, "in", transient=True,
                                        error="could not run: UNAVAILABLE: the agent is restarting"))
