"""`late_lower_bound_energy` (irm_fpga.qos.sim): a lower bound on late jobs for any policy, on hand cases.

Late: waiting more than 1 s before the dispatch (seed 001 §VI's N_L). Each job's least device-time
inside an interval [t1, t2] (t1, t2 at start deadlines = arrival + 1) is the minimum over its sizes r and
over a start at either end of its start window of r * the overlap; when the sum exceeds the pool's
device-time, the largest are dropped (made late) until the rest fit.
"""

import pytest

from irm_fpga.qos.hydrogen import HJob
from irm_fpga.qos.sim import (
    JobType,
    Scenario,
    arrivals,
    late_lower_bound,
    late_lower_bound_energy,
    least_work,
    run_hydrogen,
    true_sizes,
)


def one_size(job):
    return [(1, job.default_time)]


def test_six_two_second_jobs_on_two_devices_need_a_late_one():
    # a, b at 0 (deadline 1), c, d, e at 1 (deadline 2), f at 2 (deadline 3); 2 s each on 1 device; pool 2.
    # On [2, 3] (2 device-s): c, d, e started at 1 or 2 each run through [2, 3]: 1 s each; a, b (started at 0,
    # they end at 2) and f (it may start at 3) 0. Sum 3 > 2: drop one, 2 fit: at least 1 late. On [1, 3] (4 device-s): a, b at least 1 s each, c, d, e 1 s each: 5 > 4,
    # also one. (The true least is 2: f waits for a device until 4.)
    jobs = [HJob(n, t, 2.0) for n, t in (("a", 0.0), ("b", 0.0), ("c", 1.0), ("d", 1.0), ("e", 1.0), ("f", 2.0))]
    assert late_lower_bound_energy(jobs, 2, one_size) == 1
    # Without e: [2, 3] holds 2, [1, 3] holds 4, [1, 2] holds a and b's 2: nothing is proved (f is still late:
    # the bound is only a lower bound).
    assert late_lower_bound_energy([j for j in jobs if j.job_id != "e"], 2, one_size) == 0
    # A third device: 3 device-s on [2, 3], 6 on [1, 3].
    assert late_lower_bound_energy(jobs, 3, one_size) == 0
    # Intervals longer than `span` are not tried: the start deadlines are 1 s apart.
    assert late_lower_bound_energy(jobs, 2, one_size, span=0.5) == 0


def test_a_job_that_may_run_wide_counts_at_its_least_device_time_in_the_interval():
    # w at 0 (deadline 1): 2 s on 1 device or 1.05 s on 2. x1..x3 at 1 (deadline 2): 1.2 s on 1 device.
    # q at 2.2 (deadline 3.2): 0.1 s. Pool 2; interval [1, 3.2]: 4.4 device-s.
    # x: started at 1 gives 1.2 s inside, at 2 gives 1.2 s: 1.2 each, 3.6. q: 0 (it can start at 3.2).
    # w on 1 device: started at 0, 1 s inside; at 1, 2 s: 1 -> 4.6 > 4.4, one late.
    # w on 2 devices: started at 0 it leaves at 1.05: 2 * 0.05 = 0.1 -> 3.7 <= 4.4: nothing proved.
    w = HJob("w", 0.0, 2.0, 1, 2)
    xs = [HJob(f"x{i}", 1.0, 1.2) for i in range(3)]
    q = HJob("q", 2.2, 0.1)

    def narrow(job):
        return [(1, job.default_time)]

    def wide(job):
        return [(1, 2.0), (2, 1.05)] if job.job_id == "w" else [(1, job.default_time)]

    assert late_lower_bound_energy([w, *xs, q], 2, narrow) == 1
    assert late_lower_bound_energy([w, *xs, q], 2, wide) == 0


def test_counts_of_separate_overloads_are_not_added():
    burst = [HJob(n, t, 2.0) for n, t in (("a", 0.0), ("b", 0.0), ("c", 1.0), ("d", 1.0), ("e", 1.0), ("f", 2.0))]
    later = [HJob(f"{j.job_id}2", j.arrival + 100.0, 2.0) for j in burst]
    assert late_lower_bound_energy(burst + later, 2, one_size) == 1
    assert late_lower_bound_energy([], 2, one_size) == 0


def test_true_sizes_lists_every_allowed_size():
    job = HJob("j", 0.0, 2.0, 2, 3)
    assert true_sizes(job, 0.1) == [(2, pytest.approx(2.0 * (0.1 + 0.9 / 2))), (3, pytest.approx(2.0 * (0.1 + 0.9 / 3)))]


def test_no_simulated_policy_beats_the_bound():
    # Heavier than seed 001 §VI's scenario 2 (rate 5.5, Poisson, 60 s): overloads every few seconds.
    sc = Scenario("heavy", (JobType("short", 0.5, 1, 2, 0.7), JobType("long", 4.0 / 3.0, 1, 4, 0.3)),
                  rate=5.5, duration=60.0, strategy="completion time", spread=1.0)
    bounds = []
    for seed in (0, 1):
        jobs = [j for j in arrivals(sc, seed) if j.arrival + 1.0 < sc.duration]
        energy = late_lower_bound_energy(jobs, sc.pool, lambda j: true_sizes(j, sc.overhead))
        runs = late_lower_bound(jobs, sc.pool, lambda j: least_work(j, sc.overhead))
        bounds.append((energy, runs))
        for alg in ("fcfs_max", "fcfs_min", "fcfs_amap", "sjtf", "slack_amap"):
            assert max(energy, runs) <= run_hydrogen(sc, alg, seed).N_L
        assert max(energy, runs) <= run_hydrogen(sc, "managed_deadline", seed, learned=True).N_L
    # Seed 1 has an overload that only the energy bound proves.
    assert bounds[1][0] >= 1 and bounds[1][0] > bounds[1][1]
