"""The emulated FPGA-server as a gRPC service: the engine on the wall clock.

Results are handed out when the clock reaches their completion time. Whoever
waits for results drives the engine: a RunBatch handler advances it itself
(so a lone client pays no thread hand-off per task), and so does the handler
of an Execute stream (the client library's path) while the stream is owed
results -- one stream at a time, the others getting what it routes to them
and one of them taking over when it is done. A stream's reader thread hands
each batch to its handler, which sleeps until the task is due and writes the
result itself: one thread hand-off per lone task, no dispatcher. The
dispatcher thread drives the engine when nobody waits for results, and looks
in every DISPATCH_GRACE_S while handlers drive, for an event none of them
planned for; idle, it sleeps until told of work (IDLE_LOOK_S at most).

The latency of one task through a group (thesis Fig. 3.4) is what RunBatch
adds over RunDirect, so both handlers are kept lean and alike: the same
validation of parameters, the same sleep primitive while the device is busy
(a timed acquisition of a bare lock, `_doze`), the same result encoding. On
RunBatch the group's work is: check the client's token, the engine's
`submit_next` (shortest queue, device locking, and when to look again; one
lock acquisition, inline for a single task), one `poll` per wake-up (results, device events and the next
event time under one lock acquisition), and routing results to whoever waits
for them. No thread is woken for it: not the dispatcher (told only when work
is left for it), and no Event or queue is allocated per call.

Results go back by sink, not only by client: the engine knows each task by its
client's id and the sink (Execute stream, RunBatch call) it came on (`_Id`), so
two sinks of one client may use the same task ids at once and each gets its
own results. An Execute stream that ends while it still owes results (the
client cancelled, the connection broke) takes its queued tasks out of the
engine and ends a device lock taken on it: nobody is left to answer them to or
to unlock it. Each open stream holds a gRPC worker thread, idle or not, so
their number is capped (`max_execute_streams`) below the server's threads.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import grpc

from harness.v1 import fpga_pb2, fpga_pb2_grpc
from irm_fpga import designs as design_lib
from irm_fpga import engine as eng
from irm_fpga.wire import KIND_TO_ENGINE, KIND_TO_WIRE, WireError, choices, from_map, to_map
from services import control
from services.clock import Clock, WallClock
from services.errors import (
    STREAM_CAP,
    FailedPrecondition,
    FieldViolation,
    HarnessError,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    ResourceExhausted,
    Unavailable,
)
from services.server import CallCap, Component
from services.tls import TlsSettings

log = logging.getLogger(__name__)

STATE = {
    eng.UNASSIGNED: fpga_pb2.DeviceInfo.STATE_FREE,
    eng.RECONFIGURING: fpga_pb2.DeviceInfo.STATE_RECONFIGURING,
    eng.IDLE: fpga_pb2.DeviceInfo.STATE_IDLE,
    eng.BUSY: fpga_pb2.DeviceInfo.STATE_BUSY,
    "held": fpga_pb2.DeviceInfo.STATE_BUSY,
    "blacklisted": fpga_pb2.DeviceInfo.STATE_BLACKLISTED,
}


@dataclass
class FpgaServerConfig(TlsSettings):
    address: str = "127.0.0.1:50081"
    name: str = "fpga-0"
    devices: int = 8
    reconfig_mean_s: float = 3.78
    reconfig_std_s: float = 0.13
    reconfig_failure_rate: float = 0.0
    blacklist_after: int = 3
    seed: int = 0
    # InjectFault answers only with this on (tests, fault drills): it makes reconfigurations fail and, repeated,
    # blacklists devices, which no caller of a production server should be able to do.
    fault_injection: bool = False
    # Control calls (group parts, clients, state) only from a caller sending this token: the Orchestrator's
    # `control_token` (services.control). Empty: anyone who reaches the address (development).
    control_token: str = ""
    # Execute streams open at once; one more is RESOURCE_EXHAUSTED (reason STREAM_CAP). Each holds one of the
    # server's gRPC worker threads for as long as it is open, sending or idle: the server gets this many plus a
    # reserve for every other call (control calls, RunBatch, RunDirect), which so never wait behind idle clients.
    max_execute_streams: int = 64


# gRPC worker threads beyond the Execute streams': control calls, RunBatch and RunDirect.
_OTHER_WORKERS = 16
# While handlers drive the engine, the dispatcher looks in this often and hands out what is this late.
DISPATCH_GRACE_S = 0.02
# With no work at all, nothing can fall due unseen: new work and state changes notify the
# dispatcher (`_kick`, a handler leaving work behind), and the first handler to drive wakes it
# (`_one_more_driver`). So an idle server wakes twice a second, not fifty times.
IDLE_LOOK_S = 0.5
# GetServer reports the latest device events (failed reconfigurations, blacklistings), not a server's whole
# life: kept unbounded, a flaky device would grow every GetServer answer (and this process) without end.
EVENTS_KEPT = 200
# An Execute stream's result messages stay under this many bytes (a single larger result is sent alone): well
# within gRPC's default 4 MiB receive limit, so a client in any language takes them with default settings.
RESULT_BATCH_BYTES = 1 << 20
_FIELD_OVERHEAD = 6     # a repeated message field's tag and length prefix, at most, for a result under 2 GiB


def domain_error(e: Exception, batch: fpga_pb2.TaskBatch | None = None) -> HarnessError:
    """The engine's error as the caller's; `batch`: the request whose tasks the engine was given (a task's error
    then names the field of that request that carried the bad value)."""
    if isinstance(e, eng.NotFoundError):
        return NotFound(str(e))
    if isinstance(e, eng.CapacityError):
        return ResourceExhausted(str(e))
    if isinstance(e, eng.AlreadyExistsError | eng.PreconditionError):
        return FailedPrecondition(str(e))
    if isinstance(e, eng.ArgumentError):
        if e.index is not None and batch is not None:
            return InvalidArgument(str(e), _task_violations(e, batch))
        # The engine's arguments are named as the control-plane requests' fields (size, client_id, ...).
        return InvalidArgument(str(e), [FieldViolation(e.field, str(e))])
    return InvalidArgument(str(e))


def _task_violations(e: eng.ArgumentError, batch: fpga_pb2.TaskBatch) -> list[FieldViolation]:
    """Where in the batch the engine's complaint about task `e.index` points: a parameter the task carries is in
    its params, one only the batch carries in shared_params; a missing one belongs in the task's params."""
    base = f"tasks[{e.index}]"
    if e.field != "params" or not e.params:
        return [FieldViolation(f"{base}.{e.field}", str(e))]
    own, shared = batch.tasks[e.index].params, batch.shared_params
    return [FieldViolation(f"shared_params.{p}" if p not in own and p in shared else f"{base}.params.{p}", str(e))
            for p in e.params]


def _bad_wire(e: WireError, where: str) -> InvalidArgument:
    return InvalidArgument(str(e), [FieldViolation(e.field or where, e.reason)])


def _bad_kind(field_path: str, kind: int) -> InvalidArgument:
    # An unknown number would otherwise run as a plain task: the client meant something this server cannot do.
    return InvalidArgument.of(field_path, f"unknown task kind {kind}; one of {choices(fpga_pb2.Task.Kind)}")


def _doze(bell: Any, seconds: float) -> None:
    """Sleep up to `seconds` on a held bare lock (returns early if someone releases it)."""
    bell.acquire(timeout=seconds)


class _Bell:
    """`bell` is a bare lock used as an auto-reset event: its handler holds it and
    sleeps by acquiring it again with a timeout (`_doze`); anyone wakes it by
    releasing it (a release while already released does nothing). Cheaper than
    a threading.Event, and it wakes the handler only when something changed.
    """

    __slots__ = ("bell",)

    def __init__(self) -> None:
        self.bell = threading.Lock()
        self.bell.acquire()

    def wake(self) -> None:
        try:
            self.bell.release()
        except RuntimeError:
            pass  # already rung


class _Id(tuple):
    """A task's id in the engine: (the id its client gave it, the sink it came on).

    Ids are the client's, and one client may have several sinks at once (an Execute stream and a RunBatch
    call, two processes attached as one client), each numbering its tasks its own way: known by both, a
    result goes back to the sink that sent its task, never to another one with a task of the same number in
    flight. Shown as the client's id in the engine's messages.
    """

    __slots__ = ()

    def __repr__(self) -> str:
        return repr(self[0])


_tnew = tuple.__new__


class _Waiter(_Bell):
    """A RunBatch handler waiting for its own tasks' results."""

    __slots__ = ("expect", "results")

    def __init__(self, expect: set[Any]) -> None:
        super().__init__()
        self.expect = expect
        self.results: list[eng.Result] = []

    def deliver(self, results: Sequence[eng.Result]) -> None:
        expect = self.expect
        for r in results:
            tid = r.task_id[0]
            if tid in expect:
                # Keep first, then tick off: the handler reads `results` once `expect` is empty.
                self.results.append(r)
                expect.discard(tid)
        if not expect:
            self.wake()


class _Stream(_Bell):
    """An Execute stream: its client's results wait in `out` for the stream's handler to write them.

    The handler sleeps on `bell` (`_Bell`); results routed here, the stream's reader (new tasks, the end of the requests) and `_kick`
    ring it. `submitted` is written by the reader only (before it submits), `answered` by the
    handler only: their difference is what the stream still owes, without a lock.

    Only results of the tasks this stream sent come here (`_Id`). `gone`: the handler is done, nothing
    more is submitted for it; set, and read before each submission, under `submitting`, so that what
    the stream leaves in the engine is all there when the handler takes it out (`_abandon`). `pseudo`:
    it sent a LOCK or UNLOCK (the lock to end if the stream ends).
    """

    __slots__ = ("out", "submitted", "answered", "closed", "failure", "gone", "pseudo", "submitting")

    def __init__(self) -> None:
        super().__init__()
        self.out: deque[eng.Result] = deque()
        self.submitted = 0
        self.answered = 0
        self.closed = False
        self.failure: list[HarnessError] = []
        self.gone = False
        self.pseudo = False
        self.submitting = threading.Lock()

    def deliver(self, results: Sequence[eng.Result]) -> None:
        self.out.extend(results)
        self.wake()


_Sink = _Waiter | _Stream


class FpgaServerService(fpga_pb2_grpc.FpgaServerServicer):
    def __init__(self, config: FpgaServerConfig, clock: Clock | None = None) -> None:
        if isinstance(config.max_execute_streams, bool) or not isinstance(config.max_execute_streams, int) \
                or config.max_execute_streams < 1:
            raise ValueError(f"fpga_server.max_execute_streams = {config.max_execute_streams!r}: expected a whole "
                             "number, at least 1 (the Execute streams open at once; each holds a worker thread)")
        self.config = config
        self.clock = clock or WallClock()
        self.engine = eng.Engine(self.clock, eng.EngineConfig(
            devices=config.devices, reconfig_mean_s=config.reconfig_mean_s, reconfig_std_s=config.reconfig_std_s,
            reconfig_failure_rate=config.reconfig_failure_rate, blacklist_after=config.blacklist_after,
            seed=config.seed))
        self.tokens: dict[str, tuple[str, str]] = {}  # client -> (group, token)
        self.lock = threading.Lock()
        # Guards the sinks and the count of RunBatch handlers driving the engine; the dispatcher
        # sleeps on it. Sinks: client -> its sinks, a tuple replaced (never mutated) under the
        # condition, so routing reads it without a lock.
        self.cond = threading.Condition(threading.Lock())
        self.sinks: dict[str, tuple[_Sink, ...]] = {}
        self.waiting_handlers = 0
        self._dispatcher_idle = False  # asleep for up to IDLE_LOOK_S: the first driving handler wakes it
        # One Execute stream at a time drives the engine for all of them (the others wait for the
        # results it routes to them, and one of them takes over when it stops): no herd of stream
        # handlers waking at every event.
        self.stream_driver: _Stream | None = None
        self.streams_waiting: set[_Stream] = set()
        self.events: deque[str] = deque(maxlen=EVENTS_KEPT)
        self._events_lock = threading.Lock()
        self.boot_id = uuid.uuid4().hex     # which run answered a GetServer (ServerInfo.boot_id)
        self._stop = threading.Event()
        self._dispatcher = threading.Thread(target=self._dispatch, name="fpga-dispatch", daemon=True)
        # One RunDirect at a time per device (a second waits for the first); different devices run at once.
        self.direct_locks = [threading.Lock() for _ in range(config.devices)]
        self.streams = CallCap(config.max_execute_streams, self._streams_refusal)    # Execute streams open

    # -- driving the engine ---------------------------------------------
    def _advance(self) -> float | None:
        """Hand out what is due, to whoever waits for it; return when the next event is due."""
        # Drained and logged under one lock, so GetServer never reports a device state whose
        # event another thread has taken out of the engine but not yet logged.
        with self._events_lock:
            results, events, nxt = self.engine.poll()
            for ev in events:
                if ev.kind in ("reconfiguration_failed", "blacklisted"):
                    text = f"device {ev.device}: {ev.kind} ({ev.detail})" if ev.detail else f"device {ev.device}: {ev.kind}"
                    self.events.append(text)
                    log.warning("device event", extra={"device": ev.device, "event": ev.kind, "group": ev.group_id})
        if results:
            self._route(results)
        return nxt

    def _route(self, results: Sequence[eng.Result]) -> None:
        """Each result to the sink its task came on (a task put into the engine otherwise has nobody to go to).
        A sink that has ended takes it and nobody reads it."""
        if len(results) == 1:
            tid = results[0].task_id
            if tid.__class__ is _Id:
                tid[1].deliver(results)
            return
        by_sink: dict[_Sink, list[eng.Result]] = {}
        for r in results:
            tid = r.task_id
            if tid.__class__ is _Id:
                rs = by_sink.get(tid[1])
                if rs is None:
                    by_sink[tid[1]] = [r]
                else:
                    rs.append(r)
        for sink, rs in by_sink.items():
            sink.deliver(rs)

    def _kick(self) -> None:
        """New work or a new group state: the next event may be sooner than anyone planned for."""
        with self.cond:
            self.cond.notify_all()
            sinks = list(self.sinks.values())
        for lst in sinks:
            for k in lst:
                k.wake()

    def _one_more_driver(self) -> None:
        """A handler starts driving (called under `cond`): an idle dispatcher resumes its
        safety-net looks. Only then is it woken, so a lone client's calls mostly pay nothing."""
        self.waiting_handlers += 1
        if self._dispatcher_idle:
            self._dispatcher_idle = False
            self.cond.notify_all()

    def _dispatch(self) -> None:
        """Drive the engine when nobody waiting for results does (their results then have no hurry).

        While handlers drive it (RunBatch handlers, the Execute stream owed results), this only
        looks in every DISPATCH_GRACE_S, as a safety net: a handler plans its next look by the
        engine's next event when it last advanced it, and an event that someone else's work
        created sooner than that (and then left) is handed out at most about DISPATCH_GRACE_S late.
        Handlers come and go without telling it, so it never sleeps longer than that.
        """
        while not self._stop.is_set():
            with self.cond:
                nxt = self.engine.next_event_time()
                t = self.clock.now()
                if self.waiting_handlers > 0:
                    if nxt is None or nxt > t - DISPATCH_GRACE_S:
                        self.cond.wait(DISPATCH_GRACE_S)
                        continue
                elif nxt is None:
                    self._dispatcher_idle = True
                    self.cond.wait(IDLE_LOOK_S)
                    self._dispatcher_idle = False
                    continue
                elif nxt > t:
                    self.cond.wait(min(DISPATCH_GRACE_S, nxt - t))
                    continue
            self._advance()

    def _wait(self, w: _Waiter, nxt: float | None, deadline: float | None,
              alive=lambda: True) -> None:  # type: ignore[no-untyped-def]
        """Drive the engine until the waiter has all its results (a RunBatch handler).

        `nxt`: when the engine's next event is due (as its `submit_next` said). Sleeps until
        then, or until its results or new work (`_kick`) wake it; while it waits it advances
        the engine for every client.
        """
        advance = self._advance
        now = self.clock.now
        while w.expect:
            t = now()
            if nxt is not None and nxt <= t:
                nxt = advance()
                continue
            if deadline is not None and time.monotonic() > deadline:
                raise FailedPrecondition("the batch did not finish before the call's deadline")
            if not alive():
                raise FailedPrecondition("the caller went away")
            if self._stop.is_set():
                raise Unavailable("the FPGA-server is stopping")
            _doze(w.bell, 0.5 if nxt is None else min(0.5, nxt - t))
            nxt = advance()

    # -- lifecycle -------------------------------------------------------
    def start(self) -> None:
        self._dispatcher.start()

    def quiesce(self) -> None:
        """Shutting down, before the server stops: the Execute streams and RunBatch calls end (UNAVAILABLE: the
        FPGA-server is stopping), and the dispatcher with them."""
        self._stop.set()
        self._kick()
        with self.cond:
            sinks = [k for lst in self.sinks.values() for k in lst]
        for k in sinks:
            k.wake()

    def stop(self) -> None:
        self.quiesce()        # nothing else to release: no database

    # -- control plane (called by the Orchestrator) ----------------------
    def _part(self, g: eng.GroupInfo) -> fpga_pb2.GroupPart:
        return fpga_pb2.GroupPart(group_id=g.group_id, design=g.design, target=g.target, active=g.size,
                                  min_size=g.min_size, max_size=g.max_size, clients=list(g.clients),
                                  server=self.config.name)

    def GetServer(self, request, context):  # noqa: N802
        control.check(self.config.control_token, context, f"FPGA-server {self.config.name!r}")
        seq, states, groups = self.engine.snapshot()
        devices = [fpga_pb2.DeviceInfo(index=d.index, state=STATE.get("blacklisted" if d.blacklisted else d.state,
                                                                      fpga_pb2.DeviceInfo.STATE_UNSPECIFIED),
                                       design=d.design or "", group_id=d.group_id or "", failures=d.failures)
                   for d in states]
        self._advance()  # log the events of the states just read (and hand out what is due)
        with self._events_lock:
            events = list(self.events)
        return fpga_pb2.ServerInfo(name=self.config.name, devices=devices, groups=[self._part(g) for g in groups],
                                   designs=sorted(design_lib.DESIGNS), reconfiguration_s=self.config.reconfig_mean_s,
                                   events=events, boot_id=self.boot_id, read_seq=seq)

    def _engine_call(self, fn, *args, **kwargs):  # type: ignore[no-untyped-def]
        try:
            out = fn(*args, **kwargs)
        except (eng.EngineError, ValueError) as e:
            raise domain_error(e) from None
        self._kick()
        return out

    def CreateGroupPart(self, request, context):  # noqa: N802
        control.check(self.config.control_token, context, f"FPGA-server {self.config.name!r}")
        if not request.group_id:
            raise InvalidArgument.of("group_id", "required")
        if request.design not in design_lib.DESIGNS:
            raise InvalidArgument.of("design", f"unknown design {request.design!r}; "
                                               f"available: {sorted(design_lib.DESIGNS)}")
        existing = {g.group_id: g for g in self.engine.groups()}
        if request.group_id in existing:  # idempotent for the Orchestrator's retries
            return self._part(existing[request.group_id])
        # Group-level limits are the Orchestrator's; a part may shrink to 0 devices.
        info = self._engine_call(self.engine.create_group, request.group_id, request.design, request.size,
                                 min_size=0, max_size=None)
        return self._part(info)

    def ResizeGroupPart(self, request, context):  # noqa: N802
        control.check(self.config.control_token, context, f"FPGA-server {self.config.name!r}")
        return self._part(self._engine_call(self.engine.resize_group, request.group_id, request.size,
                                            hand_back=request.hand_back))

    def _has(self, group_id: str) -> bool:
        return any(g.group_id == group_id for g in self.engine.groups())

    def DeleteGroupPart(self, request, context):  # noqa: N802
        control.check(self.config.control_token, context, f"FPGA-server {self.config.name!r}")
        if self._has(request.group_id):
            self._engine_call(self.engine.delete_group, request.group_id)  # revokes its clients
        with self.lock:
            for c, (g, _) in list(self.tokens.items()):
                if g == request.group_id:
                    self.tokens.pop(c)
        return fpga_pb2.DeleteGroupPartResponse()

    def AttachClient(self, request, context):  # noqa: N802
        control.check(self.config.control_token, context, f"FPGA-server {self.config.name!r}")
        if not request.token:
            raise InvalidArgument.of("token", "required")
        # Read, attach and record under one hold: two attachments of one client (the Orchestrator's retries)
        # or a DeleteGroupPart in between would otherwise act on a stale read.
        with self.lock:
            known = self.tokens.get(request.client_id)
            if known is None:
                self._engine_call(self.engine.attach_client, request.group_id, request.client_id)
            elif known[0] != request.group_id:
                raise FailedPrecondition(f"client {request.client_id!r} is attached to another group")
            self.tokens[request.client_id] = (request.group_id, request.token)
        return fpga_pb2.ServerAttachResponse()

    def DetachClient(self, request, context):  # noqa: N802
        control.check(self.config.control_token, context, f"FPGA-server {self.config.name!r}")
        with self.lock:
            self.tokens.pop(request.client_id, None)
        try:
            self.engine.detach_client(request.client_id)
        except eng.NotFoundError:
            pass
        self._kick()
        return fpga_pb2.ServerClientResponse()

    def RevokeClient(self, request, context):  # noqa: N802
        control.check(self.config.control_token, context, f"FPGA-server {self.config.name!r}")
        with self.lock:
            self.tokens.pop(request.client_id, None)
        try:
            cancelled = self.engine.revoke_client(request.client_id)
        except eng.NotFoundError:
            cancelled = 0
        self._kick()
        self._advance()  # hand the cancelled tasks' results out now
        return fpga_pb2.ServerClientResponse(cancelled=cancelled)

    def GetMeasurements(self, request, context):  # noqa: N802
        control.check(self.config.control_token, context, f"FPGA-server {self.config.name!r}")
        m = self.engine.measurements()
        return fpga_pb2.ServerMeasurements(
            time=m.time, usable_devices=m.usable, reconfigurations=m.reconfigurations, devices=m.devices,
            reconfiguration_failures=m.reconfiguration_failures,
            groups=[fpga_pb2.GroupCounters(
                group_id=g.group_id, design=g.design, active=g.size, target=g.target, joining=g.joining,
                draining=g.draining, submitted=g.executed + g.waiting + g.running, completed=g.executed,
                queued=g.waiting + g.running, waiting=g.waiting, running=g.running, busy_device_s=g.busy_s,
                failed=g.failed, incarnation=g.incarnation,
                clients=[fpga_pb2.ClientCounters(client_id=c.client_id, completed=c.executed,
                                                 queued=c.waiting + c.running, waiting=c.waiting, running=c.running,
                                                 submitted=c.executed + c.waiting + c.running)
                         for c in g.clients]) for g in m.groups])

    def InjectFault(self, request, context):  # noqa: N802
        control.check(self.config.control_token, context, f"FPGA-server {self.config.name!r}")
        if not self.config.fault_injection:
            raise FailedPrecondition(f"fault injection is off on FPGA-server {self.config.name!r}: start it with "
                                     "fault_injection: true (tests and fault drills only)")
        if request.count < 0:
            raise InvalidArgument.of("count", "reconfigurations to fail: >= 0")
        self._engine_call(self.engine.inject_reconfiguration_failures, request.device, request.count)
        return fpga_pb2.InjectFaultResponse()

    # -- data plane ------------------------------------------------------
    def _authorise(self, batch: fpga_pb2.TaskBatch) -> str:
        client = batch.client_id
        known = self.tokens.get(client)  # one dict read is atomic; writers hold self.lock among themselves
        if known is None:
            raise PermissionDenied(f"client {client!r} is not attached here (or was revoked); "
                                   "attach through the Orchestrator")
        if known[1] != batch.token:
            raise PermissionDenied("token or group does not match the client's attachment")
        group = batch.group_id
        if group and group != known[0]:
            raise PermissionDenied("token or group does not match the client's attachment")
        return client

    @staticmethod
    def _tasks(batch: fpga_pb2.TaskBatch, sink: _Sink) -> list[tuple[Any, Any, str]]:
        """The batch's tasks as engine (task_id, params, kind) triples, known in the engine as `sink`'s (`_Id`)."""
        pb = batch.tasks
        kinds = KIND_TO_ENGINE
        try:
            shared = from_map(batch.shared_params, "shared_params") if batch.shared_params else None
            if len(pb) == 1:  # one task (indexing a repeated field is cheaper than iterating it)
                t = pb[0]
                kind = kinds.get(t.kind)
                if kind is None:
                    raise _bad_kind("tasks[0].kind", t.kind)
                params = t.params
                if not params:
                    return [(_tnew(_Id, (t.id, sink)), shared, kind)]
                params = from_map(params, "tasks[0].params")
                return [(_tnew(_Id, (t.id, sink)), {**shared, **params} if shared else params, kind)]
            tasks = []
            for i, t in enumerate(pb):
                kind = kinds.get(t.kind)
                if kind is None:
                    raise _bad_kind(f"tasks[{i}].kind", t.kind)
                if not t.params:
                    params = shared  # one object for all: the engine validates it once
                elif shared:
                    params = {**shared, **from_map(t.params, f"tasks[{i}].params")}
                else:
                    params = from_map(t.params, f"tasks[{i}].params")
                tasks.append((_tnew(_Id, (t.id, sink)), params, kind))
        except WireError as e:
            raise _bad_wire(e, "tasks") from None
        return tasks

    @staticmethod
    def _stream_tasks(batch: fpga_pb2.TaskBatch, sink: _Stream) -> tuple[
            list[tuple[Any, Any, str]], list[fpga_pb2.Task], list[tuple[fpga_pb2.Task, str]]]:
        """An Execute batch's tasks: the engine's triples, the task each came from, and the tasks that cannot
        go with why. A task is named by its id, never by its place in the batch: the client library forms the
        batches, out of whatever its caller submitted meanwhile, so an index means nothing to the caller."""
        pb = batch.tasks
        shared = None
        if batch.shared_params:
            try:
                shared = from_map(batch.shared_params, "shared_params")
            except WireError as e:
                why = f"{e.field or 'shared_params'}: {e.reason}"   # every task of the batch takes them
                return [], [], [(t, why) for t in pb]
        kinds = KIND_TO_ENGINE
        tasks: list[tuple[Any, Any, str]] = []
        sent: list[fpga_pb2.Task] = []
        bad: list[tuple[fpga_pb2.Task, str]] = []
        for t in pb:
            kind = kinds.get(t.kind)
            if kind is None:
                bad.append((t, f"kind: unknown task kind {t.kind}; one of {choices(fpga_pb2.Task.Kind)}"))
                continue
            if not t.params:
                params = shared
            else:
                try:
                    own = from_map(t.params, "params")
                except WireError as e:
                    bad.append((t, f"{e.field or 'params'}: {e.reason}"))
                    continue
                params = {**shared, **own} if shared else own
            tasks.append((_tnew(_Id, (t.id, sink)), params, kind))
            sent.append(t)
        return tasks, sent, bad

    def _fill(self, r: eng.Result, out: fpga_pb2.TaskResult) -> fpga_pb2.TaskResult:
        """Encode a result into `out` (a message in place: no copy into its batch)."""
        out.id = r.task_id[0]    # the client's id (`_Id`: the engine knows it with its sink)
        out.kind = KIND_TO_WIRE.get(r.kind, fpga_pb2.Task.KIND_RUN)
        if r.error:
            out.error = r.error
        out.queue_time_s = r.started_at - r.submitted_at
        out.device_time_s = r.device_time
        out.device = r.device
        out.server = self.config.name
        v = r.value
        if isinstance(v, dict):
            to_map(v, out.value)
        elif v is not None:
            to_map({"value": v}, out.value)
        return out

    def _result(self, r: eng.Result) -> fpga_pb2.TaskResult:
        return self._fill(r, fpga_pb2.TaskResult())

    def _results(self, results: Sequence[eng.Result]) -> fpga_pb2.ResultBatch:
        out = fpga_pb2.ResultBatch()
        add = out.results.add
        fill = self._fill
        for r in results:
            fill(r, add())
        return out

    def _result_batches(self, results: Sequence[eng.Result]) -> Iterator[fpga_pb2.ResultBatch]:
        """`results` as stream messages of at most RESULT_BATCH_BYTES each (a larger result goes alone): a burst
        of big results in one message outgrew what clients take (gRPC's default is 4 MiB a message)."""
        out = fpga_pb2.ResultBatch()
        size = 0
        fill = self._fill
        for r in results:
            msg = out.results.add()
            fill(r, msg)
            n = msg.ByteSize() + _FIELD_OVERHEAD
            if size + n > RESULT_BATCH_BYTES and size:
                del out.results[-1]
                yield out
                out = fpga_pb2.ResultBatch()
                fill(r, out.results.add())
                size = 0
            size += n
        if size:
            yield out

    def _add_sink(self, client: str, sink: _Sink, handler: bool = False) -> None:
        """Route the client's results to `sink` too; `handler`: a RunBatch handler now drives the engine."""
        with self.cond:
            self.sinks[client] = (*self.sinks.get(client, ()), sink)
            if handler:
                self._one_more_driver()

    def _drop_sink(self, client: str, sink: _Sink, handler: bool = False) -> None:
        with self.cond:
            mine = self.sinks.get(client, ())
            if mine == (sink,):
                del self.sinks[client]
            elif sink in mine:
                self.sinks[client] = tuple(k for k in mine if k is not sink)
            if handler:
                self.waiting_handlers -= 1
            # The dispatcher takes over driving the engine, if anything is left to drive (also after
            # an Execute handler that never drove: its reader may have submitted work as it left).
            # Work submitted from now on comes with a _kick, which waits for this condition.
            if self.waiting_handlers == 0 and self.engine.busy():
                self.cond.notify_all()

    def RunBatch(self, request, context):  # noqa: N802
        client = self._authorise(request)
        w = _Waiter(set())
        tasks = self._tasks(request, w)
        w.expect.update([t[0][0] for t in tasks])
        if len(w.expect) != len(tasks):
            raise InvalidArgument.of("tasks", "task ids must be unique within a batch")
        # This handler drives the engine while it waits (for every client), so the dispatcher is
        # neither needed nor woken: on this path a task costs no thread hand-off.
        self._add_sink(client, w, handler=True)
        try:
            try:
                nxt = self.engine.submit_next(client, tasks)
            except (eng.EngineError, ValueError) as e:
                raise domain_error(e, request) from None
            if any(t[2] is not eng.RUN for t in tasks):
                # An unlock can start other callers' tasks sooner than they planned to look.
                self._kick()
            if context is None:
                self._wait(w, nxt, None)
            else:
                remaining = context.time_remaining()
                self._wait(w, nxt, None if remaining is None else time.monotonic() + remaining, context.is_active)
        finally:
            self._drop_sink(client, w, handler=True)
        return self._results(w.results)

    def _claim_driving(self, st: _Stream) -> bool:
        """Let `st`'s handler drive the engine unless another stream's does (then it waits for a turn)."""
        with self.cond:
            if self.stream_driver is None:
                self.stream_driver = st
                self._one_more_driver()
                self.streams_waiting.discard(st)
                return True
            self.streams_waiting.add(st)
            return False

    def _leave_driving(self, st: _Stream, driving: bool) -> None:
        """`st` is owed nothing (or is ending): hand driving on to a stream that is owed, if any."""
        with self.cond:
            self.streams_waiting.discard(st)
            if driving:
                self.stream_driver = None
                self.waiting_handlers -= 1
            elif self.stream_driver is not None:
                return
            successor = next(iter(self.streams_waiting), None)
            if successor is None and self.waiting_handlers == 0 and self.engine.busy():
                self.cond.notify_all()  # the dispatcher takes over
        if successor is not None:
            successor.wake()  # it claims driving when it wakes

    def _stream_submit(self, client: str, st: _Stream, batch: fpga_pb2.TaskBatch) -> None:
        """One batch from an Execute stream into the engine; the stream's handler is rung to drive it.

        A task that cannot run (bad parameters, an unknown kind, a second LOCK, a stray UNLOCK) is answered
        alone with why; the batch's other tasks run. The client library puts whatever its caller submitted
        meanwhile into one batch: one caller's mistake must not fail the others' tasks (nor a LOCK sent with
        them, which the library would then believe held)."""
        n = len(batch.tasks)
        tasks, sent, bad = self._stream_tasks(batch, st)
        pseudo = False
        with st.submitting:
            if st.gone:
                return  # the handler is done: nobody would answer these
            # Counted before the engine has them: the handler never sees more answered than asked.
            st.submitted += n
            if tasks:
                try:
                    refused = self.engine.submit_each(client, tasks)
                except (eng.EngineError, ValueError) as e:
                    err = domain_error(e)
                    if not isinstance(err, FailedPrecondition):
                        # NotFound (the client was revoked), ...: the stream ends with it.
                        st.submitted -= n
                        raise err from None
                    # The client is detaching: none of the batch runs, and each task says why.
                    bad = [(t, str(err)) for t in batch.tasks]
                else:
                    bad.extend((sent[i], str(e)) for i, e in refused)
                    pseudo = any(t[2] is not eng.RUN for t in tasks)
                    if pseudo:
                        st.pseudo = True
        if bad:
            now = self.clock.now()
            st.deliver([eng.Result(_tnew(_Id, (t.id, st)), client, "", KIND_TO_ENGINE.get(t.kind, eng.RUN), None,
                                   f"task {t.id}: {why}", now, now, now, 0.0, -1) for t, why in bad])
        if pseudo:
            self._kick()  # a lock or unlock can start other callers' tasks sooner than they planned
            return
        if len(bad) == n:
            return
        # New work, maybe due sooner than the driving stream planned to look: its handler (and
        # this stream's, which drives if nobody does) re-plans. Nobody else needs telling.
        st.wake()
        driver = self.stream_driver
        if driver is not None and driver is not st:
            driver.wake()

    def _abandon(self, client: str, st: _Stream) -> None:
        """`st`'s handler is done: its tasks still queued leave the engine and a lock taken on it ends, if it
        ends owing results or having locked (a client that cancelled or lost its connection would otherwise
        have its abandoned tasks run ahead of its new ones, and its lock held with nobody to unlock it)."""
        with st.submitting:
            st.gone = True
        if st.submitted <= st.answered and not st.pseudo:
            return
        dropped = self.engine.abandon(client, lambda tid: tid.__class__ is _Id and tid[1] is st)
        if dropped:
            log.info("stream ended with tasks queued: dropped", extra={"client": client, "tasks": dropped})
        if st.pseudo:
            self._kick()  # a device the lock held went to others' tasks: events nobody planned for

    def _read_stream(self, client: str, st: _Stream, first: fpga_pb2.TaskBatch, requests: Any) -> None:
        try:
            batch = first
            while batch is not None and not st.gone:
                self._stream_submit(client, st, batch)
                batch = next(requests, None)
        except HarnessError as e:
            st.failure.append(e)
        except grpc.RpcError:
            pass
        except Exception as e:  # noqa: BLE001 - the stream must end with a status, never hang waiting for results
            log.exception("a task batch could not be read")
            st.failure.append(HarnessError(f"internal error: a task batch could not be read ({type(e).__name__}); see the service log"))
        finally:
            st.closed = True
            st.wake()

    def _streams_refusal(self, n: int, limit: int) -> ResourceExhausted:
        return ResourceExhausted(
            f"{n} Execute streams are open on FPGA-server {self.config.name!r}, its most "
            f"(max_execute_streams={limit}); close one (the client library opens one per part, for the "
            "life of the client: close clients you no longer use), send with RunBatch, or retry later",
            reason=STREAM_CAP)

    def Execute(self, request_iterator, context):  # noqa: N802
        """Tasks in batches, results as they come, over one stream (the client library's path).

        A reader thread submits what arrives; this handler writes the results and, while the
        stream is owed any, drives the engine itself as a RunBatch handler does (sleeps on its
        bell until the next event, advances the engine for every client): so a lone task costs
        one thread hand-off (reader to handler) and no dispatcher, and results for this client
        are written by the thread that produced them.
        """
        # Counted before the first message is read: waiting for it already holds a worker thread.
        self.streams.take()
        try:
            first = next(request_iterator, None)
            if first is None:
                return
            client = self._authorise(first)
            st = _Stream()
            self._add_sink(client, st)
            try:
                threading.Thread(target=self._read_stream, args=(client, st, first, request_iterator),
                                 name=f"exec-{client}", daemon=True).start()
                yield from self._answer(client, st, context)
            finally:
                self._abandon(client, st)
                self._drop_sink(client, st)
        finally:
            self.streams.give_back()

    def _answer(self, client: str, st: _Stream, context: Any) -> Iterator[fpga_pb2.ResultBatch]:
        """Write `st`'s results as they come, driving the engine while it is owed any (see Execute)."""
        out, bell, advance, now, stopping = st.out, st.bell, self._advance, self.clock.now, self._stop
        driving = waiting = False  # driving the engine / owed results while another stream drives
        try:
            while True:
                bell.acquire(False)  # take a ring: what rings from now on wakes the sleeps below
                if out:
                    got = [out.popleft() for _ in range(len(out))]
                    st.answered += len(got)
                    if (driving or waiting) and st.submitted <= st.answered:
                        self._leave_driving(st, driving)
                        driving = waiting = False
                    yield from self._result_batches(got)
                    continue
                if st.failure:
                    raise st.failure[0]
                if st.closed:  # read first: once it is set, every batch is counted in `submitted`
                    if st.submitted <= st.answered or not context.is_active():
                        break  # all answered, or the client went away (`_abandon` takes its queued tasks out)
                if stopping.is_set():
                    owed = st.submitted - st.answered
                    if owed > 0:
                        # Not a normal end: the client must know that what it still waits for will not come.
                        raise Unavailable(f"the FPGA-server is stopping: {owed} task(s) sent on this stream will "
                                          "not be answered; send them again (to another part of the group, or "
                                          "once this server is back)")
                    break
                if st.submitted > st.answered:
                    if not driving and (not waiting or self.stream_driver is None):
                        driving = self._claim_driving(st)
                        waiting = not driving
                    if driving:
                        nxt = advance()
                        if out:
                            continue
                        t = now()
                        if nxt is not None and nxt <= t:
                            continue
                        bell.acquire(timeout=0.5 if nxt is None else min(0.5, nxt - t))
                    else:
                        bell.acquire(timeout=0.5)  # results, or the driver handing over, ring it
                    continue
                if driving or waiting:
                    self._leave_driving(st, driving)
                    driving = waiting = False
                if not bell.acquire(timeout=1.0) and not context.is_active():
                    break
        finally:
            if driving or waiting:
                self._leave_driving(st, driving)

    def RunDirect(self, request, context):  # noqa: N802
        """One task on one free device, no group, no queues: the baseline of thesis Fig. 3.4.

        A control call (it takes a device out of the pool that groups are sold from). The device is held
        while the caller waits, no longer: a caller that gives up (its deadline, a cancel) or a stopping
        server ends the wait and gives the device back, as does the end of the task."""
        control.check(self.config.control_token, context, f"FPGA-server {self.config.name!r}")
        locks = self.direct_locks
        device = request.device
        if not 0 <= device < len(locks):
            raise InvalidArgument.of("device", f"FPGA-server {self.config.name!r} has no device {device}: "
                                               f"its devices are 0..{len(locks) - 1}")
        design = design_lib.DESIGNS.get(request.design)
        if design is None:
            raise InvalidArgument.of("design", f"unknown design {request.design!r}; available: "
                                               f"{', '.join(sorted(design_lib.DESIGNS))}")
        if request.task.kind not in KIND_TO_ENGINE:
            raise _bad_kind("task.kind", request.task.kind)
        try:
            params = from_map(request.task.params, "task.params")
        except WireError as e:
            raise _bad_wire(e, "task.params") from None
        try:
            value, seconds = design.run(params)
        except ValueError as e:
            fields = [f"task.params.{p}" for p in getattr(e, "params", ())] or ["task.params"]
            raise InvalidArgument(str(e), [FieldViolation(f, str(e)) for f in fields]) from None
        alive = context.is_active if context is not None else _always
        wanted = self._direct_wanted
        lock = locks[device]
        # After a RunDirect on the same device, but not for longer than this caller waits.
        while not lock.acquire(timeout=0.5):
            wanted(alive)
        try:
            # Taken out of the engine's pool for the call: no group's task runs on it meanwhile (a group
            # short of devices gets it when it is given back).
            try:
                reconfigure = self.engine.take_device(device, request.design)
            except eng.PreconditionError:
                raise FailedPrecondition(f"device {device} belongs to a group or is unusable") from None
            try:
                start = self.clock.now()
                if reconfigure:
                    seconds += self.config.reconfig_mean_s
                end = start + seconds
                bell = threading.Lock()
                bell.acquire()
                now = start
                while now < end:  # the device is busy until then (slept on as a RunBatch handler sleeps)
                    wanted(alive)
                    _doze(bell, min(0.5, end - now))
                    now = self.clock.now()
            finally:
                if self.engine.return_device(device):
                    self._kick()  # a group took it: its reconfiguration is an event nobody planned for
        finally:
            lock.release()
        r = eng.Result((request.task.id,), "", "", eng.RUN, value, None, start, start, end, seconds, device)
        return self._result(r)

    def _direct_wanted(self, alive: Any) -> None:
        """Raise if a RunDirect's wait is over before its task: the caller gone, or the server stopping."""
        if self._stop.is_set():
            raise Unavailable("the FPGA-server is stopping")
        if not alive():
            raise FailedPrecondition("the caller went away (its deadline passed, or it cancelled)")


def _always() -> bool:
    return True


def component(config: FpgaServerConfig, clock: Clock | None = None) -> Component:
    svc = FpgaServerService(config, clock)

    def register(server: grpc.Server) -> None:
        fpga_pb2_grpc.add_FpgaServerServicer_to_server(svc, server)

    return Component(name=f"fpga-server:{config.name}", register=register,
                     service_names=["harness.v1.FpgaServer"], start=svc.start, quiesce=svc.quiesce, stop=svc.stop,
                     extra={"server": svc}, max_workers=config.max_execute_streams + _OTHER_WORKERS)
