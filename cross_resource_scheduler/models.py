"""CRS state: managers, reservations (with their per-IRM parts) and pending compensations."""

from __future__ import annotations

from sqlalchemy import (
    JSON,
    Boolean,
    Float,
    Index,
    Integer,
    LargeBinary,
    String,
    Text,
    UniqueConstraint,
    false,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from services.db import metadata as db_metadata


class Base(DeclarativeBase):
    metadata = db_metadata()


class Manager(Base):
    __tablename__ = "crs_managers"

    name: Mapped[str] = mapped_column(String(128), primary_key=True)
    address: Mapped[str] = mapped_column(String(256))
    resource_types: Mapped[list[str]] = mapped_column(JSON, default=list)
    registered_at: Mapped[float] = mapped_column(Float)


class Reservation(Base):
    __tablename__ = "crs_reservations"
    __table_args__ = (UniqueConstraint("tenant", "request_id"),)

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    tenant: Mapped[str] = mapped_column(String(128), index=True)
    request_id: Mapped[str] = mapped_column(String(128))
    # pending (being placed/delegated) -> active -> released
    state: Mapped[str] = mapped_column(String(16))
    priority: Mapped[int] = mapped_column(Integer, default=0)
    price_per_minute: Mapped[float] = mapped_column(Float, default=0.0)
    created_at: Mapped[float] = mapped_column(Float)
    released_at: Mapped[float] = mapped_column(Float, default=0.0)
    # The AllocatedGroup messages, serialised as a harness.v1.Reservation holding only
    # `groups` (protobuf bytes: the wire format is the stable schema, and fast).
    allocation: Mapped[bytes] = mapped_column(LargeBinary, default=b"")
    notes: Mapped[list[str]] = mapped_column(JSON, default=list)
    # sha256 of the request without its request_id: a replay of the id must ask for the same ("": rows from
    # before it was recorded, replayed unchecked).
    request_hash: Mapped[str] = mapped_column(String(64), default="", server_default="")
    # While pending, the CRS process placing it (owners.Owner): a restarted CRS recovers at once the rows of a
    # process that is gone, and waits out the pending horizon only for others ("": rows from before it was
    # recorded).
    owner: Mapped[str] = mapped_column(String(256), default="", server_default="")


class Compensation(Base):
    """A part of a failed or released reservation still held by an unreachable IRM."""

    __tablename__ = "crs_compensations"
    # The compensator's read: one manager's rows due, soonest first.
    __table_args__ = (Index("ix_crs_compensations_manager_next_try_at", "manager", "next_try_at"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    manager: Mapped[str] = mapped_column(String(128))
    tenant: Mapped[str] = mapped_column(String(128))
    # The IRM-side request id (service.irm_request_id), for a part whose manager reservation id is not known (a
    # Reserve that failed or was left pending: one row per id the part may have); "" when it is.
    irm_request_id: Mapped[str] = mapped_column(String(256))
    # The part's reservation id at its manager (a released reservation's part, which the allocation names): given
    # back by that id, one row per part.
    irm_reservation_id: Mapped[str] = mapped_column(Text, default="", server_default="")
    created_at: Mapped[float] = mapped_column(Float)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    # The Reserve got no definite answer: the manager may still commit it, so "absent" is not final until
    # in_doubt_horizon_s (else 3 x irm_timeout_s). Stored, as is the next try, so a restarted CRS keeps both.
    in_doubt: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    next_try_at: Mapped[float] = mapped_column(Float, default=0.0, server_default="0")
