import pytest

from irm_fpga.qos import get_policy
from irm_fpga.qos.hydrogen import (
    COMPLETION_TIME,
    FAIRNESS,
    PAPER_ALGORITHMS,
    PRESERVE,
    SCALE_DOWN,
    SCALE_UP,
    HJob,
    LearnedCostModel,
    elasticity_decide,
    elasticity_from_jlos,
    fcfs_amap,
    fcfs_max,
    fcfs_min,
    forecast_arrivals,
    jlo_metric,
    late_weight,
    linear_cost,
    managed,
    managed_schedule,
    priority,
    project,
    resize_pool,
    schedule_jlos,
    sjtf,
)
from irm_fpga.qos.sim import JobType, Scenario, arrivals, check_schedule, run_hydrogen

# Seed 001 Table III: (paths 1e6, target s, expected s, pool, decision); expected from Table II.
TABLE3 = [(1, 5, 5.91, 1, SCALE_UP), (1, 5, 2.96, 2, PRESERVE), (2, 5.5, 5.89, 2, SCALE_UP),
          (2, 5.5, 3.93, 3, PRESERVE), (3, 9, 17.71, 3, SCALE_UP), (3, 9, 8.86, 4, PRESERVE),
          (2, 5.5, 2.95, 4, SCALE_DOWN), (2, 5.5, 3.93, 3, PRESERVE), (1, 5, 1.97, 3, SCALE_DOWN),
          (1, 5, 2.96, 2, PRESERVE)]
ONE_FPGA = {1: 5.91, 2: 11.78, 3: 17.71}


def test_table3_decisions_and_pool_sequence_with_beta_2_5():
    pool = 1
    for paths, target, expected, table_pool, decision in TABLE3:
        job = HJob(f"p{paths}", 0.0, ONE_FPGA[paths], 1, 4, target=target)
        devices = round(ONE_FPGA[paths] / expected)
        d = elasticity_decide([(job, devices)], beta=2.5)
        assert pool == table_pool
        assert d.decision == decision
        assert d.jlo_pos + d.jlo_neg == pytest.approx(target - expected, abs=0.01)
        pool = resize_pool(pool, d.decision, 1, 4)


def test_jlo_aggregate_and_pool_bounds():
    assert jlo_metric([2.0, 1.0], 2.5) == 0.0          # as written it never exceeds the negative sum
    assert jlo_metric([2.0, -0.4], 2.5) == pytest.approx(-0.4)
    assert resize_pool(4, SCALE_UP, 1, 4) == 4 and resize_pool(1, SCALE_DOWN, 1, 4) == 1


def q():
    return [HJob("a", 0.0, 8.0, 1, 4), HJob("b", 1.0, 2.0, 2, 3), HJob("c", 2.0, 1.0, 1, 1)]


def test_fcfs_variants_on_a_hand_case():
    assert fcfs_max(q(), 4, 30) == [("a", 4)]
    assert fcfs_max(q(), 3, 30) == [("b", 3)]           # a does not fit at its max; b does
    assert fcfs_min(q(), 4, 30) == [("a", 1), ("b", 2), ("c", 1)]
    assert fcfs_amap(q(), 4, 30) == [("a", 4)]
    assert fcfs_amap(q(), 6, 30) == [("a", 4), ("b", 2)]
    assert fcfs_min(q(), 4, 1) == [("a", 1)]            # the window bounds the decision


def test_sjtf_and_priority_stop_at_first_job_that_does_not_fit():
    assert sjtf(q(), 4, 30) == [("b", 2), ("c", 1), ("a", 1)]   # costs at min: b 2/2=1 (earlier), c 1, a 8
    assert sjtf(q(), 1, 30) == []                                # b needs 2: stop, c is not tried
    jobs = [HJob("lo", 0.0, 1.0, 1, 1, priority=1), HJob("hi", 1.0, 1.0, 3, 3, priority=5)]
    assert priority(jobs, 4, 30) == [("hi", 3), ("lo", 1)]
    assert priority(jobs, 2, 30) == []



def test_the_learned_model_of_one_tenant_is_not_taught_by_another():
    # A live action is whatever its tenant sends: bob sending his size in empty tasks (runs of ~0 s) must not make
    # alice's jobs of the design look instant to the scheduler.
    alice = HJob("a", 0.0, 100.0, 1, 4, actions=100, design="sleep", tenant="alice")
    bob = HJob("b", 0.0, 100.0, 1, 4, actions=100, design="sleep", tenant="bob")
    m = LearnedCostModel()
    for r in (1, 2):
        m.observe(alice, r, 100.0 * (0.2 + 0.8 / r))
    before = m(alice, 2)
    for r in (1, 2):
        m.observe(bob, r, 1e-6)
    assert m(alice, 2) == pytest.approx(before) == pytest.approx(60.0)
    assert m(bob, 2) < 1e-3 and m.observed("sleep", "bob") and not m.observed("sleep")

def test_linear_and_learned_cost():
    j = HJob("a", 0.0, 12.0, 1, 4)
    assert linear_cost(j, 4) == 3.0
    m = LearnedCostModel()
    m.observe(j, 1, 12.0)
    assert m(j, 4) == 3.0                       # one size seen: eq. 1
    for r in (1, 2, 4):                         # t = 12 * (0.2 + 0.8 / r)
        m.observe(j, r, 12.0 * (0.2 + 0.8 / r))
    a, b = m.coefficients(j.design)
    assert a == pytest.approx(0.1, abs=0.15) and m(j, 3) > linear_cost(j, 3)
    m2 = LearnedCostModel()
    for r in (1, 2, 4):
        m2.observe(j, r, 12.0 * (0.2 + 0.8 / r))
    assert m2.coefficients(j.design) == pytest.approx((0.2, 0.8))
    # Noisy runs that a free least-squares fit reads as "more devices, slower" (12 s per action-share on 1
    # device, 13 on 2: b = -2): the fit is non-negative, so more devices are never predicted slower.
    m3 = LearnedCostModel()
    m3.observe(j, 1, 12.0)
    m3.observe(j, 2, 13.0)
    a, b = m3.coefficients(j.design)
    assert a >= 0 and b >= 0 and m3(j, 2) <= m3(j, 1)



def test_learned_cost_fit_is_the_fit_over_every_run_and_keeps_no_runs():
    """The model keeps per-size sums, not the runs (a long-lived manager's list grew without bound): its fit
    must still be the non-negative least-squares fit over every run, here checked against scipy on all rows."""
    import random

    import numpy as np
    from scipy.optimize import nnls

    rng = random.Random(7)
    j = HJob("a", 0.0, 2.0, 1, 8)
    m = LearnedCostModel()
    runs = []
    for _ in range(5000):
        r = rng.choice((1, 2, 3, 5, 8))
        seconds = 2.0 * (0.3 + 0.7 / r) * rng.uniform(0.7, 1.4)
        m.observe(j, r, seconds)
        runs.append((r, seconds / 2.0))
    want, _ = nnls(np.array([[1.0, 1.0 / r] for r, _ in runs]), np.array([v for _, v in runs]))
    assert m.coefficients(j.design) == pytest.approx(tuple(want), rel=1e-9)
    assert sum(len(by_size) for by_size in vars(m)["_sums"].values()) == 5      # one entry per size seen
    learned = m.observed(j.design)
    assert sorted(learned) == [1, 2, 3, 5, 8] and sum(n for n, _ in learned.values()) == 5000

def test_managed_mode_picks_by_strategy():
    # Idle pool of 4, one job: spreading it (AMAP/Max) minimises the makespan.
    one = [HJob("a", 0.0, 8.0, 1, 4)]
    alloc, name = managed(one, 4, 30, now=0.0, strategy=COMPLETION_TIME)
    assert alloc == [("a", 4)] and name == "fcfs_max"
    # Eight queued unit jobs on 4 devices: at min every job starts by t=1 (none late); at max (serial,
    # 0.25 s each) j5..j7 would wait more than 1 s. Same makespan (2 s): fairness decides.
    eight = [HJob(f"j{i}", 0.0, 1.0, 1, 4) for i in range(8)]
    alloc, name = managed(eight, 4, 30, now=0.0, strategy=FAIRNESS)
    assert sorted(alloc) == [("j0", 1), ("j1", 1), ("j2", 1), ("j3", 1)] and name == "fcfs_min"
    # "completion time" (seed 001 §IV-A) does not look at lateness: all eight done by 2 s either way, same
    # makespan, so the first listed (FCFSMax) wins.
    assert managed(eight, 4, 30, now=0.0, strategy=COMPLETION_TIME)[1] == "fcfs_max"
    # No late job either way (two unit jobs): equal lateness, the makespan decides; ties: first listed.
    two = eight[:2]
    assert managed(two, 4, 30, now=0.0, strategy=COMPLETION_TIME) == ([("j0", 4)], "fcfs_max")
    with pytest.raises(ValueError):
        managed(one, 4, 30, strategy="cheapest")
    assert get_policy("managed") is managed


def test_forecast_arrivals_keeps_rate_and_mix():
    seen = [HJob("a", 0.0, 1.0, design="x"), HJob("b", 1.0, 3.0, 1, 4, design="y"), HJob("c", 2.0, 1.0, design="x")]
    # 3 arrivals over 2 s: 1.5/s; burst 1 -> every 2/3 s, shaped like c, b, c (most recent first).
    f = forecast_arrivals(seen, 2.0, 3, burst=1.0)
    assert [j.job_id for j in f] == ["~0", "~1", "~2"]
    assert [round(j.arrival, 3) for j in f] == [2.667, 3.333, 4.0]
    assert [j.design for j in f] == ["x", "y", "x"] and f[1].max_devices == 4
    assert [round(j.arrival, 3) for j in forecast_arrivals(seen, 2.0, 2, burst=2.0)] == [2.333, 2.667]
    assert forecast_arrivals(seen, 40.0, 3) == []          # nothing in the last 30 s
    assert forecast_arrivals(seen[:1], 2.0, 3) == []       # one arrival: no rate
    assert forecast_arrivals(seen, 2.0, 0) == []


def test_managed_mode_sees_expected_arrivals():
    # One 8 s job (1..4 devices) on an idle pool of 4. Alone, FCFSMax (4 devices, 2 s) has the best makespan.
    a = [HJob("a", 0.0, 8.0, 1, 4)]
    assert managed(a, 4, 30, now=0.0) == ([("a", 4)], "fcfs_max")
    # Three unit jobs are expected at 0.1, 0.2, 0.3 s: under FCFSMax they wait until t=2 (1.9, 1.8, 1.7 s: late);
    # at its min a leaves 3 devices and none waits. FCFSMin, SJTF and Priority tie: the first listed wins.
    units = [HJob(f"~{k}", 0.1 * (k + 1), 1.0) for k in range(3)]
    p = project(fcfs_max, "fcfs_max", a, 0.0, [], 4, 30, linear_cost, units)
    assert p.starts == {"a": 0.0, "~0": 2.0, "~1": 2.0, "~2": 2.0} and p.makespan == 3.0
    assert late_weight(p, a + units) == 3
    # "completion time": FCFSMax's makespan (3 s) beats FCFSMin's (8 s); "fairness": no late job wins.
    assert managed(a, 4, 30, now=0.0, expected=units) == ([("a", 4)], "fcfs_max")
    assert managed(a, 4, 30, now=0.0, expected=units, strategy=FAIRNESS) == ([("a", 1)], "fcfs_min")


def test_managed_decision_never_exceeds_available_devices():
    # Two devices are still held by a job that ends now: the decision may use 2, the projection then 4.
    a = [HJob("a", 0.0, 8.0, 1, 4), HJob("b", 0.0, 8.0, 1, 4)]
    alloc, name = managed(a, 2, 30, now=0.0, running_ends=[(0.0, 2)], pool=4)
    assert sum(n for _, n in alloc) <= 2
    p = project(fcfs_max, "fcfs_max", a, 0.0, [(0.0, 2)], 4, 30, linear_cost, available=2)
    assert p.allocation == [] and p.starts == {"a": 0.0, "b": 2.0}   # a at once on the freed devices


def test_paper_algorithms_are_table4s_four():
    assert list(PAPER_ALGORITHMS) == ["fcfs_max", "fcfs_min", "fcfs_amap", "sjtf"]


def test_a_schedule_that_starts_nothing_never_wins():
    # Pool of 1 (elasticity shrank it): FCFSMax cannot fit a job at its max (2..4) and schedules nothing.
    jobs = [HJob("l", 0.0, 4.0, 1, 4), HJob("s", 0.5, 1.0, 1, 2)]
    p = project(fcfs_max, "fcfs_max", jobs, 1.0, [], 1, 30, linear_cost)
    assert p.starts == {} and p.makespan == float("inf")
    alloc, name = managed(jobs, 1, 30, now=1.0, pool=1, algorithms=PAPER_ALGORITHMS)
    assert name == "fcfs_min" and alloc == [("l", 1)]


def test_schedule_jlos_count_from_arrival_and_drive_algorithm_3():
    # Two unit jobs (target 2 s) that arrived at 0; at t=1 one device: FCFSMin runs them 1-2 and 2-3.
    jobs = [HJob("a", 0.0, 1.0, target=2.0), HJob("b", 0.0, 1.0, target=2.0)]
    best = managed_schedule(jobs, 1, 30, now=1.0, pool=1, algorithms={"fcfs_min": fcfs_min})
    assert schedule_jlos(best, jobs) == [0.0, -1.0]
    assert elasticity_from_jlos([0.0, -1.0], 2.5).decision == SCALE_UP
    assert elasticity_from_jlos([1.5, 1.5], 2.5).decision == SCALE_DOWN
    assert elasticity_from_jlos([1.5, 1.0], 2.5).decision == PRESERVE
    with pytest.raises(ValueError):
        schedule_jlos(best, [HJob("x", 0.0, 1.0)])


def test_a_job_the_pool_cannot_hold_misses_its_jlo_so_algorithm_3_grows_the_pool():
    # min 3 on a pool of 2: no schedule starts it. Its JLO is its time at min, negative (it cannot end).
    wide = HJob("w", 0.0, 6.0, 3, 3, target=100.0)
    proj = project(fcfs_min, "fcfs_min", [wide], 0.0, [], 2, 30, linear_cost)
    assert proj.starts == {} and schedule_jlos(proj, [wide]) == [-2.0]
    assert elasticity_from_jlos(schedule_jlos(proj, [wide]), 2.5).decision == SCALE_UP


def _scenario(rate=2.0, spread=None, duration=60.0):
    return Scenario("t", (JobType("a", 0.75, 1, 3, 1.0),), rate=rate, duration=duration, strategy=FAIRNESS,
                    spread=spread)


def test_arrivals_uniform_spread_and_default_targets():
    jobs = arrivals(_scenario(rate=2.0, spread=1.0, duration=200.0), 1)
    gaps = [b.arrival - a.arrival for a, b in zip(jobs, jobs[1:], strict=False)]
    assert all(0.0 <= g <= 1.0 for g in gaps) and 350 < len(jobs) < 450
    assert all(j.target == pytest.approx(1.0 + 0.75) for j in jobs)     # 1 s + eq. 1 at min


def test_managed_with_elasticity_stays_within_the_pool():
    sc = _scenario(rate=3.0, spread=1.0)
    fixed = run_hydrogen(sc, "managed", 0)
    assert fixed.mean_pool == pytest.approx(4.0) and not fixed.scalings
    el = run_hydrogen(sc, "managed", 0, elasticity=True)
    assert 1.0 <= el.mean_pool <= 4.0 and sum(el.scalings.values()) > 0
    assert set(el.chosen) <= set(PAPER_ALGORITHMS)
    single = run_hydrogen(sc, "fcfs_min", 0)
    assert single.S_T == pytest.approx(0.75) and single.mean_pool == pytest.approx(4.0)


def test_trace_lists_every_dispatch_and_agrees_with_the_metrics():
    sc = _scenario(rate=5.0, spread=1.0)          # over capacity at min: some jobs wait, some are late
    trace: list = []
    m = run_hydrogen(sc, "fcfs_amap", 3, trace=trace)
    jobs = arrivals(sc, 3)
    assert len({job.job_id for job, *_ in trace}) == len(trace) <= len(jobs)
    waits = [start - job.arrival for job, start, _, _ in trace]
    assert min(waits) >= 0.0 and sum(waits) / len(waits) == pytest.approx(m.W_T)
    assert all(job.min_devices <= n <= job.max_devices for job, _, n, _ in trace)
    assert m.N_C == sum(1 for _, start, _, took in trace if start + took <= sc.duration)
    started = {job.job_id for job, *_ in trace}
    never = sum(1 for j in jobs if j.job_id not in started and sc.duration - j.arrival > 1.0)
    assert m.N_L == sum(1 for w in waits if w > 1.0) + never and m.N_L > 0
    # Never more devices busy at once than the pool (check_schedule raises if so), and the same late jobs.
    late = check_schedule(jobs, [(j.job_id, s, n) for j, s, n, _ in trace], pool=sc.pool, overhead=sc.overhead,
                          duration=sc.duration)
    assert len(late) == m.N_L


def test_the_slack_orders_count_lateness_with_their_callers_bound():
    from irm_fpga.qos import dispatch
    from irm_fpga.qos.hydrogen import managed_deadline_schedule, slack_min

    # At t=2, a (arrived at 0) and b (0.5, priority 5) waited 2 and 1.5 s: late under the 1 s default, so the
    # higher priority goes first; on time under a 10 s bound, so the earlier start deadline (a) does.
    a, b = HJob("a", 0.0, 1.0), HJob("b", 0.5, 1.0, priority=5.0)
    assert slack_min([a, b], 1, 30, now=2.0) == [("b", 1)]
    assert managed_deadline_schedule([a, b], 1, 30, now=2.0, algorithms={"slack_min": slack_min},
                                     late_after=10.0).allocation == [("a", 1)]
    s = dispatch.Scheduler("slack_amap", late_after=10.0)
    assert dispatch.decide(s, [a, b], now=2.0, pool=1, pool_max=1).allocation == [("a", 1)]


def test_a_callers_bound_reaches_algorithms_whatever_their_own_and_however_they_are_made():
    import functools
    from dataclasses import dataclass

    from irm_fpga.qos.hydrogen import slack_min, with_late_after

    a, b = HJob("a", 0.0, 1.0), HJob("b", 0.5, 1.0, priority=5.0)
    # A partial with its own 10 s bound, run by a caller counting 1 s: both late at t=2, so priority first.
    lenient = functools.partial(slack_min, late_after=10.0)
    assert with_late_after(lenient, 1.0)([a, b], 1, 30, now=2.0) == [("b", 1)]

    @dataclass
    class Unhashable:                     # a callable object that cannot key a cache
        def __call__(self, queue, available, window, cost=None, *, now=0.0, late_after=1.0):
            return slack_min(queue, available, window, now=now, late_after=late_after)

    assert with_late_after(Unhashable(), 10.0)([a, b], 1, 30, now=2.0) == [("a", 1)]
