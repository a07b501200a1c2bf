"""The emulated FPGA-server: an MPC-X-like appliance as a clock-driven state machine.

Thesis §3.2 (FPGA-server, FPGA groups) and §3.3.1 (elasticity); blacklisting
after repeated reconfiguration failures from seed 000 §III-B. No gRPC, no
database; time comes from the injected `services.clock.Clock` (the wall clock
live, a `VirtualClock` in simulations). Nothing sleeps per task: the engine
computes when each task ends and hands its result out when `advance` reaches
that time.

Model
-----
* `devices` devices (default 8). Each is unassigned, reconfiguring, a member
  of one group, or blacklisted; it carries the design it is configured with.
  Reconfiguring takes N(3.78 s, 0.13 s) (thesis §3.4) and fails with
  probability `reconfig_failure_rate` (or when failures are injected); a
  failed device is retried, and after `blacklist_after` consecutive failures it
  is blacklisted, reported in `drain_events()`, and the group takes another
  device if there is one.
* A group (the part of an FPGA group on this server) has a design, a target
  size and min/max limits. Clients attach to a group; each gets its own Rx
  buffer and as many task queues as the server has devices (thesis §3.2.3).
  `submit` moves a client's tasks from its Rx buffer into its queues, each task
  into the currently shortest queue (pending + running; ties to the lowest
  index). A queue with work locks any free device of its group (queues waiting
  for a device are served first come, first served), runs its head task,
  unlocks the device, and queues again if it has more work.
* Lock / unlock pseudo-tasks (thesis §3.2.4): a `LOCK` task pins the client
  to one queue (its later tasks go there); when it reaches the head of that
  queue, the queue keeps the device it obtains, through every task, until the
  `UNLOCK` task runs. One lock per client at a time; results are emitted for
  both pseudo-tasks (`value={"device": index}`).
* Resizing never disturbs a running task. Growing takes an unassigned device
  (one already configured with the design joins at once, otherwise it
  reconfigures and joins when that ends; when no device is free the group
  waits for one to be released). Shrinking first cancels joins in progress,
  then releases idle members, then marks busy members to leave when their
  current task ends (locked ones when unlocked). A task is never lost or run
  twice: tasks live in client queues, not on devices. A part resized to no
  device with `hand_back` (the group has devices on other servers) answers
  its queued tasks, and any sent to it until it grows again, at once with
  `MOVED`; the client library sends them to the group's other parts.
* `revoke_client` cancels the client's queued tasks at once (their results
  carry `error="revoked"`); its running tasks finish on their devices and are
  reported with the same error, without value. `detach_client` stops
  accepting tasks and removes the client when its work is done.

API (all methods thread-safe; times in seconds on the engine's clock)
---------------------------------------------------------------------
    Engine(clock, config=EngineConfig(), designs=DESIGNS)
    submit(client_id, tasks: Sequence[Task]) -> int            # all or nothing
    submit_each(client_id, tasks) -> [(index, error)]           # the good ones; the bad ones left out, with why
    abandon(client_id, owned) -> int                           # drop queued tasks `owned(task_id)`, and their lock
    submit_next(client_id, tasks) -> float | None               # submit, then next_event_time(), one lock
    next_event_time() -> float | None;  busy() -> bool
    advance(until: float | None = None) -> list[Result]          # until defaults to clock.now()
    poll(until=None) -> (results, events, next_event_time)      # advance + drain_events, one lock
    create_group(group_id, design, size, *, min_size=1, max_size=None) -> GroupInfo
    resize_group(group_id, size, *, min_size=None, max_size=None) -> GroupInfo
    apply_sizes(sizes: Mapping[group_id, int]) -> None          # several at once, shrinks first
    delete_group(group_id) -> None
    group_info(group_id) -> GroupInfo;  groups() -> list[GroupInfo]
    attach_client(group_id, client_id) -> None
    detach_client(client_id) -> None;  revoke_client(client_id) -> int (tasks cancelled)
    queue_lengths(client_id) -> list[int]
    schedule(client_id, tasks, times) -> int   # simulations: open-loop arrivals at given times
    device_states() -> list[DeviceState];  device_state(index) -> DeviceState
    measurements() -> ServerMeasurements                        # cumulative counters
    drain_events() -> list[DeviceEvent]
    inject_reconfiguration_failures(device, count) -> None;  reinstate_device(device) -> None
    take_device(device, design) -> bool (reconfigured);  return_device(device) -> bool (a group took it)

Every mutator first processes the events due up to `clock.now()`, so nothing
starts before it was submitted. Errors: `ValueError` (bad argument; an
`ArgumentError` names it, and for a task its index and design parameters),
`NotFoundError`, `AlreadyExistsError`, `CapacityError` (not enough usable
devices), `PreconditionError` (e.g. a detaching client submits).

A task is a `Task(task_id, params, kind)` or any (task_id, params, kind)
triple; task ids are the client's and come back in the `Result`. Consecutive
tasks passing the same params object are validated once (do not mutate it
after submitting). A design's `compute` runs when its task ends, inside
`advance`, on the caller's thread. A group whose `min_size == max_size` is
static for the autoscaler. Live use: call `advance()` when
`next_event_time()` comes (or on every incoming batch) and send the results.
"""

from __future__ import annotations

import heapq
import random
import threading
import uuid
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from itertools import repeat
from operator import attrgetter
from typing import Any, NamedTuple

import numpy as np

from irm_fpga.designs import DESIGNS, Design
from services.clock import Clock

RUN = "run"
LOCK = "lock"
UNLOCK = "unlock"
# The error of a queued task handed back by a part left without devices (the client library resends it).
MOVED = "moved: this part of the group has no devices now; send it to another part"

_DONE = 0
_RECONF = 1
_ARRIVE = 2

# device states
UNASSIGNED = "unassigned"
RECONFIGURING = "reconfiguring"
IDLE = "idle"
BUSY = "busy"
HELD = "held"               # locked by a client's queue, between tasks
BLACKLISTED = "blacklisted"


class EngineError(Exception):
    """Base of the engine's errors (besides ValueError for bad arguments)."""


class NotFoundError(EngineError):
    pass


class AlreadyExistsError(EngineError):
    pass


class CapacityError(EngineError):
    pass


class PreconditionError(EngineError):
    pass


class ArgumentError(ValueError):
    """A bad argument, named so a caller can point at the field of its own request that carried it.

    `field`: the argument ("size", "client_id"; for a task: "params" or "kind"); `index`: the task's position
    in the sequence submitted (None: not about a task); `params`: the design parameters at fault, if known.
    """

    def __init__(self, message: str, field: str, *, index: int | None = None, params: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.field, self.index, self.params = field, index, params


def _bad_params(e: ValueError, i: int, tid: Any) -> ArgumentError:
    return ArgumentError(f"task {i} ({tid!r}): {e}", "params", index=i, params=getattr(e, "params", ()))


class Task(NamedTuple):
    """A task: `params` for the group's design (see `designs`), or a lock/unlock pseudo-task."""

    task_id: Any
    params: Mapping[str, Any] | None = None
    kind: str = RUN


class Result(NamedTuple):
    task_id: Any
    client_id: str
    group_id: str
    kind: str
    value: Any
    error: str | None
    submitted_at: float
    started_at: float
    finished_at: float
    device_time: float
    device: int

    @property
    def queue_time(self) -> float:
        return self.started_at - self.submitted_at

    @property
    def latency(self) -> float:
        return self.finished_at - self.submitted_at


@dataclass(frozen=True)
class EngineConfig:
    devices: int = 8
    reconfig_mean_s: float = 3.78
    reconfig_std_s: float = 0.13
    reconfig_failure_rate: float = 0.0
    blacklist_after: int = 3
    seed: int = 0

    def __post_init__(self) -> None:
        if not 1 <= self.devices <= 1024:
            raise ValueError(f"devices must be in [1, 1024], got {self.devices}")
        if self.reconfig_mean_s < 0 or self.reconfig_std_s < 0:
            raise ValueError("reconfiguration time and its deviation must be >= 0")
        if not 0.0 <= self.reconfig_failure_rate <= 1.0:
            raise ValueError(f"reconfig_failure_rate must be in [0, 1], got {self.reconfig_failure_rate}")
        if self.blacklist_after < 1:
            raise ValueError(f"blacklist_after must be >= 1, got {self.blacklist_after}")


class DeviceState(NamedTuple):
    index: int
    state: str                  # unassigned | reconfiguring | idle | busy | held | blacklisted
    design: str | None          # configured design (None: unconfigured or failed)
    group_id: str | None        # member of, or reconfiguring for
    healthy: bool               # False after a failed reconfiguration, until one succeeds
    blacklisted: bool
    draining: bool              # leaves its group when its task ends / it is unlocked
    locked_by: str | None       # client holding it through a lock pseudo-task
    task_id: Any
    failures: int
    consecutive_failures: int
    reconfigurations: int
    busy_s: float


class DeviceEvent(NamedTuple):
    time: float
    device: int
    kind: str                   # reconfiguring | reconfigured | reconfiguration_failed | blacklisted | joined | left | reinstated
    group_id: str | None
    detail: str = ""


class GroupInfo(NamedTuple):
    group_id: str
    design: str
    target: int
    size: int                   # members serving (not leaving)
    joining: int                # devices reconfiguring for the group
    draining: int               # members leaving when their task ends
    min_size: int
    max_size: int
    clients: tuple[str, ...]
    waiting: int
    running: int


class ClientMeasurement(NamedTuple):
    client_id: str
    executed: int               # cumulative tasks finished
    waiting: int                # tasks queued, not started
    running: int


class GroupMeasurement(NamedTuple):
    group_id: str
    design: str
    size: int
    target: int
    joining: int
    draining: int
    min_size: int
    max_size: int
    executed: int               # cumulative
    busy_s: float               # cumulative device-seconds of finished tasks
    waiting: int
    running: int
    clients: tuple[ClientMeasurement, ...]
    failed: int = 0             # cumulative: those of `executed` that ended in an error (revoked, compute failed)
    incarnation: str = ""       # this group's making on this server: counters restart when it changes


class ServerMeasurements(NamedTuple):
    time: float
    devices: int
    usable: int                 # not blacklisted
    reconfigurations: int       # cumulative, finished (successful or not)
    reconfiguration_failures: int
    groups: tuple[GroupMeasurement, ...]


# -- internal state ---------------------------------------------------------------------------------

class _Device:
    __slots__ = ("index", "design", "group", "state", "task", "queue", "start", "draining", "locked_by",
                 "joining_for", "reconfig_design", "healthy", "failures", "consecutive", "reconfigurations",
                 "busy_s", "forced_failures")

    def __init__(self, index: int) -> None:
        self.index = index
        self.design: str | None = None
        self.group: _Group | None = None
        self.state = UNASSIGNED
        self.task: tuple | None = None
        self.queue: _Queue | None = None
        self.start = 0.0
        self.draining = False
        self.locked_by: _Queue | None = None
        self.joining_for: _Group | None = None
        self.reconfig_design: str | None = None
        self.healthy = True
        self.failures = 0
        self.consecutive = 0
        self.reconfigurations = 0
        self.busy_s = 0.0
        self.forced_failures = 0


_BY_N = attrgetter("n")
_UNSET = object()
_tnew = tuple.__new__
_push = heapq.heappush


class _Queue:
    __slots__ = ("client", "index", "tasks", "n", "dev", "lock", "waiting")

    def __init__(self, client: _Client, index: int) -> None:
        self.client = client
        self.index = index
        self.tasks: deque[tuple] = deque()
        self.n = 0                      # queued + running
        self.dev: _Device | None = None     # device running its task or held by its lock
        self.lock: _Device | None = None    # device held through a lock pseudo-task
        self.waiting = False            # in the group's line for a device


class _Client:
    __slots__ = ("id", "group", "queues", "pinned", "alive", "detaching", "outstanding", "executed", "lock_pending",
                 "arrivals", "armed", "lock_rec")

    def __init__(self, client_id: str, group: _Group, queues: int) -> None:
        self.id = client_id
        self.group = group
        self.queues = [_Queue(self, i) for i in range(queues)]
        self.pinned: _Queue | None = None   # queue chosen by an outstanding LOCK
        self.alive = True
        self.detaching = False
        self.outstanding = 0
        self.executed = 0
        self.lock_pending = False       # a LOCK submitted and its UNLOCK not yet submitted
        self.arrivals: deque[tuple] = deque()   # scheduled arrivals (simulations), in time order
        self.armed = False              # an arrival event for this client is in the heap
        # The LOCK or UNLOCK record that last changed the client's lock while one is pending or held: whoever sent
        # it answers for the lock (`abandon`), since only they would ever send the UNLOCK that ends it.
        self.lock_rec: tuple | None = None


@dataclass(eq=False)
class _Group:
    id: str
    design: Design
    target: int
    min_size: int
    max_size: int
    members: set = field(default_factory=set)
    joining: set = field(default_factory=set)
    free: list = field(default_factory=list)
    line: deque = field(default_factory=deque)
    clients: dict = field(default_factory=dict)
    executed: int = 0
    failed: int = 0
    busy_s: float = 0.0
    # A deleted and re-made group (or a restarted server's) restarts its counters from 0: readers that
    # difference them must tell the new group from the old one, whatever its counters have reached since.
    incarnation: str = field(default_factory=lambda: uuid.uuid4().hex[:16])
    deleted: bool = False
    hands_back: bool = False    # cut to nothing while the group has devices elsewhere (see resize_group)

    def active(self) -> int:
        return sum(1 for d in self.members if not d.draining)


class Engine:
    def __init__(self, clock: Clock, config: EngineConfig | None = None,
                 designs: Mapping[str, Design] | None = None) -> None:
        self.clock = clock
        self.config = config or EngineConfig()
        self.designs = dict(DESIGNS if designs is None else designs)
        self._lock = threading.RLock()
        self._rng = random.Random(self.config.seed)
        self._devices = [_Device(i) for i in range(self.config.devices)]
        self._pool: list[_Device] = list(self._devices)     # unassigned, usable
        self._groups: dict[str, _Group] = {}
        self._clients: dict[str, _Client] = {}
        self._wanting: list[_Group] = []                     # groups short of devices, first come first served
        self._heap: list[tuple] = []
        self._seq = 0
        self._now = float(clock.now())
        self._until = self._now
        self._ready: list[Result] = []
        self._events: list[DeviceEvent] = []
        self._reconfigs = 0
        self._reconfig_failures = 0
        self._snapshots = 0

    # -- time ---------------------------------------------------------------------------------------

    def next_event_time(self) -> float | None:
        """When the next internal event (task end, reconfiguration end) is due; `now` if results wait."""
        with self._lock:
            if self._ready:
                return self._now
            return self._heap[0][0] if self._heap else None

    def busy(self) -> bool:
        """Whether any event is planned or any result waits to be handed out (a lock-free glance)."""
        return bool(self._heap or self._ready)

    def advance(self, until: float | None = None) -> list[Result]:
        """Process every event due at or before `until` (default: the clock's now); return finished results."""
        with self._lock:
            self._process(self.clock.now() if until is None else until)
            out = self._ready
            self._ready = []
            return out

    def poll(self, until: float | None = None) -> tuple[Sequence[Result], Sequence[DeviceEvent], float | None]:
        """`advance`, `drain_events` and `next_event_time` under one lock acquisition (a live server's loop).

        Returns (finished results, device events, when the next event is due or None).
        """
        with self._lock:
            self._process(self.clock.now() if until is None else until)
            out: Sequence[Result] = self._ready
            if out:
                self._ready = []
            else:
                out = ()
            ev: Sequence[DeviceEvent] = self._events
            if ev:
                self._events = []
            else:
                ev = ()
            return out, ev, (self._heap[0][0] if self._heap else None)

    def _sync(self) -> float:
        self._process(self.clock.now())
        return self._now

    def _process(self, until: float) -> None:
        self._until = until
        heap = self._heap
        pop = heapq.heappop
        done = self._done
        while heap and heap[0][0] <= until:
            t, _, kind, obj = pop(heap)
            self._now = t
            if kind == _DONE:
                done(obj, t)
            elif kind == _ARRIVE:
                self._arrive(obj, t)
            else:
                self._reconf_done(obj, t)
        if until > self._now:
            self._now = until

    # -- tasks --------------------------------------------------------------------------------------

    def submit(self, client_id: str, tasks: Sequence[Task]) -> int:
        """Queue `tasks` for `client_id` now: validated first, all accepted or none."""
        with self._lock:
            c = self._accepting(client_id)
            t = self._sync()
            if len(tasks) == 1:
                tid, p, kind = tasks[0]
                if kind == RUN:
                    self._submit_one(c, tid, p, t)
                    if c.group.hands_back:
                        self._hand_back(c.group)
                    return 1
            recs = self._prepare(c, tasks, t, None)
            self._enqueue(c, recs, t)
            if c.group.hands_back:       # sent to a part cut to nothing before the client learnt of it
                self._hand_back(c.group)
            return len(recs)

    def submit_next(self, client_id: str, tasks: Sequence[Task]) -> float | None:
        """`submit`, then `next_event_time()`, under one lock acquisition (a caller about to wait for results)."""
        with self._lock:
            self.submit(client_id, tasks)
            if self._ready:
                return self._now
            return self._heap[0][0] if self._heap else None

    def submit_each(self, client_id: str, tasks: Sequence[Task]) -> list[tuple[int, Exception]]:
        """`submit`, except that a bad task (bad parameters, a second LOCK, a stray UNLOCK) is left out and the
        others are queued, in order: returns each bad task's (index, error), the error's message not naming the
        index (whoever formed the batch may not be whoever sent the task). Errors about the client itself (not
        attached, detaching) still raise, nothing queued."""
        with self._lock:
            c = self._accepting(client_id)
            t = self._sync()
            bad: list[tuple[int, Exception]] = []
            if len(tasks) == 1 and tasks[0][2] == RUN:
                tid, p, _ = tasks[0]
                self._submit_one(c, tid, p, t, bad)
            else:
                recs = self._prepare(c, tasks, t, None, bad=bad)
                if recs:
                    self._enqueue(c, recs, t)
            if c.group.hands_back:
                self._hand_back(c.group)
            return bad

    def abandon(self, client_id: str, owned: Any) -> int:
        """Whoever sent some of the client's tasks went away (an Execute stream that broke): drop its tasks still
        queued (those whose id `owned(task_id)` is true), unanswered, and end the client's lock if its LOCK or
        UNLOCK was theirs (nobody else would ever unlock it). Running tasks finish. Returns how many were dropped;
        an unknown client (revoked, detached) is 0."""
        with self._lock:
            t = self._sync()
            c = self._clients.get(client_id)
            if c is None:
                return 0
            dropped = 0
            for q in c.queues:
                if q.tasks and any(owned(rec[0]) for rec in q.tasks):
                    keep = deque(rec for rec in q.tasks if not owned(rec[0]))
                    n = len(q.tasks) - len(keep)
                    q.tasks = keep
                    q.n -= n
                    c.outstanding -= n
                    dropped += n
            rec = c.lock_rec
            if rec is not None and owned(rec[0]):
                self._end_lock(c, t)
            self._check_detached(c)
            return dropped

    def _end_lock(self, c: _Client, t: float) -> None:
        """The client's lock ends now, as its UNLOCK would end it (hold the lock): a held device goes back to the
        group (one running a task stays with it until the task ends); tasks still pinned behind it queue for
        any device."""
        c.lock_rec = None
        c.pinned, c.lock_pending = None, False
        g = c.group
        for q in c.queues:
            dev = q.lock
            if dev is None:
                continue
            q.lock = None
            dev.locked_by = None
            if dev.task is not None:
                continue        # `_done` passes it on as after any task of an unlocked queue
            q.dev = None
            if q.tasks and not q.waiting:
                q.waiting = True
                g.line.append(q)
            self._run_device(dev, t)

    def _submit_one(self, c: _Client, tid: Any, p: Mapping[str, Any] | None, t: float,
                    bad: list[tuple[int, Exception]] | None = None) -> None:
        """One run task (the latency-bound case, thesis Fig. 3.4): what `_prepare` + `_enqueue` do, inline.

        Same rules: validated by the design, into the client's pinned queue (a lock is pending or
        held) or else its shortest queue, where `_place` locks a free device of the group and
        starts it at once, or lines the queue up for one. A bad task raises, or with `bad` is recorded
        there as `_prepare` does.
        """
        try:
            inputs, dt = c.group.design.prepare(p if p is not None else {})
        except ValueError as e:
            if bad is None:
                raise _bad_params(e, 0, tid) from None
            bad.append((0, ArgumentError(str(e), "params", index=0, params=getattr(e, "params", ()))))
            return
        c.outstanding += 1
        q = c.pinned
        self._place(c, q if q is not None else min(c.queues, key=_BY_N), (tid, RUN, inputs, dt, t), t)

    def schedule(self, client_id: str, tasks: Sequence[Task], times: Sequence[float]) -> int:
        """Open-loop arrivals (simulations): task i reaches the client's Rx buffer at `times[i]`.

        Times must be non-decreasing and not before now or the client's last scheduled arrival;
        only `run` tasks. From its arrival on, a task follows exactly the path of `submit`.
        """
        with self._lock:
            c = self._accepting(client_id)
            now = self._sync()
            if len(times) != len(tasks):
                raise ValueError(f"{len(tasks)} tasks but {len(times)} arrival times")
            if not tasks:
                return 0
            last = c.arrivals[-1][4] if c.arrivals else now
            arr = np.asarray(times, dtype=np.float64)
            if arr.ndim != 1 or not np.isfinite(arr).all():
                raise ValueError("arrival times must be a flat sequence of finite numbers")
            if arr[0] < last or (arr.size > 1 and (np.diff(arr) < 0).any()):
                raise ValueError(f"arrival times must be non-decreasing and not before {last}")
            recs = self._prepare(c, tasks, None, arr.tolist(), run_only=True)
            c.arrivals.extend(recs)
            c.outstanding += len(recs)
            if not c.armed:
                c.armed = True
                self._seq += 1
                heapq.heappush(self._heap, (recs[0][4], self._seq, _ARRIVE, c))
            return len(recs)

    def _accepting(self, client_id: str) -> _Client:
        c = self._clients.get(client_id)
        if c is None:
            raise NotFoundError(f"client {client_id!r} is not attached to any group")
        if c.detaching:
            raise PreconditionError(f"client {client_id!r} is detaching; no new tasks")
        return c

    def _prepare(self, c: _Client, tasks: Sequence[Task], t: float | None,
                 times: Sequence[float] | None, run_only: bool = False,
                 bad: list[tuple[int, Exception]] | None = None) -> list[tuple]:
        """Validate tasks into internal records (task_id, kind, inputs, device_s, submitted_at).

        Consecutive tasks sharing one params object are validated once. A bad task raises (its index and id in
        the message), or with `bad` is left out and recorded there as (index, error without that prefix).
        """
        prepare = c.group.design.prepare
        recs: list[tuple] = []
        append = recs.append
        pending = c.lock_pending
        last_params: Any = _UNSET
        inputs: Any = None
        dt = 0.0
        for i, (task, at) in enumerate(zip(tasks, repeat(t) if times is None else times, strict=False)):
            tid, p, kind = task
            if kind == RUN:
                if p is not last_params:
                    try:
                        inputs, dt = prepare(p if p is not None else {})
                    except ValueError as e:
                        if bad is None:
                            raise _bad_params(e, i, tid) from None
                        # Not remembered as validated: the next task with these params is refused too.
                        bad.append((i, ArgumentError(str(e), "params", index=i, params=getattr(e, "params", ()))))
                        last_params = _UNSET
                        continue
                    last_params = p
                append((tid, RUN, inputs, dt, at))
            elif run_only:
                raise ArgumentError(f"task {i} ({tid!r}): only run tasks can be scheduled; submit lock/unlock",
                                    "kind", index=i)
            elif kind == LOCK:
                if pending:
                    why = f"client {c.id!r} already holds or awaits a lock; unlock first"
                    if bad is None:
                        raise PreconditionError(f"task {i} ({tid!r}): {why}")
                    bad.append((i, PreconditionError(why)))
                    continue
                pending = True
                append((tid, LOCK, None, 0.0, at))
            elif kind == UNLOCK:
                if not pending:
                    if bad is None:
                        raise PreconditionError(f"task {i} ({tid!r}): unlock without a lock")
                    bad.append((i, PreconditionError("unlock without a lock")))
                    continue
                pending = False
                append((tid, UNLOCK, None, 0.0, at))
            else:
                why = f"unknown kind {kind!r}; expected {RUN!r}, {LOCK!r} or {UNLOCK!r}"
                if bad is None:
                    raise ArgumentError(f"task {i} ({tid!r}): {why}", "kind", index=i)
                bad.append((i, ArgumentError(why, "kind", index=i)))
        return recs

    def _arrive(self, c: _Client, t: float) -> None:
        """Arrivals due at t enter the client's queues; so do later ones that come before any other event."""
        arr = c.arrivals
        place = self._place
        heap = self._heap
        until = self._until
        queues = c.queues
        while arr:
            at = arr[0][4]
            if at > t:
                if at > until or (heap and heap[0][0] <= at):
                    break
                t = self._now = at
            rec = arr.popleft()
            place(c, c.pinned or min(queues, key=_BY_N), rec, t)
        if c.group.hands_back:      # as `submit`: nothing would run them on a part cut to nothing
            self._hand_back(c.group)
        if arr:
            self._seq += 1
            heapq.heappush(heap, (arr[0][4], self._seq, _ARRIVE, c))
        else:
            c.armed = False

    def _enqueue(self, c: _Client, recs: list[tuple], t: float) -> None:
        queues = c.queues
        heap = None
        c.outstanding += len(recs)
        place = self._place
        many = len(recs) > 8
        for rec in recs:
            kind = rec[1]
            q = c.pinned
            if q is None:
                if many:
                    if heap is None:
                        heap = [(x.n, x.index) for x in queues]
                        heapq.heapify(heap)
                    n, i = heap[0]
                    heapq.heapreplace(heap, (n + 1, i))
                    q = queues[i]
                else:
                    q = min(queues, key=_BY_N)
            if kind is not RUN:
                heap = None     # pinning changes which queue lengths move
                c.lock_rec = rec
                if kind is LOCK:
                    c.pinned = q
                    c.lock_pending = True
                else:
                    c.pinned = None
                    c.lock_pending = False
            place(c, q, rec, t)

    def _place(self, c: _Client, q: _Queue, rec: tuple, t: float) -> None:
        """A task enters queue q; if the queue was idle it locks a free device or waits for one."""
        q.tasks.append(rec)
        q.n += 1
        dev = q.dev
        if dev is None:
            if not q.waiting:
                g = c.group
                if g.free:
                    dev = g.free.pop()
                    if not self._start(dev, q, t):
                        self._run_device(dev, t)
                else:
                    q.waiting = True
                    g.line.append(q)
        elif dev.task is None and q.lock is dev:
            # idle device held by this queue's lock: run at once
            if not self._start(dev, q, t):
                self._run_device(dev, t)

    def _start(self, dev: _Device, q: _Queue, t: float) -> bool:
        """Run q's head on dev. Returns False if dev was released (an UNLOCK ran), True otherwise."""
        tasks = q.tasks
        c = q.client
        dev.queue = q
        while tasks:
            rec = tasks[0]
            kind = rec[1]
            if kind is RUN:
                tasks.popleft()
                dev.task = rec
                dev.queue = q
                dev.start = t
                dev.state = BUSY
                q.dev = dev
                self._seq += 1
                heapq.heappush(self._heap, (t + rec[3], self._seq, _DONE, dev))
                return True
            tasks.popleft()
            q.n -= 1
            c.outstanding -= 1
            g = c.group
            if kind is LOCK:
                q.lock = dev
                q.dev = dev
                dev.locked_by = q
                dev.state = HELD
                self._ready.append(Result(rec[0], c.id, g.id, LOCK, {"device": dev.index}, None,
                                          rec[4], t, t, 0.0, dev.index))
                continue
            # UNLOCK
            q.lock = None
            q.dev = None
            dev.locked_by = None
            if c.lock_rec is rec:
                c.lock_rec = None
            self._ready.append(Result(rec[0], c.id, g.id, UNLOCK, {"device": dev.index}, None,
                                      rec[4], t, t, 0.0, dev.index))
            if tasks and g.hands_back:      # what queued behind the lock goes to the group's other parts
                self._hand_back(g)
            elif tasks:
                q.waiting = True
                g.line.append(q)
            self._check_detached(c)
            return False
        # nothing left: only a held device stays with the queue
        if q.lock is dev:
            dev.state = HELD
            self._check_detached(c)
            return True
        q.dev = None
        return False

    def _run_device(self, dev: _Device, t: float) -> None:
        """`dev` is available in its group: give it to the first queue waiting, or park it."""
        while True:
            g = dev.group
            if dev.draining or g is None or g.deleted:
                self._leave(dev, t)
                return
            line = g.line
            q = None
            while line:
                x = line.popleft()
                x.waiting = False
                if x.client.alive and x.tasks and x.dev is None:
                    q = x
                    break
            if q is None:
                dev.state = IDLE
                dev.queue = None
                g.free.append(dev)
                return
            if self._start(dev, q, t):
                return

    def _done(self, dev: _Device, t: float) -> None:
        rec = dev.task
        q = dev.queue
        c = q.client
        g = dev.group
        dt = rec[3]
        dev.busy_s += dt
        g.busy_s += dt
        g.executed += 1
        q.n -= 1
        c.outstanding -= 1
        c.executed += 1
        value = error = None
        if not c.alive:
            error = "revoked"
        elif rec[2] is not None:
            try:
                value = g.design.compute(rec[2])
            except Exception as e:  # a design bug must not stop the server
                error = f"compute failed: {type(e).__name__}: {e}"
        if error is not None:
            g.failed += 1
        self._ready.append(_tnew(Result, (rec[0], c.id, g.id, RUN, value, error, rec[4], dev.start, t, dt,
                                          dev.index)))
        tasks = q.tasks
        if q.lock is None and not dev.draining:
            # The queue unlocks the device; it goes to the first queue waiting for one (this queue
            # again, at once, if nobody waits and it has more work).
            line = g.line
            nq = None
            q.dev = None
            if tasks and c.alive:
                if line:
                    q.waiting = True
                    line.append(q)
                else:
                    nq = q
            while nq is None and line:
                x = line.popleft()
                x.waiting = False
                if x.tasks and x.dev is None and x.client.alive:
                    nq = x
            if nq is None:
                dev.task = None
                dev.queue = None
                dev.state = IDLE
                g.free.append(dev)
            else:
                nxt = nq.tasks[0]
                if nxt[1] is RUN:
                    nq.tasks.popleft()
                    dev.task = nxt
                    dev.queue = nq
                    dev.start = t
                    nq.dev = dev
                    self._seq += 1
                    _push(self._heap, (t + nxt[3], self._seq, _DONE, dev))
                else:
                    dev.task = None
                    if not self._start(dev, nq, t):
                        self._run_device(dev, t)
            if c.detaching:
                self._check_detached(c)
            return
        if q.lock is None:     # draining
            dev.task = None
            q.dev = None
            if tasks and c.alive:
                q.waiting = True
                g.line.append(q)
            if c.detaching:
                self._check_detached(c)
            self._run_device(dev, t)
            return
        dev.task = None
        if q.lock is dev:
            if tasks:
                if not self._start(dev, q, t):
                    self._run_device(dev, t)
            else:
                dev.state = HELD
                self._check_detached(c)

    # -- clients ------------------------------------------------------------------------------------

    def attach_client(self, group_id: str, client_id: str) -> None:
        with self._lock:
            self._sync()
            g = self._group(group_id)
            if not client_id or not isinstance(client_id, str):
                raise ArgumentError("client_id must be a non-empty string", "client_id")
            if client_id in self._clients:
                raise AlreadyExistsError(f"client {client_id!r} is already attached "
                                         f"to group {self._clients[client_id].group.id!r}")
            c = _Client(client_id, g, self.config.devices)
            self._clients[client_id] = c
            g.clients[client_id] = c

    def detach_client(self, client_id: str) -> None:
        """Stop accepting tasks; the client goes once its queued and running tasks are done."""
        with self._lock:
            self._sync()
            c = self._client(client_id)
            c.detaching = True
            self._check_detached(c)

    def revoke_client(self, client_id: str) -> int:
        """Cut the client off now. Returns how many queued tasks were cancelled."""
        with self._lock:
            t = self._sync()
            c = self._client(client_id)
            g = c.group
            cancelled = 0
            c.alive = False
            while c.arrivals:
                rec = c.arrivals.popleft()
                c.outstanding -= 1
                cancelled += 1
                self._ready.append(Result(rec[0], c.id, g.id, rec[1], None, "revoked", rec[4], t, t, 0.0, -1))
            for q in c.queues:
                while q.tasks:
                    rec = q.tasks.popleft()
                    q.n -= 1
                    c.outstanding -= 1
                    cancelled += 1
                    self._ready.append(Result(rec[0], c.id, g.id, rec[1], None, "revoked", rec[4], t, t, 0.0, -1))
                dev = q.lock
                if dev is not None:
                    q.lock = None
                    dev.locked_by = None
                    if dev.task is None:
                        q.dev = None
                        self._run_device(dev, t)
            self._remove_client(c)
            return cancelled

    def queue_lengths(self, client_id: str) -> list[int]:
        """Tasks in each of the client's queues, the running one included."""
        with self._lock:
            self._sync()
            return [q.n for q in self._client(client_id).queues]

    def _check_detached(self, c: _Client) -> None:
        if c.detaching and c.outstanding == 0 and c.alive:
            c.alive = False
            for q in c.queues:
                dev = q.lock
                if dev is not None:
                    q.lock = None
                    q.dev = None
                    dev.locked_by = None
                    if dev.task is None:
                        self._run_device(dev, self._now)
            self._remove_client(c)

    def _remove_client(self, c: _Client) -> None:
        if self._clients.get(c.id) is c:
            del self._clients[c.id]
        c.group.clients.pop(c.id, None)

    # -- groups -------------------------------------------------------------------------------------

    def create_group(self, group_id: str, design: str, size: int, *, min_size: int = 1,
                     max_size: int | None = None) -> GroupInfo:
        with self._lock:
            self._sync()
            if not group_id or not isinstance(group_id, str):
                raise ArgumentError("group_id must be a non-empty string", "group_id")
            if group_id in self._groups:
                raise AlreadyExistsError(f"group {group_id!r} already exists")
            if design not in self.designs:
                raise ArgumentError(f"unknown design {design!r}; known: {', '.join(sorted(self.designs))}", "design")
            mx = self.config.devices if max_size is None else max_size
            self._check_limits(size, min_size, mx)
            self._check_capacity(size)
            g = _Group(group_id, self.designs[design], 0, min_size, mx)
            self._groups[group_id] = g
            self._set_target(g, size)
            return self._info(g)

    def resize_group(self, group_id: str, size: int, *, min_size: int | None = None,
                     max_size: int | None = None, hand_back: bool = False) -> GroupInfo:
        """`hand_back` (with size 0): the group has devices elsewhere, so its queued tasks, and any sent here
        until it grows again, are answered at once with `MOVED`; without it they wait here for devices."""
        with self._lock:
            self._sync()
            g = self._group(group_id)
            mn = g.min_size if min_size is None else min_size
            mx = g.max_size if max_size is None else max_size
            self._check_limits(size, mn, mx)
            self._check_capacity(size - g.target)
            g.min_size, g.max_size = mn, mx
            self._set_target(g, size)
            g.hands_back = hand_back and size == 0
            if g.hands_back:
                self._hand_back(g)
            return self._info(g)

    def apply_sizes(self, sizes: Mapping[str, int]) -> None:
        """Set several groups' sizes at once (an autoscaler decision): shrinks first, then grows."""
        with self._lock:
            self._sync()
            gs = {gid: self._group(gid) for gid in sizes}
            for gid, n in sizes.items():
                g = gs[gid]
                self._check_limits(n, g.min_size, g.max_size)
            self._check_capacity(sum(n - gs[gid].target for gid, n in sizes.items()))
            for gid, n in sorted(sizes.items(), key=lambda kv: kv[1] - gs[kv[0]].target):
                self._set_target(gs[gid], n)
                if n:
                    gs[gid].hands_back = False

    def _hand_back(self, g: _Group) -> None:
        """A part left without devices answers its queued tasks at once with `MOVED` (hold the lock).

        Nothing would ever run them here: the client library sends them again to the group's other parts.
        Running tasks finish where they are.
        """
        t = self._now
        for c in list(g.clients.values()):
            for q in c.queues:
                if q.lock is not None:
                    continue            # a locked queue keeps its device until it unlocks
                while q.tasks:
                    rec = q.tasks.popleft()
                    q.n -= 1
                    c.outstanding -= 1
                    if rec[1] is LOCK and c.pinned is q:      # the lock it asked for is asked elsewhere now
                        c.pinned, c.lock_pending = None, False
                        c.lock_rec = None
                    self._ready.append(Result(rec[0], c.id, g.id, rec[1], None, MOVED, rec[4], t, t, 0.0, -1))

    def delete_group(self, group_id: str) -> None:
        """Revoke every client of the group and release its devices (busy ones when their task ends)."""
        with self._lock:
            self._sync()
            g = self._group(group_id)
            for cid in list(g.clients):
                self.revoke_client(cid)
            self._set_target(g, 0)
            g.deleted = True
            del self._groups[group_id]
            if g in self._wanting:
                self._wanting.remove(g)

    def group_info(self, group_id: str) -> GroupInfo:
        with self._lock:
            self._sync()
            return self._info(self._group(group_id))

    def groups(self) -> list[GroupInfo]:
        with self._lock:
            self._sync()
            return [self._info(g) for g in self._groups.values()]

    def snapshot(self) -> tuple[int, list[DeviceState], list[GroupInfo]]:
        """The devices and groups read at one instant, and that read's place among this engine's snapshots.

        One lock for both, and the number taken under it: of two snapshots, the one with the larger number
        saw the later state, however late its answer reaches whoever asked (concurrent readers are answered
        in any order).
        """
        with self._lock:
            self._sync()
            self._snapshots += 1
            return (self._snapshots, [self._state(d) for d in self._devices],
                    [self._info(g) for g in self._groups.values()])

    def _check_limits(self, size: int, mn: int, mx: int) -> None:
        for name, v in (("size", size), ("min_size", mn), ("max_size", mx)):
            if isinstance(v, bool) or not isinstance(v, int):
                raise ArgumentError(f"{name} must be an integer, got {v!r}", name)
        if not 0 <= mn <= mx <= self.config.devices:
            raise ArgumentError(f"need 0 <= min_size <= max_size <= {self.config.devices}, got min_size={mn}, "
                                f"max_size={mx}", "min_size" if mn < 0 else "max_size")
        if not mn <= size <= mx:
            raise ArgumentError(f"size {size} is outside [min_size={mn}, max_size={mx}]", "size")

    def _check_capacity(self, extra: int) -> None:
        if extra <= 0:
            return
        usable = sum(1 for d in self._devices if d.state != BLACKLISTED)
        committed = sum(g.target for g in self._groups.values())
        if committed + extra > usable:
            raise CapacityError(f"{extra} more device(s) needed, {usable - committed} of {usable} usable "
                                f"devices are not committed to groups")

    def _set_target(self, g: _Group, size: int) -> None:
        t = self._now
        g.target = size
        have = g.active() + len(g.joining)
        excess = have - size
        if excess > 0:
            # 1. cancel joins in progress (latest to finish first)
            for dev in sorted(g.joining, key=lambda d: (-self._reconf_end(d), d.index)):
                if excess == 0:
                    break
                g.joining.discard(dev)
                dev.joining_for = None
                excess -= 1
            # 2. idle members
            while excess and g.free:
                dev = g.free.pop()
                self._leave(dev, t, allocate=False)
                excess -= 1
            # 3. busy members, earliest to finish first; 4. held (locked) ones
            busy = [d for d in g.members if not d.draining]
            busy.sort(key=lambda d: (d.locked_by is not None, d.start + d.task[3] if d.task else t, d.index))
            for dev in busy[:excess]:
                dev.draining = True
            if g in self._wanting:
                self._wanting.remove(g)
            self._allocate()
        elif excess < 0:
            # members still finishing a task before leaving simply stay
            for dev in sorted(g.members, key=lambda d: d.index):
                if excess < 0 and dev.draining:
                    dev.draining = False
                    excess += 1
            if excess == 0:
                return
            if g not in self._wanting:
                self._wanting.append(g)
            self._allocate()

    def _reconf_end(self, dev: _Device) -> float:
        for ev in self._heap:
            if ev[3] is dev and ev[2] == _RECONF:
                return ev[0]
        return self._now

    def _allocate(self) -> None:
        """Give unassigned devices to groups short of their target, first come first served."""
        t = self._now
        while self._wanting and self._pool:
            g = self._wanting[0]
            if g.active() + len(g.joining) >= g.target:
                self._wanting.pop(0)
                continue
            name = g.design.name
            # configured with the design > unconfigured > configured with another; fewer failures first
            dev = min(self._pool, key=lambda d: (d.design != name, d.design is not None, d.consecutive, d.index))
            self._pool.remove(dev)
            if dev.design == name and dev.healthy:
                self._join(dev, g, t)
            else:
                self._reconfigure(dev, g, t)

    def _reconfigure(self, dev: _Device, g: _Group, t: float) -> None:
        dev.state = RECONFIGURING
        dev.joining_for = g
        dev.reconfig_design = g.design.name
        dev.design = None
        g.joining.add(dev)
        dur = max(0.0, self._rng.gauss(self.config.reconfig_mean_s, self.config.reconfig_std_s)
                  if self.config.reconfig_std_s > 0 else self.config.reconfig_mean_s)
        self._seq += 1
        heapq.heappush(self._heap, (t + dur, self._seq, _RECONF, dev))
        self._events.append(DeviceEvent(t, dev.index, "reconfiguring", g.id, g.design.name))

    def _reconf_done(self, dev: _Device, t: float) -> None:
        g = dev.joining_for
        gid = g.id if g is not None else None
        self._reconfigs += 1
        dev.reconfigurations += 1
        fail = False
        if dev.forced_failures > 0:
            dev.forced_failures -= 1
            fail = True
        elif self.config.reconfig_failure_rate > 0 and self._rng.random() < self.config.reconfig_failure_rate:
            fail = True
        if g is not None:
            g.joining.discard(dev)
        dev.joining_for = None
        if fail:
            self._reconfig_failures += 1
            dev.failures += 1
            dev.consecutive += 1
            dev.healthy = False
            dev.design = None
            self._events.append(DeviceEvent(t, dev.index, "reconfiguration_failed", gid,
                                            f"attempt {dev.consecutive} of {self.config.blacklist_after}"))
            if dev.consecutive >= self.config.blacklist_after:
                dev.state = BLACKLISTED
                self._events.append(DeviceEvent(t, dev.index, "blacklisted", gid,
                                                f"{dev.consecutive} consecutive failed reconfigurations"))
                if g is not None and not g.deleted and g not in self._wanting:
                    self._wanting.append(g)
                self._allocate()
                return
            if g is not None and not g.deleted:
                self._reconfigure(dev, g, t)   # retry on the same device
                return
            dev.state = UNASSIGNED
            self._pool.append(dev)
            self._allocate()
            return
        dev.healthy = True
        dev.consecutive = 0
        dev.design = dev.reconfig_design
        self._events.append(DeviceEvent(t, dev.index, "reconfigured", gid, dev.design or ""))
        if g is not None and not g.deleted:
            self._join(dev, g, t)
        else:
            dev.state = UNASSIGNED
            self._pool.append(dev)
            self._allocate()

    def _join(self, dev: _Device, g: _Group, t: float) -> None:
        dev.group = g
        dev.draining = False
        g.members.add(dev)
        self._events.append(DeviceEvent(t, dev.index, "joined", g.id, g.design.name))
        self._run_device(dev, t)

    def _leave(self, dev: _Device, t: float, allocate: bool = True) -> None:
        g = dev.group
        if g is not None:
            g.members.discard(dev)
            if dev in g.free:
                g.free.remove(dev)
            self._events.append(DeviceEvent(t, dev.index, "left", g.id, ""))
        dev.group = None
        dev.draining = False
        dev.queue = None
        dev.state = UNASSIGNED
        self._pool.append(dev)
        if allocate:
            self._allocate()

    # -- devices ------------------------------------------------------------------------------------

    def inject_reconfiguration_failures(self, device: int, count: int) -> None:
        """Make the device's next `count` reconfigurations fail (tests, fault drills)."""
        with self._lock:
            self._device(device).forced_failures += count

    def reinstate_device(self, device: int) -> None:
        """Return a blacklisted device (e.g. after replacement) to the pool, unconfigured."""
        with self._lock:
            t = self._sync()
            dev = self._device(device)
            if dev.state != BLACKLISTED:
                raise PreconditionError(f"device {device} is not blacklisted")
            dev.state = UNASSIGNED
            dev.consecutive = 0
            dev.healthy = True
            self._pool.append(dev)
            self._events.append(DeviceEvent(t, device, "reinstated", None, ""))
            self._allocate()

    def take_device(self, device: int, design: str) -> bool:
        """Take an unassigned device out of the pool for work outside every group (the server's
        RunDirect), configured with `design`; returns whether it had to be reconfigured for it.
        No group gets it until `return_device`; meanwhile it is busy, in no group."""
        with self._lock:
            self._sync()
            dev = self._device(device)
            if dev.state != UNASSIGNED or dev not in self._pool:
                raise PreconditionError(f"device {device} belongs to a group or is unusable")
            self._pool.remove(dev)
            dev.state = BUSY
            # The device really is configured with it afterwards: a group of this design may take it
            # as it is, one of another design reconfigures it.
            reconfigure = dev.design != design
            dev.design = design
            return reconfigure

    def return_device(self, device: int) -> bool:
        """Give back a device `take_device` took; returns whether a group waiting for one took it."""
        with self._lock:
            self._sync()
            dev = self._device(device)
            if dev.state != BUSY or dev.group is not None or dev in self._pool:
                raise PreconditionError(f"device {device} was not taken")
            dev.state = UNASSIGNED
            self._pool.append(dev)
            self._allocate()
            return dev not in self._pool

    def device_states(self) -> list[DeviceState]:
        with self._lock:
            self._sync()
            return [self._state(d) for d in self._devices]

    @staticmethod
    def _state(d: _Device) -> DeviceState:
        g = d.group or d.joining_for
        return DeviceState(
            d.index, d.state, d.design, g.id if g is not None else None, d.healthy,
            d.state == BLACKLISTED, d.draining, d.locked_by.client.id if d.locked_by else None,
            d.task[0] if d.task else None, d.failures, d.consecutive, d.reconfigurations, d.busy_s)

    def device_state(self, index: int) -> DeviceState:
        """One device's state (`device_states()[index]`, without building the others)."""
        with self._lock:
            self._sync()
            return self._state(self._device(index))

    def drain_events(self) -> list[DeviceEvent]:
        with self._lock:
            self._sync()
            ev, self._events = self._events, []
            return ev

    # -- measurements -------------------------------------------------------------------------------

    def measurements(self) -> ServerMeasurements:
        """Cumulative counters for the autoscaler (it differences two snapshots)."""
        with self._lock:
            t = self._sync()
            groups = []
            for g in self._groups.values():
                clients = []
                gw = gr = 0
                for c in g.clients.values():
                    w = sum(len(q.tasks) for q in c.queues)
                    r = sum(1 for q in c.queues if q.dev is not None and q.dev.task is not None
                            and q.dev.queue is q)
                    clients.append(ClientMeasurement(c.id, c.executed, w, r))
                    gw += w
                    gr += r
                groups.append(GroupMeasurement(
                    g.id, g.design.name, g.active(), g.target, len(g.joining),
                    sum(1 for d in g.members if d.draining), g.min_size, g.max_size,
                    g.executed, g.busy_s, gw, gr, tuple(clients), g.failed, g.incarnation))
            usable = sum(1 for d in self._devices if d.state != BLACKLISTED)
            return ServerMeasurements(t, len(self._devices), usable, self._reconfigs,
                                      self._reconfig_failures, tuple(groups))

    # -- lookups ------------------------------------------------------------------------------------

    def _info(self, g: _Group) -> GroupInfo:
        waiting = sum(len(q.tasks) for c in g.clients.values() for q in c.queues)
        running = sum(1 for d in g.members if d.task is not None)
        return GroupInfo(g.id, g.design.name, g.target, g.active(), len(g.joining),
                         sum(1 for d in g.members if d.draining), g.min_size, g.max_size,
                         tuple(g.clients), waiting, running)

    def _group(self, group_id: str) -> _Group:
        g = self._groups.get(group_id)
        if g is None:
            raise NotFoundError(f"group {group_id!r} not found")
        return g

    def _client(self, client_id: str) -> _Client:
        c = self._clients.get(client_id)
        if c is None:
            raise NotFoundError(f"client {client_id!r} is not attached to any group")
        return c

    def _device(self, index: int) -> _Device:
        if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < len(self._devices):
            raise NotFoundError(f"device {index!r} does not exist (0..{len(self._devices) - 1})")
        return self._devices[index]
