"""The job manager's loose ends (issue 5), on SQLite and PostgreSQL, on virtual time.

The manager runs over an in-memory stand-in for the Orchestrator (groups in
the real database, FPGA-servers reduced to the `completed` counters the
manager reads) so every step is a direct call: auto-retirement of deadline
jobs whose size is done, priority in EDF and in the throughput broker, and
the controller state carried across a restart (`tests.integration.fake_orchestrator`).
`test_fpga_jobs.py` runs the same manager against real FPGA-server processes.
"""

from __future__ import annotations

import math
import threading

import pytest
from sqlalchemy import inspect, select

from harness.v1 import fpga_jobs_pb2 as jp
from irm_fpga.job_models import FpgaJob, FpgaJobController
from irm_fpga.jobs import RETIRED, JobManager
from irm_fpga.models import Group
from services.errors import NotFound, Unavailable
from tests.conftest import eventually
from tests.integration.fake_orchestrator import DEVICES, deadline

# -- auto-retirement -------------------------------------------------------------------------


def test_edf_deadline_job_retires_itself_when_its_size_is_done_and_its_devices_go_back(irm_factory):
    irm = irm_factory("edf")
    soon = irm.register("soon", **deadline(30.0, 100))
    late = irm.register("late", **deadline(100.0, 1000))
    assert (irm.job(soon.id).devices, irm.job(late.id).devices) == (7, 1)

    irm.clock.advance(1.0)
    irm.complete(soon, 99)  # one action short: still active
    irm.manager.control_once()
    assert irm.job(soon.id).state == "active" and irm.job(soon.id).observed_actions == 99

    irm.clock.advance(1.0)
    irm.complete(soon, 1)
    irm.manager.control_once()
    done = irm.job(soon.id)
    assert done.state == RETIRED and done.devices == 0 and done.retired_at == pytest.approx(1002.0)
    assert done.allocations == [[1000.0, 8], [1000.0, 7], [1002.0, 0]]
    with pytest.raises(NotFound):
        irm.orch._group(done.group_id)  # its group is gone
    # EDF's event: the remaining job gets every device at once.
    assert irm.job(late.id).devices == DEVICES and irm.orch.size_of(late.group_id) == DEVICES
    assert irm.job(late.id).allocations == [[1000.0, 1], [1002.0, 8]]
    with irm.orch.db.read() as s:  # its controller row went with it
        assert s.get(FpgaJobController, soon.id) is None
    # Retiring it again is a no-op.
    assert irm.manager.retire("alice", soon.id).retired_at == pytest.approx(1002.0)


def test_reported_progress_that_reaches_the_size_retires_the_job(irm_factory):
    irm = irm_factory("edf")
    a = irm.register("a", **deadline(30.0, 50))
    b = irm.register("b", **deadline(60.0, 50))
    irm.clock.advance(2.0)
    assert irm.manager.report("alice", a.id, 49).state == "active"
    row = irm.manager.report("alice", a.id, 50)
    assert row.state == RETIRED and row.retired_at == pytest.approx(1002.0)
    assert irm.job(b.id).devices == DEVICES
    # A count above the size (2^63 - 1, a fuzzing client's: review 25) counts as the size: it retires the job, and
    # its completed actions and mean throughput stay the job's.
    row = irm.manager.report("alice", b.id, 2 ** 63 - 1)
    assert row.state == RETIRED and row.reported_actions == 50
    job = irm.manager.GetJob(jp.GetJobRequest(tenant="alice", job_id=b.id), None)
    assert job.completed_actions == 50 and job.mean_throughput == pytest.approx(50 / 2.0)


def test_throughput_policy_retires_done_deadline_jobs_and_the_broker_reuses_their_devices(irm_factory):
    irm = irm_factory("throughput")
    d = irm.register("d", **deadline(100.0, 40))
    t = irm.register("t", throughput=jp.ThroughputGoal(actions_per_s=10.0))
    assert irm.job(d.id).devices + irm.job(t.id).devices <= DEVICES
    irm.clock.advance(2.0)
    irm.complete(d, 40)
    irm.complete(t, 20)
    alloc = irm.manager.control_once()
    assert irm.job(d.id).state == RETIRED and d.id not in alloc
    assert set(alloc) == {t.id}
    # The broker's pool is every device again: t's group may grow up to it.
    assert irm.manager._pool(irm.manager._active()) == DEVICES


# -- priority ----------------------------------------------------------------------------------


def test_edf_breaks_deadline_ties_by_priority(irm_factory):
    irm = irm_factory("edf")
    low = irm.register("low", priority=1.0, **deadline(50.0, 1000))  # due at 1050, submitted first
    irm.clock.advance(10.0)
    high = irm.register("high", priority=5.0, **deadline(40.0, 1000))  # due at 1050 too
    assert irm.job(low.id).deadline_at == irm.job(high.id).deadline_at == 1050.0
    # Minimums first (1 each), the allocable six to the higher priority.
    assert (irm.job(high.id).devices, irm.job(low.id).devices) == (7, 1)
    sooner = irm.register("sooner", priority=0.5, **deadline(10.0, 1000))  # an earlier deadline still wins
    assert (irm.job(sooner.id).devices, irm.job(high.id).devices, irm.job(low.id).devices) == (6, 1, 1)


def test_throughput_admission_takes_surplus_from_the_lower_priority_first(irm_factory):
    irm = irm_factory("throughput")
    goal = {"throughput": jp.ThroughputGoal(actions_per_s=10.0)}
    # Admission gives a new job the unallocated devices (up to its max); requests start at the minimum (1).
    lo = irm.register("lo", priority=1.0, max_devices=3, **goal)  # 3 devices: surplus 2
    hi = irm.register("hi", priority=3.0, **goal)  # the other 5: surplus 4
    assert (irm.job(lo.id).devices, irm.job(hi.id).devices) == (3, 5)
    # A third job needs 2 and nothing is free: the lower priority gives first (the paper's rule, the
    # largest surplus first, would take them from hi).
    new = irm.register("new", priority=2.0, min_devices=2, **goal)
    assert (irm.job(lo.id).devices, irm.job(hi.id).devices, irm.job(new.id).devices) == (1, 5, 2)


# -- state across a restart ------------------------------------------------------------------


def test_throughput_controller_state_survives_a_restart(irm_factory):
    irm = irm_factory("throughput", alpha=0.5)
    job = irm.register("tp", throughput=jp.ThroughputGoal(actions_per_s=10.0))
    irm.clock.advance(2.0)
    irm.complete(job, 80)  # 40 actions/s on 8 devices: a_hat = 8 / 40 = 0.2
    irm.manager.control_once()
    before = irm.manager._states[job.id]
    assert before.a_hat == pytest.approx(0.2) and before.request == 2 and before.last_actions == 80
    devices = irm.job(job.id).devices

    irm.restart()  # a new manager and Orchestrator, same database
    loaded = irm.manager._states[job.id]
    assert loaded == before
    assert irm.manager._seen[job.id] == {"s1": ("", 80)} and irm.manager._last[job.id] == (1002.0, 80)

    # The next period uses the old estimate: 20 actions in 2 s on `devices`: sample devices / 10, EMA with 0.2.
    irm.clock.advance(2.0)
    irm.complete(job, 20)
    irm.manager.control_once()
    after = irm.manager._states[job.id]
    assert after.a_hat == pytest.approx(0.5 * devices / 10.0 + 0.5 * 0.2)
    # The server's counter (100) was not counted again from zero: 100 actions, not 180.
    assert irm.job(job.id).observed_actions == 100 and after.last_actions == 100
    assert irm.job(job.id).achieved_throughput == pytest.approx(10.0)



@pytest.mark.parametrize("policy", ["edf", "throughput", "fcfs_min"])
def test_a_job_never_turns_active_without_its_controller_and_keeps_its_progress_over_a_restart(irm_factory, policy):
    # An active job without a controller row is taken after a restart as never read: its first counter reading
    # is a baseline and the actions done before are lost. Dispatch (and registration, under EDF and throughput)
    # wrote the job and its controller in two transactions; a crash between them lost that progress.
    irm = irm_factory(policy)
    db, real = irm.manager.db, irm.manager.db.transact
    bare: list[set[str]] = []

    def checked(fn):  # type: ignore[no-untyped-def]
        out = real(fn)
        with db.read() as s:     # what a crash right after this commit would leave
            active = set(s.scalars(select(FpgaJob.id).where(FpgaJob.state == "active")))
            bare.append(active - set(s.scalars(select(FpgaJobController.job_id))))
        return out

    irm.manager.db.transact = checked
    first = irm.register("first", min_devices=DEVICES, max_devices=DEVICES, **deadline(60.0, 100))
    if policy == "fcfs_min":
        queued = irm.register("queued", **deadline(60.0, 100))      # dispatched when first retires
        irm.clock.advance(1.0)
        irm.complete(irm.job(first.id), 100)
        irm.manager.control_once()
        assert irm.job(first.id).state == RETIRED
        first = irm.job(queued.id)
    assert irm.job(first.id).state == "active" and bare and not any(bare), bare
    irm.manager.db.transact = real
    irm.complete(irm.job(first.id), 40)          # progress, then a restart before any period read it
    irm.restart()
    irm.manager.control_once()
    assert irm.job(first.id).observed_actions == 40

def test_infinite_goal_and_performance_round_trip(irm_factory):
    # A deadline job past its deadline has an infinite goal (it wants its max); a done one an infinite p.
    irm = irm_factory("throughput")
    late = irm.register("late", **deadline(1.0, 1000))
    irm.clock.advance(2.0)
    irm.complete(late, 10)
    irm.manager.control_once()
    assert math.isinf(irm.manager._states[late.id].goal)
    with irm.orch.db.read() as s:
        c = s.get(FpgaJobController, late.id)
    assert math.isinf(c.goal) and c.request == DEVICES
    irm.restart()
    assert math.isinf(irm.manager._states[late.id].goal)


def test_jobs_without_a_saved_controller_start_afresh(irm_factory):
    irm = irm_factory("throughput")
    job = irm.register("tp", throughput=jp.ThroughputGoal(actions_per_s=10.0))
    irm.orch.db.transact(lambda s: s.delete(s.get(FpgaJobController, job.id)))  # as before the migration
    irm.clock.advance(5.0)
    irm.restart()
    st = irm.manager._states[job.id]
    assert st.a_hat is None and st.last_time == pytest.approx(1005.0)
    with irm.orch.db.read() as s:
        assert "fpga_job_controllers" in inspect(s.get_bind()).get_table_names()
        assert [r.id for r in s.scalars(select(FpgaJob))] == [job.id]


def test_a_throughput_job_that_has_done_nothing_yet_does_not_lock_out_other_tenants(irm_factory):
    irm = irm_factory("throughput")
    a = irm.register("a", throughput=jp.ThroughputGoal(actions_per_s=10.0))
    assert irm.job(a.id).devices == DEVICES
    irm.clock.advance(1.0)
    irm.manager.control_once()            # a's application has not started: no action completed, no estimate
    assert irm.job(a.id).devices == DEVICES                # nothing measured: it keeps them...
    b = irm.manager.register(jp.RegisterJobRequest(tenant="bob", request_id="b", design="sleep",
                                                   throughput=jp.ThroughputGoal(actions_per_s=10.0)))
    assert b.devices >= 1 and irm.job(a.id).devices == DEVICES - b.devices


def test_the_broker_keeps_every_job_at_its_minimum_when_requests_do_not_fit(irm_factory):
    irm = irm_factory("throughput")
    a = irm.register("a", min_devices=3, throughput=jp.ThroughputGoal(actions_per_s=10.0))
    irm.clock.advance(2.0)
    irm.complete(irm.job(a.id), 400)      # 200 actions/s on 8 devices against a goal of 10: request -> its min 3
    irm.manager.control_once()
    assert irm.job(a.id).devices == 3
    b = irm.register("b", **deadline(1.0, 100_000))
    irm.clock.advance(2.0)                # b is past its deadline: it wants the whole pool (requests do not fit)
    irm.complete(irm.job(a.id), 400)
    irm.complete(irm.job(b.id), 10)
    irm.manager.control_once()
    assert (irm.job(a.id).devices, irm.job(b.id).devices) == (3, DEVICES - 3)


class _Crash(BaseException):
    """The process dies here (kill -9, power): no except clause runs."""


def test_a_group_left_by_a_crash_before_its_job_was_recorded_is_dropped_on_restart(irm_factory, monkeypatch):
    irm = irm_factory("edf")
    kept = irm.register("kept", **deadline(100.0, 10))

    def die(self, row, controller_at=None):
        raise _Crash()

    monkeypatch.setattr(JobManager, "_insert", die)
    with pytest.raises(_Crash):
        irm.register("lost", **deadline(100.0, 10))
    monkeypatch.undo()
    assert irm.manager.pool_devices() < DEVICES           # the orphan holds devices no job will give back
    irm.restart()
    assert [r.id for r in irm.manager._active()] == [kept.id]
    assert irm.manager.pool_devices() == DEVICES
    assert irm.orch.size_of(irm.job(kept.id).group_id) >= 1   # the job's own group stays


def test_a_job_registered_while_devices_were_missing_grows_onto_them_when_they_return(irm_factory):
    irm = irm_factory("edf")
    irm.orch.capacity = {"s1": DEVICES // 2}        # half the devices out (a server away, or blacklisted)
    a = irm.register("a", **deadline(100.0, 1000))   # no max of its own
    b = irm.register("b", **deadline(200.0, 1000))
    assert (irm.job(a.id).devices, irm.job(b.id).devices) == (DEVICES // 2 - 1, 1)
    irm.orch.capacity = {"s1": DEVICES}             # back
    irm.manager.retire("alice", b.id)               # EDF's event: every device to a
    assert irm.job(a.id).devices == DEVICES == irm.orch.size_of(irm.job(a.id).group_id)


@pytest.mark.parametrize("policy", ["throughput", "edf"])
def test_a_server_that_does_not_answer_for_a_moment_shrinks_no_job(irm_factory, policy):
    irm = irm_factory(policy)
    irm.orch.capacity = {"s1": DEVICES // 2, "s2": DEVICES // 2}
    d = irm.register("d", **deadline(100.0, 100_000))
    irm.orch.capacity = {"s1": DEVICES}             # the fake puts every group on s1: s2 holds no part of it
    irm.clock.advance(2.0)
    irm.complete(irm.job(d.id), 20)
    irm.manager.control_once()
    assert irm.job(d.id).devices == DEVICES
    irm.orch.capacity = {}                          # s1 (holding d's group) does not answer GetServer
    irm.clock.advance(2.0)
    irm.complete(irm.job(d.id), 20)
    irm.manager.control_once()
    irm.manager._rebalance(irm.clock.now())         # EDF's event path too
    assert irm.job(d.id).devices == DEVICES and irm.orch.size_of(irm.job(d.id).group_id) == DEVICES
    for answering in ({}, {"s2": DEVICES // 2}):          # none, or only a server holding none of d's group
        irm.orch.capacity = answering
        with pytest.raises(Unavailable, match="retry later"):     # a registration would shrink d too
            irm.manager.register(jp.RegisterJobRequest(tenant="bob", request_id="e", design="sleep",
                                                       **deadline(200.0, 1000)))
    with irm.orch.db.read() as s:
        assert list(s.scalars(select(FpgaJob).where(FpgaJob.tenant == "bob"))) == []
    assert irm.job(d.id).devices == DEVICES
    irm.orch.capacity = {"s1": DEVICES // 2}        # it answers again, with half its devices blacklisted
    irm.clock.advance(2.0)
    irm.complete(irm.job(d.id), 20)
    irm.manager.control_once()
    irm.manager._rebalance(irm.clock.now())
    assert irm.job(d.id).devices == DEVICES // 2


def test_a_job_without_saved_counters_is_not_counted_twice_after_a_restart(irm_factory):
    irm = irm_factory("edf")
    job = irm.register("d", **deadline(100.0, 100))
    irm.clock.advance(1.0)
    irm.complete(irm.job(job.id), 50)                # half done
    irm.manager.control_once()
    assert irm.job(job.id).observed_actions == 50
    irm.orch.db.transact(lambda s: s.delete(s.get(FpgaJobController, job.id)))   # as before that table existed
    irm.restart()
    irm.clock.advance(1.0)
    irm.manager.control_once()                       # nothing new: the servers' 50 are not progress again
    assert (irm.job(job.id).state, irm.job(job.id).observed_actions) == ("active", 50)
    irm.complete(irm.job(job.id), 10)
    irm.clock.advance(1.0)
    irm.manager.control_once()                       # what is done after the restart counts
    assert irm.job(job.id).observed_actions == 60
    irm.restart()                                    # and its counters are saved from then on
    irm.complete(irm.job(job.id), 5)
    irm.clock.advance(1.0)
    irm.manager.control_once()
    assert irm.job(job.id).observed_actions == 65


def test_only_the_managers_own_job_groups_are_dropped_as_orphans(irm_factory):
    irm = irm_factory("edf")
    irm.register("d", **deadline(100.0, 10))
    # A tenant's group whose request id merely starts "job:" (accepted before the prefix was reserved).
    mine = irm.orch.create_group("alice", "job:nightly-42", "sleep", 1, min_size=1, max_size=1)
    irm.restart()
    with irm.orch.db.read() as s:
        assert s.get(Group, mine.id).deleted is False


class WatchedLock:
    """A lock standing in for another, recording the threads that find it held by someone else."""

    def __init__(self, inner) -> None:  # noqa: ANN001
        self.inner = inner
        self.blocked: set[int] = set()

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        # A first try that does not block tells a thread that must wait (another holds it) from one that may go on.
        if self.inner.acquire(False):
            return True
        self.blocked.add(threading.get_ident())
        return self.inner.acquire(blocking, timeout)

    def release(self) -> None:
        self.inner.release()

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


def test_dropping_orphans_waits_for_a_registration_in_flight(irm_factory, monkeypatch):
    # The server takes RegisterJob before the manager's start hook runs: a registration between making its
    # group and recording its job must not see its group dropped as an orphan.
    irm = irm_factory("edf")
    lock = irm.manager.lock = WatchedLock(irm.manager.lock)
    real_insert, sweeps = JobManager._insert, []

    def insert(self, row, controller_at=None):  # noqa: ANN001, ANN202
        sweep = threading.Thread(target=self._drop_orphans)
        sweep.start()
        sweeps.append(sweep)
        # The sweep has reached the manager's lock, which this registration holds, and waits there: it can only
        # look for orphans once the job is recorded. A sweep that does not take the lock ends without waiting,
        # which fails here at once.
        eventually(lambda: sweep.ident in lock.blocked or not sweep.is_alive(), timeout=10, interval=0.005)
        assert sweep.ident in lock.blocked and sweep.is_alive()
        return real_insert(self, row, controller_at)

    monkeypatch.setattr(JobManager, "_insert", insert)
    job = irm.register("d", **deadline(100.0, 10))
    sweeps[0].join(10)
    assert not sweeps[0].is_alive()
    with irm.orch.db.read() as s:
        assert s.get(Group, job.group_id).deleted is False


def test_a_server_holding_only_other_tenants_groups_going_quiet_shrinks_no_job(irm_factory):
    irm = irm_factory("edf")
    irm.orch.capacity = {"s1": DEVICES, "s2": 4}
    t = irm.orch.create_group("carol", "plain", "sleep", 4, min_size=4, max_size=4)
    irm.orch.db.transact(lambda s: setattr(s.get(Group, t.id), "parts", {"s2": 4}))    # all of it on s2
    d = irm.register("d", **deadline(100.0, 100_000))
    assert irm.job(d.id).devices == DEVICES                # 12 usable - carol's 4
    irm.orch.capacity = {"s1": DEVICES}                    # s2 (carol's only) does not answer
    e = irm.manager.register(jp.RegisterJobRequest(tenant="bob", request_id="e", design="sleep",
                                                   **deadline(1000.0, 10)))
    # carol's 4 were never on s1: counted against s1's 8 they cut d to 3; it gives e one device only.
    assert (irm.job(d.id).devices, e.devices) == (DEVICES - 1, 1)


# -- EDF decides again when its last decision was not applied -----------------------------------------------

def _edf_pair(irm):
    soon = irm.register("soon", **deadline(30.0, 100))
    later = irm.register("later", **deadline(100.0, 100_000))
    assert (irm.job(soon.id).devices, irm.job(later.id).devices) == (DEVICES - 1, 1)
    return soon, later


def test_edf_decides_again_when_a_retirement_came_while_a_server_was_silent(irm_factory):
    irm = irm_factory("edf")
    soon, later = _edf_pair(irm)
    irm.orch.capacity = {}                  # s1, holding both groups, misses a status check
    irm.clock.advance(1.0)
    irm.manager.retire("alice", soon.id)    # the event: no decision while s1 is silent
    assert irm.job(later.id).devices == 1
    irm.orch.capacity = {"s1": DEVICES}
    irm.clock.advance(1.0)
    irm.manager.control_once()              # the next round decides it
    assert irm.job(later.id).devices == DEVICES == irm.orch.size_of(irm.job(later.id).group_id)


def test_edf_decides_again_when_a_job_finished_in_a_round_that_could_not_count_devices(irm_factory):
    irm = irm_factory("edf")
    soon, later = _edf_pair(irm)
    irm.clock.advance(1.0)
    irm.complete(irm.job(soon.id), 100)     # its size is done
    irm.orch.capacity = {}
    irm.manager.control_once()              # it retires; no allocation without s1's count
    assert irm.job(soon.id).state == RETIRED and irm.job(later.id).devices == 1
    irm.orch.capacity = {"s1": DEVICES}
    irm.clock.advance(1.0)
    irm.manager.control_once()
    assert irm.job(later.id).devices == DEVICES


def test_edf_decides_again_after_a_refused_resize(irm_factory, monkeypatch):
    irm = irm_factory("edf")
    soon, later = _edf_pair(irm)
    real = type(irm.orch).resize

    def refuse(self, g, size, **kw):  # noqa: ANN001, ANN202
        raise Unavailable("the FPGA-server did not answer")

    monkeypatch.setattr(type(irm.orch), "resize", refuse)
    irm.manager.retire("alice", soon.id)
    assert irm.job(later.id).devices == 1
    monkeypatch.setattr(type(irm.orch), "resize", real)
    irm.clock.advance(1.0)
    irm.manager.control_once()
    assert irm.job(later.id).devices == DEVICES
    irm.manager.control_once()              # applied: nothing left to decide again
    assert not irm.manager._unapplied


def test_edf_after_a_restart_or_a_switch_from_throughput_allocates_as_edf(irm_factory):
    irm = irm_factory("throughput")
    a = irm.register("a", **deadline(1000.0, 4000))
    irm.clock.advance(0.5)
    b = irm.register("b", **deadline(50.0, 4000))        # earlier deadline; admission gives it its minimum
    assert (irm.job(a.id).devices, irm.job(b.id).devices) == (DEVICES - 1, 1)
    irm.policy = "edf"
    irm.restart()
    irm.clock.advance(1.0)
    irm.manager.control_once()
    assert (irm.job(a.id).devices, irm.job(b.id).devices) == (1, DEVICES - 1)    # all but one to the earliest


# -- progress across a part's makings, and failed tasks -----------------------------------------------------

def test_progress_counts_a_remade_part_from_zero_even_past_the_old_counter(irm_factory):
    irm = irm_factory("edf")
    job = irm.register("d", **deadline(100.0, 100))
    g = irm.job(job.id).group_id
    irm.server.remake(g)                     # a server with incarnations
    irm.clock.advance(1.0)
    irm.complete(irm.job(job.id), 30)
    irm.manager.control_once()
    assert irm.job(job.id).observed_actions == 30
    irm.server.remake(g)                     # the server restarted; the Orchestrator made the part again
    irm.server.completed[g] = 70             # past the old counter before the next reading
    irm.clock.advance(1.0)
    irm.manager.control_once()
    row = irm.job(job.id)
    assert (row.observed_actions, row.state) == (100, RETIRED)


def test_failed_tasks_are_not_progress(irm_factory):
    irm = irm_factory("edf")
    job = irm.register("d", **deadline(100.0, 100))
    g = irm.job(job.id).group_id
    irm.server.completed[g], irm.server.failed[g] = 100, 60      # 60 of them revoked or failed in the design
    irm.clock.advance(1.0)
    irm.manager.control_once()
    row = irm.job(job.id)
    assert (row.observed_actions, row.state) == (40, "active")


def test_a_reading_saved_before_incarnations_only_sets_the_baseline(irm_factory):
    irm = irm_factory("edf")
    job = irm.register("d", **deadline(100.0, 1000))
    g = irm.job(job.id).group_id
    irm.clock.advance(1.0)
    irm.complete(irm.job(job.id), 50)
    irm.manager.control_once()
    irm.orch.db.transact(lambda s: setattr(s.get(FpgaJobController, job.id), "seen", {"s1": 50}))   # old format
    irm.restart()
    irm.server.incarnation[g] = "upgraded"   # the server now names its parts: same counter, cannot tell
    irm.clock.advance(1.0)
    irm.manager.control_once()
    assert irm.job(job.id).observed_actions == 50
    irm.complete(irm.job(job.id), 5)
    irm.clock.advance(1.0)
    irm.manager.control_once()
    assert irm.job(job.id).observed_actions == 55


# -- requests that come before the manager has loaded its state ------------------------------------------

class _Entered(threading.Event):
    """The manager's ready flag, telling the test when a request has started waiting on it."""

    def __init__(self) -> None:
        super().__init__()
        self.waiting = threading.Event()

    def wait(self, timeout=None):  # noqa: ANN001, ANN202
        self.waiting.set()
        return super().wait(timeout)


def test_a_retirement_before_the_manager_has_loaded_waits_for_it_and_counts_once(irm_factory, monkeypatch):
    irm = irm_factory("edf")
    job = irm.register("d", **deadline(100.0, 1000))
    irm.clock.advance(1.0)
    irm.complete(irm.job(job.id), 300)
    irm.manager.control_once()
    irm.manager.stop()
    fresh = JobManager(irm.orch, irm.manager.config)      # serving, its start hook not run yet
    fresh._ready = _Entered()
    out: list = []
    t = threading.Thread(target=lambda: out.append(fresh.retire("alice", job.id)))
    t.start()
    assert fresh._ready.waiting.wait(10)
    fresh.start()
    t.join(10)
    fresh.stop()
    assert out[0].state == RETIRED and out[0].observed_actions == 300

    early = JobManager(irm.orch, irm.manager.config)
    monkeypatch.setattr("irm_fpga.jobs.LOAD_WAIT_S", 0.01)
    with pytest.raises(Unavailable, match="still loading"):
        early.register(jp.RegisterJobRequest(tenant="bob", request_id="x", design="sleep", **deadline(10.0, 5)))


# -- the controller's eq. 2 and the rate kept at retirement -----------------------------------------------

def test_eq2_divides_by_the_devices_held_over_the_period_not_those_at_its_end(irm_factory):
    irm = irm_factory("throughput", alpha=0.5)
    a = irm.register("a", **deadline(1000.0, 20_000))      # about 20 actions/s
    irm.clock.advance(1.0)
    irm.complete(irm.job(a.id), 40)                         # 5 actions/s per device on 8: a_hat 0.2
    irm.manager.control_once()
    assert irm.manager._states[a.id].a_hat == pytest.approx(0.2) and irm.job(a.id).devices == DEVICES
    irm.clock.advance(0.95)
    irm.register("b", **deadline(1000.0, 100), min_devices=4)    # admission takes 4 of a's late in the period
    assert irm.job(a.id).devices == 4
    irm.complete(irm.job(a.id), 39)                         # 8 devices for 0.95 s and 4 for 0.05 s at 5/s
    irm.clock.advance(0.05)
    irm.manager.control_once()
    st = irm.manager._states[a.id]
    assert st.a_hat == pytest.approx(0.2, rel=0.01) and st.request == 4    # with 4 / 39: 0.151 and 3


def test_a_retirement_just_after_a_sample_keeps_the_last_periods_rate(irm_factory):
    irm = irm_factory("edf")
    job = irm.register("d", **deadline(100.0, 1000))
    for _ in range(3):
        irm.clock.advance(1.0)
        irm.complete(irm.job(job.id), 40)
        irm.manager.control_once()
    assert irm.job(job.id).achieved_throughput == 40.0
    irm.clock.advance(0.001)
    irm.complete(irm.job(job.id), 1)
    assert irm.manager.retire("alice", job.id).achieved_throughput == 40.0     # not 1 action / 1 ms
    early = irm.register("e", **deadline(100.0, 1000))
    irm.clock.advance(0.5)
    irm.complete(irm.job(early.id), 10)
    assert irm.manager.retire("alice", early.id).achieved_throughput == pytest.approx(20.0)   # its whole life


def test_the_broker_does_not_give_out_the_devices_of_a_job_registered_this_instant(irm_factory):
    irm = irm_factory("throughput")
    a = irm.register("a", throughput=jp.ThroughputGoal(actions_per_s=5.0))
    irm.clock.advance(1.0)
    irm.complete(irm.job(a.id), 10)          # 10 actions/s on 8 devices: it needs 4 for 5 actions/s
    irm.manager.control_once()
    irm.clock.advance(1.0)
    irm.complete(irm.job(a.id), 2)           # a slowed down: it asks for more than the devices b left free
    b = irm.register("b", throughput=jp.ThroughputGoal(actions_per_s=1.0), min_devices=2)
    held = irm.job(b.id).devices
    irm.manager.control_once()               # the same instant: a takes a step, b has no period behind it yet
    assert irm.job(b.id).devices == held >= 2
    assert irm.job(a.id).devices + irm.job(b.id).devices <= DEVICES
