"""irm_fpga.qos.sim.check_schedule: an exact check of a whole run's schedule, on hand-computed cases."""

import pytest

from irm_fpga.qos.hydrogen import HJob
from irm_fpga.qos.sim import check_schedule

# No serial part (overhead 0): a job takes default_time / devices.
JOBS = [HJob("a", 0.0, 2.0, 1, 2), HJob("b", 0.5, 1.0, 1, 1), HJob("c", 1.0, 1.0, 1, 1)]


def check(dispatches, pool=2, duration=10.0):
    return check_schedule(JOBS, dispatches, pool=pool, overhead=0.0, duration=duration)


def test_on_time_schedule_and_back_to_back_jobs():
    # a on 2 devices over [0, 1]; b waits until 1.0 (0.5 s), c starts at 1.0: both devices reused at once.
    assert check([("a", 0.0, 2), ("b", 1.0, 1), ("c", 1.0, 1)]) == []


def test_late_starts_and_jobs_never_started():
    # b waits 1.5 s; c never starts but arrived 9 s before the end: both late.
    assert check([("a", 0.0, 2), ("b", 2.0, 1)]) == ["b", "c"]
    # A job arriving within 1 s of the end need not start.
    assert check([("a", 0.0, 2), ("b", 1.0, 1)], duration=1.5) == []


@pytest.mark.parametrize("dispatches, fault", [
    ([("a", 0.0, 2), ("b", 0.5, 1)], "3 devices busy at 0.5"),
    ([("a", 0.0, 3)], "3 devices, allowed 1..2"),
    ([("b", 0.4, 1)], "before its arrival"),
    ([("x", 0.0, 1)], "x: unknown"),
    ([("b", 0.5, 1), ("b", 0.6, 1)], "b: dispatched twice"),
])
def test_faults_are_named(dispatches, fault):
    with pytest.raises(ValueError, match=fault):
        check(dispatches)
