"""Review 16 of the Application Manager: bottleneck bounds that outlive their session, failures newer than the ok
runs of a configuration, exact whitebox steps, bounded extrapolation, input sizes by size, NaN-free frontiers and
datasets, small extrapolation budgets, a utilisation walk after hintless runs, warm starts without failed runs' times.
"""

from __future__ import annotations

import math
import warnings
from types import SimpleNamespace

import numpy as np
import pytest

from application_manager import service as svc
from application_manager.local import RunDetail
from application_manager.model import Point, pareto, select
from application_manager.profilers import PROFILERS, History, Observation, Proposal
from application_manager.profilers.base import BENCHMARK, PRODUCTION
from application_manager.profilers.extrapolated import apply_curve, fit_curve
from application_manager.replay import Dataset, DatasetError, ReplayBackend
from application_manager.runner import StopRules, profile
from application_manager.slo import parse_slo
from application_manager.space import from_records
from harness.v1 import application_manager_pb2 as pb
from tests.unit.test_am_transient import _am, _submit


class _Ctx:
    def is_active(self) -> bool:
        return True

    def add_callback(self, callback) -> bool:  # noqa: ANN001 - the RPC never ends in these tests
        return True


def _grid():  # noqa: ANN202
    return from_records(["cores", "memory"], [{"cores": c, "memory": m} for c in (1, 2, 4, 8) for m in (1, 2, 4, 8)])


def _prices(space) -> np.ndarray:  # noqa: ANN001
    return np.array([c["cores"] + c["memory"] for c in space.configs], float)


def _memory_hungry(space):  # noqa: ANN001, ANN202
    """time = size x 8 / cores; the run fails with memory at its limit when memory < 2 x size (production: 3x)."""
    prices = _prices(space)

    def run(pr: Proposal) -> Observation:
        c = space.configs[pr.config]
        size = 1.0 if pr.input == BENCHMARK else 3.0
        t, ok = size * 8.0 / c["cores"], c["memory"] >= 2 * size
        mem = 100.0 * 2 * size / c["memory"] if ok else 100.0
        return Observation(pr.config, ok, t, t * prices[pr.config], pr.input, 50.0, mem,
                           "" if ok else "memory limit exceeded")
    return run


# -- 1. memory bounds learned in one session hold in the next ------------------------------------------------------
def test_a_later_extrapolated_session_keeps_the_memory_bound_the_earlier_runs_show():
    s = _grid()
    run = _memory_hungry(s)
    first = PROFILERS["extrapolated"](s, np.random.default_rng(0), prices=_prices(s), max_runs=20, has_benchmark=True)
    earlier, _ = profile(first, run, StopRules(max_runs=20))
    assert first.constraints == [("memory", 8)]
    assert any(o.memory_bottleneck for o in earlier if o.input == PRODUCTION)
    # The service hands a later session the earlier runs, not the profiler that learned from them.
    later = PROFILERS["extrapolated"](s, np.random.default_rng(100), prices=_prices(s), max_runs=6,
                                      has_benchmark=True)
    obs, _ = profile(later, run, StopRules(max_runs=6), observed=earlier)
    assert later.constraints == [("memory", 8)]
    preds = later.predictions(obs)
    assert preds and all(s.configs[c]["memory"] >= 8 for c, _, _ in preds)
    assert all(s.configs[o.config]["memory"] >= 8 for o in obs[len(earlier):] if o.input == PRODUCTION)
    # The SLO's choice among measured and predicted points is a configuration that works on the production input.
    points = {o.config: Point(s.configs[o.config], o.time_s, o.cost, o.ok) for o in obs if o.input == PRODUCTION}
    for c, t, k in preds:
        points.setdefault(c, Point(s.configs[c], t, k, True, predicted=True))
    chosen = select(pareto(list(points.values())),
                    parse_slo({"Objective": {"Constraints": ["%execution_time <= 30"], "Optimize": "%cost"}}))
    assert run(Proposal(s.index(chosen.config))).ok


# -- 2. a failure newer than a configuration's ok runs takes it off the frontier -----------------------------------
def _measured_rtm(backend, proposal):  # noqa: ANN001, ANN202
    c = backend.space.configs[proposal.config]
    t = (1.0 if proposal.input == BENCHMARK else 10.0) * (1.0 / c["%master_cores"] + 25.6 / c["%master_mem"])
    price = c["%master_cores"] * 0.01 + c["%master_mem"] / 1024 * 0.01
    return RunDetail(Observation(proposal.config, True, t, t * price, proposal.input, 75.0, 75.0))


def test_an_execution_killed_at_the_limit_drawn_from_the_model_takes_its_configuration_off_the_frontier(
        tmp_path, monkeypatch):
    slow = {"on": False}

    def run(self, proposal, *, request_id="", timeout_s=0.0, cost_limit=0.0):  # noqa: ANN001, ANN202
        if slow["on"]:
            return RunDetail(Observation(proposal.config, False, timeout_s, 1.0, proposal.input, error="timeout"))
        return _measured_rtm(self, proposal)

    am = _am(tmp_path, monkeypatch, run)
    try:
        app = _submit(am)
        list(am.StartProfiling(pb.StartProfilingRequest(tenant="t", application_id=app.id, profiler="uniform",
                                                        max_runs=8, seed=1), _Ctx()))
        request = pb.ExecuteApplicationRequest(tenant="t", application_id=app.id)
        slow["on"] = True
        killed = am.ExecuteApplication(request, _Ctx())
        assert killed.state == pb.ApplicationExecution.STATE_FAILED and "the model's" in killed.error
        front = am.GetModel(pb.GetModelRequest(tenant="t", application_id=app.id), _Ctx()).frontier
        assert front and dict(killed.configuration.values) not in [dict(p.configuration.values) for p in front]
        slow["on"] = False
        assert dict(am.ExecuteApplication(request, _Ctx()).configuration.values) != dict(killed.configuration.values)
    finally:
        am.stop()


def test_the_newest_measured_run_of_a_configuration_decides_whether_it_is_ok():
    def points(*runs):  # noqa: ANN002, ANN202 - (config, ok, time) in the order they were recorded
        rows = [SimpleNamespace(config={"c": c}, ok=ok, time_s=t, cost=t) for c, ok, t in runs]
        session = SimpleNamespace(scalars=lambda query: rows)
        front = pareto(svc.ApplicationManager._points(session, SimpleNamespace(app=SimpleNamespace(id="a")), []))
        return [(p.config["c"], p.time_s) for p in front]

    # A crash after an ok run fails the configuration as a timeout does ...
    assert points((1, True, 10.0), (2, True, 20.0), (1, False, 2.0)) == [(2, 20.0)]
    # ... and an ok run after the failure brings it back, at the mean of its ok runs.
    assert points((1, True, 10.0), (1, False, 2.0), (1, True, 14.0)) == [(1, 12.0)]


# -- 3. the utilisation-driven walk steps to exactly the neighbour a hint names ------------------------------------
def test_a_step_to_a_neighbour_already_seen_is_no_step_to_another_configuration():
    s = _grid()
    at = s.index({"cores": 2, "memory": 4})
    assert s.configs[s.step(at, "cores", +1)] == {"cores": 4, "memory": 4}
    assert s.step(at, "cores", +1, exclude={s.index({"cores": 4, "memory": 4})}) is None
    # Left out of the space (a GlobalConstraint), the neighbour gives way to the nearest with that value.
    holed = from_records(["cores", "memory"], [c for c in s.configs if c != {"cores": 4, "memory": 4}])
    j = holed.step(holed.index({"cores": 2, "memory": 4}), "cores", +1)
    assert holed.configs[j]["cores"] == 4 and holed.configs[j]["memory"] in (2, 8)


def test_the_utilisation_driven_walk_only_moves_as_its_hints_say():
    s = _grid()

    # CPU always over-used and memory under-used: every hint says more cores, less memory.
    def run(pr: Proposal) -> Observation:
        return Observation(pr.config, True, 10.0 / s.configs[pr.config]["cores"], 1.0, pr.input, 95.0, 50.0)

    for seed in range(4):
        obs, why = profile(PROFILERS["utilisation"](s, np.random.default_rng(seed), max_runs=30), run,
                           StopRules(max_runs=30))
        start = s.configs[obs[0].config]
        assert why == "exhausted"
        for o in obs[1:]:
            c = s.configs[o.config]
            assert c["cores"] >= start["cores"] and c["memory"] <= start["memory"], (seed, start, c)


# -- 4. extrapolation stays bounded outside the benchmark times it was fitted on ------------------------------------
def test_a_curve_goes_on_proportionally_outside_the_benchmark_times_it_was_fitted_on():
    fit = {"family": "exponential", "params": [2.0, 0.5], "range": [2.0, 4.0]}
    assert apply_curve(fit, 3.0) == pytest.approx(2.0 * math.exp(1.5))
    assert apply_curve(fit, 40.0) == pytest.approx(2.0 * math.exp(2.0) * 40.0 / 4.0)
    assert apply_curve(fit, 1.0) == pytest.approx(2.0 * math.exp(1.0) * 1.0 / 2.0)
    assert fit_curve([1.0, 2.0, 3.0, 4.0, 5.0], [3.0 * v ** 1.5 for v in (1, 2, 3, 4, 5)])["range"] == [1.0, 5.0]


def test_noisy_proportional_timings_extrapolate_to_a_far_configuration_within_bounds():
    # Production time 4 x benchmark time with 5% noise, fitted on benchmark times of 10-25 s, predicted at 110 s:
    # an exponential or power curve chosen on an AICc lower by less than 2 predicted up to 26x the time.
    rng = np.random.default_rng(7)
    ratios, families = [], set()
    for _ in range(300):
        x = np.sort(rng.uniform(10.0, 25.0, 6))
        f = fit_curve(list(x), list(4 * x * (1 + rng.normal(0, 0.05, 6))))
        families.add(f["family"])
        ratios.append(apply_curve(f, 110.0) / 440.0)
    assert max(ratios) < 1.3 and min(ratios) > 0.75, (min(ratios), max(ratios), families)


def test_a_curved_family_needs_an_aicc_lower_by_2_to_replace_the_proportional_curve():
    # Production ~ 4 x benchmark with 5% noise, on which an exponential curve's AICc is ~1 lower than the
    # proportional one's: too little to tell them apart, so the simpler stays.
    x = [13.7, 16.4, 19.4, 20.0, 20.6, 23.2]
    f = fit_curve(x, [57.7, 67.3, 78.3, 80.2, 84.4, 97.3])
    assert f["family"] == "proportional" and f["params"][0] == pytest.approx(4.1, abs=0.1)


# -- 5. input sizes: the largest is the production input -------------------------------------------------------------
def _sized(sizes: dict[str, float]) -> Dataset:
    raw = [{"workload": "w", "runtime_s": str(t / x), "cost": "1", "input_size": size, "x": str(x)}
           for size, t in sizes.items() for x in (1, 2)]
    return Dataset.from_records(raw, "t", ["workload", "runtime_s", "cost", "input_size", "x"])


def test_text_input_sizes_are_ordered_by_size_not_alphabetically():
    by_runtime = _sized({"small": 10, "medium": 50, "large": 100})
    assert by_runtime.input_sizes("w") == ["small", "medium", "large"]
    b = ReplayBackend(by_runtime, "w")
    assert (b.benchmark, b.production) == ("small", "large")
    # With a unit, by the amount: runtimes that say otherwise do not matter.
    assert _sized({"10GB": 1, "2GB": 50, "512 MB": 100, "5G": 7}).input_sizes("w") == ["512 MB", "2GB", "5G", "10GB"]
    assert _sized({"10": 1, "9": 2}).input_sizes("w") == [9, 10]


# -- 6. NaN stays out of the frontier and of datasets ----------------------------------------------------------------
def test_the_frontier_takes_only_finite_points_whatever_their_order():
    a, b, c = Point({"n": 1}, 1.0, 10.0), Point({"n": 2}, math.nan, 1.0), Point({"n": 3}, 2.0, 5.0)
    d = Point({"n": 4}, 3.0, math.inf)
    for pts in ([a, b, c, d], [a, c, b, d], [b, d, c, a]):
        assert [p.config["n"] for p in pareto(pts)] == [1, 3]


@pytest.mark.parametrize(("runtime", "cost"), [("nan", "1"), ("inf", "1"), ("5", "NaN"), ("5", "-inf")])
def test_a_dataset_refuses_a_non_finite_runtime_or_cost_naming_the_row(runtime, cost):
    raw = [{"workload": "w", "runtime_s": "5", "cost": "1", "x": "1"},
           {"workload": "w", "runtime_s": runtime, "cost": cost, "x": "2"}]
    with pytest.raises(DatasetError, match=r"^runs\.csv:3: runtime_s and cost must be finite"):
        Dataset.from_records(raw, "runs.csv")


# -- 7. any budget makes runs; one too small to extrapolate says so -------------------------------------------------
@pytest.mark.parametrize("budget", [1, 2, 3, 4])
def test_extrapolated_profiling_makes_runs_on_any_budget(budget):
    s = _grid()

    def run(pr: Proposal) -> Observation:
        t = 10.0 / s.configs[pr.config]["cores"] * (3 if pr.input == PRODUCTION else 1)
        return Observation(pr.config, True, t, 1.0, pr.input, 50.0, 50.0)

    p = PROFILERS["extrapolated"](s, np.random.default_rng(0), max_runs=budget, has_benchmark=True)
    obs, _ = profile(p, run, StopRules(max_runs=budget))
    assert len(obs) == budget and any(o.input == PRODUCTION for o in obs)
    if budget < 3:
        assert all(o.input == PRODUCTION for o in obs) and "too few to extrapolate" in p.note
    else:
        assert p.note == "" and p.predictions(obs)     # something beyond the production runs themselves


def test_a_session_too_small_to_extrapolate_ends_saying_so(tmp_path, monkeypatch):
    am = _am(tmp_path, monkeypatch, lambda self, proposal, **kw: _measured_rtm(self, proposal))
    try:
        app = _submit(am)
        events = list(am.StartProfiling(pb.StartProfilingRequest(
            tenant="t", application_id=app.id, profiler="extrapolated", max_runs=2), _Ctx()))
        session = events[-1].session
        assert (session.state, session.runs) == (pb.ProfilingSession.STATE_DONE, 2)
        assert session.message.startswith("iterations; 2 run(s) are too few to extrapolate"), session.message
    finally:
        am.stop()


# -- 8. a utilisation-driven session after hintless runs still runs ------------------------------------------------
def test_a_utilisation_driven_session_after_runs_with_no_hint_starts_at_random():
    s = _grid()
    earlier = [Observation(3, True, 10.0, 1.0, PRODUCTION, 75.0, 75.0)]     # neither over- nor under-used
    p = PROFILERS["utilisation"](s, np.random.default_rng(0), max_runs=10)
    first = p.propose(list(earlier))
    assert first is not None and first.why == "random start" and first.config != 3


# -- 9. warm starts: failed runs' times are no runtimes -------------------------------------------------------------
def test_a_history_workload_known_only_by_its_failures_adds_no_nan_to_the_prior():
    s = _grid()
    known = np.array([[math.log(8.0 / c["cores"]) for c in s.configs]])
    lt = np.vstack([known, np.full((1, len(s)), np.nan)])
    fl = np.vstack([np.zeros((1, len(s))), np.ones((1, len(s)))])
    bo = PROFILERS["bo"](s, np.random.default_rng(0), prices=_prices(s), history=History(lt, fl), max_runs=5)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)      # "Mean of empty slice": the row's offset was NaN
        for ok in ({}, {0: math.log(8.0)}):
            mu, pf = bo.prior(ok, set())
            assert np.isfinite(mu).all() and np.isfinite(pf).all()
