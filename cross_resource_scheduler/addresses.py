"""Where the resources of a reservation's parts are now, as their managers say (an execution agent's address,
say), for the tenant's reads of its reservations.

The CRS records a part's addresses when it is reserved; a manager that restarted since (registered as a new
instance) may give others. A read asks such a manager once per registration -- about the one part, or the
tenant's every part there -- and writes what it learned back to the reservation (statements.READDRESS).
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field

import grpc

from cross_resource_scheduler.registry import Registry
from cross_resource_scheduler.statements import READDRESS, to_proto
from harness.v1 import irm_pb2
from services import paging
from services.clock import Clock
from services.db import Database

# Logged as the CRS service, as before this module was split out of it: log filters select by that name.
log = logging.getLogger("cross_resource_scheduler.service")

# A reservation read after its manager restarted (registered as a new instance) asks it where the resources are
# now, for at most this long (less when the caller's deadline is nearer: `harness run` gives GetReservation 10 s); a
# manager that did not answer is not asked again for this long, its resources shown as last known meanwhile.
ADDRESS_TIMEOUT_S = 2.0
ADDRESS_RETRY_S = 5.0


@dataclass
class Whereabouts:
    """Where one manager, since it last registered as a new instance, says the resources of its parts are (an
    execution agent's address, say): a restart may have moved them, and a manager restarting registers again with
    a new instance id (this is then replaced: Addresses.registered). Its parts reserved before `since` are asked
    about once, when a tenant reads them; those reserved since were answered by the manager as it is now."""

    since: float
    lock: threading.Lock = field(default_factory=threading.Lock)
    tenants: set[str] = field(default_factory=set)       # every active part of theirs there answered
    parts: set[str] = field(default_factory=set)         # manager reservation ids answered (or unknown to it)
    address: dict[str, str] = field(default_factory=dict)  # resource id -> address
    # A CRS below's notes on its reservations now (by its reservation id): what happened there since (a manager of
    # its deregistered with the part) shows in a read here too.
    notes: dict[str, list[str]] = field(default_factory=dict)
    silent_until: float = -math.inf                      # the CRS clock's; not asked again before then
    silence: str = ""                                    # why it was not asked / did not answer


class Addresses:
    """Each manager's Whereabouts since it last registered as a new instance, and the reads that ask it."""

    def __init__(self, db: Database, registry: Registry, clock: Clock) -> None:
        self.db = db
        self.registry = registry
        self.clock = clock
        self._whereabouts: dict[str, Whereabouts] = {}
        self._whereabouts_lock = threading.Lock()
        # Manager -> (address, instance id) of its last registration with this process (registered). In memory:
        # a restarted CRS asks every manager about its parts from before anyway (`_started_at`).
        self._instances: dict[str, tuple[str, str]] = {}
        # A manager not registered since this process started may have moved before: parts older are asked about.
        self._started_at = self.clock.now()

    def where(self, manager: str) -> Whereabouts:
        with self._whereabouts_lock:
            w = self._whereabouts.get(manager)
            if w is None:
                w = self._whereabouts[manager] = Whereabouts(since=self._started_at)
            return w

    def moved(self, manager: str) -> None:
        """`manager` registered (again): what it said before about where its resources are may be out of date."""
        with self._whereabouts_lock:
            self._whereabouts[manager] = Whereabouts(since=self.clock.now())

    def forget(self, manager: str) -> None:
        """`manager` was deregistered: a manager registering later under its name is another."""
        with self._whereabouts_lock:
            self._whereabouts.pop(manager, None)
            self._instances.pop(manager, None)

    def registered(self, manager: str, address: str, instance_id: str) -> bool:
        """`manager` registered at `address` as the instance `instance_id`: moved unless its last registration
        with this process was that same instance there (it registered again without restarting: after missed
        heartbeats, a network blip), its resources where it said. No id (a manager older than instance_id) or no
        registration before (this CRS restarted since) is taken for a restart. True if it was moved."""
        with self._whereabouts_lock:
            last = self._instances.get(manager)
            self._instances[manager] = (address, instance_id)
            if instance_id and last == (address, instance_id):
                w = self._whereabouts.get(manager)
                if w is not None:
                    w.silent_until = -math.inf      # it answers again: a read asks it at once what it still must
                return False
            self._whereabouts[manager] = Whereabouts(since=self.clock.now())
            return True

    def current(self, tenant: str, rows: list, context=None) -> list[irm_pb2.Reservation]:  # noqa: ANN001
        """`rows` (the tenant's) as the tenant reads them: the addresses of active reservations' resources as
        their managers give them now. The CRS records a part's addresses when it is reserved, and a manager that
        restarted since (its agent on another port) gives others: a part reserved before its manager last
        registered as a new instance (or before this CRS started) is asked about once per such registration -- the
        one part, or the tenant's every part there (one List, not a call per reservation). A manager that does not
        answer leaves its resources' addresses as last known, with a note saying so."""
        outs = [to_proto(r) for r in rows]
        where: dict[str, Whereabouts] = {}
        unknown: dict[str, set[str]] = defaultdict(set)     # manager -> its parts not asked about since it registered
        relays: dict[str, bool] = {}
        for r, out in zip(rows, outs, strict=True):
            if r.state != "active":
                continue
            for g in out.groups:
                # One deregistered (its parts given up: the reservation's note says so) is not asked.
                if g.manager and g.manager_reservation_id and any(x.address for x in g.resources) \
                        and self.registry.get(g.manager) is not None:
                    if g.manager not in where:
                        where[g.manager] = self.where(g.manager)
                        relays[g.manager] = self._relays(g.manager)
                    w = where[g.manager]
                    if relays[g.manager] or (r.created_at < w.since and tenant not in w.tenants
                                             and g.manager_reservation_id not in w.parts):
                        unknown[g.manager].add(g.manager_reservation_id)
        silent = {m: why for m, parts in unknown.items() if (why := self.ask_where(m, where[m], tenant, parts,
                                                                                     context, relays[m]))}
        for r, out in zip(rows, outs, strict=True):
            if r.state != "active":
                continue
            changed, unconfirmed = False, set()
            for g in out.groups:
                if g.manager not in where:
                    continue
                if g.manager in silent and g.manager_reservation_id in unknown[g.manager]:
                    unconfirmed.add(g.manager)
                    continue
                if relays[g.manager]:
                    for n in where[g.manager].notes.get(g.manager_reservation_id, ()):
                        said = f"{g.manager}: {n}"
                        if said not in out.notes:      # (its notes from when it was reserved are stored here)
                            out.notes.append(said)
                for x in g.resources:
                    now = where[g.manager].address.get(x.id)
                    if now and now != x.address:
                        x.address, changed = now, True
            for m in sorted(unconfirmed):
                out.notes.append(f"{m}: the addresses of its resources are as last known ({silent[m]}); if one "
                                 f"cannot be reached, read the reservation again once {m} is up")
            if changed:
                self._readdress(r.id, r.allocation or b"", out)
        return outs

    def _relays(self, manager: str) -> bool:
        """Whether `manager` is a CRS below this one (it offers other managers' resources: stacking.py). What it
        says of where they are is only as fresh as what it last heard from them: it is asked at every read (it
        asks its own managers as this CRS asks its own)."""
        state = self.registry.get(manager)
        return state is not None and bool(state.below)

    def ask_where(self, manager: str, w: Whereabouts, tenant: str, parts: set[str],
                   context, relay: bool = False) -> str:  # noqa: ANN001
        """Ask `manager` where the resources of `tenant`'s `parts` there are now (into `w`, its Whereabouts);
        "" once it answered, else why not. `relay`: asked even about parts it answered before (`_relays`)."""
        # Within the caller's deadline, with time left to answer it, the wait for another read's call included.
        left = context.time_remaining() if context is not None else None
        cut = left is not None and left - 0.5 < ADDRESS_TIMEOUT_S
        deadline = time.monotonic() + min(ADDRESS_TIMEOUT_S, math.inf if left is None else max(0.0, left - 0.5))
        # A burst of reads after a restart asks once; the others wait for its answer, no longer than their own
        # budget (a manager slow to answer must not hold every server thread).
        if not w.lock.acquire(timeout=max(0.0, deadline - time.monotonic())):
            return f"{manager} is slow to answer where its resources are"
        try:
            if not relay:
                parts = {p for p in parts if p not in w.parts}
                if tenant in w.tenants or not parts:
                    return ""
            if self.clock.now() < w.silent_until:
                return w.silence
            state = self.registry.get(manager)
            if state is None or not state.up:
                return "the manager is down" if state is not None else "the manager is not registered"
            stub = state.stub()
            try:
                if len(parts) == 1:
                    [part] = parts
                    try:
                        answers = [stub.GetReservation(irm_pb2.GetReservationRequest(
                            tenant=tenant, reservation_id=part), timeout=max(0.01, deadline - time.monotonic()))]
                    except grpc.RpcError as e:
                        if e.code() != grpc.StatusCode.NOT_FOUND:
                            raise
                        answers = []      # it holds nothing under that id: nothing of it to show anew
                    w.parts.add(part)
                else:
                    answers, token = [], ""
                    while True:
                        page = stub.ListReservations(irm_pb2.ListReservationsRequest(
                            tenant=tenant, page_size=paging.MAX_PAGE_SIZE, page_token=token),
                            timeout=max(0.01, deadline - time.monotonic()))
                        answers.extend(page.reservations)
                        w.parts.update(x.id for x in page.reservations)
                        token = page.next_page_token
                        if not token:
                            break
                    w.tenants.add(tenant)
            except grpc.RpcError as e:
                why = f"{manager} did not answer ({e.code().name})"
                log.info("could not ask a manager where its resources are", extra={
                    "manager": manager, "code": str(e.code())})
                if not (cut and e.code() == grpc.StatusCode.DEADLINE_EXCEEDED):
                    # Not asked again for a while. A call cut short by this caller's own near deadline says nothing
                    # of the manager: the next read asks.
                    w.silent_until = self.clock.now() + ADDRESS_RETRY_S
                    w.silence = why
                # Its answers of earlier pages stand (they are this registration's).
                return why
            for res in answers:
                if relay:
                    w.notes[res.id] = list(res.notes)
                for g in res.groups:
                    for x in g.resources:
                        if x.address:
                            w.address[x.id] = x.address
            return ""
        finally:
            w.lock.release()

    def _readdress(self, res_id: str, was: bytes, out: irm_pb2.Reservation) -> None:
        """Record the addresses a manager gave anew: the next read while it does not answer shows these. Only
        while the stored allocation is still `was`, the one they were worked out from: a read of an earlier
        registration, answered after a later one's read wrote, must not put the older addresses back."""
        try:
            self.db.execute(READDRESS, {"rid": res_id, "was": was,
                                         "alloc": irm_pb2.Reservation(groups=out.groups).SerializeToString()})
        except Exception:  # noqa: BLE001 - a read still answers; the next one records them
            log.warning("could not record a reservation's new addresses", exc_info=True,
                        extra={"reservation": res_id})
