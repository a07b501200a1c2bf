"""Time is injected: policies and services ask a Clock, never `time` itself.

`WallClock` runs live services; `VirtualClock` runs simulations, where time
moves only when the simulation advances it, so a 300 s experiment takes as
long as its computation.
"""

from __future__ import annotations

import heapq
import threading
import time
from typing import Protocol


class Clock(Protocol):
    def now(self) -> float:
        """Seconds since the epoch (wall) or since the simulation's start."""

    def sleep(self, seconds: float) -> None:
        """Block until `seconds` have passed on this clock."""


class WallClock:
    def now(self) -> float:
        return time.time()

    def sleep(self, seconds: float) -> None:
        if seconds > 0:
            time.sleep(seconds)


class VirtualClock:
    """Time that advances only when told to.

    `sleep` from another thread blocks until `advance` moves time past its
    wake-up point, so threaded code can run on virtual time deterministically.
    """

    def __init__(self, start: float = 0.0) -> None:
        self._now = start
        self._cond = threading.Condition()
        self._sleepers: list[float] = []

    def now(self) -> float:
        with self._cond:
            return self._now

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError("time does not run backwards")
        self.advance_to(self.now() + seconds)

    def advance_to(self, t: float) -> None:
        with self._cond:
            if t < self._now:
                raise ValueError("time does not run backwards")
            self._now = t
            while self._sleepers and self._sleepers[0] <= t:
                heapq.heappop(self._sleepers)
            self._cond.notify_all()

    def next_wakeup(self) -> float | None:
        with self._cond:
            return self._sleepers[0] if self._sleepers else None

    def sleep(self, seconds: float) -> None:
        with self._cond:
            wake = self._now + max(0.0, seconds)
            heapq.heappush(self._sleepers, wake)
            self._cond.notify_all()
            self._cond.wait_for(lambda: self._now >= wake)
