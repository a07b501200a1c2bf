"""Giving back what managers hold for reservations that are not (or no longer) a client's (thesis §5.1.1).

Each part of a reservation is reserved at its manager under a request id derived from the CRS reservation
(irm_request_id), so whatever a manager may have committed can be found again and released: at once where the
manager answers, else later, from a compensation row (crs_compensations) that the compensator's passes retry with
back-off. A reservation a crash left pending is recovered into such rows (Compensator.recover).

The Compensator is the CRS's (Crs composes one and runs its passes on a thread of its own): it needs the
database, the registry of managers, the capacity view (what a release frees shows there at once) and the clock.
"""

from __future__ import annotations

import hashlib
import logging
import math
import threading
import time
from collections.abc import Callable

import grpc
from sqlalchemy import delete, select

from cross_resource_scheduler import owners
from cross_resource_scheduler.models import Compensation, Manager, Reservation
from cross_resource_scheduler.registry import Registry
from cross_resource_scheduler.stacking import as_one_part
from cross_resource_scheduler.statements import ANY_COMPENSATION
from cross_resource_scheduler.view import CapacityView
from harness.v1 import irm_pb2
from services.clock import Clock
from services.db import Database

# Logged as the CRS service, as before this module was split out of it: log filters select by that name.
log = logging.getLogger("cross_resource_scheduler.service")

# A compensation row not done is tried again after 0.5 s x 2^attempts, at most this long after: a manager that
# hangs is not asked for each of its rows every pass.
COMPENSATION_BACKOFF_MAX_S = 60.0
# Rows of one manager looked at per pass (rows not yet due are skipped).
_ROWS_PER_MANAGER = 50


def irm_request_id(res_id: str, attempt: int, manager: str) -> str:
    """The request id of a reservation's part at one manager, one per placement attempt.

    A retry must never meet the part an earlier attempt took and gave back: the manager would answer the
    same request id with that released reservation (its idempotent replay) and the CRS activate a
    reservation holding nothing there. A long manager name is hashed: the id stays within the 128
    characters a manager accepts.
    """
    tail = manager if len(manager) <= 64 else hashlib.sha256(manager.encode()).hexdigest()[:16]
    return f"{res_id}#{attempt}@{tail}"


# Attempts a reservation's parts are looked for under when which one placed them is not known (recovery, a
# release whose manager did not answer): at least this many, whatever `place_attempts` is now.
_ATTEMPTS_ASKED = 8


def part_request_ids(res_id: str, manager: str, attempts: int) -> list[str]:
    """Every request id a part of `res_id` at `manager` may have: one per attempt, and the single id parts had
    before ids were per attempt (`<res>@<manager>`)."""
    return [irm_request_id(res_id, a, manager) for a in range(max(attempts, _ATTEMPTS_ASKED))] + [
        f"{res_id}@{manager}"]


class Compensator:
    """The CRS's giving back: at managers now (undo, release_part), or remembered in compensation rows for the
    passes (compensate_pending) to retry until the manager gives the part back or provably holds nothing."""

    def __init__(self, db: Database, registry: Registry, view: CapacityView, clock: Clock, owner: owners.Owner,
                 attempts: Callable[[], int], irm_timeout_s: float, in_doubt_horizon_s: float,
                 kick: threading.Event, stop: threading.Event) -> None:
        self.db = db
        self.registry = registry
        self.view = view
        self.clock = clock
        # This process, named in the pending rows it places (see owners.py): a row of another owner that is gone
        # is a crash's leftover.
        self.owner = owner
        # The placement attempts a Reserve makes now (Crs._attempts): each has its parts' request ids.
        self._attempts = attempts
        self.irm_timeout_s = irm_timeout_s
        self.in_doubt_horizon_s = in_doubt_horizon_s
        # Set when rows may be due (a manager came up, a release or an in-doubt Reserve left rows): wakes the
        # compensator thread (Crs._run_compensator). `stop`: the CRS is stopping; a pass ends early.
        self._kick = kick
        self._stop = stop
        # Manager -> (calls in a row it did not answer, when to ask it again): one that hangs is not waited on
        # again each pass for its next row.
        self._silent: dict[str, tuple[int, float]] = {}

    # -- reservations left pending ---------------------------------------
    def recover(self, before: float = math.inf) -> int:
        """Reservations left pending by a crash (created before `before`, or whose owner is gone): give back
        whatever any IRM holds for them. Returns how many pending rows were left for later (younger, of an owner
        that may be placing them still)."""
        with self.db.read() as s:
            rows = list(s.scalars(select(Reservation).where(Reservation.state == "pending")))
        left = 0
        for r in rows:
            why = owners.gone(r.owner, self.owner)
            if r.created_at < before or why:
                self.recover_one(r.id, r.tenant, why or "pending longer than a Reserve takes")
            else:
                left += 1
        return left

    def releases_due_now(self) -> int:
        """At start-up: the parts a release recorded and was giving back itself (not due until its grace ended,
        `ReleaseReservation`) are due now. The process that was releasing them is gone (this one has just
        started), and capacity held for a released reservation stayed refused to others until the grace ended
        (~30 s). A release is idempotent: were another CRS on the database still giving one back, asking again
        does no harm. Returns how many."""
        now = self.clock.now()

        def due(s) -> int:  # type: ignore[no-untyped-def]
            rows = list(s.scalars(select(Compensation).where(Compensation.attempts == 0,
                                                             Compensation.in_doubt.is_(False),
                                                             Compensation.next_try_at > now)))
            for row in rows:
                row.next_try_at = now
            return len(rows)
        return self.db.transact(due)

    def recover_one(self, res_id: str, tenant: str, why: str = "") -> bool:
        """Give back what any IRM holds for the pending reservation `res_id`, and drop it; False if it is no
        longer pending (its Reserve activated it, or dropped it, since it was read)."""
        with self.db.read() as s:
            everyone = [m.name for m in s.scalars(select(Manager))]

        def run(s):  # type: ignore[no-untyped-def]
            # Still pending, checked in the transaction that drops it: a Reserve that activated it since it was
            # read keeps it (and its parts).
            if not s.execute(delete(Reservation).where(Reservation.id == res_id,
                                                       Reservation.state == "pending")).rowcount:
                return False
            # Which managers (and attempts) it reached is unknown: ask each for every derived request id.
            # In doubt: a Reserve in flight when the CRS stopped may still commit at its manager.
            for m in everyone:
                for rid in part_request_ids(res_id, m, self._attempts()):
                    s.add(Compensation(manager=m, tenant=tenant, irm_request_id=rid,
                                       created_at=self.clock.now(), in_doubt=True))
            return True
        if not self.db.transact(run):
            return False
        log.warning("recovered a reservation left pending", extra={"reservation": res_id, "why": why})
        self._kick.set()
        return True

    # -- compensation ----------------------------------------------------
    def undo(self, manager: str, tenant: str, irm_request_id: str) -> str:
        """Release whatever `manager` holds under `irm_request_id`.

        Returns "released", "absent" (the manager holds nothing under that id now) or
        "unreachable".
        """
        state = self.registry.get(manager)
        if state is None:
            return "unreachable"
        stub = state.stub()
        try:
            try:
                res = stub.GetReservation(irm_pb2.GetReservationRequest(tenant=tenant, request_id=irm_request_id),
                                          timeout=self.irm_timeout_s)
            except grpc.RpcError as e:
                if e.code() == grpc.StatusCode.NOT_FOUND:
                    return "absent"
                raise
            stub.ReleaseReservation(irm_pb2.ReleaseReservationRequest(tenant=tenant, reservation_id=res.id),
                                    timeout=self.irm_timeout_s)
            return "released"
        except grpc.RpcError as e:
            log.warning("could not release at manager; will retry", extra={
                "manager": manager, "irm_request_id": irm_request_id, "code": str(e.code())})
            return "unreachable"

    def release_part(self, manager: str, tenant: str, irm_reservation_id: str, show: bool = True,
                     generations: dict[tuple[str, str], int] | None = None) -> str:
        """Give back the part `irm_reservation_id` at `manager`: "released" (also if it was already), "absent"
        (the manager knows no such reservation) or "unreachable". `show`: free in the view at once (the
        compensator's retries do not: a part the Release showed freed already would be counted free twice).
        `generations`: gets, per (manager, resource id) of the part, its host's generation after the release,
        where the manager says it (a CRS passes them up: stacking.py)."""
        state = self.registry.get(manager)
        if state is None or not irm_reservation_id:
            return "unreachable"
        try:
            reply = state.stub().ReleaseReservation(irm_pb2.ReleaseReservationRequest(
                tenant=tenant, reservation_id=irm_reservation_id), timeout=self.irm_timeout_s)
        except grpc.RpcError as e:
            if e.code() == grpc.StatusCode.NOT_FOUND:
                return "absent"
            log.warning("could not release at manager; will retry", extra={
                "manager": manager, "irm_reservation_id": irm_reservation_id, "code": str(e.code())})
            return "unreachable"
        if show:
            self._show_released(manager, reply)
        if generations is not None:
            generations.update(((manager, r.id), r.physical_generation) for g in reply.groups for r in g.resources
                               if r.physical_generation)
        return "released"

    def _show_released(self, manager: str, reply: irm_pb2.Reservation) -> None:
        """What a manager just gave back, free in the view at once: until its event arrives, a Reserve right after
        the Release was refused "capacity in use". Only where the manager says the generation its release made
        (an assumption of negative demand, settled when the view reaches it); a node already there shows it."""
        token = f"release:{manager}:{reply.id}"      # a release gives back once: one token per reservation
        caught_up: dict[str, int] = {}
        with self.view.lock:
            for g in as_one_part(manager, reply):     # a CRS below's: its resources as this CRS knows them
                for r in g.resources:
                    node = self.view.nodes.get(f"{manager}/{r.physical_id}")
                    if not r.physical_generation or node is None or node.generation >= r.physical_generation:
                        continue
                    freed = {k: -v for k, v in r.attributes.items() if k in node.capacity and v > 0}
                    self.view.assume(token, node, freed)
                    caught_up[node.key] = max(caught_up.get(node.key, 0), r.physical_generation)
            if caught_up:
                self.view.commit(token, caught_up)

    def forget(self, manager: str) -> None:
        """`manager` was deregistered (its rows deleted with it): nothing of it is kept here either."""
        self._silent.pop(manager, None)

    def remember(self, manager: str, tenant: str, irm_request_id: str, in_doubt: bool = False) -> None:
        now = self.clock.now()

        def add(s):  # type: ignore[no-untyped-def]
            s.add(Compensation(manager=manager, tenant=tenant, irm_request_id=irm_request_id, created_at=now,
                               in_doubt=in_doubt, next_try_at=now))
        self.db.transact(add)

    def undo_or_remember(self, manager: str, tenant: str, irm_request_id: str, in_doubt: bool = False) -> None:
        """Give back what `manager` holds for a request; remember to retry if that is not certain.

        `in_doubt`: the manager's Reserve failed without a definite answer (timed out,
        unreachable), so it may still commit later: the request is only remembered, for the
        compensator. Asking now could wait as long as the Reserve did, on the request's thread
        (a slow manager's failed reserves then held the server's workers twice as long), and
        "absent" now would prove nothing anyway (see compensate_pending).
        """
        if in_doubt:
            self.remember(manager, tenant, irm_request_id, in_doubt=True)
            self._kick.set()
            return
        if self.undo(manager, tenant, irm_request_id) == "unreachable":
            self.remember(manager, tenant, irm_request_id)

    def _settled_after(self) -> float:
        """How long a manager may still be working on a request the CRS gave up on."""
        return 3 * self.irm_timeout_s

    def _backoff(self, attempts: int) -> float:
        return min(COMPENSATION_BACKOFF_MAX_S, 0.5 * 2 ** min(attempts, 20))

    def compensate_pending(self) -> None:
        """One pass over the compensation rows of the managers up.

        A row not done waits 0.5 s x 2^attempts (at most COMPENSATION_BACKOFF_MAX_S) before its next try;
        managers take turns, a manager that did not answer is left for the rest of the pass, and no new
        try starts after irm_timeout_s: a manager that heartbeats but hangs costs a pass at most one
        call's timeout, and the other managers' rows still get their turns.
        """
        if not self.db.fetch(ANY_COMPENSATION, {}):
            return
        up = [m.name for m in self.registry.up()]
        if not up:
            return
        now = self.clock.now()
        queues: list[list[Compensation]] = []
        with self.db.read() as s:
            for name in up:
                if self._silent.get(name, (0, 0.0))[1] > now:
                    continue
                rows = list(s.scalars(select(Compensation).where(Compensation.manager == name,
                                                                 Compensation.next_try_at <= now)
                                      .order_by(Compensation.next_try_at, Compensation.id)
                                      .limit(_ROWS_PER_MANAGER)))
                if rows:
                    queues.append(rows)
        deadline = time.monotonic() + max(1.0, self.irm_timeout_s)
        while queues and not self._stop.is_set() and time.monotonic() < deadline:
            for rows in list(queues):
                c = rows.pop(0)
                if not rows:
                    queues.remove(rows)
                state = self.registry.get(c.manager)
                if state is None or not state.up:
                    continue
                outcome = self._try_compensation(c)
                if outcome == "unreachable":
                    misses = self._silent.get(c.manager, (0, 0.0))[0] + 1
                    self._silent[c.manager] = (misses, self.clock.now() + self._backoff(misses))
                    if rows:
                        queues.remove(rows)  # its other rows wait for a later pass
                else:
                    self._silent.pop(c.manager, None)
                if time.monotonic() >= deadline:
                    break

    def _try_compensation(self, c: Compensation) -> str:
        if c.irm_reservation_id:
            outcome = self.release_part(c.manager, c.tenant, c.irm_reservation_id, show=False)
        else:
            outcome = self.undo(c.manager, c.tenant, c.irm_request_id)
        now = self.clock.now()
        age = now - c.created_at
        if outcome == "released":
            done = True
        elif outcome == "absent":
            # "absent" is final only once the manager cannot still be committing the request. A Reserve that
            # got no definite answer may yet commit (a manager stuck that long still finishes): its row is
            # asked about, ever more rarely, for in_doubt_horizon_s.
            horizon = self.in_doubt_horizon_s if c.in_doubt else self._settled_after()
            done = age > max(horizon, self._settled_after())
        else:
            done = False

        def run(s):  # type: ignore[no-untyped-def]
            if done:
                s.execute(delete(Compensation).where(Compensation.id == c.id))
            else:
                row = s.get(Compensation, c.id)
                if row is not None:
                    row.attempts += 1
                    row.next_try_at = now + self._backoff(row.attempts)
        self.db.transact(run)
        if outcome == "released":
            log.info("released a leftover at manager", extra={
                "manager": c.manager, "irm_request_id": c.irm_request_id, "irm_reservation_id": c.irm_reservation_id})
        return outcome

    def pending(self) -> int:
        """Compensation rows not done yet."""
        with self.db.read() as s:
            return len(list(s.scalars(select(Compensation.id))))
