"""Profilers, Pareto selection, extrapolation fits, replay: small hand-checkable cases."""

from __future__ import annotations

import math
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from application_manager.model import Point, pareto, select
from application_manager.profilers import PROFILERS, History, Observation, Proposal, whitebox_hints
from application_manager.profilers.extrapolated import apply_curve, fit_curve
from application_manager.replay import Dataset, ReplayBackend
from application_manager.runner import StopRules, profile
from application_manager.slo import parse_slo
from application_manager.space import Dimension, Space, from_records
from services.errors import FailedPrecondition


def grid_space() -> Space:
    rows = [{"cores": c, "memory": m} for c in (1, 2, 4, 8) for m in (1, 2, 4, 8)]
    return from_records(["cores", "memory"], rows)


def synthetic(space: Space, i: int, size: float = 1.0) -> Observation:
    """time = size * 8 / cores; fails when memory < 2 * size; price = cores + memory."""
    c = space.configs[i]
    t = size * 8.0 / c["cores"]
    price = c["cores"] + c["memory"]
    ok = c["memory"] >= 2 * size
    cpu = 95.0 if c["cores"] <= 2 else 40.0
    mem = 100.0 if not ok else 100.0 * 2 * size / c["memory"]
    return Observation(i, ok, t, t * price, "production", cpu, mem, "" if ok else "memory limit exceeded")


def test_pareto_and_selection_under_slo():
    pts = [Point({"n": 1}, 10, 1.0), Point({"n": 2}, 5, 2.0), Point({"n": 3}, 6, 3.0),  # 3 dominated by 2
           Point({"n": 4}, 2, 5.0), Point({"n": 5}, 1, 9.0, ok=False)]
    front = pareto(pts)
    assert [p.config["n"] for p in front] == [4, 2, 1]
    deadline = parse_slo({"Objective": {"Constraints": ["%execution_time <= 6"], "Optimize": "%cost"}})
    assert select(front, deadline).config["n"] == 2
    budget = parse_slo({"Objective": {"Constraints": ["%cost <= 2.5"], "Optimize": "%execution_time"}})
    assert select(front, budget).config["n"] == 2
    assert select(front, parse_slo({"Objective": {"Optimize": "%cost"}})).config["n"] == 1
    with pytest.raises(FailedPrecondition) as e:
        select(front, parse_slo({"Objective": {"Constraints": ["%execution_time <= 1"]}}))
    assert "best achievable" in e.value.message and "2 s" in e.value.message


def test_whitebox_hints_follow_thresholds():
    s = grid_space()
    i = s.index({"cores": 1, "memory": 8})
    assert whitebox_hints(s, Observation(i, True, 1, 1, cpu_percent=95, memory_percent=20)) == {"cores": 1, "memory": -1}
    assert whitebox_hints(s, Observation(i, False, 1, 1, memory_percent=99, error="x")) == {"memory": 1}
    assert whitebox_hints(s, Observation(i, True, 1, 1, cpu_percent=75, memory_percent=75)) == {}


@pytest.mark.parametrize("name", sorted(PROFILERS))
def test_profilers_are_seeded_and_never_repeat(name):
    s = grid_space()

    def run(seed):
        cls = PROFILERS[name]
        p = cls(s, np.random.default_rng(seed), prices=np.array([c["cores"] + c["memory"] for c in s.configs], float),
                max_runs=8)
        obs, why = profile(p, lambda pr: synthetic(s, pr.config), StopRules(max_runs=8))
        return [o.config for o in obs], why

    a, why = run(1)
    assert a == run(1)[0]
    assert len(a) == len(set(a)) and 1 <= len(a) <= 8
    assert why in ("iterations", "exhausted")


def test_utilisation_driven_walks_towards_the_bottleneck():
    s = grid_space()
    p = PROFILERS["utilisation"](s, np.random.default_rng(0), max_runs=40)
    obs, why = profile(p, lambda pr: synthetic(s, pr.config), StopRules(max_runs=40))
    assert why == "exhausted" and len(obs) <= len(s)
    # Over-utilised CPU at 1-2 cores pushes cores up; memory headroom pulls memory down to what it needs.
    assert any(s.configs[o.config]["cores"] >= 4 for o in obs)


def test_stop_rules_budget_and_duration():
    s = grid_space()
    p = PROFILERS["uniform"](s, np.random.default_rng(0), max_runs=16)
    obs, why = profile(p, lambda pr: synthetic(s, pr.config), StopRules(max_runs=16, max_cost=30))
    assert why == "budget" and sum(o.cost for o in obs[:-1]) < 30 <= sum(o.cost for o in obs)
    # A later session with its own budget: the earlier runs teach the profiler but are not this budget's.
    more, why = profile(PROFILERS["uniform"](s, np.random.default_rng(1), max_runs=16),
                        lambda pr: synthetic(s, pr.config), StopRules(max_runs=16, max_cost=10), observed=obs)
    new = more[len(obs):]
    assert why == "budget" and new and sum(o.cost for o in new[:-1]) < 10 <= sum(o.cost for o in new)
    assert not {o.config for o in new} & {o.config for o in obs}       # it knew what had run

    class Tick:
        t = 0.0

        def now(self):
            self.t += 1.0
            return self.t

    obs, why = profile(PROFILERS["sa"](s, np.random.default_rng(0), max_runs=16),
                       lambda pr: synthetic(s, pr.config), StopRules(max_runs=16, max_duration_s=3), clock=Tick())
    assert why == "duration" and len(obs) == 2
    obs, why = profile(PROFILERS["sa"](s, np.random.default_rng(0)), lambda pr: synthetic(s, pr.config),
                       StopRules(max_runs=5), stopped=lambda: True)
    assert why == "stopped" and obs == []


def test_curve_families_pick_the_right_shape():
    # Five points: AICc compares two-parameter families from five points on (fewer: proportional alone).
    x = [1.0, 2.0, 3.0, 4.0, 5.0]
    lin = fit_curve(x, [1 + 2 * v for v in x])
    assert lin["family"] == "linear" and lin["r2"] == pytest.approx(1.0)
    assert apply_curve(lin, 10) == pytest.approx(21)
    pw = fit_curve(x, [3 * v ** 1.5 for v in x])
    # Within the benchmark times fitted (outside them a curve goes on proportionally: test_review16_am_fixes).
    assert pw["family"] == "power" and apply_curve(pw, 4.5) == pytest.approx(3 * 4.5 ** 1.5, rel=1e-6)
    assert fit_curve([2.0], [10.0])["params"] == [5.0]


def test_extrapolated_profiling_detects_the_memory_bottleneck():
    s = grid_space()
    p = PROFILERS["extrapolated"](s, np.random.default_rng(3), max_runs=20, has_benchmark=True,
                                  prices=np.array([c["cores"] + c["memory"] for c in s.configs], float))

    def run(pr: Proposal) -> Observation:
        o = synthetic(s, pr.config, 1.0 if pr.input == "benchmark" else 3.0)
        return Observation(o.config, o.ok, o.time_s, o.cost, pr.input, o.cpu_percent, o.memory_percent, o.error)

    obs, _ = profile(p, run, StopRules(max_runs=40))
    prod = [o for o in obs if o.input == "production"]
    assert any(o.input == "benchmark" for o in obs) and prod
    preds = p.predictions(obs)
    assert p.fit["family"] in ("proportional", "linear", "power") and p.fit["r2"] > 0.99
    # production time is exactly 3 x benchmark time: predictions match the truth.
    for c, t, _cost in preds:
        assert t == pytest.approx(3 * 8.0 / s.configs[c]["cores"], rel=1e-6)
    if any(o.memory_bottleneck for o in prod):
        assert p.constraints and p.constraints[0][0] == "memory"
        assert all(s.configs[c]["memory"] >= p.constraints[0][1] for c, _, _ in preds)


def test_extrapolated_learns_the_memory_bound_from_a_bigger_config_already_run():
    """The extrapolation tests may run the bigger-memory configurations on the production input
    before the small one fails (when the small one's benchmark was slow, so not the cheapest):
    the bottleneck's bound then comes from those runs, not from a retry that has nothing left."""
    s = from_records(["memory"], [{"memory": m} for m in (96, 512, 1024)])
    prices = np.array([1.0, 2.0, 3.0])
    p = PROFILERS["extrapolated"](s, np.random.default_rng(2), max_runs=9, has_benchmark=True, prices=prices)
    bench_time = {96: 10.0, 512: 1.0, 1024: 0.9}  # 96 MB: slow (swapping) and so the dearest

    def run(pr: Proposal) -> Observation:
        m = s.configs[pr.config]["memory"]
        if pr.input == "benchmark":
            t = bench_time[m]
            return Observation(pr.config, True, t, t * prices[pr.config], "benchmark", 50.0, 90.0)
        if m == 96:
            return Observation(pr.config, False, 1.0, prices[pr.config], "production", 50.0, 100.0,
                               "memory limit exceeded")
        t = 4 * bench_time[m]
        return Observation(pr.config, True, t, t * prices[pr.config], "production", 50.0, 60.0)

    obs, _ = profile(p, run, StopRules(max_runs=9))
    prod = [s.configs[o.config]["memory"] for o in obs if o.input == "production"]
    assert prod.index(96) > prod.index(512)  # the small one failed after the bigger ones ran
    assert p.constraints == [("memory", 512)]
    assert len(prod) == len(set(prod))  # nothing was run twice to learn it


def test_model_based_uses_prices_and_history():
    s = grid_space()
    prices = np.array([c["cores"] + c["memory"] for c in s.configs], float)
    truth = {i: synthetic(s, i) for i in range(len(s))}
    # History: two workloads with the same shape (times differ by a constant factor).
    lt = np.array([[math.log(truth[i].time_s * k) for i in range(len(s))] for k in (0.5, 2.0)])
    fl = np.array([[0.0 if truth[i].ok else 1.0 for i in range(len(s))] for _ in range(2)])
    warm = PROFILERS["bo"](s, np.random.default_rng(0), prices=prices, history=History(lt, fl), max_runs=3)
    first = warm.propose([]).config
    best = min((i for i in truth if truth[i].ok), key=lambda i: truth[i].cost)
    assert truth[first].cost == pytest.approx(truth[best].cost)
    cold = PROFILERS["bo"](s, np.random.default_rng(0), prices=prices, max_runs=3)
    assert prices[cold.propose([]).config] == prices.min()


def test_replay_dataset_merges_duplicates_and_replays(tmp_path):
    f = tmp_path / "d.csv"
    f.write_text("workload,runtime_s,cost,status,nodes,family\n"
                 "w1,10,1.0,ok,2,a\nw1,20,2.0,ok,2,a\nw1,5,1.0,oom,4,a\nw1,8,0.8,ok,4,b\n"
                 "w2,1,0.1,ok,2,a\n")
    d = Dataset.load(f)
    assert d.params == ["nodes", "family"] and d.workloads == ["w1", "w2"]
    r = d.run("w1", (2, "a"))
    assert (r.time_s, r.cost, r.ok) == (15, 1.5, True)
    assert d.run("w1", (4, "a")).error == "oom"
    b = ReplayBackend(d, "w1")
    assert len(b.space) == 3 and b.space.dim("family").categorical
    o = b.execute(Proposal(b.space.index({"nodes": 4, "family": "a"})))
    assert not o.ok and o.cost == 1.0
    assert d.prices(b.space)[b.space.index({"nodes": 2, "family": "a"})] == pytest.approx(0.1)
    h = d.history(b.space, ["w2"])
    assert np.isnan(h.log_time[0]).sum() == 2


def test_space_from_records_handles_not_applicable_values():
    s = from_records(["p", "a"], [{"p": "A", "a": 1}, {"p": "B", "a": None}])
    assert s.dim("a").values == (None, 1) and isinstance(s.dims[0], Dimension)


def test_bo_on_a_large_space_runs_in_bounded_memory():
    # 100 x 160 = 16,000 configurations (the space allows 200,000): the full pairwise distance tensors took
    # n^2 x features memory (8 GB here). Run in a child capped at 1.5 GB of address space, so a regression
    # fails this test instead of the machine.
    code = textwrap.dedent("""
        import json, resource
        resource.setrlimit(resource.RLIMIT_AS, (3 * 2**29, 3 * 2**29))
        import numpy as np
        from application_manager.manifest import parse_manifest
        from application_manager.profilers import PROFILERS, Observation
        from application_manager.space import from_manifest
        m = json.load(open("examples/rtm/manifest.json"))
        impl = m["Modules"][0]["Implementations"][0]
        impl["Resources"]["Groups"][0]["Attributes"] = {
            "Cores": {"Var": "%master_cores", "Range": [1, 100]},
            "Memory": {"Var": "%master_mem", "Range": [1024, 1183]}}
        impl["GlobalConstraints"] = []
        space = from_manifest(parse_manifest(m), {}, {"vm"})
        prof = PROFILERS["bo"](space, np.random.default_rng(0), max_runs=10)
        seen = []
        for i in range(4):
            c = prof.propose(seen).config
            seen.append(Observation(config=c, time_s=10.0 + i, cost=1.0, ok=True))
        print(len(space), len({o.config for o in seen}))
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                       cwd=Path(__file__).resolve().parents[2])
    assert r.returncode == 0, r.stderr[-600:]
    assert r.stdout.split() == ["16000", "4"]


def test_extrapolated_learns_no_bound_from_a_refused_production_run():
    # A production run the CRS refused (transient) says nothing of what the configuration lacks: no "retry with
    # the dimension at its maximum", no constraint.
    s = from_records(["memory"], [{"memory": m} for m in (96, 512, 1024)])
    prices = np.array([1.0, 2.0, 3.0])
    p = PROFILERS["extrapolated"](s, np.random.default_rng(2), max_runs=9, has_benchmark=True, prices=prices)
    reasons = []

    def run(pr: Proposal) -> Observation:
        reasons.append(pr.why)
        if pr.input == "benchmark":
            return Observation(pr.config, True, 1.0, prices[pr.config], "benchmark", 50.0, 50.0)
        return Observation(pr.config, False, 0.0, 0.0, "production", error="could not reserve: RESOURCE_EXHAUSTED",
                           transient=True)

    profile(p, run, StopRules(max_runs=9))
    assert p.constraints == [] and not [r for r in reasons if r.startswith("no bottleneck seen")], reasons


@pytest.mark.parametrize("name", ["sa", "directed-sa"])
def test_an_annealing_session_after_earlier_ones_starts_warm_from_their_best_point(name: str) -> None:
    # 30 runs of earlier sessions cooled the new one to ~1e-6 (a greedy walk that never takes a worse point).
    s = grid_space()
    earlier = [synthetic(s, i) for i in range(len(s))][:12]
    p = PROFILERS[name](s, np.random.default_rng(0), max_runs=10)
    proposal = p.propose(list(earlier))
    assert proposal is not None and proposal.config not in {o.config for o in earlier}
    assert p.temperature == 1.0                                   # this session's cooling starts now
    best = min((o for o in earlier if o.ok), key=lambda o: o.time_s * o.cost)
    assert p.current is not None and p.current.config == best.config
