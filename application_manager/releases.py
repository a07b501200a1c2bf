"""What ended runs may have left reserved at the CRS, and its release.

Every run reserves under a request id derived from its session (and its number in it) or its execution
(`reservation_request_id`), so whatever it may hold is found again: what a run could not release as it ended is kept
as a row (m.Release) until the CRS confirms nothing is held under it, and what the runs of an interrupted session or
execution (its AM process gone) left is looked for by those ids (`release_pending`).

The ApplicationManager composes one Releases and calls it from its sweeps (every heartbeat_s); it needs only the
database, the CRS, the clock, and the sweep period (back-off) and CRS address (logs) of the configuration.
"""

from __future__ import annotations

import logging

import grpc
from sqlalchemy import delete as sql_delete
from sqlalchemy import select as sql_select
from sqlalchemy import update as sql_update

from application_manager import models as m
from application_manager.local import TRANSIENT_CODES, Unreleased
from harness.v1 import irm_pb2, irm_pb2_grpc
from services.clock import Clock
from services.db import Database
from services.errors import RESERVATION_PENDING, error_info

# The service's logger: the records keep the name they had before this module was split out of
# application_manager.service (log filters and the tests read it).
log = logging.getLogger("application_manager.service")

# A Reserve in doubt whose request id the CRS does not know (NOT_FOUND) is taken as holding nothing only after this
# long from when it was kept. Until then its request may still reach the CRS and claim the id: up to its deadline
# (local.RESERVE_TIMEOUT_S after it was sent, before the row was kept: a lost connection fails the call early, not the
# request the CRS may have read), then the CRS's parsing and its database's waits before the claim (a connection
# from the pool, a lock: ~30 s each); gRPC starts no handler past a call's deadline. A CRS from before
# RESERVATION_PENDING also answers NOT_FOUND while it places the Reserve, for as long as it keeps one pending (its
# pending horizon: ~3 min with default settings), and may activate it then: this covers both.
IN_DOUBT_KEPT_S = 900.0
# A release the CRS refuses for good (PERMISSION_DENIED, FAILED_PRECONDITION...) is asked again after heartbeat_s,
# doubled at each refusal in a row up to this: its reservation may still be held, so the row is never dropped, but
# it costs one call and one warning an hour rather than one each sweep.
RELEASE_BACKOFF_MAX_S = 3600.0
# Failures that stop the pass over the kept rows: the CRS is out of reach for all of them (the next sweep tries).
_CRS_AWAY = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)


def reservation_request_id(owner: str, run: int | None = None) -> str:
    """The CRS request id of a run: derived from its session (and the run's number in it) or execution, so a
    reservation left by an AM that died mid-run is found again (`Releases.release_pending`)."""
    return f"am-{owner}" if run is None else f"am-{owner}-{run}"


class Releases:
    """The kept releases of one AM process, and the release of what interrupted runs left."""

    def __init__(self, db: Database, crs: irm_pb2_grpc.ResourceManagerStub, clock: Clock, heartbeat_s: float,
                 crs_address: str) -> None:
        self.db = db
        self.crs = crs
        self.clock = clock
        # The first wait after a refusal (`_back_off`): the sweeps' period.
        self.heartbeat_s = heartbeat_s
        self.crs_address = crs_address

    def release_later(self, left: Unreleased) -> None:
        """Keep what a run may have left reserved (LocalBackend.release_later) for the sweeps to release: in the
        database, so that neither a restart nor the CRS staying away for a while loses it."""
        row = m.Release(tenant=left.tenant, request_id=left.request_id, reservation_id=left.reservation_id,
                        reserve_request=None if left.request is None else
                        left.request.SerializeToString(deterministic=True), created_at=self.clock.now())
        self.db.transact(lambda s: s.add(row))

    def release_kept(self) -> None:
        """Release what ended runs may have left at the CRS (`m.Release`), each forgotten once the CRS confirms
        nothing is held under it; a CRS out of reach ends the pass, a refusal that waiting may cure leaves that one
        to the next sweep, any other one to a later sweep (`_back_off`). Only ended runs' request ids are kept, so
        nothing a run in progress holds is released."""
        with self.db.read() as s:
            rows = list(s.scalars(sql_select(m.Release).where(m.Release.next_try_at <= self.clock.now())
                                  .order_by(m.Release.id)))
        for row in rows:
            try:
                done = self._release_one(row)
            except grpc.RpcError as e:
                if e.code() not in TRANSIENT_CODES:
                    self._back_off(row, e)
                    continue
                log.warning("could not release a reservation a run left: the next sweep tries again (or release it "
                            "at the CRS: ReleaseReservation)",
                            extra={"tenant": row.tenant, "request_id": row.request_id,
                                   "reservation": row.reservation_id, "code": str(e.code()),
                                   "crs": self.crs_address})
                if e.code() in _CRS_AWAY:
                    return
                continue
            if done:
                self.db.transact(lambda s, rid=row.id: s.execute(sql_delete(m.Release).where(m.Release.id == rid)))
                log.info("released a reservation a run had left", extra={"request_id": row.request_id})
            elif row.attempts:
                # Answered (its Reserve still on its way or being placed): the refusals in a row are over.
                self.db.transact(lambda s, rid=row.id: s.execute(sql_update(m.Release).where(
                    m.Release.id == rid).values(attempts=0)))

    def _back_off(self, row: m.Release, e: grpc.RpcError) -> None:
        """The CRS refused `row` in a way waiting does not cure (its delegation refused, the request invalid...):
        asked again later and later, up to RELEASE_BACKOFF_MAX_S, and kept -- its reservation may still be held."""
        attempts = row.attempts + 1
        # The exponent bounded: a row refused for years would overflow a float.
        delay = min(RELEASE_BACKOFF_MAX_S, self.heartbeat_s * 2.0 ** min(attempts - 1, 32))
        self.db.transact(lambda s: s.execute(sql_update(m.Release).where(m.Release.id == row.id).values(
            attempts=attempts, next_try_at=self.clock.now() + delay)))
        what = (f"reservation {row.reservation_id}" if row.reservation_id
                else f"the reservation under request id {row.request_id!r}, if the CRS placed one")
        log.warning(f"the CRS refused to release a reservation a run may have left ({e.code().name}: "
                    f"{(e.details() or '')[:300]}); asked again in {delay:g} s. Release it yourself at the CRS "
                    f"(ReleaseReservation) as tenant {row.tenant!r}: {what} (`harness reservations --tenant "
                    f"{row.tenant}` lists its id), or fix what the CRS refuses (the AM's delegation, say)",
                    extra={"tenant": row.tenant, "request_id": row.request_id, "reservation": row.reservation_id,
                           "code": str(e.code()), "attempts": attempts, "crs": self.crs_address})

    def _release_one(self, row: m.Release) -> bool:
        """Whether nothing is held under `row` at the CRS any more (released now, or never placed); False while its
        Reserve is still being placed, or may still reach the CRS. RpcError: the CRS did not answer, or refused."""
        reservation_id = row.reservation_id
        if not reservation_id:
            try:
                held = self.crs.GetReservation(irm_pb2.GetReservationRequest(tenant=row.tenant,
                                                                             request_id=row.request_id), timeout=10)
            except grpc.RpcError as e:
                if e.code() == grpc.StatusCode.ABORTED and (error_info(e) or ("",))[0] == RESERVATION_PENDING:
                    return False        # its outcome is not decided yet: asked again next sweep
                if e.code() != grpc.StatusCode.NOT_FOUND:
                    raise
                # Not even pending. Reserving again under its id to tell "never placed" from "on its way" would
                # place what nobody uses: the request's deadline is what says it can no longer land.
                return self.clock.now() - row.created_at > IN_DOUBT_KEPT_S
            if held.state != irm_pb2.Reservation.STATE_ACTIVE:
                return True
            reservation_id = held.id
            # Found: a release that fails below is tried again by its id.
            self.db.transact(lambda s: s.execute(sql_update(m.Release).where(m.Release.id == row.id).values(
                reservation_id=reservation_id)))
        try:
            self.crs.ReleaseReservation(irm_pb2.ReleaseReservationRequest(tenant=row.tenant,
                                                                          reservation_id=reservation_id), timeout=30)
        except grpc.RpcError as e:
            if e.code() != grpc.StatusCode.NOT_FOUND:
                raise
        return True

    def release_pending(self, session_ids: set[str] | None = None) -> None:
        """Release at the CRS what the runs of rows marked `release_pending` (ended as interrupted) left reserved,
        and clear the mark once it confirms; a CRS out of reach leaves it for the next sweep (every heartbeat_s).
        `session_ids`: only those sessions'."""
        with self.db.read() as s:
            q = (sql_select(m.Session.id, m.Application.tenant).join(m.Application,
                                                                     m.Application.id == m.Session.application_id)
                 .where(m.Session.release_pending.is_(True)))
            if session_ids is not None:
                q = q.where(m.Session.id.in_(session_ids))
            sessions = list(s.execute(q))
            executions = [] if session_ids is not None else list(s.execute(
                sql_select(m.Execution.id, m.Execution.tenant).where(m.Execution.release_pending.is_(True))))
        by_tenant: dict[str, tuple[list[str], list[str]]] = {}
        for sid, tenant in sessions:
            by_tenant.setdefault(tenant, ([], []))[0].append(sid)
        for eid, tenant in executions:
            by_tenant.setdefault(tenant, ([], []))[1].append(eid)
        for tenant, (sids, eids) in by_tenant.items():
            # Every run of a session reserved under am-<session>-<n> (a prefix here); an execution under am-<id>.
            request_ids = ([reservation_request_id(x, 0).removesuffix("0") for x in sids]
                           + [reservation_request_id(x) for x in eids])
            if not self._release_left(tenant, request_ids):
                return      # the CRS is out of reach: for every tenant; the next sweep tries them all again

            def released(s, sids=sids, eids=eids) -> None:  # type: ignore[no-untyped-def]
                if sids:
                    s.execute(sql_update(m.Session).where(m.Session.id.in_(sids)).values(release_pending=False))
                if eids:
                    s.execute(sql_update(m.Execution).where(m.Execution.id.in_(eids)).values(release_pending=False))
            self.db.transact(released)

    def _release_left(self, tenant: str, request_ids: list[str]) -> bool:
        """Release the tenant's active reservations whose request id is one of `request_ids` (an execution's) or
        starts with one ending in "-" (a session's runs): what a run in progress held when the AM died.
        Whether the CRS confirmed (none of them is active now); a CRS out of reach is logged, and False."""
        exact = {p for p in request_ids if not p.endswith("-")}
        starts = tuple(p for p in request_ids if p.endswith("-"))
        token = ""
        try:
            while True:
                page = self.crs.ListReservations(irm_pb2.ListReservationsRequest(
                    tenant=tenant, page_size=1000, page_token=token), timeout=10)
                for r in page.reservations:
                    if r.state != irm_pb2.Reservation.STATE_ACTIVE:
                        continue
                    if r.request_id in exact or (starts and r.request_id.startswith(starts)):
                        self.crs.ReleaseReservation(irm_pb2.ReleaseReservationRequest(
                            tenant=tenant, reservation_id=r.id), timeout=30)
                        log.info("released a reservation an interrupted run left",
                                 extra={"reservation": r.id, "request_id": r.request_id})
                token = page.next_page_token
                if not token:
                    return True
        except grpc.RpcError as e:
            log.warning("could not release the reservations interrupted runs left: the next sweep tries again "
                        "(or release them at the CRS: ReleaseReservation; their request ids start with the ones "
                        "logged here)",
                        extra={"tenant": tenant, "request_ids": request_ids, "code": str(e.code()),
                               "crs": self.crs_address})
            return False
