"""The cross-resource scheduler: the IRM API in front of many IRMs (thesis §5.1.1).

A reservation is placed against the capacity view (placement.py), then
delegated to the IRMs all-or-nothing: each IRM gets a request id derived from
the CRS reservation, so whatever an IRM may have committed before failing can
be found again and released, now or (if the IRM is unreachable) later.

Crs is the servicer: it parses, places and delegates, and composes what has
a module of its own -- parsing.py (a request checked, in placement's terms),
compensation.py (giving back what managers hold; reservations left pending),
addresses.py (where parts' resources are after their manager restarted),
registration.py (the ManagerRegistry service), capacity_watch.py
(WatchCapacity), refusals.py (a manager's answers as the tenant reads them),
statements.py (the hot-path SQL) and topology_file.py.
"""

from __future__ import annotations

import logging
import math
import os
import random
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

import grpc
from sqlalchemy import select
from sqlalchemy.exc import IntegrityError

from cross_resource_scheduler import owners, parsing
from cross_resource_scheduler.addresses import ADDRESS_RETRY_S as ADDRESS_RETRY_S  # re-exported
from cross_resource_scheduler.addresses import Addresses, Whereabouts
from cross_resource_scheduler.capacity_watch import MAX_WATCHES as MAX_WATCHES  # re-exported
from cross_resource_scheduler.capacity_watch import CapacityWatch
from cross_resource_scheduler.compensation import Compensator, irm_request_id, part_request_ids
from cross_resource_scheduler.gate import PriorityGate
from cross_resource_scheduler.models import Manager, Reservation
from cross_resource_scheduler.parsing import MAX_INSTANCES as MAX_INSTANCES  # re-exported
from cross_resource_scheduler.parsing import merged_attribute
from cross_resource_scheduler.placement import (
    Placement,
    PlacementRequest,
    Unschedulable,
    as_pinned,
    filters_for,
    schedule,
)
from cross_resource_scheduler.plugins import (
    Context,
    Pipeline,
    PipelineError,
    PriceWeigher,
    price_key,
    running_plugin,
)
from cross_resource_scheduler.refusals import definite, err_from_rpc, tenant_paths
from cross_resource_scheduler.registration import MAX_INSTANCE_ID as MAX_INSTANCE_ID  # re-exported
from cross_resource_scheduler.registration import Registrations
from cross_resource_scheduler.registration import serving_at as serving_at  # re-exported
from cross_resource_scheduler.registry import ManagerState, Registry
from cross_resource_scheduler.stacking import as_one_part, refused_keys, refused_metadata
from cross_resource_scheduler.statements import (
    ACTIVATE,
    ANY_COMPENSATION,
    BY_ID,
    BY_REQUEST,
    CLAIM,
    COMPENSATE,
    DROP_PENDING,
    DUE_NOW,
    FORGET_PART,
    RELEASE,
    STAMP_PENDING,
    ReservationRow,
    to_proto,
)
from cross_resource_scheduler.topology import TopologyModel
from cross_resource_scheduler.topology_file import load_topology
from cross_resource_scheduler.view import CapacityView
from harness.v1 import common_pb2, irm_pb2, irm_pb2_grpc, registry_pb2_grpc
from services import paging, tenants
from services.clock import Clock, WallClock
from services.config import ConfigError, check_seconds
from services.db import Database, default_url
from services.errors import (
    CAPACITY_IN_USE,
    MANAGER_DOWN,
    MANAGER_UNAVAILABLE,
    OVER_PRICE,
    PIN_REFUSED,
    PIN_UNKNOWN,
    RESERVATION_PENDING,
    RETRY_LATER_S,
    SEARCH_GAVE_UP,
    Aborted,
    FailedPrecondition,
    HarnessError,
    InvalidArgument,
    NotFound,
    ResourceExhausted,
    Unavailable,
    error_info,
    owned,
    require_since,
    require_tenant,
)
from services.idempotency import request_hash, request_id_problem, reservation_key, reused_request_id
from services.registration import Membership
from services.server import Component
from services.tls import TlsSettings
from services.watch import Broadcaster

log = logging.getLogger(__name__)
# Names this module held before they moved to the modules named for them are still reached through it (by tests;
# a database call stood in for is told apart by its statement, `prepared is crs_service._ACTIVATE`): those imported
# above as themselves ("re-exported"), and these. Read them here, but change them where they live now: the code
# that uses them reads its own module's.
_ACTIVATE, _ANY_COMPENSATION, _Whereabouts = ACTIVATE, ANY_COMPENSATION, Whereabouts
MIGRATIONS = Path(__file__).parent / "migrations"
# Over a max price, placement is made again preferring cheap nodes: the price weigher's multiplier (it must
# outweigh the others), and how many kinds of node per group are quoted for it.
PRICE_MULTIPLIER = 100.0
PRICED_KINDS = 64
_ACTIVE = irm_pb2.Reservation.STATE_ACTIVE
_PARSE_CACHE = 1024
# Requests (groups and constraints serialized) larger than this are parsed each time, never cached: the cache
# holds its keys' bytes, so its memory is bounded by entries x this.
_PARSE_CACHE_MAX_BYTES = 64 * 1024
# A failed liveness check or compensation pass is tried again after at most this long.
STEP_RETRY_MAX_S = 5.0
# Beyond a Reserve's own timeouts, how long its pending row may still be in a live process's hands (the
# placement search, the database) before a starting CRS takes it for a crash's leftover.
PENDING_SLACK_S = 10.0
# Rounds of price quotes one placement attempt may add under max_price_per_minute (Crs._within_price: the
# placement's quote, the unit prices of each kind of node, the cheaper placement's quote), each up to irm_timeout_s.
QUOTE_ROUNDS = 3
# A Reserve or GetReservation meeting a reservation still being placed tells the client to ask again after this
# long: most Reserves are placed and delegated within it.
PENDING_RETRY_S = 1.0
# A placement this long, with plug-ins taking part, is logged as a warning naming their share (at most one a
# SLOW_SAID_EVERY_S): placements run one at a time, so a slow plug-in delays every request.
SLOW_PLACEMENT_S = 0.5
SLOW_SAID_EVERY_S = 60.0
# A placement still running after STUCK_PLACEMENT_S is said while it runs (then every STUCK_SAID_EVERY_S), with the
# plug-in and line it is in: one that never returns (a filter looping forever) holds the capacity view's lock, and
# every request, read or release waits on it with nothing logged (a thread cannot be stopped from outside: the
# operator must remove the plug-in and restart the CRS).
STUCK_PLACEMENT_S = 10.0
STUCK_SAID_EVERY_S = 30.0
# A Reserve stamps its pending row afresh at an attempt once the stamp is older than this: the common Reserve,
# placed and delegated within a second, writes nothing more.
PENDING_STAMP_S = 1.0


class _ViewChanged(Unavailable):
    """A resource a placement chose left the view before it was assumed: placing again may succeed."""


class _PinRefused(Exception):
    """A CRS below refused a resource this CRS pinned a group to (PIN_REFUSED): placing it elsewhere may succeed."""

    def __init__(self, manager: str, error: HarnessError) -> None:
        super().__init__(str(error))
        self.manager, self.error = manager, error
        self.placement: Placement | None = None     # what was refused, when not the caller's own (a quote's)


class _CredentialsRefused(Exception):
    """A manager refused this CRS's credentials (its control or delegation token: a misconfiguration, for the
    operators): placed again clear of all of its resources, the request may succeed elsewhere."""

    def __init__(self, manager: str, error: HarnessError) -> None:
        super().__init__(str(error))
        self.manager, self.error = manager, error


def _refused_by(manager: str, e: grpc.RpcError, field_path: Callable[[str], str],
                consequence: str = "nothing was reserved") -> Exception:
    """A manager's failed call as the CRS passes it on (refusals.err_from_rpc), or _PinRefused or
    _CredentialsRefused: to place again."""
    error = err_from_rpc(manager, e, field_path, consequence=consequence)
    if e.code() == grpc.StatusCode.UNAUTHENTICATED:
        return _CredentialsRefused(manager, error)
    return _PinRefused(manager, error) if error.reason == PIN_REFUSED else error


@dataclass
class CrsConfig(TlsSettings):
    address: str = "127.0.0.1:50051"
    database: str = ""
    state_dir: str = "~/.harness"
    # How often IRMs must heartbeat, and after how long without one they are down.
    heartbeat_interval_s: float = 2.0
    heartbeat_timeout_s: float = 6.0
    # Placement pipeline, by plug-in name (an unknown name fails at start-up).
    filters: list[str] = field(default_factory=lambda: ["traits", "properties", "capacity", "affinity", "distance"])
    weighers: dict[str, float] = field(default_factory=lambda: {"pack": 1.0, "topology": 2.0})
    sample_size: int = 16
    # Placements retried when an IRM refuses because the view was stale.
    place_attempts: int = 3
    irm_timeout_s: float = 10.0
    # Reserve calls waiting at one manager at most; one more is UNAVAILABLE at once. A manager slower than its
    # callers arrive would otherwise hold every one of the server's 32 worker threads (services.server), and
    # reserves at other managers and every manager's heartbeats would queue behind it.
    max_delegations_per_manager: int = 8
    # How long one more waits for a slot before that UNAVAILABLE: a burst at a healthy manager (calls of a few ms)
    # is queued, not refused; at a slow one the waiters give their threads back soon.
    delegation_wait_s: float = 0.5
    # How long the CRS keeps asking a manager whose Reserve it gave up on (timed out, unreachable) for the part
    # it may still commit: a manager that commits that late still gets the part taken back.
    in_doubt_horizon_s: float = 86400.0
    # Topology links (YAML list of {a, b, latency_ms, bandwidth_gbps} between sites, or racks: "r1" is the racks of
    # that name in every site, "site-a/r1" that site's; a bare name the file also names with a site is refused).
    topology_file: str = ""
    seed: int = 0
    # Managers register and heartbeat sending this (services.control); empty: any caller who reaches the CRS can
    # add a manager (development). `harness up` makes one per suite; compose takes HARNESS_CONTROL_TOKEN.
    control_token: str = ""
    # Tenants and their tokens' digests (services.tenants): a call naming a tenant must carry its token, or the
    # delegation token of the services acting for tenants (the CRS, the AM), checked against `delegation_sha256`.
    # Empty: any caller may name any tenant (development).
    tenants_file: str = ""
    # The SHA-256 of the CRS's and the AM's delegation_token ("sha256:<hex>"; `harness tenant delegation`): never
    # the token itself, which would let whoever reads this service's settings act for every tenant.
    delegation_sha256: str = ""
    # Sent with the calls the CRS makes at its managers for tenants (services.tenants); only with a tenants_file.
    # With `delegation_sha256` empty, the CRS takes the AM's calls for tenants with this token (the suite's one).
    delegation_token: str = ""
    # Stacking (stacking.py): the CRSs above this one (comma-separated). It registers with each as the manager
    # `name`, at `advertise_address` (empty: its own host and port), and offers them its managers' resources; they
    # send it their `control_token` and `delegation_token` as to any manager. Empty: a CRS at the top.
    crs_address: str = ""
    name: str = "crs"
    advertise_address: str = ""


# How often a refused registration of one manager is logged at most.
REFUSAL_LOG_S = 60.0


def _refusal(e: Unschedulable) -> HarnessError:
    """What the tenant is answered for a request placement refused."""
    # A manager down that could hold it: it is the manager the client waits for (README's contract).
    error = Unavailable if e.down else FailedPrecondition if e.unresolvable else ResourceExhausted
    return error(str(e), reason=e.reason,
                 retry_after_s=RETRY_LATER_S if e.reason in (CAPACITY_IN_USE, MANAGER_DOWN, PIN_UNKNOWN) else None,
                 metadata={"manager": ",".join(e.down)} if e.down else dict(e.metadata))


def _caller_still_there(context, request_id: str, when: str) -> None:  # noqa: ANN001
    """ABORTED when the Reserve's caller is gone (its deadline passed, it cancelled): nothing is reserved."""
    if context is not None and not context.is_active():
        raise Aborted(f"the caller of Reserve {request_id!r} went away {when} (its deadline passed or it "
                      "cancelled): nothing is reserved; retry under the same request_id with a longer deadline")


class Crs(irm_pb2_grpc.ResourceManagerServicer, registry_pb2_grpc.ManagerRegistryServicer):
    def __init__(self, config: CrsConfig, clock: Clock | None = None) -> None:
        self.config = config
        self.clock = clock or WallClock()
        # Its seconds (heartbeats, irm_timeout_s...) as `harness serve` checks them: zero or less would spin the
        # monitor and every IRM's heartbeats, or fail every call to a manager at once.
        check_seconds(config, "crs")
        for name in ("place_attempts", "max_delegations_per_manager"):
            value = getattr(config, name)
            if not (isinstance(value, int) and value >= 1):
                # Taken as 1 further on: the setting would be silently another than the one written.
                raise ConfigError(f"crs.{name} = {value!r}: expected a whole number, 1 or more")
        try:
            self.pipeline = Pipeline.from_names(config.filters, config.weighers, config.sample_size)
        except PipelineError as e:
            raise ValueError(f"crs configuration: {e}") from None
        self.topology = TopologyModel()
        if config.topology_file:
            load_topology(config.topology_file, self.topology)
        self.db = Database(config.database or default_url(config.state_dir, "crs"))
        self.db.migrate(MIGRATIONS, "alembic_version_crs")
        self.view = CapacityView()
        # WatchCapacity's streams (capacity_watch.py); `watchers` is theirs, closed when the CRS quiesces.
        self.capacity_watch = CapacityWatch(self.view, config.control_token)
        self.registry = Registry(self.view, self.clock, config.heartbeat_timeout_s,
                                 on_change=self.capacity_watch.forward, on_up=self._manager_up,
                                 on_down=self._manager_down,
                                 max_delegations=config.max_delegations_per_manager,
                                 control_token=config.control_token, delegation_token=config.delegation_token)
        self.gate = PriorityGate()
        self._specs_cache: tuple[list, dict[str, dict[str, irm_pb2.AttributeSpec]]] | None = None
        self._parsed: tuple[object, dict[tuple[tuple[bytes, ...], tuple[bytes, ...]], PlacementRequest]] = (None, {})
        # Placements differ from one CRS process to another (several on one database follow the same managers, and
        # an identical request sent to each would pick the same host and one be refused), unless `seed` makes them
        # repeat.
        self._salt = config.seed or random.SystemRandom().getrandbits(64)
        self._slow_said = -math.inf
        # RegisterManager refusals logged, by (manager, address, code): when (see RegisterManager).
        self._refusals_logged: dict[tuple[str, str, str], float] = {}
        # Named in the rows this process leaves pending while it places them (see owners.py).
        self.owner = owners.this_process()
        # Where each manager says its parts' resources are, asked again after it restarts (addresses.py).
        self.addresses = Addresses(self.db, self.registry, self.clock)
        # The ManagerRegistry service's work (registration.py).
        # A manager of ours registering as a new instance (started, restarted: its resources may have moved, its
        # types changed): the CRSs above ask us again, as we register with them as a new instance too.
        self.registrations = Registrations(self.db, self.registry, self.view, self.clock, self.addresses,
                                           config.control_token, config.heartbeat_interval_s,
                                           on_new_instance=lambda: [m.renew() for m in self.memberships],
                                           on_removed=self._manager_removed, attempts=self._attempts)
        self._stop = threading.Event()
        self._kick = threading.Event()
        self.memberships: list[Membership] = []     # in the CRSs above (`crs_address`)
        # What managers hold for reservations that are not (or no longer) a client's goes back through this
        # (compensation.py): at once where it can, else by the passes of the compensator thread, woken by _kick.
        self.compensator = Compensator(self.db, self.registry, self.view, self.clock, self.owner, self._attempts,
                                       config.irm_timeout_s, config.in_doubt_horizon_s, kick=self._kick,
                                       stop=self._stop)
        # Liveness and compensation on threads of their own: a compensation pass waits on managers (up to
        # irm_timeout_s a call), and down-detection of every other manager must not wait with it.
        self._monitor = threading.Thread(target=self._run_monitor, name="crs-monitor", daemon=True)
        self._compensating = threading.Thread(target=self._run_compensator, name="crs-compensator", daemon=True)
        # The placement under way (its thread's id, monotonic start), for the stuck-placement watch (on a thread of
        # its own: the monitor may wait on the view's lock a stuck placement holds).
        self._placing: tuple[int, float] | None = None
        self._stuck_said: tuple[float, float] | None = None     # (the placement's start, when last said)
        self._watching = threading.Thread(target=self._run_stuck_watch, name="crs-stuck-placement", daemon=True)

    @property
    def watchers(self) -> Broadcaster[irm_pb2.CapacityEvent]:
        """The WatchCapacity streams' broadcaster: the capacity watch's, read and replaced (a test caps it) under
        the name the CRS gave it before the watch had a module of its own."""
        return self.capacity_watch.watchers

    @watchers.setter
    def watchers(self, broadcaster: Broadcaster[irm_pb2.CapacityEvent]) -> None:
        self.capacity_watch.watchers = broadcaster

    # -- lifecycle -------------------------------------------------------
    def start(self, port: int | None = None) -> None:
        """Recover what a crash left, follow the known managers, and (with `crs_address`) register with the CRSs
        above, as serving at `port` unless `advertise_address` says where."""
        # A pending row is a crash's leftover only once no live process can still be placing it: a restart may
        # overlap the old process winding down (its Reserves still delegating). Rows older than that, or whose
        # owner is provably gone (a crash on this machine), are recovered now; the others once that long has
        # passed, if still pending then.
        started = self.clock.now()
        if due := self.compensator.releases_due_now():
            log.info("releases a previous CRS process was giving back are due now", extra={"parts": due})
        if self._recover(before=started - self._pending_horizon_s()):
            threading.Thread(target=self._recover_later, args=(started,), name="recover-pending",
                             daemon=True).start()
        with self.db.read() as s:
            known = list(s.scalars(select(Manager)))
        for m in known:
            # Known from before a restart: followed, but down until it heartbeats (one that registered while this
            # CRS started, serving already, is left up: it was marked down for a heartbeat interval).
            self.registry.remember(m.name, m.address, m.resource_types)
        self._monitor.start()
        self._compensating.start()
        self._watching.start()
        above = [a.strip() for a in self.config.crs_address.split(",") if a.strip()]
        if above:
            host = self.config.address.rsplit(":", 1)[0]
            advertise = self.config.advertise_address or f"{host}:{port}"
            for crs in above:
                m = Membership(crs, self.config.name, advertise, self._offered_types,
                               self.config.heartbeat_interval_s, control_token=self.config.control_token)
                m.start()
                self.memberships.append(m)

    def _offered_types(self) -> list[str]:
        """The resource types this CRS offers a CRS above: its managers' (none yet: it registers once it has)."""
        return sorted({t for m in self.registry.all() for t in m.resource_types}
                      | {spec.name for m in self.registry.all() for spec in m.specs})

    def quiesce(self) -> None:
        """Shutting down, before the server stops: leave the CRSs above, end the WatchCapacity streams."""
        for m in self.memberships:
            m.stop()
        self.watchers.close()

    def stop(self) -> None:
        """After the server's calls have finished: stop following managers and the background work, close the
        database."""
        self.quiesce()
        self._stop.set()
        self._kick.set()
        self.registry.stop()
        self._monitor.join(timeout=5)
        self._compensating.join(timeout=5)
        if self._watching.is_alive():
            self._watching.join(timeout=5)
        self.db.dispose()

    def _interval(self) -> float:
        return max(0.05, min(self.config.heartbeat_interval_s, self.config.heartbeat_timeout_s) / 2)

    def _run_monitor(self) -> None:
        self._keep_running("liveness check", self.registry.check_liveness, lambda: self._stop.wait(self._interval()))

    def _run_stuck_watch(self) -> None:
        while not self._stop.wait(1.0):
            self.check_stuck_placement()

    def check_stuck_placement(self, now: float | None = None) -> str | None:
        """A warning, if the placement under way has run STUCK_PLACEMENT_S or more (once, then every
        STUCK_SAID_EVERY_S): how long, and the plug-in it is in (its code's file and line) or the CRS's own code.
        Returns what it logged."""
        placing = self._placing
        now = time.monotonic() if now is None else now
        if placing is None or now - placing[1] < STUCK_PLACEMENT_S:
            return None
        thread_id, started = placing
        if self._stuck_said is not None and self._stuck_said[0] == started and \
                now - self._stuck_said[1] < STUCK_SAID_EVERY_S:
            return None
        self._stuck_said = (started, now)
        where = running_plugin(sys._current_frames().get(thread_id))
        text = (f"a placement has been running for {now - started:.0f} s and goes on; every request, read and release "
                f"of the CRS waits for it (placements hold the capacity view): "
                + (f"it is in {where}: remove the plug-in from the CRS's settings and restart the CRS (a running "
                   "placement cannot be stopped)" if where else "it is in the CRS's own placement code"))
        log.warning(text, extra={"seconds": round(now - started, 1), "where": where or "crs"})
        return text

    def _run_compensator(self) -> None:
        def pause() -> None:
            self._kick.wait(self._interval())
            self._kick.clear()

        recovered_at = time.monotonic()

        def step() -> None:
            nonlocal recovered_at
            # Now and then, reservations left pending longer than a live Reserve can take (a Reserve whose own
            # clean-up failed, a crash's that a start-up found too young): their parts go back.
            if time.monotonic() - recovered_at >= self._pending_horizon_s():
                recovered_at = time.monotonic()
                self._recover(before=self.clock.now() - self._pending_horizon_s())
            self._compensate_pending()
        self._keep_running("compensation pass", step, pause)

    def _keep_running(self, what: str, step: Callable[[], None], pause: Callable[[], None]) -> None:
        """`step` then `pause`, until stopped. A failing step (the database away for a moment, any error) is
        logged and tried again after a growing pause: one exception must not end down-detection or
        compensation for the life of the process."""
        failures = 0
        while not self._stop.is_set():
            try:
                step()
                failures = 0
            except Exception:  # noqa: BLE001 - logged; the loop is what keeps the CRS whole
                failures += 1
                log.exception(f"{what} failed; retrying", extra={"failures": failures})
                self._stop.wait(min(STEP_RETRY_MAX_S, 0.25 * 2 ** min(failures, 5)))
                continue
            pause()

    def _pending_horizon_s(self) -> float:
        """How long a Reserve can stay pending in a live process, with room to spare: its placement attempts,
        each waiting for a delegation slot and an IRM's answer (after the call in flight to it), and under a price
        cap for QUOTE_ROUNDS of quotes. A live Reserve's row is stamped afresh at each attempt (_stamp), so time
        queued at the placement gate over several attempts does not add up against it."""
        per_attempt = self.config.delegation_wait_s + (2 + QUOTE_ROUNDS) * self.config.irm_timeout_s
        return self._attempts() * per_attempt + PENDING_SLACK_S

    def _recover_later(self, started: float) -> None:
        if not self._stop.wait(self._pending_horizon_s()):
            try:
                self._recover(before=started)
            except Exception:  # noqa: BLE001 - logged; the next start recovers them
                log.exception("could not recover reservations left pending")

    # -- giving back (compensation.py) -------------------------------------
    # The Crs's own handles on its compensator: Reserve gives back through _undo_or_remember (which a test may
    # stand in for on an instance), the lifecycle recovers and compensates through these, and so do the tests.
    def _recover(self, before: float = math.inf) -> int:
        return self.compensator.recover(before)

    def _remember(self, manager: str, tenant: str, irm_request_id: str, in_doubt: bool = False) -> None:
        self.compensator.remember(manager, tenant, irm_request_id, in_doubt)

    def _undo_or_remember(self, manager: str, tenant: str, irm_request_id: str, in_doubt: bool = False) -> None:
        self.compensator.undo_or_remember(manager, tenant, irm_request_id, in_doubt)

    def _compensate_pending(self) -> None:
        self.compensator.compensate_pending()

    def pending_compensations(self) -> int:
        return self.compensator.pending()

    # -- request parsing -------------------------------------------------
    def _specs(self) -> dict[str, dict[str, irm_pb2.AttributeSpec]]:
        """The attributes of each type a manager up provides, as all its managers (up or down) describe
        them together: a value valid at any of them is valid (a down one's is refused as UNAVAILABLE by
        placement, not as a mistake of the tenant's)."""
        managers = self.registry.all()
        # A manager's specs list is replaced, never edited: the same lists, the same answer.
        key = [(m.name, m.up, m.specs) for m in managers]
        cached = self._specs_cache
        if cached is not None and len(cached[0]) == len(key) and all(
                a[0] == b[0] and a[1] == b[1] and a[2] is b[2] for a, b in zip(cached[0], key, strict=True)):
            return cached[1]
        offered = {spec.name for m in managers if m.up for spec in m.specs}
        out: dict[str, dict[str, irm_pb2.AttributeSpec]] = defaultdict(dict)
        for m in managers:
            for spec in m.specs:
                if spec.name in offered:
                    attrs = out[spec.name]
                    for a in spec.attributes:
                        attrs[a.name] = merged_attribute(attrs.get(a.name), a)
        self._specs_cache = (key, out)
        return out

    def _parse(self, groups: list[irm_pb2.ResourceGroup], constraints: list[irm_pb2.GroupConstraint]
               ) -> PlacementRequest:
        """The request in placement's terms. A pure function of the groups, the constraints
        and the managers' specs, and placement only reads it: valid requests are cached by
        their bytes while the specs stay the same (clients repeat a few shapes)."""
        specs = self._specs()
        key = (tuple(g.SerializeToString() for g in groups), tuple(c.SerializeToString() for c in constraints))
        cache = self._parsed
        if cache[0] is not specs:
            cache = self._parsed = (specs, {})
        hit = cache[1].get(key)
        if hit is not None:
            return hit
        req = parsing.parse(groups, constraints, specs, self.registry.providing, self.config.seed)
        if sum(map(len, key[0])) + sum(map(len, key[1])) > _PARSE_CACHE_MAX_BYTES or any(g.placement for g in groups):
            # Not kept: a few such requests would hold megabytes; pinned ones (a CRS above's) never repeat.
            return req
        if len(cache[1]) >= _PARSE_CACHE:
            cache[1].clear()
        cache[1][key] = req
        return req

    @staticmethod
    def _pinned(groups: list[irm_pb2.ResourceGroup], placement: Placement) -> dict[str, list[irm_pb2.ResourceGroup]]:
        """Per manager, the groups (or parts of groups) it must reserve, pinned to physical resources."""
        out: dict[str, list[irm_pb2.ResourceGroup]] = {}
        for g in groups:
            by_manager: dict[str, list[str]] = {}
            for node in placement.nodes[g.name]:
                by_manager.setdefault(node.manager, []).append(node.physical_id)
            for manager, ids in by_manager.items():
                part = irm_pb2.ResourceGroup()
                part.CopyFrom(g)
                part.count = len(ids)
                part.placement[:] = ids
                out.setdefault(manager, []).append(part)
        return out

    # -- IRM API ---------------------------------------------------------
    def DescribeAllocationSpec(self, request, context):  # noqa: N802
        # Every registered manager's types as it last described them, a down one's too: what may be asked for
        # (DiscoverResources says what is there now). A CRS above describing this one while its IRMs are down must
        # not take their types for unknown: a request then waits for them (retry later), it is not invalid.
        return irm_pb2.DescribeAllocationSpecResponse(
            resource_types=[spec for m in self.registry.all() for spec in m.specs])

    def DiscoverResources(self, request, context):  # noqa: N802
        nodes = [n for n in self.view.up_nodes() if not request.resource_type or n.resource_type == request.resource_type]
        return irm_pb2.DiscoverResourcesResponse(resources=[n.to_proto() for n in nodes],
                                                 links=self.topology.level_links())

    def QuotePrice(self, request, context):  # noqa: N802
        tenant = require_tenant(request.tenant)
        req = self._parse(list(request.groups), list(request.constraints))
        if all(g.pins for g in req.groups):
            # Priced where pinned, busy or not, as an IRM prices a pinned host: a CRS above asks for one host of
            # each kind in one call (its unit prices under max_price_per_minute), in use or not. A resource that
            # never takes its group is refused as Reserve refuses it (PIN_REFUSED: the CRS above prices elsewhere).
            try:
                placement = as_pinned(req, self.view, self.pipeline, self.topology)
            except Unschedulable as e:
                raise _refusal(e) from None
            try:
                return self._quote(tenant, list(request.groups), placement, consequence="")
            except _PinRefused as e:
                self._clear_of(req, e, placement)       # pinned here from above: the refusal goes up
                raise
            except _CredentialsRefused as e:
                raise e.error from None
        refusals: list[_PinRefused] = []
        unauthenticated: dict[str, HarnessError] = {}
        basis = self._rng_basis(req)
        for attempt in range(self._attempts()):
            try:
                placement = self._place(req, priority=0, assume_token=None,
                                        again=(basis, attempt) if refusals or unauthenticated else None)
            except HarnessError:
                if unauthenticated:
                    raise next(iter(unauthenticated.values())) from None     # as Reserve answers it
                raise
            try:
                return self._quote(tenant, list(request.groups), placement, consequence="")
            except _PinRefused as e:
                # What Reserve does: placed again clear of what a CRS below refused, so both price the same hosts.
                req = self._clear_of(req, e, placement)
                refusals.append(e)
            except _CredentialsRefused as e:
                unauthenticated[e.manager] = e.error            # as Reserve: priced clear of it
                req = self._clear_of_manager(req, e.manager)
        if not refusals:
            raise next(iter(unauthenticated.values()))
        raise self._refused_each_time(req, 0, refusals)

    def _clear_of_manager(self, req: PlacementRequest, manager: str) -> PlacementRequest:
        """`req` with every group placed clear of all of `manager`'s resources (it refused this CRS's
        credentials)."""
        with self.view.lock:
            theirs = frozenset(n.key for n in self.view.nodes.values() if n.manager == manager)
        return replace(req, groups=[replace(g, avoid=g.avoid | theirs) for g in req.groups])

    def _quote(self, tenant: str, groups: list[irm_pb2.ResourceGroup], placement: Placement,
               consequence: str = "nothing was reserved") -> irm_pb2.QuotePriceResponse:
        """The managers' quotes for `placement`; a refusal says `consequence` (QuotePrice's: none)."""
        quotes: list[irm_pb2.GroupQuote] = []
        index = {g.name: i for i, g in enumerate(groups)}
        for manager, parts in self._pinned(groups, placement).items():
            state = self.registry.get(manager)
            assert state is not None
            try:
                reply = state.stub().QuotePrice(irm_pb2.QuotePriceRequest(tenant=tenant, groups=parts),
                                                timeout=self.config.irm_timeout_s)
            except grpc.RpcError as e:
                error = _refused_by(manager, e, tenant_paths(parts, index), consequence)
                if isinstance(error, _PinRefused):
                    error.placement = placement     # (Reserve's price check quotes placements of its own)
                raise error from None
            for q in reply.groups:
                # The manager this CRS delegates to, as a Reservation's groups name it (a CRS below says its own
                # manager's name, two levels down).
                q.manager = manager
            quotes.extend(reply.groups)
        return irm_pb2.QuotePriceResponse(price_per_minute=sum(q.price_per_minute for q in quotes), groups=quotes)

    def _slow_placement(self, pipeline: Pipeline, seconds: float) -> None:
        """A warning (at most one a minute) when a placement took SLOW_PLACEMENT_S or more and plug-ins took part:
        placements run one at a time, so every request waited for it; the plug-ins' share says which to look at."""
        spent = pipeline.take_spent()
        if seconds < SLOW_PLACEMENT_S or not spent or time.monotonic() - self._slow_said < SLOW_SAID_EVERY_S:
            return
        self._slow_said = time.monotonic()
        shares = ", ".join(f"{name} {s:.3f} s" for name, s in sorted(spent.items(), key=lambda x: -x[1]))
        log.warning(f"a placement took {seconds:.3f} s, of which plug-ins: {shares}; placements run one at a time, "
                    "so every request waited for it (said at most once a minute)",
                    extra={"seconds": round(seconds, 3), "plugins": {k: round(v, 3) for k, v in spent.items()}})

    def _rng_basis(self, req: PlacementRequest) -> str:
        return f"{self._salt}:{req.seed}:{self.view.version}:{self.view.assumptions_made}"

    def _place(self, req: PlacementRequest, priority: int, assume_token: str | None,
               pipeline: Pipeline | None = None, again: tuple[str, int] | None = None) -> Placement:
        """`again`: (the RNG basis at the call's start, the attempt) of a place again after a CRS below refused:
        a quote and a Reserve placing again alike land alike (Reserve's own assume and forget moved the view's
        basis on meanwhile)."""
        # The view's lock from placing to assuming: a watch thread must not remove a placed node in between.
        with self.gate.hold(priority), self.view.lock:
            # An RNG of the request and the view as they are: with one shared RNG, a quote and a Reserve of one
            # request on an unchanged view landed on hosts of different prices; with the request's alone, every
            # identical request scanned from one offset past the hosts the earlier ones had filled (placement
            # cost growing with the cloud), and a place again after a manager's refusal chose the same host.
            rng = random.Random(f"{again[0]}:{again[1]}" if again else self._rng_basis(req))
            started = time.monotonic()
            self._placing = (threading.get_ident(), started)
            try:
                placement = schedule(req, self.view, pipeline or self.pipeline, self.topology, rng)
            except Unschedulable as e:
                log.info("unschedulable", extra={"reason": str(e), "removed_by": e.removed_by})
                raise _refusal(e) from None
            finally:
                self._placing = None
                self._slow_placement(pipeline or self.pipeline, time.monotonic() - started)
            if assume_token is not None:
                nodes = [(self.view.nodes.get(key), demand) for key, demand in placement.demand.items()]
                gone = sorted(key for key, (node, _) in zip(placement.demand, nodes, strict=True) if node is None)
                if gone:
                    # Nothing is assumed yet: nothing to take back.
                    raise _ViewChanged(f"resource{'s' if len(gone) > 1 else ''} {', '.join(gone)} left the "
                                       "capacity view (its manager removed it) while the request was placed; "
                                       "nothing was reserved, retry")
                for node, demand in nodes:
                    self.view.assume(assume_token, node, demand)
            return placement

    def Reserve(self, request, context):  # noqa: N802
        tenant = require_tenant(request.tenant)
        if (why := request_id_problem(request.request_id, 128)) is not None:
            raise InvalidArgument.of("request_id", why)
        if request.HasField("max_price_per_minute") and not (math.isfinite(request.max_price_per_minute)
                                                             and request.max_price_per_minute >= 0):
            # Every comparison with NaN is false: the cap would cap nothing; no price is below 0.
            raise InvalidArgument.of("max_price_per_minute",
                                     f"a finite price >= 0 (or leave it unset), got {request.max_price_per_minute}")
        req = self._parse(list(request.groups), list(request.constraints))
        res_id = f"crs-{os.urandom(10).hex()}"
        content = request_hash(request)
        claim = dict(id=res_id, tenant=tenant, request_id=request.request_id, state="pending",
                     priority=request.priority, price_per_minute=0.0, created_at=self.clock.now(),
                     released_at=0.0, allocation=b"", notes=[], request_hash=content, owner=str(self.owner))
        try:
            # The unique (tenant, request_id) index makes the claim the idempotency check.
            self.db.execute(CLAIM, claim)
        except IntegrityError:
            existing = self._find(tenant, request.request_id)
            if existing is None:
                raise Aborted("a concurrent request with this request_id failed; retry") from None
            if existing.request_hash and existing.request_hash != content:
                # Answering with the first reservation would hand the client something it did not ask for.
                raise reused_request_id() from None
            return self._existing(existing, context)
        try:
            return self._reserve(tenant, res_id, claim["created_at"], request, req, context)
        except BaseException:
            self.db.execute(DROP_PENDING, {"rid": res_id})
            raise

    def _find(self, tenant: str, request_id: str) -> ReservationRow | None:
        rows = self.db.fetch(BY_REQUEST, {"tenant": tenant, "req": request_id})
        return ReservationRow(**rows[0]) if rows else None

    def _existing(self, r: ReservationRow, context=None) -> irm_pb2.Reservation:  # noqa: ANN001
        if r.state == "pending":
            # Its owner gone (the CRS that placed it crashed, and this one was started on its machine), or
            # pending longer than a live Reserve can take (its own clean-up failed, say, on a database that
            # failed): a leftover. Its parts go back; the retry after this one places afresh.
            why = owners.gone(r.owner, self.owner)
            old = r.created_at < self.clock.now() - self._pending_horizon_s()
            if (why or old) and self.compensator.recover_one(r.id, r.tenant,
                                                             why or "pending longer than a Reserve takes"):
                said = f"left pending because {why}" if why else "left pending by a Reserve that failed"
                raise Aborted(f"reservation for request_id {r.request_id!r} was {said}; what it held is being "
                              "given back: retry", reason=RESERVATION_PENDING, retry_after_s=RETRY_LATER_S)
            # A client in doubt about its Reserve (the Application Manager) must tell this from "never placed": a
            # reason, and when to ask again.
            raise Aborted(f"reservation for request_id {r.request_id!r} is still being placed; retry shortly",
                          reason=RESERVATION_PENDING, retry_after_s=PENDING_RETRY_S)
        return self.addresses.current(r.tenant, [r], context)[0]

    def _reserve(self, tenant: str, res_id: str, created_at: float, request: irm_pb2.ReserveRequest,
                 req: PlacementRequest, context=None) -> irm_pb2.Reservation:  # noqa: ANN001
        groups = list(request.groups)
        by_name = {g.name: i for i, g in enumerate(groups)}
        last_error: HarnessError | None = None
        refusals: list[_PinRefused] = []
        # Managers that refused this CRS's credentials, with their refusal: placed again clear of them.
        unauthenticated: dict[str, HarnessError] = {}
        basis = self._rng_basis(req)
        stamped = created_at
        for attempt in range(self._attempts()):
            token = f"{res_id}#{attempt}"
            placed = False
            try:
                try:
                    placement = self._place(req, request.priority, token,
                                            again=(basis, attempt) if refusals or unauthenticated else None)
                except (HarnessError, Unschedulable) as e:
                    if unauthenticated and not isinstance(e, _ViewChanged):
                        # Nothing fits clear of them: the operators' misconfiguration is the answer, not a verdict
                        # on the request (which would fit where their managers refused this CRS).
                        raise next(iter(unauthenticated.values())) from None
                    raise
                placed = True
                # Queued behind other placements (a slow plug-in, a burst) past the caller's deadline: nobody
                # waits for what would be delegated now.
                _caller_still_there(context, request.request_id, "before it was delegated")
                stamped = self._stamp(res_id, stamped, request.request_id)
                pinned = self._pinned(groups, placement)
                if request.HasField("max_price_per_minute"):
                    placement = self._within_price(tenant, groups, req, request, token, placement)
                    pinned = self._pinned(groups, placement)
                allocated, notes, caught_up = self._delegate(tenant, res_id, attempt, pinned, by_name)
            except (ResourceExhausted, _ViewChanged) as e:
                self.view.forget(token)
                if not placed and isinstance(e, ResourceExhausted):
                    raise  # no room in the view now: placing again at once would find none either
                # An IRM saw capacity our view had not caught up with, or a placed resource left the view: place
                # again.
                last_error = e
                continue
            except _PinRefused as e:
                self.view.forget(token)
                req = self._clear_of(req, e, placement)
                last_error = e.error
                refusals.append(e)
                continue
            except _CredentialsRefused as e:
                self.view.forget(token)
                if any(g.pins for g in req.groups):
                    raise e.error from None     # pinned from above: not this CRS's to place elsewhere
                log.warning("a manager refused this CRS's credentials (its control or delegation token): the "
                            "request is placed again clear of it; fix the tokens", extra={
                                "manager": e.manager, "details": e.error.message[:300]})
                unauthenticated[e.manager] = e.error
                last_error = e.error
                req = self._clear_of_manager(req, e.manager)
                continue
            except BaseException:
                self.view.forget(token)
                raise
            try:
                # A caller gone while the managers reserved (its deadline passed, it cancelled) gets no answer: an
                # active reservation now would be held and charged with no one knowing its id (`harness reserve`
                # makes a random one). Its parts go back instead; a retry under the same request id places afresh.
                _caller_still_there(context, request.request_id, "while its parts were reserved")
            except Aborted:
                self.view.forget(token)
                # Never activated, so nothing to tell first (and a failing database must not leave the parts held
                # with no row naming them, as "cannot tell" would).
                for manager in pinned:
                    self._undo_or_remember(manager, tenant, irm_request_id(res_id, attempt, manager))
                raise
            self.view.commit(token, caught_up)
            allocated.sort(key=lambda g: by_name.get(g.name, 0))
            price = sum(g.price_per_minute for g in allocated)
            # One message: its bytes (groups only) are stored, then it is completed as the reply.
            out = irm_pb2.Reservation(groups=allocated)
            alloc = out.SerializeToString()
            try:
                activated = self.db.execute(ACTIVATE, {"rid": res_id, "price": price, "alloc": alloc, "said": notes,
                                                        "created": created_at})
            except BaseException:
                self._give_back_unrecorded(tenant, res_id, attempt, list(pinned))
                raise
            if not activated:
                # Its pending row is gone: another CRS process starting on this database took it for a crash's
                # leftover (and queued its parts for release). Answering ACTIVE would hand out an id no one knows.
                self._give_back_unrecorded(tenant, res_id, attempt, list(pinned))
                raise Aborted(f"reservation for request_id {request.request_id!r} was taken back while it was "
                              "being placed (another CRS process recovered it); nothing is reserved: retry")
            out.id, out.tenant, out.request_id, out.state = res_id, tenant, request.request_id, _ACTIVE
            out.priority, out.price_per_minute, out.created_at = request.priority, price, created_at
            out.notes.extend(notes)
            return out
        assert last_error is not None
        if last_error.reason == PIN_REFUSED:
            raise self._refused_each_time(req, request.priority, refusals)
        if last_error.reason == PIN_UNKNOWN and not any(g.pins for g in req.groups):
            raise ResourceExhausted(
                f"the CRSs below no longer knew resources this CRS placed the request on, {self._attempts()} "
                f"time{'s' if self._attempts() > 1 else ''} (they changed meanwhile); the last: {last_error}; "
                "nothing was reserved: retry",
                reason=PIN_UNKNOWN, retry_after_s=RETRY_LATER_S)
        if isinstance(last_error, ResourceExhausted) and not last_error.reason:
            # A manager refused what the view showed free without saying why (an older manager): in use.
            last_error.with_reason(CAPACITY_IN_USE, RETRY_LATER_S)
        raise last_error

    def _clear_of(self, req: PlacementRequest, refusal: _PinRefused, placement: Placement) -> PlacementRequest:
        """`req` with the group a CRS below refused placed clear of what it refused (stacking.py). A group pinned
        here was pinned by the CRS above: its refusal goes up, in the keys that CRS pinned."""
        error, below = refusal.error, refusal.manager
        placement = refusal.placement or placement
        pin = f"{below}/{error.metadata.get('pin', '')}"
        # The group by its name, or (a name cut to fit the status) as the one placed on the refused resource.
        g = next((g for g in req.groups if g.name == error.metadata.get("group")), None) or next(
            (g for g in req.groups if any(n.key == pin for n in placement.nodes.get(g.name, []))), None)
        if g is None:
            raise error  # not a group of this request's: passed on as it came
        with self.view.lock:
            # Down ones included: a claim that all of a prefix refuses must hold for the resources of a manager
            # down below it too (said of the up ones only, the CRS above avoided all of them: NEVER_FITS where the
            # request would fit once that manager is back).
            of_type = self.view.all_of_type(g.resource_type)
            # The pin itself whatever the list kept (a pin too long for it, a list the status left out).
            keys = refused_keys(below, error.metadata, of_type) | ({pin} & {n.key for n in of_type})
            every = [n.key for n in of_type]
        if g.pins:
            raise FailedPrecondition(str(error), reason=PIN_REFUSED,
                                     metadata=refused_metadata(g.name, pin, keys, every))
        log.info("a CRS below refused a group's resources: placed again clear of them",
                 extra={"manager": below, "group": g.name, "refused": len(keys)})
        return replace(req, groups=[replace(x, avoid=x.avoid | keys) if x is g else x for x in req.groups])

    def _refused_each_time(self, req: PlacementRequest, priority: int, refusals: list[_PinRefused]
                           ) -> HarnessError:
        """The answer once every attempt ended in a CRS below refusing where it was put: where it could go, clear
        of all they refused, is this CRS's own verdict (its refusal names refused_below); if somewhere remains
        untried, the attempts ran out (not proven impossible: a retry places afresh)."""
        try:
            self._place(req, priority, assume_token=None)
        except HarnessError as e:
            return e
        last = refusals[-1].error
        return ResourceExhausted(
            f"the CRSs below refused the resources this CRS placed the request on, {len(refusals)} "
            f"time{'s' if len(refusals) > 1 else ''} (filters "
            f"of their own, which this CRS does not run; the last: {last}); resources it has not tried remain: "
            "retry, or the operator may raise place_attempts", reason=SEARCH_GAVE_UP, retry_after_s=RETRY_LATER_S)

    def _stamp(self, res_id: str, stamped: float, request_id: str) -> float:
        """The pending row `res_id`'s stamp: `stamped`, or now once that is PENDING_STAMP_S old (the row is stamped
        again). A Reserve past the placement gate is then never taken for a crash's leftover (rows older than the
        horizon are), however long it queued there or how many attempts it made. ABORTED if the row was taken
        already."""
        now = self.clock.now()
        if now - stamped < PENDING_STAMP_S:
            return stamped
        if not self.db.execute(STAMP_PENDING, {"rid": res_id, "at": now}):
            raise Aborted(f"reservation for request_id {request_id!r} was taken back while it was being placed "
                          "(another CRS process recovered it); nothing is reserved: retry")
        return now

    def _within_price(self, tenant: str, groups: list[irm_pb2.ResourceGroup], req: PlacementRequest,
                      request: irm_pb2.ReserveRequest, token: str, placement: Placement) -> Placement:
        """`placement`, or one preferring cheap nodes when it costs more than the tenant's max price: the
        pipeline's pick weighs packing and distance, not price. Refused only if that one costs more too."""
        cap = request.max_price_per_minute
        price = self._quote(tenant, groups, placement).price_per_minute
        if price <= cap + 1e-12:
            return placement
        prices = self._unit_prices(tenant, groups, req)
        if prices:
            cheap = Pipeline(self.pipeline.filters, [(PriceWeigher(prices), PRICE_MULTIPLIER), *self.pipeline.weighers],
                             sample_size=max(self.pipeline.sample_size, len(self.view.nodes)))
            self.view.forget(token)
            placement = self._place(req, request.priority, token, cheap)
            price = self._quote(tenant, groups, placement).price_per_minute
            if price <= cap + 1e-12:
                return placement
        raise FailedPrecondition(
            f"the cheapest placement found is quoted {price:.4f}/min, over max_price_per_minute {cap:.4f}; "
            "nothing was reserved: raise the limit or ask for less",
            reason=OVER_PRICE, metadata={"pricePerMinute": f"{price:.4f}", "maxPricePerMinute": f"{cap:.4f}"})

    def _unit_prices(self, tenant: str, groups: list[irm_pb2.ResourceGroup], req: PlacementRequest
                     ) -> dict[tuple[str, tuple], float]:
        """Each group's price for one instance on each kind of node that could hold it (PriceWeigher's
        table): one QuotePrice per manager, pinned to one node of each kind (again without a kind a CRS below
        refused, PIN_REFUSED: see _quoted)."""
        asks: dict[str, list[tuple[str, tuple, irm_pb2.ResourceGroup]]] = defaultdict(list)
        by_name = {g.name: g for g in groups}
        for g in req.groups:
            ctx = Context(g, [], {}, {}, self.topology, ignore_usage=True)
            checks = [f.checker(ctx) for f in filters_for(self.pipeline, ctx)]
            kinds: dict[tuple, object] = {}
            for node in self.view.of_type(g.resource_type):
                key = price_key(node)
                # The node as on an empty cloud, as the never-fits proof shows it (`Node.empty`): a plug-in reading
                # usage must not leave a busy kind unquoted (then scored the dearest).
                if key in kinds or not all(ok(node.empty()) for ok in checks):
                    continue
                kinds[key] = node
                one = irm_pb2.ResourceGroup()
                one.CopyFrom(by_name[g.name])
                one.name, one.count = f"q{sum(len(a) for a in asks.values())}", 1
                one.placement[:] = [node.physical_id]
                asks[node.manager].append((g.name, key, one))
                if len(kinds) >= PRICED_KINDS:
                    break
        prices: dict[tuple[str, tuple], float] = {}
        for manager, items in asks.items():
            state = self.registry.get(manager)
            if state is None or not state.up:
                continue
            quoted = self._quoted(state, tenant, [one for _, _, one in items])
            for name, key, one in items:
                if one.name in quoted:
                    prices[(name, key)] = quoted[one.name]
        return prices

    def _quoted(self, state: ManagerState, tenant: str, ones: list[irm_pb2.ResourceGroup]) -> dict[str, float]:
        """The price of each one-instance group `ones` at a manager, by group name, in one call; a CRS below
        refusing one of them (PIN_REFUSED, naming it), asked again without it. Unquoted: scored as the dearest."""
        stub = state.stub()
        while ones:
            try:
                reply = stub.QuotePrice(irm_pb2.QuotePriceRequest(tenant=tenant, groups=ones),
                                        timeout=self.config.irm_timeout_s)
                return {q.name: q.price_per_minute for q in reply.groups}
            except grpc.RpcError as e:
                info = error_info(e)
                if info is None or info[0] != PIN_REFUSED:
                    return {}
                rest = [one for one in ones if one.name != info[1].get("group")]
                if len(rest) == len(ones):
                    return {}
                ones = rest
        return {}

    def _attempts(self) -> int:
        return max(1, self.config.place_attempts)

    def _give_back_unrecorded(self, tenant: str, res_id: str, attempt: int, managers: list[str]) -> None:
        """The activation failed: unless it landed after all (a commit whose answer was lost),
        the reservation is not the client's, and what the managers hold for it goes back.
        When that cannot be told, the parts stay (capacity leaks until an operator looks)
        rather than an active reservation losing its resources."""
        try:
            rows = self.db.fetch(BY_ID, {"rid": res_id})
        except Exception:  # noqa: BLE001 - cannot tell: leave the parts
            log.exception("activation failed and its outcome is unknown; parts left at the managers",
                          extra={"reservation": res_id, "managers": managers})
            return
        if rows and rows[0]["state"] != "pending":
            return  # it landed: the reservation stands
        for manager in managers:
            try:
                self._undo_or_remember(manager, tenant, irm_request_id(res_id, attempt, manager))
            except Exception:  # noqa: BLE001 - the others still go back
                log.exception("could not give back a part", extra={"reservation": res_id, "manager": manager})

    def _delegate(self, tenant: str, res_id: str, attempt: int, pinned: dict[str, list[irm_pb2.ResourceGroup]],
                  index: dict[str, int]) -> tuple[list[irm_pb2.AllocatedGroup], list[str], dict[str, int]]:
        """All-or-nothing: reserve at every manager, or give back everything taken.

        `index`: each group's position in the tenant's request (a manager's refusal names its fields there).
        Also returns, per view node, the generation from which the node's reported usage
        includes what was taken (where the manager says; see CapacityView.commit).
        """
        allocated: list[irm_pb2.AllocatedGroup] = []
        notes: list[str] = []
        caught_up: dict[str, int] = {}
        touched: list[str] = []
        in_doubt: set[str] = set()
        try:
            for manager, parts in pinned.items():
                state = self.registry.get(manager)
                if state is None or not state.up:
                    raise Unavailable(f"manager {manager!r} went down during placement; nothing was reserved",
                                      reason=MANAGER_DOWN, retry_after_s=RETRY_LATER_S, metadata={"manager": manager})
                if not state.slots.acquire(timeout=max(0.0, self.config.delegation_wait_s)):
                    raise Unavailable(
                        f"manager {manager!r} is slow: {self.config.max_delegations_per_manager} reservations have "
                        f"been waiting on it for over {self.config.delegation_wait_s:g} s; nothing was reserved, "
                        "retry later", reason=MANAGER_UNAVAILABLE, retry_after_s=RETRY_LATER_S,
                        metadata={"manager": manager})
                touched.append(manager)
                try:
                    # Overlapping delegations to one manager share a call (delegation.py).
                    reply = state.delegator.reserve(
                        irm_pb2.ReserveRequest(tenant=tenant, request_id=irm_request_id(res_id, attempt, manager),
                                               groups=parts),
                        timeout=self.config.irm_timeout_s)
                except grpc.RpcError as e:
                    if not definite(e):
                        in_doubt.add(manager)
                    raise _refused_by(manager, e, tenant_paths(parts, index)) from None
                finally:
                    state.slots.release()
                if reply.state != irm_pb2.Reservation.STATE_ACTIVE:
                    # Never activate on a part that holds nothing (it cannot happen with fresh ids; if it does,
                    # say so rather than double-book).
                    raise Aborted(f"manager {manager!r} answered with a reservation in state "
                                  f"{irm_pb2.Reservation.State.Name(reply.state)}; nothing was reserved, retry")
                groups = as_one_part(manager, reply)        # a CRS below's reply: one part of it (stacking.py)
                allocated.extend(groups)
                notes.extend(f"{manager}: {n}" for n in reply.notes)
                for g in groups:
                    for r in g.resources:
                        if r.physical_generation:
                            key = f"{manager}/{r.physical_id}"
                            caught_up[key] = max(caught_up.get(key, 0), r.physical_generation)
        except BaseException:
            for manager in touched:
                self._undo_or_remember(manager, tenant, irm_request_id(res_id, attempt, manager),
                                       in_doubt=manager in in_doubt)
            raise
        return allocated, notes, caught_up

    # A row as the tenant reads it.
    _to_proto = staticmethod(to_proto)

    # -- where the resources are (addresses.py) ----------------------------
    def _where(self, manager: str) -> Whereabouts:
        return self.addresses.where(manager)

    def _moved(self, manager: str) -> None:
        self.addresses.moved(manager)

    def _get(self, tenant: str, reservation_id: str) -> ReservationRow:
        rows = self.db.fetch(BY_ID, {"rid": reservation_id})
        if not rows or rows[0]["state"] == "pending":
            raise NotFound(f"reservation {reservation_id!r} does not exist")
        owned(tenant, rows[0]["tenant"], f"reservation {reservation_id!r}")
        return ReservationRow(**rows[0])

    def GetReservation(self, request, context):  # noqa: N802
        tenant = require_tenant(request.tenant)
        reservation_id, request_id = reservation_key(request)
        if reservation_id:
            return self.addresses.current(tenant, [self._get(tenant, reservation_id)], context)[0]
        r = self._find(tenant, request_id)
        if r is None:
            raise NotFound(f"no reservation of this tenant has request id {request_id!r}")
        # A pending one is answered as a Reserve repeated under its id would be (a leftover is recovered here
        # too): NOT_FOUND would tell a client in doubt that it was never placed.
        return self._existing(r, context)

    def ListReservations(self, request, context):  # noqa: N802
        tenant = require_tenant(request.tenant)
        states = ["active", "released"] if request.include_released else ["active"]
        with self.db.read() as s:
            rows, token = paging.page(s, select(Reservation).where(Reservation.tenant == tenant,
                                                                    Reservation.state.in_(states)),
                                      [Reservation.id], request.page_size, request.page_token)
        return irm_pb2.ListReservationsResponse(reservations=self.addresses.current(tenant, rows, context),
                                                next_page_token=token)

    def ReleaseReservation(self, request, context):  # noqa: N802
        tenant = require_tenant(request.tenant)
        if not request.reservation_id:
            raise InvalidArgument.of("reservation_id", "required")
        r = self._get(tenant, request.reservation_id)
        if r.state == "released":
            return self._to_proto(r)
        parts = sorted({(g.manager, g.manager_reservation_id) for g in self._to_proto(r).groups})
        now = self.clock.now()
        # Marked released and its parts recorded for the compensator in one transaction, before any manager is
        # asked: a CRS that dies in between leaves neither a reservation shown active whose parts are gone nor
        # parts held that no one will give back. Not due while this call gives them back itself.
        grace = now + len(parts) * self.config.irm_timeout_s + PENDING_SLACK_S
        row = dict(tenant=tenant, created_at=now, attempts=0, in_doubt=False, next_try_at=grace)
        # A part is recorded once, by its id at its manager: released by that id, it cannot be another. One the
        # allocation names no id of (a manager that answered without one) is looked for under every request id it
        # may have had, as a recovery's are.
        rows = {(m, irm_id): [dict(row, manager=m, irm_request_id="", irm_reservation_id=irm_id)] if irm_id else
                [dict(row, manager=m, irm_request_id=rid, irm_reservation_id="")
                 for rid in part_request_ids(r.id, m, self._attempts())]
                for m, irm_id in parts}

        def mark(conn) -> dict[tuple[str, str], list[int]] | None:  # type: ignore[no-untyped-def]
            if not RELEASE.execute(conn, {"rid": r.id, "at": now}):
                return None
            # Parts at a manager since deregistered were given up with it (its rows were recorded then; the note
            # says so): one neither in the database, read in the release's transaction, nor in the registry (which
            # a CRS starting fills only after it serves; a manager stood in for may be in it alone).
            known = set(conn.execute(select(Manager.name)).scalars()) | {m.name for m in self.registry.all()}
            return {part: [COMPENSATE.first(conn, one)[0] for one in rows[part]] for part in parts if part[0] in known}

        recorded = self.db.run(mark)
        if recorded is None:
            return self._to_proto(self._get(tenant, r.id))   # released meanwhile by another call
        generations: dict[tuple[str, str], int] = {}
        for (manager, irm_id), ids in recorded.items():
            given_back = self.compensator.release_part(manager, tenant, irm_id, generations=generations) == "released"
            try:
                # Given back: nothing left for the compensator. Else (the manager did not answer just now, or knows
                # no such reservation: said final only once it cannot still be settling) it is asked again at once.
                self.db.run(lambda conn, ids=ids, done=given_back: (FORGET_PART if done else DUE_NOW)
                            .executemany(conn, [{"cid": i, "now": now} for i in ids]))
            except Exception:  # noqa: BLE001 - released all the same; the compensator finds the rows in time
                log.warning("could not update a released part's compensation rows", exc_info=True,
                            extra={"reservation": r.id, "manager": manager})
            if not given_back:
                self._kick.set()
        r.state, r.released_at = "released", now
        out = self._to_proto(r)
        # Each resource's host generation as its manager says the release made it: a CRS above frees them in its
        # view at once, as this one does (stacking.py).
        for g in out.groups:
            for x in g.resources:
                x.physical_generation = generations.get((g.manager, x.id), x.physical_generation)
        return out

    def GetMetrics(self, request, context):  # noqa: N802
        tenant = require_tenant(request.tenant)
        require_since(request.since)
        if not request.reservation_id:
            raise InvalidArgument.of("reservation_id", "required: the id Reserve answered")
        r = self._get(tenant, request.reservation_id)
        series: list[common_pb2.Series] = []
        done: set[tuple[str, str]] = set()
        for g in self._to_proto(r).groups:
            key = (g.manager, g.manager_reservation_id)
            if key in done or not all(key):
                continue
            done.add(key)
            state = self.registry.get(key[0])
            if state is None:
                continue
            try:
                reply = state.stub().GetMetrics(irm_pb2.GetMetricsRequest(
                    tenant=tenant, reservation_id=key[1], since=request.since), timeout=self.config.irm_timeout_s)
            except grpc.RpcError as e:
                raise err_from_rpc(key[0], e, consequence="") from None     # a read: nothing was to be reserved
            series.extend(reply.series)
        return irm_pb2.GetMetricsResponse(series=series)

    # -- capacity events (capacity_watch.py) -------------------------------
    def WatchCapacity(self, request, context):  # noqa: N802
        yield from self.capacity_watch.stream(request, context)

    def _manager_up(self, manager: str) -> None:
        self._kick.set()  # its compensations may run now
        self.capacity_watch.publish_all_of(manager, down=False)

    def _manager_down(self, manager: str) -> None:
        self.capacity_watch.publish_all_of(manager, down=True)

    # -- registry (registration.py) ----------------------------------------
    def RegisterManager(self, request, context):  # noqa: N802
        try:
            if self.memberships and request.name == self.config.name:
                # Its resources would be offered above under this CRS's own name, as if they were this CRS's: the
                # CRSs above could not pin them (stacking.py).
                raise FailedPrecondition(f"manager name {request.name!r} is this CRS's own name in the CRSs above "
                                         "it (its `name`): register under another name")
            return self.registrations.register(request, context)
        except HarnessError as e:
            # The manager logs the refusal where it runs; this CRS's operator sees it here too (a site whose CRS
            # cannot join shows at the top only as resources missing, otherwise) -- once a minute per manager,
            # address and code: a refused manager tries again every few seconds.
            self.registrations.refused(request.name, request.address, e)
            key, now = (request.name[:128], request.address[:256], e.code.name), time.monotonic()
            if now - self._refusals_logged.get(key, -math.inf) >= REFUSAL_LOG_S:
                if len(self._refusals_logged) > 1000:   # names are the callers': the table stays bounded
                    self._refusals_logged.clear()
                self._refusals_logged[key] = now
                fix = ("give the manager this CRS's control_token (HARNESS_CONTROL_TOKEN in compose)"
                       if e.code == grpc.StatusCode.UNAUTHENTICATED else "")
                log.warning("manager registration refused (logged once a minute per manager and cause)", extra={
                    "manager": key[0], "address": key[1], "code": key[2], "details": e.message[:500], "fix": fix})
            raise

    def Heartbeat(self, request, context):  # noqa: N802
        return self.registrations.heartbeat(request, context)

    def DeregisterManager(self, request, context):  # noqa: N802
        return self.registrations.deregister(request, context)

    def _manager_removed(self, manager: str, gone: list[irm_pb2.PhysicalResource]) -> None:
        self.compensator.forget(manager)
        if gone:
            # A CRS above drops them (and the manager, when it offered nothing else there).
            self.capacity_watch.forward(manager, irm_pb2.CapacityEvent(kind=irm_pb2.CapacityEvent.KIND_REMOVED,
                                                                       resource=gone[0], more=gone[1:]))

    def ListManagers(self, request, context):  # noqa: N802
        return self.registrations.managers()


def manager_synced(state: ManagerState, timeout: float) -> bool:
    return state.synced.wait(timeout)


def component(config: CrsConfig, clock: Clock | None = None) -> Component:
    tenants.delegation(config.tenants_file, config.delegation_token, "crs")
    auth = tenants.auth(config.tenants_file, "crs", delegation_sha256=config.delegation_sha256,
                        delegation_token=config.delegation_token, delegates=True)
    crs = Crs(config, clock)

    def register(server: grpc.Server) -> None:
        irm_pb2_grpc.add_ResourceManagerServicer_to_server(crs, server)
        registry_pb2_grpc.add_ManagerRegistryServicer_to_server(crs, server)

    comp = Component(name="crs", register=register,
                     service_names=["harness.v1.ResourceManager", "harness.v1.ManagerRegistry"],
                     quiesce=crs.quiesce, stop=crs.stop, probe=crs.db.probe, extra={"crs": crs},
                     auth=auth)
    comp.start = lambda: crs.start(comp.extra.get("port"))
    return comp
