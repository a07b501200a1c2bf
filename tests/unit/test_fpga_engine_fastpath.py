"""The engine's single-task path (`submit` of one run task, thesis Fig. 3.4's case) and `poll`.

A lone run task skips the batch machinery (`_prepare` + `_enqueue`) but must follow exactly the
same rules: the design validates it, it goes to the client's pinned queue or else its shortest
one, it only gets a device its queue may lock, and its result carries queue and device time.
"""

from __future__ import annotations

import random

import pytest

from irm_fpga.engine import LOCK, RUN, UNLOCK, NotFoundError, PreconditionError, Task
from tests.unit.test_fpga_engine import drain, make, ready_group, run_to, sleeps


def _one(e, cid, tid, d):  # type: ignore[no-untyped-def]
    assert e.submit(cid, [Task(tid, {"duration": d})]) == 1


def test_one_task_at_a_time_lands_where_a_batch_would() -> None:
    """With the clock still, tasks sent one by one fill the same queues, in the same order, as one batch."""
    rng = random.Random(11)
    durations = [rng.choice([0.1, 0.5, 2.0]) for _ in range(40)]
    one, c1 = make()
    batch, c2 = make()
    for e, clock in ((one, c1), (batch, c2)):
        ready_group(e, clock, "g", 3)
        e.attach_client("g", "c")
    for i, d in enumerate(durations):
        _one(one, "c", i, d)
    batch.submit("c", [Task(i, {"duration": d}) for i, d in enumerate(durations)])
    assert one.queue_lengths("c") == batch.queue_lengths("c")
    a, b = drain(one, c1), drain(batch, c2)
    assert [(r.task_id, r.device, r.started_at - r.submitted_at, r.device_time) for r in a] == [
        (r.task_id, r.device, r.started_at - r.submitted_at, r.device_time) for r in b
    ]


def test_idle_device_runs_a_lone_task_at_once_with_queue_and_device_time() -> None:
    e, clock = make()
    ready_group(e, clock, "g", 1)
    e.attach_client("g", "c")
    t0 = clock.now()
    _one(e, "c", "a", 0.25)
    _one(e, "c", "b", 0.5)  # the only device is busy: b waits for it
    assert e.next_event_time() == pytest.approx(t0 + 0.25)
    a, b = drain(e, clock)
    assert (a.task_id, a.kind, a.error, a.device) == ("a", RUN, None, 0)
    assert a.queue_time == 0.0 and a.device_time == pytest.approx(0.25)
    assert a.latency == pytest.approx(0.25)
    assert b.queue_time == pytest.approx(0.25) and b.device_time == pytest.approx(0.5)
    m = e.measurements().groups[0]
    assert (m.executed, m.busy_s) == (2, pytest.approx(0.75))


def test_lone_task_respects_a_lock_held_by_another_client() -> None:
    e, clock = make()
    ready_group(e, clock, "g", 1)
    e.attach_client("g", "holder")
    e.attach_client("g", "other")
    e.submit("holder", [Task("L", None, LOCK)])
    (lock,) = e.advance()
    assert lock.kind == LOCK
    _one(e, "other", 1, 0.1)
    assert run_to(e, clock, clock.now() + 5.0) == []  # the device is held: nothing runs
    assert e.queue_lengths("other")[0] == 1
    # the holder's own lone tasks go to its pinned queue and run on the held device at once
    t = clock.now()
    _one(e, "holder", "h", 0.2)
    (h,) = run_to(e, clock, t + 0.2)
    assert (h.client_id, h.device, h.queue_time) == ("holder", lock.device, 0.0)
    t_unlock = clock.now()
    e.submit("holder", [Task("U", None, UNLOCK)])
    res = drain(e, clock)
    assert [(r.client_id, r.kind) for r in res] == [("holder", UNLOCK), ("other", RUN)]
    assert res[1].started_at == pytest.approx(t_unlock)
    assert res[1].queue_time == pytest.approx(t_unlock - res[1].submitted_at)


def test_lone_task_waits_in_a_group_without_devices_until_one_joins() -> None:
    e, clock = make()
    e.create_group("g", "sleep", 0, min_size=0)
    e.attach_client("g", "c")
    _one(e, "c", 1, 0.1)
    assert run_to(e, clock, clock.now() + 5.0) == []
    assert e.group_info("g").waiting == 1
    e.resize_group("g", 1)  # reconfigures for 1 s, then runs the task
    (r,) = drain(e, clock)
    assert r.error is None and r.queue_time == pytest.approx(6.0) and r.device_time == pytest.approx(0.1)


def test_lone_task_of_a_revoked_or_detaching_client_is_refused() -> None:
    e, clock = make()
    ready_group(e, clock, "g", 1)
    e.attach_client("g", "gone")
    e.attach_client("g", "leaving")
    e.revoke_client("gone")
    with pytest.raises(NotFoundError):
        _one(e, "gone", 1, 0.1)
    _one(e, "leaving", 1, 1.0)
    e.detach_client("leaving")
    with pytest.raises(PreconditionError, match="detaching"):
        _one(e, "leaving", 2, 0.1)
    (r,) = drain(e, clock)
    assert (r.client_id, r.task_id, r.error) == ("leaving", 1, None)


def test_lone_task_bad_parameters_fail_with_the_batch_message_and_change_nothing() -> None:
    e, clock = make()
    ready_group(e, clock, "g", 1)
    e.attach_client("g", "c")
    with pytest.raises(ValueError, match=r"task 0 \('x'\): sleep: .*duration"):
        e.submit("c", [Task("x", {"duration": -1.0})])
    with pytest.raises(ValueError, match=r"task 0 \('y'\)"):
        e.submit("c", [Task("y", None)])
    assert e.queue_lengths("c") == [0] * 8 and e.next_event_time() is None


def test_lone_task_on_a_shrinking_group_finishes_then_the_device_leaves() -> None:
    e, clock = make()
    ready_group(e, clock, "g", 2)
    e.attach_client("g", "c")
    _one(e, "c", 1, 1.0)
    _one(e, "c", 2, 1.0)
    e.resize_group("g", 1)  # one busy member drains after its task
    _one(e, "c", 3, 1.0)  # waits for the remaining device
    res = drain(e, clock)
    assert sorted(r.task_id for r in res) == [1, 2, 3] and all(r.error is None for r in res)
    assert e.group_info("g").size == 1
    assert res[-1].queue_time == pytest.approx(1.0)


def test_poll_is_advance_and_drain_events_in_one() -> None:
    e, clock = make()
    e.create_group("g", "sleep", 1)
    results, events, nxt = e.poll()
    assert results == () and [ev.kind for ev in events] == ["reconfiguring"] and nxt == pytest.approx(1.0)
    assert e.busy()
    clock.advance(1.0)
    results, events, nxt = e.poll()
    assert results == () and [ev.kind for ev in events] == ["reconfigured", "joined"] and nxt is None
    assert not e.busy() and e.drain_events() == []
    e.attach_client("g", "c")
    e.submit("c", sleeps([7], 0.5))
    assert e.poll(clock.now() + 0.4) == ((), (), pytest.approx(clock.now() + 0.5))
    (r,), events, nxt = e.poll(clock.now() + 0.5)
    assert (r.task_id, events, nxt) == (7, (), None)
    assert e.device_state(0) == e.device_states()[0]
    with pytest.raises(NotFoundError):
        e.device_state(8)


def test_submit_next_tells_when_to_look_again() -> None:
    e, clock = make()
    ready_group(e, clock, "g", 1)
    e.attach_client("g", "c")
    t = clock.now()
    assert e.submit_next("c", sleeps([1], 0.25)) == pytest.approx(t + 0.25)
    assert e.submit_next("c", sleeps([2], 0.5)) == pytest.approx(t + 0.25)  # queued behind task 1
    e.attach_client("g", "locker")
    e.submit_next("locker", [Task("L", None, LOCK)])  # waits for the device: nothing ready yet
    clock.advance(0.75)
    assert [r.task_id for r in e.advance()] == [1, 2, "L"]
    # a result ready at once (the unlock, on the idle held device) means: look now
    assert e.submit_next("locker", [Task("U", None, UNLOCK)]) == clock.now()
    assert [r.kind for r in e.advance()] == [UNLOCK]
    assert e.submit_next("c", []) is None
