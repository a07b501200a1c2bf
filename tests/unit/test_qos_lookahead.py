"""The one-step lookahead over sampled futures (irm_fpga.qos.lookahead) on hand-computed cases."""

import random

import pytest

from irm_fpga.qos.hydrogen import HJob, linear_cost, managed_deadline_schedule, slack_order
from irm_fpga.qos.lookahead import first_steps, lookahead_schedule, sample_arrivals, sizes
from irm_fpga.qos.sim import JobType, Scenario, arrivals, check_schedule, run_hydrogen


def test_first_steps_are_every_dispatch_of_the_first_jobs_in_slack_order_that_fits():
    a, b = HJob("a", 0.0, 1.0, 1, 2), HJob("b", 0.2, 1.0, 1, 1)
    assert first_steps([b, a], 2, 0.5) == [[], [("a", 1)], [("a", 1), ("b", 1)], [("a", 2)], [("b", 1)]]
    assert first_steps([a, b], 0, 0.5) == [[]]
    assert first_steps([a, b], 1, 0.5, extra=0) == [[], [("a", 1)]]       # only the first job: 1 free + 0 more
    late = HJob("late", -2.0, 1.0)                                           # waited 2.5 s: after the on-time ones
    assert first_steps([late, b], 1, 0.5, extra=0) == [[], [("b", 1)]]


def test_sampled_futures_repeat_the_recent_gaps_and_shapes_after_now():
    history = [HJob(f"h{i}", 9.0 + 0.25 * i, 0.5 if i % 2 else 1.0) for i in range(5)]   # 9.0 .. 10.0
    futures = sample_arrivals(history, 10.1, samples=3, horizon=1.0, rng=random.Random(1))
    assert len(futures) == 3
    for s, fut in enumerate(futures):
        # Every gap is 0.25 s: the last arrival was at 10.0, so 10.25, 10.5, 10.75, 11.0 (<= 10.1 + 1).
        assert [j.arrival for j in fut] == pytest.approx([10.25, 10.5, 10.75, 11.0])
        assert [j.job_id for j in fut] == [f"~{s}.{k}" for k in range(4)]
        assert {j.default_time for j in fut} <= {0.5, 1.0}
    # Fewer than three recent arrivals (the others are older than the span): nothing known, one empty future.
    assert sample_arrivals(history, 38.9, span=29.0, rng=random.Random(1)) == [[]]
    # Seeded: the same futures again.
    assert sample_arrivals(history, 10.1, samples=3, rng=random.Random(1)) == futures


def test_a_future_burst_keeps_a_device_free_where_the_candidates_spread_the_long_job():
    # Pool 2, both free at t = 0; a long job (3 s on one device, eq. 1). Seen alone, spreading it is best:
    # 1.5 s instead of 3, nobody waits. With two 0.5 s jobs arriving at 0.1 and 0.2: on 2 devices they
    # wait until 1.5 (1.4 and 1.3 s: late); on 1 device the first starts at 0.1 on the other, the second
    # at 0.6 (waits 0.4): none late.
    long_ = HJob("L", 0.0, 3.0, 1, 2)
    burst = [HJob("s1", 0.1, 0.5), HJob("s2", 0.2, 0.5)]
    assert managed_deadline_schedule([long_], 2, 30, linear_cost, now=0.0, pool=2).allocation == [("L", 2)]
    assert lookahead_schedule([long_], 2, 30, linear_cost, now=0.0, pool=2).allocation == [("L", 2)]
    best = lookahead_schedule([long_], 2, 30, linear_cost, now=0.0, pool=2, futures=[burst])
    assert best.allocation == [("L", 1)] and best.algorithm == "lookahead"
    assert best.starts == pytest.approx({"L": 0.0, "s1": 0.1, "s2": 0.6})
    # Over two futures, one quiet and one with the burst: the late jobs of the burst still decide.
    assert lookahead_schedule([long_], 2, 30, linear_cost, now=0.0, pool=2,
                              futures=[[], burst]).allocation == [("L", 1)]


def test_simulated_runs_with_the_lookahead_repeat_and_stay_within_the_pool():
    sc = Scenario("t", (JobType("short", 0.5, 1, 2, 0.7), JobType("long", 4 / 3, 1, 4, 0.3)), rate=4.4,
                  duration=40.0, strategy="completion time", spread=0.4)
    trace: list = []
    a = run_hydrogen(sc, "managed_deadline", 2, learned=True, lookahead=3, trace=trace)
    b = run_hydrogen(sc, "managed_deadline", 2, learned=True, lookahead=3)
    assert a == b and set(a.chosen) == {"lookahead"} and a.N_C > 100
    # Never more devices busy at once than the pool (check_schedule raises if so), and the same late jobs.
    late = check_schedule(arrivals(sc, 2), [(j.job_id, s, n) for j, s, n, _ in trace], pool=sc.pool,
                          overhead=sc.overhead, duration=sc.duration)
    assert len(late) == a.N_L
    with pytest.raises(ValueError, match="lookahead"):
        run_hydrogen(sc, "managed", 2, lookahead=3)          # only the deadline-aware mode has one


def test_managed_lookahead_by_name_draws_its_futures_from_the_history():
    from irm_fpga.qos import get_policy

    decide = get_policy("managed_lookahead")
    long_ = HJob("L", 10.0, 3.0, 1, 2)
    # Arrivals every 0.1 s until now: the sampled futures are bursts, so the long job keeps a device free.
    busy = [HJob(f"h{i}", 9.0 + 0.1 * i, 0.5) for i in range(10)]
    assert decide([long_], 2, 30, linear_cost, now=10.0, pool=2, history=busy) == ([("L", 1)], "lookahead")
    # No recent arrivals: nothing expected, spreading it is best.
    assert decide([long_], 2, 30, linear_cost, now=10.0, pool=2) == ([("L", 2)], "lookahead")


def test_decisions_between_two_arrivals_plan_against_the_same_futures():
    from irm_fpga.qos.lookahead import futures_for

    history = [HJob(f"h{i}", 9.0 + 0.25 * i, 0.5 if i % 3 else 1.0) for i in range(5)]   # last arrival 10.0
    at_arrival = futures_for(history, 10.0, samples=4, seed=7)
    # A completion at 10.05 (no new arrival): the same draws, so the same jobs at the same times.
    assert futures_for(history, 10.05, samples=4, seed=7) == at_arrival
    # A new arrival brings new futures; so does another run seed.
    later = [*history, HJob("h5", 10.1, 1.0)]
    assert futures_for(later, 10.1, samples=4, seed=7) != at_arrival
    assert futures_for(history, 10.0, samples=4, seed=8) != at_arrival
    # Arrivals after `now` are not known yet: they neither seed nor shape the futures.
    assert futures_for(later, 10.05, samples=4, seed=7) == at_arrival


def test_first_steps_stay_few_on_a_large_pool():
    # 8 free devices, jobs of 1..8: without the caps 43,758 first steps; with them the first 4 + 2 jobs in
    # slack order, each on at most 4 device counts spread over what is left (1, 3, 6 or 8 on all 8), or skipped.
    q = [HJob(f"j{i}", 0.1 * i, 2.0, 1, 8) for i in range(20)]
    steps = first_steps(q, 8, now=2.0)
    assert sizes(1, 8) == [1, 3, 6, 8] and sizes(1, 4) == [1, 2, 3, 4]
    assert 1 < len(steps) < 1500
    assert {j for s in steps for j, _ in s} == {j.job_id for j in slack_order(q, 2.0)[:6]}
    assert all(sum(n for _, n in s) <= 8 for s in steps)
    head = slack_order(q, 2.0)[0].job_id
    assert sorted(s[0][1] for s in steps if len(s) == 1 and s[0][0] == head) == [1, 3, 6, 8]


def _counting_projections(monkeypatch) -> list[int]:
    """Counts the lookahead's projections (one per first step and future weighed)."""
    from irm_fpga.qos import lookahead as la

    calls = [0]
    real = la.project

    def counted(*args, **kwargs):
        calls[0] += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(la, "project", counted)
    return calls


def test_a_search_cut_short_weighs_the_base_step_first(monkeypatch):
    from irm_fpga.qos.hydrogen import slack_amap

    q = [HJob(f"j{i}", 0.1 * i, 2.0, 1, 3) for i in range(6)]
    calls = _counting_projections(monkeypatch)
    full = lookahead_schedule(q, 4, 30, now=0.6, pool=4)
    assert calls[0] == len(first_steps(q, 4, 0.6)) > 2
    # The deadline passed before the search began: only what slack_amap would start now is weighed (not
    # waiting: live, a wait nobody weighed against anything held the queue with every device free).
    calls[0] = 0
    cut = lookahead_schedule(q, 4, 30, now=0.6, pool=4, stop_at=5.0, clock=lambda: 5.0)
    assert calls[0] == 1
    assert cut.allocation == slack_amap(q, 4, 30, now=0.6) != []
    # Each first step the search reaches is weighed once (the base's is not weighed again).
    ticks = iter(range(100))
    calls[0] = 0
    lookahead_schedule(q, 4, 30, now=0.6, pool=4, stop_at=3, clock=lambda: next(ticks))
    assert calls[0] == 1 + 3
    # A deadline the search never reaches changes nothing.
    calls[0] = 0
    later = lookahead_schedule(q, 4, 30, now=0.6, pool=4, stop_at=5.0, clock=lambda: 4.0)
    assert later.allocation == full.allocation and calls[0] == len(first_steps(q, 4, 0.6))


def test_a_decision_budget_bounds_the_search_across_the_pools_the_elasticity_manager_tries(monkeypatch):
    from dataclasses import replace

    from irm_fpga.qos import dispatch

    # 16 devices, the pool shrunk to 1, 30 queued jobs that can each use all 16: the elasticity manager
    # searches on every pool size from 1 to 16 (tens of thousands of projections without a budget).
    q = [HJob(f"j{i}", 100 + 0.1 * i, 2.0 + i % 3, 1, 16, target=3.0 + i % 3) for i in range(30)]
    history = [HJob(f"h{i}", 70.0 + i, 2.0, 1, 16, target=3.0) for i in range(30)] + q
    s = replace(dispatch.scheduler_for("managed_lookahead"), budget_s=0.0)
    calls = _counting_projections(monkeypatch)
    d = dispatch.decide(s, q, now=103.0, pool=1, pool_max=16, history=history)
    # Past the budget the pool grows in doubling steps (1, 2, 3, 5, 9, 16: six sizes, not sixteen), and each
    # size tried weighs slack_amap's step over the 6 futures, and nothing more.
    assert d.pool == 16 and d.scaling == "Scale Up" and d.allocation
    assert 0 < calls[0] <= 6 * 6
    with pytest.raises(ValueError, match="budget_s"):
        replace(s, budget_s=-0.5)


def test_a_job_that_cannot_start_on_the_pool_holds_back_no_other():
    # w needs 8 devices, the pool has 7; s waited 2 s already (late whatever happens). Summed in as an
    # infinite latency, w made every first step tie, and the first tried (waiting) held s back for good.
    w = HJob("w", 0.0, 1.0, 8, 8, target=600.0)
    s = HJob("s", 0.0, 3.0, 1, 1, target=600.0)
    best = lookahead_schedule([w, s], 7, 30, now=2.0, pool=7)
    assert best.allocation == [("s", 1)] and "w" not in best.starts
    assert managed_deadline_schedule([w, s], 7, 30, now=2.0, pool=7).allocation == [("s", 1)]


def test_wide_jobs_in_the_recent_arrivals_do_not_stop_a_decision_on_a_smaller_pool():
    from dataclasses import replace

    from irm_fpga.qos import dispatch

    # Arrivals every 0.3 s, one in three of min 8 (sampled futures would hold jobs that cannot start on 7).
    hist = [HJob(f"h{i}", 10.0 + 0.3 * i, 0.5, 8 if i % 3 == 0 else 1, 8 if i % 3 == 0 else 1, target=60.0)
            for i in range(30)]
    s = HJob("s", 20.0, 0.5, 1, 1, target=60.0)
    sched = replace(dispatch.scheduler_for("managed_lookahead"), budget_s=None)
    d = dispatch.decide(sched, [s], now=20.0, pool=7, pool_max=7, history=[*hist, s])
    assert d.allocation == [("s", 1)]


@pytest.mark.parametrize("name", ["fcfs_min", "sjtf", "priority", "fcfs_amap"])
def test_a_job_wider_than_the_largest_pool_waits_without_blocking_the_queue(name):
    from irm_fpga.qos import dispatch

    wide = HJob("wide", 0.0, 0.1, 7, 7, priority=9.0)     # cheapest and most important: first in SJTF and priority
    small = HJob("small", 0.5, 1.0, 1, 1)
    d = dispatch.decide(dispatch.scheduler_for(name), [wide, small], now=1.0, pool=6, pool_max=6)
    assert d.allocation == [("small", 1)]


def test_a_held_job_is_decided_again_at_its_start_deadline_in_projections_and_in_the_simulator(monkeypatch):
    from irm_fpga.qos import hydrogen as hy
    from irm_fpga.qos import lookahead as la

    a = HJob("a", 0.0, 1.0)
    assert hy.wake_time([a, HJob("b", 0.3, 1.0)], 0.5) == pytest.approx(1.0 - hy.WAKE_EARLY_S)
    assert hy.wake_time([a], 1.0) is None                          # its deadline has passed: nothing to wake for
    # Held now with a device free and nothing else to come: without a wake it never starts in the projection;
    # with one it starts just before its deadline, on time.
    first_wait = la._then([], 0.0, hy.slack_amap)
    assert "a" not in hy.project(first_wait, "x", [a], 0.0, [], 1, 30, linear_cost).starts
    woken = hy.project(la._then([], 0.0, hy.slack_amap), "x", [a], 0.0, [], 1, 30, linear_cost, wake_late_after=1.0)
    assert woken.starts["a"] == pytest.approx(1.0 - hy.WAKE_EARLY_S)

    # The simulator: a lookahead that waits at a job's arrival decides again at its deadline (with no other
    # event before it, the job would start at the next arrival, 5 s later: late).
    seen: list[float] = []

    def waits_once_per_job(queue, available, window, cost=linear_cost, *, now, **kw):  # noqa: ANN001, ANN202
        seen.append(now)
        job = queue[0]
        go = [] if now == job.arrival else [(job.job_id, 1)]
        return hy.Projection("lookahead", go, {}, {}, 0.0)
    monkeypatch.setattr(la, "lookahead_schedule", waits_once_per_job)
    sc = Scenario("slow", (JobType("j", 0.5, 1, 1, 1.0),), rate=0.2, duration=12.0, strategy=hy.COMPLETION_TIME,
                  pool=1, spread=0.0)
    trace: list = []
    r = run_hydrogen(sc, "managed_deadline", 0, lookahead=2, trace=trace)
    assert r.N_L == 0 and len(trace) == 2 and len(seen) == 4       # each job: its arrival, its wake
    for job, start, _, _ in trace:
        assert start == pytest.approx(job.arrival + 1.0 - hy.WAKE_EARLY_S)
    # Without lookahead the scheduler never waits on purpose: no wake events.
    assert not run_hydrogen(sc, "managed_deadline", 0).N_L
