"""Hydrogen policies live on the FPGA IRM (issue 5, seed 001 §IV): a ready queue, dispatches, the elastic pool.

The job manager over the fake Orchestrator (`tests.integration.fake_orchestrator`: groups
in the real database, SQLite and PostgreSQL; virtual time), plus the Job
API's loose ends found in review (duplicate registrations, wide counters,
unreachable servers, refused registrations that must not disturb others).
`test_fpga_jobs.py` runs a Hydrogen policy against real FPGA-server processes.
"""

from __future__ import annotations

import threading
import time

import pytest
from sqlalchemy import select

from harness.v1 import fpga_jobs_pb2 as jp
from irm_fpga.job_models import FpgaJob
from irm_fpga.jobs import QUEUED, RETIRED, WAKE_MARGIN_S, JobManager, JobsConfig
from irm_fpga.models import Group
from services.errors import FailedPrecondition, InvalidArgument, ResourceExhausted, Unavailable
from tests.conftest import eventually
from tests.integration.fake_orchestrator import DEVICES, deadline

ACTIVE = "active"


def live_groups(irm) -> list[Group]:
    with irm.orch.db.read() as s:
        return list(s.scalars(select(Group).where(Group.deleted.is_(False))))


# -- the ready queue -------------------------------------------------------------------------------


def test_fcfs_min_queues_what_does_not_fit_and_dispatches_it_when_devices_come_back(irm_factory):
    irm = irm_factory("fcfs_min")
    a = irm.register("a", min_devices=3, **deadline(60.0, 30))
    b = irm.register("b", min_devices=3, **deadline(60.0, 30))
    c = irm.register("c", min_devices=3, **deadline(60.0, 30))
    # First come, first served at the minimum: a and b start on 3 devices each; 2 are left, c waits.
    assert [(irm.job(j.id).state, irm.job(j.id).devices) for j in (a, b, c)] == \
        [(ACTIVE, 3), (ACTIVE, 3), (QUEUED, 0)]
    assert irm.job(c.id).group_id == "" and sorted(g.size for g in live_groups(irm)) == [3, 3]
    assert irm.orch.size_of(irm.job(a.id).group_id) == 3
    proto = irm.manager.to_proto(irm.job(c.id))
    assert proto.state == jp.Job.STATE_QUEUED and proto.dispatched_at == 0.0 and proto.policy == "fcfs_min"
    with pytest.raises(FailedPrecondition, match="queued"):
        irm.manager.report("alice", c.id, 1)          # no devices yet: nothing can have run

    irm.clock.advance(4.0)
    irm.complete(irm.job(a.id), 30)                    # a's size is done: it retires, c gets its devices
    irm.manager.control_once()
    assert irm.job(a.id).state == RETIRED
    job_c = irm.job(c.id)
    assert (job_c.state, job_c.devices, job_c.allocations) == (ACTIVE, 3, [[1004.0, 3]])
    assert irm.manager.to_proto(job_c).dispatched_at == 1004.0
    assert irm.orch.size_of(job_c.group_id) == 3


def test_fcfs_amap_gives_the_head_of_the_queue_every_free_device_up_to_its_max(irm_factory):
    irm = irm_factory("fcfs_amap")
    a = irm.register("a", max_devices=5, **deadline(60.0, 30))
    b = irm.register("b", **deadline(60.0, 30))
    assert (irm.job(a.id).devices, irm.job(b.id).devices) == (5, 3)
    c = irm.register("c", **deadline(60.0, 30))
    assert irm.job(c.id).state == QUEUED


def test_a_queued_job_retires_without_a_group_and_throughput_goals_are_refused(irm_factory):
    irm = irm_factory("fcfs_max")
    a = irm.register("a", **deadline(60.0, 30))            # max 0: the whole pool
    q = irm.register("q", **deadline(60.0, 30))
    assert irm.job(a.id).devices == DEVICES and irm.job(q.id).state == QUEUED
    gone = irm.manager.retire("alice", q.id)
    assert (gone.state, gone.devices, gone.allocations, gone.group_id) == (RETIRED, 0, [], "")
    assert len(live_groups(irm)) == 1
    with pytest.raises(InvalidArgument) as e:
        irm.register("t", throughput=jp.ThroughputGoal(actions_per_s=5.0))
    assert "deadline goals only" in str(e.value)
    with pytest.raises(InvalidArgument, match="action_seconds"):
        irm.register("neg", action_seconds=-1.0, **deadline(60.0, 30))


# -- the managed modes: elastic pool, learned cost model ---------------------------------------------


def test_managed_deadline_shrinks_an_easy_pool_grows_it_for_a_job_that_would_miss_and_learns_times(irm_factory):
    irm = irm_factory("managed_deadline")
    assert irm.manager.pool_devices() == DEVICES        # before any decision: every usable device
    # 10 actions of 1 s: 10 s on one device, its JLO 100 s: easily met, so Algorithm 3 gives a device back.
    a = irm.register("a", action_seconds=1.0, **deadline(100.0, 10))
    assert irm.manager.pool_devices() == DEVICES - 1
    assert irm.job(a.id).devices == DEVICES - 1          # the whole (smaller) pool: the soonest completion
    # b (10 s on one device) must end 2.5 s after it arrives; on 7 devices it would wait for a and miss:
    # the elasticity manager grows the pool (before dispatching) to its most.
    b = irm.register("b", action_seconds=1.0, **deadline(2.5, 10))
    assert irm.manager.pool_devices() == DEVICES
    assert irm.job(b.id).state in (ACTIVE, QUEUED)

    irm.clock.advance(2.0)
    irm.complete(irm.job(a.id), 10)
    irm.manager.control_once()
    assert irm.job(a.id).state == RETIRED and irm.job(b.id).state == ACTIVE
    # The learned cost model saw a's run (7 devices, 2 s for 10 s of work) and sees it again after a restart.
    seen = irm.manager.cost.observed("sleep", "alice")
    assert seen == {DEVICES - 1: (1, pytest.approx(0.2))}
    irm.restart()
    assert irm.manager.cost.observed("sleep", "alice") == seen


def test_a_running_hydrogen_job_keeps_its_progress_across_a_restart(irm_factory):
    irm = irm_factory("fcfs_min")
    a = irm.register("a", **deadline(60.0, 100))
    irm.clock.advance(1.0)
    irm.complete(irm.job(a.id), 40)
    irm.manager.control_once()
    irm.restart()
    irm.clock.advance(1.0)
    irm.complete(irm.job(a.id), 10)
    irm.manager.control_once()
    assert irm.job(a.id).observed_actions == 50            # the server's counter (50) not counted twice


def test_a_policy_that_cannot_manage_the_jobs_left_by_another_refuses_to_start(irm_factory):
    irm = irm_factory("fcfs_min", pool_max=3)
    irm.register("a", min_devices=3, **deadline(60.0, 30))
    q = irm.register("q", **deadline(60.0, 30))
    assert irm.job(q.id).state == QUEUED                    # pool_max 3: a holds all of it
    irm.policy = "edf"              # the queued job, and a's group that fcfs_min fixed at 3 devices
    with pytest.raises(ValueError, match=f"cannot manage 2 job.*{q.id}"):
        irm.restart()


def test_unknown_hydrogen_settings_fail_at_start_up(irm_factory):
    irm = irm_factory("edf")
    for cfg, match in [(JobsConfig(policy="fcfs_fastest"), "unknown policy 'fcfs_fastest'"),
                       (JobsConfig(policy="fcfs_min", pool_min=3, pool_max=2), "pool_min <= pool_max"),
                       (JobsConfig(policy="managed_deadline", window=0), "window >= 1"),
                       (JobsConfig(policy="managed_lookahead", lookahead_budget_s=-1.0), "lookahead_budget_s"),
                       # A period beyond a day is a typo; 1e10 s overflowed the control thread's wait and killed it.
                       (JobsConfig(policy="fcfs_min", control_period_s=1e10), "at most 86400 seconds"),
                       (JobsConfig(policy="edf", control_period_s=float("nan")), "control_period_s must be")]:
        with pytest.raises(ValueError, match=match):
            JobManager(irm.orch, cfg)
    # The live lookahead's search budget reaches the scheduler (the simulator's has none).
    assert JobManager(irm.orch, JobsConfig(policy="managed_lookahead", lookahead_budget_s=0.1)).scheduler.budget_s == 0.1


# -- the Job API's loose ends ---------------------------------------------------------------------------


def test_concurrent_duplicate_registrations_make_one_job_and_one_group(irm_factory):
    irm = irm_factory("edf")
    first = irm.register("first", **deadline(100.0, 10))
    barrier, out, errors = threading.Barrier(6), [], []

    def register() -> None:
        barrier.wait()
        try:
            out.append(irm.register("dup", **deadline(30.0, 10)).id)
        except Exception as e:  # noqa: BLE001 - any failure fails the test below
            errors.append(e)

    threads = [threading.Thread(target=register) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and len(set(out)) == 1
    assert len(live_groups(irm)) == 2
    with irm.orch.db.read() as s:
        assert len(list(s.scalars(select(FpgaJob)))) == 2
    assert irm.job(first.id).devices + irm.job(out[0]).devices == DEVICES


def test_action_counts_beyond_32_bits_round_trip(irm_factory):
    irm = irm_factory("edf")
    big = irm.register("big", **deadline(100.0, 2**40))
    assert irm.job(big.id).size_actions == 2**40
    assert irm.manager.report("alice", big.id, 2**35).reported_actions == 2**35


def test_an_absurd_throughput_goal_is_refused(irm_factory):
    irm = irm_factory("throughput")
    with pytest.raises(InvalidArgument, match="at most"):
        irm.register("t", throughput=jp.ThroughputGoal(actions_per_s=1e308))


def test_unreachable_servers_are_unavailable_not_bad_input(irm_factory):
    irm = irm_factory("edf")
    a = irm.register("a", **deadline(100.0, 10))
    irm.orch._free_total_capacity = lambda: {}
    with pytest.raises(Unavailable, match="no FPGA-server can be reached"):
        irm.register("b", **deadline(100.0, 10))
    # A retry of a registration that went through gets its job, whatever the servers are doing now.
    assert irm.register("a", **deadline(100.0, 10)).id == a.id
    irm.orch._free_total_capacity = lambda: {"s1": 0}     # every device blacklisted
    assert irm.register("a", **deadline(100.0, 10)).id == a.id
    # (The same id with another request, min_devices=2 say, is INVALID_ARGUMENT on request_id: see
    # test_fpga_jobs_review13_fixes.)


def test_an_edf_registration_that_cannot_fit_leaves_the_other_jobs_untouched(irm_factory):
    irm = irm_factory("edf")
    a = irm.register("a", **deadline(100.0, 10))
    assert irm.job(a.id).devices == DEVICES
    with pytest.raises(ResourceExhausted, match=rf"minimums \(1 device\(s\)\) need {DEVICES + 1} device\(s\)"):
        irm.register("b", min_devices=DEVICES, **deadline(50.0, 10))
    assert irm.job(a.id).allocations == [[1000.0, DEVICES]]
    assert [g.size for g in live_groups(irm)] == [DEVICES]


# -- found in review of the live schedulers ---------------------------------------------------------------


def test_a_minimum_above_the_pool_max_is_refused_not_queued_forever(irm_factory):
    irm = irm_factory("fcfs_min", pool_max=3)
    with pytest.raises(InvalidArgument, match="jobs_pool_max"):
        irm.register("wide", min_devices=5, **deadline(60.0, 30))


def test_the_pool_grows_back_for_a_queued_job_that_does_not_fit_it(irm_factory):
    irm = irm_factory("managed_deadline")
    a = irm.register("a", action_seconds=1.0, **deadline(100.0, 10))
    assert irm.manager.pool_devices() == DEVICES - 1          # shrunk: a's JLO is easy
    b = irm.register("b", min_devices=DEVICES, action_seconds=1.0, **deadline(1000.0, 10))
    irm.clock.advance(2.0)
    irm.complete(irm.job(a.id), 10)
    for _ in range(3):                                        # a retires; b cannot start on 7 devices
        irm.clock.advance(1.0)
        irm.manager.control_once()
    job_b = irm.job(b.id)
    assert (job_b.state, job_b.devices) == (ACTIVE, DEVICES)
    assert irm.manager.pool_devices() == DEVICES


def test_a_pool_min_above_what_is_left_still_dispatches(irm_factory):
    irm = irm_factory("managed_lookahead", pool_min=10)      # more than the 8 devices there are
    a = irm.register("a", action_seconds=0.1, **deadline(60.0, 10))
    assert irm.job(a.id).state == ACTIVE and irm.manager.pool_devices() == DEVICES


def test_the_cost_model_learns_only_from_runs_on_one_fixed_size(irm_factory):
    irm = irm_factory("edf")
    a = irm.register("a", **deadline(100.0, 10))             # 8 devices, then 1 once b arrives
    irm.register("b", **deadline(50.0, 1000))
    irm.clock.advance(5.0)
    irm.complete(irm.job(a.id), 10)
    irm.manager.control_once()
    assert irm.job(a.id).state == RETIRED
    irm.policy = "managed_deadline"
    irm.restart()                                             # b (a deadline job under EDF) carries on
    assert irm.manager.cost.observed("sleep", "alice") == {}           # a's run was resized: not one size's time


def test_edf_refuses_to_start_over_groups_a_hydrogen_scheduler_fixed(irm_factory):
    irm = irm_factory("fcfs_max")
    a = irm.register("a", **deadline(60.0, 30))
    irm.policy = "edf"
    with pytest.raises(ValueError, match=f"cannot manage 1 job.*{a.id}"):
        irm.restart()


def test_an_fpga_irm_refused_for_its_policy_registers_nowhere_first(irm_factory, db_url, unused_address):
    irm = irm_factory("fcfs_max")
    a = irm.register("a", **deadline(60.0, 30))
    irm.close()
    from irm_fpga.orchestrator import OrchestratorConfig, component

    comp = component(OrchestratorConfig(database=db_url, servers=[unused_address()], crs_address=unused_address(),
                                        jobs_policy="edf", reconcile_interval_s=0))
    comp.extra["port"] = 1
    orch = comp.extra["orchestrator"]
    try:
        with pytest.raises(ValueError, match=f"cannot manage 1 job.*{a.id}"):
            comp.start()
        # Refused before it offered anything: no registration with the CRS under way, no rounds on its servers.
        assert orch.memberships == []
    finally:
        comp.stop()


def test_list_jobs_active_only_includes_the_queue(irm_factory):
    irm = irm_factory("fcfs_max")
    a = irm.register("a", **deadline(60.0, 30))
    q = irm.register("q", **deadline(60.0, 30))
    listed = irm.manager.ListJobs(jp.ListJobsRequest(tenant="alice", active_only=True), None)
    assert {j.id: j.state for j in listed.jobs} == {a.id: jp.Job.STATE_ACTIVE, q.id: jp.Job.STATE_QUEUED}
    assert listed.pool_devices == DEVICES


def test_list_jobs_pages_retired_jobs_included(irm_factory):
    from services.client import all_pages

    irm = irm_factory("fcfs_min")
    made = []
    for i in range(5):
        made.append(irm.register(f"j{i}", **deadline(60.0, 30)).id)
        irm.clock.advance(0.5)
        irm.manager.retire("alice", made[-1])       # history grows with every retired job: a list must page
    first = irm.manager.ListJobs(jp.ListJobsRequest(tenant="alice", page_size=2), None)
    assert [j.id for j in first.jobs] == made[:2] and first.next_page_token
    whole = all_pages(lambda r, timeout: irm.manager.ListJobs(r, None), jp.ListJobsRequest(tenant="alice",
                                                                                          page_size=2), "jobs")
    assert [j.id for j in whole.jobs] == made and whole.pool_devices == DEVICES and whole.next_page_token == ""
    with pytest.raises(InvalidArgument):
        irm.manager.ListJobs(jp.ListJobsRequest(tenant="alice", page_token="forged"), None)


def test_a_single_algorithm_uses_devices_that_come_back(irm_factory):
    # fcfs_min has no elasticity manager: a decision taken while half the devices could not be counted (a server
    # timed out, say) must not cap its pool once they are back.
    irm = irm_factory("fcfs_min")
    real = irm.orch._free_total_capacity
    irm.orch._free_total_capacity = lambda: {name: n // 2 for name, n in real().items()}
    irm.register("a", min_devices=3, **deadline(60.0, 30))
    irm.orch._free_total_capacity = real
    b = irm.register("b", min_devices=3, **deadline(60.0, 30))
    assert irm.job(b.id).state == "active" and irm.manager.pool_devices() == DEVICES


def test_the_late_after_setting_reaches_the_slack_orders(irm_factory):
    # Under a 10 s start bound, jobs that waited 1.5-2 s are on time: slack_min starts the earliest start deadline
    # (a), not the higher priority (b), which is how it orders jobs that are already late (the 1 s default).
    irm = irm_factory("slack_min", late_after_s=10.0)
    irm.register("r1", min_devices=DEVICES - 1, max_devices=DEVICES - 1, **deadline(600.0, 30))
    r2 = irm.register("r2", min_devices=1, max_devices=1, **deadline(600.0, 30))
    a = irm.register("a", max_devices=1, **deadline(60.0, 30))
    irm.clock.advance(0.5)
    b = irm.register("b", max_devices=1, priority=5.0, **deadline(60.0, 30))
    irm.clock.advance(1.5)
    irm.manager.retire("alice", r2.id)
    assert (irm.job(a.id).state, irm.job(b.id).state) == ("active", "queued")


def test_a_dispatch_the_database_failed_to_record_leaves_no_group_and_is_retried(irm_factory):
    from sqlalchemy.exc import OperationalError

    irm = irm_factory("fcfs_min")
    real, failures = irm.manager._update, [1]

    def update(job_id, **fields):          # the database drops the connection once, as the dispatch is recorded
        if fields.get("state") == "active" and failures[0]:
            failures[0] -= 1
            raise OperationalError("UPDATE fpga_jobs", {}, Exception("connection lost"))
        return real(job_id, **fields)

    irm.manager._update = update
    with pytest.raises(OperationalError):
        irm.register("a", min_devices=DEVICES, **deadline(60.0, 30))
    with irm.orch.db.read() as s:
        job = s.scalar(select(FpgaJob).where(FpgaJob.request_id == "a"))
        live = list(s.scalars(select(Group).where(Group.deleted.is_(False))))
    assert job.state == QUEUED and live == []            # its devices are not held by a group without a job
    irm.clock.advance(1.0)
    irm.manager.control_once()                            # the next decision dispatches it
    with irm.orch.db.read() as s:
        live = list(s.scalars(select(Group).where(Group.deleted.is_(False))))
    assert irm.job(job.id).state == "active" and [g.id for g in live] == [irm.job(job.id).group_id]


def test_measured_runs_outweigh_each_tenants_guess_of_an_actions_time(irm_factory):
    from types import SimpleNamespace

    irm = irm_factory("fcfs_amap")
    # 20 actions take 2 s on 8 devices and 4 s on 4: 0.1 s and 0.2 s per action, whatever the jobs guessed
    # (a: 0.1 s per action, b: the 1 s default).
    for rid, guess, devices, took in [("a", 0.1, DEVICES, 2.0), ("b", 0.0, 4, 4.0)]:
        job = irm.register(rid, action_seconds=guess, min_devices=devices, max_devices=devices, **deadline(100.0, 20))
        irm.clock.advance(took)
        irm.complete(irm.job(job.id), 20)
        irm.manager.control_once()
        assert irm.job(job.id).state == RETIRED
    assert irm.manager.cost.observed("sleep", "alice") == {DEVICES: (1, pytest.approx(0.1)), 4: (1, pytest.approx(0.2))}
    # So two 20-action jobs of the design are predicted alike (4 s on 4 devices) however far off their guesses.
    row = SimpleNamespace(id="x", registered_at=0.0, size_actions=20, min_devices=1, max_devices=0, priority=1.0,
                          design="sleep", deadline_s=100.0, tenant="alice")
    low, high = (irm.manager._hjob(SimpleNamespace(**vars(row), action_seconds=g), DEVICES) for g in (1e-3, 1e3))
    assert irm.manager.cost(low, 4) == pytest.approx(4.0) == irm.manager.cost(high, 4)
    with pytest.raises(InvalidArgument, match="action_seconds"):
        irm.register("tiny", action_seconds=1e-320, **deadline(100.0, 20))


def test_a_group_left_by_a_dispatch_that_failed_twice_over_is_dropped_by_the_next_attempt(irm_factory):
    from sqlalchemy.exc import OperationalError

    irm = irm_factory("fcfs_min")
    real_update, real_delete = irm.manager._update, irm.orch.delete

    def update(job_id, **fields):          # recording the dispatch fails, and so does dropping its group
        if fields.get("state") == "active":
            raise OperationalError("UPDATE fpga_jobs", {}, Exception("connection lost"))
        return real_update(job_id, **fields)

    def delete(g):
        raise OperationalError("UPDATE fpga_groups", {}, Exception("connection lost"))

    irm.manager._update, irm.orch.delete = update, delete
    with pytest.raises(OperationalError):
        irm.register("a", min_devices=2, max_devices=2, **deadline(60.0, 30))
    (stray,) = live_groups(irm)                           # its drop failed too
    irm.manager._update, irm.orch.delete = real_update, real_delete
    irm.clock.advance(1.0)
    irm.manager.control_once()
    # The next attempt drops the stray (a half-dropped group may have lost its devices: never reused) and
    # makes the job its own group.
    (job,) = irm.manager._active()
    assert [g.id for g in live_groups(irm)] == [job.group_id] and job.group_id != stray.id
    irm.manager.retire("alice", job.id)
    assert live_groups(irm) == []


def test_retiring_a_job_leaves_the_tenants_other_groups_alone(irm_factory):
    irm = irm_factory("fcfs_min")
    job = irm.register("a", **deadline(60.0, 30))
    # The tenant's own groups, named much like the job's (SQLite's LIKE would match the first one).
    mine = [irm.orch.create_group("alice", rid, "sleep", 1) for rid in (f"JOB:{job.id}:mine", f"job:{job.id}x")]
    irm.manager.retire("alice", job.id)
    assert sorted(g.id for g in live_groups(irm)) == sorted(g.id for g in mine)


def test_watchers_hear_of_changes_not_of_every_periodic_write(irm_factory):
    irm = irm_factory("fcfs_min")
    job = irm.register("a", **deadline(60.0, 30))
    events = []
    irm.manager.watchers.has_subscribers = lambda: True
    irm.manager.watchers.publish = events.extend
    for _ in range(3):                                   # periods without progress: nothing to tell
        irm.clock.advance(1.0)
        irm.manager.control_once()
    assert events == []
    irm.complete(irm.job(job.id), 5)
    irm.clock.advance(1.0)
    irm.manager.control_once()
    assert events and events[-1].completed_actions == 5


# -- a scheduling algorithm plugged in by name (irm_fpga.qos.plugins) ----------------------------------------

PLUG_IN = "examples.qos.longest_first:longest_first"


def test_a_plugged_in_algorithm_runs_live(irm_factory):
    irm = irm_factory(PLUG_IN)
    first = irm.register("first", min_devices=DEVICES, **deadline(60.0, 30))
    short = irm.register("short", **deadline(60.0, 10))
    long = irm.register("long", **deadline(60.0, 500))
    assert irm.job(first.id).state == ACTIVE and irm.job(short.id).state == irm.job(long.id).state == QUEUED
    assert irm.manager.to_proto(irm.job(long.id)).policy == PLUG_IN
    irm.clock.advance(3.0)
    irm.complete(irm.job(first.id), 30)
    irm.manager.control_once()
    # The plug-in's rule, not arrival order: the long job (500 actions) starts first, each on its minimum.
    assert irm.job(long.id).allocations == [[1003.0, 1]] and irm.job(short.id).allocations == [[1003.0, 1]]
    # The same configuration comes back after a restart (the jobs it dispatched are its own).
    irm.restart()
    assert irm.manager.scheduler.algorithm == PLUG_IN


def test_a_plug_in_that_over_allocates_leaves_the_queue_waiting_and_the_service_up(irm_factory, caplog):
    irm = irm_factory("tests.unit.test_qos_plugins:greedy")
    a = irm.register("a", **deadline(60.0, 30))        # alone, on its max (all devices): that fits
    assert irm.job(a.id).devices == DEVICES
    b = irm.register("b", **deadline(60.0, 30))        # greedy starts b on its max too, with none free
    assert irm.job(b.id).state == QUEUED and len(live_groups(irm)) == 1
    assert f"started jobs on {DEVICES} devices; 0 are free" in caplog.text
    irm.manager.retire("alice", a.id)                   # the retirement's decision: b fits now
    assert (irm.job(b.id).state, irm.job(b.id).devices) == (ACTIVE, DEVICES)


def test_a_plug_in_that_loops_holds_no_request_up_and_the_queue_moves_once_it_answers(irm_factory, caplog):
    # The plug-in loops whenever two jobs are queued. In the manager's process that held its lock (and every
    # registration, retirement and dispatch) for good; in its worker it is stopped after plugin_timeout_s.
    irm = irm_factory("tests.unit.test_qos_plugin_worker:loops_with_two_queued", plugin_timeout_s=0.5)
    a = irm.register("a", min_devices=DEVICES, **deadline(60.0, 30))      # alone: started on every device
    assert irm.job(a.id).state == ACTIVE
    b = irm.register("b", min_devices=DEVICES, **deadline(60.0, 30))      # queued: no device is free
    t0 = time.monotonic()
    c = irm.register("c", **deadline(60.0, 30))                           # two queued: the plug-in loops
    assert time.monotonic() - t0 < 10.0
    assert irm.job(b.id).state == irm.job(c.id).state == QUEUED
    assert "did not answer within 0.5 s" in caplog.text
    irm.manager.retire("alice", b.id)             # one queued: the plug-in would answer, once it is back
    assert irm.job(c.id).state == QUEUED         # (and no device is free: a holds them all)
    eventually(lambda: irm.manager._plugin.pid, what="the plug-in's replacement worker")
    irm.clock.advance(3.0)
    irm.complete(irm.job(a.id), 30)
    irm.manager.control_once()
    assert (irm.job(c.id).state, irm.job(c.id).devices) == (ACTIVE, 1)


def test_a_plug_in_that_cannot_be_loaded_stops_the_start_up(irm_factory):
    irm = irm_factory("edf")
    for name, match in [("no.such.module:f", "cannot load 'f' from module 'no.such.module'"),
                        ("tests.unit.test_qos_plugins:wrong_arity", "must accept"),
                        ("no_such_policy", "unknown policy 'no_such_policy'.*package.module:function")]:
        with pytest.raises(ValueError, match=match):
            JobManager(irm.orch, JobsConfig(policy=name))


# -- found in review of the live Hydrogen policies (session 8) ----------------------------------------------


def test_the_papers_managed_pool_moves_on_events_only_and_once_per_instant(irm_factory, monkeypatch):
    from irm_fpga.qos import dispatch

    irm = irm_factory("managed", late_after_s=100.0)     # no queued job turns late in this test
    jobs = [irm.register(f"j{i}", min_devices=4, max_devices=4, action_seconds=1.0, **deadline(1000.0, 40))
            for i in range(4)]
    calls: list[float] = []
    real = dispatch.decide
    monkeypatch.setattr(dispatch, "decide", lambda *a, **k: calls.append(k["now"]) or real(*a, **k))
    pools = []
    for _ in range(5):                     # nothing arrives, nothing ends: Algorithm 3 is not re-run
        irm.clock.advance(1.0)
        irm.manager.control_once()
        pools.append(irm.manager.pool_devices())
    assert calls == [] and len(set(pools)) == 1
    running = [j for j in jobs if irm.job(j.id).state == ACTIVE]
    irm.complete(irm.job(running[0].id), 40)
    irm.manager.control_once()             # a retirement: one decision at this instant, not two
    assert calls == [irm.clock.now()]


def test_the_elastic_pool_survives_a_restart_under_the_same_policy_only(irm_factory):
    irm = irm_factory("managed_deadline")
    irm.register("a", action_seconds=1.0, **deadline(100.0, 10))
    assert irm.manager.pool_devices() == DEVICES - 1        # shrunk: a's JLO is easy
    irm.restart()
    assert irm.manager.pool_devices() == DEVICES - 1
    irm.policy = "managed_lookahead"                         # another policy sized nothing yet: every device
    irm.restart()
    assert irm.manager.pool_devices() == DEVICES


def test_the_elastic_pool_survives_a_restart_under_another_name_of_the_same_policy(irm_factory):
    irm = irm_factory("managed")
    irm.register("a", action_seconds=1.0, **deadline(100.0, 10))
    irm.clock.advance(5.0)
    irm.register("b", action_seconds=1.0, **deadline(100.0, 10))
    pool = irm.manager.pool_devices()
    assert pool < DEVICES                                    # Algorithm 3 shrank it
    irm.policy = "managed_paper"
    irm.restart()
    assert irm.manager.pool_devices() == pool


def test_a_pool_cut_for_a_while_is_not_kept_as_the_elasticity_managers(irm_factory):
    irm = irm_factory("managed_deadline")
    irm.orch.capacity = {"s1": 2}          # for one decision 2 devices are usable (6 blacklisted, then back)
    irm.register("a", action_seconds=1.0, **deadline(2.5, 10))     # needs more than 2: nothing to shrink
    irm.orch.capacity = {"s1": DEVICES}
    assert irm.manager.pool_devices() == DEVICES


def test_no_decision_while_a_server_holding_job_groups_is_silent(irm_factory):
    irm = irm_factory("managed_deadline")
    a = irm.register("a", min_devices=1, max_devices=1, action_seconds=100.0, **deadline(1000.0, 10))
    assert irm.job(a.id).state == ACTIVE
    pool = irm.manager.pool_devices()
    irm.orch.servers = {"s1": irm.server, "s2": irm.server}
    irm.orch.capacity = {"s2": 2}          # s1, holding a's group, does not answer; s2 has 2 devices
    b = irm.register("b", min_devices=1, max_devices=1, action_seconds=1.0, **deadline(1000.0, 10))
    assert irm.job(b.id).state == QUEUED   # the pool cannot be counted: no decision, the pool not cut to 2
    assert irm.manager._pool_size in (None, pool)
    with pytest.raises(Unavailable, match="s1 did not: retry later"):
        irm.register("wide", min_devices=4, **deadline(1000.0, 10))     # may fit once s1 is back
    irm.orch.capacity = {"s1": DEVICES, "s2": 2}
    irm.clock.advance(1.0)
    irm.manager.control_once()
    assert irm.job(b.id).state == ACTIVE


def test_a_server_silent_for_longer_than_the_bound_is_taken_as_gone(irm_factory):
    irm = irm_factory("fcfs_min", silent_server_s=30.0)
    a = irm.register("a", min_devices=1, max_devices=1, action_seconds=100.0, **deadline(1000.0, 10))
    irm.orch.servers = {"s1": irm.server, "s2": irm.server}
    irm.orch.capacity = {"s2": 2}          # s1, holding a's group, stops answering for good
    b = irm.register("b", min_devices=1, max_devices=1, action_seconds=1.0, **deadline(1000.0, 10))
    irm.clock.advance(29.0)
    irm.manager.control_once()
    assert irm.job(b.id).state == QUEUED   # within the bound: a timeout, not a loss
    irm.clock.advance(2.0)
    irm.manager.control_once()             # 31 s of silence: s1's devices are gone, s2's 2 serve the queue
    assert irm.job(b.id).state == ACTIVE and irm.job(a.id).state == ACTIVE


@pytest.mark.parametrize("policy", ["fcfs_min", "managed_deadline"])
def test_the_jobs_of_a_server_taken_as_gone_hold_none_of_the_answering_servers_devices(irm_factory, policy):
    irm = irm_factory(policy, silent_server_s=30.0)
    a = irm.register("a", min_devices=1, max_devices=1, action_seconds=100.0, **deadline(1000.0, 10))
    assert irm.job(a.id).state == ACTIVE
    irm.orch.servers = {"s1": irm.server, "s2": irm.server}
    irm.orch.capacity = {"s2": 2}          # s1, holding a's group, gone for good; s2 has 2 devices
    b = irm.register("b", min_devices=2, max_devices=2, action_seconds=1.0, **deadline(1000.0, 10))
    irm.clock.advance(31.0)
    irm.manager.control_once()             # s1 taken as gone: a's device went with it, s2's 2 are b's
    assert irm.job(b.id).state == ACTIVE and irm.job(b.id).devices == 2


def test_a_servers_silence_is_timed_from_when_it_began_even_with_nothing_queued(irm_factory):
    irm = irm_factory("fcfs_min", silent_server_s=30.0)
    irm.register("a", min_devices=1, max_devices=1, action_seconds=100.0, **deadline(1000.0, 10))
    irm.orch.servers = {"s1": irm.server, "s2": irm.server}
    irm.orch.capacity = {"s2": 2}          # s1, holding a's group, silent from now on
    for _ in range(4):                     # 40 s of rounds with nothing queued: s1 silent all along
        irm.clock.advance(10.0)
        irm.manager.control_once()
    b = irm.register("b", min_devices=1, max_devices=1, action_seconds=1.0, **deadline(1000.0, 10))
    assert irm.job(b.id).state == ACTIVE   # silent 40 s > 30 s: gone, b is not held another 30 s


def test_a_lookahead_that_holds_a_job_decides_again_before_its_start_limit(irm_factory, monkeypatch):
    from irm_fpga.qos import hydrogen as hy
    from irm_fpga.qos import lookahead as la

    real = la.lookahead_schedule
    calls: list[float] = []

    def holds_at_first(queue, available, window, cost=hy.linear_cost, *, now, **kw):  # noqa: ANN001, ANN202
        calls.append(now)
        if len(calls) == 1:     # wait for an arrival that never comes, every device free
            return hy.Projection("lookahead", [], {}, {}, 0.0)
        return real(queue, available, window, cost, now=now, **kw)
    monkeypatch.setattr(la, "lookahead_schedule", holds_at_first)
    irm = irm_factory("managed_lookahead", lookahead_budget_s=0.1)
    j = irm.register("j", action_seconds=1.0, **deadline(100.0, 40))
    assert irm.job(j.id).state == QUEUED
    wake = irm.manager._wake_at
    assert wake == pytest.approx(irm.job(j.id).registered_at + 1.0 - 0.1 - 0.1)
    irm.clock.advance(0.5)
    irm.manager.wake_once()                # not due yet: nothing decided
    assert irm.job(j.id).state == QUEUED and len(calls) == 1
    irm.clock.advance(0.3)
    irm.manager.wake_once()                # due, nothing else happened: decided again, on time
    got = irm.job(j.id)
    assert got.state == ACTIVE and got.allocations[0][0] - got.registered_at <= 1.0
    assert irm.manager._wake_at is None


def test_a_job_held_nearer_its_limit_than_the_wake_margin_is_woken_for_at_the_limit(irm_factory, monkeypatch):
    from irm_fpga.qos import hydrogen as hy
    from irm_fpga.qos import lookahead as la

    real = la.lookahead_schedule
    calls: list[float] = []

    def holds_twice(queue, available, window, cost=hy.linear_cost, *, now, **kw):  # noqa: ANN001, ANN202
        calls.append(now)
        if len(set(calls)) <= 2:
            return hy.Projection("lookahead", [], {}, {}, 0.0)
        return real(queue, available, window, cost, now=now, **kw)
    monkeypatch.setattr(la, "lookahead_schedule", holds_twice)
    irm = irm_factory("managed_lookahead", lookahead_budget_s=0.1)
    j = irm.register("j", action_seconds=1.0, **deadline(100.0, 40))
    irm.clock.advance(0.85)                # past j's wake (0.8 s), before its limit (1 s)
    irm.register("k", action_seconds=1.0, **deadline(100.0, 40))     # held too: a decision without a wake
    limit = irm.job(j.id).registered_at + 1.0
    assert irm.manager._wake_at == pytest.approx(limit - hy.WAKE_EARLY_S)
    irm.clock.advance(limit - hy.WAKE_EARLY_S - irm.clock.now())
    irm.manager.wake_once()
    got = irm.job(j.id)
    assert got.state == ACTIVE and got.allocations[0][0] - got.registered_at <= 1.0


def test_the_control_thread_wakes_for_a_held_job_between_its_rounds(db_url, monkeypatch):
    from harness.v1 import fpga_jobs_pb2 as jobs_pb
    from irm_fpga.qos import hydrogen as hy
    from irm_fpga.qos import lookahead as la
    from services.clock import WallClock
    from tests.integration.fake_orchestrator import FakeOrchestrator, FakeServer

    real = la.lookahead_schedule
    calls: list[float] = []

    def holds_at_first(queue, available, window, cost=hy.linear_cost, *, now, **kw):  # noqa: ANN001, ANN202
        calls.append(now)
        if len(calls) == 1:
            return hy.Projection("lookahead", [], {}, {}, 0.0)
        return real(queue, available, window, cost, now=now, **kw)
    monkeypatch.setattr(la, "lookahead_schedule", holds_at_first)
    orch = FakeOrchestrator(db_url, WallClock(), {"s1": FakeServer()})
    # Rounds an hour apart: only the wake can start the held job before it turns late (5 s after registering).
    # The wake comes the decision's budget plus WAKE_MARGIN_S before that limit: 2.5 s, room for a control thread
    # slow to wake on a loaded machine.
    late_after, budget = 5.0, 2.4
    wake = late_after - budget - WAKE_MARGIN_S
    manager = JobManager(orch, JobsConfig(policy="managed_lookahead", control_period_s=3600.0,
                                          lookahead_budget_s=budget, late_after_s=late_after))
    manager.start()
    try:
        j = manager.register(jobs_pb.RegisterJobRequest(tenant="alice", request_id="j", design="sleep",
                                                        action_seconds=1.0, **deadline(100.0, 40)))
        assert manager._job("alice", j.id).state == QUEUED
        got = eventually(lambda: (r := manager._job("alice", j.id)).state == ACTIVE and r, timeout=30,
                         what="the held job to start")
        # Decided at registration, then once more at the wake (the elasticity manager may search several
        # pool sizes in one decision): 2.5 s after registering, before the job's 5 s limit.
        assert len(set(calls)) == 2 and got.allocations[0][0] == max(calls)
        assert wake - 0.1 <= got.allocations[0][0] - got.registered_at <= late_after
    finally:
        manager.stop()
        orch.db.dispose()


def test_a_queued_job_wider_than_the_pool_holds_back_no_one(irm_factory):
    irm = irm_factory("managed_lookahead")
    r = irm.register("r", min_devices=7, max_devices=7, action_seconds=1.0, **deadline(600.0, 7))
    w = irm.register("w", min_devices=DEVICES, action_seconds=0.1, **deadline(600.0, 10))
    s = irm.register("s", min_devices=2, max_devices=2, action_seconds=1.0, **deadline(600.0, 4))
    assert [irm.job(j.id).state for j in (r, w, s)] == [ACTIVE, QUEUED, QUEUED]
    irm.orch.capacity = {"s1": DEVICES - 1}        # one device blacklisted: w cannot start now
    irm.clock.advance(2.0)
    irm.manager.retire("alice", r.id)              # 7 devices free; s waited 2 s (late): it starts
    assert (irm.job(s.id).state, irm.job(w.id).state) == (ACTIVE, QUEUED)


def test_a_priority_that_would_overflow_the_schedules_weights_is_refused(irm_factory):
    irm = irm_factory("managed_lookahead")
    with pytest.raises(InvalidArgument, match="priority"):
        irm.register("p", priority=1e308, **deadline(60.0, 10))
    assert irm.register("q", priority=1e6, **deadline(60.0, 10)).priority == 1e6


def test_a_queued_job_turning_late_is_a_decision_even_with_nothing_arriving_or_ending(irm_factory, monkeypatch):
    from irm_fpga.qos import dispatch

    irm = irm_factory("fcfs_min", late_after_s=1.5)
    a = irm.register("a", min_devices=DEVICES, action_seconds=10.0, **deadline(600.0, 10))
    b = irm.register("b", min_devices=1, action_seconds=1.0, **deadline(600.0, 10))
    assert irm.job(b.id).state == QUEUED
    calls: list[float] = []
    real = dispatch.decide
    monkeypatch.setattr(dispatch, "decide", lambda *x, **k: calls.append(k["now"]) or real(*x, **k))
    irm.clock.advance(1.0)
    irm.manager.control_once()             # nothing changed: no decision
    irm.clock.advance(1.0)
    irm.manager.control_once()             # b has waited 2 s > 1.5 s: it is late now, decide again
    irm.clock.advance(1.0)
    irm.manager.control_once()
    assert calls == [1002.0] and irm.job(a.id).state == ACTIVE


def test_the_papers_managed_pool_grows_round_after_round_until_a_wide_job_fits(irm_factory):
    irm = irm_factory("managed", late_after_s=50.0)
    irm.manager._save_pool(2, irm.clock.now())             # shrunk to 2 by an earlier run (same policy)
    irm.restart()
    assert irm.manager.pool_devices() == 2
    j = irm.register("j", min_devices=6, max_devices=6, action_seconds=1.0, **deadline(1000.0, 60))
    for _ in range(10):                   # one device a decision (Algorithm 3): 2 -> 6 in four more rounds
        irm.clock.advance(1.0)
        irm.manager.control_once()
    assert (irm.job(j.id).state, irm.job(j.id).devices) == (ACTIVE, 6)


def test_a_retired_hydrogen_job_keeps_the_throughput_it_retired_with(irm_factory):
    irm = irm_factory("fcfs_min")
    a = irm.register("a", **deadline(60.0, 20))
    irm.clock.advance(2.0)
    irm.complete(irm.job(a.id), 20)
    irm.manager.control_once()
    job = irm.job(a.id)
    assert job.state == RETIRED and job.achieved_throughput == pytest.approx(10.0)    # 20 actions in 2 s
    irm.clock.advance(5.0)
    irm.manager.control_once()
    assert irm.job(a.id).achieved_throughput == pytest.approx(10.0) and a.id not in irm.manager._last


def test_a_hydrogen_job_retired_before_any_control_round_gets_its_rate(irm_factory):
    irm = irm_factory("fcfs_min")
    a = irm.register("a", **deadline(60.0, 100))
    irm.clock.advance(0.5)                                  # dispatched at once; no round has sampled it
    irm.complete(irm.job(a.id), 10)
    assert irm.manager.retire("alice", a.id).achieved_throughput == pytest.approx(20.0)
