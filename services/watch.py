"""Fan-out of change events to server-streaming watchers."""

from __future__ import annotations

import queue
import threading
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from typing import Generic, TypeVar

from services.errors import ResourceExhausted

E = TypeVar("E")

# Streams one Broadcaster serves at once, by default: each holds one of the server's 32 worker threads
# (services.server), which every other call and the health checks share; 32 idle watches froze a server.
# The control plane's streams (no tenant: the CRS following an IRM) have slots of their own, so tenants'
# watches never lock the CRS out of a manager's capacity.
MAX_STREAMS = 8
CONTROL_STREAMS = 4

_CLOSED = object()


class Broadcaster(Generic[E]):
    """Each subscriber gets its own bounded queue; a slow one is dropped, not waited for."""

    def __init__(self, max_backlog: int = 100_000, *, max_streams: int | None = MAX_STREAMS,
                 full: str = "watch streams are open on this server; close one, or poll instead",
                 control_streams: int = CONTROL_STREAMS, per_tenant: int | None = None,
                 tenant_full: str = "close one of yours") -> None:
        """`max_streams` (None: no cap): tenants' streams at once; one beyond ends at once with
        RESOURCE_EXHAUSTED, its message `max_streams` + " " + `full`. Streams of no tenant (the control
        plane's) have `control_streams` of their own. `per_tenant` (None: no cap of its own): streams one
        tenant may hold within `max_streams`, so that one tenant cannot take every slot; one beyond ends the
        same way, its message naming the tenant's cap and then `tenant_full` (what to do)."""
        if per_tenant is not None and per_tenant < 1:
            raise ValueError("per_tenant must be >= 1 (or None: no cap per tenant)")
        self._lock = threading.Lock()
        self._open: Counter[str] = Counter()     # open streams per tenant ("": the control plane)
        self._max_streams = max_streams
        self._per_tenant = per_tenant
        self._tenant_full = tenant_full
        self._control_streams = control_streams
        self._full = full
        self._subs: set[queue.Queue] = set()
        # Subscribers cut off for falling behind: their stream ends (the watcher reconnects and
        # takes a fresh snapshot) rather than going silently stale.
        self._dropped: set[queue.Queue] = set()
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
        events = list(events)
        if not events:
            return
        with self._lock:
            subs = list(self._subs)
        for q in subs:
            try:
                for e in events:
                    q.put_nowait(e)
            except queue.Full:
                self._drop(q)

    def _drop(self, q: queue.Queue) -> None:
        with self._lock:
            self._subs.discard(q)
            self._dropped.add(q)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            subs = list(self._subs)
            self._subs.clear()
        for q in subs:
            try:
                q.put_nowait(_CLOSED)
            except queue.Full:
                # No room for the end marker: the stream ends as a dropped one does, once it has read what
                # was queued (it looks when its queue runs empty).
                self._drop(q)

    def _admit(self, tenant: str) -> None:
        """Count a new stream of `tenant` in, or refuse it (under the lock)."""
        if self._max_streams is not None:
            if not tenant and self._open[""] >= self._control_streams:
                raise ResourceExhausted(f"{self._control_streams} control-plane {self._full}")
            if tenant and self._per_tenant is not None and self._open[tenant] >= self._per_tenant:
                raise ResourceExhausted(f"tenant {tenant!r} already holds {self._open[tenant]} of the watch "
                                        f"streams here, the most one tenant may ({self._per_tenant}); "
                                        f"{self._tenant_full}")
            if tenant and sum(n for t, n in self._open.items() if t) >= self._max_streams:
                raise ResourceExhausted(f"{self._max_streams} {self._full}")
        self._open[tenant] += 1

    def stream_batches(
        self, snapshot: Callable[[], Iterable[E]], is_active: Callable[[], bool], max_batch: int = 256,
        tenant: str = "",
    ) -> Iterator[list[E]]:
        """`stream` in lists: the snapshot as one list, then each time every event
        queued at that moment (at least one, at most `max_batch`), so that a burst of
        changes can go out as one message. `tenant`: whose stream it is, for the caps."""
        q: queue.Queue = queue.Queue(self._max)
        with self._lock:
            if self._closed:
                return
            self._admit(tenant)
            self._subs.add(q)
        try:
            first = list(snapshot())
            if first:
                yield first
            while is_active():
                try:
                    item = q.get_nowait()
                except queue.Empty:
                    with self._lock:
                        if q in self._dropped or self._closed:
                            return
                    try:
                        item = q.get(timeout=1.0)
                    except queue.Empty:
                        continue
                if item is _CLOSED:
                    return
                batch = [item]
                while len(batch) < max_batch:
                    try:
                        item = q.get_nowait()
                    except queue.Empty:
                        break
                    if item is _CLOSED:
                        yield batch
                        return
                    batch.append(item)
                yield batch
        finally:
            with self._lock:
                self._open[tenant] -= 1
                self._subs.discard(q)
                self._dropped.discard(q)

    def stream(self, snapshot: Callable[[], Iterable[E]], is_active: Callable[[], bool],
               tenant: str = "") -> Iterator[E]:
        """Subscribe first, then yield the snapshot, then live events.

        Subscribing before taking the snapshot means no change is lost between
        them; a change may be seen twice, which generations make harmless. A
        dropped (too slow) subscriber gets what was queued, then the stream ends.
        """
        for batch in self.stream_batches(snapshot, is_active, tenant=tenant):
            yield from batch
