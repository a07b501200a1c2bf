"""Application Manager state (SQLAlchemy 2.0 typed ORM): applications, profiling sessions,
runs, the performance model and executions. Everything the model needs survives a restart."""

from __future__ import annotations

from sqlalchemy import (
    JSON,
    Boolean,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    String,
    Text,
    UniqueConstraint,
    false,
    text,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from services.db import metadata as db_metadata


class Base(DeclarativeBase):
    metadata = db_metadata()


class Application(Base):
    __tablename__ = "am_applications"
    __table_args__ = (UniqueConstraint("tenant", "request_id"),)

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    tenant: Mapped[str] = mapped_column(String(128), index=True)
    request_id: Mapped[str | None] = mapped_column(String(128), nullable=True)
    name: Mapped[str] = mapped_column(String(256))
    manifest: Mapped[str] = mapped_column(Text)
    slo: Mapped[str] = mapped_column(Text)
    app_dir: Mapped[str] = mapped_column(String(1024))
    created_at: Mapped[float] = mapped_column(Float)


# A running session or execution belongs to the AM process that runs it (`owner`: host:pid:tag), which marks
# it alive every few seconds (`heartbeat_at`, wall time): another process on the same database leaves it be,
# and takes it as interrupted only once its owner is gone (application_manager.owners).
_RUNNING = text("state = 'running'")


class Session(Base):
    __tablename__ = "am_sessions"
    # One running session per application, whichever AM process runs it.
    __table_args__ = (Index("uq_am_sessions_running_application", "application_id", unique=True,
                            sqlite_where=_RUNNING, postgresql_where=_RUNNING),)

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    application_id: Mapped[str] = mapped_column(ForeignKey("am_applications.id"), index=True)
    profiler: Mapped[str] = mapped_column(String(64))
    state: Mapped[str] = mapped_column(String(16))  # running | done | stopped | failed
    runs: Mapped[int] = mapped_column(Integer, default=0)
    max_runs: Mapped[int] = mapped_column(Integer)
    spent: Mapped[float] = mapped_column(Float, default=0.0)
    message: Mapped[str] = mapped_column(Text, default="")
    params: Mapped[dict] = mapped_column(JSON)
    started_at: Mapped[float] = mapped_column(Float)
    ended_at: Mapped[float] = mapped_column(Float, default=0.0)
    owner: Mapped[str | None] = mapped_column(String(128), nullable=True)
    heartbeat_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    # StopProfiling through another AM process: the owner's heartbeat sees it and stops the session.
    stop_requested: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    # Ended as interrupted, the reservations its runs left not yet confirmed released at the CRS: every sweep
    # tries again until it is (a CRS out of reach when the row ended would leave them reserved for good).
    release_pending: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())


class Run(Base):
    __tablename__ = "am_runs"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    application_id: Mapped[str] = mapped_column(ForeignKey("am_applications.id"), index=True)
    session_id: Mapped[str] = mapped_column(String(64))
    ordinal: Mapped[int] = mapped_column(Integer)
    config: Mapped[dict] = mapped_column(JSON)
    input: Mapped[str] = mapped_column(String(16))
    ok: Mapped[bool] = mapped_column(Boolean)
    error: Mapped[str] = mapped_column(Text, default="")
    time_s: Mapped[float] = mapped_column(Float)
    cost: Mapped[float] = mapped_column(Float)
    cpu_percent: Mapped[float | None] = mapped_column(Float, nullable=True)
    memory_percent: Mapped[float | None] = mapped_column(Float, nullable=True)
    reason: Mapped[str] = mapped_column(Text, default="")
    created_at: Mapped[float] = mapped_column(Float)
    # Failed through no fault of the configuration (capacity refused, run lost, the caller's timeout): kept for
    # audit, left out of the model and of later sessions' search (profilers.base.Observation.transient).
    transient: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())


class Model(Base):
    __tablename__ = "am_models"

    application_id: Mapped[str] = mapped_column(ForeignKey("am_applications.id"), primary_key=True)
    # [{"config": {...}, "time_s", "cost", "predicted"}], fastest first.
    frontier: Mapped[list] = mapped_column(JSON)
    # Predicted points of extrapolated profiling: same shape as frontier entries.
    predictions: Mapped[list] = mapped_column(JSON)
    extrapolation: Mapped[dict | None] = mapped_column(JSON, nullable=True)
    updated_at: Mapped[float] = mapped_column(Float)


class Execution(Base):
    __tablename__ = "am_executions"
    __table_args__ = (UniqueConstraint("tenant", "request_id"),)

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    application_id: Mapped[str] = mapped_column(ForeignKey("am_applications.id"), index=True)
    tenant: Mapped[str] = mapped_column(String(128), index=True)
    request_id: Mapped[str | None] = mapped_column(String(128), nullable=True)
    state: Mapped[str] = mapped_column(String(16))  # running | succeeded | failed
    config: Mapped[dict] = mapped_column(JSON)
    slo: Mapped[str] = mapped_column(Text)
    predicted_time_s: Mapped[float] = mapped_column(Float)
    predicted_cost: Mapped[float] = mapped_column(Float)
    measured_time_s: Mapped[float] = mapped_column(Float, default=0.0)
    measured_cost: Mapped[float] = mapped_column(Float, default=0.0)
    slo_met: Mapped[bool] = mapped_column(Boolean, default=False)
    error: Mapped[str] = mapped_column(Text, default="")
    output_tail: Mapped[str] = mapped_column(Text, default="")
    reservation_id: Mapped[str] = mapped_column(String(64), default="")
    started_at: Mapped[float] = mapped_column(Float)
    ended_at: Mapped[float] = mapped_column(Float, default=0.0)
    owner: Mapped[str | None] = mapped_column(String(128), nullable=True)
    heartbeat_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    # As Session.release_pending.
    release_pending: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())


class Release(Base):
    """A reservation a run may have left at the CRS: its release failed (the CRS away or slow as the run ended), or
    its Reserve failed without an answer (the CRS may have placed it). Every sweep, in any AM process, tries again
    until the CRS confirms nothing is held under it, then deletes the row. Its request id is the ended run's own:
    no run in progress reserves under it."""
    __tablename__ = "am_releases"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    tenant: Mapped[str] = mapped_column(String(128))
    request_id: Mapped[str] = mapped_column(String(128))
    # Known when the release failed; empty for a Reserve in doubt, until GetReservation by its request id finds it.
    reservation_id: Mapped[str] = mapped_column(String(64), default="")
    # The Reserve in doubt (a serialized harness.v1.ReserveRequest), for an operator to see what it asked for; the
    # sweeps learn its outcome from GetReservation by its request id, never by reserving again.
    reserve_request: Mapped[bytes | None] = mapped_column(LargeBinary, nullable=True)
    created_at: Mapped[float] = mapped_column(Float)
    # Refusals in a row that waiting does not cure (PERMISSION_DENIED, FAILED_PRECONDITION...), and when a sweep asks
    # the CRS again (service clock): a row refused for good costs a call and a log line an hour, not one a sweep.
    attempts: Mapped[int] = mapped_column(Integer, default=0, server_default=text("0"))
    next_try_at: Mapped[float] = mapped_column(Float, default=0.0, server_default=text("0"))
