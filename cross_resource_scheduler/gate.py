"""A mutex whose waiters enter in priority order (then arrival order).

Placement runs one request at a time against the capacity view; when several
wait, high-priority requests are placed first (MANGO's high vs normal
priority, seed 003). Delegation to IRMs happens outside the gate.

The holder hands the gate straight to the best waiter, waking that one
thread only (a shared condition would wake every waiter, twice per
placement, for one of them to enter); with nobody waiting, entering costs a
lock round trip.
"""

from __future__ import annotations

import heapq
import itertools
import threading
from collections.abc import Iterator
from contextlib import contextmanager


class PriorityGate:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._grew = threading.Condition(self._lock)  # for wait_for_waiters only
        self._busy = False
        self._waiting: list[tuple[int, int, threading.Event]] = []
        self._seq = itertools.count()

    def waiting(self) -> int:
        with self._lock:
            return len(self._waiting)

    @contextmanager
    def hold(self, priority: int = 0) -> Iterator[None]:
        turn: threading.Event | None = None
        with self._lock:
            if self._busy:
                turn = threading.Event()
                heapq.heappush(self._waiting, (-priority, next(self._seq), turn))
                self._grew.notify_all()
            else:
                self._busy = True
        if turn is not None:
            turn.wait()  # the previous holder handed the gate over: it stays busy for us
        try:
            yield
        finally:
            with self._lock:
                if self._waiting:
                    heapq.heappop(self._waiting)[2].set()
                else:
                    self._busy = False

    def wait_for_waiters(self, n: int, timeout: float) -> bool:
        """Block until at least `n` requests wait (for tests and benchmarks)."""
        with self._grew:
            return self._grew.wait_for(lambda: len(self._waiting) >= n, timeout)
