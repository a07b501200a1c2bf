"""A queued job says why it waits, also when the scheduler's last decision succeeded.

Before, `Job.waiting_reason` was set only while decisions failed (a broken plug-in, review 14) and was empty
otherwise: a tenant whose job sat queued behind others, or behind a pool too small for its minimum, or behind a
silent FPGA-server that stops every decision, saw STATE_QUEUED and nothing else. Now it is, in order: why no
decision can be made (a server holding running jobs' groups that does not answer; no device at all), a failed
decision's reason, else what the last decision saw (devices held and free, jobs left queued) and what keeps this
job back (its minimum, the policy holding jobs back, or jobs ahead of it).

The manager runs over the fake Orchestrator on a VirtualClock, with a built-in Hydrogen policy.
"""

from __future__ import annotations

import pytest

from harness.v1 import fpga_jobs_pb2 as jp
from irm_fpga.jobs import ACTIVE, QUEUED, JobManager
from tests.integration.fake_orchestrator import DEVICES, deadline, watched_manager

START = 1000.0


@pytest.fixture
def live(db_url):
    """(manager, orchestrator, published Job messages) for a Hydrogen policy, control period 1 s."""
    made = []

    def make(policy: str, **config):
        m, published = watched_manager(db_url, policy, START, **config)
        made.append(m)
        return m, m.orch, published

    yield make
    for m in made:
        m.stop()
        m.orch.db.dispose()


def register(m: JobManager, request_id: str, **kw) -> jp.Job:
    return m.register(jp.RegisterJobRequest(tenant="alice", request_id=request_id, design="sleep",
                                            **deadline(60.0, 30), **kw))


def reason(m: JobManager, job_id: str) -> str:
    return m.GetJob(jp.GetJobRequest(tenant="alice", job_id=job_id), None).waiting_reason


def test_a_job_queued_behind_running_ones_is_told_the_devices_held_and_its_minimum(live):
    m, _, _ = live("fcfs_max")
    a = register(m, "a", min_devices=1)                        # FCFSMax: all 8 devices
    b = register(m, "b", min_devices=2)
    assert m._job("alice", a.id).state == ACTIVE and m._job("alice", b.id).state == QUEUED
    assert reason(m, a.id) == ""                               # not queued
    assert reason(m, b.id) == (
        f"waiting for devices: at the last scheduling decision ({START:.3f}) {DEVICES} of the pool's {DEVICES} "
        f"device(s) were held by 1 running job(s), 0 free, and 1 job(s) stayed in the ready queue; this job needs "
        f"at least 2 device(s)")
    # ListJobs tells the same.
    listed = m.ListJobs(jp.ListJobsRequest(tenant="alice"), None).jobs
    assert {j.id: j.waiting_reason for j in listed}[b.id] == reason(m, b.id)


def test_a_minimum_above_the_pool_says_the_job_waits_for_the_pool_to_grow(live):
    m, orch, _ = live("fcfs_min")
    a = register(m, "a", min_devices=DEVICES)
    big = register(m, "big", min_devices=4)
    assert m._job("alice", big.id).state == QUEUED
    orch.capacity = {"s1": 2}                          # six devices blacklisted since big registered
    m.retire("alice", a.id)
    assert m._job("alice", big.id).state == QUEUED
    assert "0 of the pool's 2 device(s) were held by 0 running job(s), 2 free" in reason(m, big.id)
    assert reason(m, big.id).endswith("this job needs at least 4 device(s), more than the pool has now: it waits "
                                      "until the pool grows")


def test_no_device_at_all_is_a_stall_told_to_queued_jobs_and_cleared_when_devices_return(live):
    m, orch, published = live("fcfs_min")
    a = register(m, "a", min_devices=DEVICES)
    b = register(m, "b", min_devices=1)
    orch.capacity = {"s1": 0}                          # every device blacklisted
    m.retire("alice", a.id)
    assert m._job("alice", b.id).state == QUEUED
    assert reason(m, b.id).startswith("no devices: every FPGA-server is unreachable or all its devices are held")
    assert [j.waiting_reason for j in published if j.id == b.id][-1] == reason(m, b.id)     # streamed
    orch.capacity = {"s1": DEVICES}
    m.clock.advance(1.0)
    m.control_once()
    assert m._job("alice", b.id).state == ACTIVE
    c = register(m, "c", min_devices=DEVICES)          # queued behind b, told so: no stall any more
    assert reason(m, c.id).startswith("waiting for devices:")


def test_a_silent_server_holding_running_jobs_stops_decisions_and_queued_jobs_are_told(live):
    m, orch, published = live("fcfs_min", silent_server_s=30.0)
    a = register(m, "a", min_devices=DEVICES)
    b = register(m, "b", min_devices=1)
    assert m._job("alice", a.id).state == ACTIVE and m._job("alice", b.id).state == QUEUED
    orch.capacity = {}                                         # s1, holding a's group, does not answer
    m.clock.advance(1.0)
    m.control_once()
    told = reason(m, b.id)
    assert told.startswith("no scheduling decision is made while 1 FPGA-server(s) holding running jobs' groups "
                           "do not answer")
    assert [j.waiting_reason for j in published if j.id == b.id][-1] == told
    orch.capacity = {"s1": DEVICES}                            # it answers again: decisions resume
    m.clock.advance(1.0)
    m.control_once()
    assert reason(m, b.id).startswith("waiting for devices:") and "needs at least 1 device(s)" in reason(m, b.id)
    assert [j.waiting_reason for j in published if j.id == b.id][-1] == reason(m, b.id)   # the stall's withdrawn


def holds_everything(queue, available, window, cost, *, now):
    """A plug-in algorithm that starts nothing (as a policy may, waiting for devices about to free)."""
    return []


def test_a_job_that_fits_the_free_devices_but_waits_is_told_the_policy_left_it(live):
    m, _, _ = live(f"{__name__}:holds_everything")
    a = register(m, "a", min_devices=2)
    assert reason(m, a.id) == (
        f"waiting for devices: at the last scheduling decision ({START:.3f}) 0 of the pool's {DEVICES} device(s) "
        f"were held by 0 running job(s), {DEVICES} free, and 1 job(s) stayed in the ready queue; the policy "
        f"({__name__}:holds_everything) left queued jobs that the free devices could start (it may hold them for "
        f"devices of running jobs about to end)")


def test_a_job_beyond_the_window_is_told_so(live):
    m, _, _ = live("fcfs_min", window=1)
    register(m, "b", min_devices=4)
    c = register(m, "c", min_devices=DEVICES)          # heads the queue, the window of 1: d is not looked at
    m.clock.advance(0.001)                             # (jobs registered at one instant are taken in id order)
    d = register(m, "d", min_devices=1)
    assert m._job("alice", d.id).state == QUEUED
    assert "(1000.001) 4 of the pool's 8 device(s) were held by 1 running job(s), 4 free, and 2 job(s)" in \
        reason(m, d.id)
    assert reason(m, d.id).endswith("it is not among the first 1 queued jobs that the policy looks at (its window)")
    assert reason(m, c.id).endswith(f"this job needs at least {DEVICES} device(s)")
