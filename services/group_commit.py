"""Group commit for SQLite: many small transactions per commit, led by a caller.

SQLite admits one writer at a time. With many request threads each taking a
lock, running a short transaction and committing, the lock holder keeps losing
the GIL to the waiters and every hand-off costs a thread wake-up, so writes
crawl long before the disk is busy. Here each caller queues its work; if no
commit is under way the caller leads one itself (no hand-off when the
database is idle), running everything queued inside one BEGIN IMMEDIATE ...
COMMIT, and then passes the lead to the oldest caller still waiting
(services.batching). Every
caller gets its answer only after the commit that holds its work (durability
as before); a piece that fails rolls back alone.

Costs, measured (CPython 3.11, SQLAlchemy 2.x): a SQLAlchemy nested
transaction costs ~170 us per piece and a pooled `engine.begin()` ~100 us per
batch, several times the INSERT they wrap. So the leader keeps one connection
for the committer's lifetime, issues BEGIN IMMEDIATE and COMMIT on the driver
connection, and isolates pieces with SAVEPOINTs there too (~2 us), only when
the batch holds more than one piece: a lone piece that fails rolls the whole
transaction back, which is the same thing.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

from sqlalchemy import Connection, Engine
from sqlalchemy.exc import DBAPIError

from services.batching import CallerLed, Waiter, thread_wake

log = logging.getLogger(__name__)

MAX_BATCH = 64


def driver_begin(conn: Connection, raw: Any, sql: str) -> None:
    """`sql` (a BEGIN) on the driver connection `raw` of `conn`. A driver error is raised as SQLAlchemy's
    (OperationalError for "database is locked"), as every statement's is through SQLAlchemy: a BEGIN IMMEDIATE
    that meets another process's writer is then the same transient conflict as any other, and retried."""
    try:
        raw.execute(sql)
    except conn.dialect.loaded_dbapi.Error as e:
        raise DBAPIError.instance(sql, (), e, conn.dialect.loaded_dbapi.Error, dialect=conn.dialect) from e


class _Slot(Waiter):
    __slots__ = ("fn", "single", "ok", "value")

    def __init__(self, fn: Callable[[Connection], Any], wake: threading.Event, single: bool = False) -> None:
        super().__init__(wake)
        self.fn = fn
        self.single = single  # fn runs one statement: atomic by itself, no savepoint needed
        self.ok = False
        self.value: Any = None


class _PieceFailed(Exception):  # noqa: N818 - internal signal, never escapes
    """A lone piece raised: its transaction is rolled back, the error goes to its caller."""

    def __init__(self, error: BaseException) -> None:
        super().__init__()
        self.error = error


class GroupCommitter:
    def __init__(self, engine: Engine, lock: AbstractContextManager[Any]) -> None:
        self.engine = engine
        self.lock = lock
        self._batches: CallerLed[_Slot] = CallerLed(self._commit, MAX_BATCH)
        self._conn: Connection | None = None  # used by the leader only (under self.lock)
        self._closed = False

    def submit(self, fn: Callable[[Connection], Any], single_statement: bool = False) -> Any:
        """Run `fn` in the next commit; its value, or its exception raised here.

        `single_statement`: `fn` runs exactly one statement. SQLite undoes a failed
        statement by itself and keeps the transaction, so such a piece needs no
        savepoint (each savepoint costs two more calls into SQLite, and each call
        gives up the GIL, which the leader then has to win back while it holds the
        write lock)."""
        slot = _Slot(fn, thread_wake(), single_statement)
        self._batches.run([slot])
        if slot.ok:
            return slot.value
        raise slot.value

    def submit_all(self, fns: list[Callable[[Connection], Any]]) -> list[tuple[bool, Any]]:
        """Several pieces from one caller, queued together (usually one commit for all);
        each succeeds or fails alone: per piece, (True, its value) or (False, its error)."""
        wake = thread_wake()
        slots = [_Slot(fn, wake) for fn in fns]
        self._batches.run(slots)
        return [(slot.ok, slot.value) for slot in slots]

    def close(self) -> None:
        with self.lock:
            self._closed = True
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    def _connection(self) -> Connection:
        if self._conn is None or self._conn.invalidated or self._conn.closed:
            if self._closed:
                raise RuntimeError("the database is closed")
            self._conn = self.engine.connect()
        return self._conn

    def _commit(self, batch: list[_Slot]) -> None:
        outcomes: list[tuple[bool, Any]] = []
        try:
            with self.lock:
                conn = self._connection()
                raw = conn.connection.driver_connection
                assert raw is not None
                if len(batch) == 1 and batch[0].single:
                    self._alone(conn, raw, batch[0])
                    return
                # BEGIN and COMMIT on the driver connection (SQLAlchemy's transaction
                # machinery costs ~50 us per batch). A piece that uses the Connection
                # makes SQLAlchemy autobegin; its begin hook sees the transaction open
                # (services.db), and the commit then goes through SQLAlchemy.
                driver_begin(conn, raw, "BEGIN IMMEDIATE")
                try:
                    if len(batch) == 1:
                        try:
                            outcomes.append((True, batch[0].fn(conn)))
                        except BaseException as e:  # noqa: BLE001 - handed to its caller
                            raise _PieceFailed(e) from None
                    else:
                        self._pieces(conn, batch, outcomes)
                except BaseException:
                    self._end(conn, raw, commit=False)
                    raise
                self._end(conn, raw, commit=True)
        except _PieceFailed as failed:
            outcomes = [(False, failed.error)]
        except BaseException as e:  # noqa: BLE001 - the commit itself failed: nobody's work stands
            log.warning("group commit failed", extra={"batch": len(batch), "error": repr(e)})
            outcomes = [(False, e)] * len(batch)
        for slot, (ok, value) in zip(batch, outcomes, strict=True):
            slot.ok, slot.value = ok, value

    def _alone(self, conn: Connection, raw: Any, slot: _Slot) -> None:
        """One statement with nothing to share its commit: run in autocommit, it is its own
        transaction (atomic, and committed as durably as by COMMIT when it returns), which
        saves the BEGIN IMMEDIATE and COMMIT calls into SQLite and their GIL hand-offs. A
        single statement needs no BEGIN IMMEDIATE for isolation: it takes the write lock
        itself. (If it went through SQLAlchemy, which begins a transaction first, that
        transaction is ended here.)"""
        try:
            slot.value, slot.ok = slot.fn(conn), True
        except BaseException as e:  # noqa: BLE001 - handed to its caller
            slot.value, slot.ok = e, False
        if conn.in_transaction() or raw.in_transaction:
            try:
                self._end(conn, raw, commit=slot.ok)
            except BaseException as e:  # noqa: BLE001 - the commit failed: the work does not stand
                log.warning("group commit failed", extra={"batch": 1, "error": repr(e)})
                slot.value, slot.ok = e, False

    def _end(self, conn: Connection, raw: Any, commit: bool) -> None:
        """COMMIT or ROLLBACK, through SQLAlchemy if a piece made it begin, else on the driver.
        If that fails, the transaction is rolled back (or the connection dropped), so the
        next batch starts clean."""
        try:
            if conn.in_transaction():
                (conn.commit if commit else conn.rollback)()
            elif raw.in_transaction:
                (raw.commit if commit else raw.rollback)()
        except BaseException:
            try:
                if conn.in_transaction():
                    conn.rollback()
                if raw.in_transaction:
                    raw.rollback()
            except BaseException:  # noqa: BLE001 - its state is unknown: start afresh
                conn.invalidate()
            raise
        finally:
            if conn.invalidated:
                conn.close()
                self._conn = None

    @staticmethod
    def _pieces(conn: Connection, batch: list[_Slot], outcomes: list[tuple[bool, Any]]) -> None:
        raw = conn.connection.driver_connection
        assert raw is not None
        for slot in batch:
            if slot.single:
                try:
                    outcomes.append((True, slot.fn(conn)))
                except BaseException as e:  # noqa: BLE001 - handed to its caller
                    if not raw.in_transaction:
                        raise  # SQLite rolled the whole transaction back (I/O error, full disk)
                    outcomes.append((False, e))
                continue
            raw.execute("SAVEPOINT harness_gc")
            try:
                value = slot.fn(conn)
            except BaseException as e:  # noqa: BLE001 - handed to its caller
                if not raw.in_transaction:
                    raise  # as above: nobody's work stands
                raw.execute("ROLLBACK TO SAVEPOINT harness_gc")
                raw.execute("RELEASE SAVEPOINT harness_gc")
                outcomes.append((False, e))
            else:
                raw.execute("RELEASE SAVEPOINT harness_gc")
                outcomes.append((True, value))
