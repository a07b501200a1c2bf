"""The database layer every service uses: SQLAlchemy 2.0 + Alembic.

SQLite (a file per service, the default) and PostgreSQL run the same code.
On SQLite, write transactions start with BEGIN IMMEDIATE: Python's sqlite3
otherwise defers the lock to the first write, so a read-then-write is not
isolated and concurrent writers double-book (FIELD-NOTES, "Not double-booking").
Reads use a deferred BEGIN so they never queue behind writers in WAL mode.
"""

from __future__ import annotations

import hashlib
import logging
import operator
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from sqlalchemy import Connection, Dialect, Engine, Executable, MetaData, create_engine, event, text
from sqlalchemy.exc import DBAPIError, InvalidRequestError
from sqlalchemy.orm import Session
from tenacity import retry, retry_if_exception, stop_after_attempt, wait_random_exponential

from services.errors import DATABASE_UNAVAILABLE, RETRY_LATER_S, Unavailable
from services.group_commit import GroupCommitter, driver_begin

log = logging.getLogger(__name__)
T = TypeVar("T")


def default_url(state_dir: str | Path, name: str) -> str:
    path = Path(state_dir).expanduser()
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        from services.config import ConfigError

        # Named by its setting: "[Errno 2] No such file or directory: '/proc/x'" said nothing of where it came from.
        raise ConfigError(f"state_dir {str(path)!r}: cannot make it ({e.strerror or e}): give a directory this "
                          "service may write (its databases go there)") from None
    return f"sqlite:///{path / name}.db"


NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


def metadata() -> MetaData:
    """A service's MetaData: named constraints, so Alembic migrations can alter them on any database."""
    return MetaData(naming_convention=NAMING_CONVENTION)


def _retrying(attempts: int, transient: Callable[[BaseException], bool] | None = None):  # type: ignore[no-untyped-def]
    """Retry transient conflicts (lock contention, serialisation failures), bounded and jittered. `transient`:
    what tells one (default `_is_transient`), asked once per failed attempt."""
    return retry(
        retry=retry_if_exception(transient or (lambda e: _is_transient(e))),
        stop=stop_after_attempt(attempts),
        wait=wait_random_exponential(multiplier=0.005, max=0.2),
        reraise=True,
    )


# SQLite's primary result codes of lock contention (an extended code, e.g. SQLITE_BUSY_SNAPSHOT, holds its
# primary one in its low byte); PostgreSQL's SQLSTATEs of a serialisation failure and a deadlock.
_SQLITE_CONTENTION = (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)
_PG_CONTENTION = ("40001", "40P01")


def _is_transient(exc: BaseException) -> bool:
    """Lock contention (SQLite) or a serialisation failure/deadlock (PostgreSQL), told by the driver's error
    (SQLAlchemy's wraps it as `orig`): its result code or SQLSTATE, never by words in the message, which holds
    the statement and its parameters (a tenant's "unlocked-gpu" is no reason to retry)."""
    err = exc.orig if isinstance(exc, DBAPIError) and exc.orig is not None else exc
    if isinstance(err, sqlite3.Error):
        code = getattr(err, "sqlite_errorcode", None)
        return isinstance(code, int) and code & 0xFF in _SQLITE_CONTENTION
    return getattr(err, "sqlstate", None) in _PG_CONTENTION


# Failures of the database's environment, not of the request nor of the code: a full disk, a file that cannot be
# opened or written, a server out of memory or connections, shutting down or unreachable. Waiting (and the operator)
# helps, so they are UNAVAILABLE (services.server), never INTERNAL. SQLite's primary result codes, by name (lock
# contention is one too once `_attempt`'s retries are spent); PostgreSQL's SQLSTATEs (and class 08, connection
# exceptions), by what they mean.
_SQLITE_UNAVAILABLE = {
    sqlite3.SQLITE_FULL: "SQLITE_FULL", sqlite3.SQLITE_READONLY: "SQLITE_READONLY",
    sqlite3.SQLITE_IOERR: "SQLITE_IOERR", sqlite3.SQLITE_CANTOPEN: "SQLITE_CANTOPEN",
    sqlite3.SQLITE_NOMEM: "SQLITE_NOMEM", sqlite3.SQLITE_BUSY: "SQLITE_BUSY", sqlite3.SQLITE_LOCKED: "SQLITE_LOCKED",
}
# A deadlock or serialisation failure left after the retries is contention, as SQLite's busy is: UNAVAILABLE.
_PG_UNAVAILABLE = {"53100": "disk full", "53200": "out of memory", "53300": "too many connections",
                   "57P01": "admin shutdown", "57P02": "crash shutdown", "57P03": "cannot connect now"}
_SAID_CHARS = 300


@dataclass(frozen=True)
class Unavailability:
    """Why the database cannot do the work now, as the driver told it (never the statement or its parameters)."""

    database: str   # "sqlite" | "postgresql"
    code: str       # SQLite's result code name (SQLITE_FULL) or PostgreSQL's SQLSTATE (53100; "" when none came)
    said: str       # the database's own message, first line


def unavailability(exc: BaseException) -> Unavailability | None:
    """The database's environment failing (see _SQLITE_UNAVAILABLE), told by the driver's error (SQLAlchemy's
    wraps it as `orig`) by its result code or SQLSTATE, never by words in the message; None for anything else
    (a constraint, a bad statement, a bug: those stay errors of their own)."""
    err = exc.orig if isinstance(exc, DBAPIError) and exc.orig is not None else exc
    if isinstance(err, sqlite3.Error):
        code = getattr(err, "sqlite_errorcode", None)
        name = _SQLITE_UNAVAILABLE.get(code & 0xFF) if isinstance(code, int) else None
        return Unavailability("sqlite", name, _first_line(str(err))) if name else None
    try:
        import psycopg
    except ImportError:  # pragma: no cover - a dependency; without it there is no PostgreSQL error to tell
        return None
    if not isinstance(err, psycopg.Error):
        return None
    sqlstate = err.sqlstate or ""
    primary = getattr(err.diag, "message_primary", None) or str(err)
    if sqlstate in _PG_UNAVAILABLE or sqlstate in _PG_CONTENTION or sqlstate.startswith("08"):
        return Unavailability("postgresql", sqlstate, _first_line(primary))
    if not sqlstate and (isinstance(err, psycopg.OperationalError)
                         or isinstance(exc, DBAPIError) and exc.connection_invalidated):
        # No SQLSTATE: the server never answered (connection refused, lost, closed under us).
        return Unavailability("postgresql", "", _first_line(primary))
    return None


def unavailable_error(exc: BaseException) -> Unavailable | None:
    """`exc` as the caller's UNAVAILABLE (reason DATABASE_UNAVAILABLE, a RetryInfo, metadata "database" and
    "code"), saying what the database said, when it is its environment failing (`unavailability`); else None."""
    why = unavailability(exc)
    if why is None:
        return None
    source = {"sqlite": "SQLite", "postgresql": "PostgreSQL"}[why.database]
    code = "" if not why.code else f" {why.code}" if why.database == "sqlite" else f" SQLSTATE {why.code}"
    return Unavailable(f"the service's database is unavailable: {why.said} ({source}{code}); retry later",
                       reason=DATABASE_UNAVAILABLE, retry_after_s=RETRY_LATER_S,
                       metadata={"database": why.database, **({"code": why.code} if why.code else {})})


def _first_line(text_: str) -> str:
    line = (text_.strip().splitlines() or [""])[0].strip()
    return line if len(line) <= _SAID_CHARS else line[:_SAID_CHARS] + "..."


def migration_lock_key(version_table: str) -> int:
    """The PostgreSQL advisory lock key (a signed 64-bit integer) migrations of `version_table` take: the same in
    every process (a stable hash of the name, not Python's salted hash())."""
    digest = hashlib.sha256(f"harness-migrate:{version_table}".encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


_WAL_WAIT_S = 30.0


def _wal(cur: Any) -> None:
    """Put the database in WAL mode. On a fresh file another process may be switching it at the same moment
    (two services' first start): SQLite then answers "database is locked" at once, without waiting on the busy
    timeout, so the switch is tried again for a while (once in WAL mode, the pragma changes nothing)."""
    deadline = time.monotonic() + _WAL_WAIT_S
    pause = 0.01
    while True:
        try:
            cur.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as e:
            if not _is_transient(e) or time.monotonic() + pause > deadline:
                raise
        time.sleep(pause)        # another process holds the lock for a moment: back off, then look again
        pause = min(pause * 2, 0.25)


class Database:
    """`one_writer`: this process's writes (`run`, `run_all`, `execute`, `write`) take turns on any database, as
    they do on SQLite. For a service whose writers all want the same few rows (the compute IRM's packing sends
    every unpinned VM to the fullest host with room), PostgreSQL's row locks otherwise queue them there anyway,
    and writers that take rows in different orders (a reservation's hosts, a release's) deadlock, each broken only
    after `deadlock_timeout` (1 s): 30 writers took a minute. Taking turns, there is no cycle to break; but one
    slow write (a row an outside session holds, a connection that hangs) holds up the others for as long."""

    def __init__(self, url: str, *, echo: bool = False, one_writer: bool = False) -> None:
        self.url = url
        self.is_sqlite = url.startswith("sqlite")
        kwargs: dict = {"echo": echo, "future": True}
        if self.is_sqlite:
            kwargs["connect_args"] = {"timeout": 30, "check_same_thread": False}
        else:
            kwargs.update(pool_size=10, max_overflow=20, pool_pre_ping=True)
        self.engine: Engine = create_engine(url, **kwargs)
        if self.is_sqlite:
            self._install_sqlite_hooks(self.engine)
        self._reader = self.engine.execution_options(harness_read=True)
        self._version_table: str | None = None     # the Alembic version table `migrate` brought up to date
        self._write_lock: threading.Lock | nullcontext = (
            threading.Lock() if self.is_sqlite or one_writer else nullcontext())
        # Turns for the writes that do not go through the group committer (every write, off SQLite).
        self._turns: threading.Lock | nullcontext = self._write_lock if one_writer and not self.is_sqlite \
            else nullcontext()
        self.conflicts = 0   # transient conflicts met (lock contention, deadlocks, serialisation failures)
        # SQLite has one writer at a time: batch this process's small writes (see group_commit).
        self._committer = GroupCommitter(self.engine, self._write_lock) if self.is_sqlite else None

    @staticmethod
    def _install_sqlite_hooks(engine: Engine) -> None:
        @event.listens_for(engine, "connect")
        def _connect(dbapi_conn, _record):  # type: ignore[no-untyped-def]
            dbapi_conn.isolation_level = None  # we issue BEGIN ourselves
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA busy_timeout=30000")
            _wal(cur)
            cur.execute("PRAGMA synchronous=NORMAL")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.close()

        @event.listens_for(engine, "begin")
        def _begin(conn):  # type: ignore[no-untyped-def]
            raw = conn.connection.driver_connection
            if raw.in_transaction:
                return  # begun on the driver already (the group committer does)
            read = conn.get_execution_options().get("harness_read", False)
            # On the driver connection: SQLAlchemy's statement machinery (events, result
            # set-up) costs ~10x the BEGIN itself, paid once per transaction.
            driver_begin(conn, raw, "BEGIN" if read else "BEGIN IMMEDIATE")

    @contextmanager
    def write(self) -> Iterator[Session]:
        """A write transaction: committed on success, rolled back on error.

        On SQLite, writers of this process queue on a lock first: SQLite's own
        busy handler sleeps in growing steps (up to 100 ms) while it waits,
        which under contention costs far more than the transactions do.
        Writers in other processes still meet at BEGIN IMMEDIATE.
        """
        with self._write_lock, Session(self.engine, expire_on_commit=False) as session, session.begin():
            yield session

    @contextmanager
    def read(self) -> Iterator[Session]:
        with Session(self._reader, expire_on_commit=False) as session, session.begin():
            yield session

    def transact(self, fn: Callable[[Session], T], attempts: int = 8) -> T:
        """Run `fn` in a write transaction, retrying transient conflicts."""

        @_retrying(attempts, self._conflict)
        def run() -> T:
            with self.write() as session:
                return fn(session)

        return run()

    def run(self, fn: Callable[[Connection], T], attempts: int = 8) -> T:
        """Like `transact`, on a bare Core connection: for hot paths with prebuilt statements,
        where the ORM session's bookkeeping would cost more than the SQL. On SQLite the
        work joins a group commit and runs under its own savepoint (when the commit
        holds other work: alone, a failure rolls the transaction back)."""

        def go() -> T:
            if self._committer is not None:
                return self._committer.submit(fn)
            with self._turns, self.engine.begin() as conn:
                return fn(conn)

        return self._attempt(go, attempts)

    def execute(self, prepared: Prepared, params: Mapping[str, Any], attempts: int = 8) -> int:
        """One prepared write statement in its own transaction (on SQLite: in the next
        group commit, without a savepoint: a statement is atomic by itself); the number
        of rows it changed."""

        def go() -> int:
            if self._committer is not None:
                return self._committer.submit(lambda c: prepared.execute(c, params), single_statement=True)
            with self._turns, self.engine.begin() as conn:
                return prepared.execute(conn, params)

        return self._attempt(go, attempts)

    def _attempt(self, go: Callable[[], T], attempts: int) -> T:
        """`go()`, retried on transient conflicts (each counted in `conflicts`). The first attempt runs outside
        tenacity: building its retry state per call costs more than a small write, and conflicts are the rare
        case."""
        try:
            return go()
        except Exception as e:
            if not self._conflict(e) or attempts <= 1:
                raise
        return _retrying(attempts - 1, self._conflict)(go)()

    def _conflict(self, exc: BaseException) -> bool:
        """Whether `exc` is a transient conflict, counted if so (asked once per failed attempt)."""
        if transient := _is_transient(exc):
            self.conflicts += 1
        return transient

    def run_all(self, fns: list[Callable[[Connection], T]], attempts: int = 8) -> list[tuple[bool, T | Exception]]:
        """Several independent pieces of write work, as `run` does each: per piece,
        (True, its value) or (False, its exception). On SQLite they join one group
        commit; elsewhere they share one transaction of their own. Either way each
        runs under its own savepoint, so a piece that fails rolls back alone, and
        one commit (one WAL flush on PostgreSQL, instead of one per piece) makes
        them all durable. A piece that failed on a transient conflict is retried
        by itself. On PostgreSQL the row locks of every piece are held until the
        one commit: a writer that takes the same rows in another order may
        deadlock with the batch, which PostgreSQL breaks after `deadlock_timeout`
        (the failed piece is then retried)."""
        outcomes: list[tuple[bool, T | Exception]]
        if self._committer is None:
            outcomes = self._one_transaction(fns)
        else:
            outcomes = self._committer.submit_all(list(fns))  # type: ignore[arg-type]
        for i, (ok, value) in enumerate(outcomes):
            if not ok and attempts > 1 and isinstance(value, Exception) and _is_transient(value):
                try:
                    outcomes[i] = (True, self.run(fns[i], attempts - 1))
                except Exception as e:  # noqa: BLE001 - handed to the caller
                    outcomes[i] = (False, e)
            elif not ok and not isinstance(value, Exception):
                raise value  # KeyboardInterrupt, SystemExit: not a piece's failure
        return outcomes

    def _one_transaction(self, fns: list[Callable[[Connection], T]]) -> list[tuple[bool, T | Exception]]:
        outcomes: list[tuple[bool, T | Exception]] = []
        try:
            with self._turns, self.engine.begin() as conn:
                for fn in fns:
                    piece = conn.begin_nested()
                    try:
                        value = fn(conn)
                    except Exception as e:  # noqa: BLE001 - handed to the caller
                        piece.rollback()
                        outcomes.append((False, e))
                    else:
                        piece.commit()
                        outcomes.append((True, value))
        except Exception as e:  # noqa: BLE001 - the commit failed: no piece's work stands
            # A piece that failed by itself keeps its own error; the others get the commit's.
            return [o if not o[0] else (False, e) for o in outcomes] + [(False, e)] * (len(fns) - len(outcomes))
        return outcomes

    def fetch(self, prepared: Prepared, params: Mapping[str, Any]) -> list[dict[str, Any]]:
        """One prepared SELECT, its rows as dicts: no transaction around a single statement
        (it reads one consistent snapshot by itself); cheaper than `query`."""
        with self._reader.connect() as conn:
            return prepared.mappings(conn, params)

    def query(self, fn: Callable[[Connection], T]) -> T:
        """A read-only Core transaction."""
        with self._reader.begin() as conn:
            return fn(conn)

    def probe(self) -> None:
        """A write that commits and changes nothing (the version row set to itself): raises while the database
        cannot take one (a full disk, a read-only file, a server down). For the server's health
        (services.server.DatabaseHealth) on services with no probe of their own."""
        if self._version_table is None:
            raise RuntimeError("no schema migrated in this process: nothing to probe")
        table = self._version_table
        self.run(lambda c: c.execute(text(f"UPDATE {table} SET version_num = version_num")), attempts=1)

    def migrate(self, migrations_dir: Path, version_table: str) -> None:
        """Bring the schema to the newest Alembic revision."""
        if not version_table.isidentifier():
            raise ValueError(f"version table {version_table!r}: expected an identifier")
        self._version_table = version_table
        from alembic import command
        from alembic.config import Config

        cfg = Config()
        cfg.set_main_option("script_location", str(migrations_dir))
        cfg.attributes["version_table"] = version_table
        # Two processes of a service starting at once on a fresh PostgreSQL database would both create the
        # version table and the schema (one fails on a duplicate): they take turns on an advisory lock of the
        # version table's name. On SQLite the whole upgrade is one BEGIN IMMEDIATE transaction instead (see
        # run_migrations).
        key = migration_lock_key(version_table) if self.engine.dialect.name == "postgresql" else None
        with self.engine.connect() as conn:
            if key is not None:
                conn.execute(text("SELECT pg_advisory_lock(:key)"), {"key": key})
                conn.commit()       # the lock is the session's: held until unlocked, across the upgrade's transaction
            try:
                self._known_revision(conn, cfg, version_table)
                cfg.attributes["connection"] = conn
                command.upgrade(cfg, "head")
                conn.commit()
            finally:
                if key is not None:
                    self._unlock(conn, key)

    def _known_revision(self, conn: Connection, cfg, version_table: str) -> None:  # type: ignore[no-untyped-def]
        """SchemaTooNew if the database is at a revision these migrations do not have: a newer Harness wrote it (an
        operator went back a version, or runs two versions on one database). Alembic would fail deep in the
        upgrade ("Can't locate revision"), a traceback every restart."""
        from alembic.runtime.migration import MigrationContext
        from alembic.script import ScriptDirectory

        script = ScriptDirectory.from_config(cfg)
        known = {r.revision for r in script.walk_revisions()}
        current = MigrationContext.configure(conn, opts={"version_table": version_table}).get_current_heads()
        conn.rollback()         # the upgrade begins its own transaction (on SQLite, one holding the write lock)
        unknown = sorted(set(current) - known)
        if unknown:
            where = self.engine.url.render_as_string(hide_password=True)
            raise SchemaTooNew(
                f"the database {where} is at schema revision {', '.join(unknown)} ({version_table}), which this "
                f"Harness does not know: a newer Harness wrote it. Run that version (or a newer one), or restore "
                f"the backup taken before the upgrade; this version's newest revision is "
                f"{', '.join(script.get_heads())}")

    @staticmethod
    def _unlock(conn: Connection, key: int) -> None:
        try:
            conn.rollback()
            conn.execute(text("SELECT pg_advisory_unlock(:key)"), {"key": key})
            conn.commit()
        except Exception:  # noqa: BLE001 - the session ends instead (its locks with it): not back to the pool
            log.warning("could not release the migration lock; dropping the connection", exc_info=True)
            conn.invalidate()

    def ping(self) -> None:
        with self.read() as s:
            s.execute(text("SELECT 1"))

    def dispose(self) -> None:
        if self._committer is not None:
            self._committer.close()
        self.engine.dispose()


class _Plan:
    """A statement compiled for one dialect, with its parameters' and columns' converters."""

    __slots__ = ("dialect", "compiled", "sql", "order", "pick", "binds", "columns", "results")

    def __init__(self, stmt: Any, dialect: Dialect, columns: Sequence[str] | None) -> None:
        self.dialect = dialect  # held, so the plans' key (its id) stays unique
        self.compiled = stmt.compile(dialect=dialect, column_keys=list(columns) if columns is not None else None)
        self.sql: str = self.compiled.string
        self.order: list[str] | None = list(self.compiled.positiontup) if self.compiled.positional else None
        # Positional drivers (sqlite3: qmark): the values in the order of the placeholders.
        self.pick: Callable[[dict[str, Any]], tuple[Any, ...]] | None = None
        if self.order is not None:
            order = self.order
            if len(order) > 1:
                self.pick = operator.itemgetter(*order)
            else:
                self.pick = lambda values: tuple(values[name] for name in order)
        if self.compiled.literal_execute_params or self.compiled.post_compile_params:
            raise NotImplementedError("Prepared does not handle expanding or literal-execute parameters")
        # Per bound parameter: the name the driver sees, where its value comes from (the
        # parameters by key or name, else the statement's own value: SQLAlchemy's
        # construct_params rules) and the type's bind processor (JSON, booleans, ...).
        escaped = self.compiled.escaped_bind_names
        self.binds: list[tuple[str, str, str, Any, Callable[[Any], Any] | None]] = [
            (escaped.get(name, name), bp.key, name, bp, bp.type.dialect_impl(dialect).bind_processor(dialect))
            for bp, name in self.compiled.bind_names.items()]
        self.columns = list(getattr(stmt, "exported_columns", ()) or ())
        # Per the driver's column type codes: each result column's processor (None: the value stands).
        self.results: dict[tuple[Any, ...], list[Callable[[Any], Any] | None]] = {}

    def processors(self, description: Sequence[Sequence[Any]]) -> list[Callable[[Any], Any] | None]:
        codes = tuple(d[1] for d in description)
        procs = self.results.get(codes)
        if procs is None:
            procs = self.results[codes] = [c.type.dialect_impl(self.dialect).result_processor(self.dialect, code)
                                           for c, code in zip(self.columns, codes, strict=True)]
        return procs

    def args(self, params: Mapping[str, Any]) -> Any:
        values: dict[str, Any] = {}
        for out, key, name, bp, proc in self.binds:
            if key in params:
                value = params[key]
            elif name in params:
                value = params[name]
            elif bp.required:
                raise InvalidRequestError(f"A value is required for bind parameter {key!r}")
            else:
                value = bp.effective_value if bp.callable else bp.value
            values[out] = value if proc is None else proc(value)
        if self.pick is not None:
            return self.pick(values)
        return values


class Prepared:
    """A Core statement compiled once per dialect and run on the driver's cursor.

    For the few statements on hot paths: SQLAlchemy's per-execution work (cache
    key, execution context, result set-up) costs ~60-80 us, the SQLite INSERT
    itself ~20 us. The SQL is the one SQLAlchemy compiles for the connection's
    dialect, and parameters and results go through the column types' own
    processors, so SQLite and PostgreSQL behave as through `Connection.execute`;
    driver errors are raised as SQLAlchemy's (IntegrityError, OperationalError,
    ...). It runs inside the caller's transaction (`Database.run`/`query`).
    Rows come back as tuples in the order of the statement's columns.

    `columns`: for an INSERT, the column keys every parameter set gives.
    """

    def __init__(self, stmt: Executable, columns: Sequence[str] | None = None) -> None:
        self.stmt = stmt
        self.columns = list(columns) if columns is not None else None
        self.keys = [c.key for c in getattr(stmt, "exported_columns", ()) or ()]
        self._plans: dict[int, _Plan] = {}
        self._lock = threading.Lock()

    def _plan(self, conn: Connection) -> _Plan:
        dialect = conn.dialect
        plan = self._plans.get(id(dialect))
        if plan is None:
            with self._lock:
                plan = self._plans.get(id(dialect)) or _Plan(self.stmt, dialect, self.columns)
                self._plans[id(dialect)] = plan
        return plan

    def _cursor(self, conn: Connection, plan: _Plan, args: Any, many: bool = False) -> Any:
        cursor = conn.connection.cursor()
        try:
            (cursor.executemany if many else cursor.execute)(plan.sql, args)
        except plan.dialect.loaded_dbapi.Error as e:
            cursor.close()
            raise DBAPIError.instance(plan.sql, args, e, plan.dialect.loaded_dbapi.Error,
                                      dialect=plan.dialect) from e
        return cursor

    def _rows(self, plan: _Plan, cursor: Any) -> list[tuple[Any, ...]]:
        rows = cursor.fetchall()
        if not rows:
            return []
        procs = plan.processors(cursor.description)
        if not any(procs):
            return [tuple(r) for r in rows]
        return [tuple(p(v) if p is not None else v for p, v in zip(procs, r, strict=True)) for r in rows]

    def execute(self, conn: Connection, params: Mapping[str, Any]) -> int:
        """Run it; the number of rows it changed."""
        plan = self._plan(conn)
        cursor = self._cursor(conn, plan, plan.args(params))
        try:
            return cursor.rowcount
        finally:
            cursor.close()

    def executemany(self, conn: Connection, params: Sequence[Mapping[str, Any]]) -> None:
        if not params:
            return
        plan = self._plan(conn)
        self._cursor(conn, plan, [plan.args(p) for p in params], many=True).close()

    def all(self, conn: Connection, params: Mapping[str, Any]) -> list[tuple[Any, ...]]:
        plan = self._plan(conn)
        cursor = self._cursor(conn, plan, plan.args(params))
        try:
            return self._rows(plan, cursor)
        finally:
            cursor.close()

    def first(self, conn: Connection, params: Mapping[str, Any]) -> tuple[Any, ...] | None:
        rows = self.all(conn, params)
        return rows[0] if rows else None

    def mappings(self, conn: Connection, params: Mapping[str, Any]) -> list[dict[str, Any]]:
        keys = self.keys
        return [dict(zip(keys, r, strict=True)) for r in self.all(conn, params)]


class SchemaTooNew(ValueError):
    """The database's schema is from a newer Harness than this one (Database.migrate)."""


def run_migrations(context, metadata: MetaData) -> None:  # type: ignore[no-untyped-def]
    """Body of every service's migrations/env.py (online mode only)."""
    conn = context.config.attributes["connection"]
    sqlite = conn.dialect.name == "sqlite"
    context.configure(
        connection=conn,
        target_metadata=metadata,
        version_table=context.config.attributes["version_table"],
        render_as_batch=sqlite,
        # Alembic takes SQLite's DDL as non-transactional and commits each revision apart; a second process
        # starting then reads the heads between two commits and runs the next revision too, while the first
        # still means to ("duplicate column"). Our connections issue BEGIN themselves, so SQLite's DDL is
        # transactional: one transaction, holding the write lock from reading the heads to the last revision.
        transactional_ddl=True if sqlite else None,
    )
    with context.begin_transaction():
        context.run_migrations()


@contextmanager
def scratch_database(url: str, prefix: str = "harness_scratch") -> Iterator[str]:
    """On a PostgreSQL server, a database of its own (named `prefix`_<random>), dropped afterwards;
    any other URL is yielded as given. A failed drop is logged, not raised, so it never hides
    the outcome of the work done inside."""
    from sqlalchemy.engine import make_url

    if make_url(url).get_backend_name() != "postgresql":
        yield url
        return
    name = f"{prefix}_{os.urandom(6).hex()}"
    admin = create_engine(url, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}"'))
        try:
            yield make_url(url).set(database=name).render_as_string(hide_password=False)
        finally:
            try:
                with admin.connect() as conn:
                    conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
            except Exception as e:  # noqa: BLE001 - see the docstring
                log.warning("could not drop a scratch database", extra={"database": name, "error": repr(e)})
    finally:
        admin.dispose()
