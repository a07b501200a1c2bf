"""The deadline-aware managed mode (irm_fpga.qos.hydrogen, last section) on hand-computed cases.

Every case is small enough to work out by hand; the comments give the arithmetic.
Late: waiting more than 1 s before the dispatch (seed 001 §VI's N_L).
"""


import pytest

from irm_fpga.qos import get_policy
from irm_fpga.qos.hydrogen import (
    COMPLETION_TIME,
    DEADLINE_ALGORITHMS,
    PAPER_ALGORITHMS,
    PRESERVE,
    SCALE_DOWN,
    SCALE_UP,
    HJob,
    RunningJob,
    deadline_elasticity,
    deadline_score,
    fcfs_min,
    linear_cost,
    managed,
    managed_deadline,
    managed_deadline_schedule,
    project,
    slack_amap,
    slack_min,
    slack_order,
    start_deadline,
)
from irm_fpga.qos.sim import JobType, Scenario, arrivals, late_lower_bound, least_work, run_hydrogen


def test_slack_order_puts_jobs_already_late_behind_the_ones_that_can_still_start_on_time():
    # now = 2: a waited 1.5 s (late whatever happens now), b 0.8 s and c 0.5 s (deadlines 2.2 and 2.5).
    a, b, c = HJob("a", 0.5, 1.0), HJob("b", 1.2, 1.0), HJob("c", 1.5, 1.0)
    assert start_deadline(b) == pytest.approx(2.2)
    assert [j.job_id for j in slack_order([a, b, c], 2.0)] == ["b", "c", "a"]
    assert slack_min([a, b, c], 2, 30, now=2.0) == [("b", 1), ("c", 1)]
    assert fcfs_min([a, b, c], 2, 30, now=2.0) == [("a", 1), ("b", 1)]  # the paper's FCFS serves a first
    assert slack_min([a, b, c], 3, 30, now=2.0) == [("b", 1), ("c", 1), ("a", 1)]
    # Exactly 1 s of waiting is not late (N_L counts "more than 1 second").
    assert [j.job_id for j in slack_order([a, b], 1.5)] == ["a", "b"]


def test_slack_order_ties_and_late_jobs_by_priority():
    lo, hi = HJob("lo", 1.0, 1.0, priority=1), HJob("hi", 1.0, 1.0, priority=3)
    assert [j.job_id for j in slack_order([lo, hi], 1.5)] == ["hi", "lo"]  # same deadline
    x, y = HJob("x", 1.0, 1.0, priority=1), HJob("y", 2.0, 1.0, priority=3)  # both late at t=5
    assert [j.job_id for j in slack_order([x, y], 5.0)] == ["y", "x"]
    assert [j.job_id for j in slack_order([x, HJob("z", 2.0, 1.0)], 5.0)] == ["x", "z"]  # then arrival


def test_slack_amap_widens_the_longest_only_when_the_whole_window_is_dispatched():
    long_, short = HJob("l", 0.0, 4.0, 1, 4), HJob("s", 0.1, 1.0, 1, 2)
    # 4 free: both at min (2 devices), the 2 left go to the longest (l: 4 s at min) up to its max.
    assert slack_amap([long_, short], 4, 30, now=0.2) == [("l", 3), ("s", 1)]
    # 6 free: l to its max 4 (3 more), s gets the last one (2 = its max).
    assert slack_amap([long_, short], 6, 30, now=0.2) == [("l", 4), ("s", 2)]
    # 1 free: s cannot start, nothing is widened.
    assert slack_amap([long_, short], 1, 30, now=0.2) == [("l", 1)]
    # A window of 1 leaves s outside: the window is "all dispatched" and l takes every free device.
    assert slack_amap([long_, short], 4, 1, now=0.2) == [("l", 4)]


def test_deadline_mode_keeps_devices_for_the_window_where_the_papers_scoring_spreads_one_job():
    # Idle pool of 4 at t=0; an 8 s job a (1..4 devices) and three 1 s jobs (1 device) all arrived at 0.
    jobs = [HJob("a", 0.0, 8.0, 1, 4), *(HJob(k, 0.0, 1.0) for k in "bcd")]
    # FCFSMax: a on 4 devices for 2 s, b, c, d start at 2 (waited 2 s: 3 late); makespan 3 s.
    # FCFSMin: all four start now; makespan 8 s.
    p_max = project(PAPER_ALGORITHMS["fcfs_max"], "fcfs_max", jobs, 0.0, [], 4, 30, linear_cost)
    assert p_max.starts == {"a": 0.0, "b": 2.0, "c": 2.0, "d": 2.0} and p_max.makespan == 3.0
    # "completion time" (seed 001 §IV-A): FCFSMax completes all four by 3 s, FCFSMin only b, c, d: FCFSMax.
    assert managed(jobs, 4, 30, now=0.0, strategy=COMPLETION_TIME) == ([("a", 4)], "fcfs_max")
    # Deadline-aware: FCFSMax scores (-3, ...); FCFSMin (0 late, 0 s of waiting, 8+1+1+1 = 11 s) ties
    # with SJTF, slack_min and slack_amap: the first listed wins.
    p_min = project(fcfs_min, "fcfs_min", jobs, 0.0, [], 4, 30, linear_cost)
    assert deadline_score(p_max, jobs) == (-3.0, 0.0, -6.0, -(2.0 + 3 * 3.0))
    assert deadline_score(p_min, jobs) == (0.0, 0.0, 0.0, -11.0)
    alloc, name = managed_deadline(jobs, 4, 30, now=0.0)
    assert name == "fcfs_min" and sorted(alloc) == [("a", 1), ("b", 1), ("c", 1), ("d", 1)]


def test_deadline_mode_serves_the_job_that_can_still_be_on_time():
    # t=2, one device: a (1 s) waited 1.5 s, b (1 s) waited 0.5 s. FCFS runs a now and b at 3 (waited
    # 1.5 s): 2 late. slack_min runs b now and a at 3: 1 late, so it is the only best schedule.
    a, b = HJob("a", 0.5, 1.0), HJob("b", 1.5, 1.0)
    best = managed_deadline_schedule([a, b], 1, 30, now=2.0, pool=1)
    assert best.algorithm == "slack_min" and best.allocation == [("b", 1)]
    assert best.starts == {"b": 2.0, "a": 3.0}
    assert deadline_score(best, [a, b]) == (-1.0, 0.0, -(0.5 + 2.5), -(1.5 + 3.5))  # waits, times from arrival


def test_deadline_score_weights_late_jobs_by_priority_and_counts_unstarted_ones():
    # One device, t=2: a (priority 5) waited 1.5 s, b (priority 1) 0.5 s: whatever runs first, a is late
    # (5) and b is late if it runs second (1). slack_min (b first): 5; FCFS (a first): 5 + 1 = 6.
    a, b = HJob("a", 0.5, 1.0, priority=5), HJob("b", 1.5, 1.0, priority=1)
    fcfs = project(fcfs_min, "fcfs_min", [a, b], 2.0, [], 1, 30, linear_cost)
    slack = project(slack_min, "slack_min", [a, b], 2.0, [], 1, 30, linear_cost)
    assert deadline_score(fcfs, [a, b])[0] == -6.0 and deadline_score(slack, [a, b])[0] == -5.0
    # A job that needs 2 devices on a pool of 1 never starts: late, and counted apart (with priority), not
    # summed into the latencies of the jobs that start.
    wide = HJob("w", 0.0, 1.0, 2, 2, priority=3)
    p = project(fcfs_min, "fcfs_min", [wide, b], 2.0, [], 1, 30, linear_cost)
    assert deadline_score(p, [wide, b]) == (-3.0, -3.0, -0.5, -1.5)


def test_registry_names_both_managed_modes():
    assert get_policy("managed_deadline") is managed_deadline
    assert get_policy("managed_paper") is managed and get_policy("managed") is managed
    assert get_policy("slack_min") is slack_min and get_policy("slack_amap") is slack_amap
    assert list(DEADLINE_ALGORITHMS) == [*PAPER_ALGORITHMS, "slack_min", "slack_amap"]


# -- the elasticity manager -----------------------------------------------------------------


def unit(jid, arrival=0.0, target=2.0, **kw):
    return HJob(jid, arrival, 1.0, target=target, **kw)


def test_grows_before_dispatch_by_as_many_devices_as_the_jlos_need():
    # Pool 1, busy until t=2. Two 1 s jobs (JLO 2 s from arrival at 0). On 1 device they run 2-3 and 3-4:
    # JLOs 2-3 = -1 and -2. On 2: a 0-1, b 1-2: JLOs 1 and 0 (met). So +1 device, a dispatched now.
    running = [RunningJob(unit("r", target=10.0), 2.0, 1)]
    plan = deadline_elasticity(
        [unit("a"), unit("b")], 30, now=0.0, running=running, pool=1, lo=1, hi=4, beta=2.5
    )
    assert (plan.pool, plan.decision) == (2, SCALE_UP)
    assert plan.jlos == (1.0, 0.0) and plan.schedule.allocation == [("a", 1)]
    # Three such jobs need 3 devices (1 busy + a, b now, c at 1: JLO 0): +2 at once.
    plan = deadline_elasticity(
        [unit("a"), unit("b"), unit("c")], 30, now=0.0, running=running, pool=1, lo=1, hi=4, beta=2.5
    )
    assert (plan.pool, plan.decision) == (3, SCALE_UP) and plan.jlos == (1.0, 1.0, 0.0)
    # Capped by hi: on 2 devices c still misses (JLO -1); the manager cannot do better than its max.
    plan = deadline_elasticity(
        [unit("a"), unit("b"), unit("c")], 30, now=0.0, running=running, pool=1, lo=1, hi=2, beta=2.5
    )
    assert (plan.pool, plan.decision) == (2, SCALE_UP) and min(plan.jlos) == -1.0


def test_shrinks_one_device_only_when_every_jlo_holds_on_the_smaller_pool():
    # Idle pool of 4, three 1 s jobs with JLO 3 s: on 4 or 3 devices all run 0-1 (JLOs 2, 2, 2: sum 6 > 2.5).
    three = [unit(k, target=3.0) for k in "abc"]
    plan = deadline_elasticity(three, 30, now=0.0, pool=4, lo=1, hi=4, beta=2.5)
    assert (plan.pool, plan.decision) == (3, SCALE_DOWN) and plan.jlos == (2.0, 2.0, 2.0)
    assert sum(n for _, n in plan.schedule.allocation) <= 3
    # Positive sum 2 <= beta: preserve (Algorithm 3's test).
    plan = deadline_elasticity([unit("a", target=3.0)], 30, now=0.0, pool=4, lo=1, hi=4, beta=2.5)
    assert (plan.pool, plan.decision) == (4, PRESERVE)
    # Four such jobs on 3 devices: d would run 1-2 (JLO 1, met) -> shrink; with JLO 1.5 for d, it would
    # finish at 2 > 1.5: the smaller pool misses it, so the pool is kept.
    plan = deadline_elasticity([*three, unit("d", target=1.5)], 30, now=0.0, pool=4, lo=1, hi=4, beta=2.5)
    assert (plan.pool, plan.decision) == (4, PRESERVE)


def test_never_shrinks_while_a_running_job_is_predicted_late_or_expected_arrivals_would_miss():
    three = [unit(k, target=3.0) for k in "abc"]
    # A running job that arrived at -2 with JLO 1 s ends at 0.5: 2.5 s after arrival, late.
    late_runner = RunningJob(unit("r", arrival=-2.0, target=1.0), 0.5, 1)
    plan = deadline_elasticity(three, 30, now=0.0, running=[late_runner], pool=5, lo=1, hi=5, beta=2.5)
    assert (plan.pool, plan.decision) == (5, PRESERVE)
    # Expected arrivals: three 1 s jobs at 0.1 with JLO 1.5 s. On 3 devices (busy with a, b, c until 1)
    # they would end at 2 (JLO 1.5 - 1.9 < 0): no shrink. On 4 (the pool now) one of them is fine.
    expected = [unit(f"~{k}", arrival=0.1, target=1.5) for k in range(3)]
    plan = deadline_elasticity(three, 30, now=0.0, pool=4, lo=1, hi=4, beta=2.5, expected=expected)
    assert (plan.pool, plan.decision) == (4, PRESERVE)
    with pytest.raises(ValueError):
        deadline_elasticity(three, 30, now=0.0, pool=4, lo=3, hi=2, beta=2.5)


# -- the lower bound and the simulation ---------------------------------------------------------


def test_late_lower_bound_on_a_hand_case():
    # Nine 1 s jobs at t=0, 4 devices, late after 0.5 s: all would start in [0, 0.5] (2 device-s); at most
    # 4 can still be running at 0.5, the other 5 s of work do not fit: 3 must be moved out (5-3 = 2 <= 2).
    nine = [HJob(f"j{i}", 0.0, 1.0) for i in range(9)]
    assert late_lower_bound(nine, 4, lambda j: j.default_time, late_after=0.5) == 3
    assert late_lower_bound(nine[:4], 4, lambda j: j.default_time, late_after=0.5) == 0
    # Two bursts far apart add up.
    later = [HJob(f"k{i}", 100.0, 1.0) for i in range(9)]
    assert late_lower_bound(nine + later, 4, lambda j: j.default_time, late_after=0.5) == 6
    # least_work: r * t(r) grows with r, so the least device-seconds is at the min.
    assert least_work(HJob("w", 0.0, 2.0, 2, 4), 0.1) == pytest.approx(2 * 2.0 * (0.1 + 0.9 / 2))


def heavy(duration=60.0):
    return Scenario(
        "heavy",
        (JobType("short", 0.5, 1, 2, 0.7), JobType("long", 4.0 / 3.0, 1, 4, 0.3)),
        rate=4.6,
        duration=duration,
        strategy=COMPLETION_TIME,
        spread=1.0,
    )


def test_simulated_deadline_mode_is_never_below_the_bound_and_beats_fcfs_on_late_jobs():
    sc = heavy()
    for seed in (0, 1):
        bound = late_lower_bound(arrivals(sc, seed), sc.pool, lambda j: least_work(j, sc.overhead))
        fcfs = run_hydrogen(sc, "fcfs_min", seed)
        ours = run_hydrogen(sc, "managed_deadline", seed, learned=True)
        el = run_hydrogen(sc, "managed_deadline", seed, learned=True, elasticity=True, forecast=30)
        assert bound <= ours.N_L <= fcfs.N_L and bound <= el.N_L and bound <= fcfs.N_L
        assert set(ours.chosen) <= set(DEADLINE_ALGORITHMS)
        assert 1.0 <= el.mean_pool <= 4.0 + 1e-9 and set(el.scalings) <= {SCALE_UP, SCALE_DOWN, PRESERVE}
    assert sum(run_hydrogen(sc, "fcfs_min", s).N_L for s in (0, 1)) > sum(
        run_hydrogen(sc, "managed_deadline", s, learned=True).N_L for s in (0, 1)
    )
    with pytest.raises(KeyError):
        run_hydrogen(sc, "round_robin", 0)
