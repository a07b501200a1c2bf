"""Review 15 of the client library (irm_fpga.client.VirtualFpga): no future is left pending for good, and no
failure wedges the client.

A failed LOCK leaves nothing locked; a client revoked (or its group deleted) fails what it submits, saying so,
instead of queueing it for ever; close() fails what still waits and refuses later submits; a broken stream's
sender thread ends with it; a task or a lock lost with its stream says what became of it. In-process
FPGA-servers over gRPC, or stand-in parts where the server cannot be made to answer a given way; Orchestrators
are fakes (tests/integration/test_review15_fpga_client_orchestrator.py has the real one).
"""

# ruff: noqa: F811 - the tests take test_fpga_client's `servers` fixture, imported, as their parameter

from __future__ import annotations

import queue
import sys
import threading
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future

import grpc
import pytest

from harness.v1 import fpga_pb2
from irm_fpga import client as cl
from irm_fpga.client import TaskFailed, VirtualFpga
from irm_fpga.engine import MOVED
from tests.conftest import PeerError, eventually
from tests.unit.test_fpga_client import Server, attachment, part, servers  # noqa: F401 - servers: its fixture

LOCK, UNLOCK = fpga_pb2.Task.KIND_LOCK, fpga_pb2.Task.KIND_UNLOCK


def attach(s: Server, gid: str, client: str) -> None:
    s.svc.AttachClient(fpga_pb2.ServerAttachRequest(group_id=gid, client_id=client, token=f"tok-{client}"), None)


def revoke(s: Server, client: str) -> None:
    s.svc.RevokeClient(fpga_pb2.ServerClientRequest(client_id=client), None)


Refused = PeerError     # what a stub raises for a refused call


class Orchestrator:
    """A fake Orchestrator: AttachClient answers `att` (attaching the client on `server` again, as the real one
    does) or raises `attach_error`; GetGroup answers, or raises `group_error`."""

    def __init__(self, att: fpga_pb2.Attachment, server: Server | None = None) -> None:
        self.att, self.server = att, server
        self.attach_error: grpc.RpcError | None = None
        self.group_error: grpc.RpcError | None = None
        self.attaches = 0

    def AttachClient(self, request, timeout=None):  # type: ignore[no-untyped-def]  # noqa: N802
        self.attaches += 1
        if self.attach_error is not None:
            raise self.attach_error
        if self.server is not None:
            attach(self.server, self.att.group_id, self.att.client_id)
        return self.att

    def GetGroup(self, request, timeout=None):  # type: ignore[no-untyped-def]  # noqa: N802
        if self.group_error is not None:
            raise self.group_error
        return fpga_pb2.FpgaGroup(id=request.group_id)


def failure(fut: Future, timeout: float = 10) -> str:
    """The TaskFailed `fut` ends with (a future still pending after `timeout` fails the test)."""
    e = fut.exception(timeout)
    assert isinstance(e, TaskFailed), repr(e)
    return str(e)


# -- 1. a failed LOCK -------------------------------------------------------------------------------------------

class _StandInPart:
    """One stream to an FPGA-server, stood in: what the library sends lands in `outbox`, results are fed to
    `_complete` by the test, the stream's end by `_part_ended`."""

    def __init__(self, owner, part) -> None:  # noqa: ANN001
        self.owner, self.part = owner, part
        self.outbox: queue.SimpleQueue = queue.SimpleQueue()
        self.sent: set[int] = set()
        self.ended = False

    def end(self) -> None:
        self.ended = True

    def close(self) -> None:
        pass


@pytest.fixture
def stand_in(monkeypatch) -> Iterator[VirtualFpga]:
    monkeypatch.setattr(cl, "_Part", _StandInPart)
    att = fpga_pb2.Attachment(client_id="c", group_id="g", token="t", design="sleep", parts=[
        fpga_pb2.AttachedPart(server=s, address="x", devices=1) for s in ("A", "B")])
    f = cl.VirtualFpga(att, refresh_s=0)
    yield f
    f.close(detach=False)


def result(task_id: int, error: str = "", kind: int = fpga_pb2.Task.KIND_RUN) -> fpga_pb2.TaskResult:
    return fpga_pb2.TaskResult(id=task_id, error=error, kind=kind, server="A")


def in_thread(call: Callable[[], object]) -> tuple[threading.Thread, dict]:
    """Run `call` on a thread of its own (it waits for results the test feeds in): its outcome lands in the box."""
    box: dict = {}

    def run() -> None:
        try:
            box["out"] = call()
        except Exception as e:  # noqa: BLE001 - the test looks at what the call raised
            box["error"] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, box


def locking(f: VirtualFpga) -> tuple[threading.Thread, dict]:
    return in_thread(f.lock)


def not_locked(f: VirtualFpga) -> None:
    """unlock() says nothing is locked (on a thread: an UNLOCK sent instead would wait for an answer for ever)."""
    t, box = in_thread(f.unlock)
    t.join(5)
    assert isinstance(box.get("error"), RuntimeError) and "not locked" in str(box["error"]), box


def sent_to(f: VirtualFpga, task_id: int) -> cl._Part:
    return eventually(lambda: next((p for p in f._all.values() if task_id in p.sent), None),
                      what=f"task {task_id} sent", timeout=5)


def test_a_refused_lock_leaves_nothing_locked_and_lock_works_again(stand_in) -> None:  # type: ignore[no-untyped-def]
    f = stand_in
    t, box = locking(f)
    sent_to(f, 1)
    # Refused, as a LOCK in a batch with a bad task was (or one the server turns down for any reason).
    f._complete([result(1, "task 0 (1): sleep: 'duration' must be >= 0.0", LOCK)])
    t.join(5)
    assert isinstance(box.get("error"), TaskFailed)
    not_locked(f)                                  # nothing is locked: no UNLOCK the server would refuse
    t, box = locking(f)                            # not "already locked"
    part = sent_to(f, 2)
    f._complete([result(2, kind=LOCK)])
    t.join(5)
    assert box["out"].kind == LOCK
    f.submit({"duration": 0.01})
    assert part.sent == {3}                        # pinned to the lock now held
    unlocking = threading.Thread(target=f.unlock, daemon=True)
    unlocking.start()
    assert sent_to(f, 4) is part
    f._complete([result(4, kind=UNLOCK)])
    unlocking.join(5)
    assert f._locked is None and f._held is None


def test_a_lock_whose_stream_ends_before_it_is_granted_is_not_reported_again_by_unlock(stand_in) -> None:  # type: ignore[no-untyped-def]
    f = stand_in
    t, box = locking(f)
    part = sent_to(f, 1)
    f._part_ended(part, "A: UNAVAILABLE: Socket closed", grpc.StatusCode.UNAVAILABLE)
    t.join(5)
    assert "A: UNAVAILABLE" in str(box.get("error")) and "may not have run" in str(box["error"])
    not_locked(f)                                  # lock() said why already; nothing was ever held
    t, box = locking(f)
    sent_to(f, 2)
    f._complete([result(2, kind=LOCK)])
    t.join(5)
    assert box["out"].kind == LOCK


def test_lock_after_close_raises_and_leaves_nothing_locked(stand_in) -> None:  # type: ignore[no-untyped-def]
    f = stand_in
    f.close(detach=False)                          # (stand-in parts stay listed: their streams never end)
    with pytest.raises(RuntimeError, match="closed"):
        f.lock()
    not_locked(f)


def test_a_task_its_stream_drops_after_close_says_the_client_was_closed(stand_in) -> None:  # type: ignore[no-untyped-def]
    f = stand_in
    fut = f.submit({"duration": 0.01})
    part = sent_to(f, 1)
    f.close(detach=False)
    f._part_ended(part, "A: the stream ended")     # the stream closed before the task got onto it
    said = failure(fut, 0)
    assert "the client was closed before A answered" in said and "may not have run" in said
    assert part.ended


# -- 2. futures that would never end ----------------------------------------------------------------------------

def test_without_an_orchestrator_a_revoked_client_fails_each_later_task_at_once(servers) -> None:  # type: ignore[no-untyped-def]
    a = servers("fpga-a")
    f = VirtualFpga(attachment("g", "c", part(a, "g", "c", 2)), refresh_s=0)
    try:
        assert f.submit({"duration": 0.001}).result(10).server == "fpga-a"
        revoke(a, "c")
        first = failure(f.submit({"duration": 0.001}))
        cause = "not attached there: revoked, detached or its group deleted"
        assert "NOT_FOUND" in first and cause in first and "may not have run" in first
        for _ in range(3):  # no part left, nobody to ask for another: never sent, never pending
            later = f.submit({"duration": 0.001})
            assert later.done() and cause in failure(later, 0) and "no Orchestrator" in failure(later, 0)
        assert f.pending() == 0 and f.in_flight() == 0
    finally:
        f.close(detach=False)


def test_without_an_orchestrator_tasks_handed_back_by_every_part_fail_instead_of_waiting(stand_in) -> None:  # type: ignore[no-untyped-def]
    f = stand_in
    futures = [f.submit({"duration": 0.01}) for _ in range(2)]    # one to A, one to B
    f._complete([result(1, MOVED), result(2, MOVED)])              # both parts cut to no devices
    for fut in futures:
        said = failure(fut, 0)
        assert "was cut to no devices" in said and "no Orchestrator" in said
    assert f.pending() == 0 and f.in_flight() == 0


def test_the_orchestrator_saying_revoked_fails_what_waits_and_each_later_task(servers) -> None:  # type: ignore[no-untyped-def]
    a = servers("fpga-a", devices=1)
    orch = Orchestrator(attachment("g", "c", part(a, "g", "c", 1)))
    f = VirtualFpga(orch.att, orchestrator=orch, refresh_s=0, max_in_flight=1)  # type: ignore[arg-type]
    try:
        assert f.submit({"duration": 0.001}).result(10).server == "fpga-a"
        revoke(a, "c")
        orch.attach_error = Refused(grpc.StatusCode.FAILED_PRECONDITION,
                                    "client 'c' was revoked or belongs to another group; attach under a new client id")
        sent, waiting = f.submit({"duration": 0.001}), f.submit({"duration": 0.001})  # one in flight, one waits
        for fut in (sent, waiting):
            assert "was revoked" in failure(fut)
        assert "NOT_FOUND" in failure(sent)       # and what the server said
        later = f.submit({"duration": 0.001})
        assert later.done() and "was revoked" in failure(later, 0)
        assert f.pending() == 0
    finally:
        f.close(detach=False)


def test_the_orchestrator_saying_the_group_is_gone_fails_tasks_as_deleted(servers) -> None:  # type: ignore[no-untyped-def]
    a = servers("fpga-a")
    orch = Orchestrator(attachment("g", "c", part(a, "g", "c", 2)))
    f = VirtualFpga(orch.att, orchestrator=orch, refresh_s=0)  # type: ignore[arg-type]
    try:
        a.svc.DeleteGroupPart(fpga_pb2.DeleteGroupPartRequest(group_id="g"), None)
        orch.attach_error = orch.group_error = Refused(grpc.StatusCode.NOT_FOUND, "FPGA group 'g' does not exist")
        assert "FPGA group 'g' was deleted" in failure(f.submit({"duration": 0.001}))
        later = f.submit({"duration": 0.001})
        assert later.done() and "was deleted" in failure(later, 0)
    finally:
        f.close(detach=False)


def test_a_not_found_a_server_passed_on_is_not_taken_for_a_deleted_group(servers) -> None:  # type: ignore[no-untyped-def]
    # The Orchestrator relays a restarted server's NOT_FOUND (its part not given back yet) under its own code:
    # while the group itself is there, tasks wait for the part, and go once the Orchestrator answers again.
    a = servers("fpga-a")
    orch = Orchestrator(attachment("g", "c", part(a, "g", "c", 2)), server=a)
    # A refresh loop that does not come round during the test: with none (refresh_s=0), no part left after the
    # one ask fails what waits (see test_review15_fpga_client_cap.py); with one, it waits for the next round.
    f = VirtualFpga(orch.att, orchestrator=orch, refresh_s=3600)  # type: ignore[arg-type]
    try:
        revoke(a, "c")
        orch.attach_error = Refused(grpc.StatusCode.NOT_FOUND, "FPGA-server 'fpga-a': group 'g' not found")
        refused = f.submit({"duration": 0.001})     # the server refuses the client
        assert "fpga-a" in failure(refused) and "was deleted" not in failure(refused)
        waits = f.submit({"duration": 0.001})
        assert not waits.done() and f._gone is None
        orch.attach_error = None
        f.refresh()
        assert waits.result(10).server == "fpga-a"
    finally:
        f.close(detach=False)


def test_close_fails_what_waits_beyond_max_in_flight_and_submit_after_close_raises(servers) -> None:  # type: ignore[no-untyped-def]
    a = servers("fpga-a", devices=1)
    f = VirtualFpga(attachment("g", "c", part(a, "g", "c", 1)), refresh_s=0, max_in_flight=1)
    futures = [f.submit({"duration": 0.2}) for _ in range(4)]
    f.close(detach=False)
    assert futures[0].result(0).id == 1           # in flight: close() waited for it
    for fut in futures[1:]:
        assert "the client was closed" in failure(fut, 0)
    assert f.pending() == 0 and f.in_flight() == 0
    with pytest.raises(RuntimeError, match="closed"):
        f.submit({"duration": 0.001})
    with pytest.raises(RuntimeError, match="closed"):
        f.lock()
    with pytest.raises(RuntimeError, match="not locked"):
        f.unlock()                                 # the refused lock() left nothing behind


def test_close_fails_what_waits_for_a_part_to_come_back(servers) -> None:  # type: ignore[no-untyped-def]
    a = servers("fpga-a")
    orch = Orchestrator(attachment("g", "c", part(a, "g", "c", 2)))
    # A refresh loop that does not come round during the test (without one, refresh_s=0, the stream's end asks
    # the Orchestrator at once, and what waits fails once no part is left).
    f = VirtualFpga(orch.att, orchestrator=orch, refresh_s=3600)  # type: ignore[arg-type]
    assert f.submit({"duration": 0.001}).result(10).server == "fpga-a"
    a.running.stop(0)                              # the only part's stream breaks: tasks wait for a refresh
    eventually(lambda: f._parts == [], timeout=5, what="the part dropped")
    waiting = f.submit({"duration": 0.001})
    f.close(detach=False)                          # nothing in flight: no answer comes to move them on
    assert "the client was closed" in failure(waiting, 0)


def test_a_refresh_that_ends_after_close_opens_no_stream(servers) -> None:  # type: ignore[no-untyped-def]
    a = servers("fpga-a")
    orch = Orchestrator(attachment("g", "c", part(a, "g", "c", 2)))
    base = senders()
    f = VirtualFpga(orch.att, orchestrator=orch, refresh_s=0)  # type: ignore[arg-type]
    assert f.submit({"duration": 0.001}).result(10).server == "fpga-a"
    f.close(detach=False)
    eventually(lambda: senders() == base, timeout=5, what="the closed client's sender to end")
    f.refresh()                                    # the refresh loop's, answered just after close()
    assert senders() == base                       # a stream opened now would be nobody's to close


# -- 3. a broken stream's sender --------------------------------------------------------------------------------

def senders(but: Iterable[cl._Part] = ()) -> int:
    """Threads running a part's request generator (each stream's sender, parked on its outbox when idle), those
    of the parts `but` left out. A sender that has just handed a batch over is in gRPC, not in the generator, for
    a moment (so not counted); one whose stream ended without telling it stays parked for good (so counted)."""
    code = cl._Part._batches.__code__
    skip = {id(p) for p in but}
    count = 0
    for frame in sys._current_frames().values():
        while frame is not None:
            if frame.f_code is code:
                if id(frame.f_locals.get("self")) not in skip:
                    count += 1
                break
            frame = frame.f_back
    return count


def test_each_broken_stream_takes_its_sender_thread_with_it(servers) -> None:  # type: ignore[no-untyped-def]
    a = servers("fpga-a")
    orch = Orchestrator(attachment("g", "c", part(a, "g", "c", 2)), server=a)
    # Counted before the client exists: its live stream's sender, just back from handing a batch to gRPC, may
    # not be parked yet when its first result is in (it would then be missing from a count taken there).
    base = senders()
    f = VirtualFpga(orch.att, orchestrator=orch, refresh_s=0)  # type: ignore[arg-type]
    try:
        assert f.submit({"duration": 0.001}).result(10).server == "fpga-a"
        for i in range(5):
            revoke(a, "c")                         # the next batch ends the stream; a refresh opens another
            assert "may not have run" in failure(f.submit({"duration": 0.001}))
            assert f.submit({"duration": 0.001}).result(10).server == "fpga-a"
            assert orch.attaches == i + 1
        live = list(f._parts)
        assert len(live) == 1                      # the stream the last refresh opened: its sender stays
        # No sender but the live stream's is left: each of the 5 broken streams took its sender with it.
        eventually(lambda: senders(but=live) <= base, timeout=5, what="the broken streams' senders to end")
    finally:
        f.close(detach=False)


# -- 4. what the failures say -----------------------------------------------------------------------------------

def test_a_lost_stream_says_its_tasks_may_not_have_run_and_its_lock_was_released(servers) -> None:  # type: ignore[no-untyped-def]
    a, b = servers("fpga-a", devices=1), servers("fpga-b", devices=1)
    f = VirtualFpga(attachment("g", "c", part(a, "g", "c", 1), part(b, "g", "c", 1)), refresh_s=0)
    try:
        assert f.lock().server == "fpga-a"
        running = f.submit({"duration": 30.0})
        eventually(lambda: a.svc.engine.group_info("g").running == 1, timeout=5)
        a.running.stop(0)
        said = failure(running)
        assert "fpga-a" in said and "may not have run" in said
        with pytest.raises(TaskFailed, match="lock on fpga-a was lost") as lost:
            f.unlock()
        assert "the server released" in str(lost.value)
        assert f.submit({"duration": 0.001}).result(10).server == "fpga-b"
    finally:
        f.close(detach=False)
