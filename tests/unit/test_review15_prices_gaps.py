"""Prices with gaps: a configuration the CRS cannot quote now (NaN) costs the model-based search only that
configuration's price, not every price; one the CRS refuses for good (it never fits) is priced out (+inf): kept
with the application's prices, never proposed, never predicted."""

from __future__ import annotations

import json
import math

import grpc
import numpy as np
import pytest
from google.protobuf import any_pb2, duration_pb2
from google.rpc import error_details_pb2, status_pb2

import examples
from application_manager import service as svc
from application_manager.local import LocalBackend, RunDetail, never_quoted
from application_manager.manifest import parse_manifest
from application_manager.profilers import PROFILERS, Observation, Proposal
from application_manager.slo import parse_slo
from application_manager.space import from_manifest, from_records
from harness.v1 import application_manager_pb2 as pb
from services.clock import VirtualClock
from services.errors import FailedPrecondition


def grid():  # type: ignore[no-untyped-def]
    return from_records(["cores", "memory"], [{"cores": c, "memory": m} for c in (1, 2, 4, 8) for m in (1, 2, 4, 8)])


def drive(prof, space, limit: int = 100) -> list[int]:  # type: ignore[no-untyped-def]
    """Every configuration the profiler proposes until it stops; time = 8 / cores, all ok."""
    obs: list[Observation] = []
    for _ in range(limit):
        p = prof.propose(obs)
        if p is None:
            break
        t = 8.0 / space.configs[p.config]["cores"]
        obs.append(Observation(p.config, True, t, t, p.input))
    return [o.config for o in obs]


def test_one_unquoted_price_leaves_the_others_steering_the_search():
    s = grid()
    prices = np.array([20.0 - i for i in range(len(s))])    # the last configurations are the cheapest
    prices[15] = math.nan                                    # the cheapest could not be quoted
    bo = PROFILERS["bo"](s, np.random.default_rng(0), prices=prices, max_runs=5)
    blind = PROFILERS["bo"](s, np.random.default_rng(0), prices=np.full(len(s), math.nan), max_runs=5)
    # Nothing measured: the cheapest quoted configuration first (not the unquoted one, not the first one).
    assert bo.propose([]).config == 14
    assert blind.propose([]).config == 0
    # The unquoted price is no cheaper than any known one, but the configuration stays in the search.
    assert bo.logp[15] == pytest.approx(math.log(20.0))
    assert 15 in drive(bo, s)


def test_a_priced_out_configuration_is_never_proposed_and_the_session_says_why():
    s = grid()
    prices = np.array([1.0 + i for i in range(len(s))])
    prices[0] = math.inf       # the cheapest never fits
    prices[5] = math.nan       # another could not be quoted now
    bo = PROFILERS["bo"](s, np.random.default_rng(0), prices=prices, max_runs=20)
    assert bo.propose([]).config == 1      # still by price
    tried = drive(bo, s)
    assert sorted(tried) == [i for i in range(len(s)) if i != 0]
    assert bo.ended.startswith("the configuration not run never fits")


def test_extrapolation_predicts_no_priced_out_configuration():
    s = from_records(["memory"], [{"memory": m} for m in (1, 2, 3, 4)])
    prices = np.array([1.0, 2.0, 3.0, math.inf])
    p = PROFILERS["extrapolated"](s, np.random.default_rng(0), max_runs=9, has_benchmark=True, prices=prices)
    obs = [Observation(c, True, 10.0 / (c + 1), 1.0, "benchmark") for c in range(4)]
    obs += [Observation(c, True, 30.0 / (c + 1), 1.0, "production") for c in (0, 1)]
    assert [c for c, _, _ in p.predictions(obs)] == [2]


class _Refused(grpc.RpcError):
    def __init__(self, code: grpc.StatusCode, retry_s: float | None = None) -> None:
        self._code, self._retry = code, retry_s

    def code(self):  # noqa: ANN201
        return self._code

    def details(self):  # noqa: ANN201
        return "refused"

    def rich_status(self) -> status_pb2.Status:
        status = status_pb2.Status(code=self._code.value[0], message="refused")
        if self._retry is not None:
            detail = any_pb2.Any()
            detail.Pack(error_details_pb2.RetryInfo(retry_delay=duration_pb2.Duration(seconds=int(self._retry))))
            status.details.append(detail)
        return status


def test_only_refusals_for_good_price_a_configuration_out():
    c = grpc.StatusCode
    assert never_quoted(_Refused(c.FAILED_PRECONDITION)) and never_quoted(_Refused(c.INVALID_ARGUMENT))
    for code in (c.UNAVAILABLE, c.DEADLINE_EXCEEDED, c.RESOURCE_EXHAUSTED, c.ABORTED, c.INTERNAL, c.UNKNOWN):
        assert not never_quoted(_Refused(code)), code
    assert not never_quoted(_Refused(c.FAILED_PRECONDITION, retry_s=5))   # the CRS says waiting helps


def test_local_prices_price_out_what_never_fits_and_leave_momentary_gaps(monkeypatch):
    m = parse_manifest(examples.manifest("rtm"))
    slo = parse_slo(examples.slo("rtm", rows=400, steps=20), m)
    b = LocalBackend("127.0.0.1:1", "t", m, from_manifest(m, slo.parameters, {"vm"}), slo.parameters, "/a", "py", 30)

    def quote(self, config):  # noqa: ANN001, ANN202
        if config["%master_cores"] == 4:
            raise _Refused(grpc.StatusCode.FAILED_PRECONDITION)
        if config["%master_mem"] == 256:
            raise _Refused(grpc.StatusCode.UNAVAILABLE)
        return 60.0 * config["%master_cores"]

    monkeypatch.setattr(LocalBackend, "quote_per_minute", quote)
    prices = b.prices()
    for c, p in zip(b.space.configs, prices, strict=True):
        if c["%master_cores"] == 4:
            assert p == math.inf
        elif c["%master_mem"] == 256:
            assert math.isnan(p)
        else:
            assert p == c["%master_cores"]


class _Ctx:
    def is_active(self) -> bool:
        return True

    def add_callback(self, callback) -> bool:  # noqa: ANN001
        return True


def test_prices_with_a_configuration_that_never_fits_are_kept_and_it_is_never_run(tmp_path, monkeypatch):
    asked: list[int] = []
    tried: list[dict] = []

    def quote(self, config):  # noqa: ANN001, ANN202
        asked.append(1)
        if config["%master_cores"] == 4:
            raise _Refused(grpc.StatusCode.FAILED_PRECONDITION)
        return 60.0 * (config["%master_cores"] * 0.01 + config["%master_mem"] / 1024 * 0.01)

    def run(self, proposal: Proposal, *, request_id="", timeout_s=0.0, cost_limit=0.0):  # noqa: ANN001, ANN202
        c = self.space.configs[proposal.config]
        tried.append(c)
        t = 10.0 * (1.0 / c["%master_cores"] + 25.6 / c["%master_mem"])
        return RunDetail(Observation(proposal.config, True, t, t * 0.01, proposal.input, 50.0, 50.0))

    monkeypatch.setattr(svc.ApplicationManager, "_offered_types", lambda self: {"vm"})
    monkeypatch.setattr(LocalBackend, "quote_per_minute", quote)
    monkeypatch.setattr(LocalBackend, "run", run)
    am = svc.ApplicationManager(svc.AppManagerConfig(state_dir=str(tmp_path), crs_address="127.0.0.1:1"))
    try:
        app = am.SubmitApplication(pb.SubmitApplicationRequest(
            tenant="t", manifest_json=examples.manifest("rtm"), slo_json=examples.slo("rtm", rows=400, steps=20),
            app_dir="/x"), _Ctx())
        list(am.StartProfiling(pb.StartProfilingRequest(tenant="t", application_id=app.id, profiler="bo",
                                                        max_runs=20), _Ctx()))
        prices = am._loaded[app.id].prices
        assert prices is not None and np.isposinf(prices).sum() == 2     # kept: an answer, not a gap
        once = len(asked)
        list(am.StartProfiling(pb.StartProfilingRequest(tenant="t", application_id=app.id, profiler="bo",
                                                        max_runs=1), _Ctx()))
        am.GetModel(pb.GetModelRequest(tenant="t", application_id=app.id), _Ctx())
        assert len(asked) == once                                          # not quoted again
        assert tried and all(c["%master_cores"] != 4 for c in tried)
        assert len(tried) == 6                                             # everything else was run
        # Online exploration with nothing left but what never fits, under an SLO nothing run meets: it says so.
        unmet = json.loads(examples.slo("rtm", rows=400, steps=20))
        unmet["Objective"]["Constraints"] = ["%execution_time <= 0.001"]
        with pytest.raises(FailedPrecondition) as e:
            am.ExecuteApplication(pb.ExecuteApplicationRequest(tenant="t", application_id=app.id, online=True,
                                                               slo_json=json.dumps(unmet)),
                                  _Ctx())
        assert "the 2 configurations not run never fit" in str(e.value) and "none satisfies" in str(e.value)
    finally:
        am.stop()


def test_quotes_are_asked_again_after_price_ttl_s_so_a_configuration_priced_out_comes_back(tmp_path, monkeypatch):
    """A configuration that never fit (+inf) fits once hosts are added: after price_ttl_s the quotes are asked
    again, and the next session runs it (before, its +inf was kept until the AM restarted)."""
    small = {"cloud": True}
    asked: list[int] = []
    tried: list[int] = []

    def quote(self, config):  # noqa: ANN001, ANN202
        asked.append(1)
        if small["cloud"] and config["%master_cores"] == 4:
            raise _Refused(grpc.StatusCode.FAILED_PRECONDITION)
        return 60.0 * (config["%master_cores"] * 0.01 + config["%master_mem"] / 1024 * 0.01)

    def run(self, proposal: Proposal, *, request_id="", timeout_s=0.0, cost_limit=0.0):  # noqa: ANN001, ANN202
        c = self.space.configs[proposal.config]
        tried.append(c["%master_cores"])
        t = 10.0 * (1.0 / c["%master_cores"] + 25.6 / c["%master_mem"])
        return RunDetail(Observation(proposal.config, True, t, t * 0.01, proposal.input, 50.0, 50.0))

    monkeypatch.setattr(svc.ApplicationManager, "_offered_types", lambda self: {"vm"})
    monkeypatch.setattr(LocalBackend, "quote_per_minute", quote)
    monkeypatch.setattr(LocalBackend, "run", run)
    clock = VirtualClock(1000.0)
    am = svc.ApplicationManager(svc.AppManagerConfig(state_dir=str(tmp_path), crs_address="127.0.0.1:1",
                                                     price_ttl_s=300.0), clock=clock)
    try:
        app = am.SubmitApplication(pb.SubmitApplicationRequest(
            tenant="t", manifest_json=examples.manifest("rtm"), slo_json=examples.slo("rtm", rows=400, steps=20),
            app_dir="/x"), _Ctx())

        def session() -> None:
            list(am.StartProfiling(pb.StartProfilingRequest(tenant="t", application_id=app.id, profiler="bo",
                                                            max_runs=20), _Ctx()))

        session()
        assert 4 not in tried and np.isposinf(am._loaded[app.id].prices).sum() == 2
        small["cloud"] = False              # hosts with 4 cores were added
        once = len(asked)
        clock.advance(299.0)
        session()
        assert len(asked) == once and 4 not in tried        # within price_ttl_s: the kept quotes
        clock.advance(2.0)
        session()
        assert len(asked) > once                            # older than price_ttl_s: asked again
        assert np.isfinite(am._loaded[app.id].prices).all()
        assert 4 in tried                                   # and what fits now is run
    finally:
        am.stop()
