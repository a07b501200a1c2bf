import math

import pytest

from irm_fpga.qos import JobProgress, QosJob
from irm_fpga.qos.throughput import (
    BrokerJob,
    ControllerState,
    admission_request,
    admit,
    allocate_not_fit,
    broker_max,
    controller_step,
    resource_broker,
    throughput_goal,
)


def tjob(goal=30.0, mn=0, mx=None):
    return QosJob("t", goal="throughput", throughput=goal, min_devices=mn, max_devices=mx)


def test_deadline_turned_into_time_varying_goal():
    j = QosJob("d", deadline=200.0, size=3000)
    assert throughput_goal(j, 0.0, 0) == pytest.approx(15.0)
    assert throughput_goal(j, 100.0, 2000) == pytest.approx(10.0)      # (3000-2000)/(200-100)
    assert throughput_goal(j, 250.0, 2000) == math.inf
    assert throughput_goal(j, 150.0, 3000) == 0.0


def test_controller_equations_1_to_4():
    s = ControllerState(last_time=0.0, last_actions=0, a_hat=0.1)
    s2 = controller_step(tjob(30.0), s, JobProgress(time=2.0, actions=40, allocation=2), alpha=0.5)
    assert s2.throughput == pytest.approx(20.0)                 # eq. 1: 40 actions / 2 s
    assert s2.a_hat == pytest.approx(0.5 * 2 / 20 + 0.5 * 0.1)  # eq. 2: 0.1
    assert s2.request == 3                                      # eq. 3: ceil(0.1 * 30)
    assert s2.performance == pytest.approx(20 / 30)             # eq. 4
    s3 = controller_step(tjob(30.0), s2, JobProgress(time=4.0, actions=100, allocation=3), alpha=0.25)
    assert s3.a_hat == pytest.approx(0.25 * 3 / 30 + 0.75 * 0.1)
    assert s3.performance == pytest.approx(1.0)


def test_controller_keeps_estimate_without_progress_and_clamps_to_min_max():
    s = ControllerState(last_time=0.0, last_actions=0, a_hat=0.5)
    s2 = controller_step(tjob(30.0, mn=1, mx=4), s, JobProgress(2.0, 0, 0))
    assert s2.a_hat == 0.5 and s2.request == 4                  # ceil(15) clamped to max 4
    s3 = controller_step(tjob(0.5, mn=2), s, JobProgress(2.0, 0, 0))
    assert s3.request == 2                                      # ceil(0.25) = 1 raised to min 2


def test_controller_request_for_a_goal_beyond_any_pool_is_the_max_not_an_overflow():
    s = ControllerState(last_time=0.0, last_actions=0, a_hat=2.0)
    s2 = controller_step(tjob(1e308, mx=6), s, JobProgress(2.0, 0, 0))   # a_hat * goal overflows to inf
    assert s2.request == 6
    assert controller_step(tjob(1e308), s, JobProgress(2.0, 0, 0), max_devices=8).request == 8


def test_broker_fit_branch_gives_slack_to_deadline_jobs_worst_first():
    jobs = [BrokerJob("thr", 2, 1.0, False), BrokerJob("d1", 1, 0.9, True), BrokerJob("d2", 0, 0.5, True)]
    alloc, fit = resource_broker(jobs, 8)
    assert fit
    # slack 5: paused d2 gets 1, then round-robin d2, d1, d2, d1; throughput job keeps its request
    assert alloc == {"thr": 2, "d1": 3, "d2": 3}


def test_broker_fit_respects_max():
    alloc, fit = resource_broker([BrokerJob("d1", 1, 0.5, True, max_devices=2), BrokerJob("d2", 1, 0.9, True)], 8)
    assert fit and alloc == {"d1": 2, "d2": 6}


def test_broker_not_fit_branch_algorithm_3():
    jobs = [BrokerJob("a", 3, 0.5, True), BrokerJob("b", 3, 1.2, False)]
    alloc, fit = resource_broker(jobs, 4)
    # entries a: .5 .375 .28125, b: 1.2 .9 .675 ascending -> a,a,a then b(.675)
    assert not fit and alloc == {"a": 3, "b": 1}
    assert allocate_not_fit([BrokerJob("a", 2, 1.0, True), BrokerJob("b", 2, 1.0, True)], 2) == {"a": 1, "b": 1}


def test_algorithm_3_grants_each_minimum_first():
    # a: min 3, doing well (rank 2.0); b: behind (rank 0.1) asking for 8 of 8. Without minimums b's entries
    # (0.1, 0.075, ...) all rank before a's first (2.0): a would get 0. With them a keeps its 3, b the other 5.
    a, b = BrokerJob("a", 3, 2.0, False, min_devices=3), BrokerJob("b", 8, 0.1, True, min_devices=1)
    alloc, fit = resource_broker([a, b], 8)
    assert not fit and alloc == {"a": 3, "b": 5}
    # Above its minimum a job's entries start at i = min: c's 3rd entry is 1.0 * 0.75^2 = 0.5625, ahead of d's
    # first (0.6); d's second (0.45) before c's 4th (0.42).
    c, d = BrokerJob("c", 4, 1.0, True, min_devices=2), BrokerJob("d", 4, 0.6, True)
    assert allocate_not_fit([c, d], 5) == {"c": 3, "d": 2}
    # Minimums that do not all fit: the best rank first.
    assert allocate_not_fit([BrokerJob("x", 4, 0.9, True, min_devices=3), BrokerJob("y", 4, 0.2, True, min_devices=3)],
                            4) == {"x": 1, "y": 3}


def test_a_job_without_an_estimate_keeps_its_devices_but_admission_may_take_all_but_its_minimum():
    # Nothing completed yet (no a_hat): the broker keeps what it holds (nothing measured to shrink it by)...
    s = controller_step(tjob(30.0, mn=2), ControllerState(last_time=0.0, last_actions=0), JobProgress(1.0, 0, 8))
    assert s.a_hat is None and s.request == 8
    # ... while admission counts its minimum, so a newcomer is not locked out by a job that has done nothing.
    assert admission_request(tjob(30.0, mn=2), s, 8) == 2
    assert admission_request(tjob(30.0), s, 8) == 1
    measured = controller_step(tjob(30.0), s, JobProgress(2.0, 20, 8))      # 20 actions/s on 8: a_hat 0.4
    assert admission_request(tjob(30.0), measured, 8) == measured.request == 12      # eq. 3: 0.4 x 30
    assert admission_request(tjob(30.0), None, 5) == 5                      # no controller at all: what it has


def test_broker_max_excludes_blacklisted_and_reserved():
    assert broker_max(8, blacklisted=2, reserved=1) == 5
    alloc, fit = resource_broker([BrokerJob("a", 6, 1.0, False)], broker_max(8, blacklisted=2))
    # 6 requested of the 6 that remain once 2 are blacklisted: the request fits (request <= max).
    assert fit and alloc == {"a": 6}
    assert sum(resource_broker([BrokerJob("a", 8, 1.0, False)], broker_max(8, 3))[0].values()) == 5


def test_admission_takes_free_devices_then_surplus_then_rejects():
    j = QosJob("n", goal="throughput", throughput=5.0, min_devices=2)
    assert admit(j, {"a": 3}, {"a": 3}, 8) == {"a": 3, "n": 5}
    assert admit(j, {"a": 6, "b": 2}, {"a": 3, "b": 2}, 8) == {"a": 4, "b": 2, "n": 2}
    assert admit(j, {"a": 6, "b": 2}, {"a": 6, "b": 2}, 8) is None


def test_broker_ranks_by_performance_over_priority():
    # Fit, slack 4 to deadline jobs: d1 at p 0.9 with priority 3 ranks 0.3, before d2 (p 0.5, priority 1).
    jobs = [BrokerJob("d1", 1, 0.9, True, priority=3.0), BrokerJob("d2", 1, 0.5, True)]
    alloc, fit = resource_broker(jobs, 5)
    assert fit and alloc == {"d1": 3, "d2": 2}                    # round-robin d1, d2, d1
    assert resource_broker([BrokerJob("d1", 1, 0.9, True), BrokerJob("d2", 1, 0.5, True)], 5)[0] == \
        {"d1": 2, "d2": 3}                                        # equal priorities: the paper's order
    # Not fit: entries a: 0.6/2 = .3, .225; b: .5, .375 -> a, a, then b.
    alloc, fit = resource_broker([BrokerJob("a", 2, 0.6, True, priority=2.0), BrokerJob("b", 2, 0.5, True)], 3)
    assert not fit and alloc == {"a": 2, "b": 1}
    # Equal ranks (two paused jobs, p = 0): the higher priority first.
    assert allocate_not_fit([BrokerJob("a", 1, 0.0, True), BrokerJob("b", 1, 0.0, True, priority=2.0)], 1) == \
        {"a": 0, "b": 1}
    assert BrokerJob("z", 1, 0.5, True, priority=0.0).rank == math.inf


def test_admission_takes_surplus_from_lower_priority_first():
    j = QosJob("n", goal="throughput", throughput=5.0, min_devices=2)
    alloc, req = {"lo": 3, "hi": 5}, {"lo": 1, "hi": 1}
    assert admit(j, alloc, req, 8) == {"lo": 3, "hi": 3, "n": 2}                        # largest surplus first
    assert admit(j, alloc, req, 8, priorities={"lo": 1.0, "hi": 3.0}) == {"lo": 1, "hi": 5, "n": 2}
