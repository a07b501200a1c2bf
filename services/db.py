"""The database layer every service uses: SQLAlchemy 2.0 + Alembic.

SQLite (a file per service, the default) and PostgreSQL run the same code.
On SQLite, write transactions start with BEGIN IMMEDIATE: Python's sqlite3
otherwise defers the lock to the first write, so a read-then-write is not
isolated and concurrent writers double-book (FIELD-NOTES, "Not double-booking").
Reads use a deferred BEGIN so they never queue behind writers in WAL mode.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import TypeVar

from sqlalchemy import Connection, Engine, MetaData, create_engine, event, text
from sqlalchemy.exc import DBAPIError, OperationalError
from sqlalchemy.orm import Session
from tenacity import retry, retry_if_exception, stop_after_attempt, wait_random_exponential

from services.group_commit import GroupCommitter

log = logging.getLogger(__name__)
T = TypeVar("T")


def default_url(state_dir: str | Path, name: str) -> str:
    path = Path(state_dir).expanduser()
    path.mkdir(parents=True, exist_ok=True)
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


def _retrying(attempts: int):  # type: ignore[no-untyped-def]
    """Retry transient conflicts (lock contention, serialisation failures), bounded and jittered."""
    return retry(
        retry=retry_if_exception(_is_transient),
        stop=stop_after_attempt(attempts),
        wait=wait_random_exponential(multiplier=0.005, max=0.2),
        reraise=True,
    )


def _is_transient(exc: BaseException) -> bool:
    """Lock contention (SQLite) or a serialisation failure/deadlock (PostgreSQL)."""
    if isinstance(exc, OperationalError) and "locked" in str(exc).lower():
        return True
    if isinstance(exc, DBAPIError):
        sqlstate = getattr(getattr(exc, "orig", None), "sqlstate", None)
        return sqlstate in ("40001", "40P01")
    return False


class Database:
    def __init__(self, url: str, *, echo: bool = False) -> None:
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
        self._write_lock: threading.Lock | nullcontext = threading.Lock() if self.is_sqlite else nullcontext()
        # SQLite has one writer at a time: batch this process's small writes (see group_commit).
        self._committer = GroupCommitter(self.engine, self._write_lock) if self.is_sqlite else None

    @staticmethod
    def _install_sqlite_hooks(engine: Engine) -> None:
        @event.listens_for(engine, "connect")
        def _connect(dbapi_conn, _record):  # type: ignore[no-untyped-def]
            dbapi_conn.isolation_level = None  # we issue BEGIN ourselves
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA synchronous=NORMAL")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.execute("PRAGMA busy_timeout=30000")
            cur.close()

        @event.listens_for(engine, "begin")
        def _begin(conn):  # type: ignore[no-untyped-def]
            read = conn.get_execution_options().get("harness_read", False)
            conn.exec_driver_sql("BEGIN" if read else "BEGIN IMMEDIATE")

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

        @_retrying(attempts)
        def run() -> T:
            with self.write() as session:
                return fn(session)

        return run()

    def run(self, fn: Callable[[Connection], T], attempts: int = 8) -> T:
        """Like `transact`, on a bare Core connection: for hot paths with prebuilt statements,
        where the ORM session's bookkeeping would cost more than the SQL. On SQLite the
        work joins a group commit and runs under its own savepoint."""

        @_retrying(attempts)
        def go() -> T:
            if self._committer is not None:
                return self._committer.submit(fn)
            with self.engine.begin() as conn:
                return fn(conn)

        return go()

    def query(self, fn: Callable[[Connection], T]) -> T:
        """A read-only Core transaction."""
        with self._reader.begin() as conn:
            return fn(conn)

    def migrate(self, migrations_dir: Path, version_table: str) -> None:
        """Bring the schema to the newest Alembic revision."""
        from alembic import command
        from alembic.config import Config

        cfg = Config()
        cfg.set_main_option("script_location", str(migrations_dir))
        cfg.attributes["version_table"] = version_table
        with self.engine.connect() as conn:
            cfg.attributes["connection"] = conn
            command.upgrade(cfg, "head")
            conn.commit()

    def ping(self) -> None:
        with self.read() as s:
            s.execute(text("SELECT 1"))

    def dispose(self) -> None:
        if self._committer is not None:
            self._committer.close()
        self.engine.dispose()


def run_migrations(context, metadata: MetaData) -> None:  # type: ignore[no-untyped-def]
    """Body of every service's migrations/env.py (online mode only)."""
    conn = context.config.attributes["connection"]
    context.configure(
        connection=conn,
        target_metadata=metadata,
        version_table=context.config.attributes["version_table"],
        render_as_batch=conn.dialect.name == "sqlite",
    )
    with context.begin_transaction():
        context.run_migrations()

