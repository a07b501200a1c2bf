import pytest

from irm_fpga.qos import QosJob, get_policy
from irm_fpga.qos.edf import edf_allocate


def job(jid, deadline, mn=1, mx=None, at=0.0):
    return QosJob(jid, deadline=deadline, size=100, min_devices=mn, max_devices=mx, submitted_at=at)


def test_all_allocable_devices_to_earliest_deadline_with_minimums():
    jobs = [job("c", 195), job("a", 50), job("b", 109)]
    assert edf_allocate(jobs, 8) == {"a": 6, "b": 1, "c": 1}


def test_max_constraint_passes_the_rest_to_the_next_deadline():
    jobs = [job("a", 50, mx=3), job("b", 109), job("c", 195)]
    assert edf_allocate(jobs, 8) == {"a": 3, "b": 4, "c": 1}


def test_submission_of_earlier_deadline_takes_over_and_later_one_does_not():
    base = [job("a", 50), job("b", 109)]
    assert edf_allocate(base, 8) == {"a": 7, "b": 1}
    assert edf_allocate(base + [job("x", 30)], 8) == {"x": 6, "a": 1, "b": 1}
    assert edf_allocate(base + [job("y", 300)], 8) == {"a": 6, "b": 1, "y": 1}


def test_minimums_that_do_not_fit_leave_latest_jobs_waiting():
    jobs = [job("a", 10, mn=3), job("b", 20, mn=3), job("c", 30, mn=3)]
    assert edf_allocate(jobs, 7) == {"a": 4, "b": 3, "c": 0}


def test_ties_broken_by_submission_then_id_and_throughput_jobs_rejected():
    assert edf_allocate([job("b", 50, at=1.0), job("a", 50, at=2.0)], 4) == {"b": 3, "a": 1}
    with pytest.raises(ValueError):
        edf_allocate([QosJob("t", goal="throughput", throughput=10.0)], 4)


def test_registry_selects_by_name_and_rejects_unknown():
    assert get_policy("edf") is edf_allocate
    with pytest.raises(KeyError):
        get_policy("round-robin")


def test_priority_breaks_deadline_ties_only():
    lo = QosJob("lo", deadline=50, size=100, min_devices=1, priority=1.0, submitted_at=0.0)
    hi = QosJob("hi", deadline=50, size=100, min_devices=1, priority=4.0, submitted_at=5.0)
    assert edf_allocate([lo, hi], 8) == {"hi": 7, "lo": 1}           # same deadline: the higher priority
    early = QosJob("early", deadline=40, size=100, min_devices=1, priority=0.5, submitted_at=9.0)
    assert edf_allocate([lo, hi, early], 8) == {"early": 6, "hi": 1, "lo": 1}   # an earlier deadline first
    # Minimums that do not fit: on a deadline tie the lower priority waits.
    a = QosJob("a", deadline=10, size=100, min_devices=3, priority=1.0)
    b = QosJob("b", deadline=10, size=100, min_devices=3, priority=2.0)
    assert edf_allocate([a, b], 4) == {"b": 4, "a": 0}
