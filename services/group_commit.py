"""Group commit for SQLite: many small transactions per commit, led by a caller.

SQLite admits one writer at a time. With many request threads each taking a
lock, running a short transaction and committing, the lock holder keeps losing
the GIL to the waiters and every hand-off costs a thread wake-up, so writes
crawl long before the disk is busy. Here each caller queues its work; if no
commit is under way the caller leads one itself (no hand-off when the
database is idle), running everything queued, each piece under its own
SAVEPOINT inside one BEGIN IMMEDIATE ... COMMIT, and then passes the lead to
the oldest caller still waiting. Every caller gets its answer only after the
commit that holds its work (durability as before); a piece that fails rolls
back to its savepoint and fails alone.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

from sqlalchemy import Connection, Engine

log = logging.getLogger(__name__)

MAX_BATCH = 64


class _Slot:
    __slots__ = ("fn", "wake", "lead", "done", "ok", "value")

    def __init__(self, fn: Callable[[Connection], Any]) -> None:
        self.fn = fn
        self.wake = threading.Event()
        self.lead = False
        self.done = False
        self.ok = False
        self.value: Any = None


class GroupCommitter:
    def __init__(self, engine: Engine, lock: AbstractContextManager[Any]) -> None:
        self.engine = engine
        self.lock = lock
        self._mutex = threading.Lock()
        self._pending: list[_Slot] = []
        self._busy = False

    def submit(self, fn: Callable[[Connection], Any]) -> Any:
        slot = _Slot(fn)
        with self._mutex:
            self._pending.append(slot)
            if not self._busy:
                self._busy = slot.lead = True
        while not slot.done:
            if slot.lead:
                self._lead()
            else:
                slot.wake.wait()
                slot.wake.clear()
        if slot.ok:
            return slot.value
        raise slot.value

    def close(self) -> None:
        return None

    def _lead(self) -> None:
        with self._mutex:
            batch, self._pending = self._pending[:MAX_BATCH], self._pending[MAX_BATCH:]
        try:
            self._commit(batch)
        finally:
            with self._mutex:
                if self._pending:
                    nxt = self._pending[0]
                    nxt.lead = True
                    nxt.wake.set()
                else:
                    self._busy = False
            for slot in batch:
                slot.lead = False
                slot.done = True
                slot.wake.set()

    def _commit(self, batch: list[_Slot]) -> None:
        outcomes: list[tuple[bool, Any]] = []
        try:
            with self.lock, self.engine.begin() as conn:
                for slot in batch:
                    sp = conn.begin_nested()
                    try:
                        value = slot.fn(conn)
                    except BaseException as e:  # noqa: BLE001 - handed to its caller
                        sp.rollback()
                        outcomes.append((False, e))
                    else:
                        sp.commit()
                        outcomes.append((True, value))
        except BaseException as e:  # noqa: BLE001 - the commit itself failed: nobody's work stands
            log.warning("group commit failed", extra={"batch": len(batch), "error": repr(e)})
            outcomes = [(False, e)] * len(batch)
        for slot, (ok, value) in zip(batch, outcomes, strict=True):
            slot.ok, slot.value = ok, value
