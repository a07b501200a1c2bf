"""Group commit for SQLite: one writer thread, many small transactions per commit.

SQLite admits one writer at a time. With many request threads each taking a
lock, running a short transaction and committing, the lock holder keeps losing
the GIL to the waiters and every hand-off costs a thread wake-up, so writes
crawl long before the disk is busy. Here callers queue their work; a single
writer thread takes everything queued, runs each piece under its own
SAVEPOINT inside one BEGIN IMMEDIATE ... COMMIT, and answers each caller only
after the commit (durability as before). A piece that fails rolls back to its
savepoint and fails alone.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from contextlib import AbstractContextManager
from typing import Any

from sqlalchemy import Connection, Engine

log = logging.getLogger(__name__)

MAX_BATCH = 64


class GroupCommitter:
    def __init__(self, engine: Engine, lock: AbstractContextManager[Any]) -> None:
        self.engine = engine
        self.lock = lock
        self._queue: queue.SimpleQueue[tuple[Callable[[Connection], Any], Future] | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._start_lock = threading.Lock()

    def submit(self, fn: Callable[[Connection], Any]) -> Any:
        if self._thread is None:
            with self._start_lock:
                if self._thread is None:
                    self._thread = threading.Thread(target=self._loop, name="group-commit", daemon=True)
                    self._thread.start()
        fut: Future = Future()
        self._queue.put((fn, fut))
        return fut.result()

    def close(self) -> None:
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join(timeout=10)
            self._thread = None

    def _loop(self) -> None:
        while True:
            first = self._queue.get()
            if first is None:
                return
            batch = [first]
            stop = False
            while len(batch) < MAX_BATCH:
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                if item is None:
                    stop = True
                    break
                batch.append(item)
            self._commit(batch)
            if stop:
                return

    def _commit(self, batch: list) -> None:  # type: ignore[type-arg]
        outcomes: list[tuple[bool, Any]] = []
        try:
            with self.lock, self.engine.begin() as conn:
                for fn, _ in batch:
                    sp = conn.begin_nested()
                    try:
                        value = fn(conn)
                    except BaseException as e:  # noqa: BLE001 - handed to its caller
                        sp.rollback()
                        outcomes.append((False, e))
                    else:
                        sp.commit()
                        outcomes.append((True, value))
        except BaseException as e:  # noqa: BLE001 - the commit itself failed: nobody's work stands
            log.warning("group commit failed", extra={"batch": len(batch), "error": repr(e)})
            for _, fut in batch:
                fut.set_exception(e)
            return
        for (_, fut), (ok, value) in zip(batch, outcomes, strict=True):
            if ok:
                fut.set_result(value)
            else:
                fut.set_exception(value)
