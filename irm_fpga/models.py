"""Orchestrator state: FPGA groups, their clients, and IRM-API reservations."""

from __future__ import annotations

from sqlalchemy import JSON, Float, Integer, String, UniqueConstraint
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from services.db import metadata as db_metadata


class Base(DeclarativeBase):
    metadata = db_metadata()


class Group(Base):
    __tablename__ = "fpga_groups"
    __table_args__ = (UniqueConstraint("tenant", "request_id"),)

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    tenant: Mapped[str] = mapped_column(String(128), index=True)
    request_id: Mapped[str] = mapped_column(String(256))
    # What CreateGroup asked for, hashed (`services.idempotency.request_hash`: every field but request_id): a
    # reused request_id with another request is refused. "": not compared (a group made before it was recorded,
    # or by the Orchestrator itself: a reservation's or a job's).
    request_hash: Mapped[str] = mapped_column(String(64), default="", server_default="")
    design: Mapped[str] = mapped_column(String(64))
    size: Mapped[int] = mapped_column(Integer)
    min_size: Mapped[int] = mapped_column(Integer)
    max_size: Mapped[int] = mapped_column(Integer)
    shared: Mapped[bool] = mapped_column(default=False)
    elastic: Mapped[bool] = mapped_column(default=False)
    # server name -> devices of the group there
    parts: Mapped[dict] = mapped_column(JSON, default=dict)
    created_at: Mapped[float] = mapped_column(Float)
    deleted: Mapped[bool] = mapped_column(default=False)
    # The IRM-API reservation that created it, if any.
    reservation_id: Mapped[str] = mapped_column(String(64), default="", index=True)


class Client(Base):
    __tablename__ = "fpga_clients"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    group_id: Mapped[str] = mapped_column(String(64), index=True)
    tenant: Mapped[str] = mapped_column(String(128))
    token: Mapped[str] = mapped_column(String(128))
    # attached | detached | revoked
    state: Mapped[str] = mapped_column(String(16), default="attached")


class Reservation(Base):
    __tablename__ = "fpga_reservations"
    __table_args__ = (UniqueConstraint("tenant", "request_id"),)

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    tenant: Mapped[str] = mapped_column(String(128), index=True)
    request_id: Mapped[str] = mapped_column(String(256))
    # What Reserve asked for, hashed as Group.request_hash is; "": not compared (made before it was recorded).
    request_hash: Mapped[str] = mapped_column(String(64), default="", server_default="")
    state: Mapped[str] = mapped_column(String(16), default="active")
    price_per_minute: Mapped[float] = mapped_column(Float, default=0.0)
    created_at: Mapped[float] = mapped_column(Float)
    released_at: Mapped[float] = mapped_column(Float, default=0.0)
    # [{"name": group name, "groups": [fpga group ids], "server": ...}]
    groups: Mapped[list] = mapped_column(JSON, default=list)
