"""The FPGA-server's handlers in-process (review 15): results go back to the sink their task came on, a bad task on
an Execute stream fails alone, a stream that ends early takes its queued tasks and its lock with it, a stopping
server ends a stream that still owes results UNAVAILABLE, Execute streams are capped, and RunDirect holds its device
only while its caller waits, for control callers only.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from harness.v1 import fpga_pb2
from irm_fpga.server import _OTHER_WORKERS, FpgaServerConfig, FpgaServerService, component
from services import control
from services.errors import (
    STREAM_CAP,
    FailedPrecondition,
    InvalidArgument,
    ResourceExhausted,
    Unauthenticated,
    Unavailable,
)
from tests.conftest import eventually
from tests.unit.test_fpga_server import Stream as BaseStream
from tests.unit.test_fpga_server import batch, group, in_thread, task

LOCK, UNLOCK = fpga_pb2.Task.KIND_LOCK, fpga_pb2.Task.KIND_UNLOCK


class Ctx:
    """The bits of a grpc.ServicerContext the handlers use; `active` turns False when the caller goes."""

    def __init__(self, metadata: tuple = ()) -> None:
        self.active = True
        self.metadata = metadata

    def time_remaining(self) -> float | None:
        return None

    def is_active(self) -> bool:
        return self.active

    def invocation_metadata(self) -> tuple:
        return self.metadata


def service(**kw: object) -> FpgaServerService:
    s = FpgaServerService(FpgaServerConfig(name="fpga-t", devices=kw.pop("devices", 4),  # type: ignore[arg-type]
                                           reconfig_mean_s=0.0, reconfig_std_s=0.0, **kw))  # type: ignore[arg-type]
    s.start()
    return s


@pytest.fixture
def svc() -> Iterator[FpgaServerService]:
    s = service()
    try:
        yield s
    finally:
        s.stop()


class Stream(BaseStream):
    """test_fpga_server's in-process Execute stream, with this file's context, and a client that goes away."""

    def __init__(self, s: FpgaServerService, first: fpga_pb2.TaskBatch, ctx: Ctx | None = None) -> None:
        super().__init__(s, first, ctx or Ctx())

    def by_id(self) -> dict[int, fpga_pb2.TaskResult]:
        return {r.id: r for r in self.results}

    def cancel(self) -> None:
        """The client goes away (a cancel, a broken connection): its requests end and the call is no longer
        active."""
        self.ctx.active = False
        self.inbox.put(None)
        self.thread.join(5)
        assert not self.thread.is_alive()


# -- 1. results go to the sink that sent the task ----------------------------------------------------------------


def test_the_same_task_id_on_a_stream_and_a_run_batch_of_one_client_each_get_their_own_result(
        svc: FpgaServerService) -> None:
    group(svc, "g", 2, "c")
    st = Stream(svc, batch("c", task(7, 0.4)))
    eventually(lambda: svc.engine.group_info("g").running == 1, timeout=5)
    (r,) = svc.RunBatch(batch("c", task(7, 0.01)), Ctx()).results
    assert r.device_time_s == pytest.approx(0.01)
    eventually(lambda: st.results, timeout=5)
    st.end()
    # The stream's own task, once: not the RunBatch's result (which finished first) in its place.
    assert [(x.id, round(x.device_time_s, 3)) for x in st.results] == [(7, 0.4)]
    assert st.error is None


def test_two_streams_of_one_client_with_the_same_ids_each_get_their_own_results(svc: FpgaServerService) -> None:
    # Two processes attached as one client (the Orchestrator gives them the same token), both numbering from 1.
    group(svc, "g", 4, "worker")
    slow = Stream(svc, batch("worker", *(task(i, 0.3) for i in (1, 2))))
    eventually(lambda: svc.engine.group_info("g").running == 2, timeout=5)
    fast = Stream(svc, batch("worker", *(task(i, 0.01) for i in (1, 2))))
    eventually(lambda: len(fast.results) == 2 and len(slow.results) == 2, timeout=5)
    fast.end()
    slow.end()
    assert sorted((r.id, round(r.device_time_s, 3)) for r in fast.results) == [(1, 0.01), (2, 0.01)]
    assert sorted((r.id, round(r.device_time_s, 3)) for r in slow.results) == [(1, 0.3), (2, 0.3)]


# -- 3. a bad task on a stream fails alone -----------------------------------------------------------------------


def test_a_bad_task_on_a_stream_fails_alone_named_by_its_id_and_a_lock_with_it_is_granted(
        svc: FpgaServerService) -> None:
    group(svc, "g", 2, "s")
    bad_kind = fpga_pb2.Task(id=24, kind=9)
    undecodable = task(25)
    undecodable.params["duration"].array.dtype = "<f8"
    undecodable.params["duration"].array.data = b"xyz"
    st = Stream(svc, batch("s", task(21, 0.01), task(22, -1.0), task(23, 0.01), bad_kind, undecodable,
                           task(26, kind=LOCK), task(27, 0.01)))
    eventually(lambda: len(st.results) == 7, timeout=5)
    got = st.by_id()
    assert [i for i in sorted(got) if not got[i].error] == [21, 23, 26, 27]
    assert got[22].error == "task 22: sleep: 'duration' must be >= 0.0, got -1.0"
    assert got[24].error.startswith("task 24: kind: unknown task kind 9; one of KIND_UNSPECIFIED (0)")
    assert got[25].error.startswith("task 25: params.duration: ") and "bytes do not fit" in got[25].error
    # No index of a batch the client's caller never formed.
    assert not any("tasks[" in r.error or "task 1 " in r.error for r in st.results)
    # The LOCK sent with them holds a device, and the task after it ran there.
    assert got[26].kind == LOCK and got[27].device == got[26].value["device"].integer
    # A second LOCK and a stray run task in one batch: only the LOCK is refused.
    st.send(batch("s", task(28, kind=LOCK), task(29, 0.01)))
    eventually(lambda: {28, 29} <= set(st.by_id()), timeout=5)
    got = st.by_id()
    assert got[28].error == "task 28: client 's' already holds or awaits a lock; unlock first"
    assert got[29].error == ""
    st.send(batch("s", task(30, kind=UNLOCK), task(31, kind=UNLOCK)))
    eventually(lambda: {30, 31} <= set(st.by_id()), timeout=5)
    got = st.by_id()
    assert (got[30].error, got[31].error) == ("", "task 31: unlock without a lock")
    st.end()
    assert st.error is None


def test_a_stream_batch_whose_shared_params_are_bad_fails_each_of_its_tasks_naming_them(
        svc: FpgaServerService) -> None:
    group(svc, "g", 1, "s")
    b = batch("s", task(1), task(2))
    b.shared_params["duration"].array.dtype = "<f8"
    b.shared_params["duration"].array.data = b"x"
    st = Stream(svc, b)
    eventually(lambda: len(st.results) == 2, timeout=5)
    assert all(r.error.startswith(f"task {r.id}: shared_params.duration: ") for r in st.results)
    st.send(batch("s", task(3, 0.01)))   # the stream goes on
    eventually(lambda: 3 in st.by_id(), timeout=5)
    assert st.by_id()[3].error == ""
    st.end()


def test_run_batch_still_refuses_a_batch_with_a_bad_task_naming_its_field(svc: FpgaServerService) -> None:
    group(svc, "g", 1, "c")
    with pytest.raises(InvalidArgument) as e:
        svc.RunBatch(batch("c", task(1, 0.01), task(2, -1.0)), Ctx())
    assert [v.field for v in e.value.violations] == ["tasks[1].params.duration"]
    assert "task 1 (2)" in str(e.value)     # the engine's message names the client's id, not the sink
    assert svc.engine.group_info("g").waiting == 0


# -- 4. a stream that ends early takes its queued tasks and its lock with it -------------------------------------


def test_a_cancelled_stream_takes_its_queued_tasks_out_and_the_clients_next_task_does_not_wait(
        svc: FpgaServerService) -> None:
    group(svc, "g", 1, "c")
    st = Stream(svc, batch("c", *(task(i, 0.5) for i in range(1, 21))))
    eventually(lambda: svc.engine.group_info("g").running == 1, timeout=5)
    st.cancel()
    # Not started: out of the engine at once; the running one finishes on its device.
    eventually(lambda: svc.engine.group_info("g").waiting == 0, timeout=2)
    (r,) = svc.RunBatch(batch("c", task(100, 0.01)), Ctx()).results
    assert r.error == "" and r.queue_time_s < 0.6
    eventually(lambda: svc.sinks == {} and svc.waiting_handlers == 0 and not svc.engine.busy(), timeout=5)
    assert svc.engine.measurements().groups[0].executed == 2


def test_a_lock_taken_on_a_stream_ends_with_the_stream(svc: FpgaServerService) -> None:
    group(svc, "g", 2, "c", "other")
    st = Stream(svc, batch("c", task(1, kind=LOCK)))
    eventually(lambda: 1 in st.by_id(), timeout=5)
    held = st.by_id()[1].value["device"].integer
    assert svc.engine.device_state(held).locked_by == "c"
    st.cancel()
    eventually(lambda: svc.engine.device_state(held).locked_by is None, timeout=2)
    # Both devices serve again, and the client may lock anew (no "already holds").
    rb = svc.RunBatch(batch("other", task(1, 0.2), task(2, 0.2)), Ctx())
    assert sorted(r.device for r in rb.results) == [0, 1]
    (lk,) = svc.RunBatch(batch("c", task(2, kind=LOCK)), Ctx()).results
    assert lk.error == ""
    svc.RunBatch(batch("c", task(3, kind=UNLOCK)), Ctx())


def test_a_lock_queued_behind_a_cancelled_streams_tasks_is_not_left_pending(svc: FpgaServerService) -> None:
    group(svc, "g", 1, "c")
    st = Stream(svc, batch("c", task(1, 0.3), task(2, kind=LOCK), task(3, 0.01)))
    eventually(lambda: svc.engine.group_info("g").running == 1, timeout=5)
    st.cancel()
    eventually(lambda: svc.engine.group_info("g").waiting == 0, timeout=2)
    (lk,) = svc.RunBatch(batch("c", task(4, kind=LOCK)), Ctx()).results
    assert lk.error == ""


def test_a_stream_ending_leaves_a_lock_another_call_took_alone(svc: FpgaServerService) -> None:
    group(svc, "g", 1, "c")
    (lk,) = svc.RunBatch(batch("c", task(1, kind=LOCK)), Ctx()).results   # not the stream's lock
    st = Stream(svc, batch("c", task(2, 0.3), task(3, 0.01), task(4, 0.01)))
    eventually(lambda: svc.engine.group_info("g").running == 1, timeout=5)
    st.cancel()
    eventually(lambda: svc.engine.group_info("g").waiting == 0, timeout=2)
    assert svc.engine.device_state(lk.device).locked_by == "c"
    (unlock,) = svc.RunBatch(batch("c", task(5, kind=UNLOCK)), Ctx()).results
    assert unlock.error == ""


# -- 5. a stopping server ends a stream that owes results UNAVAILABLE --------------------------------------------


def test_a_stopping_server_ends_a_stream_that_still_owes_results_unavailable() -> None:
    s = service(devices=1)
    try:
        group(s, "g", 1, "owed", "done")
        owed = Stream(s, batch("owed", *(task(i, 0.5) for i in range(1, 11))))
        done = Stream(s, batch("done"))    # owes nothing
        eventually(lambda: s.engine.group_info("g").running == 1, timeout=5)
        s.quiesce()
        owed.thread.join(5)
        done.thread.join(5)
        assert isinstance(owed.error, Unavailable), owed.error
        assert "the FPGA-server is stopping" in str(owed.error) and "10 task(s)" in str(owed.error)
        assert done.error is None and not done.thread.is_alive()
    finally:
        s.stop()


# -- 2. Execute streams are capped below the server's worker threads ---------------------------------------------


def test_execute_streams_beyond_the_cap_are_resource_exhausted_and_the_server_keeps_threads_for_the_rest() -> None:
    s = service(max_execute_streams=2)
    try:
        group(s, "g", 1, "c")
        a, b = Stream(s, batch("c")), Stream(s, batch("c"))
        eventually(lambda: s.streams.open == 2, timeout=5)
        third = Stream(s, batch("c"))
        third.thread.join(5)
        assert isinstance(third.error, ResourceExhausted) and third.error.reason == STREAM_CAP
        assert "max_execute_streams=2" in str(third.error)
        a.end()
        eventually(lambda: s.streams.open == 1, timeout=5)
        fourth = Stream(s, batch("c", task(1, 0.01)))
        eventually(lambda: 1 in fourth.by_id(), timeout=5)
        fourth.end()
        b.end()
        assert s.streams.open == 0
    finally:
        s.stop()
    comp = component(FpgaServerConfig(max_execute_streams=40))
    assert comp.max_workers == 40 + _OTHER_WORKERS
    comp.extra["server"].stop()


@pytest.mark.parametrize("bad", [0, -1, True, 2.5])
def test_a_bad_max_execute_streams_is_refused_at_start_up_naming_the_setting(bad: object) -> None:
    with pytest.raises(ValueError, match=r"fpga_server\.max_execute_streams = .*at least 1"):
        FpgaServerService(FpgaServerConfig(max_execute_streams=bad))  # type: ignore[arg-type]


# -- 6. RunDirect ------------------------------------------------------------------------------------------------


def direct(device: int, seconds: float, design: str = "sleep") -> fpga_pb2.RunDirectRequest:
    return fpga_pb2.RunDirectRequest(device=device, design=design, task=task(1, seconds))


def test_run_direct_gives_its_device_back_when_its_caller_goes(svc: FpgaServerService) -> None:
    first, second = Ctx(), Ctx()
    th1, out1 = in_thread(svc.RunDirect, direct(3, 3600.0), first)
    eventually(lambda: svc.engine.device_state(3).state == "busy", timeout=5)
    # Another RunDirect on the same device waits for it, but not past its own caller.
    th2, out2 = in_thread(svc.RunDirect, direct(3, 0.01), second)
    second.active = False
    th2.join(3)
    assert not th2.is_alive() and isinstance(out2.get("error"), FailedPrecondition)
    first.active = False
    th1.join(3)
    assert not th1.is_alive() and isinstance(out1.get("error"), FailedPrecondition)
    assert "went away" in str(out1["error"])
    assert svc.engine.device_state(3).state == "unassigned"
    # A group may take it now.
    svc.CreateGroupPart(fpga_pb2.CreateGroupPartRequest(group_id="g", design="sleep", size=4), None)
    eventually(lambda: svc.engine.group_info("g").size == 4, timeout=5)


def test_run_direct_ends_unavailable_when_the_server_stops() -> None:
    s = service()
    try:
        th, out = in_thread(s.RunDirect, direct(0, 3600.0), Ctx())
        eventually(lambda: s.engine.device_state(0).state == "busy", timeout=5)
        s.quiesce()
        th.join(3)
        assert not th.is_alive() and isinstance(out.get("error"), Unavailable)
        assert s.engine.device_state(0).state == "unassigned"
    finally:
        s.stop()


def test_run_direct_takes_the_control_token_and_names_a_bad_device_or_design() -> None:
    s = service(control_token="secret")
    try:
        with pytest.raises(Unauthenticated):
            s.RunDirect(direct(0, 0.001), Ctx())
        with pytest.raises(Unauthenticated):
            s.RunDirect(direct(0, 0.001), Ctx(((control.METADATA_KEY, "wrong"),)))
        ok = Ctx(((control.METADATA_KEY, "secret"),))
        assert s.RunDirect(direct(0, 0.001), ok).device == 0
        with pytest.raises(InvalidArgument) as e:
            s.RunDirect(direct(4, 0.001), ok)
        assert [v.field for v in e.value.violations] == ["device"] and "0..3" in str(e.value)
        with pytest.raises(InvalidArgument) as e:
            s.RunDirect(direct(-1, 0.001), ok)
        assert [v.field for v in e.value.violations] == ["device"]
        with pytest.raises(InvalidArgument) as e:
            s.RunDirect(direct(0, 0.001, design="nope"), ok)
        assert [v.field for v in e.value.violations] == ["design"]
        assert "available: black_scholes, fft, mc_bond_option, moving_average, sleep" in str(e.value)
    finally:
        s.stop()


# -- the engine's side: `submit_each` and `abandon` on a virtual clock ------------------------------------------


def engine_with(devices: int):  # type: ignore[no-untyped-def]
    from irm_fpga.engine import Engine, EngineConfig
    from services.clock import VirtualClock

    clock = VirtualClock()
    e = Engine(clock, EngineConfig(devices=devices, reconfig_mean_s=0.0, reconfig_std_s=0.0))
    e.create_group("g", "sleep", devices)
    e.attach_client("g", "c")
    e.advance()
    return e, clock


def mine(tid: object) -> bool:
    return str(tid).startswith("a")


def test_abandoning_a_lock_whose_device_runs_a_task_frees_the_device_when_the_task_ends() -> None:
    e, clock = engine_with(2)
    assert e.submit_each("c", [("a-lock", None, "lock"), ("a-1", {"duration": 1.0}, "run")]) == []
    (lock,) = e.advance()
    held = lock.value["device"]
    e.submit("c", [("b-1", {"duration": 0.5}, "run")])     # another sender's task, pinned behind the lock
    clock.advance(0.1)
    assert e.abandon("c", mine) == 0                         # a-1 runs: nothing queued of theirs
    assert e.device_state(held).locked_by is None and e.device_state(held).state == "busy"
    clock.advance(0.9)
    assert [r.task_id for r in e.advance()] == ["a-1"]      # then b-1 starts: the queue lost its lock
    clock.advance(0.5)
    assert [r.task_id for r in e.advance()] == ["b-1"]
    assert e.submit_each("c", [("b-lock", None, "lock")]) == []   # the client may lock again
    assert e.advance()[0].error is None


def test_abandoning_drops_only_the_senders_queued_tasks_and_a_held_idle_device_goes_back() -> None:
    e, clock = engine_with(1)
    e.submit_each("c", [("a-lock", None, "lock")])
    e.advance()
    e.submit("c", [("a-1", {"duration": 1.0}, "run"), ("b-1", {"duration": 0.2}, "run"),
                   ("a-2", {"duration": 1.0}, "run"), ("a-3", {"duration": 1.0}, "run")])
    clock.advance(1.0)
    assert [r.task_id for r in e.advance()] == ["a-1"]      # b-1 runs now, a-2 and a-3 wait
    assert e.abandon("c", mine) == 2
    assert e.queue_lengths("c") == [1]                      # b-1 alone (running)
    clock.advance(0.2)
    assert [r.task_id for r in e.advance()] == ["b-1"]
    assert e.device_state(0).state == "idle" and e.device_state(0).locked_by is None
    assert not e.busy()


def test_submit_each_queues_the_good_tasks_in_order_and_says_why_for_each_bad_one() -> None:
    from irm_fpga.engine import ArgumentError, PreconditionError

    e, clock = engine_with(1)
    bad = e.submit_each("c", [("t1", {"duration": 0.1}, "run"), ("t2", {"duration": -1.0}, "run"),
                              ("t3", {"duration": 0.1}, "run"), ("t4", None, "unlock"), ("t5", None, "lock"),
                              ("t6", None, "lock"), ("t7", {"nope": 1.0}, "run")])
    assert [(i, type(x), str(x)) for i, x in bad] == [
        (1, ArgumentError, "sleep: 'duration' must be >= 0.0, got -1.0"),
        (3, PreconditionError, "unlock without a lock"),
        (5, PreconditionError, "client 'c' already holds or awaits a lock; unlock first"),
        (6, ArgumentError, "sleep: unknown parameter(s) 'nope'; expected duration"),
    ]
    clock.advance(0.2)
    assert [r.task_id for r in e.advance()] == ["t1", "t3", "t5"]
    (one,) = e.submit_each("c", [("t8", {"duration": -2.0}, "run")])   # the lone-task path too
    assert one[0] == 0 and "got -2.0" in str(one[1]) and e.queue_lengths("c") == [0]
