"""A mutex whose waiters enter in priority order (then arrival order).

Placement runs one request at a time against the capacity view; when several
wait, high-priority requests are placed first (MANGO's high vs normal
priority, seed 003). Delegation to IRMs happens outside the gate.
"""

from __future__ import annotations

import heapq
import itertools
import threading
from collections.abc import Iterator
from contextlib import contextmanager


class PriorityGate:
    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._busy = False
        self._waiting: list[tuple[int, int]] = []
        self._seq = itertools.count()

    def waiting(self) -> int:
        with self._cond:
            return len(self._waiting)

    @contextmanager
    def hold(self, priority: int = 0) -> Iterator[None]:
        with self._cond:
            ticket = (-priority, next(self._seq))
            heapq.heappush(self._waiting, ticket)
            self._cond.notify_all()  # someone may be waiting for the queue to grow (tests)
            self._cond.wait_for(lambda: not self._busy and self._waiting[0] == ticket)
            heapq.heappop(self._waiting)
            self._busy = True
        try:
            yield
        finally:
            with self._cond:
                self._busy = False
                self._cond.notify_all()

    def wait_for_waiters(self, n: int, timeout: float) -> bool:
        """Block until at least `n` requests wait (for tests and benchmarks)."""
        with self._cond:
            return self._cond.wait_for(lambda: len(self._waiting) >= n, timeout)
