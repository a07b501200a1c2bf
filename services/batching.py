"""Caller-led batching: work that overlaps in time is done together, led by a caller.

Used by the SQLite group commit (services/group_commit.py) and by the CRS's
batched delegations (cross_resource_scheduler/delegation.py). Each caller
queues its items; if nothing is under way, the caller leads at once itself (no
thread hand-off, no added latency when idle) and processes everything queued
(up to `max_batch`), then passes the lead to the oldest item still waiting.
Callers that arrived meanwhile sleep on their thread's wake-up event until
their items are done or they are handed the lead.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Generic, TypeVar

_local = threading.local()


def thread_wake() -> threading.Event:
    """This thread's wake-up event, reused from call to call (an Event costs a Condition
    and two locks to build). A set left over from an earlier call only makes the first
    wait return early: every waiter re-checks its items and waits again."""
    ev = getattr(_local, "wake", None)
    if ev is None:
        ev = _local.wake = threading.Event()
    ev.clear()  # before the new items are visible: nobody can set it for them yet
    return ev


class Waiter:
    """An item of a batch: who to wake, and where it stands."""

    __slots__ = ("wake", "lead", "done")

    def __init__(self, wake: threading.Event | None = None) -> None:
        self.wake = wake or thread_wake()
        self.lead = False
        self.done = False


W = TypeVar("W", bound=Waiter)


class CallerLed(Generic[W]):
    """`run(items)` returns once `process` has handled every one of them, in some batch."""

    def __init__(self, process: Callable[[list[W]], None], max_batch: int) -> None:
        self._process = process
        self._max = max_batch
        self._mutex = threading.Lock()
        self._pending: list[W] = []
        self._busy = False

    def waiting(self) -> int:
        """Items queued behind the batch under way."""
        with self._mutex:
            return len(self._pending)

    def run(self, items: Sequence[W]) -> None:
        if not items:
            return
        with self._mutex:
            self._pending.extend(items)
            if not self._busy:
                self._busy = items[0].lead = True
        wake = items[0].wake  # one caller's items share its thread's event
        while not all(item.done for item in items):
            if any(item.lead for item in items):
                self._lead()
            else:
                wake.wait()
                wake.clear()

    def _lead(self) -> None:
        with self._mutex:
            batch, self._pending = self._pending[: self._max], self._pending[self._max :]
        try:
            self._process(batch)
        finally:
            with self._mutex:
                if self._pending:
                    nxt = self._pending[0]
                    nxt.lead = True
                    nxt.wake.set()
                else:
                    self._busy = False
            for item in batch:
                item.lead = False
                item.done = True
                item.wake.set()
