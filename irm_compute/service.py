"""The compute IRM: the IRM API over hosts and VMs, plus ComputeControl for agents."""

from __future__ import annotations

import logging
import math
import os
import queue
import threading
from collections.abc import Iterator
from concurrent import futures
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import grpc
from sqlalchemy.engine import make_url

from harness.v1 import (
    agent_pb2,
    agent_pb2_grpc,
    common_pb2,
    compute_pb2,
    compute_pb2_grpc,
    irm_pb2,
    irm_pb2_grpc,
)
from irm_compute import inventory as inv
from irm_compute import sandbox
from irm_compute.cost import CostModel
from irm_compute.models import Host, Reservation
from irm_compute.shapes import KNOWN_ATTRIBUTES, VM_TYPE, Domain, VmGroup, parse_groups
from irm_compute.store import ComputeStore, HostUsage, Outcome, ReservationRecord, ReserveCall
from services import client, control, tenants
from services.clock import Clock, WallClock
from services.config import ConfigError
from services.db import Database, default_url, unavailable_error
from services.errors import (
    CREDENTIALS_REFUSED,
    HarnessError,
    InvalidArgument,
    Unavailable,
    Violations,
    require_since,
    require_tenant,
    to_status,
)
from services.idempotency import request_hash, request_id_problem, reservation_key
from services.registration import Membership
from services.server import Component
from services.tls import TlsSettings
from services.watch import CAPACITY_TENANT_FULL, CAPACITY_WATCHES_PER_TENANT, Broadcaster

log = logging.getLogger(__name__)
MIGRATIONS = Path(__file__).parent / "migrations"


@dataclass
class ComputeConfig(TlsSettings):
    address: str = "127.0.0.1:50061"
    # Shared with the agents (services.control): required on GetVm, sent with ReleaseVm and GetVmMetrics.
    # Empty: nothing checked or sent (development).
    control_token: str = ""
    # Tenants and their tokens' digests (services.tenants): a call naming a tenant must carry its token, or the
    # delegation token of the services acting for tenants (the CRS, the AM), checked against `delegation_sha256`.
    # Empty: any caller may name any tenant (development).
    tenants_file: str = ""
    # The SHA-256 of the CRS's and the AM's delegation_token ("sha256:<hex>"; `harness tenant delegation`): never
    # the token itself, which would let whoever reads this service's settings act for every tenant.
    delegation_sha256: str = ""
    # Name under which this IRM registers with the CRS.
    name: str = "compute"
    # SQLAlchemy URL; empty: a SQLite file in state_dir.
    database: str = ""
    state_dir: str = "~/.harness"
    # Host inventory YAML; empty: the embedded default datacenter.
    inventory: str = ""
    # Agent for hosts whose inventory entry names none.
    agent_address: str = "127.0.0.1:50071"
    # Register with (and heartbeat to) these CRSs (comma-separated); empty: stand alone.
    crs_address: str = ""
    # The address the CRS should use for us; empty: the bound address.
    advertise_address: str = ""
    heartbeat_interval_s: float = 2.0
    # Execution back-end of the agents: "local" (real processes).
    backend: str = "local"
    per_core: float = 0.0396
    per_gb: float = 0.0186
    base: float = 0.0417
    reference_frequency_ghz: float = 2.2
    # Test-only fault injection at the edge: "crash_after_commit" makes the
    # process die right after committing a reservation, before answering
    # (an IRM killed mid-request). Never set in production.
    fault: str = ""


# Execution back-ends (the agents': "local" runs real processes, "replay" answers from a dataset) and test-only
# faults a compute IRM knows; anything else is refused at start-up.
BACKENDS = ("local", "replay")
FAULTS = ("", "crash_after_commit")


def check_config(config: ComputeConfig) -> None:
    """ConfigError (one line, naming the setting) for a configuration the compute IRM cannot run with: a price
    coefficient below 0 or not finite (a negative price passes any `max_price_per_minute`), a reference frequency
    not above 0, an unknown back-end or fault."""
    for name in ("per_core", "per_gb", "base"):
        value = getattr(config, name)
        if not (isinstance(value, int | float) and math.isfinite(value) and value >= 0):
            raise ConfigError(f"compute configuration: {name} {value!r}: expected a finite price per minute >= 0")
    ref = config.reference_frequency_ghz
    if not (isinstance(ref, int | float) and math.isfinite(ref) and ref > 0):
        raise ConfigError(f"compute configuration: reference_frequency_ghz {ref!r}: expected a finite number of "
                          "GHz, more than 0")
    if config.backend not in BACKENDS:
        raise ConfigError(f"compute configuration: backend {config.backend!r}: expected one of "
                          f"{', '.join(map(repr, BACKENDS))}")
    if config.fault not in FAULTS:
        raise ConfigError(f"compute configuration: fault {config.fault!r}: expected one of "
                          f"{', '.join(map(repr, FAULTS))} (test-only; leave it empty)")


MAX_PER_MESSAGE = 256
# GetMetrics: at most this long per agent call (less when the caller's deadline is nearer), and this many
# agents asked at once.
METRICS_TIMEOUT_S = 5.0
METRICS_PARALLEL = 8


def _remaining(context) -> float:  # noqa: ANN001
    """Seconds left before the caller's deadline (inf without one)."""
    left = context.time_remaining() if context is not None else None
    return math.inf if left is None else left


def coalesce(events: list[irm_pb2.CapacityEvent]) -> Iterator[irm_pb2.CapacityEvent]:
    """Consecutive events of one kind as one message (`resource` + `more`), each resource
    once, at its newest generation. A lone event goes out as it is (events are shared
    between subscribers: never modified here)."""
    if len(events) == 1:
        yield events[0]
        return
    kind: int | None = None
    run: dict[str, common_pb2.PhysicalResource] = {}

    def flush() -> Iterator[irm_pb2.CapacityEvent]:
        if kind is not None:
            first, *rest = run.values()
            yield irm_pb2.CapacityEvent(kind=kind, resource=first, more=rest)  # type: ignore[arg-type]

    for ev in events:
        if not ev.HasField("resource"):  # SNAPSHOT_END: on its own, in its place
            yield from flush()
            kind, run = None, {}
            yield ev
            continue
        if ev.kind != kind or len(run) >= MAX_PER_MESSAGE:
            yield from flush()
            kind, run = ev.kind, {}
        seen = run.get(ev.resource.id)
        if seen is None or ev.resource.generation >= seen.generation:
            run.pop(ev.resource.id, None)  # keep the order of the newest change
            run[ev.resource.id] = ev.resource
    yield from flush()


def _refusal(e: HarnessError) -> irm_pb2.ReserveOutcome:
    bad = [irm_pb2.ReserveFieldViolation(field=v.field, description=v.description)
           for v in getattr(e, "violations", [])]
    status = to_status(e)   # bounded as a Reserve's own status would be
    return irm_pb2.ReserveOutcome(error=irm_pb2.ReserveError(code=e.code.value[0], message=status.message,
                                                             field_violations=bad, details=status.details))


def _validate_request_id(request_id: str) -> None:
    if (why := request_id_problem(request_id, 128)) is not None:
        raise InvalidArgument.of("request_id", why)


class ComputeIrm(irm_pb2_grpc.ResourceManagerServicer, compute_pb2_grpc.ComputeControlServicer):
    def __init__(self, config: ComputeConfig, clock: Clock | None = None) -> None:
        check_config(config)        # before anything is opened or written
        self.config = config
        self.clock = clock or WallClock()
        # The inventory first: one this IRM cannot use is refused before a database is made or claimed for it.
        hosts = inv.load(config.inventory or None, config.agent_address)
        url = config.database or default_url(config.state_dir, f"compute-{config.name}")
        self.db = Database(url, one_writer=True)   # its writers want the same hosts' rows (see Database)
        self.db.migrate(MIGRATIONS, "alembic_version_compute")
        self.cost = CostModel(config.per_core, config.per_gb, config.base, config.reference_frequency_ghz)
        self.store = ComputeStore(self.db, self.cost, self.clock)
        # One compute IRM per database: another's inventory sync would disable this one's hosts and offer its own
        # as ours. Refused before anything of the owner's is touched.
        owner = self.store.claim(config.name)
        if owner != config.name:
            self.db.dispose()
            raise ConfigError(
                f"the database {make_url(url).render_as_string(hide_password=True)} holds the state of compute IRM "
                f"{owner!r}; this one is {config.name!r}: give each compute IRM its own database (set `database`, "
                "or leave it empty for a SQLite file of its own in state_dir)")
        self.store.sync_inventory(hosts)
        # Every host, those that left the inventory too: their VMs still need their agent and location.
        self._hosts: dict[str, Host] = {h.id: h for h in self.store.all_hosts()}
        # The attributes' ranges over the enabled hosts (the inventory is read once, at start-up): what
        # DescribeAllocationSpec advertises and what an unpinned group may ask for.
        self._ranges = Domain.of([h for h in self._hosts.values() if h.enabled])
        # Per host in the inventory, an UPDATED event with its static facts, serialised once: a change
        # event is this plus the new usage (building the message field by field costs
        # ~0.1 ms, on every reserve and release).
        self._event_bytes: dict[str, bytes] = {
            h.id: irm_pb2.CapacityEvent(kind=irm_pb2.CapacityEvent.KIND_UPDATED,
                                        resource=self._physical(h)).SerializeToString()
            for h in self._hosts.values() if h.enabled}
        self.watchers: Broadcaster[irm_pb2.CapacityEvent] = Broadcaster(
            full="WatchCapacity streams are open on this compute IRM; close one, or poll DiscoverResources",
            per_tenant=CAPACITY_WATCHES_PER_TENANT, tenant_full=CAPACITY_TENANT_FULL)
        self._release_queue: queue.Queue[tuple[str, str] | None] = queue.Queue()
        self._notifier = threading.Thread(target=self._notify_agents, name="agent-release", daemon=True)
        self.memberships: list[Membership] = []

    # -- lifecycle -------------------------------------------------------
    def start(self, port: int) -> None:
        self._notifier.start()
        host = self.config.address.rsplit(":", 1)[0]
        advertise = self.config.advertise_address or f"{host}:{port}"
        for crs in [a.strip() for a in self.config.crs_address.split(",") if a.strip()]:
            m = Membership(crs, self.config.name, advertise, [VM_TYPE], self.config.heartbeat_interval_s,
                           control_token=self.config.control_token)
            m.start()
            self.memberships.append(m)

    def quiesce(self) -> None:
        """Shutting down, before the server stops: leave the CRS and end the WatchCapacity streams."""
        for m in self.memberships:
            m.stop()
        self.watchers.close()

    def stop(self) -> None:
        """After the server's calls have finished: tell the agents of the last releases, close the database."""
        self.quiesce()
        self._release_queue.put(None)
        self._notifier.join(timeout=5)
        self.db.dispose()

    # -- conversions -----------------------------------------------------
    def _location(self, host_id: str) -> common_pb2.Location:
        h = self._hosts.get(host_id)
        return common_pb2.Location(site=h.site, rack=h.rack, host=h.id) if h else common_pb2.Location(host=host_id)

    def _physical(self, h: Host) -> common_pb2.PhysicalResource:
        return common_pb2.PhysicalResource(
            id=h.id, resource_type=VM_TYPE,
            capacity={"cores": h.cores, "memory_gb": h.memory_mb / 1024},
            used={"cores": h.used_cores, "memory_gb": h.used_memory_mb / 1024},
            properties={"frequency_ghz": h.frequency_ghz},
            traits=list(h.traits), location=common_pb2.Location(site=h.site, rack=h.rack, host=h.id),
            generation=h.generation, manager=self.config.name,
        )

    def _reservation(self, r: Reservation | ReservationRecord,
                     generations: dict[str, int] | None = None) -> irm_pb2.Reservation:
        """`generations`: per host, its generation right after this reservation took (or gave back) its share."""
        gens = generations or {}
        groups = []
        for g in r.groups:
            vms = [vm for vm in r.vms if vm.group == g["name"]]
            groups.append(irm_pb2.AllocatedGroup(
                name=g["name"], resource_type=VM_TYPE, manager=self.config.name, manager_reservation_id=r.id,
                price_per_minute=sum(vm.price_per_minute for vm in vms),
                resources=[irm_pb2.AllocatedResource(
                    id=vm.id, physical_id=vm.host_id,
                    address=(self._hosts[vm.host_id].agent if vm.host_id in self._hosts else ""),
                    attributes={"cores": vm.cores, "memory_gb": vm.memory_mb / 1024,
                                "frequency_ghz": vm.frequency_ghz},
                    location=self._location(vm.host_id), physical_generation=gens.get(vm.host_id, 0),
                ) for vm in vms],
            ))
        state = {"active": irm_pb2.Reservation.STATE_ACTIVE,
                 "released": irm_pb2.Reservation.STATE_RELEASED}.get(r.state, irm_pb2.Reservation.STATE_FAILED)
        return irm_pb2.Reservation(id=r.id, tenant=r.tenant, request_id=r.request_id, state=state, groups=groups,
                                   price_per_minute=r.price_per_minute, created_at=r.created_at,
                                   released_at=r.released_at, notes=list(r.notes))

    def _publish(self, touched: list[HostUsage]) -> None:
        if not self.watchers.has_subscribers():
            return
        events = []
        for u in touched:
            static = self._event_bytes.get(u.host_id)
            if static is None:
                continue
            ev = irm_pb2.CapacityEvent.FromString(static)
            r = ev.resource
            r.used["cores"], r.used["memory_gb"], r.generation = u.used_cores, u.used_memory_mb / 1024, u.generation
            events.append(ev)
        self.watchers.publish(events)

    def _local_notes(self, groups: list[VmGroup]) -> list[str]:
        if self.config.backend != "local":
            return []
        cpus = len(os.sched_getaffinity(0))
        notes = [
            f"group {g.name!r}: {g.cores} cores per VM, this machine has {cpus} CPUs; "
            f"the local back-end confines each VM to {cpus}"
            for g in groups if g.cores > cpus
        ]
        # The agent's own reserve is its setting (memory_reserve_mb); the default is what a reservation can know.
        machine = sandbox.machine_memory_mb()
        cap = math.floor(machine - sandbox.default_memory_reserve_mb(machine))
        notes += [
            f"group {g.name!r}: {g.memory_mb} MB per VM, this machine has {machine:.0f} MB; the local back-end "
            f"confines each VM to its memory less the agent's reserve ({cap} MB with the default reserve)"
            for g in groups if g.memory_mb > cap
        ]
        return notes

    # -- IRM API ---------------------------------------------------------
    def DescribeAllocationSpec(self, request, context):  # noqa: N802
        domain = self._ranges
        spec = irm_pb2.ResourceTypeSpec(
            name=VM_TYPE, manager=self.config.name,
            description="A virtual machine of custom shape (thesis §4.2.4): any cores and memory within a host.",
            metrics=["cpu_percent", "memory_percent"],
            attributes=[
                irm_pb2.AttributeSpec(name="cores", kind=irm_pb2.AttributeSpec.KIND_NUMBER, unit="cores",
                                      domain=common_pb2.Range(min=1, max=domain.max_cores), consumable=True,
                                      description="Whole CPU cores per VM.", required=True, integer=True),
                irm_pb2.AttributeSpec(name="memory_gb", kind=irm_pb2.AttributeSpec.KIND_NUMBER, unit="GB",
                                      domain=common_pb2.Range(min=1 / 1024, max=domain.max_memory_gb), consumable=True,
                                      description="Memory per VM.", required=True),
                irm_pb2.AttributeSpec(name="frequency_ghz", kind=irm_pb2.AttributeSpec.KIND_NUMBER, unit="GHz",
                                      domain=common_pb2.Range(min=domain.freq_min, max=domain.freq_max),
                                      description="CPU frequency of the host; a number or a range.",
                                      default=common_pb2.AttributeRequest(
                                          range=common_pb2.Range(min=domain.freq_min, max=domain.freq_max))),
            ],
        )
        assert set(KNOWN_ATTRIBUTES) == {a.name for a in spec.attributes}
        return irm_pb2.DescribeAllocationSpecResponse(resource_types=[spec])

    def DiscoverResources(self, request, context):  # noqa: N802
        if request.resource_type and request.resource_type != VM_TYPE:
            return irm_pb2.DiscoverResourcesResponse()
        return irm_pb2.DiscoverResourcesResponse(resources=[self._physical(h) for h in self.store.hosts()])

    def QuotePrice(self, request, context):  # noqa: N802
        require_tenant(request.tenant)
        v = Violations()
        groups = self._parse_groups(request, v)
        v.raise_if_any()
        for g in groups:                # what Reserve refuses about a group's hosts, refused here the same way
            for host_id in dict.fromkeys(g.placement):
                self.store.pinned_host(g, host_id)
            if not g.placement:
                self.store.never_holds(g)
        # The unpinned groups together, as Reserve judges a refusal. Pinned ones are priced however many share a
        # host: a CRS above prices a host of each kind by pinning instances there (`pinned_host` checks each).
        self.store.refuse_never_fitting([g for g in groups if not g.placement])
        quotes = []
        # Unpinned instances are priced where Reserve would put them now (the store's order: fullest host with
        # room first, then by id), not on the cheapest matching host: a Reserve capped at the quote must pass.
        # Each instance, in order, as Reserve takes it: usage moves with every take, pinned ones included.
        hosts = self.store.hosts()
        used = {h.id: [h.used_cores, h.used_memory_mb] for h in hosts}
        for g in groups:
            if g.placement:
                freqs = [self._hosts[h].frequency_ghz if h in self._hosts else g.freq_min for h in g.placement]
                for h in g.placement:
                    if h in used:
                        used[h][0] += g.cores
                        used[h][1] += g.memory_mb
            else:
                matching = [h for h in hosts if g.host_matches(h.frequency_ghz, set(h.traits))]
                worst = max((h.frequency_ghz for h in matching), default=None)
                fallback = worst if worst is not None else (
                    g.freq_min if math.isfinite(g.freq_min) and g.freq_min else None)
                freqs = []
                left = g.count
                while left:
                    room = [h for h in matching if h.cores - used[h.id][0] >= g.cores
                            and h.memory_mb - used[h.id][1] >= g.memory_mb]
                    if not room:                # the rest would not fit now: the dearest they could cost
                        freqs += [fallback] * left
                        break
                    host = min(room, key=lambda h: (-used[h.id][0], h.id))     # the store's packing order
                    # It stays the fullest host with room as it fills: the next instances go there too, as
                    # many as fit (one pass per host, not per instance).
                    n = min(left, (host.cores - used[host.id][0]) // g.cores,
                            (host.memory_mb - used[host.id][1]) // g.memory_mb)
                    used[host.id][0] += n * g.cores
                    used[host.id][1] += n * g.memory_mb
                    freqs += [host.frequency_ghz] * n
                    left -= n
            price = sum(self.cost.price_per_minute(g.cores, g.memory_mb / 1024, f) for f in freqs)
            quotes.append(irm_pb2.GroupQuote(name=g.name, price_per_minute=price, manager=self.config.name))
        return irm_pb2.QuotePriceResponse(price_per_minute=sum(q.price_per_minute for q in quotes), groups=quotes)

    def _parse_groups(self, request: irm_pb2.ReserveRequest | irm_pb2.QuotePriceRequest,
                      v: Violations) -> list[VmGroup]:
        """The groups of a Reserve or a QuotePrice, checked alike: a quote of what Reserve refuses is no quote."""
        groups = parse_groups(list(request.groups), v, domain=self._ranges)
        v.check(len(request.constraints) == 0, "constraints",
                "the compute IRM places groups one by one; send constraints between groups to the CRS")
        return groups

    def _parse_reserve(self, request: irm_pb2.ReserveRequest) -> ReserveCall:
        tenant = require_tenant(request.tenant)
        _validate_request_id(request.request_id)
        v = Violations()
        groups = self._parse_groups(request, v)
        v.check(not request.HasField("max_price_per_minute") or (math.isfinite(request.max_price_per_minute)
                                                                 and request.max_price_per_minute >= 0),
                "max_price_per_minute", f"a finite price per minute >= 0 (or leave it unset), got "
                                        f"{request.max_price_per_minute}")
        v.raise_if_any()
        # The cap is checked inside the store's transaction: a refusal records nothing and leaves the id unused.
        cap = request.max_price_per_minute if request.HasField("max_price_per_minute") else None
        return ReserveCall(tenant, request.request_id, groups, self._local_notes(groups), cap, request_hash(request))

    def _after_commit(self, outcomes: list[Outcome]) -> None:
        if self.config.fault == "crash_after_commit" and any(o.created for o in outcomes):
            log.error("fault injection: dying after commit, before the reply")
            os._exit(137)
        self._publish([u for o in outcomes for u in o.touched])

    def _reply(self, outcome: Outcome) -> irm_pb2.Reservation:
        return self._reservation(outcome.reservation, {u.host_id: u.generation for u in outcome.touched})

    def Reserve(self, request, context):  # noqa: N802
        outcome = self.store.reserve_call(self._parse_reserve(request))
        self._after_commit([outcome])
        return self._reply(outcome)

    def ReserveBatch(self, request, context):  # noqa: N802
        """Each request as Reserve would answer it; the valid ones in one commit, their
        capacity changes in one watch message."""
        results: list[irm_pb2.ReserveOutcome | None] = [None] * len(request.requests)
        todo: list[tuple[int, ReserveCall]] = []
        for i, req in enumerate(request.requests):
            try:
                todo.append((i, self._parse_reserve(req)))
            except HarnessError as e:
                results[i] = _refusal(e)
        done = self.store.reserve_many([call for _, call in todo])
        self._after_commit([o for o in done if isinstance(o, Outcome)])
        for (i, _), outcome in zip(todo, done, strict=True):
            try:
                if not isinstance(outcome, Outcome):
                    raise outcome
                results[i] = irm_pb2.ReserveOutcome(reservation=self._reply(outcome))
            except HarnessError as e:
                results[i] = _refusal(e)
            except Exception as e:  # noqa: BLE001
                if (unavailable := unavailable_error(e)) is not None:     # a full disk, a server down: retry later
                    log.warning("reserve in a batch failed on the database: %s", unavailable.message,
                                extra={"request_id": request.requests[i].request_id})
                    results[i] = _refusal(unavailable)
                    continue
                log.exception("reserve in a batch failed", extra={"request_id": request.requests[i].request_id})
                results[i] = irm_pb2.ReserveOutcome(error=irm_pb2.ReserveError(
                    code=grpc.StatusCode.INTERNAL.value[0], message="internal error; see the service log"))
        return irm_pb2.ReserveBatchResponse(outcomes=results)

    def _release(self, tenant: str, reservation_id: str) -> Outcome:
        outcome = self.store.release(tenant, reservation_id)
        if outcome.created:
            self._publish(outcome.touched)
            for vm in outcome.reservation.vms:
                agent = self._hosts[vm.host_id].agent if vm.host_id in self._hosts else ""
                if agent and vm.agent_seen:
                    self._release_queue.put((agent, vm.id))
        return outcome

    def GetReservation(self, request, context):  # noqa: N802
        tenant = require_tenant(request.tenant)
        return self._reservation(self.store.get(tenant, *reservation_key(request)))

    def ListReservations(self, request, context):  # noqa: N802
        tenant = require_tenant(request.tenant)
        rows, token = self.store.list(tenant, request.include_released, request.page_size, request.page_token)
        return irm_pb2.ListReservationsResponse(reservations=[self._reservation(r) for r in rows],
                                                next_page_token=token)

    def ReleaseReservation(self, request, context):  # noqa: N802
        tenant = require_tenant(request.tenant)
        if not request.reservation_id:
            raise InvalidArgument.of("reservation_id", "required")
        outcome = self._release(tenant, request.reservation_id)
        # Each host's generation right after this release gave its share back (none if it was released before):
        # the CRS shows the capacity free at once, until its view reaches that generation.
        return self._reservation(outcome.reservation, {u.host_id: u.generation for u in outcome.touched})

    def GetMetrics(self, request, context):  # noqa: N802
        tenant = require_tenant(request.tenant)
        require_since(request.since)
        if not request.reservation_id:
            raise InvalidArgument.of("reservation_id", "required: the id Reserve answered")
        res = self.store.get(tenant, request.reservation_id, "")
        by_agent: dict[str, list[str]] = {}
        for vm in res.vms:
            agent = self._hosts[vm.host_id].agent if vm.host_id in self._hosts else ""
            if agent:
                by_agent.setdefault(agent, []).append(vm.id)
        if not by_agent:
            return irm_pb2.GetMetricsResponse()
        # The agents in parallel (a bounded few at a time), each within the caller's deadline: a hung agent
        # must neither hold this worker thread past it nor delay what the others answer.
        answers: dict[str, list[common_pb2.Series]] = {}
        refused: set[str] = set()       # agents refusing this IRM's control token
        if len(by_agent) == 1:          # one agent (the usual case): asked from this thread
            [(agent, vm_ids)] = by_agent.items()
            self._agent_metrics(agent, vm_ids, res.tenant, request.since, context, answers, refused)
        else:
            pool = ThreadPoolExecutor(max_workers=min(len(by_agent), METRICS_PARALLEL),
                                      thread_name_prefix="metrics")
            try:
                jobs = [pool.submit(self._agent_metrics, agent, vm_ids, res.tenant, request.since, context,
                                    answers, refused) for agent, vm_ids in by_agent.items()]
                left = _remaining(context)
                futures.wait(jobs, timeout=left if math.isfinite(left) else None)
            finally:
                # Calls still out end by their own deadline (the caller's); those not started never will.
                pool.shutdown(wait=False, cancel_futures=True)
        if refused and not answers:
            # Not an empty series (a VM with nothing measured yet): the operators' tokens differ.
            raise Unavailable(f"the execution agent{'s' if len(refused) > 1 else ''} of this reservation's VMs "
                              f"({', '.join(sorted(refused))}) refuse{'' if len(refused) > 1 else 's'} the compute "
                              "IRM's control token: no metrics can be read until the operator gives them the same "
                              "control_token", reason=CREDENTIALS_REFUSED)
        # VMs whose agent did not answer (in time) have no series: their metrics are unavailable.
        return irm_pb2.GetMetricsResponse(series=[x for vm in res.vms for x in answers.get(vm.id, [])])

    def _agent_metrics(self, agent: str, vm_ids: list[str], tenant: str, since: float, context,  # noqa: ANN001
                       answers: dict[str, list[common_pb2.Series]], refused: set[str]) -> None:
        """One agent's VMs' series into `answers`, one call at a time; an agent that does not answer one
        is not asked about the others (one refusing this IRM's control token goes into `refused`)."""
        stub = self._agent(agent)
        for vm_id in vm_ids:
            timeout = min(METRICS_TIMEOUT_S, _remaining(context))
            if timeout <= 0 or (context is not None and not context.is_active()):
                return
            try:
                reply = stub.GetVmMetrics(agent_pb2.GetVmMetricsRequest(vm_id=vm_id, tenant=tenant, since=since),
                                          timeout=timeout, metadata=tenants.forwarded(context))
            except grpc.RpcError as e:
                code = e.code()  # type: ignore[attr-defined]
                if code == grpc.StatusCode.UNAUTHENTICATED:
                    refused.add(agent)
                    log.warning("agent metrics unavailable: the agent refuses this IRM's control token; give both "
                                "the same control_token (HARNESS_CONTROL_TOKEN in compose)",
                                extra={"agent": agent, "vm": vm_id, "code": str(code)})
                else:
                    log.warning("agent metrics unavailable", extra={"agent": agent, "vm": vm_id, "code": str(code)})
                if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED,
                            grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.CANCELLED):
                    return
                continue
            answers[vm_id] = list(reply.series)

    def WatchCapacity(self, request, context):  # noqa: N802
        # Its caps: a tenant's, or the control plane's for a caller with the control token (services.control).
        who = control.watch_tenant(request.tenant, self.config.control_token, context)
        wanted = request.resource_type in ("", VM_TYPE)

        def snapshot():
            if wanted:
                for h in self.store.hosts():
                    yield irm_pb2.CapacityEvent(kind=irm_pb2.CapacityEvent.KIND_SNAPSHOT, resource=self._physical(h))
            yield irm_pb2.CapacityEvent(kind=irm_pb2.CapacityEvent.KIND_SNAPSHOT_END)

        # A stream over the Broadcaster's caps is refused there (RESOURCE_EXHAUSTED, STREAM_CAP).
        for batch in self.watchers.stream_batches(snapshot, context.is_active, tenant=who):
            if not wanted:
                # Another type's watch: the snapshot's end, then nothing (every event here is a vm host's).
                batch = [ev for ev in batch if not ev.HasField("resource")]
                if not batch:
                    continue
            yield from coalesce(batch)

    # -- ComputeControl --------------------------------------------------
    def GetVm(self, request, context):  # noqa: N802
        control.check(self.config.control_token, context, f"compute IRM {self.config.name!r}")
        if not request.vm_id:
            raise InvalidArgument.of("vm_id", "required")
        vm = self.store.vm(request.vm_id)
        # Marked once: agents re-confirm each VM every few seconds, and a write each time was all that GetVm
        # cost. A VM seen already needs no atomic check: its release tells the agent.
        active = vm.state == "active" and (vm.agent_seen or self.store.mark_seen(vm.id))
        return compute_pb2.Vm(
            id=vm.id, tenant=vm.reservation.tenant, reservation_id=vm.reservation_id, host=vm.host_id,
            cores=vm.cores, memory_gb=vm.memory_mb / 1024, frequency_ghz=vm.frequency_ghz,
            state=compute_pb2.Vm.STATE_ACTIVE if active else compute_pb2.Vm.STATE_RELEASED,
        )

    def _agent(self, address: str) -> agent_pb2_grpc.ExecutionAgentStub:
        """An agent's stub, sending this IRM's control token with every call."""
        return agent_pb2_grpc.ExecutionAgentStub(control.channel(client.channel(address), self.config.control_token))

    # -- background ------------------------------------------------------
    def _notify_agents(self) -> None:
        """Tell agents about released VMs off the request path, so release stays fast."""
        while True:
            item = self._release_queue.get()
            if item is None:
                return
            agent, vm_id = item
            try:
                self._agent(agent).ReleaseVm(
                    agent_pb2.ReleaseVmRequest(vm_id=vm_id), timeout=3)
            except grpc.RpcError as e:
                # An agent that is down has no processes of this VM to kill; it
                # also refuses the VM later because GetVm reports it released.
                log.info("agent not told of release", extra={"agent": agent, "vm": vm_id, "code": str(e.code())})


def component(config: ComputeConfig, clock: Clock | None = None) -> Component:
    auth = tenants.auth(config.tenants_file, "compute", delegation_sha256=config.delegation_sha256)
    irm = ComputeIrm(config, clock)

    def register(server: grpc.Server) -> None:
        irm_pb2_grpc.add_ResourceManagerServicer_to_server(irm, server)
        compute_pb2_grpc.add_ComputeControlServicer_to_server(irm, server)

    comp = Component(
        name=f"compute:{config.name}",
        register=register,
        service_names=["harness.v1.ResourceManager", "harness.v1.ComputeControl"],
        quiesce=irm.quiesce,
        stop=irm.stop,
        extra={"irm": irm},
        probe=irm.store.probe,
        auth=auth,
    )
    comp.start = lambda: irm.start(comp.extra["port"])
    return comp
