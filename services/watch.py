"""Fan-out of change events to server-streaming watchers."""

from __future__ import annotations

import logging
import threading
from collections import Counter, OrderedDict, deque
from collections.abc import Callable, Hashable, Iterable, Iterator
from typing import Generic, TypeVar

from services.errors import STREAM_CAP, ResourceExhausted

E = TypeVar("E")
log = logging.getLogger(__name__)

# Streams one Broadcaster serves at once, by default: each holds one of the server's 32 worker threads
# (services.server), which every other call and the health checks share; 32 idle watches froze a server.
# The control plane's streams (no tenant: the CRS following an IRM) have slots of their own, so tenants'
# watches never lock the CRS out of a manager's capacity. A server counts a stream as the control plane's ("") only
# for a caller with its control token (services.control.watch_tenant; the CRS, the compute IRM and the FPGA
# Orchestrator do): else anyone leaving the tenant out could take those slots.
MAX_STREAMS = 8
CONTROL_STREAMS = 4
# WatchCapacity streams one tenant may hold of a server's: one without a resource type follows them all, so one
# tenant needs no more, and cannot lock the other tenants out.
CAPACITY_WATCHES_PER_TENANT = 2
CAPACITY_TENANT_FULL = ("close one of your WatchCapacity streams (one without resource_type follows every type), or "
                        "poll DiscoverResources")


class _Subscriber(Generic[E]):
    """One stream's pending events: those it `accept`s, at most `limit` of them (`key`: only the latest event of
    each key is kept, in the place of the first one pending), then the stream is cut off (`ended`) once it has
    read what it holds."""

    def __init__(self, limit: int, accept: Callable[[E], bool] | None, key: Callable[[E], Hashable] | None) -> None:
        self.limit = limit
        self.accept = accept
        self.key = key
        self.cond = threading.Condition(threading.Lock())
        self.pending: deque[E] = deque()
        self.latest: OrderedDict[Hashable, E] = OrderedDict()   # with a key: key -> its latest event, in order
        self.ended = False                           # cut off (fell behind) or closed: no more events come

    def qsize(self) -> int:
        with self.cond:
            return len(self.latest) if self.key is not None else len(self.pending)

    def offer(self, events: list[E]) -> bool:
        """Queue the events it accepts; False: it had no room for one (what fit stays queued)."""
        mine = events if self.accept is None else [e for e in events if self.accept(e)]
        if not mine:
            return True
        keys = None if self.key is None else [self.key(e) for e in mine]
        with self.cond:
            try:
                if keys is None:
                    for e in mine:
                        if len(self.pending) >= self.limit:
                            return False
                        self.pending.append(e)
                else:
                    for k, e in zip(keys, mine, strict=True):
                        if k not in self.latest and len(self.latest) >= self.limit:
                            return False
                        self.latest[k] = e           # a key already pending keeps its place
                return True
            finally:
                self.cond.notify_all()

    def end(self) -> None:
        with self.cond:
            self.ended = True
            self.cond.notify_all()

    def take(self, most: int, timeout: float) -> list[E]:
        """Up to `most` pending events, waiting up to `timeout` s for one ([]: none came, or the stream ended)."""
        with self.cond:
            if not self.pending and not self.latest and not self.ended:
                self.cond.wait(timeout)
            if self.key is None:
                return [self.pending.popleft() for _ in range(min(most, len(self.pending)))]
            return [self.latest.popitem(last=False)[1] for _ in range(min(most, len(self.latest)))]


class Broadcaster(Generic[E]):
    """Each subscriber gets its own bounded queue; a slow one is dropped, not waited for."""

    def __init__(self, max_backlog: int = 100_000, *, max_streams: int | None = MAX_STREAMS,
                 full: str = "watch streams are open on this server; close one, or poll instead",
                 control_streams: int = CONTROL_STREAMS, per_tenant: int | None = None,
                 tenant_full: str = "close one of yours") -> None:
        """`max_backlog`: events a subscriber may have pending (a stream may ask for another cap, see
        `stream_batches`); one more and it is cut off. `max_streams` (None: no cap): tenants' streams at once; one
        beyond ends at once with RESOURCE_EXHAUSTED, its message `max_streams` + " " + `full`. Streams of no
        tenant (the control plane's) have `control_streams` of their own. `per_tenant` (None: no cap of its
        own): streams one tenant may hold within `max_streams`, so that one tenant cannot take every slot; one
        beyond ends the same way, its message naming the tenant's cap and then `tenant_full` (what to do)."""
        if per_tenant is not None and per_tenant < 1:
            raise ValueError("per_tenant must be >= 1 (or None: no cap per tenant)")
        if max_backlog < 1:
            raise ValueError("max_backlog must be >= 1")
        self._lock = threading.Lock()
        self._open: Counter[str] = Counter()     # open streams per tenant ("": the control plane)
        self._max_streams = max_streams
        self._per_tenant = per_tenant
        self._tenant_full = tenant_full
        self._control_streams = control_streams
        self._full = full
        # Subscribers cut off for falling behind leave this set: their stream ends once it has read what it held
        # (the watcher reconnects and takes a fresh snapshot) rather than going silently stale.
        self._subs: set[_Subscriber[E]] = set()
        self._max = max_backlog
        self._closed = False      # for good: a stream opened after close() ends at once

    @property
    def closed(self) -> bool:
        """Whether close() was called (a stream that ended may tell shutdown from falling behind by it)."""
        return self._closed

    def has_subscribers(self) -> bool:
        """Whether anyone listens now (a publisher may skip building events nobody reads:
        a subscriber that arrives later takes its snapshot after the change)."""
        return bool(self._subs)

    def publish(self, events: Iterable[E]) -> None:
        """Each subscriber is handed the events it accepts (see `stream_batches`), without waiting for it."""
        events = list(events)
        if not events:
            return
        with self._lock:
            subs = list(self._subs)
        for sub in subs:
            try:
                kept = sub.offer(events)
            except Exception:     # its filter or key failed on an event: that stream ends, the others go on
                log.exception("a watch stream's event filter failed; the stream is ended")
                kept = False
            if not kept:
                self._drop(sub)

    def _drop(self, sub: _Subscriber[E]) -> None:
        with self._lock:
            self._subs.discard(sub)
        sub.end()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            subs = list(self._subs)
            self._subs.clear()
        for sub in subs:
            sub.end()           # each stream ends once it has read what was queued

    def _admit(self, tenant: str) -> None:
        """Count a new stream of `tenant` in, or refuse it (under the lock)."""
        if self._max_streams is not None:
            if not tenant and self._open[""] >= self._control_streams:
                raise ResourceExhausted(f"{self._control_streams} control-plane {self._full}", reason=STREAM_CAP)
            # A pseudo-tenant ("\x00...": anonymous watchers, e.g. CRSs following a manager without its token)
            # gathers many callers, not one tenant: half the tenants' slots, so the others keep the rest.
            cap = self._per_tenant
            if cap is not None and tenant.startswith("\x00") and self._max_streams is not None:
                cap = max(cap, self._max_streams // 2)
            if tenant and cap is not None and self._open[tenant] >= cap:
                held = self._open[tenant]
                said = (f"callers naming no tenant already hold {held} of the watch streams here, the most they "
                        f"may ({cap})" if tenant.startswith("\x00") else
                        f"tenant {tenant!r} already holds {held} of the watch streams here, the most one tenant may "
                        f"({cap})")
                raise ResourceExhausted(f"{said}; {self._tenant_full}", reason=STREAM_CAP)
            if tenant and sum(n for t, n in self._open.items() if t) >= self._max_streams:
                raise ResourceExhausted(f"{self._max_streams} {self._full}", reason=STREAM_CAP)
        self._open[tenant] += 1

    def stream_batches(
        self, snapshot: Callable[[], Iterable[E]], is_active: Callable[[], bool], max_batch: int = 256,
        tenant: str = "", *, accept: Callable[[E], bool] | None = None, key: Callable[[E], Hashable] | None = None,
        max_backlog: int | None = None,
    ) -> Iterator[list[E]]:
        """`stream` in lists: the snapshot as one list, then each time every event
        queued at that moment (at least one, at most `max_batch`), so that a burst of
        changes can go out as one message. `tenant`: whose stream it is, for the caps.

        `accept` (None: every event): the events this stream wants, asked as they are published, so that one
        it does not want (another tenant's) is never queued for it. `key` (None: every event is queued): events
        of one key replace each other while pending (a stream that follows states needs only the latest of each
        one), so a stalled stream holds at most one event per key. `max_backlog` (None: the Broadcaster's): the
        events (with `key`: the keys) it may have pending; one more and it is cut off -- the stream ends after
        what it holds, and `closed` is false (a caller tells the watcher it fell behind).
        """
        limit = self._max if max_backlog is None else max_backlog
        if limit < 1:
            raise ValueError("max_backlog must be >= 1")
        sub: _Subscriber[E] = _Subscriber(limit, accept, key)
        with self._lock:
            if self._closed:
                return
            self._admit(tenant)
            self._subs.add(sub)
        try:
            first = list(snapshot())
            if first:
                yield first
            while is_active():
                batch = sub.take(max_batch, timeout=1.0)
                if batch:
                    yield batch
                elif sub.ended:
                    return
        finally:
            with self._lock:
                self._open[tenant] -= 1
                self._subs.discard(sub)

    def stream(self, snapshot: Callable[[], Iterable[E]], is_active: Callable[[], bool],
               tenant: str = "") -> Iterator[E]:
        """Subscribe first, then yield the snapshot, then live events.

        Subscribing before taking the snapshot means no change is lost between
        them; a change may be seen twice, which generations make harmless. A
        dropped (too slow) subscriber gets what was queued, then the stream ends.
        """
        for batch in self.stream_batches(snapshot, is_active, tenant=tenant):
            yield from batch
