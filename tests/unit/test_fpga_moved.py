"""A group part left without devices hands its queued tasks back (MOVED); the client library sends them on.

Engine side on a virtual clock; client side with stand-in parts (the gRPC streams to the FPGA-servers).
The cross-process case is tests/integration/test_fpga.py (a group over two servers shrunk to one device).
"""

from __future__ import annotations

import queue
import threading

import pytest

from harness.v1 import fpga_pb2
from irm_fpga import client as cl
from irm_fpga import engine as eng
from services.clock import VirtualClock
from tests.conftest import eventually


def _engine(devices: int = 2) -> tuple[eng.Engine, VirtualClock]:
    clock = VirtualClock(0.0)
    e = eng.Engine(clock, eng.EngineConfig(devices=devices, reconfig_mean_s=0.01, reconfig_std_s=0.0))
    e.create_group("g", "sleep", 1, min_size=0, max_size=devices)     # as a server makes a part: may go to 0
    e.attach_client("g", "c")
    clock.advance(1.0)
    e.advance()
    return e, clock


def test_a_task_reaching_a_part_already_cut_to_nothing_is_answered_at_once():
    e, clock = _engine()
    e.resize_group("g", 0, hand_back=True)         # the group has devices on other servers
    assert e.advance() == []                       # nothing queued: nothing to hand back
    e.submit("c", [eng.Task(1, {"duration": 0.01})])      # sent before the client learnt of it
    assert [(r.task_id, r.error) for r in e.advance()] == [(1, eng.MOVED)]
    e.resize_group("g", 1)                          # grown again: tasks stay and run here
    e.submit("c", [eng.Task(2, {"duration": 0.01})])
    clock.advance(1.0)
    assert [(r.task_id, r.error) for r in e.advance()] == [(2, None)]


def test_a_group_at_nothing_without_hand_back_holds_its_tasks_for_devices_to_come():
    # A group with no devices anywhere (e.g. an elastic one at 0): its waiting tasks are what grows it.
    e, clock = _engine()
    e.resize_group("g", 0)
    e.submit("c", [eng.Task(1, {"duration": 0.01})])
    clock.advance(3600.0)
    assert e.advance() == []
    e.resize_group("g", 1)
    clock.advance(1.0)
    assert [r.task_id for r in e.advance()] == [1]


def test_a_lock_handed_back_leaves_no_pending_lock_behind():
    e, clock = _engine()
    e.submit("c", [eng.Task(1, {"duration": 10.0})])      # the part's only device is busy
    e.submit("c", [eng.Task(2, None, eng.LOCK)])           # queued, waiting for a device
    e.resize_group("g", 0, hand_back=True)
    assert [(r.task_id, r.error) for r in e.advance()] == [(2, eng.MOVED)]
    clock.advance(20.0)
    e.advance()
    e.resize_group("g", 1)                                 # a device again, later
    clock.advance(1.0)
    e.advance()
    e.submit("c", [eng.Task(3, None, eng.LOCK)])           # refused while a handed-back LOCK looked pending
    clock.advance(1.0)
    assert [(r.task_id, r.error) for r in e.advance()] == [(3, None)]      # locked: no error


class _Part:
    """A stand-in for one stream to an FPGA-server: what the library puts in its outbox is what it sent."""

    def __init__(self, owner, part) -> None:  # noqa: ANN001
        self.owner, self.part = owner, part
        self.outbox: queue.SimpleQueue = queue.SimpleQueue()
        self.sent: set[int] = set()

    def close(self) -> None:
        pass

    def drained(self) -> list[int]:
        out = []
        while True:
            try:
                out.append(self.outbox.get_nowait()[0].id)
            except queue.Empty:
                return out


@pytest.fixture
def vf(monkeypatch):
    monkeypatch.setattr(cl, "_Part", _Part)
    att = fpga_pb2.Attachment(client_id="c", group_id="g", token="t", design="sleep", parts=[
        fpga_pb2.AttachedPart(server=s, address="x", devices=1) for s in ("A", "B", "C")])
    return cl.VirtualFpga(att, refresh_s=0)


def result(task_id: int, error: str = "", kind: int = fpga_pb2.Task.KIND_RUN) -> fpga_pb2.TaskResult:
    return fpga_pb2.TaskResult(id=task_id, error=error, kind=kind, server="?")


def test_moved_tasks_go_to_the_other_parts_in_their_order_and_never_back(vf):
    a = vf._all["A"]
    futures = [vf.submit({"duration": 0.01}) for _ in range(6)]      # 1..6 over A, B, C: A has 1 and 4
    assert a.drained() == [1, 4]
    vf._max_in_flight = 4                      # so the handed-back ones stay in view, waiting
    vf._complete([result(1, eng.MOVED), result(4, eng.MOVED)])
    assert [task.id for task, _, _ in vf._waiting] == [1, 4]
    vf._max_in_flight = 64
    vf._pump()
    assert a.drained() == [] and not any(f.done() for f in futures)     # sent elsewhere, not failed


def test_what_follows_a_moved_lock_goes_to_the_part_that_holds_the_lock(vf):
    a, b, c = (vf._all[s] for s in "ABC")
    locking = threading.Thread(target=vf.lock, daemon=True)
    locking.start()                                                # the LOCK goes to A (the first part)
    eventually(lambda: a.sent, what="the LOCK sent")
    assert a.drained() == [1]
    vf._complete([result(1, eng.MOVED, fpga_pb2.Task.KIND_LOCK)])  # A lost its devices: the LOCK comes back
    holder = next(p for p in (b, c) if p.sent)
    assert holder.drained() == [1]
    vf._complete([result(1, kind=fpga_pb2.Task.KIND_LOCK)])        # locked there
    locking.join(5)
    vf.submit({"duration": 0.01})
    assert holder.sent == {2}                                      # on the locked device's part


def test_tasks_that_queued_behind_an_unlock_on_a_part_cut_to_nothing_are_handed_back():
    e, clock = _engine()
    e.submit("c", [eng.Task("L", None, eng.LOCK)])
    e.submit("c", [eng.Task("R1", {"duration": 10.0})])            # on the locked device
    assert [r.task_id for r in e.advance()] == ["L"]
    e.resize_group("g", 0, hand_back=True)                          # a locked queue keeps its device
    e.submit("c", [eng.Task("U", None, eng.UNLOCK), eng.Task("R2", {"duration": 0.01}),
                   eng.Task("R3", {"duration": 0.01}), eng.Task("R4", {"duration": 0.01})])
    seen = {r.task_id: r.error for r in e.advance()}
    clock.advance(100.0)
    seen.update({r.task_id: r.error for r in e.advance()})
    assert set(seen) == {"R1", "U", "R2", "R3", "R4"}               # each run or handed back: none left waiting


def test_scheduled_arrivals_at_a_part_cut_to_nothing_are_handed_back():
    e, clock = _engine()
    e.schedule("c", [eng.Task(1, {"duration": 0.01})], [5.0])
    e.resize_group("g", 0, hand_back=True)
    clock.advance(3600.0)
    assert [(r.task_id, r.error) for r in e.advance()] == [(1, eng.MOVED)]


def test_a_lock_granted_on_a_part_cut_to_nothing_keeps_what_follows_and_its_unlock_there(vf):
    a = vf._all["A"]
    vf.submit({"duration": 0.01})                                   # 1 -> A
    assert a.drained() == [1]
    locking = threading.Thread(target=vf.lock, daemon=True)
    locking.start()
    eventually(lambda: 2 in a.sent, what="the LOCK sent to A")
    assert a.drained() == [2]
    vf._complete([result(2, kind=fpga_pb2.Task.KIND_LOCK)])         # granted at A
    locking.join(5)
    vf._complete([result(1, eng.MOVED)])                            # A cut to nothing: 1 handed back, lock kept
    vf.submit({"duration": 0.01})                                   # 3: on the locked device, at A
    unlocking = threading.Thread(target=vf.unlock, daemon=True)
    unlocking.start()
    eventually(lambda: any(4 in p.sent for p in vf._all.values()), what="the UNLOCK sent")
    where = {tid: p.part.server for p in vf._all.values() for tid in p.sent}
    assert (where[3], where[4]) == ("A", "A")                       # elsewhere: "unlock without a lock"
    vf._complete([result(4, kind=fpga_pb2.Task.KIND_UNLOCK)])
    unlocking.join(5)
    assert vf._held is None and vf._locked is None
