"""Compute IRM state (SQLAlchemy 2.0 typed ORM).

Capacity is counted in integers (cores, MiB) so the no-overbooking invariant
is exact: for every host, the sum of its active VMs equals `used_*` and never
exceeds the capacity.
"""

from __future__ import annotations

from sqlalchemy import JSON, Float, ForeignKey, Index, Integer, String, UniqueConstraint
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship

from services.db import metadata as db_metadata


class Base(DeclarativeBase):
    metadata = db_metadata()


class Host(Base):
    __tablename__ = "compute_hosts"

    id: Mapped[str] = mapped_column(String(128), primary_key=True)
    site: Mapped[str] = mapped_column(String(64))
    rack: Mapped[str] = mapped_column(String(64))
    cores: Mapped[int] = mapped_column(Integer)
    memory_mb: Mapped[int] = mapped_column(Integer)
    frequency_ghz: Mapped[float] = mapped_column(Float)
    traits: Mapped[list[str]] = mapped_column(JSON, default=list)
    agent: Mapped[str] = mapped_column(String(256), default="")
    used_cores: Mapped[int] = mapped_column(Integer, default=0)
    used_memory_mb: Mapped[int] = mapped_column(Integer, default=0)
    # Bumped on every change (OpenStack Placement's resource-provider generation).
    generation: Mapped[int] = mapped_column(Integer, default=0)
    # False once the host left the inventory; kept while VMs still run on it.
    enabled: Mapped[bool] = mapped_column(default=True)


class Reservation(Base):
    __tablename__ = "compute_reservations"
    __table_args__ = (UniqueConstraint("tenant", "request_id"),)

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    tenant: Mapped[str] = mapped_column(String(128), index=True)
    request_id: Mapped[str] = mapped_column(String(128))
    state: Mapped[str] = mapped_column(String(16), default="active")
    price_per_minute: Mapped[float] = mapped_column(Float, default=0.0)
    created_at: Mapped[float] = mapped_column(Float)
    released_at: Mapped[float] = mapped_column(Float, default=0.0)
    # The group names, in request order, and any notes for the tenant.
    groups: Mapped[list[dict]] = mapped_column(JSON, default=list)
    notes: Mapped[list[str]] = mapped_column(JSON, default=list)
    # SHA-256 (hex) of the request minus its request_id: a replay of the id must ask for the same thing.
    # Empty on rows older than the column: their replays are not checked.
    request_hash: Mapped[str] = mapped_column(String(64), default="", server_default="")

    vms: Mapped[list[Vm]] = relationship(back_populates="reservation", order_by="Vm.ordinal")


class Vm(Base):
    __tablename__ = "compute_vms"
    __table_args__ = (Index("ix_compute_vms_host_state", "host_id", "state"),)

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    reservation_id: Mapped[str] = mapped_column(ForeignKey("compute_reservations.id"), index=True)
    ordinal: Mapped[int] = mapped_column(Integer)
    group: Mapped[str] = mapped_column(String(128))
    host_id: Mapped[str] = mapped_column(ForeignKey("compute_hosts.id"))
    cores: Mapped[int] = mapped_column(Integer)
    memory_mb: Mapped[int] = mapped_column(Integer)
    frequency_ghz: Mapped[float] = mapped_column(Float)
    price_per_minute: Mapped[float] = mapped_column(Float)
    state: Mapped[str] = mapped_column(String(16), default="active")
    # Set once the VM's agent asked about it (GetVm): only then can it hold
    # processes that a release must kill, so only then is the agent told.
    agent_seen: Mapped[bool] = mapped_column(default=False)

    reservation: Mapped[Reservation] = relationship(back_populates="vms")


class Owner(Base):
    """The compute IRM (its `name`) whose hosts, reservations and VMs these tables hold: one row (id 1), written
    by the first IRM that starts on the database. The tables hold one IRM's state (host ids are keys, the
    inventory sync disables every host not in its own inventory), so another IRM is refused at start-up."""

    __tablename__ = "compute_owner"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    manager: Mapped[str] = mapped_column(String(128))
    claimed_at: Mapped[float] = mapped_column(Float)
    # Written by the health probe (services.server.DatabaseHealth) while the database is failing: does it take a
    # write again?
    probed_at: Mapped[float] = mapped_column(Float, default=0.0)
