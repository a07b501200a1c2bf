"""The FPGA-server's data-plane handlers in-process (no gRPC, wall clock, short tasks).

RunBatch of one task is the latency path of thesis Fig. 3.4: the handler submits, sleeps until
the engine's next event and hands the result out itself. These check that the lean path still
does a group's work: token check, locks held by other clients, revocation, results carrying
queue and device time, results for other callers routed to them. Execute streams drive the
engine themselves while they are owed results (one stream at a time, handing over when done), so
they work without the dispatcher, which only looks in as a safety net while handlers drive.
"""

from __future__ import annotations

import itertools
import queue
import re
import sys
import threading
import time
from collections.abc import Iterator

import pytest

from harness.v1 import fpga_pb2
from irm_fpga.server import FpgaServerConfig, FpgaServerService
from services.errors import FailedPrecondition, InvalidArgument, PermissionDenied
from tests.conftest import eventually

RUN, LOCK, UNLOCK = fpga_pb2.Task.KIND_RUN, fpga_pb2.Task.KIND_LOCK, fpga_pb2.Task.KIND_UNLOCK


class Ctx:
    """The bits of a grpc.ServicerContext the handlers use."""

    def __init__(self, seconds: float | None = None) -> None:
        self.seconds = seconds
        self.active = True

    def time_remaining(self) -> float | None:
        return self.seconds

    def is_active(self) -> bool:
        return self.active


@pytest.fixture
def svc() -> Iterator[FpgaServerService]:
    s = FpgaServerService(FpgaServerConfig(name="fpga-t", devices=4, reconfig_mean_s=0.0, reconfig_std_s=0.0))
    s.start()
    try:
        yield s
    finally:
        s.stop()


def group(s: FpgaServerService, gid: str, size: int, *clients: str) -> None:
    s.CreateGroupPart(fpga_pb2.CreateGroupPartRequest(group_id=gid, design="sleep", size=size), None)
    for c in clients:
        s.AttachClient(fpga_pb2.ServerAttachRequest(group_id=gid, client_id=c, token=f"tok-{c}"), None)
    eventually(lambda: s.engine.group_info(gid).size == size, timeout=5)


def task(tid: int, duration: float | None = None, kind: int = RUN) -> fpga_pb2.Task:
    t = fpga_pb2.Task(id=tid, kind=kind)
    if duration is not None:
        t.params["duration"].number = duration
    return t


def batch(client: str, *tasks: fpga_pb2.Task, gid: str = "g", **kw: object) -> fpga_pb2.TaskBatch:
    return fpga_pb2.TaskBatch(client_id=client, group_id=gid, token=f"tok-{client}", tasks=tasks, **kw)


def in_thread(fn, *args):  # type: ignore[no-untyped-def]
    out: dict[str, object] = {}

    def run() -> None:
        try:
            out["value"] = fn(*args)
        except Exception as e:  # noqa: BLE001
            out["error"] = e

    th = threading.Thread(target=run, daemon=True)
    th.start()
    return th, out


_order = itertools.count()


class Nap:
    """One timed sleep of a handler on its bell. `rung`: None while it sleeps, then True if a ring ended it
    (`by`: the server function that rang), False if its timeout did -- so a test can wait until a handler is
    asleep, and tell a wake-up, and whose, from a timeout."""

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self.seq = next(_order)
        self.ended: float | None = None
        self.rung: bool | None = None
        self.by: str | None = None


class NapBell:
    """A handler's bell (a bare lock it sleeps on, rung by releasing it) that records its sleeps and rings.

    Every effective ring (a release of the held lock) is taken by exactly one successful acquire, in order:
    so the n-th acquire that succeeds was ended by the n-th ring, whoever got in between."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.lock.acquire()
        self.guard = threading.Lock()   # ringers one at a time: "held" is then checked and released as one step
        self.naps: list[Nap] = []
        self.rings: list[tuple[int, str]] = []   # (order, ringer), effective rings only
        self.taken = 0

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        nap = Nap(timeout) if blocking and timeout >= 0 else None
        if nap:
            self.naps.append(nap)
        got = self.lock.acquire(blocking, timeout) if nap else self.lock.acquire(blocking)
        by = None
        if got:
            self.taken += 1
            by = self.rings[self.taken - 1][1]
        if nap:
            nap.ended, nap.by, nap.rung = time.monotonic(), by, got
        return got

    def release(self) -> None:
        ringer = sys._getframe(2).f_code.co_name     # release <- _Bell.wake <- the ringer
        with self.guard:
            if not self.lock.locked():
                raise RuntimeError("release unlocked lock")   # already rung: _Bell.wake ignores it
            self.rings.append((next(_order), ringer))
            self.lock.release()

    def asleep(self) -> bool:
        """Asleep in a nap that began after the last ring (no ring it has not yet seen is on its way to it)."""
        last = self.rings[-1][0] if self.rings else -1
        return bool(self.naps) and self.naps[-1].rung is None and self.naps[-1].seq > last


@pytest.fixture
def bells(monkeypatch: pytest.MonkeyPatch) -> None:
    """RunBatch waiters and Execute streams made from now on sleep on a `NapBell` (`sink.bell`)."""
    import irm_fpga.server as server

    class Waiter(server._Waiter):
        def __init__(self, expect) -> None:  # type: ignore[no-untyped-def]
            super().__init__(expect)
            self.bell = NapBell()

    class Stream(server._Stream):
        def __init__(self) -> None:
            super().__init__()
            self.bell = NapBell()

    monkeypatch.setattr(server, "_Waiter", Waiter)
    monkeypatch.setattr(server, "_Stream", Stream)


def sink_of(s: FpgaServerService, client: str) -> NapBell:
    """The bell of `client`'s only sink (a RunBatch waiter or an Execute stream), once it has one."""
    return eventually(lambda: s.sinks.get(client), timeout=5, interval=0.002)[0].bell


def test_one_task_comes_back_with_queue_time_device_time_and_device(svc: FpgaServerService) -> None:
    group(svc, "g", 1, "c")
    t0 = time.monotonic()
    rb = svc.RunBatch(batch("c", task(5, 0.02)), Ctx(10))
    assert time.monotonic() - t0 >= 0.02
    (r,) = rb.results
    assert (r.id, r.kind, r.error, r.device, r.server) == (5, RUN, "", 0, "fpga-t")
    assert r.device_time_s == pytest.approx(0.02)
    assert 0.0 <= r.queue_time_s < 0.01
    # nothing was left behind: no sink, no handler count, nothing for the dispatcher
    assert svc.sinks == {} and svc.waiting_handlers == 0 and not svc.engine.busy()
    m = svc.engine.measurements().groups[0]
    assert (m.executed, m.busy_s) == (1, pytest.approx(0.02))


def test_batches_shared_params_and_the_direct_baseline(svc: FpgaServerService) -> None:
    group(svc, "g", 2, "c")
    b = batch("c", task(1), task(2, 0.01), task(3))
    b.shared_params["duration"].number = 0.005
    rb = svc.RunBatch(b, Ctx(10))
    assert {r.id: round(r.device_time_s, 6) for r in rb.results} == {1: 0.005, 2: 0.01, 3: 0.005}
    one = batch("c", task(4))
    one.shared_params["duration"].number = 0.003
    (r,) = svc.RunBatch(one, Ctx(10)).results
    assert r.device_time_s == pytest.approx(0.003)
    # RunDirect: a device outside every group, same result encoding
    d = svc.RunDirect(fpga_pb2.RunDirectRequest(device=3, design="sleep", task=task(9, 0.004)), Ctx())
    assert (d.id, d.kind, d.device, d.server, d.queue_time_s) == (9, RUN, 3, "fpga-t", 0.0)
    assert d.device_time_s == pytest.approx(0.004)
    with pytest.raises(FailedPrecondition, match="belongs to a group"):
        svc.RunDirect(fpga_pb2.RunDirectRequest(device=0, design="sleep", task=task(9, 0.004)), Ctx())


def test_bad_requests_are_refused_before_anything_is_queued(svc: FpgaServerService) -> None:
    group(svc, "g", 1, "c")
    with pytest.raises(PermissionDenied):
        svc.RunBatch(
            fpga_pb2.TaskBatch(client_id="c", group_id="g", token="wrong", tasks=[task(1, 0.01)]), Ctx()
        )
    with pytest.raises(PermissionDenied):
        svc.RunBatch(batch("c", task(1, 0.01), gid="other"), Ctx())
    with pytest.raises(InvalidArgument, match="unique"):
        svc.RunBatch(batch("c", task(1, 0.01), task(1, 0.01)), Ctx())
    with pytest.raises(InvalidArgument, match="duration"):
        svc.RunBatch(batch("c", task(1, -1.0)), Ctx())
    bad = batch("c", task(1))
    bad.tasks[0].params["duration"].array.dtype = "<f8"
    bad.tasks[0].params["duration"].array.data = b"xyz"
    with pytest.raises(InvalidArgument, match=r"tasks\[0\].params\[duration\]"):
        svc.RunBatch(bad, Ctx())
    assert svc.engine.queue_lengths("c") == [0] * 4 and svc.sinks == {}
    assert svc.RunBatch(batch("c"), Ctx()).results == []  # an empty batch is answered at once


def test_a_revoked_client_is_refused_and_its_waiting_task_answered(svc: FpgaServerService) -> None:
    group(svc, "g", 1, "a", "b")
    svc.RunBatch(batch("a", task(1, kind=LOCK)), Ctx(10))  # a holds the only device
    th, out = in_thread(svc.RunBatch, batch("b", task(2, 0.01)), Ctx(10))
    eventually(lambda: svc.engine.group_info("g").waiting == 1, timeout=5)
    assert svc.RevokeClient(fpga_pb2.ServerClientRequest(client_id="b"), None).cancelled == 1
    th.join(5)
    (r,) = out["value"].results  # type: ignore[union-attr]
    assert (r.id, r.error, r.device) == (2, "revoked", -1)
    with pytest.raises(PermissionDenied, match="revoked"):
        svc.RunBatch(batch("b", task(3, 0.01)), Ctx(10))


def test_one_task_waits_for_a_lock_held_by_another_client(svc: FpgaServerService, bells: None) -> None:
    group(svc, "g", 1, "holder", "other")
    (lock,) = svc.RunBatch(batch("holder", task(1, kind=LOCK)), Ctx(10)).results
    assert (lock.kind, lock.device) == (LOCK, 0)
    # 0.2 s: longer than the dispatcher's grace (only a woken handler hands it out at once), shorter than a nap
    th, out = in_thread(svc.RunBatch, batch("other", task(2, 0.2)), Ctx(10))
    bell = sink_of(svc, "other")
    # the device is held: its task is queued and its handler asleep, nothing planned for it
    eventually(lambda: svc.engine.group_info("g").waiting == 1 and bell.asleep(), timeout=5)
    assert th.is_alive()
    # the holder's own tasks run on the held device meanwhile
    (mine,) = svc.RunBatch(batch("holder", task(3, 0.01)), Ctx(10)).results
    assert (mine.device, mine.error) == (0, "") and mine.queue_time_s < 0.1
    assert th.is_alive()
    # The waiting handler sleeps in 0.5 s naps while nothing is planned for it: unlock in its second nap.
    eventually(lambda: len(bell.naps) >= 2, timeout=5, interval=0.005)
    first, second = bell.naps[:2]
    assert (first.timeout, first.rung, second.timeout) == (0.5, False, 0.5)  # nothing woke it in the first
    t_sent = time.monotonic()
    svc.RunBatch(batch("holder", task(4, kind=UNLOCK)), Ctx(10))
    th.join(5)
    t_done = time.monotonic()
    # the unlock woke the waiting handler (it would otherwise sleep on for up to 0.5 s): the nap it was in when
    # the unlock was sent (the second, unless this thread was held up past its end) ended with the unlock's ring
    # (`_kick`), not with its timeout nor with its result handed out by another
    nap = next(n for n in bell.naps if n.ended is None or n.ended >= t_sent)
    assert (nap.timeout, nap.rung, nap.by) == (0.5, True, "_kick") and nap.ended is not None
    # woken, it slept only until its task was due, not a further nap: its result came less than a nap later
    assert all(n.timeout <= 0.2 for n in bell.naps[bell.naps.index(nap) + 1:])
    assert t_done - nap.ended < nap.timeout
    (r,) = out["value"].results  # type: ignore[union-attr]
    assert r.error == "" and r.device == 0 and r.device_time_s == pytest.approx(0.2)
    assert r.queue_time_s >= 0.5


def test_a_group_without_devices_holds_the_task_until_the_deadline(svc: FpgaServerService) -> None:
    group(svc, "g", 0, "c")
    t0 = time.monotonic()
    with pytest.raises(FailedPrecondition, match="deadline"):
        svc.RunBatch(batch("c", task(1, 0.01)), Ctx(0.2))
    assert time.monotonic() - t0 >= 0.2
    assert svc.engine.group_info("g").waiting == 1 and svc.waiting_handlers == 0
    svc.ResizeGroupPart(fpga_pb2.ResizeGroupPartRequest(group_id="g", size=1), None)
    (r,) = svc.RunBatch(batch("c", task(2, 0.01)), Ctx(10)).results
    assert r.error == ""
    # the task that waited ran too (its result had nobody left to go to)
    eventually(lambda: svc.engine.measurements().groups[0].executed == 2, timeout=5)


def test_a_departed_caller_stops_its_handler(svc: FpgaServerService, bells: None) -> None:
    group(svc, "g", 0, "c")
    ctx = Ctx(None)
    th, out = in_thread(svc.RunBatch, batch("c", task(1, 0.01)), ctx)
    bell = sink_of(svc, "c")
    eventually(lambda: svc.engine.group_info("g").waiting == 1 and bell.asleep(), timeout=5, interval=0.005)
    ctx.active = False
    th.join(5)
    assert isinstance(out.get("error"), FailedPrecondition) and "went away" in str(out["error"])


def test_concurrent_handlers_get_their_own_results_whoever_drives(svc: FpgaServerService) -> None:
    group(svc, "g", 2, "a", "b")
    runs = [
        in_thread(svc.RunBatch, batch(c, *(task(i, 0.002 * (i % 3 + 1)) for i in range(n))), Ctx(20))
        for c, n in (("a", 30), ("b", 20), ("a", 1), ("b", 1))
    ]
    got = []
    for th, out in runs:
        th.join(20)
        got.append(sorted(r.id for r in out["value"].results))  # type: ignore[union-attr]
    assert got == [list(range(30)), list(range(20)), [0], [0]]
    assert svc.sinks == {} and svc.waiting_handlers == 0


class Stream:
    """An Execute stream in-process: batches in through `send`, results collected as they come."""

    def __init__(self, s: FpgaServerService, first: fpga_pb2.TaskBatch, ctx: Ctx | None = None) -> None:
        self.inbox: queue.SimpleQueue = queue.SimpleQueue()
        self.results: list[fpga_pb2.TaskResult] = []
        self.messages = 0
        self.error: Exception | None = None
        self.ctx = ctx or Ctx()
        self.inbox.put(first)
        out = s.Execute(self._requests(), self.ctx)
        self.thread = threading.Thread(target=self._collect, args=(out,), daemon=True)
        self.thread.start()

    def _requests(self) -> Iterator[fpga_pb2.TaskBatch]:
        while (item := self.inbox.get()) is not None:
            yield item

    def _collect(self, out: Iterator[fpga_pb2.ResultBatch]) -> None:
        try:
            for rb in out:
                self.messages += 1
                self.results.extend(rb.results)
        except Exception as e:  # noqa: BLE001
            self.error = e

    def send(self, b: fpga_pb2.TaskBatch) -> None:
        self.inbox.put(b)

    def ids(self) -> list[int]:
        return sorted(r.id for r in self.results)

    def end(self) -> None:
        self.inbox.put(None)
        self.thread.join(5)
        assert not self.thread.is_alive()


@pytest.fixture
def bare() -> Iterator[FpgaServerService]:
    """A server whose dispatcher never runs: only those waiting for results drive the engine."""
    s = FpgaServerService(FpgaServerConfig(name="fpga-t", devices=4, reconfig_mean_s=0.0, reconfig_std_s=0.0))
    try:
        yield s
    finally:
        s.stop()


def test_execute_stream_drives_the_engine_itself_while_it_is_owed_results(bare: FpgaServerService) -> None:
    group(bare, "g", 2, "s")
    st = Stream(bare, batch("s", task(1, 2.0)))
    eventually(lambda: bare.waiting_handlers == 1, timeout=5)  # owed a result (for 2 s): it drives
    eventually(lambda: st.ids() == [1], timeout=5)
    eventually(lambda: bare.waiting_handlers == 0, timeout=5)  # owed nothing: it does not
    # One at a time, each comes back about when its device is done, without a dispatcher: well within the 0.5 s
    # a handler naps when it plans nothing, and the 1 s it idles owed nothing (either would be slept through if
    # the new batch did not ring the handler, or the handler did not then sleep only until the task is due).
    for i in range(2, 12):
        t0 = time.monotonic()
        st.send(batch("s", task(i, 0.01)))
        eventually(lambda i=i: len(st.results) == i, timeout=5, interval=0.001)
        assert time.monotonic() - t0 < 0.5
    st.send(batch("s", task(20, 0.01), task(21, 0.01), task(22, 0.01)))
    eventually(lambda: len(st.results) == 14, timeout=5)
    st.end()
    assert st.error is None and st.ids() == [*range(1, 12), 20, 21, 22]
    assert all(r.error == "" and r.server == "fpga-t" for r in st.results)
    assert st.results[0].device_time_s == pytest.approx(2.0)
    assert bare.sinks == {} and bare.waiting_handlers == 0 and bare.stream_driver is None


def test_one_stream_drives_for_all_and_hands_over_when_it_is_done(bare: FpgaServerService, bells: None) -> None:
    group(bare, "g", 1, "a", "b")
    a = Stream(bare, batch("a", task(1, 2.0)))  # the only device is a's for 2 s: b's tasks queue behind it
    eventually(lambda: bare.stream_driver is not None, timeout=5)
    b = Stream(bare, batch("b", *(task(i, 0.05) for i in range(6))))
    b_bell = sink_of(bare, "b")
    eventually(lambda: len(bare.streams_waiting) == 1, timeout=5)
    assert bare.waiting_handlers == 1  # one stream drives, the other waits for what it routes
    # a's task ends first (2 s) and a leaves; b, still owed all its results, takes over (there is
    # no dispatcher here: without the hand-over b's results would not come)
    eventually(lambda: a.ids() == [1], timeout=5, interval=0.005)
    t0 = time.monotonic()
    eventually(lambda: b.ids() == list(range(6)), timeout=5, interval=0.005)
    # 6 x 0.05 s left on the device, and hand-over at once: without it, b would first sleep out its 0.5 s nap (the
    # slack is for a loaded machine; the ring below is the mechanism itself)
    assert time.monotonic() - t0 < 6 * 0.05 + 0.35
    # at once: a rang b's handler as it left, b did not wait for its 0.5 s nap to end to look
    assert "_leave_driving" in [by for _, by in b_bell.rings]
    a.end()
    b.end()
    assert a.error is None and b.error is None
    assert bare.waiting_handlers == 0 and bare.stream_driver is None and not bare.streams_waiting


def test_a_new_task_on_a_waiting_stream_wakes_the_driver(bare: FpgaServerService, bells: None) -> None:
    group(bare, "g", 2, "a", "b")
    a = Stream(bare, batch("a", task(1, 2.0)))  # drives, with nothing due for 2 s
    driver = eventually(lambda: bare.stream_driver, timeout=5)
    eventually(lambda: bare.engine.busy() and driver.bell.asleep(), timeout=5, interval=0.005)
    t0 = time.monotonic()
    b = Stream(bare, batch("b", task(1, 0.01)))
    eventually(lambda: b.ids() == [1], timeout=5, interval=0.005)
    t_done = time.monotonic()
    # b's task rang the driver out of the nap it was in when b's task came (the one just begun, unless this
    # thread was held up past its end), before that nap's timeout
    nap = next(n for n in driver.bell.naps if n.ended is None or n.ended >= t0)
    assert (nap.timeout, nap.rung, nap.by) == (0.5, True, "_stream_submit")
    assert nap.ended is not None and nap.ended >= t0
    # and b's result came at once, not when a's handler would next have looked (a further 0.5 s nap)
    assert t_done - nap.ended < nap.timeout
    b.end()
    bare.RevokeClient(fpga_pb2.ServerClientRequest(client_id="a"), None)
    a.end()


def test_a_bad_task_fails_alone_not_the_stream_and_revocation_ends_it(svc: FpgaServerService) -> None:
    group(svc, "g", 1, "s")
    st = Stream(svc, batch("s", task(1, -1.0), task(2, 0.01)))
    eventually(lambda: len(st.results) == 2, timeout=5)
    assert {r.id: "duration" in r.error for r in st.results} == {1: True, 2: False}   # the bad task alone
    st.send(batch("s", task(3, 0.01)))
    eventually(lambda: st.ids() == [1, 2, 3], timeout=5)
    assert st.results[-1].error == ""
    st.send(batch("s", task(4, 1.0), task(5, 1.0)))
    eventually(lambda: svc.engine.group_info("g").waiting == 1, timeout=5)
    svc.RevokeClient(fpga_pb2.ServerClientRequest(client_id="s"), None)
    eventually(lambda: 5 in st.ids(), timeout=5)
    assert next(r for r in st.results if r.id == 5).error == "revoked"
    st.send(batch("s", task(6, 0.01)))  # refused: the stream ends with the reason
    st.thread.join(5)
    assert st.error is not None and not st.thread.is_alive()
    st.end()
    eventually(lambda: svc.sinks == {} and svc.waiting_handlers == 0, timeout=5)


def test_an_idle_dispatcher_sleeps_until_told_of_work_not_every_grace_period() -> None:
    from irm_fpga.server import DISPATCH_GRACE_S, IDLE_LOOK_S

    waits: list[float | None] = []

    class Counting(threading.Condition):
        def wait(self, timeout=None):  # type: ignore[no-untyped-def]
            waits.append(timeout)
            return super().wait(timeout)

    s = FpgaServerService(FpgaServerConfig(name="fpga-idle", devices=2, reconfig_mean_s=0.0, reconfig_std_s=0.0))
    s.cond = Counting(threading.Lock())
    s.start()
    try:
        eventually(lambda: len(waits) >= 1, timeout=5, interval=0.005)
        assert waits[0] == IDLE_LOOK_S > 10 * DISPATCH_GRACE_S  # nothing to do: a long sleep
        # New work wakes it at once (a kick), long before IDLE_LOOK_S.
        group(s, "g", 1, "a")
        n = len(waits)
        eventually(lambda: len(waits) > n, timeout=IDLE_LOOK_S / 2, interval=0.002)
    finally:
        s.stop()


def test_the_dispatcher_hands_out_what_no_driving_handler_planned_for(svc: FpgaServerService,
                                                                    bells: None) -> None:
    from irm_fpga.server import DISPATCH_GRACE_S

    group(svc, "g", 1, "holder", "a")
    group(svc, "h", 1, "other")
    svc.RunBatch(batch("holder", task(1, kind=LOCK)), Ctx(10))
    th, out = in_thread(svc.RunBatch, batch("a", task(2, 0.01)), Ctx(10))  # drives, nothing planned
    bell = sink_of(svc, "a")
    eventually(lambda: svc.waiting_handlers == 1 and bell.asleep(), timeout=5, interval=0.002)
    # work nobody is told about (straight into the engine): the handler sleeps on (up to 0.5 s)
    t0 = time.monotonic()
    svc.engine.submit("other", [(9, {"duration": 0.01}, "run")])
    eventually(lambda: not svc.engine.busy(), timeout=5, interval=0.002)
    t1 = time.monotonic()
    # a few dispatcher graces, well under the handler's 0.5 s nap it would otherwise have waited out (the nap
    # check below is the mechanism itself; the slack is for a loaded machine)
    assert t1 - t0 < 0.01 + 3 * DISPATCH_GRACE_S + 0.3
    # the dispatcher handed it out: the handler slept through it in the nap it was in when the work came (the one
    # just begun, unless this thread was held up past its end), nothing woke it: still in that nap, or out of it
    # by its timeout only after the work was seen handed out
    nap = next(n for n in bell.naps if n.ended is None or n.ended >= t0)
    assert nap.rung is None or (nap.rung is False and nap.ended is not None and nap.ended >= t1)
    svc.RunBatch(batch("holder", task(3, kind=UNLOCK)), Ctx(10))
    th.join(5)
    assert out["value"].results[0].error == ""  # type: ignore[union-attr]


def test_wire_maps_every_kind_of_value_and_names_a_bad_one() -> None:
    import numpy as np

    from irm_fpga.wire import WireError, from_map, to_map

    t = fpga_pb2.Task()
    to_map({"n": 1.5, "i": 3, "b": True, "s": "x", "a": np.arange(3.0)}, t.params)
    got = from_map(t.params, "p")
    assert {k: v for k, v in got.items() if k != "a"} == {"n": 1.5, "i": 3, "b": True, "s": "x"}
    assert got["a"].tolist() == [0.0, 1.0, 2.0]
    assert from_map(fpga_pb2.Task().params, "p") == {}
    t.params["empty"].SetInParent()
    with pytest.raises(WireError, match=r"p\[empty\]: empty value"):
        from_map(t.params, "p")


def test_overhead_bench_pairs_alternate_their_order() -> None:
    from bench.fpga_overhead import _paired

    order: list[str] = []
    ticks = iter(range(1000))
    d, g = _paired(
        (lambda: order.append("d"), lambda: order.append("g")), 4, warmup=1, clock=lambda: float(next(ticks))
    )
    assert order == ["d", "g"] + ["d", "g", "g", "d", "d", "g", "g", "d"]
    assert len(d) == len(g) == 4 and d == g == [1.0] * 4


def test_overhead_bench_cpu_blocks_alternate_and_cover_both_processes() -> None:
    import os

    from bench.fpga_overhead import _cpu_blocks

    order: list[str] = []
    out = _cpu_blocks((lambda: order.append("d"), lambda: order.append("c")), 2, 3, os.getpid())
    assert order == list("dddccc" "cccddd")  # two pairs of blocks, the order alternating
    assert set(out) == {f"{n}_{s}cpu_us" for n in ("direct", "client") for s in ("bench_", "server_", "")}
    assert all(v >= 0 for v in out.values())


@pytest.mark.parametrize(("dtype", "shape", "data", "fragment"), [
    ("<f8", [-1, -2], b"\0" * 16, "negative dimension"),           # the product fits the bytes; reshape raised
    ("(1000000000,1000000000)f8", [0], b"", "params[signal]"),     # numpy's dtype raised ValueError
    ("<f8", [2**62, 2**62], b"", "do not fit"),                     # a product numpy would wrap around
])
def test_a_malformed_array_is_bad_input_on_both_paths(svc: FpgaServerService, dtype, shape, data, fragment) -> None:
    group(svc, "g", 1, "c")
    bad = batch("c", task(1))
    a = bad.tasks[0].params["signal"].array
    a.dtype, a.data = dtype, data
    a.shape[:] = shape
    with pytest.raises(InvalidArgument, match=re.escape(fragment)):
        svc.RunBatch(bad, Ctx())
    # On the stream (the client library's path) it fails its batch; the stream goes on.
    st = Stream(svc, bad)
    eventually(lambda: len(st.results) == 1, timeout=5)
    assert st.results[0].id == 1 and st.results[0].error
    st.send(batch("c", task(2, 0.01)))
    eventually(lambda: st.ids() == [1, 2], timeout=5)
    st.end()


def test_a_run_batch_lock_outlives_the_call_until_the_client_is_detached(svc: FpgaServerService) -> None:
    """A crashed client's lock taken by RunBatch (no stream to end with it) is freed by detaching the client."""
    group(svc, "g", 1, "holder", "a")
    (lock,) = svc.RunBatch(batch("holder", task(1, kind=LOCK)), Ctx(10)).results
    assert lock.error == "" and svc.engine.group_info("g").size == 1
    th, out = in_thread(svc.RunBatch, batch("a", task(2, 0.01)), Ctx(10))
    eventually(lambda: sum(svc.engine.queue_lengths("a")) == 1, timeout=5, interval=0.002)   # a's task waits...
    assert [d.locked_by for d in svc.engine.device_states() if d.group_id == "g"] == ["holder"]  # ...for its lock
    assert sum(svc.engine.queue_lengths("a")) == 1 and th.is_alive()
    svc.DetachClient(fpga_pb2.ServerClientRequest(client_id="holder"), None)   # holder crashed: detached
    th.join(5)
    assert out["value"].results[0].error == ""  # type: ignore[union-attr]
    # A stray UNLOCK depends on the client's lock: FAILED_PRECONDITION naming the task, the batch refused.
    with pytest.raises(FailedPrecondition, match=r"task 1 \(5\): unlock without a lock"):
        svc.RunBatch(batch("a", task(4, 0.01), task(5, kind=UNLOCK)), Ctx(10))
