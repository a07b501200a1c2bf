"""`on_time_schedule` (irm_fpga.qos.late_search): an exact search for a schedule with no late job, on hand cases,
against brute force on one device, and on Table IV scenario 2's arrivals (checked by `check_schedule`)."""

import itertools
import random

import pytest

from bench.policies import continue_on_time, table4_scenarios
from irm_fpga.qos.hydrogen import HJob
from irm_fpga.qos.late_search import IMPOSSIBLE, ON_TIME, UNKNOWN, on_time_schedule
from irm_fpga.qos.sim import arrivals, check_schedule, true_sizes


def job(name, arrival, sizes):
    # default_time/min/max only matter to check_schedule: sizes() below is what the search uses.
    lo, hi = min(r for r, _ in sizes), max(r for r, _ in sizes)
    return HJob(name, arrival, 1.0, lo, hi, 1.0)


def table(spec):
    return lambda j: spec[j.job_id]


def test_a_job_is_held_back_with_its_devices_free_when_only_that_starts_the_other_on_time():
    # Pool 2, late after 1.2 s. A (0 s) runs 3 s on 1 device or 1.6 s on 2; B (0.1 s) needs both devices for 1 s.
    # Starting A at once on either size makes B late; holding A until B ends (1.1 s) starts both on time.
    spec = {"A": [(1, 3.0), (2, 1.6)], "B": [(2, 1.0)]}
    jobs = [job("A", 0.0, spec["A"]), job("B", 0.1, spec["B"])]
    r = on_time_schedule(jobs, 2, table(spec), late_after=1.2)
    assert r.verdict == ON_TIME
    assert [(j, round(s, 9), n) for j, s, n in r.dispatches] == [("B", 0.1, 2), ("A", 1.1, 1)]


def test_the_same_jobs_with_a_shorter_allowance_have_no_on_time_schedule():
    spec = {"A": [(1, 3.0), (2, 1.6)], "B": [(2, 1.0)]}
    jobs = [job("A", 0.0, spec["A"]), job("B", 0.1, spec["B"])]
    assert on_time_schedule(jobs, 2, table(spec), late_after=1.0).verdict == IMPOSSIBLE


def test_the_state_a_policy_left_is_where_the_search_starts():
    spec = {"A": [(1, 0.5)]}
    jobs = [job("A", 0.5, spec["A"])]
    # The only device is busy until 2.0: A (start deadline 1.5) cannot start on time; until 1.4 it can, at 1.4.
    assert on_time_schedule(jobs, 1, table(spec), start=0.5, busy=[2.0]).verdict == IMPOSSIBLE
    r = on_time_schedule(jobs, 1, table(spec), start=0.5, busy=[1.4])
    assert r.verdict == ON_TIME and r.dispatches == (("A", 1.4, 1),)


def test_a_job_with_no_size_that_fits_the_pool_is_never_on_time():
    spec = {"A": [(3, 1.0)]}
    assert on_time_schedule([job("A", 0.0, spec["A"])], 2, table(spec)).verdict == IMPOSSIBLE


def test_bad_input_is_refused():
    spec = {"A": [(1, 1.0)], "B": [(1, 1.0)]}
    with pytest.raises(ValueError, match="sorted"):
        on_time_schedule([job("B", 1.0, spec["B"]), job("A", 0.0, spec["A"])], 1, table(spec))
    with pytest.raises(ValueError, match="pool"):
        on_time_schedule([job("A", 0.0, spec["A"])], 0, table(spec))
    assert on_time_schedule([], 1, table(spec)).verdict == ON_TIME


def on_time_by_brute_force(jobs):
    """One device, one size per job: some order starts every job within 1 s (each as early as it can)."""
    for order in itertools.permutations(jobs):
        t, ok = 0.0, True
        for j in order:
            s = max(t, j.arrival)
            if s - j.arrival > 1.0:
                ok = False
                break
            t = s + j.default_time
        if ok:
            return True
    return False


@pytest.mark.parametrize("seed", range(40))
def test_one_device_verdicts_equal_brute_force(seed):
    # About a third of these draws have no on-time schedule: both verdicts are exercised.
    rng = random.Random(seed)
    t, jobs = 0.0, []
    for i in range(6):
        t += rng.uniform(0.0, 0.8)
        jobs.append(HJob(f"j{i}", t, rng.choice([0.2, 0.4, 0.6, 0.9]), 1, 1, 1.0))
    r = on_time_schedule(jobs, 1, lambda j: [(1, j.default_time)])
    assert r.verdict == (ON_TIME if on_time_by_brute_force(jobs) else IMPOSSIBLE)
    if r.verdict == ON_TIME:
        assert check_schedule(jobs, r.dispatches, pool=1, overhead=1.0, duration=1e9) == []


def test_a_window_of_table4_scenario2_is_placed_on_time_and_the_schedule_checks():
    sc = table4_scenarios()[1]
    jobs = [j for j in arrivals(sc, 4) if 57.0 <= j.arrival <= 62.0]     # the long-job burst before seed 4's late jobs
    r = on_time_schedule(jobs, sc.pool, lambda j: true_sizes(j, sc.overhead))
    assert r.verdict == ON_TIME and len(r.dispatches) == len(jobs)
    assert check_schedule(jobs, r.dispatches, pool=sc.pool, overhead=sc.overhead, duration=1e9) == []


def test_slack_amap_has_lost_seed_4_four_seconds_before_its_first_late_job():
    # slack_amap's first late job on seed 4 arrives at 60.05 s; from the state it left at 56 s none can avoid one.
    sc = table4_scenarios()[1]
    assert continue_on_time(sc, 4, "slack_amap", 56.0, until_s=68.0, time_limit=60.0).verdict == IMPOSSIBLE


def test_a_search_out_of_time_says_so():
    sc = table4_scenarios()[1]
    jobs = [j for j in arrivals(sc, 4) if 50.0 <= j.arrival <= 64.0]
    assert on_time_schedule(jobs, sc.pool, lambda j: true_sizes(j, sc.overhead), time_limit=0.2).verdict == UNKNOWN


def test_a_job_already_past_its_start_deadline_when_the_search_starts_is_never_on_time():
    # Waiting since 0 s with 1 s allowed: at 1.1 s it is late, however many devices are free.
    spec = {"A": [(1, 1.0)]}
    assert on_time_schedule([job("A", 0.0, spec["A"])], 8, table(spec), start=1.1).verdict == IMPOSSIBLE
    assert on_time_schedule([job("A", 0.0, spec["A"])], 8, table(spec), start=1.0).verdict == ON_TIME


def test_more_busy_devices_than_the_pool_is_refused():
    spec = {"A": [(1, 1.0)]}
    with pytest.raises(ValueError, match="busy devices"):
        on_time_schedule([job("A", 0.0, spec["A"])], 1, table(spec), busy=[1.0, 2.0])
