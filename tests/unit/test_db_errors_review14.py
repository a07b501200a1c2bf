"""A database failing for a reason of its environment (a full disk, a read-only or unopenable file, a PostgreSQL
server out of space, memory or connections, shutting down or unreachable) is UNAVAILABLE with the reason
DATABASE_UNAVAILABLE and a RetryInfo, saying what the database said (never the SQL or its parameters), not
INTERNAL "OperationalError; see the service log"; after 3 such calls in a row the server reports NOT_SERVING, and
SERVING again once the work succeeds (a call, or a component's probe). Anything else stays INTERNAL (review 14).

The full disk is real: SQLite's `PRAGMA max_page_count` caps the file, and SQLite answers SQLITE_FULL ("database
or disk is full") exactly as on a full disk."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import psycopg
import psycopg.errors
import pytest
from google.rpc import error_details_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_status import rpc_status
from sqlalchemy import event, text
from sqlalchemy.exc import IntegrityError, OperationalError

from harness.v1 import common_pb2, diagnostics_pb2, diagnostics_pb2_grpc, irm_pb2, irm_pb2_grpc
from irm_compute.service import ComputeConfig
from irm_compute.service import component as compute_component
from services import errors, server
from services.db import Database, unavailability, unavailable_error
from services.tls import plain_channel
from tests.conftest import eventually

TIMEOUT = 30
RM = "harness.v1.ResourceManager"
BLOB = 16 * 1024          # bytes a Reserve writes: 4 pages
MAX_PAGES = 40            # the file's cap: a few writes fill it


# -- a tiny service that writes ----------------------------------------------------------------------------------

class Writer(irm_pb2_grpc.ResourceManagerServicer):
    """Reserve writes a blob; GetReservation reads a table that does not exist (a bug, not the environment);
    ReleaseReservation raises a constraint violation (the request's fault, not the environment's)."""

    def __init__(self, db: Database) -> None:
        self.db = db

    def Reserve(self, request, context):  # noqa: N802
        self.db.run(lambda c: c.execute(text("INSERT INTO blobs (data) VALUES (randomblob(:n))"), {"n": BLOB}))
        return irm_pb2.Reservation(id=request.request_id)

    def GetReservation(self, request, context):  # noqa: N802
        with self.db.read() as s:
            s.execute(text("SELECT * FROM no_such_table"))
        return irm_pb2.Reservation()

    def ReleaseReservation(self, request, context):  # noqa: N802
        self.db.run(lambda c: c.execute(text("INSERT INTO blobs (id, data) VALUES (1, x'00')")))
        self.db.run(lambda c: c.execute(text("INSERT INTO blobs (id, data) VALUES (1, x'00')")))
        return irm_pb2.Reservation()

    def probe(self) -> None:
        """A write: raises while the database is full."""
        self.db.run(lambda c: c.execute(text("INSERT INTO blobs (data) VALUES (randomblob(:n))"), {"n": BLOB}))
        self.db.run(lambda c: c.execute(text("DELETE FROM blobs WHERE id = (SELECT max(id) FROM blobs)")))


@dataclass
class Served:
    path: Path
    db: Database
    rm: irm_pb2_grpc.ResourceManagerStub
    health: health_pb2_grpc.HealthStub
    echo: diagnostics_pb2_grpc.DiagnosticsStub

    def status(self, service: str = RM) -> int:
        return self.health.Check(health_pb2.HealthCheckRequest(service=service), timeout=TIMEOUT).status

    def free_space(self) -> None:
        """The operator's fix: what filled the file is deleted (on a connection of its own, without the cap)."""
        with sqlite3.connect(self.path) as conn:
            conn.execute("DELETE FROM blobs")


def serve_writer(tmp_path: Path, probe: bool = False, probe_interval_s: float = 3600.0) -> Iterator[Served]:
    path = tmp_path / "w.db"
    db = Database(f"sqlite:///{path}")

    @event.listens_for(db.engine, "connect")
    def _cap(dbapi_conn, _record):  # type: ignore[no-untyped-def]
        dbapi_conn.execute(f"PRAGMA max_page_count = {MAX_PAGES}")

    db.run(lambda c: c.execute(text("CREATE TABLE blobs (id INTEGER PRIMARY KEY, data BLOB)")))
    writer = Writer(db)
    comp = server.Component(name="writer", register=lambda s: irm_pb2_grpc.add_ResourceManagerServicer_to_server(
        writer, s), service_names=[RM], probe=writer.probe if probe else None)
    db_health = server.DatabaseHealth(probe_interval_s=probe_interval_s)
    running = server.start("127.0.0.1:0", [comp], db_health=db_health)
    channel = plain_channel(f"127.0.0.1:{running.port}")
    try:
        yield Served(path, db, irm_pb2_grpc.ResourceManagerStub(channel), health_pb2_grpc.HealthStub(channel),
                     diagnostics_pb2_grpc.DiagnosticsStub(channel))
    finally:
        channel.close()
        running.stop(0)
        db.dispose()


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Served]:
    yield from serve_writer(tmp_path)


def reserve(s: Served, rid: str) -> grpc.RpcError | None:
    try:
        s.rm.Reserve(irm_pb2.ReserveRequest(tenant="t", request_id=rid), timeout=TIMEOUT)
    except grpc.RpcError as e:
        return e
    return None


def fill(s: Served) -> grpc.RpcError:
    """Reserve until the file is full: the first refusal."""
    for i in range(MAX_PAGES):
        if (e := reserve(s, f"fill-{i}")) is not None:
            return e
    raise AssertionError(f"{MAX_PAGES} writes of {BLOB} bytes never filled a file of {MAX_PAGES} pages")


def details(e: grpc.RpcError) -> tuple[error_details_pb2.ErrorInfo | None, float | None]:
    status = rpc_status.from_call(e)  # type: ignore[arg-type]
    info, retry = None, None
    for d in status.details if status is not None else []:
        if d.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            info = error_details_pb2.ErrorInfo()
            d.Unpack(info)
        elif d.Is(error_details_pb2.RetryInfo.DESCRIPTOR):
            r = error_details_pb2.RetryInfo()
            d.Unpack(r)
            retry = r.retry_delay.ToNanoseconds() / 1e9
    return info, retry


# -- SQLite, for real, over gRPC -----------------------------------------------------------------------------------

def test_a_full_database_is_unavailable_with_its_reason_and_a_retry_delay(served: Served) -> None:
    e = fill(served)
    assert e.code() == grpc.StatusCode.UNAVAILABLE, e.details()
    info, retry = details(e)
    assert info is not None and (info.reason, info.domain) == ("DATABASE_UNAVAILABLE", "harness.v1")
    assert dict(info.metadata) == {"database": "sqlite", "code": "SQLITE_FULL"}
    assert retry is not None and retry > 0
    assert "database or disk is full" in e.details()
    assert "INSERT" not in e.details() and "randomblob" not in e.details() and "OperationalError" not in e.details()


def test_three_database_failures_in_a_row_are_not_serving_until_a_write_succeeds(served: Served) -> None:
    assert served.status() == health_pb2.HealthCheckResponse.SERVING
    fill(served)                                                    # failure 1
    assert reserve(served, "again-2") is not None                   # failure 2
    assert served.status() == health_pb2.HealthCheckResponse.SERVING
    # A call that never failed on the database (a health check, an echo) neither counts nor clears.
    assert served.echo.Echo(diagnostics_pb2.EchoRequest(payload=b"x"), timeout=TIMEOUT).payload == b"x"
    assert reserve(served, "again-3") is not None                   # failure 3
    for service in (RM, ""):
        assert served.status(service) == health_pb2.HealthCheckResponse.NOT_SERVING
    served.free_space()
    assert reserve(served, "after-the-fix") is None
    for service in (RM, ""):
        assert served.status(service) == health_pb2.HealthCheckResponse.SERVING


def test_a_probe_brings_serving_back_without_a_call(tmp_path: Path) -> None:
    gen = serve_writer(tmp_path, probe=True, probe_interval_s=0.05)
    served = next(gen)
    try:
        fill(served)
        for i in range(2):
            assert reserve(served, f"again-{i}") is not None
        assert served.status() == health_pb2.HealthCheckResponse.NOT_SERVING
        served.free_space()
        eventually(lambda: served.status() == health_pb2.HealthCheckResponse.SERVING, timeout=TIMEOUT,
                   what="the probe's write to succeed")
    finally:
        gen.close()


def test_other_database_errors_stay_internal_and_do_not_count(served: Served) -> None:
    for _ in range(3):
        with pytest.raises(grpc.RpcError) as bug:                     # a bug: a table that does not exist
            served.rm.GetReservation(irm_pb2.GetReservationRequest(tenant="t", reservation_id="r"),
                                     timeout=TIMEOUT)
        assert bug.value.code() == grpc.StatusCode.INTERNAL
        assert details(bug.value) == (None, None)
        with pytest.raises(grpc.RpcError) as dup:                     # a constraint: not the environment either
            served.rm.ReleaseReservation(irm_pb2.ReleaseReservationRequest(tenant="t", reservation_id="r"),
                                         timeout=TIMEOUT)
        assert dup.value.code() == grpc.StatusCode.INTERNAL
    assert served.status() == health_pb2.HealthCheckResponse.SERVING


# -- the compute IRM's ReserveBatch: each request's outcome is UNAVAILABLE too -----------------------------------

def test_compute_reserve_batch_on_a_full_database_answers_unavailable_outcomes(tmp_path: Path) -> None:
    (tmp_path / "hosts.yaml").write_text("hosts:\n  - {id: a, cores: 64, memory_gb: 256}\n")
    comp = compute_component(ComputeConfig(state_dir=str(tmp_path), address="127.0.0.1:0",
                                           inventory=str(tmp_path / "hosts.yaml")))
    running = server.start("127.0.0.1:0", [comp])
    channel = plain_channel(f"127.0.0.1:{running.port}")
    rm = irm_pb2_grpc.ResourceManagerStub(channel)
    irm = comp.extra["irm"]
    try:
        # The writes' connection (the group commit's) may not grow the file any more.
        irm.db.run(lambda c: c.exec_driver_sql("PRAGMA max_page_count = 1"))
        group = irm_pb2.ResourceGroup(name="g", resource_type="vm", count=1, attributes={
            "cores": common_pb2.AttributeRequest(number=1), "memory_gb": common_pb2.AttributeRequest(number=1)})
        for i in range(2000):           # reserve and release until a page is needed
            try:
                r = rm.Reserve(irm_pb2.ReserveRequest(tenant="t", request_id=f"r{i}", groups=[group]),
                               timeout=TIMEOUT)
                rm.ReleaseReservation(irm_pb2.ReleaseReservationRequest(tenant="t", reservation_id=r.id),
                                      timeout=TIMEOUT)
            except grpc.RpcError as e:
                assert e.code() == grpc.StatusCode.UNAVAILABLE, e.details()
                assert details(e)[0].reason == "DATABASE_UNAVAILABLE"
                break
        else:
            raise AssertionError("the database never filled")
        reply = rm.ReserveBatch(irm_pb2.ReserveBatchRequest(requests=[
            irm_pb2.ReserveRequest(tenant="t", request_id=f"b{i}", groups=[group]) for i in range(2)]),
            timeout=TIMEOUT)
        for outcome in reply.outcomes:
            assert outcome.error.code == grpc.StatusCode.UNAVAILABLE.value[0], outcome
            assert "database or disk is full" in outcome.error.message
            reasons = []
            for d in outcome.error.details:
                if d.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
                    info = error_details_pb2.ErrorInfo()
                    d.Unpack(info)
                    reasons.append(info.reason)
            assert reasons == ["DATABASE_UNAVAILABLE"]
    finally:
        channel.close()
        running.stop(0)


# -- the classification itself -------------------------------------------------------------------------------------

def _wrapped(orig: Exception) -> OperationalError:
    """As SQLAlchemy raises it: the statement and its parameters held beside the driver's error."""
    return OperationalError("INSERT INTO compute_reservations (tenant) VALUES (%(t)s)", {"t": "secret-tenant"}, orig)


def test_postgresql_disk_full_is_database_unavailable_without_sql_or_parameters() -> None:
    exc = _wrapped(psycopg.errors.DiskFull('could not extend file "base/16384/2619": No space left on device'))
    why = unavailability(exc)
    assert why is not None and (why.database, why.code) == ("postgresql", "53100")
    error = unavailable_error(exc)
    assert error is not None and error.code == grpc.StatusCode.UNAVAILABLE
    assert (error.reason, error.retry_after_s) == (errors.DATABASE_UNAVAILABLE, errors.RETRY_LATER_S)
    assert error.metadata == {"database": "postgresql", "code": "53100"}
    assert "No space left on device" in error.message
    assert "INSERT" not in error.message and "secret-tenant" not in error.message


@pytest.mark.parametrize("orig", [
    psycopg.errors.OutOfMemory("out of memory"),                          # 53200
    psycopg.errors.TooManyConnections("sorry, too many clients already"),  # 53300
    psycopg.errors.AdminShutdown("terminating connection due to administrator command"),  # 57P01
    psycopg.errors.ConnectionFailure("connection failure"),                # 08006
    psycopg.OperationalError('connection failed: connection to server at "127.0.0.1", port 1 failed'),  # no SQLSTATE
], ids=["53200", "53300", "57P01", "08006", "no-sqlstate"])
def test_postgresql_environment_failures_are_database_unavailable(orig: Exception) -> None:
    assert unavailable_error(_wrapped(orig)) is not None
    assert unavailable_error(orig) is not None          # raw too (a commit on the driver connection)


@pytest.mark.parametrize("exc", [
    IntegrityError("INSERT ...", {}, psycopg.errors.UniqueViolation("duplicate key")),
    _wrapped(psycopg.errors.UndefinedTable('relation "x" does not exist')),
    ValueError("a bug"),
    sqlite3.IntegrityError("UNIQUE constraint failed"),
], ids=["unique", "undefined-table", "value-error", "sqlite-integrity"])
def test_other_errors_are_not_the_databases_environment(exc: Exception) -> None:
    assert unavailability(exc) is None


def test_sqlite_readonly_and_cantopen_are_database_unavailable(tmp_path: Path) -> None:
    path = tmp_path / "ro.db"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE t (x)")
    conn.close()
    ro = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    with pytest.raises(sqlite3.OperationalError) as readonly:
        ro.execute("INSERT INTO t VALUES (1)")
    ro.close()
    with pytest.raises(sqlite3.OperationalError) as cantopen:
        sqlite3.connect(tmp_path / "no-such-dir" / "x.db")
    assert unavailability(readonly.value).code == "SQLITE_READONLY"
    assert unavailability(cantopen.value).code == "SQLITE_CANTOPEN"


def test_database_unavailable_is_a_documented_reason() -> None:
    assert errors.DATABASE_UNAVAILABLE in errors.REASONS
    header = (Path(__file__).resolve().parents[2] / "protos/harness/v1/common.proto").read_text().split("syntax =")[0]
    assert "//   DATABASE_UNAVAILABLE UNAVAILABLE" in header


# -- what counts towards NOT_SERVING, and the probe every database-backed service has -------------------------------

def test_failures_spread_over_more_than_the_window_never_add_up(monkeypatch) -> None:
    clock = [1000.0]
    monkeypatch.setattr(server.time, "monotonic", lambda: clock[0])
    h = server.DatabaseHealth(threshold=3)
    for _ in range(5):                               # one failure every two minutes, for ten minutes
        h.failed("/x/Write")
        clock[0] += 2 * server.DB_FAILURE_WINDOW_S
    assert not h.down
    for _ in range(3):                               # three within the window: a database that fails
        h.failed("/x/Write")
        clock[0] += 1.0
    assert h.down


class _Context:
    def __init__(self) -> None:
        self.aborted: list = []

    def abort_with_status(self, status) -> None:  # type: ignore[no-untyped-def]
        self.aborted.append(status)


def test_contention_left_after_the_retries_is_unavailable_but_not_counted() -> None:
    h = server.DatabaseHealth(threshold=1)
    busy = sqlite3.OperationalError("database is locked")
    busy.sqlite_errorcode = sqlite3.SQLITE_BUSY                   # type: ignore[attr-defined]
    ctx = _Context()
    server._internal(ctx, "/x/Write", OperationalError("UPDATE t", {}, busy), h)
    (status,) = ctx.aborted
    assert status.code == grpc.StatusCode.UNAVAILABLE             # retryable, as before
    assert not h.down                                             # but load is no reason to leave service
    full = sqlite3.OperationalError("database or disk is full")
    full.sqlite_errorcode = sqlite3.SQLITE_FULL                   # type: ignore[attr-defined]
    server._internal(_Context(), "/x/Write", OperationalError("INSERT", {}, full), h)
    assert h.down


@pytest.mark.parametrize("orig", [
    psycopg.errors.SerializationFailure("could not serialize access due to concurrent update"),   # 40001
    psycopg.errors.DeadlockDetected("deadlock detected"),                                          # 40P01
], ids=["40001", "40P01"])
def test_postgresql_contention_left_after_the_retries_is_unavailable_but_not_counted(orig: Exception) -> None:
    # As SQLite's busy (README): retryable, not INTERNAL (it was: "internal error in .../Reserve: OperationalError").
    h = server.DatabaseHealth(threshold=1)
    ctx = _Context()
    server._internal(ctx, "/x/Write", _wrapped(orig), h)
    (status,) = ctx.aborted
    assert status.code == grpc.StatusCode.UNAVAILABLE
    assert unavailability(_wrapped(orig)).code == orig.sqlstate
    assert not h.down


def test_every_migrated_database_has_a_probe_write_that_fails_while_it_cannot_take_one(tmp_path: Path) -> None:
    from cross_resource_scheduler.service import MIGRATIONS

    url = f"sqlite:///{tmp_path}/crs.db"
    db = Database(url)
    with pytest.raises(RuntimeError, match="nothing to probe"):
        db.probe()
    db.migrate(MIGRATIONS, "alembic_version_crs")
    db.probe()                                                    # a healthy database takes it
    db.dispose()
    # The same file, every connection read-only (as a read-only mount makes it).
    ro = Database(url)
    event.listen(ro.engine, "connect", lambda conn, _: conn.execute("PRAGMA query_only = ON"))
    ro._version_table = "alembic_version_crs"                     # what its migrate() recorded
    try:
        with pytest.raises(OperationalError) as e:
            ro.probe()
        assert unavailability(e.value).code == "SQLITE_READONLY"
    finally:
        ro.dispose()


def test_the_crs_gives_the_server_a_probe_of_its_database(tmp_path: Path) -> None:
    from cross_resource_scheduler.service import CrsConfig
    from cross_resource_scheduler.service import component as crs_component

    comp = crs_component(CrsConfig(database=f"sqlite:///{tmp_path}/crs.db"))
    try:
        assert comp.probe is not None
        comp.probe()                                              # a write its database takes
    finally:
        comp.extra["crs"].db.dispose()
