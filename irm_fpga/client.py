"""A virtual FPGA for Python programs: one FPGA group, however many devices and servers.

    fpga = VirtualFpga.attach(orchestrator_address, tenant, group_id)
    future = fpga.submit({"spot": 100.0, "strike": 95.0, ...})
    result = future.result()          # TaskOutcome: value, queue_time_s, device_time_s, ...
    fpga.close()

Tasks first go to an unbounded wait queue; at most `max_in_flight` are in
flight at once (thesis §3.2.3). Each server part has one Execute stream: its
sender (the gRPC thread that reads the stream's requests) takes whatever has
queued up for the part when it runs, up to `batch_size` tasks in one batch --
a task submitted alone goes alone, at once (no batching window), a burst goes
in batches. The part's receiver thread reads the results and completes the
futures itself (one lock acquisition per result batch, which also moves
waiting tasks into the freed in-flight slots). Parts get tasks in proportion
to their devices. `lock()`/`unlock()` send the pseudo-tasks that give this
client one device exclusively (thesis §3.2.4).

One task at a time (the latency-bound case, thesis Fig. 3.4) takes no longer
through this library than a unary call straight to a device:
`harness bench fpga-overhead` pairs the two (`client_added_ms_per_task`). A
unary RunBatch per lone task was tried instead of the stream, and was slower:
a message on an open stream costs the server less than a call does.
"""

from __future__ import annotations

import itertools
import queue
import threading
from collections import deque
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass
from typing import Any

import grpc

from harness.v1 import fpga_pb2, fpga_pb2_grpc
from irm_fpga.engine import MOVED
from irm_fpga.wire import WireError, from_map, to_map
from services import client as rpc

_STOP = object()


@dataclass(frozen=True)
class TaskOutcome:
    id: int
    value: dict[str, Any]
    queue_time_s: float
    device_time_s: float
    device: int
    server: str
    kind: int


class TaskFailed(RuntimeError):
    pass


class _Part:
    def __init__(self, owner: VirtualFpga, part: fpga_pb2.AttachedPart) -> None:
        self.owner = owner
        self.part = part
        self.outbox: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self.sent: set[int] = set()  # task ids handed to this part and not answered yet
        # A channel of its own (closed with the part), with the suite's message limits: a result over gRPC's
        # default 4 MiB would fail the task.
        self.channel = grpc.insecure_channel(part.address, options=rpc.CHANNEL_OPTIONS)
        self.stub = fpga_pb2_grpc.FpgaServerStub(self.channel)
        self.call = self.stub.Execute(self._batches())
        self.receiver = threading.Thread(target=self._receive, name=f"fpga-recv-{part.server}", daemon=True)
        self.receiver.start()

    def _batches(self) -> Iterator[fpga_pb2.TaskBatch]:
        o = self.owner
        first = True
        while True:
            item = self.outbox.get()
            if item is _STOP:
                return
            items = [item]
            while len(items) < o.batch_size:
                try:
                    more = self.outbox.get_nowait()
                except queue.Empty:
                    break
                if more is _STOP:
                    self.outbox.put(_STOP)
                    break
                items.append(more)
            batch = fpga_pb2.TaskBatch(tasks=[t for t, _ in items])
            if first:
                batch.client_id, batch.group_id, batch.token = o.client_id, o.group_id, o.token
                first = False
            yield batch

    def _receive(self) -> None:
        why = f"{self.part.server}: the stream ended"
        try:
            complete = self.owner._complete
            for rb in self.call:
                complete(rb.results)  # futures are completed here, by the thread that reads the stream
        except grpc.RpcError as e:
            why = f"{self.part.server}: {e.code().name}: {e.details()}"
        # However the stream ended, what it still owed will not come: fail those tasks (only
        # those), and stop sending here until a refresh finds the part again.
        self.owner._part_ended(self, why)

    def close(self) -> None:
        self.outbox.put(_STOP)
        self.receiver.join(timeout=30)
        self.channel.close()


class VirtualFpga:
    def __init__(self, attachment: fpga_pb2.Attachment, *, max_in_flight: int = 4096, batch_size: int = 300,
                 orchestrator: fpga_pb2_grpc.FpgaOrchestratorStub | None = None, tenant: str = "",
                 refresh_s: float = 1.0) -> None:
        self.client_id = attachment.client_id
        self.group_id = attachment.group_id
        self.token = attachment.token
        self.design = attachment.design
        self.batch_size = batch_size
        self._orchestrator = orchestrator
        self._tenant = tenant
        self._ids = itertools.count(1)
        self._futures: dict[int, Future] = {}
        self._tasks: dict[int, tuple[fpga_pb2.Task, _Part | None]] = {}
        self._lock = threading.Lock()
        self._max_in_flight = max(1, max_in_flight)
        self._in_flight = 0
        # Unbounded: submit never blocks; the pump moves tasks on as in-flight slots free up.
        self._waiting: deque[tuple[fpga_pb2.Task, Future, _Part | None]] = deque()
        self._all: dict[str, _Part] = {}
        self._where: dict[int, _Part] = {}
        self._parts: list[_Part] = []
        self._cycle: Iterator[_Part] = iter(())
        self._use(attachment)
        self._locked: _Part | None = None
        self._held: _Part | None = None      # where the device of a granted lock is, until its UNLOCK is answered
        self._lock_lost: str | None = None   # why the lock died with its part's stream, until unlock() or lock()
        self._closing = threading.Event()
        if refresh_s > 0 and orchestrator is not None:
            threading.Thread(target=self._refresh_loop, args=(refresh_s,), name="fpga-refresh", daemon=True).start()

    def _use(self, attachment: fpga_pb2.Attachment) -> None:
        """Send to the parts that have devices now (a group may grow onto, or shrink off, servers)."""
        for p in attachment.parts:
            if p.server not in self._all and p.devices > 0:
                self._all[p.server] = _Part(self, p)
            if p.server in self._all:
                self._all[p.server].part = p
        live = [self._all[p.server] for p in attachment.parts if p.devices > 0 and p.server in self._all]
        if not live:
            raise RuntimeError(f"group {self.group_id} has no devices to send tasks to")
        self._parts = live
        self._cycle = itertools.cycle([p for p in live for _ in range(p.part.devices)])

    def refresh(self) -> None:
        """Ask the Orchestrator where the group's devices are now."""
        assert self._orchestrator is not None
        att = self._orchestrator.AttachClient(fpga_pb2.AttachClientRequest(
            tenant=self._tenant, group_id=self.group_id, client_id=self.client_id), timeout=10)
        with self._lock:
            self._use(att)
        self._pump()  # tasks may have waited for a part to come (back)

    def _refresh_loop(self, every: float) -> None:
        while not self._closing.wait(every):
            try:
                self.refresh()
            except (grpc.RpcError, RuntimeError):
                continue  # the Orchestrator may be down: the data plane goes on as it is

    @classmethod
    def attach(cls, orchestrator_address: str, tenant: str, group_id: str, **kw: Any) -> VirtualFpga:
        stub = fpga_pb2_grpc.FpgaOrchestratorStub(grpc.insecure_channel(orchestrator_address))
        att = stub.AttachClient(fpga_pb2.AttachClientRequest(tenant=tenant, group_id=group_id), timeout=30)
        return cls(att, orchestrator=stub, tenant=tenant, **kw)

    # -- submitting ------------------------------------------------------
    def submit(self, params: Mapping[str, Any] | None = None, kind: int = fpga_pb2.Task.KIND_RUN) -> Future:
        """Queue one task; the future resolves to a TaskOutcome (or raises TaskFailed)."""
        task_id = next(self._ids)
        task = fpga_pb2.Task(id=task_id, kind=kind)
        to_map(params, task.params)
        fut: Future = Future()
        with self._lock:
            self._futures[task_id] = fut
            # Kept until answered: a part left without devices hands it back (with where it had to go).
            self._tasks[task_id] = (task, self._locked)
            self._waiting.append((task, fut, self._locked))
            sends = self._take()
        if sends:
            self._send(sends)
        return fut

    def _pump(self) -> None:
        """Send waiting tasks while fewer than max_in_flight are out (thesis §3.2.3)."""
        with self._lock:
            sends = self._take() if self._waiting else None
        if sends:
            self._send(sends)

    def _take(self) -> list[tuple[_Part, fpga_pb2.Task, Future]]:
        """Waiting tasks that may go now, each to its part (hold the lock)."""
        sends = []
        while self._waiting and self._in_flight < self._max_in_flight and self._parts:
            task, fut, pinned = self._waiting.popleft()
            self._in_flight += 1
            if pinned is not None and pinned not in self._parts and pinned is not self._held:
                # The lock's part lost its devices before granting it: the lock (handed back) is asked again
                # where the cycle says, and what was to follow it goes to that part. A granted lock keeps its
                # device whatever happens to the part: what is pinned to it still goes there.
                lk = self._locked
                pinned = lk if task.kind != fpga_pb2.Task.KIND_LOCK and lk is not None and (
                    lk in self._parts or lk is self._held) else None
            part = pinned if pinned is not None else next(self._cycle)
            if task.kind == fpga_pb2.Task.KIND_LOCK:
                self._locked = part
            part.sent.add(task.id)
            self._where[task.id] = part
            sends.append((part, task, fut))
        return sends

    @staticmethod
    def _send(sends: list[tuple[_Part, fpga_pb2.Task, Future]]) -> None:
        # Straight to the part's stream: its sender takes whatever has queued up by the time it
        # runs (a lone task goes alone, at once; a burst goes in batches of up to batch_size).
        for part, task, fut in sends:
            part.outbox.put((task, fut))

    def map(self, params_list: list[Mapping[str, Any]]) -> list[TaskOutcome]:
        futures = [self.submit(p) for p in params_list]
        return [f.result() for f in futures]

    def lock(self) -> TaskOutcome:
        """Exclusive use of one device until unlock(); later tasks run on it.

        If the stream to the lock's FPGA-server ends (the server restarts, the network fails), the
        lock is gone with it: the tasks pinned to it fail, later ones go to the live parts, and
        unlock() raises TaskFailed saying so."""
        if self._locked is not None:
            raise RuntimeError("already locked")
        self._lock_lost = None
        self._locked = self._parts[0]
        return self.submit(None, fpga_pb2.Task.KIND_LOCK).result()

    def unlock(self) -> TaskOutcome:
        if self._locked is None:
            lost, self._lock_lost = self._lock_lost, None
            if lost is not None:
                raise TaskFailed(lost)
            raise RuntimeError("not locked")
        out = self.submit(None, fpga_pb2.Task.KIND_UNLOCK).result()
        self._locked = None
        return out

    # -- completion ------------------------------------------------------
    def _complete(self, results: Sequence[fpga_pb2.TaskResult]) -> None:
        """Complete the futures of a batch of results; the in-flight slots they free go to waiting tasks."""
        done = []
        moved = []
        with self._lock:
            futures, where = self._futures, self._where
            for r in results:
                part = where.pop(r.id, None)
                if part is not None:
                    part.sent.discard(r.id)
                if r.error == MOVED and r.id in futures:
                    # Its part has no devices any more: not there again; the task waits for another part.
                    self._in_flight -= 1
                    if part is not None and part in self._parts:
                        self._parts = [p for p in self._parts if p is not part]
                        self._cycle = itertools.cycle([p for p in self._parts for _ in range(p.part.devices)])
                    task, pinned = self._tasks[r.id]
                    moved.append((task, futures[r.id], pinned))
                    continue
                fut = futures.pop(r.id, None)
                self._tasks.pop(r.id, None)
                if r.kind == fpga_pb2.Task.KIND_LOCK and not r.error:
                    self._held = part
                elif r.kind == fpga_pb2.Task.KIND_UNLOCK and not r.error:
                    self._held = None  # a refused UNLOCK (in a batch with a bad task) leaves the lock held
                if fut is not None:
                    self._in_flight -= 1
                    done.append((fut, r))
            self._waiting.extendleft(reversed(moved))      # first again, in the order they were sent
            sends = self._take() if self._waiting else None
        if sends:
            self._send(sends)
        for fut, r in done:
            try:
                if r.error:
                    fut.set_exception(TaskFailed(r.error))
                    continue
                try:
                    value = from_map(r.value, "value")
                except WireError as e:  # fails this task, not the stream's reader
                    fut.set_exception(TaskFailed(f"{r.server}: undecodable result: {e}"))
                    continue
                fut.set_result(TaskOutcome(r.id, value, r.queue_time_s, r.device_time_s, r.device, r.server,
                                           r.kind))
            except InvalidStateError:
                pass  # the caller cancelled it; the device ran it anyway

    def _part_ended(self, part: _Part, why: str) -> None:
        with self._lock:
            failed = []
            for task_id in list(part.sent):
                fut = self._futures.pop(task_id, None)
                self._tasks.pop(task_id, None)
                self._where.pop(task_id, None)
                if fut is not None:
                    self._in_flight -= 1
                    failed.append((fut, why))
            part.sent.clear()
            if self._held is part or self._locked is part:
                # The server forgets a client's lock with its stream (a restarted one never had it): what
                # was pinned to the lock cannot run as the caller meant, so it fails rather than waiting
                # for a part that is gone, and the lock is off (later tasks go to the live parts).
                lost = f"the lock on {part.part.server} was lost with its stream ({why})"
                self._held = self._locked = None
                self._lock_lost = lost
                keep: deque[tuple[fpga_pb2.Task, Future, _Part | None]] = deque()
                for task, fut, pinned in self._waiting:
                    if pinned is part:
                        self._futures.pop(task.id, None)
                        self._tasks.pop(task.id, None)
                        failed.append((fut, lost))
                    else:
                        keep.append((task, fut, pinned))
                self._waiting = keep
            if self._all.get(part.part.server) is part:
                del self._all[part.part.server]
            if part in self._parts:
                self._parts = [p for p in self._parts if p is not part]
                self._cycle = itertools.cycle([p for p in self._parts for _ in range(p.part.devices)])
        for fut, reason in failed:
            try:
                fut.set_exception(TaskFailed(reason))
            except InvalidStateError:
                pass  # cancelled by the caller
        self._pump()

    def pending(self) -> int:
        """Tasks submitted and not yet answered (waiting or in flight)."""
        with self._lock:
            return len(self._futures)

    def in_flight(self) -> int:
        with self._lock:
            return self._in_flight

    def close(self, detach: bool = True) -> None:
        self._closing.set()
        with self._lock:
            parts = list(self._all.values())
        for p in parts:
            p.close()
        if detach and self._orchestrator is not None:
            try:
                self._orchestrator.DetachClient(fpga_pb2.ClientRequest(
                    tenant=self._tenant, group_id=self.group_id, client_id=self.client_id), timeout=10)
            except grpc.RpcError:
                pass

    def __enter__(self) -> VirtualFpga:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
