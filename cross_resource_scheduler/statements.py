"""The CRS's hot-path statements over its two tables (crs_reservations, crs_compensations), and a reservation row
as those statements read it and as a tenant sees it.

Compiled once and run on the driver's cursor (services.db.Prepared): SQLAlchemy's per-execution work costs several
times these statements on SQLite. Cold paths (recovery, a compensation pass) use the ORM.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import bindparam, delete, insert, select, update

from cross_resource_scheduler.models import Compensation, Reservation
from harness.v1 import irm_pb2
from services.db import Prepared

_R = Reservation.__table__
_COLUMNS = [c.key for c in _R.c]
CLAIM = Prepared(insert(_R), columns=_COLUMNS)
BY_ID = Prepared(select(_R).where(_R.c.id == bindparam("rid")))
BY_REQUEST = Prepared(select(_R).where(_R.c.tenant == bindparam("tenant"), _R.c.request_id == bindparam("req")))
ACTIVATE = Prepared(update(_R).where(_R.c.id == bindparam("rid"), _R.c.state == "pending").values(
    state="active", price_per_minute=bindparam("price"), allocation=bindparam("alloc"), notes=bindparam("said"),
    created_at=bindparam("created")))
# A pending row's time, while its Reserve works on (see Crs._stamp); activation puts the creation time back.
STAMP_PENDING = Prepared(update(_R).where(_R.c.id == bindparam("rid"), _R.c.state == "pending").values(
    created_at=bindparam("at")))
RELEASE = Prepared(update(_R).where(_R.c.id == bindparam("rid"), _R.c.state == "active").values(
    state="released", released_at=bindparam("at")))
DROP_PENDING = Prepared(delete(_R).where(_R.c.id == bindparam("rid"), _R.c.state == "pending"))
# An active reservation's parts with their resources' addresses as their managers answer them now
# (addresses.Addresses.current), only over the allocation the read started from: a read that learned newer
# addresses may have written since.
READDRESS = Prepared(update(_R).where(_R.c.id == bindparam("rid"), _R.c.state == "active",
                                      _R.c.allocation == bindparam("was")).values(allocation=bindparam("alloc")))
_C = Compensation.__table__
# The monitor's poll (twice a second, usually finding nothing): an ORM query costs ~ms.
ANY_COMPENSATION = Prepared(select(_C.c.id).limit(1))
# A Release records its parts for the compensator in the transaction that marks the reservation released, and
# forgets each part once its manager gave it back (Crs.ReleaseReservation): by the ids the inserts returned (one
# row per part, by its manager reservation id), each a primary-key lookup.
COMPENSATE = Prepared(insert(_C).returning(_C.c.id), columns=[
    "manager", "tenant", "irm_request_id", "irm_reservation_id", "created_at", "attempts", "in_doubt", "next_try_at"])
FORGET_PART = Prepared(delete(_C).where(_C.c.id == bindparam("cid")))
DUE_NOW = Prepared(update(_C).where(_C.c.id == bindparam("cid")).values(next_try_at=bindparam("now")))


@dataclass(slots=True)
class ReservationRow:
    """A crs_reservations row as the hot paths read it (attributes as the ORM's Reservation)."""

    id: str
    tenant: str
    request_id: str
    state: str
    priority: int
    price_per_minute: float
    created_at: float
    released_at: float
    allocation: bytes
    notes: list[str]
    request_hash: str = ""
    owner: str = ""


def to_proto(r: Reservation | ReservationRow) -> irm_pb2.Reservation:
    """A stored reservation (a ReservationRow, or the ORM's row) as the tenant reads it."""
    state = {"active": irm_pb2.Reservation.STATE_ACTIVE, "released": irm_pb2.Reservation.STATE_RELEASED
             }.get(r.state, irm_pb2.Reservation.STATE_FAILED)
    out = irm_pb2.Reservation.FromString(r.allocation or b"")
    out.id, out.tenant, out.request_id, out.state, out.priority = r.id, r.tenant, r.request_id, state, r.priority
    out.price_per_minute, out.created_at, out.released_at = r.price_per_minute, r.created_at, r.released_at
    out.notes[:] = list(r.notes or [])
    return out
