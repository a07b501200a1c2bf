"""Transactional placement and release of VMs on hosts.

No host is ever over-committed: each VM takes its share with one conditional
UPDATE (`... WHERE used + need <= capacity`) inside the reservation's write
transaction, so the capacity check and the allocation are a single atomic
step on SQLite (BEGIN IMMEDIATE) and PostgreSQL (row lock) alike. A failed
step rolls back the whole reservation: it is all-or-nothing.
"""

from __future__ import annotations

import logging
import uuid
from collections import Counter
from dataclasses import dataclass, field

from sqlalchemy import Connection, bindparam, func, insert, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, selectinload

from irm_compute import inventory as inv
from irm_compute.cost import CostModel
from irm_compute.models import Host, Owner, Reservation, Vm
from irm_compute.shapes import VmGroup
from services import paging
from services.clock import Clock
from services.db import Database, Prepared
from services.errors import (
    CAPACITY_IN_USE,
    NEVER_FITS,
    OVER_PRICE,
    RETRY_LATER_S,
    FailedPrecondition,
    HarnessError,
    NotFound,
    ResourceExhausted,
    owned,
)
from services.idempotency import reused_request_id

log = logging.getLogger(__name__)
_H, _R, _V = Host.__table__, Reservation.__table__, Vm.__table__
# Built once: constructing a statement costs more than running it on SQLite.
_TAKE = (
    update(_H)
    .where(_H.c.id == bindparam("hid"),
           _H.c.used_cores + bindparam("c") <= _H.c.cores,
           _H.c.used_memory_mb + bindparam("m") <= _H.c.memory_mb)
    .values(used_cores=_H.c.used_cores + bindparam("c"), used_memory_mb=_H.c.used_memory_mb + bindparam("m"),
            generation=_H.c.generation + 1)
    .returning(_H.c.used_cores, _H.c.used_memory_mb, _H.c.generation)
)
_GIVE_BACK = (
    update(_H)
    .where(_H.c.id == bindparam("hid"))
    .values(used_cores=_H.c.used_cores - bindparam("c"), used_memory_mb=_H.c.used_memory_mb - bindparam("m"),
            generation=_H.c.generation + 1)
    .returning(_H.c.used_cores, _H.c.used_memory_mb, _H.c.generation)
)
_RES_COLUMNS = [c.key for c in _R.c]
_VM_COLUMNS = [c.key for c in _V.c]
_INSERT_RES = insert(_R)
_INSERT_VMS = insert(_V)
_SELECT_RES = select(_R).where(_R.c.id == bindparam("rid"))
_SELECT_VMS = select(_V).where(_V.c.reservation_id == bindparam("rid")).order_by(_V.c.ordinal)
_RELEASE_RES = (update(_R)
                .where(_R.c.id == bindparam("rid"), _R.c.tenant == bindparam("who"), _R.c.state == "active")
                .values(state="released", released_at=bindparam("at"))
                .returning(*_R.c))
_RELEASE_VMS = (update(_V).where(_V.c.reservation_id == bindparam("rid"), _V.c.state == "active")
                .values(state="released").returning(*_V.c))
# Only an active VM can be marked seen: checked and marked in one statement, so a release
# cannot slip between an agent's look-up and the mark (it would never be told of it).
_MARK_SEEN = (update(_V).where(_V.c.id == bindparam("vid"), _V.c.state == "active")
              .values(agent_seen=True).returning(_V.c.id))
# The hot paths run them compiled once, on the driver's cursor (services.db.Prepared).
_P_TAKE = Prepared(_TAKE)
_P_GIVE_BACK = Prepared(_GIVE_BACK)
_P_INSERT_RES = Prepared(_INSERT_RES, columns=_RES_COLUMNS)
_P_INSERT_VMS = Prepared(_INSERT_VMS, columns=_VM_COLUMNS)
_P_SELECT_RES = Prepared(_SELECT_RES)
_P_SELECT_VMS = Prepared(_SELECT_VMS)
_P_RELEASE_RES = Prepared(_RELEASE_RES)
_P_RELEASE_VMS = Prepared(_RELEASE_VMS)
_P_MARK_SEEN = Prepared(_MARK_SEEN)

# Prices are sums of floats: a cap set to a quote of the same shapes may differ from the charge in the last bits.
_PRICE_SLACK = 1e-9


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:20]}"


@dataclass(frozen=True)
class HostUsage:
    """A host's usage right after a change, as the change's own statement returned it."""

    host_id: str
    used_cores: int
    used_memory_mb: int
    generation: int


@dataclass(slots=True)
class VmRecord:
    """A VM row as the hot paths read and write it (the ORM's Vm, without its bookkeeping)."""

    id: str
    reservation_id: str
    ordinal: int
    group: str
    host_id: str
    cores: int
    memory_mb: int
    frequency_ghz: float
    price_per_minute: float
    state: str
    agent_seen: bool


@dataclass(slots=True)
class ReservationRecord:
    """A reservation row and its VMs, as the hot paths return it (attributes as the ORM's Reservation).

    Building ORM instances costs more than the statements that fill them (~0.3 ms
    per reservation, measured); these are plain values.
    """

    id: str
    tenant: str
    request_id: str
    state: str
    price_per_minute: float
    created_at: float
    released_at: float
    groups: list[dict]
    notes: list[str]
    request_hash: str
    vms: list[VmRecord]


@dataclass(frozen=True)
class ReserveCall:
    """One reservation to make, as `reserve` and `reserve_many` take it."""

    tenant: str
    request_id: str
    groups: list[VmGroup]
    notes: list[str] = field(default_factory=list)
    # Refused inside the reservation's transaction when the price is higher: a refusal records nothing.
    max_price: float | None = None
    # The request's content, hashed (see models.Reservation.request_hash); "": not checked.
    request_hash: str = ""


@dataclass
class Outcome:
    reservation: Reservation | ReservationRecord
    # Hosts this call changed, with their usage after it (for watch events).
    touched: list[HostUsage]
    created: bool


class ComputeStore:
    def __init__(self, db: Database, cost: CostModel, clock: Clock) -> None:
        self.db = db
        self.cost = cost
        self.clock = clock
        # Static facts of every host (id, shape, traits), as of the last inventory sync.
        self._static: dict[str, Host] = {}

    # -- ownership -------------------------------------------------------
    def claim(self, name: str) -> str:
        """Record the compute IRM `name` as the owner of this database's compute tables, unless one is already:
        the owner's name (`name` when it is this IRM). The first IRM to start on a database owns it, one made
        before owners were recorded (hosts and all) included. Atomic: of two IRMs starting at once, one wins."""

        def run(s: Session) -> str:
            row = s.get(Owner, 1)
            if row is not None:
                return row.manager
            hosts = s.scalar(select(func.count()).select_from(Host)) or 0
            if hosts:
                log.info("compute IRM %r adopts this database's compute tables (%d hosts; no owner was recorded)",
                         name, hosts)
            s.add(Owner(id=1, manager=name, claimed_at=self.clock.now(), probed_at=0.0))
            return name

        try:
            return self.db.transact(run)
        except IntegrityError:          # PostgreSQL: another IRM inserted the row first; it owns the tables
            with self.db.read() as s:
                row = s.get(Owner, 1)
                assert row is not None
                return row.manager

    def probe(self) -> None:
        """A write that commits (the owner row's `probed_at`): raises while the database cannot take one."""
        self.db.transact(lambda s: s.execute(update(Owner).where(Owner.id == 1).values(probed_at=self.clock.now())),
                         attempts=1)

    # -- inventory -------------------------------------------------------
    def sync_inventory(self, inventory: inv.Inventory) -> None:
        """Make the host table match the inventory; hosts that left are disabled, not deleted."""

        def run(s: Session) -> None:
            existing = {h.id: h for h in s.scalars(select(Host))}
            wanted = {h.id for h in inventory.hosts}
            for spec in inventory.hosts:
                row = existing.get(spec.id)
                if row is None:
                    s.add(Host(id=spec.id, site=spec.site, rack=spec.rack, cores=spec.cores,
                               memory_mb=spec.memory_mb, frequency_ghz=spec.frequency_ghz,
                               traits=list(spec.traits), agent=spec.agent, used_cores=0,
                               used_memory_mb=0, generation=0, enabled=True))
                    continue
                # Never a capacity below what the host's active VMs hold (that would publish overbooking and
                # break the store's invariant): a host that shrank keeps what they use until they are released;
                # the inventory's size applies at the first start after that.
                cores, memory_mb = max(spec.cores, row.used_cores), max(spec.memory_mb, row.used_memory_mb)
                if (cores, memory_mb) != (spec.cores, spec.memory_mb):
                    log.warning(
                        "host %s: the inventory gives it %d cores / %d MB, but its active VMs hold %d cores / %d MB;"
                        " keeping %d cores / %d MB until they are released (restart the compute IRM after that to"
                        " apply the inventory's size)", spec.id, spec.cores, spec.memory_mb, row.used_cores,
                        row.used_memory_mb, cores, memory_mb)
                changed = (row.site, row.rack, row.cores, row.memory_mb, row.frequency_ghz, list(row.traits),
                           row.agent, row.enabled) != (spec.site, spec.rack, cores, memory_mb,
                                                       spec.frequency_ghz, list(spec.traits), spec.agent, True)
                if changed:
                    row.site, row.rack, row.cores, row.memory_mb = spec.site, spec.rack, cores, memory_mb
                    row.frequency_ghz, row.traits, row.agent, row.enabled = (
                        spec.frequency_ghz, list(spec.traits), spec.agent, True)
                    row.generation += 1
            for host_id, row in existing.items():
                if host_id not in wanted and row.enabled:
                    row.enabled = False
                    row.generation += 1

        self.db.transact(run)
        with self.db.read() as s:
            self._static = {h.id: h for h in s.scalars(select(Host))}

    def hosts(self) -> list[Host]:
        """The hosts in the inventory (enabled), by id."""
        with self.db.read() as s:
            return list(s.scalars(select(Host).where(Host.enabled).order_by(Host.id)))

    def all_hosts(self) -> list[Host]:
        """Every host row, those that left the inventory too: VMs may still run there (their agent and
        location are still needed, to reach and to describe them)."""
        with self.db.read() as s:
            return list(s.scalars(select(Host).order_by(Host.id)))

    def hosts_by_id(self, ids: list[str]) -> list[Host]:
        with self.db.read() as s:
            return list(s.scalars(select(Host).where(Host.id.in_(ids))))

    # -- reserve ---------------------------------------------------------
    def reserve(self, tenant: str, request_id: str, groups: list[VmGroup], notes: list[str] | None = None, *,
                max_price: float | None = None, request_hash: str = "") -> Outcome:
        return self.reserve_call(ReserveCall(tenant, request_id, groups, notes or [], max_price, request_hash))

    def reserve_call(self, call: ReserveCall) -> Outcome:
        # No look-up first: the unique (tenant, request_id) index answers "seen before?"
        # inside the transaction, and a retry is the rare case.
        try:
            return self.db.run(lambda c: self._reserve(c, call))
        except (IntegrityError, HarnessError) as e:
            out = self._replay(call, e)
            if out is e:
                raise
            if isinstance(out, Exception):
                raise out from None
            return out

    def reserve_many(self, calls: list[ReserveCall]) -> list[Outcome | Exception]:
        """Several reservations, each as `reserve` makes it: in one commit where the database
        allows, each succeeding or failing alone."""
        done = self.db.run_all([lambda c, call=call: self._reserve(c, call) for call in calls])
        out: list[Outcome | Exception] = []
        for call, (ok, value) in zip(calls, done, strict=True):
            if ok:
                out.append(value)  # type: ignore[arg-type]
            elif isinstance(value, IntegrityError | HarnessError):  # a retry? as in `reserve`
                out.append(self._replay(call, value))
            else:
                out.append(value)  # type: ignore[arg-type]
        return out

    def _replay(self, call: ReserveCall, error: Exception) -> Outcome | Exception:
        """After a failed reservation: a retry, or a concurrent request with the same id that won
        the race, gets that reservation. (A retry can also fail a take or the price cap first,
        when its hosts have filled up since.) Anything else gets `error`; an id first used for
        a different request, a refusal naming request_id."""
        existing = self._by_request(call.tenant, call.request_id)
        if existing is None:
            return error
        if call.request_hash and existing.request_hash and call.request_hash != existing.request_hash:
            return reused_request_id()
        return Outcome(existing, [], False)

    def _by_request(self, tenant: str, request_id: str) -> Reservation | None:
        with self.db.read() as s:
            return s.scalar(
                select(Reservation).options(selectinload(Reservation.vms))
                .where(Reservation.tenant == tenant, Reservation.request_id == request_id)
            )

    def _reserve(self, conn: Connection, call: ReserveCall) -> Outcome:
        # Prepared statements and plain records, not the ORM unit of work: this is the
        # hot path, and a flush costs more than the SQL.
        res = ReservationRecord(id=new_id("res"), tenant=call.tenant, request_id=call.request_id, state="active",
                                price_per_minute=0.0, created_at=self.clock.now(), released_at=0.0,
                                groups=[{"name": g.name, "count": g.count} for g in call.groups],
                                notes=list(call.notes), request_hash=call.request_hash, vms=[])
        touched: dict[str, HostUsage] = {}
        vms = res.vms
        for g in call.groups:
            for i in range(g.count):
                try:
                    host, usage = self._take(conn, g, g.placement[i] if g.placement else None)
                except ResourceExhausted:
                    # Full now, or never? Only worked out on a refusal: the hot path pays nothing.
                    self.refuse_never_fitting(call.groups)
                    raise
                price = self.cost.price_per_minute(g.cores, g.memory_mb / 1024, host.frequency_ghz)
                vms.append(VmRecord(id=new_id("vm"), reservation_id=res.id, ordinal=len(vms), group=g.name,
                                    host_id=host.id, cores=g.cores, memory_mb=g.memory_mb,
                                    frequency_ghz=host.frequency_ghz, price_per_minute=price, state="active",
                                    agent_seen=False))
                touched[host.id] = usage
        res.price_per_minute = sum(vm.price_per_minute for vm in vms)
        # Before anything is recorded: raising here rolls the takes back, and the request_id stays unused.
        self._check_price(res.price_per_minute, call.max_price)
        # The unique (tenant, request_id) index fails this insert for a retry, rolling back the takes.
        _P_INSERT_RES.execute(conn, {
            "id": res.id, "tenant": call.tenant, "request_id": call.request_id, "state": "active",
            "price_per_minute": res.price_per_minute, "created_at": res.created_at, "released_at": 0.0,
            "groups": res.groups, "notes": res.notes, "request_hash": call.request_hash})
        _P_INSERT_VMS.executemany(conn, [{k: getattr(vm, k) for k in _VM_COLUMNS} for vm in vms])
        return Outcome(res, list(touched.values()), True)

    @staticmethod
    def _check_price(price: float, cap: float | None) -> None:
        if cap is not None and price > cap + _PRICE_SLACK:
            raise FailedPrecondition(
                f"price {price:.4f}/min exceeds max_price_per_minute {cap:.4f}; nothing was reserved: "
                "raise the cap, or ask for fewer or smaller VMs (QuotePrice says what a request costs)",
                reason=OVER_PRICE, metadata={"pricePerMinute": f"{price:.4f}", "maxPricePerMinute": f"{cap:.4f}"})

    def _take(self, conn: Connection, g: VmGroup, pinned: str | None) -> tuple[Host, HostUsage]:
        """Take one VM's share of a host, atomically; the host is pinned or chosen here."""
        if pinned is not None:
            host = self.pinned_host(g, pinned)
            usage = self._cas_take(conn, host, g)
            if usage is None:
                raise ResourceExhausted(
                    f"group {g.name!r}: host {pinned!r} has no room for {g.cores} cores / "
                    f"{g.memory_mb / 1024:g} GB any more (it changed since it was chosen); retry placement",
                    reason=CAPACITY_IN_USE, retry_after_s=RETRY_LATER_S)
            return host, usage
        # Not pinned: first fit among the fullest hosts that still have room (packing), then by id in code point
        # order, as QuotePrice orders them in Python: PostgreSQL's default collation may be a locale's (another
        # order), SQLite's is that one already.
        by_id = Host.id.collate("C") if conn.dialect.name == "postgresql" else Host.id
        # Traits live in JSON, so they are matched here, a page of candidates at a time.
        query = select(_H).where(
            Host.enabled,
            Host.cores - Host.used_cores >= g.cores,
            Host.memory_mb - Host.used_memory_mb >= g.memory_mb,
            Host.frequency_ghz >= g.freq_min - 1e-9,
            Host.frequency_ghz <= (g.freq_max + 1e-9 if g.freq_max != float("inf") else 1e9),
        ).order_by(Host.used_cores.desc(), by_id)
        page, offset = 32, 0
        while True:
            candidates = [Host(**row) for row in conn.execute(query.offset(offset).limit(page)).mappings()]
            for host in candidates:
                if g.host_matches(host.frequency_ghz, set(host.traits)):
                    usage = self._cas_take(conn, host, g)
                    if usage is not None:
                        return host, usage
            if len(candidates) < page:
                break
            offset += page
        self._explain_no_room(conn, g)
        raise AssertionError("unreachable")

    def pinned_host(self, g: VmGroup, pinned: str) -> Host:
        """The host a group pins an instance to (its static facts; usage is checked by the take), or why
        it cannot be used."""
        host = self._static.get(pinned)
        if host is None or not host.enabled:
            raise NotFound(f"group {g.name!r}: host {pinned!r} is not managed here (DiscoverResources lists "
                           "the hosts)")
        if not g.host_matches(host.frequency_ghz, set(host.traits)):
            raise FailedPrecondition(
                f"group {g.name!r}: host {pinned!r} ({host.frequency_ghz} GHz, traits {sorted(host.traits)}) "
                "does not match the group's frequency or traits", reason=NEVER_FITS)
        return host

    def never_fits(self, groups: list[VmGroup]) -> str | None:
        """Why a request could not be placed even on empty hosts (as of the inventory), or None when it
        might fit once others release. Sound, not complete: it names only certain impossibilities."""
        enabled = [h for h in self._static.values() if h.enabled]
        pinned: dict[str, list[int]] = {}
        for g in groups:
            for host_id, n in Counter(g.placement).items():
                need = pinned.setdefault(host_id, [0, 0])
                need[0] += n * g.cores
                need[1] += n * g.memory_mb
        for host_id, (cores, memory_mb) in sorted(pinned.items()):
            h = self._static.get(host_id)
            if h is not None and (cores > h.cores or memory_mb > h.memory_mb):
                return (f"the VMs pinned to host {host_id!r} need {cores} cores / {memory_mb / 1024:g} GB together; "
                        f"it has {h.cores} cores / {h.memory_mb / 1024:g} GB in all: pin fewer of them there")
        union: dict[str, Host] = {}
        cores_needed = memory_needed = 0
        for g in groups:
            if g.placement:
                continue
            matching = [h for h in enabled if g.host_matches(h.frequency_ghz, set(h.traits))]
            union.update((h.id, h) for h in matching)
            cores_needed += g.count * g.cores
            memory_needed += g.count * g.memory_mb
            slots = sum(min(h.cores // g.cores, h.memory_mb // g.memory_mb) for h in matching)
            if g.count > slots:
                return (f"group {g.name!r} asks for {g.count} VMs of {g.cores} cores / {g.memory_mb / 1024:g} GB; "
                        f"the hosts matching its frequency and traits could hold at most {slots} of them even "
                        "empty: ask for fewer or smaller VMs")
        cores_total = sum(h.cores for h in union.values())
        memory_total = sum(h.memory_mb for h in union.values())
        if cores_needed > cores_total or memory_needed > memory_total:
            return (f"the unpinned groups need {cores_needed} cores / {memory_needed / 1024:g} GB together; the hosts "
                    f"matching them have {cores_total} cores / {memory_total / 1024:g} GB in all: ask for fewer or "
                    "smaller VMs")
        return None

    @staticmethod
    def _cas_take(conn: Connection, host: Host, g: VmGroup) -> HostUsage | None:
        """The capacity check and the take in one statement; the row's new usage comes back."""
        row = _P_TAKE.first(conn, {"hid": host.id, "c": g.cores, "m": g.memory_mb})
        return None if row is None else HostUsage(host.id, *row)

    def refuse_never_fitting(self, groups: list[VmGroup]) -> None:
        """FAILED_PRECONDITION (NEVER_FITS) saying why, if `never_fits` finds the request impossible."""
        if (why := self.never_fits(groups)) is not None:
            raise FailedPrecondition(f"this request can never fit, even on empty hosts: {why}", reason=NEVER_FITS)

    def never_holds(self, g: VmGroup, hosts: list[Host] | None = None) -> None:
        """FAILED_PRECONDITION (NEVER_FITS) if no host could ever hold one VM of the unpinned group `g`: none has
        its frequency and traits, or none of those is that large. `hosts`: the enabled hosts (None: as of the
        inventory sync)."""
        if hosts is None:
            hosts = [h for h in self._static.values() if h.enabled]
        fitting = [h for h in hosts if g.host_matches(h.frequency_ghz, set(h.traits))]
        if not fitting:
            raise FailedPrecondition(f"group {g.name!r}: no host has the requested frequency and traits",
                                     reason=NEVER_FITS)
        if not any(h.cores >= g.cores and h.memory_mb >= g.memory_mb for h in fitting):
            biggest = max(fitting, key=lambda h: (h.cores, h.memory_mb))
            raise FailedPrecondition(
                f"group {g.name!r}: no host can ever hold {g.cores} cores / {g.memory_mb / 1024:g} GB; the largest "
                f"matching host has {biggest.cores} cores / {biggest.memory_mb / 1024:g} GB", reason=NEVER_FITS)

    def _explain_no_room(self, conn: Connection, g: VmGroup) -> None:
        self.never_holds(g, [Host(**row) for row in conn.execute(select(_H).where(_H.c.enabled)).mappings()])
        raise ResourceExhausted(f"group {g.name!r}: every matching host is too full for {g.cores} cores / "
                                f"{g.memory_mb / 1024:g} GB right now", reason=CAPACITY_IN_USE,
                                retry_after_s=RETRY_LATER_S)

    # -- release ---------------------------------------------------------
    def release(self, tenant: str, reservation_id: str) -> Outcome:
        def run(conn: Connection) -> Outcome:
            now = self.clock.now()
            rows = _P_RELEASE_RES.mappings(conn, {"rid": reservation_id, "who": tenant, "at": now})
            if not rows:  # unknown, another tenant's, or released already: find out which
                rows = _P_SELECT_RES.mappings(conn, {"rid": reservation_id})
                if not rows:
                    raise NotFound(f"reservation {reservation_id!r} does not exist")
                owned(tenant, rows[0]["tenant"], f"reservation {reservation_id!r}")
                vms = [VmRecord(**v) for v in _P_SELECT_VMS.mappings(conn, {"rid": reservation_id})]
                return Outcome(ReservationRecord(**rows[0], vms=vms), [], False)
            vms = sorted((VmRecord(**v) for v in _P_RELEASE_VMS.mappings(conn, {"rid": reservation_id})),
                         key=lambda vm: vm.ordinal)
            touched: dict[str, HostUsage] = {}
            for vm in vms:
                usage = _P_GIVE_BACK.first(conn, {"hid": vm.host_id, "c": vm.cores, "m": vm.memory_mb})
                assert usage is not None
                touched[vm.host_id] = HostUsage(vm.host_id, *usage)
            return Outcome(ReservationRecord(**rows[0], vms=vms), list(touched.values()), True)

        return self.db.run(run)

    def mark_seen(self, vm_id: str) -> bool:
        """Record that the VM's agent knows it; False if the VM is no longer active."""
        return self.db.run(lambda c: _P_MARK_SEEN.first(c, {"vid": vm_id}) is not None)

    # -- queries ---------------------------------------------------------
    def get(self, tenant: str, reservation_id: str = "", request_id: str = "") -> Reservation:
        with self.db.read() as s:
            q = select(Reservation).options(selectinload(Reservation.vms))
            if reservation_id:
                res = s.scalar(q.where(Reservation.id == reservation_id))
                what = f"reservation {reservation_id!r}"
            else:
                res = s.scalar(q.where(Reservation.tenant == tenant, Reservation.request_id == request_id))
                what = f"no reservation of this tenant has request id {request_id!r}"
            if res is None:
                raise NotFound(f"{what} does not exist" if reservation_id else what)
            owned(tenant, res.tenant, what)
            return res

    def list(self, tenant: str, include_released: bool, page_size: int, page_token: str) -> tuple[list[Reservation], str]:
        with self.db.read() as s:
            q = select(Reservation).options(selectinload(Reservation.vms)).where(Reservation.tenant == tenant)
            if not include_released:
                q = q.where(Reservation.state == "active")
            return paging.page(s, q, [Reservation.id], page_size, page_token)

    def vm(self, vm_id: str) -> Vm:
        with self.db.read() as s:
            vm = s.scalar(select(Vm).options(selectinload(Vm.reservation)).where(Vm.id == vm_id))
            if vm is None:
                raise NotFound(f"vm {vm_id!r} does not exist")
            return vm

    # -- the invariant, checked independently of the code above ---------------
    def overbooking(self) -> list[str]:
        """Every way the database breaks 'no host over-committed' (empty: none)."""
        problems: list[str] = []
        with self.db.read() as s:
            sums = dict(
                (row[0], (row[1] or 0, row[2] or 0))
                for row in s.execute(
                    select(Vm.host_id, func.sum(Vm.cores), func.sum(Vm.memory_mb))
                    .where(Vm.state == "active").group_by(Vm.host_id))
            )
            for h in s.scalars(select(Host)):
                cores, mem = sums.get(h.id, (0, 0))
                if cores > h.cores or mem > h.memory_mb:
                    problems.append(f"{h.id}: active VMs hold {cores}/{h.cores} cores, {mem}/{h.memory_mb} MB")
                if (cores, mem) != (h.used_cores, h.used_memory_mb):
                    problems.append(f"{h.id}: counters say {h.used_cores} cores/{h.used_memory_mb} MB, "
                                    f"VMs sum to {cores}/{mem}")
        return problems
