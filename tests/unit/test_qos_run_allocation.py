"""irm_fpga.qos.sim.run_allocation: devices a job frees part-way through a tick are not used twice."""

import pytest

from bench.policies import ACTION_S, deadline_jobs, deadlines
from irm_fpga.qos.jobs import QosJob
from irm_fpga.qos.sim import run_allocation


@pytest.mark.parametrize("policy", ["edf", "throughput"])
def test_the_bench_deadline_runs_use_no_more_device_time_than_exists(policy):
    jobs = deadline_jobs()
    run = run_allocation(jobs, policy, action_time=ACTION_S, period=2.0, alpha=0.5)    # as bench.policies runs it
    # Without noise every action costs one device for ACTION_S: 6630 actions are 663 device-seconds, so no
    # schedule on 8 devices ends before 663 / 8 = 82.875 s.
    need = sum(j.size for j in jobs) * ACTION_S
    assert run.busy_device_seconds == pytest.approx(need, abs=1e-6)
    assert run.makespan >= need / run.devices - 1e-9
    assert run.utilisation <= 1.0 + 1e-9


def test_the_bench_reports_the_utilisation_it_measured():
    out = deadlines("edf")
    assert out["deadlines_met"] == out["of"] == 3
    assert out["utilisation"] <= 1.0
    # EDF keeps every device busy to the end on these jobs (min 1 each, 8 devices, 3 jobs).
    assert out["finish_s"]["j3"] == pytest.approx(82.875, abs=1e-3)


def test_edf_finish_times_match_a_schedule_computed_by_hand():
    # 4 devices, 0.1 s actions (1 device: 10 actions/s), ticks of 0.05 s. EDF gives each job its min (1),
    # the other 2 to a (earlier deadline): a 3 devices, b 1.
    #   a: 4 actions at 30/s -> ends at 4/30 = 0.13333 s, inside the tick [0.10, 0.15).
    #   b: by then 0.13333 s x 10/s = 1.33333 actions; then all 4 devices, 40/s: (7 - 1.33333) / 40 = 0.14167 s
    #      more -> ends at 0.13333 + 0.14167 = 0.275 s.
    # Busy: 3 x 0.13333 + 1 x 0.13333 + 4 x 0.14167 = 1.1 device-seconds (11 actions x 0.1 s) over 4 x 0.275:
    # utilisation exactly 1. Giving b the 4 devices for the whole tick from 0.10 would end it at 0.25 s.
    jobs = [QosJob("a", deadline=1.0, size=4, min_devices=1), QosJob("b", deadline=2.0, size=7, min_devices=1)]
    run = run_allocation(jobs, "edf", devices=4, action_time=0.1, tick=0.05)
    assert run.traces["a"].finished_at == pytest.approx(4 / 30, abs=1e-9)
    assert run.traces["b"].finished_at == pytest.approx(0.275, abs=1e-9)
    # b's 4 devices are its from a's end, not from the start of the tick a ended in.
    assert [n for _, n in run.traces["b"].allocations] == [1, 4]
    assert run.traces["b"].allocations[1][0] == pytest.approx(4 / 30, abs=1e-9)
    assert run.busy_device_seconds == pytest.approx(1.1, abs=1e-9)
    assert run.utilisation == pytest.approx(1.0, abs=1e-9)
