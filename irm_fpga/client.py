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

Every future ends, one way or another. A task whose stream ends before its
result comes fails with TaskFailed (it may not have run: the server cancels
what a broken stream had queued). When the client can never send again --
revoked, detached or its group deleted (as the Orchestrator says, asked when
a server refuses the client), or no part left to send to with nobody to ask
for another (no Orchestrator, or refresh_s=0 and the Orchestrator, asked once
when the stream ended, named none) -- what waits fails with TaskFailed saying
why, as does each later submit(). close() fails what still waits beyond
max_in_flight; submit() after close() raises RuntimeError, as a
concurrent.futures executor does after shutdown().

A server whose `max_execute_streams` are all open refuses a part's stream
(RESOURCE_EXHAUSTED, reason STREAM_CAP) before reading any of it: nothing sent
on it ran, so its tasks go to the other parts, and the part is tried again
after 1 s, then 2, 4, ... up to 30 s between tries (a refresh does not reopen
it sooner) until a stream there answers. With no other part, tasks wait for
one, up to `stream_cap_wait_s` (60 s) from the first refusal; past it they fail
with TaskFailed saying the server refused the stream as full.

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
import time
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
from services import tenants, tls
from services.errors import STREAM_CAP, error_info

_STOP = object()

# A server refusing the client these ways no longer takes it: revoked, detached, its group (part) deleted. Whether
# that is for good is the Orchestrator's to say (a restarted server may not have been given the client back yet).
_REFUSED = (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.PERMISSION_DENIED)

# The waits between tries of a part whose server refused its stream as full (STREAM_CAP): the first, doubled after
# each refusal up to the last. The refresh's period would be too short: such a server is full until one of its
# clients closes, and each try that comes too soon is one more refusal and one more round trip for the tasks.
_FULL_RETRY_FIRST_S = 1.0
_FULL_RETRY_MAX_S = 30.0


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


@dataclass
class _Full:
    """A server that refused this client's stream as full, from its first refusal until a stream there answers."""

    part: fpga_pb2.AttachedPart          # where to try again (a refresh keeps it current)
    since: float                         # time.monotonic() of the first refusal: what waits for it is bounded
    why: str                             # what the server said the last time
    delay: float                         # the wait after the next refusal
    timer: threading.Timer | None = None  # the next try, if no stream is open there now


class _Part:
    def __init__(self, owner: VirtualFpga, part: fpga_pb2.AttachedPart) -> None:
        self.owner = owner
        self.part = part
        self.outbox: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self.sent: set[int] = set()  # task ids handed to this part and not answered yet
        # A channel of its own (closed with the part), with the suite's message limits: a result over gRPC's
        # default 4 MiB would fail the task.
        self.channel = tls.open_channel(part.address, rpc.CHANNEL_OPTIONS)
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
        code: grpc.StatusCode | None = None
        answered = full = False
        try:
            complete = self.owner._complete
            for rb in self.call:
                if not answered:
                    answered = True
                    self.owner._answered(self)
                complete(rb.results)  # futures are completed here, by the thread that reads the stream
        except grpc.RpcError as e:
            code = e.code()
            why = f"{self.part.server}: {code.name}: {e.details()}"
            # The server counts a stream against max_execute_streams before reading its first message: refused so,
            # none of what was sent on it ran.
            full = (not answered and code == grpc.StatusCode.RESOURCE_EXHAUSTED
                    and (error_info(e) or ("", {}))[0] == STREAM_CAP)
        # However the stream ended, what it still owed will not come: fail those tasks (only
        # those), and stop sending here until a refresh finds the part again.
        self.owner._part_ended(self, why, code, full=full)

    def end(self) -> None:
        """Its stream is over (called from the receiver): the sender, parked on the outbox, must return, or each
        broken stream would keep a thread (and the channel its sockets) for the life of the client."""
        self.outbox.put(_STOP)
        self.channel.close()

    def close(self) -> None:
        self.outbox.put(_STOP)
        self.receiver.join(timeout=30)
        self.channel.close()


class VirtualFpga:
    def __init__(self, attachment: fpga_pb2.Attachment, *, max_in_flight: int = 4096, batch_size: int = 300,
                 orchestrator: fpga_pb2_grpc.FpgaOrchestratorStub | None = None, tenant: str = "",
                 refresh_s: float = 1.0, stream_cap_wait_s: float = 60.0) -> None:
        """`refresh_s`: how often to ask the Orchestrator where the group's devices are (0: only when a stream
        ends, and refresh()). `stream_cap_wait_s`: how long tasks with no other part to go to wait for a server
        that refuses this client's stream as full (see the module's docstring)."""
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
        self._closed = False               # close() began: nothing is sent any more, submit() raises
        self._gone: str | None = None      # why this client can never send again (revoked, its group deleted)
        self._last_loss = ""               # why the last live part went (the reason, with no Orchestrator to ask)
        self._locked: _Part | None = None
        self._held: _Part | None = None      # where the device of a granted lock is, until its UNLOCK is answered
        self._lock_lost: str | None = None   # why the lock died with its part's stream, until unlock() or lock()
        self._closing = threading.Event()
        self._refreshing = refresh_s > 0 and orchestrator is not None   # a loop asks the Orchestrator
        self._full_wait_s = stream_cap_wait_s
        self._full: dict[str, _Full] = {}  # servers that refused this client's stream as full (by name)
        # Parts opened by asking the Orchestrator when a stream ended, until they answer: one that ends unanswered
        # too is not asked about again at once (a server the Orchestrator reaches and this client cannot would
        # have the two ask and fail in a loop).
        self._reopened: set[_Part] = set()
        self._asking = 0                   # streams' ends now asking the Orchestrator: what waits, waits for them
        # Under the lock: a stream refused at once (a full server) ends before this returns.
        with self._lock:
            self._use(attachment)
        if self._refreshing:
            threading.Thread(target=self._refresh_loop, args=(refresh_s,), name="fpga-refresh", daemon=True).start()

    def _use(self, attachment: fpga_pb2.Attachment, after: _Part | None = None) -> None:
        """Send to the parts that have devices now (a group may grow onto, or shrink off, servers); `after`: the
        part whose stream's end made this refresh (hold the lock)."""
        if self._closed:
            return  # a refresh that was under way: a part opened now would outlive close()
        listed = {p.server for p in attachment.parts if p.devices > 0}
        for server in [s for s in self._full if s not in listed]:
            self._drop_full(server)  # the group left that server: no more tries there
        for p in attachment.parts:
            full = self._full.get(p.server)
            if full is not None and p.server not in self._all:
                full.part = p  # its next try opens it: opened now, it would only be refused again
                continue
            if p.server not in self._all and p.devices > 0:
                self._all[p.server] = _Part(self, p)
                if after is not None and p.server == after.part.server:
                    self._reopened.add(self._all[p.server])
            if p.server in self._all:
                self._all[p.server].part = p
        live = [self._all[p.server] for p in attachment.parts if p.devices > 0 and p.server in self._all]
        if not live and not self._full:
            raise RuntimeError(f"group {self.group_id} has no devices to send tasks to")
        self._set_parts(live)

    def _set_parts(self, parts: list[_Part]) -> None:
        self._parts = parts
        self._cycle = itertools.cycle([p for p in parts for _ in range(p.part.devices)])

    def refresh(self) -> None:
        """Ask the Orchestrator where the group's devices are now.

        Raises the Orchestrator's grpc.RpcError. When it says this client can never send again (revoked or
        detached, its group deleted), the tasks waiting fail with TaskFailed saying so first, and so does every
        later submit()."""
        self._refresh()

    def _refresh(self, after: _Part | None = None) -> None:
        assert self._orchestrator is not None
        try:
            att = self._orchestrator.AttachClient(fpga_pb2.AttachClientRequest(
                tenant=self._tenant, group_id=self.group_id, client_id=self.client_id), timeout=10)
        except grpc.RpcError as e:
            gone = self._for_good(e)
            if gone is not None:
                with self._lock:
                    if self._gone is None:
                        self._gone = gone
                self._pump()  # what waits can never go now: it fails
            raise
        with self._lock:
            self._use(att, after)
        self._pump()  # tasks may have waited for a part to come (back)

    def _for_good(self, e: grpc.RpcError) -> str | None:
        """Why the Orchestrator's refusal of an attach means this client can never send again, or None (try later).

        FAILED_PRECONDITION and PERMISSION_DENIED are the Orchestrator's own answers about the client (revoked,
        detached, another tenant's). NOT_FOUND may be a server's, passed on (a restarted server not yet given
        its part back), so only the group's own read settles it."""
        assert self._orchestrator is not None
        code = e.code()
        if code in (grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.PERMISSION_DENIED):
            return f"client {self.client_id!r} can no longer use FPGA group {self.group_id!r}: {e.details()}"
        if code != grpc.StatusCode.NOT_FOUND:
            return None
        try:
            self._orchestrator.GetGroup(fpga_pb2.GetGroupRequest(tenant=self._tenant, group_id=self.group_id),
                                        timeout=10)
        except grpc.RpcError as g:
            if g.code() == grpc.StatusCode.NOT_FOUND:
                return f"FPGA group {self.group_id!r} was deleted ({g.details()})"
        return None

    def _refresh_loop(self, every: float) -> None:
        while not self._closing.wait(every) and self._gone is None:
            try:
                self.refresh()
            except (grpc.RpcError, RuntimeError):
                continue  # the Orchestrator may be down: the data plane goes on as it is

    @classmethod
    def attach(cls, orchestrator_address: str, tenant: str, group_id: str, token: str | None = None,
               **kw: Any) -> VirtualFpga:
        """`token`: the tenant's (services.tenants; default $HARNESS_TENANT_TOKEN), for an Orchestrator that
        checks them."""
        stub = fpga_pb2_grpc.FpgaOrchestratorStub(tenants.tenant_channel(orchestrator_address, token))
        att = stub.AttachClient(fpga_pb2.AttachClientRequest(tenant=tenant, group_id=group_id), timeout=30)
        return cls(att, orchestrator=stub, tenant=tenant, **kw)

    # -- submitting ------------------------------------------------------
    def submit(self, params: Mapping[str, Any] | None = None, kind: int = fpga_pb2.Task.KIND_RUN) -> Future:
        """Queue one task; the future resolves to a TaskOutcome (or raises TaskFailed).

        Once the client can never send again (revoked, its group deleted: see the module's docstring) the
        future returned has already failed with TaskFailed saying why. After close(), raises RuntimeError (as
        concurrent.futures executors do after shutdown()): nothing would ever run it."""
        task_id = next(self._ids)
        task = fpga_pb2.Task(id=task_id, kind=kind)
        to_map(params, task.params)
        fut: Future = Future()
        with self._lock:
            if self._closed:
                raise RuntimeError(f"cannot submit: the client of FPGA group {self.group_id!r} was closed")
            self._futures[task_id] = fut
            # Kept until answered: a part left without devices hands it back (with where it had to go).
            self._tasks[task_id] = (task, self._locked)
            self._waiting.append((task, fut, self._locked))
            sends, failed = self._take()
        self._send(sends, failed)
        return fut

    def _pump(self) -> None:
        """Send waiting tasks while fewer than max_in_flight are out (thesis §3.2.3)."""
        with self._lock:
            if not self._waiting:
                return
            sends, failed = self._take()
        self._send(sends, failed)

    def _unsendable(self) -> str | None:
        """Why what waits can never be sent, or None (hold the lock)."""
        if self._closed:
            return "the client was closed before the task was sent"
        if self._gone is not None:
            return self._gone
        if self._parts or self._asking:
            return None
        if self._full:
            # Every part left refused this client's stream as full: what waits, waits for a stream there, as long
            # as the server refusing for the shortest time has refused for less than stream_cap_wait_s.
            now = time.monotonic()
            full = max(self._full.values(), key=lambda f: f.since)
            if now - full.since < self._full_wait_s:
                return None
            return (f"FPGA-server {full.part.server!r} refused this client's stream as full for "
                    f"{now - full.since:.0f} s: its max_execute_streams streams are all open ({full.why}); "
                    f"the task was not sent (this client waits at most stream_cap_wait_s={self._full_wait_s:g} s "
                    "for a stream: close other clients of that server, or raise its max_execute_streams)")
        if self._orchestrator is None:
            return (f"no part of FPGA group {self.group_id!r} is left to send to ({self._last_loss}), "
                    "and this client has no Orchestrator to ask where the group is now")
        if not self._refreshing:
            return (f"no part of FPGA group {self.group_id!r} is left to send to ({self._last_loss}), and this "
                    "client does not ask the Orchestrator again by itself (refresh_s=0): refresh() once the "
                    "group's servers are back")
        return None

    def _take(self) -> tuple[list[tuple[_Part, fpga_pb2.Task, Future]], list[tuple[Future, str]]]:
        """Waiting tasks that may go now, each to its part, and those that never can, with why (hold the lock)."""
        sends: list[tuple[_Part, fpga_pb2.Task, Future]] = []
        failed: list[tuple[Future, str]] = []
        why = self._unsendable()
        if why is not None:
            while self._waiting:
                task, fut, _ = self._waiting.popleft()
                self._futures.pop(task.id, None)
                self._tasks.pop(task.id, None)
                failed.append((fut, why))
            return sends, failed
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
        return sends, failed

    @staticmethod
    def _send(sends: list[tuple[_Part, fpga_pb2.Task, Future]], failed: Sequence[tuple[Future, str]] = ()) -> None:
        # Straight to the part's stream: its sender takes whatever has queued up by the time it
        # runs (a lone task goes alone, at once; a burst goes in batches of up to batch_size).
        for part, task, fut in sends:
            part.outbox.put((task, fut))
        _fail(failed)

    def map(self, params_list: list[Mapping[str, Any]]) -> list[TaskOutcome]:
        futures = [self.submit(p) for p in params_list]
        return [f.result() for f in futures]

    def lock(self) -> TaskOutcome:
        """Exclusive use of one device until unlock(); later tasks run on it.

        If the LOCK fails (TaskFailed), nothing is locked: lock() may be called again. If the stream
        to the lock's FPGA-server ends (the server restarts, the network fails), the lock is gone
        with it (the server releases the device of a stream that breaks): the tasks pinned to it
        fail, later ones go to the live parts, and unlock() raises TaskFailed saying so."""
        with self._lock:
            if self._locked is not None:
                raise RuntimeError("already locked")
            self._lock_lost = None
            self._locked = self._parts[0] if self._parts else None  # None: the LOCK goes where the cycle says
        try:
            fut = self.submit(None, fpga_pb2.Task.KIND_LOCK)
        except RuntimeError:
            with self._lock:
                self._locked = None
            raise
        try:
            return fut.result()
        except TaskFailed:
            with self._lock:
                # A refused LOCK (a bad task in its batch, say) holds nothing: left set, every later
                # lock() would be "already locked" and unlock() refused by the server, for good.
                if self._held is None:
                    self._locked = None
                self._lock_lost = None  # this lock() has said why
            raise

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
                        self._set_parts([p for p in self._parts if p is not part])
                        if not self._parts:
                            self._last_loss = f"{part.part.server} was cut to no devices"
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
            sends, failed = self._take() if self._waiting else ([], [])
        self._send(sends, failed)
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

    def _answered(self, part: _Part) -> None:
        """`part`'s stream answered (its first results): its server took it."""
        server = part.part.server
        with self._lock:
            self._reopened.discard(part)
            if server in self._full and self._all.get(server) is part:
                del self._full[server]  # a later refusal there starts from the first wait again

    def _drop_full(self, server: str) -> None:
        """No more tries of `server` (hold the lock)."""
        full = self._full.pop(server, None)
        if full is not None and full.timer is not None:
            full.timer.cancel()

    def _back_off(self, server: str, part: fpga_pb2.AttachedPart, why: str) -> None:
        """`server` refused the stream as full: try it again later, each time after twice the wait (hold the
        lock)."""
        now = time.monotonic()
        full = self._full.get(server)
        if full is None:
            full = self._full[server] = _Full(part, now, why, _FULL_RETRY_FIRST_S)
        full.part, full.why = part, why
        wait = full.delay
        full.delay = min(full.delay * 2, _FULL_RETRY_MAX_S)
        left = full.since + self._full_wait_s - now
        if left > 0:
            wait = min(wait, left)  # a try at the limit: if it is refused too, what waits fails then, not later
        if full.timer is not None:
            full.timer.cancel()
        full.timer = threading.Timer(wait, self._retry_full, args=(server,))
        full.timer.daemon = True
        full.timer.start()

    def _retry_full(self, server: str) -> None:
        with self._lock:
            full = self._full.get(server)
            # Only this try's own timer opens the stream: one cancelled after it fired (the group left the
            # server, close()) or superseded finds another, or none.
            if (full is None or full.timer is not threading.current_thread() or self._closed
                    or self._gone is not None or server in self._all):
                return
            full.timer = None
            part = self._all[server] = _Part(self, full.part)
            self._set_parts([*self._parts, part])
        self._pump()

    def _part_ended(self, part: _Part, why: str, code: grpc.StatusCode | None = None, *,
                    full: bool = False) -> None:
        """`part`'s stream ended, with `code` (None: it ended without a status); `full`: the server refused it as
        full before reading any of it (STREAM_CAP)."""
        server = part.part.server
        with self._lock:
            closing = self._closed
            live = part in self._parts
            reopened = part in self._reopened
            self._reopened.discard(part)
            mine = self._all.get(server) is part
            if mine:
                del self._all[server]
            if live:
                self._set_parts([p for p in self._parts if p is not part])
                if not self._parts:
                    self._last_loss = why
            sent = []
            failed: list[tuple[Future, str]] = []
            if full and self._held is not part:
                # Nothing sent on it ran: its tasks go first again, in the order they were submitted, to the other
                # parts or, with none, to this one once its server takes a stream (a lock asked here included).
                back = []
                for task_id in sorted(part.sent):
                    self._where.pop(task_id, None)
                    fut = self._futures.get(task_id)
                    if fut is not None:
                        self._in_flight -= 1
                        task, pinned = self._tasks[task_id]
                        back.append((task, fut, pinned))
                part.sent.clear()
                self._waiting.extendleft(reversed(back))
                if live and not closing and self._gone is None:
                    self._back_off(server, part.part, why)
                ask = False
            else:
                full = False
                if mine:
                    self._drop_full(server)  # its server took the stream, which ended another way
                for task_id in list(part.sent):
                    fut = self._futures.pop(task_id, None)
                    self._tasks.pop(task_id, None)
                    self._where.pop(task_id, None)
                    if fut is not None:
                        self._in_flight -= 1
                        sent.append(fut)
                part.sent.clear()
                if self._held is part or self._locked is part:
                    # The server releases the device a client locked when the client's stream ends (a restarted
                    # server never had the lock): what was pinned to the lock cannot run as the caller meant, so it
                    # fails rather than waiting for a part that is gone, and the lock is off (later tasks go to
                    # the live parts; lock() takes a new one).
                    lost = (f"the lock on {server} was lost with its stream ({why}); the server released its "
                            "device: lock() again for another")
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
                # A server refusing the client (NOT_FOUND, PERMISSION_DENIED): the Orchestrator says whether that
                # is for good (the reason the tasks fail with) or not (a restarted server is given the client
                # back, and the part comes back with the refresh). Any other end, with no refresh loop to find
                # the part again: the Orchestrator is asked once, now; if it names no part, what waits fails.
                # Not for a part such an ask opened that ended unanswered too: the next ask would be the same.
                ask = (not closing and self._orchestrator is not None and self._gone is None and not reopened
                       and (code in _REFUSED or (live and not self._refreshing)))
                if ask:
                    self._asking += 1
        part.end()
        if full:
            self._pump()  # what came back goes on (or fails: the client closed, or waited too long)
            return
        if closing:
            reason = f"the client was closed before {server} answered ({why}); the task may not have run"
        else:
            if ask:
                try:
                    self._refresh(after=part)
                except (grpc.RpcError, RuntimeError) as e:
                    said = f"{e.code().name}: {e.details()}" if isinstance(e, grpc.RpcError) else str(e)
                    with self._lock:
                        if live and not self._parts:
                            self._last_loss = f"{why}; the Orchestrator, asked where the group is now: {said}"
                finally:
                    with self._lock:
                        self._asking -= 1
            elif code in _REFUSED and self._orchestrator is None:
                why = (f"{why} (client {self.client_id!r} is not attached there: revoked, detached or its "
                       "group deleted)")
                with self._lock:
                    if not self._parts:
                        self._last_loss = why
            gone = self._gone
            reason = (f"{gone} ({why})" if gone is not None else
                      f"{why}; the task may not have run (its stream ended before it was answered)")
        _fail([(fut, reason) for fut in sent] + failed)
        self._pump()

    def pending(self) -> int:
        """Tasks submitted and not yet answered (waiting or in flight)."""
        with self._lock:
            return len(self._futures)

    def in_flight(self) -> int:
        with self._lock:
            return self._in_flight

    def close(self, detach: bool = True) -> None:
        """Wait for the tasks in flight (up to 30 s a part), then end the streams and detach.

        Tasks still waiting for an in-flight slot (beyond max_in_flight) are not sent: they fail with
        TaskFailed ("the client was closed ..."). submit() afterwards raises RuntimeError."""
        self._closing.set()
        with self._lock:
            self._closed = True
            parts = list(self._all.values())
            for server in list(self._full):
                self._drop_full(server)
            _, failed = self._take()
        _fail(failed)
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


def _fail(failed: Sequence[tuple[Future, str]]) -> None:
    """Fail futures, outside the client's lock: their callbacks may submit again."""
    for fut, why in failed:
        try:
            fut.set_exception(TaskFailed(why))
        except InvalidStateError:
            pass  # cancelled by the caller
