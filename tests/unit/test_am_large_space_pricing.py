"""Pricing a large search space, and a session's own run timeout (exploratory review of session 24).

A space of 200 000 configurations was quoted one configuration at a time before its first run (minutes, a warning
line each), and StopProfiling did not stop a session still pricing. A session's own `run_timeout_s` ruled the
configuration it cut out for every later session. In-process: the back-end's quotes and runs stood in for.
"""

from __future__ import annotations

import json
import logging
import math
import threading

import grpc
import numpy as np
import pytest

import examples
from application_manager import local
from application_manager.local import LocalBackend, RunDetail
from application_manager.manifest import parse_manifest
from application_manager.profilers.base import Observation
from application_manager.slo import parse_slo
from application_manager.space import from_manifest
from harness.v1 import application_manager_pb2 as pb
from harness.v1 import irm_pb2
from services.errors import FailedPrecondition, InvalidArgument
from tests.conftest import eventually
from tests.unit.test_am_stop import _am, _Ctx, _submit
from tests.unit.test_review15_prices_gaps import _Refused


def _backend(cancelled: threading.Event | None = None) -> LocalBackend:
    m = parse_manifest(examples.manifest("rtm"))
    slo = parse_slo(examples.slo("rtm", rows=400, steps=20), m)
    return LocalBackend("127.0.0.1:1", "t", m, from_manifest(m, slo.parameters, {"vm"}), slo.parameters, "/a",
                        "py", 30, cancelled=cancelled)


def test_at_most_max_quotes_requests_are_quoted_spread_over_the_space_with_one_warning(monkeypatch, caplog):
    b = _backend()
    n = len(b.space)
    monkeypatch.setattr(local, "MAX_QUOTES", 4)
    asked: list[int] = []

    def quote(self, config):  # noqa: ANN001, ANN202
        i = b.space.index(config)
        asked.append(i)
        if len(asked) % 2:
            raise _Refused(grpc.StatusCode.FAILED_PRECONDITION)
        return 60.0 * (i + 1)

    monkeypatch.setattr(LocalBackend, "quote_per_minute", quote)
    caplog.set_level(logging.INFO, logger="application_manager.local")
    prices = b.prices()
    assert n > 4 and len(asked) == 4 and asked == sorted(asked) and asked[-1] >= n // 2    # spread, not the first 4
    for k, i in enumerate(asked):
        assert prices[i] == (math.inf if k % 2 == 0 else i + 1)
    assert int(np.isnan(prices).sum()) == n - 4                                          # the others: gaps
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and warnings[0].refused == {"FAILED_PRECONDITION": 2}


def test_pricing_stops_asking_once_the_session_is_stopped(monkeypatch):
    stop = threading.Event()
    b = _backend(cancelled=stop)
    asked: list[int] = []

    def quote(self, config):  # noqa: ANN001, ANN202
        asked.append(1)
        if len(asked) == 3:
            stop.set()          # StopProfiling, while pricing
        return 60.0

    monkeypatch.setattr(LocalBackend, "quote_per_minute", quote)
    prices = b.prices()
    assert len(asked) == 3 and int(np.isfinite(prices).sum()) == 3 and len(b.space) > 3


def test_a_run_cut_by_the_sessions_own_run_timeout_is_run_again_by_a_later_session(tmp_path, monkeypatch):
    runs: list[tuple[int, float]] = []

    def run(self, p, *, request_id="", timeout_s=0.0, cost_limit=0.0):  # noqa: ANN001, ANN202
        runs.append((p.config, timeout_s))
        if timeout_s < 1.0:
            return RunDetail(Observation(p.config, False, timeout_s, 0.001, p.input, error="timeout: killed"))
        return RunDetail(Observation(p.config, True, 2.0, 0.01, p.input))

    am = _am(tmp_path, monkeypatch, run)
    try:
        app = _submit(am)
        n = len(am._load("t", app.id).space)

        def session(**kw) -> pb.ProfilingSession:  # noqa: ANN003
            events = list(am.StartProfiling(pb.StartProfilingRequest(tenant="t", application_id=app.id,
                                                                     profiler="uniform", **kw), _Ctx()))
            return events[-1].session

        session(max_runs=1, run_timeout_s=0.05)
        [(cut, _)] = runs
        model = am.GetModel(pb.GetModelRequest(tenant="t", application_id=app.id), _Ctx())
        [recorded] = model.runs
        assert not recorded.ok and "this session's run_timeout_s; a later session may run it" in recorded.error
        # A later session without the bound runs every configuration, the one cut short included.
        session(max_runs=n)
        assert sorted(c for c, _ in runs[1:]) == list(range(n)) and cut in [c for c, _ in runs[1:]]
        # Each run numbered within its session, from 1 (they were numbered after the earlier sessions' runs).
        model = am.GetModel(pb.GetModelRequest(tenant="t", application_id=app.id), _Ctx())
        by_session: dict[str, list[int]] = {}
        for r in model.runs:
            by_session.setdefault(r.session_id, []).append(r.ordinal)
        assert sorted(map(sorted, by_session.values())) == [[1], list(range(1, n + 1))]
    finally:
        am.stop()


def test_an_application_failing_everywhere_is_said_so_not_an_slo_out_of_reach(tmp_path, monkeypatch):
    def run(self, p, *, request_id="", timeout_s=0.0, cost_limit=0.0):  # noqa: ANN001, ANN202
        return RunDetail(Observation(p.config, False, 0.1, 0.001, p.input, error="exit code 127: app.py: not found"))

    am = _am(tmp_path, monkeypatch, run)
    try:
        app = _submit(am)
        n = len(am._load("t", app.id).space)
        list(am.StartProfiling(pb.StartProfilingRequest(tenant="t", application_id=app.id, profiler="uniform",
                                                        max_runs=n), _Ctx()))
        with pytest.raises(FailedPrecondition) as e:
            am.ExecuteApplication(pb.ExecuteApplicationRequest(tenant="t", application_id=app.id, online=True),
                                  _Ctx())
        assert "every run failed (the last: exit code 127: app.py: not found): fix the application" in e.value.message
        assert e.value.reason == "NO_MODEL"         # not SLO_UNATTAINABLE: relaxing the SLO would not help
    finally:
        am.stop()


@pytest.mark.parametrize("command,where", [([""], "Command[0]"), (["  ", "x"], "Command[0]"), ("''", "Command")])
def test_a_command_without_a_program_is_refused_at_submit(command, where):
    m = json.loads(examples.manifest("rtm"))
    m["Modules"][0]["Implementations"][0]["Command"] = command
    with pytest.raises(InvalidArgument) as e:
        parse_manifest(json.dumps(m))
    assert {v.field: v.description for v in e.value.violations}[
        f"manifest.Modules[0].Implementations[0].{where}"] == "the program to run: must not be empty or blank"


def test_an_execution_shows_its_reservation_while_it_runs(tmp_path, monkeypatch):
    checked = threading.Event()

    def run(self, p, *, request_id="", timeout_s=0.0, cost_limit=0.0):  # noqa: ANN001, ANN202
        self.on_reserved("crs-0123")
        assert checked.wait(10)
        return RunDetail(Observation(p.config, True, 1.0, 0.01, p.input), reservation_id="crs-0123")

    am = _am(tmp_path, monkeypatch, run)
    try:
        app = _submit(am)
        done: list[pb.ApplicationExecution] = []
        t = threading.Thread(target=lambda: done.append(am.ExecuteApplication(pb.ExecuteApplicationRequest(
            tenant="t", application_id=app.id, online=True), _Ctx())))
        t.start()

        def listed() -> list[pb.ApplicationExecution]:
            return list(am.ListExecutions(pb.ListExecutionsRequest(tenant="t", application_id=app.id),
                                          _Ctx()).executions)
        [running] = eventually(lambda: [e for e in listed() if e.reservation_id], what="the reservation shown")
        assert running.state == pb.ApplicationExecution.STATE_RUNNING and running.reservation_id == "crs-0123"
        checked.set()
        t.join(10)
        assert done[0].state == pb.ApplicationExecution.STATE_SUCCEEDED and done[0].reservation_id == "crs-0123"
    finally:
        checked.set()
        am.stop()


def test_a_sampled_pricing_is_kept_for_price_ttl_s_and_one_with_momentary_gaps_is_not(monkeypatch):
    # Session 24's diff review: the gaps a large space leaves on purpose made every session and execution ask the
    # same MAX_QUOTES quotes again (price_ttl_s did nothing).
    from application_manager.loaded import Loaded

    b = _backend()
    monkeypatch.setattr(local, "MAX_QUOTES", 4)
    asked: list[int] = []
    failing = {"now": False}

    def quote(self, config):  # noqa: ANN001, ANN202
        asked.append(1)
        if failing["now"]:
            raise _Refused(grpc.StatusCode.UNAVAILABLE)
        return 60.0

    monkeypatch.setattr(LocalBackend, "quote_per_minute", quote)
    kept = Loaded(None, None, None, b.space)  # type: ignore[arg-type]
    for t in (0.0, 1.0, 2.0):
        kept.prices_from(b, t, ttl_s=3600.0)
    assert len(asked) == 4                                  # asked once, kept within the TTL
    failing["now"] = True
    fresh = Loaded(None, None, None, b.space)  # type: ignore[arg-type]
    fresh.prices_from(b, 0.0, ttl_s=3600.0)
    fresh.prices_from(b, 1.0, ttl_s=3600.0)
    assert len(asked) == 4 + 8                              # the CRS could not quote: asked again


def test_a_run_cut_at_the_services_own_run_timeout_stays_its_configurations_failure(tmp_path, monkeypatch):
    # A session's run_timeout_s at the service's (or beyond) is no shorter bound of the caller's: a configuration
    # that hangs fails for every session, or each would run it again to the same end.
    def run(self, p, *, request_id="", timeout_s=0.0, cost_limit=0.0):  # noqa: ANN001, ANN202
        return RunDetail(Observation(p.config, False, timeout_s, 0.001, p.input, error="timeout: killed"))

    am = _am(tmp_path, monkeypatch, run)
    try:
        app = _submit(am)
        list(am.StartProfiling(pb.StartProfilingRequest(tenant="t", application_id=app.id, profiler="uniform",
                                                        max_runs=1, run_timeout_s=am.config.run_timeout_s), _Ctx()))
        [seen] = am._observations(am._load("t", app.id))
        assert not seen.ok and seen.error == "timeout: killed"
    finally:
        am.stop()


def test_the_backend_tells_the_reservation_once_it_is_made(unused_address):
    # The run's own path (the execution test above stands its run in): Reserve answered, then the agents.
    from application_manager.profilers.base import Proposal

    class Crs:
        def Reserve(self, request, timeout=None):  # noqa: N802, ANN001, ANN201
            return irm_pb2.Reservation(id="crs-9", state=irm_pb2.Reservation.STATE_ACTIVE, groups=[
                irm_pb2.AllocatedGroup(name=g.name, resource_type="vm", resources=[irm_pb2.AllocatedResource(
                    id=f"vm-{g.name}", address=unused_address())]) for g in request.groups])

        def ReleaseReservation(self, request, timeout=None):  # noqa: N802, ANN001, ANN201
            return irm_pb2.Reservation(id=request.reservation_id, state=irm_pb2.Reservation.STATE_RELEASED)

    b = _backend()
    b.crs = Crs()  # type: ignore[assignment]
    told: list[str] = []
    b.on_reserved = told.append
    detail = b.run(Proposal(0), timeout_s=5.0)
    assert told == ["crs-9"] and detail.reservation_id == "crs-9" and not detail.observation.ok
