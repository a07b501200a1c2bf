"""Failures that are not the configuration's doing (the CRS full or away, the run lost, the caller's own timeout)
are recorded but never measurements: the frontier keeps what they would hide and a later session tries them again.
Prices from a round of CRS quotes that failed are not kept."""

from __future__ import annotations

import json

import grpc
import numpy as np
import pytest

import examples
from application_manager import service as svc
from application_manager.local import LocalBackend, RunDetail, transient_error
from application_manager.profilers import PROFILERS
from application_manager.profilers.base import BENCHMARK, Observation
from harness.v1 import application_manager_pb2 as pb


class _Ctx:
    def is_active(self) -> bool:
        return True

    def add_callback(self, callback) -> bool:  # noqa: ANN001
        return True


def _measured(backend, proposal):  # noqa: ANN001, ANN202
    c = backend.space.configs[proposal.config]
    t = (1.0 if proposal.input == BENCHMARK else 10.0) * (1.0 / c["%master_cores"] + 25.6 / c["%master_mem"])
    price = c["%master_cores"] * 0.01 + c["%master_mem"] / 1024 * 0.01
    return RunDetail(Observation(proposal.config, True, t, t * price, proposal.input, 50.0, 50.0))


def _am(tmp_path, monkeypatch, run, prices=True) -> svc.ApplicationManager:  # noqa: ANN001
    monkeypatch.setattr(svc.ApplicationManager, "_offered_types", lambda self: {"vm"})
    if prices:
        monkeypatch.setattr(LocalBackend, "prices", lambda self: np.array(
            [c["%master_cores"] * 0.01 + c["%master_mem"] / 1024 * 0.01 for c in self.space.configs]))
    monkeypatch.setattr(LocalBackend, "run", run)
    return svc.ApplicationManager(svc.AppManagerConfig(state_dir=str(tmp_path), crs_address="127.0.0.1:1"))


def _submit(am: svc.ApplicationManager) -> pb.Application:
    return am.SubmitApplication(pb.SubmitApplicationRequest(
        tenant="t", manifest_json=examples.manifest("rtm"), slo_json=examples.slo("rtm", rows=400, steps=20),
        app_dir="/x"), _Ctx())


@pytest.mark.parametrize("flagged", [True, False])   # set by LocalBackend.run, or only said by the error
def test_a_momentary_capacity_refusal_leaves_the_configurations_in_the_search(tmp_path, monkeypatch, flagged):
    full = {"on": True}
    tried: list[int] = []

    def run(self, proposal, *, request_id="", timeout_s=0.0, cost_limit=0.0):  # noqa: ANN001, ANN202
        tried.append(proposal.config)
        if full["on"] and self.space.configs[proposal.config]["%master_cores"] == 4:
            return RunDetail(Observation(proposal.config, False, 0.0, 0.0, proposal.input, transient=flagged,
                                         error="could not reserve: RESOURCE_EXHAUSTED: no host has room"))
        return _measured(self, proposal)

    am = _am(tmp_path, monkeypatch, run)
    try:
        app = _submit(am)
        loaded = am._load("t", app.id)
        four = {i for i, c in enumerate(loaded.space.configs) if c["%master_cores"] == 4}
        list(am.StartProfiling(pb.StartProfilingRequest(tenant="t", application_id=app.id, profiler="uniform",
                                                        max_runs=8, seed=1), _Ctx()))
        refused = [r for r in am.GetModel(pb.GetModelRequest(tenant="t", application_id=app.id), _Ctx()).runs
                   if not r.ok]
        assert refused and all("RESOURCE_EXHAUSTED" in r.error for r in refused)    # recorded for audit
        full["on"] = False
        tried.clear()
        list(am.StartProfiling(pb.StartProfilingRequest(tenant="t", application_id=app.id, profiler="bo",
                                                        max_runs=5), _Ctx()))
        assert four & set(tried), "the later session never tried the configurations the CRS had refused"
        slo = json.dumps({"Objective": {"Constraints": ["%execution_time <= 4"]}})
        ex = am.ExecuteApplication(pb.ExecuteApplicationRequest(tenant="t", application_id=app.id, slo_json=slo),
                                   _Ctx())
        assert ex.configuration.values["%master_cores"] == "4"
    finally:
        am.stop()


def test_a_timeout_the_caller_chose_is_not_a_failure_of_the_configuration(tmp_path, monkeypatch):
    def run(self, proposal, *, request_id="", timeout_s=0.0, cost_limit=0.0):  # noqa: ANN001, ANN202
        if timeout_s == 1.0:
            return RunDetail(Observation(proposal.config, False, 1.0, 0.01, proposal.input, error="timeout"))
        return _measured(self, proposal)

    am = _am(tmp_path, monkeypatch, run)
    try:
        app = _submit(am)
        # Online: nothing profiled yet, so the configuration explored has no other measurement.
        ex = am.ExecuteApplication(pb.ExecuteApplicationRequest(tenant="t", application_id=app.id, timeout_s=1.0,
                                                                online=True), _Ctx())
        assert ex.state == pb.ApplicationExecution.STATE_FAILED and ex.error == "timeout"
        model = am.GetModel(pb.GetModelRequest(tenant="t", application_id=app.id), _Ctx())
        assert [r.error for r in model.runs] == ["timeout"]               # kept for audit ...
        assert am._observations(am._load("t", app.id)) == []              # ... but no failure of the configuration
        # Without a bound of the caller's, the run is measured (and joins the model).
        ex = am.ExecuteApplication(pb.ExecuteApplicationRequest(tenant="t", application_id=app.id, online=True),
                                   _Ctx())
        assert ex.state == pb.ApplicationExecution.STATE_SUCCEEDED
        assert len(am._observations(am._load("t", app.id))) == 1
    finally:
        am.stop()


def test_only_runs_that_failed_through_no_fault_of_the_configuration_are_transient():
    assert transient_error("could not reserve: RESOURCE_EXHAUSTED: no host has room")
    assert transient_error("could not reserve: UNAVAILABLE: it would fit on a down manager's hosts")
    assert transient_error("the run was lost: the agent's stream ended without an exit status")
    assert transient_error("the run was lost: UNAVAILABLE: Socket closed")
    assert not transient_error("could not reserve: FAILED_PRECONDITION: never fits")
    assert not transient_error("could not reserve: INVALID_ARGUMENT: cores")
    assert not transient_error("exit code 1: Traceback")
    assert not transient_error("memory limit")


def test_profilers_do_not_learn_from_transient_runs(tmp_path, monkeypatch):
    am = _am(tmp_path, monkeypatch, lambda *a, **k: None)
    try:
        space = am._load("t", _submit(am).id).space
    finally:
        am.stop()
    refused = Observation(0, False, 0.0, 0.0, transient=True, error="could not reserve: RESOURCE_EXHAUSTED: full",
                          memory_percent=None)
    # A utilisation walk whose first step was refused starts again instead of ending with no hint.
    wb = PROFILERS["utilisation"](space, np.random.default_rng(0), prices=np.ones(len(space)), max_runs=10)
    nxt = wb.propose([refused])
    assert nxt is not None and nxt.config != 0
    # Simulated annealing never walks from a configuration it could not measure.
    sa = PROFILERS["sa"](space, np.random.default_rng(0), prices=np.ones(len(space)), max_runs=10)
    sa.propose([refused])
    assert sa.current is None
    # BO: not retried in the session that was refused, but not scored as a failed configuration either.
    bo = PROFILERS["bo"](space, np.random.default_rng(0), prices=np.ones(len(space)), max_runs=10)
    assert bo.propose([refused]).config != 0
    assert not refused.memory_bottleneck


def test_prices_from_failed_quotes_are_asked_again(tmp_path, monkeypatch):
    class Down(grpc.RpcError):
        def code(self):  # noqa: ANN202
            return grpc.StatusCode.UNAVAILABLE

    state = {"down": True, "asked": 0}

    def quote(self, config):  # noqa: ANN001, ANN202
        state["asked"] += 1
        if state["down"]:
            raise Down()
        return 60.0 * config["%master_cores"] * 0.01

    monkeypatch.setattr(LocalBackend, "quote_per_minute", quote)
    am = _am(tmp_path, monkeypatch, lambda self, p, **kw: _measured(self, p), prices=False)
    try:
        app = _submit(am)
        for _ in range(2):
            list(am.StartProfiling(pb.StartProfilingRequest(tenant="t", application_id=app.id, profiler="bo",
                                                            max_runs=1), _Ctx()))
            state["down"] = False
        prices = am._loaded[app.id].prices
        assert prices is not None and np.isfinite(prices).all()
        asked = state["asked"]
        list(am.StartProfiling(pb.StartProfilingRequest(tenant="t", application_id=app.id, profiler="bo",
                                                        max_runs=1), _Ctx()))
        assert state["asked"] == asked       # a complete set of quotes is kept
    finally:
        am.stop()
