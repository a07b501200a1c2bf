"""Transactional placement and release of VMs on hosts.

No host is ever over-committed: each VM takes its share with one conditional
UPDATE (`... WHERE used + need <= capacity`) inside the reservation's write
transaction, so the capacity check and the allocation are a single atomic
step on SQLite (BEGIN IMMEDIATE) and PostgreSQL (row lock) alike. A failed
step rolls back the whole reservation: it is all-or-nothing.
"""

from __future__ import annotations

import base64
import uuid
from dataclasses import dataclass

from sqlalchemy import func, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, selectinload

from irm_compute import inventory as inv
from irm_compute.cost import CostModel
from irm_compute.models import Host, Reservation, Vm
from irm_compute.shapes import VmGroup
from services.clock import Clock
from services.db import Database
from services.errors import FailedPrecondition, InvalidArgument, NotFound, ResourceExhausted, owned


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:20]}"


@dataclass
class Outcome:
    reservation: Reservation
    touched_hosts: list[str]
    created: bool


class ComputeStore:
    def __init__(self, db: Database, cost: CostModel, clock: Clock) -> None:
        self.db = db
        self.cost = cost
        self.clock = clock

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
                changed = (row.site, row.rack, row.cores, row.memory_mb, row.frequency_ghz, list(row.traits),
                           row.agent, row.enabled) != (spec.site, spec.rack, spec.cores, spec.memory_mb,
                                                       spec.frequency_ghz, list(spec.traits), spec.agent, True)
                if changed:
                    row.site, row.rack, row.cores, row.memory_mb = spec.site, spec.rack, spec.cores, spec.memory_mb
                    row.frequency_ghz, row.traits, row.agent, row.enabled = (
                        spec.frequency_ghz, list(spec.traits), spec.agent, True)
                    row.generation += 1
            for host_id, row in existing.items():
                if host_id not in wanted and row.enabled:
                    row.enabled = False
                    row.generation += 1

        self.db.transact(run)

    def hosts(self) -> list[Host]:
        with self.db.read() as s:
            return list(s.scalars(select(Host).where(Host.enabled).order_by(Host.id)))

    def hosts_by_id(self, ids: list[str]) -> list[Host]:
        with self.db.read() as s:
            return list(s.scalars(select(Host).where(Host.id.in_(ids))))

    # -- reserve ---------------------------------------------------------
    def reserve(self, tenant: str, request_id: str, groups: list[VmGroup], notes: list[str] | None = None) -> Outcome:
        existing = self._by_request(tenant, request_id)
        if existing is not None:
            return Outcome(existing, [], False)
        try:
            return self.db.transact(lambda s: self._reserve(s, tenant, request_id, groups, notes or []))
        except IntegrityError:
            # A concurrent retry with the same request id won the race: return its result.
            existing = self._by_request(tenant, request_id)
            if existing is None:
                raise
            return Outcome(existing, [], False)

    def _by_request(self, tenant: str, request_id: str) -> Reservation | None:
        with self.db.read() as s:
            return s.scalar(
                select(Reservation).options(selectinload(Reservation.vms))
                .where(Reservation.tenant == tenant, Reservation.request_id == request_id)
            )

    def _reserve(self, s: Session, tenant: str, request_id: str, groups: list[VmGroup], notes: list[str]) -> Outcome:
        res = Reservation(id=new_id("res"), tenant=tenant, request_id=request_id, state="active",
                          created_at=self.clock.now(), released_at=0.0,
                          groups=[{"name": g.name, "count": g.count} for g in groups], notes=list(notes))
        s.add(res)
        s.flush()  # the unique (tenant, request_id) index is checked here
        touched: list[str] = []
        total = 0.0
        ordinal = 0
        for g in groups:
            for i in range(g.count):
                host = self._take(s, g, g.placement[i] if g.placement else None)
                price = self.cost.price_per_minute(g.cores, g.memory_mb / 1024, host.frequency_ghz)
                s.add(Vm(id=new_id("vm"), reservation_id=res.id, ordinal=ordinal, group=g.name,
                         host_id=host.id, cores=g.cores, memory_mb=g.memory_mb,
                         frequency_ghz=host.frequency_ghz, price_per_minute=price, state="active"))
                ordinal += 1
                total += price
                touched.append(host.id)
        res.price_per_minute = total
        s.flush()
        s.refresh(res, ["vms"])
        return Outcome(res, touched, True)

    def _take(self, s: Session, g: VmGroup, pinned: str | None) -> Host:
        """Take one VM's share of a host, atomically; the host is pinned or chosen here."""
        if pinned is not None:
            host = s.get(Host, pinned)
            if host is None or not host.enabled:
                raise NotFound(f"group {g.name!r}: host {pinned!r} is not managed here")
            if not g.host_matches(host.frequency_ghz, set(host.traits)):
                raise FailedPrecondition(
                    f"group {g.name!r}: host {pinned!r} ({host.frequency_ghz} GHz, traits {sorted(host.traits)}) "
                    "does not match the group's frequency or traits")
            if not self._cas_take(s, pinned, g):
                raise ResourceExhausted(
                    f"group {g.name!r}: host {pinned!r} has no room for {g.cores} cores / "
                    f"{g.memory_mb / 1024:g} GB any more (it changed since it was chosen); retry placement")
            return host
        # Not pinned: first fit among the fullest hosts that still have room (packing).
        candidates = s.scalars(
            select(Host).where(
                Host.enabled,
                Host.cores - Host.used_cores >= g.cores,
                Host.memory_mb - Host.used_memory_mb >= g.memory_mb,
                Host.frequency_ghz >= g.freq_min - 1e-9,
                Host.frequency_ghz <= (g.freq_max + 1e-9 if g.freq_max != float("inf") else 1e9),
            ).order_by(Host.used_cores.desc(), Host.id).limit(200)
        ).all()
        for host in candidates:
            if g.host_matches(host.frequency_ghz, set(host.traits)) and self._cas_take(s, host.id, g):
                return host
        self._explain_no_room(s, g)
        raise AssertionError("unreachable")

    @staticmethod
    def _cas_take(s: Session, host_id: str, g: VmGroup) -> bool:
        result = s.execute(
            update(Host)
            .where(Host.id == host_id,
                   Host.used_cores + g.cores <= Host.cores,
                   Host.used_memory_mb + g.memory_mb <= Host.memory_mb)
            .values(used_cores=Host.used_cores + g.cores,
                    used_memory_mb=Host.used_memory_mb + g.memory_mb,
                    generation=Host.generation + 1)
            .execution_options(synchronize_session=False)
        )
        return result.rowcount == 1

    @staticmethod
    def _explain_no_room(s: Session, g: VmGroup) -> None:
        hosts = s.scalars(select(Host).where(Host.enabled)).all()
        fitting = [h for h in hosts if g.host_matches(h.frequency_ghz, set(h.traits))]
        shape = f"{g.cores} cores / {g.memory_mb / 1024:g} GB"
        if not fitting:
            raise FailedPrecondition(f"group {g.name!r}: no host has the requested frequency and traits")
        if not any(h.cores >= g.cores and h.memory_mb >= g.memory_mb for h in fitting):
            biggest = max(fitting, key=lambda h: (h.cores, h.memory_mb))
            raise FailedPrecondition(
                f"group {g.name!r}: no host can ever hold {shape}; the largest matching host has "
                f"{biggest.cores} cores / {biggest.memory_mb / 1024:g} GB")
        raise ResourceExhausted(f"group {g.name!r}: every matching host is too full for {shape} right now")

    # -- release ---------------------------------------------------------
    def release(self, tenant: str, reservation_id: str) -> Outcome:
        def run(s: Session) -> Outcome:
            res = s.get(Reservation, reservation_id, options=[selectinload(Reservation.vms)])
            if res is None:
                raise NotFound(f"reservation {reservation_id!r} does not exist")
            owned(tenant, res.tenant, f"reservation {reservation_id!r}")
            if res.state != "active":
                return Outcome(res, [], False)
            touched = []
            for vm in res.vms:
                if vm.state != "active":
                    continue
                s.execute(
                    update(Host).where(Host.id == vm.host_id)
                    .values(used_cores=Host.used_cores - vm.cores,
                            used_memory_mb=Host.used_memory_mb - vm.memory_mb,
                            generation=Host.generation + 1)
                    .execution_options(synchronize_session=False)
                )
                vm.state = "released"
                touched.append(vm.host_id)
            res.state = "released"
            res.released_at = self.clock.now()
            return Outcome(res, touched, True)

        return self.db.transact(run)

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
        page_size = 100 if page_size <= 0 else min(page_size, 1000)
        after = ""
        if page_token:
            try:
                after = base64.urlsafe_b64decode(page_token.encode()).decode()
            except (ValueError, UnicodeDecodeError):
                raise InvalidArgument.of("page_token", "not a token from a previous response") from None
        with self.db.read() as s:
            q = (select(Reservation).options(selectinload(Reservation.vms))
                 .where(Reservation.tenant == tenant, Reservation.id > after)
                 .order_by(Reservation.id).limit(page_size + 1))
            if not include_released:
                q = q.where(Reservation.state == "active")
            rows = list(s.scalars(q))
        token = ""
        if len(rows) > page_size:
            rows = rows[:page_size]
            token = base64.urlsafe_b64encode(rows[-1].id.encode()).decode()
        return rows, token

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
