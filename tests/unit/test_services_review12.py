"""The shared infrastructure (services/*) after review 12: shutdown order, configuration types, lock contention on
SQLite, watch streams at close, page tokens, the launcher's log file and reading every page."""

from __future__ import annotations

import base64
import json
import sqlite3
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from sqlalchemy import Column, Integer, MetaData, String, Table, event, insert, select, text
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from services import config as cfg
from services import db as dbmod
from services import paging, server
from services.config import ConfigError
from services.db import Database
from services.errors import InvalidArgument
from services.tls import plain_channel
from services.watch import Broadcaster

TIMEOUT = 30.0


# -- 1: a graceful stop lets calls in flight finish before the database closes ----------------------------------
class _Recorded:
    """The gRPC server of a Running, recording when it is stopped and running `after_stop` right after."""

    def __init__(self, real: grpc.Server, steps: list[str], after_stop) -> None:  # noqa: ANN001
        self.real, self.steps, self.after_stop = real, steps, after_stop

    def stop(self, grace):  # noqa: ANN001, ANN201
        done = self.real.stop(grace)       # new calls are refused from here; those in flight may finish
        self.steps.append("server.stop")
        self.after_stop()
        return done


def test_a_write_in_flight_during_a_graceful_stop_completes_and_the_stream_ends_first(tmp_path: Path) -> None:
    meta = MetaData()
    rows = Table("t", meta, Column("id", Integer, primary_key=True), Column("v", String))
    url = f"sqlite:///{tmp_path / 'x.db'}"
    db = Database(url)
    meta.create_all(db.engine)
    entered, release = threading.Event(), threading.Event()
    watchers: Broadcaster[bytes] = Broadcaster()
    steps: list[str] = []

    def write(request, context):  # noqa: ANN001, ANN202 - a write call in flight when the stop begins
        entered.set()
        assert release.wait(TIMEOUT)
        db.run(lambda c: c.execute(insert(rows).values(v="in flight")))
        return b"ok"

    def watch(request, context):  # noqa: ANN001, ANN202 - a stream that would hold the grace period open
        yield from watchers.stream(lambda: [b"snapshot"], context.is_active)

    def register(s: grpc.Server) -> None:
        s.add_generic_rpc_handlers([grpc.method_handlers_generic_handler("demo.Demo", {
            "Write": grpc.unary_unary_rpc_method_handler(write),
            "Watch": grpc.unary_stream_rpc_method_handler(watch)})])

    def quiesce() -> None:
        steps.append("quiesce")
        watchers.close()

    def stop() -> None:
        steps.append("stop")
        db.dispose()

    running = server.start("127.0.0.1:0", [server.Component("demo", register, ["demo.Demo"], quiesce=quiesce,
                                                            stop=stop)])
    running.server = _Recorded(running.server, steps, release.set)    # type: ignore[assignment]
    channel = plain_channel(f"127.0.0.1:{running.port}")
    outcome: dict[str, object] = {}

    def call() -> None:
        try:
            outcome["write"] = channel.unary_unary("/demo.Demo/Write")(b"", timeout=TIMEOUT)
        except grpc.RpcError as e:
            outcome["write"] = (e.code(), e.details())

    stream = channel.unary_stream("/demo.Demo/Watch")(b"", timeout=TIMEOUT)
    try:
        assert next(stream) == b"snapshot"
        caller = threading.Thread(target=call)
        caller.start()
        assert entered.wait(TIMEOUT)
        running.stop(grace=TIMEOUT)      # returns when the write is done and the stream has ended
        caller.join(TIMEOUT)
        assert outcome["write"] == b"ok"
        assert list(stream) == []                    # ended by quiesce, not cancelled at the end of the grace
        assert steps == ["quiesce", "server.stop", "stop"]
        with pytest.raises(grpc.RpcError) as refused:    # stopped: no new call
            channel.unary_unary("/demo.Demo/Write")(b"", timeout=TIMEOUT)
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
    finally:
        channel.close()
        release.set()
    after = Database(url)
    try:
        assert after.query(lambda c: c.execute(select(rows.c.v)).scalars().all()) == ["in flight"]
    finally:
        after.dispose()


def test_a_component_that_fails_to_quiesce_is_still_stopped() -> None:
    stopped = threading.Event()

    def fail() -> None:
        raise RuntimeError("quiesce failed")

    running = server.start("127.0.0.1:0", [server.Component("demo", lambda s: None, [], quiesce=fail,
                                                            stop=stopped.set)])
    running.stop(grace=1.0)
    assert stopped.is_set()


# -- 2: configuration values of the wrong type are refused, naming the setting --------------------------------
@dataclass
class Typed:
    name: str = "n"
    count: int = 4
    ratio: float = 0.5
    debug: bool = False


def _yaml(tmp_path: Path, body: str) -> str:
    p = tmp_path / "h.yaml"
    p.write_text("svc:\n" + body)
    return str(p)


@pytest.mark.parametrize("body, setting, expected", [
    ("  name:\n", "svc.name", "expected str"),                    # empty: None, not the text "None"
    ("  name: [a, b]\n", "svc.name", "expected str"),
    ("  name: {a: 1}\n", "svc.name", "expected str"),
    ("  count: 2.9\n", "svc.count", "expected int"),
    ("  count: true\n", "svc.count", "expected int"),
    ("  count:\n", "svc.count", "expected int"),
    ("  debug: 0.5\n", "svc.debug", "expected bool"),
    ("  debug: 2\n", "svc.debug", "expected bool"),
    ("  debug: [x]\n", "svc.debug", "expected bool"),
    ("  debug:\n", "svc.debug", "expected bool"),
    ("  ratio: .nan\n", "svc.ratio", "expected float"),
    ("  ratio: .inf\n", "svc.ratio", "expected float"),
    ("  ratio: true\n", "svc.ratio", "expected float"),
])
def test_a_yaml_value_of_the_wrong_type_is_refused_naming_the_setting(tmp_path: Path, body: str, setting: str,
                                                                      expected: str) -> None:
    with pytest.raises(ConfigError) as e:
        cfg.load(Typed, "svc", config_file=_yaml(tmp_path, body), environ={})
    assert setting in str(e.value) and expected in str(e.value)


@pytest.mark.parametrize("variable, value", [("RATIO", "nan"), ("RATIO", "-inf"), ("RATIO", "1e999"),
                                             ("COUNT", "2.5"), ("DEBUG", "2")])
def test_an_environment_value_of_the_wrong_type_is_refused(variable: str, value: str) -> None:
    with pytest.raises(ConfigError) as e:
        cfg.load(Typed, "svc", environ={f"HARNESS_SVC_{variable}": value})
    assert f"HARNESS_SVC_{variable}" in str(e.value)


def test_values_of_the_right_type_are_taken(tmp_path: Path) -> None:
    c = cfg.load(Typed, "svc", config_file=_yaml(tmp_path, "  name: 7\n  count: 3.0\n  ratio: 2\n  debug: 1\n"),
                 environ={})
    assert c == Typed(name="7", count=3, ratio=2.0, debug=True)
    assert isinstance(c.count, int) and isinstance(c.ratio, float)
    assert cfg.load(Typed, "svc", config_file=_yaml(tmp_path, "  name: ''\n  debug: 0\n"), environ={}) == \
        Typed(name="", debug=False)
    assert cfg.load(Typed, "svc", environ={"HARNESS_SVC_COUNT": " 12 ", "HARNESS_SVC_RATIO": "1e-3"}) == \
        Typed(count=12, ratio=0.001)


def test_every_service_default_and_the_readme_example_still_load(tmp_path: Path) -> None:
    from services.catalog import SERVICES, config_sections

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    example = readme.split("```yaml\ncrs:", 1)[1].split("```", 1)[0]
    path = tmp_path / "readme.yaml"
    path.write_text("crs:" + example)
    for entry in SERVICES.values():
        cls = entry.load()[0]
        assert cfg.load(cls, entry.section, environ={}) == cls()
        cfg.load(cls, entry.section, config_file=path, environ={}, sections=config_sections())


# -- 4: lock contention is told by SQLite's result code, from BEGIN too -----------------------------------------
@pytest.fixture
def contended(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):  # noqa: ANN201
    """A Database whose writers fail at once on a lock (no busy wait), another connection holding the write lock
    ("another process"), and the number of conflicts seen: the first one releases that lock."""
    path = tmp_path / "x.db"
    db = Database(f"sqlite:///{path}")

    @event.listens_for(db.engine, "connect")
    def _no_wait(dbapi_conn, _record):  # noqa: ANN001, ANN202 - after the service's own hook
        dbapi_conn.execute("PRAGMA busy_timeout=0")

    db.run(lambda c: c.execute(text("CREATE TABLE t (n INTEGER)")))
    other = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    other.execute("BEGIN IMMEDIATE")
    conflicts: list[BaseException] = []
    real = dbmod._is_transient

    def classify(exc: BaseException) -> bool:
        transient = real(exc)
        if transient:
            conflicts.append(exc)
            if other.in_transaction:
                other.rollback()            # the other writer is done: the retry gets the lock
        return transient

    monkeypatch.setattr(dbmod, "_is_transient", classify)
    yield db, conflicts
    other.close()
    db.dispose()


@pytest.mark.parametrize("path", ["transact", "run"])
def test_a_busy_begin_immediate_is_a_transient_conflict_and_retried(contended, path: str) -> None:
    db, conflicts = contended
    insert_one = text("INSERT INTO t VALUES (1)")
    if path == "transact":
        db.transact(lambda s: s.execute(insert_one))
    else:
        db.run(lambda c: c.execute(insert_one))
    assert len(conflicts) == 1
    assert isinstance(conflicts[0], OperationalError)                  # SQLAlchemy's, as any statement's
    assert conflicts[0].orig.sqlite_errorcode == sqlite3.SQLITE_BUSY   # type: ignore[union-attr]
    assert db.query(lambda c: c.execute(text("SELECT count(*) FROM t")).scalar()) == 1


def test_a_permanent_error_whose_parameters_say_locked_is_not_retried(tmp_path: Path) -> None:
    db = Database(f"sqlite:///{tmp_path / 'x.db'}")
    calls = []

    def fn(c) -> None:  # noqa: ANN001
        calls.append(1)
        c.execute(text("INSERT INTO no_such_table VALUES (:n)"), {"n": "unlocked-gpu"})

    try:
        with pytest.raises(OperationalError, match="no such table"):
            db.run(fn)
        assert len(calls) == 1
    finally:
        db.dispose()


def _sqlite_error(message: str, code: int | None) -> sqlite3.OperationalError:
    e = sqlite3.OperationalError(message)
    if code is not None:
        e.sqlite_errorcode = code          # type: ignore[attr-defined]
    return e


@pytest.mark.parametrize("error, transient", [
    (_sqlite_error("database is locked", 5), True),                          # SQLITE_BUSY
    (_sqlite_error("database table is locked", 6), True),                    # SQLITE_LOCKED
    (_sqlite_error("database is locked", 517), True),                        # SQLITE_BUSY_SNAPSHOT
    (_sqlite_error("database table is locked: t", 262), True),               # SQLITE_LOCKED_SHAREDCACHE
    (OperationalError("BEGIN IMMEDIATE", (), _sqlite_error("database is locked", 5)), True),
    (OperationalError("INSERT INTO t VALUES (?)", ("locked",), _sqlite_error("no such table: t", 1)), False),
    (_sqlite_error("locked", None), False),                                  # no result code: not told by words
    (RuntimeError("database is locked"), False),
])
def test_transient_is_told_by_the_drivers_code(error: BaseException, transient: bool) -> None:
    assert dbmod._is_transient(error) is transient


# -- 5: a watch stream whose queue is full when the broadcaster closes still ends -------------------------------
def test_a_stream_with_a_full_queue_ends_on_close() -> None:
    b: Broadcaster[int] = Broadcaster(max_backlog=3)
    stream = b.stream(lambda: [0], is_active=lambda: True)
    assert next(stream) == 0                 # subscribed; the watcher is a little behind from here
    b.publish([1, 2, 3])                     # its queue is exactly full: no room for the end marker
    b.close()
    got: list[int] = []
    done = threading.Event()

    def drain() -> None:
        got.extend(stream)
        done.set()

    threading.Thread(target=drain, daemon=True).start()
    assert done.wait(TIMEOUT), "the stream did not end after close()"
    assert got == [1, 2, 3]                  # what was queued, then the end


# -- 6: a page token holding an integer no 64-bit column holds is INVALID_ARGUMENT ------------------------------
class _Base(DeclarativeBase):
    pass


class _Row(_Base):
    __tablename__ = "rows"
    seq: Mapped[int] = mapped_column(Integer, primary_key=True)


def _token(key: object) -> str:
    return base64.urlsafe_b64encode(json.dumps(key).encode()).decode()


@pytest.mark.parametrize("key", [[10 ** 19], [-(2 ** 63) - 1], [2 ** 63], [2.5], [3.0]])
def test_a_token_out_of_an_integer_columns_range_is_invalid(tmp_path: Path, key: list) -> None:
    db = Database(f"sqlite:///{tmp_path / 'p.db'}")
    _Base.metadata.create_all(db.engine)
    try:
        with db.read() as s, pytest.raises(InvalidArgument) as e:
            paging.page(s, select(_Row), [_Row.seq], 2, _token(key))
        assert e.value.violations[0].field == "page_token"
    finally:
        db.dispose()


def test_a_token_at_the_edges_of_the_integer_range_is_taken(tmp_path: Path) -> None:
    db = Database(f"sqlite:///{tmp_path / 'p.db'}")
    _Base.metadata.create_all(db.engine)
    try:
        with db.write() as s:
            s.add_all([_Row(seq=i) for i in (1, 2, 3)])
        with db.read() as s:
            assert [r.seq for r in paging.page(s, select(_Row), [_Row.seq], 5, _token([2 ** 63 - 1]))[0]] == []
            assert [r.seq for r in paging.page(s, select(_Row), [_Row.seq], 5, _token([-(2 ** 63)]))[0]] == [1, 2, 3]
            assert [r.seq for r in paging.page(s, select(_Row), [_Row.seq], 5, _token([1]))[0]] == [2, 3]
    finally:
        db.dispose()


# -- minor: the launcher closes a service's log file; all_pages leaves the request alone and stops on a loop ----
def test_the_launcher_closes_the_log_file_when_the_process_exits(tmp_path: Path) -> None:
    from services.launcher import ServiceProcess

    proc = subprocess.Popen([sys.executable, "-c", "import sys; sys.stderr.write('a line\\n')"],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    sp = ServiceProcess("x", "x", proc)
    log = open(tmp_path / "x.log", "a")  # noqa: SIM115 - the launcher closes it
    sp._log_file = log
    sp._pump()                               # to the end of its stderr
    proc.wait(TIMEOUT)
    assert log.closed
    assert (tmp_path / "x.log").read_text() == "a line\n"


def test_all_pages_leaves_the_request_alone_and_stops_on_a_repeated_token() -> None:
    from harness.v1 import irm_pb2
    from services.client import RepeatedPageToken, all_pages

    request = irm_pb2.ListReservationsRequest(tenant="t")
    pages = {"": "a", "a": "b", "b": "a"}            # the server loops: a, b, a, ...
    asked: list[str] = []

    def call(req, timeout):  # noqa: ANN001, ANN202
        asked.append(req.page_token)
        assert len(asked) < 10, "all_pages keeps asking for the same pages"
        return irm_pb2.ListReservationsResponse(reservations=[irm_pb2.Reservation(id=req.page_token or "first")],
                                                next_page_token=pages[req.page_token])

    with pytest.raises(RepeatedPageToken) as e:
        all_pages(call, request, "reservations")
    assert isinstance(e.value, grpc.RpcError) and e.value.code() == grpc.StatusCode.INTERNAL
    assert "'a'" in e.value.details()
    assert asked == ["", "a", "b"]
    assert request.page_token == ""                  # the caller's request is as it was
    pages["b"] = ""
    assert [r.id for r in all_pages(call, request, "reservations").reservations] == ["first", "a", "b"]
    assert request.page_token == ""


def test_a_bounded_message_keeps_its_head_and_its_ending() -> None:
    from services.errors import MAX_MESSAGE_BYTES, bounded

    relayed = "compute IRM 'c': groups[0].name: " + "x" * 5000 + "; nothing was reserved"
    cut = bounded(relayed)
    assert len(cut.encode()) <= MAX_MESSAGE_BYTES
    assert cut.startswith("compute IRM 'c': groups[0].name: xx") and cut.endswith("; nothing was reserved")
    assert f"{len(relayed)} bytes in all" in cut
    wide = bounded("é" * 5000)                  # never a broken character at either cut
    assert len(wide.encode()) <= MAX_MESSAGE_BYTES and wide.startswith("éé") and wide.endswith("éé")
    assert bounded("short") == "short"
