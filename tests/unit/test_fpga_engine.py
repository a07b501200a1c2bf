"""The emulated FPGA-server (irm_fpga.engine) on a virtual clock: shortest-queue dispatch,
lock/unlock exclusivity, resizing under load without losing or duplicating a task, shrink waiting
for the running task, reconfiguration failures leading to blacklisting, revocation, detaching."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from irm_fpga.engine import (
    LOCK,
    RUN,
    UNLOCK,
    AlreadyExistsError,
    CapacityError,
    Engine,
    EngineConfig,
    NotFoundError,
    PreconditionError,
    Result,
    Task,
)
from services.clock import VirtualClock


def make(devices: int = 8, **cfg: object) -> tuple[Engine, VirtualClock]:
    clock = VirtualClock()
    cfg.setdefault("reconfig_std_s", 0.0)
    cfg.setdefault("reconfig_mean_s", 1.0)
    return Engine(clock, EngineConfig(devices=devices, **cfg)), clock  # type: ignore[arg-type]


def run_to(engine: Engine, clock: VirtualClock, t: float) -> list[Result]:
    """Advance event by event up to t (as a live server loop would)."""
    out: list[Result] = []
    while True:
        nxt = engine.next_event_time()
        if nxt is None or nxt > t:
            break
        clock.advance_to(max(nxt, clock.now()))
        out += engine.advance()
    clock.advance_to(max(t, clock.now()))
    out += engine.advance()
    return out


def drain(engine: Engine, clock: VirtualClock) -> list[Result]:
    return run_to(engine, clock, 1e9)


def sleeps(ids: range | list[int], d: float) -> list[Task]:
    return [Task(i, {"duration": d}) for i in ids]


def ready_group(engine: Engine, clock: VirtualClock, gid: str, size: int, design: str = "sleep",
                **kw: int) -> None:
    engine.create_group(gid, design, size, **kw)
    run_to(engine, clock, clock.now() + 2.0)      # reconfigurations (1 s) done
    assert engine.group_info(gid).size == size


def no_overlap_per_device(results: list[Result]) -> None:
    by_dev: dict[int, list[Result]] = {}
    for r in results:
        if r.kind == RUN and r.device >= 0:
            by_dev.setdefault(r.device, []).append(r)
    for rs in by_dev.values():
        rs.sort(key=lambda r: r.started_at)
        for a, b in zip(rs, rs[1:], strict=False):
            assert b.started_at >= a.finished_at - 1e-12, (a, b)


# -- basics -----------------------------------------------------------------------------------------

def test_create_group_reconfigures_then_runs_tasks_with_emulated_time() -> None:
    e, clock = make()
    e.create_group("g", "sleep", 2)
    states = e.device_states()
    assert [s.state for s in states[:2]] == ["reconfiguring"] * 2
    assert all(s.state == "unassigned" for s in states[2:])
    e.attach_client("g", "c")
    e.submit("c", sleeps(range(4), 0.5))
    assert e.next_event_time() == pytest.approx(1.0)       # nothing runs before the devices join
    res = run_to(e, clock, 1.9)
    assert sorted(r.task_id for r in res) == [0, 1]
    assert all(r.started_at == pytest.approx(1.0) and r.finished_at == pytest.approx(1.5) for r in res)
    res += drain(e, clock)
    assert sorted(r.task_id for r in res) == [0, 1, 2, 3]
    r = res[-1]
    assert (r.queue_time, r.device_time, r.latency) == pytest.approx((1.5, 0.5, 2.0))
    assert {r.device for r in res} == {0, 1}


def test_results_are_handed_out_only_when_the_clock_reaches_them() -> None:
    e, clock = make()
    ready_group(e, clock, "g", 1)
    e.attach_client("g", "c")
    t0 = clock.now()
    e.submit("c", sleeps(range(3), 0.001))
    assert e.advance() == []
    assert e.next_event_time() == pytest.approx(t0 + 0.001)
    clock.advance(0.0015)
    assert [r.task_id for r in e.advance()] == [0]
    clock.advance(0.01)
    assert [r.task_id for r in e.advance()] == [1, 2]


def test_real_designs_compute_in_the_engine() -> None:
    e, clock = make()
    ready_group(e, clock, "bs", 1, design="black_scholes")
    e.attach_client("bs", "c")
    params = {"spot": [100.0], "strike": 100.0, "rate": 0.05, "volatility": 0.2, "maturity": 1.0}
    e.submit("c", [Task("opt", params)])
    (r,) = drain(e, clock)
    assert r.error is None and r.value["price"][0] == pytest.approx(10.450583572185565, rel=1e-9)
    assert r.device_time == pytest.approx(2e-6 + 65 / 200e6)


def test_submit_is_all_or_nothing_with_a_precise_error() -> None:
    e, clock = make()
    ready_group(e, clock, "g", 1)
    e.attach_client("g", "c")
    with pytest.raises(ValueError, match=r"task 1 \('b'\): sleep: 'duration' must be >= 0"):
        e.submit("c", [Task("a", {"duration": 1.0}), Task("b", {"duration": -1.0})])
    assert e.queue_lengths("c") == [0] * 8
    with pytest.raises(ValueError, match="unknown kind 'explode'"):
        e.submit("c", [Task("x", None, "explode")])
    with pytest.raises(PreconditionError, match="unlock without a lock"):
        e.submit("c", [Task("u", None, UNLOCK)])
    with pytest.raises(NotFoundError):
        e.submit("nobody", sleeps([1], 1.0))
    assert drain(e, clock) == []


def test_group_and_capacity_errors() -> None:
    e, clock = make(devices=4)
    e.create_group("a", "sleep", 3)
    with pytest.raises(CapacityError, match="1 of 4 usable"):
        e.create_group("b", "sleep", 2)
    with pytest.raises(AlreadyExistsError):
        e.create_group("a", "fft", 1)
    with pytest.raises(ValueError, match="unknown design"):
        e.create_group("c", "quantum", 1)
    with pytest.raises(ValueError, match="outside"):
        e.resize_group("a", 3, max_size=2)
    with pytest.raises(NotFoundError):
        e.resize_group("zzz", 1)
    e.create_group("b", "fft", 1)
    with pytest.raises(CapacityError):
        e.apply_sizes({"a": 3, "b": 2})
    e.apply_sizes({"a": 1, "b": 3})     # shrinks first, so this fits
    assert (e.group_info("a").target, e.group_info("b").target) == (1, 3)


# -- queues -------------------------------------------------------------------------------------------

def test_each_task_goes_to_the_shortest_queue() -> None:
    e, clock = make()
    ready_group(e, clock, "g", 1)
    e.attach_client("g", "c")
    e.submit("c", sleeps(range(10), 1.0))
    assert e.queue_lengths("c") == [2, 2, 1, 1, 1, 1, 1, 1]
    rng = random.Random(5)
    for i in range(300):
        before = e.queue_lengths("c")
        clock.advance(rng.choice([0.0, 0.3, 0.7, 1.0]))
        e.advance()
        before = e.queue_lengths("c")
        e.submit("c", sleeps([100 + i], rng.choice([0.2, 1.0, 3.0])))
        after = e.queue_lengths("c")
        diff = [a - b for a, b in zip(after, before, strict=True)]
        chosen = diff.index(1)
        assert sorted(diff) == [0] * 7 + [1]
        assert before[chosen] == min(before) and chosen == before.index(min(before))
    # a batch fills queues level by level
    e2, c2 = make()
    ready_group(e2, c2, "g", 1)
    e2.attach_client("g", "c")
    e2.submit("c", sleeps(range(3), 1.0))
    e2.submit("c", sleeps(range(3, 20), 1.0))
    assert e2.queue_lengths("c") == [3, 3, 3, 3, 2, 2, 2, 2]


def test_queues_take_free_devices_first_come_first_served() -> None:
    e, clock = make()
    ready_group(e, clock, "g", 1)
    e.attach_client("g", "c")
    t0 = clock.now()
    e.submit("c", sleeps(range(10), 1.0))     # queues: q0=[0,8] q1=[1,9] q2=[2] ... q7=[7]
    res = drain(e, clock)
    # one device: q0 runs task 0, then each waiting queue in turn, q0 again (task 8), q1 (task 9)
    assert [r.task_id for r in res] == [0, 1, 2, 3, 4, 5, 6, 7, 8, 9]
    assert [r.started_at - t0 for r in res] == pytest.approx(list(range(10)))


def test_two_clients_share_a_group_each_with_own_queues() -> None:
    e, clock = make()
    ready_group(e, clock, "g", 2)
    e.attach_client("g", "a")
    e.attach_client("g", "b")
    e.submit("a", sleeps(range(20), 0.1))
    e.submit("b", sleeps(range(100, 120), 0.1))
    assert sum(e.queue_lengths("a")) == 20 and sum(e.queue_lengths("b")) == 20
    res = drain(e, clock)
    assert Counter(r.client_id for r in res) == {"a": 20, "b": 20}
    no_overlap_per_device(res)
    # queues are served in turn: b does not wait for a's whole batch; both finish within two rounds
    a_ends = sorted(r.finished_at for r in res if r.client_id == "a")
    assert min(r.started_at for r in res if r.client_id == "b") <= a_ends[7] + 1e-9   # after one turn of a's 8 queues
    last = {c: max(r.finished_at for r in res if r.client_id == c) for c in "ab"}
    assert abs(last["a"] - last["b"]) <= 0.2 + 1e-9


# -- lock / unlock ------------------------------------------------------------------------------------

def test_lock_gives_a_client_exclusive_use_of_one_device_until_unlock() -> None:
    e, clock = make()
    ready_group(e, clock, "g", 2)
    e.attach_client("g", "a")
    e.attach_client("g", "b")
    e.submit("a", [Task("L", None, LOCK)] + sleeps(range(5), 1.0) + [Task("U", None, UNLOCK)])
    assert sorted(e.queue_lengths("a")) == [0] * 7 + [6]        # pinned to one queue; the lock ran at once
    e.submit("b", sleeps(range(100, 112), 0.5))
    t_b_submit = clock.now()
    res = drain(e, clock)
    lock = next(r for r in res if r.kind == LOCK)
    unlock = next(r for r in res if r.kind == UNLOCK)
    dev = lock.value["device"]
    assert unlock.value["device"] == dev
    a_runs = [r for r in res if r.client_id == "a" and r.kind == RUN]
    assert {r.device for r in a_runs} == {dev}
    assert unlock.finished_at == pytest.approx(max(r.finished_at for r in a_runs))
    # no task of b touched the locked device while the lock was held
    for r in res:
        if r.client_id == "b" and r.device == dev:
            assert r.started_at >= unlock.finished_at - 1e-12
    # b kept the other device busy meanwhile, and got both after the unlock
    b_runs = [r for r in res if r.client_id == "b"]
    assert min(r.started_at for r in b_runs) == pytest.approx(t_b_submit)
    assert len({r.device for r in b_runs}) == 2 or max(r.finished_at for r in b_runs) <= unlock.finished_at
    no_overlap_per_device(res)
    assert sorted(r.task_id for r in a_runs) == list(range(5))


def test_lock_waits_for_a_device_and_a_held_device_stays_idle_between_tasks() -> None:
    e, clock = make()
    ready_group(e, clock, "g", 1)
    e.attach_client("g", "a")
    e.attach_client("g", "b")
    e.submit("b", sleeps([0], 2.0))
    e.submit("a", [Task("L", None, LOCK)])
    res = run_to(e, clock, clock.now() + 2.5)
    assert [r.kind for r in res] == [RUN, LOCK]            # the lock waited for b's task
    e.submit("b", sleeps([1], 1.0))                        # b cannot run: the only device is held
    assert run_to(e, clock, clock.now() + 5.0) == []
    e.submit("a", sleeps(["x"], 1.0) + [Task("U", None, UNLOCK)])
    res = drain(e, clock)
    assert [(r.client_id, r.task_id) for r in res] == [("a", "x"), ("a", "U"), ("b", 1)]
    with pytest.raises(PreconditionError, match="already holds"):
        e.submit("a", [Task("L1", None, LOCK), Task("L2", None, LOCK)])


# -- elasticity ---------------------------------------------------------------------------------------

def test_resize_under_load_loses_and_duplicates_no_task() -> None:
    e, clock = make(reconfig_mean_s=0.5, reconfig_std_s=0.05, seed=3)
    ready_group(e, clock, "g", 2)
    e.create_group("other", "fft", 1)
    e.attach_client("g", "c")
    e.attach_client("g", "d")
    rng = random.Random(9)
    ids = 0
    res: list[Result] = []
    plan = {5.0: 6, 9.0: 1, 10.0: 4, 14.0: 2, 14.2: 7, 18.0: 3}
    t = clock.now()
    end = t + 25.0
    while t < end:
        t += 0.05
        res += run_to(e, clock, t)
        for at, size in list(plan.items()):
            if t >= at:
                e.resize_group("g", size)
                del plan[at]
        if t < end - 5:
            who = rng.choice("cd")
            n = rng.randint(0, 12)
            e.submit(who, [Task((who, ids + i), {"duration": rng.choice([0.001, 0.01, 0.05])}) for i in range(n)])
            ids += n
    res += drain(e, clock)
    got = Counter(r.task_id for r in res)
    assert sum(got.values()) == ids and all(v == 1 for v in got.values())
    assert all(r.error is None for r in res)
    no_overlap_per_device(res)
    # a device only ran this group's tasks while it was a member
    members: dict[int, list[list[float]]] = {}
    for ev in e.drain_events():
        if ev.group_id == "g" and ev.kind == "joined":
            members.setdefault(ev.device, []).append([ev.time, float("inf")])
        if ev.group_id == "g" and ev.kind == "left":
            members[ev.device][-1][1] = ev.time
    for r in res:
        assert any(a - 1e-12 <= r.started_at and r.finished_at <= b + 1e-12 for a, b in members[r.device]), r
    assert e.group_info("g").size == 3 and e.group_info("g").draining == 0


def test_shrink_waits_until_the_running_task_ends() -> None:
    e, clock = make()
    ready_group(e, clock, "g", 2)
    e.attach_client("g", "c")
    t0 = clock.now()
    e.submit("c", [Task("long", {"duration": 5.0}), Task("short", {"duration": 2.0})] + sleeps(range(3), 1.0))
    info = e.resize_group("g", 1)
    assert (info.size, info.draining) == (1, 1)
    states = {s.task_id: s for s in e.device_states() if s.task_id is not None}
    assert states["short"].draining and not states["long"].draining
    res = drain(e, clock)
    left = [ev for ev in e.drain_events() if ev.kind == "left"]
    assert len(left) == 1 and left[0].device == states["short"].index
    assert left[0].time == pytest.approx(t0 + 2.0)           # the moment its task ended
    assert sorted(map(str, (r.task_id for r in res))) == ["0", "1", "2", "long", "short"]
    after = [r for r in res if r.started_at >= t0 + 2.0 - 1e-12]
    assert {r.device for r in after} == {states["long"].index}


def test_growing_reuses_a_device_still_configured_with_the_design() -> None:
    e, clock = make()
    ready_group(e, clock, "g", 3)
    e.resize_group("g", 1)                 # idle members leave at once, still configured
    assert e.group_info("g").size == 1
    info = e.resize_group("g", 3)
    assert (info.size, info.joining) == (3, 0)    # no reconfiguration
    e.attach_client("g", "c")
    e.submit("c", sleeps(range(2), 10.0))
    e.resize_group("g", 1)                 # one busy member drains ...
    assert e.group_info("g").draining == 1
    assert e.resize_group("g", 2).draining == 0    # ... and simply stays when the group grows back
    assert sum(1 for ev in e.drain_events() if ev.kind == "reconfiguring") == 3


def test_grow_waits_for_devices_released_by_another_group() -> None:
    e, clock = make(devices=4)
    ready_group(e, clock, "a", 3)
    ready_group(e, clock, "b", 1, design="fft")
    e.attach_client("a", "ca")
    e.submit("ca", sleeps(range(3), 4.0))
    t0 = clock.now()
    e.apply_sizes({"a": 1, "b": 3})
    assert e.group_info("b").joining == 0 and e.group_info("a").draining == 2
    drain(e, clock)
    joins = [ev for ev in e.drain_events() if ev.kind == "joined" and ev.group_id == "b" and ev.time > t0]
    assert len(joins) == 2 and all(ev.time == pytest.approx(t0 + 4.0 + 1.0) for ev in joins)
    assert e.group_info("b").size == 3


# -- failures -----------------------------------------------------------------------------------------

def test_repeated_reconfiguration_failure_blacklists_and_the_group_keeps_working() -> None:
    e, clock = make(blacklist_after=3)
    e.inject_reconfiguration_failures(0, 5)
    e.create_group("g", "sleep", 2)
    e.attach_client("g", "c")
    e.submit("c", sleeps(range(6), 1.0))
    res = drain(e, clock)
    assert sorted(r.task_id for r in res) == list(range(6))
    events = e.drain_events()
    kinds0 = [ev.kind for ev in events if ev.device == 0]
    assert kinds0 == ["reconfiguring", "reconfiguration_failed"] * 3 + ["blacklisted"]
    assert [ev.device for ev in events if ev.kind == "joined"] == [1, 2]
    dev0 = e.device_states()[0]
    assert (dev0.state, dev0.blacklisted, dev0.healthy, dev0.failures) == ("blacklisted", True, False, 3)
    assert e.group_info("g").size == 2 and 0 not in {r.device for r in res}
    m = e.measurements()
    assert (m.usable, m.reconfiguration_failures) == (7, 3)
    # the blacklisted device no longer counts as capacity
    with pytest.raises(CapacityError):
        e.create_group("big", "fft", 6)
    e.reinstate_device(0)
    assert e.device_states()[0].state == "unassigned"


def test_random_failures_are_seeded_and_retried() -> None:
    def run(seed: int) -> list[tuple[int, str]]:
        e, clock = make(reconfig_failure_rate=0.4, blacklist_after=2, seed=seed)
        e.create_group("g", "sleep", 5)
        drain(e, clock)
        assert e.group_info("g").size == 5
        return [(ev.device, ev.kind) for ev in e.drain_events()]

    a, b = run(1), run(1)
    assert a == b
    assert any(k == "reconfiguration_failed" for _, k in a)


# -- clients ------------------------------------------------------------------------------------------

def test_revoke_cancels_queued_tasks_and_withholds_running_results() -> None:
    e, clock = make()
    ready_group(e, clock, "g", 1)
    e.attach_client("g", "a")
    e.attach_client("g", "b")
    e.submit("a", sleeps(range(5), 1.0))
    e.submit("b", sleeps(range(10, 13), 1.0))
    clock.advance(0.5)
    assert e.revoke_client("a") == 4
    res = drain(e, clock)
    a = [r for r in res if r.client_id == "a"]
    assert len(a) == 5 and all(r.error == "revoked" and r.value is None for r in a)
    assert sorted(r.task_id for r in res if r.client_id == "b" and r.error is None) == [10, 11, 12]
    (running,) = [r for r in a if r.device >= 0]
    assert running.finished_at - running.started_at == pytest.approx(1.0)   # it ran to its end
    assert min(r.started_at for r in res if r.client_id == "b") == pytest.approx(running.finished_at)
    with pytest.raises(NotFoundError):
        e.submit("a", sleeps([9], 1.0))
    assert e.group_info("g").clients == ("b",)


def test_revoking_a_lock_holder_frees_its_device() -> None:
    e, clock = make()
    ready_group(e, clock, "g", 1)
    e.attach_client("g", "a")
    e.attach_client("g", "b")
    e.submit("a", [Task("L", None, LOCK)])
    e.submit("b", sleeps([1], 1.0))
    run_to(e, clock, clock.now() + 3)
    e.revoke_client("a")
    (r,) = drain(e, clock)
    assert (r.client_id, r.task_id, r.error) == ("b", 1, None)


def test_detach_waits_for_outstanding_work() -> None:
    e, clock = make()
    ready_group(e, clock, "g", 1)
    e.attach_client("g", "a")
    e.submit("a", sleeps(range(3), 1.0))
    e.detach_client("a")
    with pytest.raises(PreconditionError):
        e.submit("a", sleeps([5], 1.0))
    assert e.group_info("g").clients == ("a",)
    res = drain(e, clock)
    assert [r.task_id for r in res] == [0, 1, 2] and all(r.error is None for r in res)
    assert e.group_info("g").clients == ()
    e.attach_client("g", "a")      # the id is free again


def test_delete_group_releases_everything() -> None:
    e, clock = make()
    ready_group(e, clock, "g", 3)
    e.attach_client("g", "a")
    e.submit("a", sleeps(range(6), 1.0))
    e.delete_group("g")
    res = drain(e, clock)
    assert len(res) == 6 and all(r.error == "revoked" for r in res)
    assert all(s.state == "unassigned" for s in e.device_states())
    assert e.groups() == []


def test_scheduled_arrivals_follow_the_submit_path() -> None:
    e, clock = make()
    ready_group(e, clock, "g", 2)
    e.attach_client("g", "c")
    t0 = clock.now()
    times = [t0 + x for x in (0.0, 0.1, 0.1, 0.5, 2.0)]
    e.schedule("c", sleeps(range(5), 0.3), times)
    res = drain(e, clock)
    assert [r.submitted_at for r in res] == pytest.approx(times)
    starts = {r.task_id: r.started_at - t0 for r in res}
    assert starts == pytest.approx({0: 0.0, 1: 0.1, 2: 0.3, 3: 0.5, 4: 2.0})
    with pytest.raises(ValueError, match="non-decreasing"):
        e.schedule("c", sleeps(range(2), 0.3), [clock.now() + 1, clock.now()])


def test_measurements_count_executed_tasks_busy_time_and_waiting() -> None:
    e, clock = make()
    ready_group(e, clock, "g", 2, min_size=1, max_size=4)
    e.attach_client("g", "a")
    e.attach_client("g", "b")
    e.submit("a", sleeps(range(4), 0.5))
    e.submit("b", sleeps(range(10, 20), 0.25))
    m0 = e.measurements()
    (g0,) = m0.groups
    assert (g0.size, g0.min_size, g0.max_size, g0.waiting, g0.running) == (2, 1, 4, 12, 2)
    run_to(e, clock, clock.now() + 1.0)
    (g1,) = e.measurements().groups
    ca, cb = g1.clients
    assert g1.busy_s == pytest.approx(2.0)          # two devices busy for 1 s
    assert g1.executed == ca.executed + cb.executed
    assert ca.executed * 0.5 + cb.executed * 0.25 == pytest.approx(2.0)
    assert ca.waiting + cb.waiting + g1.running + g1.executed == 14


def test_measurements_count_failed_tasks_apart_and_a_remade_group_is_a_new_incarnation() -> None:
    # A job's progress is its group's tasks that succeeded, read across the group's makings (issue 5).
    e, clock = make()
    ready_group(e, clock, "g", 1)
    e.attach_client("g", "a")
    e.attach_client("g", "b")
    e.submit("a", sleeps(range(3), 1.0))
    e.submit("b", sleeps([10], 1.0))
    clock.advance(0.5)
    e.revoke_client("a")                       # one running (ends "revoked"), two queued (cancelled)
    drain(e, clock)
    (g,) = e.measurements().groups
    assert (g.executed, g.failed) == (2, 1)    # the revoked running task and b's task ran; one failed
    first = g.incarnation
    assert first
    e.delete_group("g")
    ready_group(e, clock, "g", 1)              # made again under the same id: counters from 0
    (g,) = e.measurements().groups
    assert (g.executed, g.failed) == (0, 0) and g.incarnation != first
