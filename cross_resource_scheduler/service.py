"""The cross-resource scheduler: the IRM API in front of many IRMs (thesis §5.1.1).

A reservation is placed against the capacity view (placement.py), then
delegated to the IRMs all-or-nothing: each IRM gets a request id derived from
the CRS reservation, so whatever an IRM may have committed before failing can
be found again and released, now or (if the IRM is unreachable) later.
"""

from __future__ import annotations

import hashlib
import logging
import math
import os
import random
import re
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from sqlalchemy import bindparam, delete, insert, select, update
from sqlalchemy.exc import IntegrityError

from cross_resource_scheduler import constraints as cons
from cross_resource_scheduler import owners
from cross_resource_scheduler.gate import PriorityGate
from cross_resource_scheduler.models import Compensation, Manager, Reservation
from cross_resource_scheduler.placement import Placement, PlacementRequest, Unschedulable, schedule
from cross_resource_scheduler.plugins import (
    Context,
    GroupDemand,
    Pipeline,
    PipelineError,
    PriceWeigher,
    price_key,
)
from cross_resource_scheduler.registry import ManagerState, Registry
from cross_resource_scheduler.topology import TopologyModel
from cross_resource_scheduler.view import CapacityView
from harness.v1 import common_pb2, irm_pb2, irm_pb2_grpc, registry_pb2, registry_pb2_grpc
from services import control, paging, tenants, tls
from services.clock import Clock, WallClock
from services.config import ConfigError, check_address, check_seconds
from services.db import Database, Prepared, default_url
from services.errors import (
    CAPACITY_IN_USE,
    MANAGER_DOWN,
    MANAGER_UNAVAILABLE,
    OVER_PRICE,
    RESERVATION_PENDING,
    RETRY_LATER_S,
    Aborted,
    FailedPrecondition,
    HarnessError,
    InvalidArgument,
    NotFound,
    ResourceExhausted,
    Unavailable,
    Violations,
    from_rpc_error,
    owned,
    require_tenant,
)
from services.idempotency import request_hash, reused_request_id
from services.server import Component
from services.tls import TlsSettings
from services.watch import Broadcaster

log = logging.getLogger(__name__)
_R = Reservation.__table__
_COLUMNS = [c.key for c in _R.c]
# Hot-path statements, compiled once and run on the driver's cursor (services.db.Prepared):
# SQLAlchemy's per-execution work costs several times these statements on SQLite.
_CLAIM = Prepared(insert(_R), columns=_COLUMNS)
_BY_ID = Prepared(select(_R).where(_R.c.id == bindparam("rid")))
_BY_REQUEST = Prepared(select(_R).where(_R.c.tenant == bindparam("tenant"), _R.c.request_id == bindparam("req")))
_ACTIVATE = Prepared(update(_R).where(_R.c.id == bindparam("rid"), _R.c.state == "pending").values(
    state="active", price_per_minute=bindparam("price"), allocation=bindparam("alloc"), notes=bindparam("said"),
    created_at=bindparam("created")))
# A pending row's time, while its Reserve works on (see Crs._stamp); activation puts the creation time back.
_STAMP_PENDING = Prepared(update(_R).where(_R.c.id == bindparam("rid"), _R.c.state == "pending").values(
    created_at=bindparam("at")))
_RELEASE = Prepared(update(_R).where(_R.c.id == bindparam("rid"), _R.c.state == "active").values(
    state="released", released_at=bindparam("at")))
_DROP_PENDING = Prepared(delete(_R).where(_R.c.id == bindparam("rid"), _R.c.state == "pending"))
# An active reservation's parts with their resources' addresses as their managers answer them now (Crs._current),
# only over the allocation the read started from: a read that learned newer addresses may have written since.
_READDRESS = Prepared(update(_R).where(_R.c.id == bindparam("rid"), _R.c.state == "active",
                                       _R.c.allocation == bindparam("was")).values(allocation=bindparam("alloc")))
_C = Compensation.__table__
# The monitor's poll (twice a second, usually finding nothing): an ORM query costs ~ms.
_ANY_COMPENSATION = Prepared(select(_C.c.id).limit(1))
# A Release records its parts for the compensator in the transaction that marks the reservation released, and
# forgets each part once its manager gave it back (Crs.ReleaseReservation): by the ids the inserts returned (one
# row per part, by its manager reservation id), each a primary-key lookup.
_COMPENSATE = Prepared(insert(_C).returning(_C.c.id), columns=[
    "manager", "tenant", "irm_request_id", "irm_reservation_id", "created_at", "attempts", "in_doubt", "next_try_at"])
_FORGET_PART = Prepared(delete(_C).where(_C.c.id == bindparam("cid")))
_DUE_NOW = Prepared(update(_C).where(_C.c.id == bindparam("cid")).values(next_try_at=bindparam("now")))
MIGRATIONS = Path(__file__).parent / "migrations"
# Answers after which a manager certainly did not commit (anything else: it may have, or may yet).
DEFINITE_REFUSALS = {grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.FAILED_PRECONDITION,
                     grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.NOT_FOUND,
                     grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.ALREADY_EXISTS}
MAX_COUNT = 1000
# Instances of one request in all (the groups' counts summed): placement's work grows with them, and it holds
# the placement gate (every other tenant's placement waits) while it works.
MAX_INSTANCES = 4096
# A group's name, at most (it is echoed in replies, stored, and part of the parse cache's keys).
MAX_GROUP_NAME = 128
# Over a max price, placement is made again preferring cheap nodes: the price weigher's multiplier (it must
# outweigh the others), and how many kinds of node per group are quoted for it.
PRICE_MULTIPLIER = 100.0
PRICED_KINDS = 64
_ACTIVE = irm_pb2.Reservation.STATE_ACTIVE
_PARSE_CACHE = 1024
# Requests (groups and constraints serialized) larger than this are parsed each time, never cached: the cache
# holds its keys' bytes, so its memory is bounded by entries x this.
_PARSE_CACHE_MAX_BYTES = 64 * 1024
# Open WatchCapacity streams at most (the Broadcaster refuses more): each holds one of the server's 32 worker
# threads (services.server), which Reserve, the IRMs' heartbeats and the health checks share; 32 idle watches
# froze the CRS.
MAX_WATCHES = 8
# A manager's instance id (RegisterManagerRequest.instance_id), at most this long.
MAX_INSTANCE_ID = 128
# How long a registration waits for the manager already registered under its name to answer a health check.
PROBE_TIMEOUT_S = 1.0
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
# A Reserve stamps its pending row afresh at an attempt once the stamp is older than this: the common Reserve,
# placed and delegated within a second, writes nothing more.
PENDING_STAMP_S = 1.0
# A compensation row not done is tried again after 0.5 s x 2^attempts, at most this long after: a manager that
# hangs is not asked for each of its rows every pass.
COMPENSATION_BACKOFF_MAX_S = 60.0
# Rows of one manager looked at per pass (rows not yet due are skipped).
_ROWS_PER_MANAGER = 50
# A reservation read after its manager restarted (registered as a new instance) asks it where the resources are
# now, for at most this long (less when the caller's deadline is nearer: `harness run` gives GetReservation 10 s); a
# manager that did not answer is not asked again for this long, its resources shown as last known meanwhile.
ADDRESS_TIMEOUT_S = 2.0
ADDRESS_RETRY_S = 5.0
_GROUP_PATH = re.compile(r"groups\[(\d+)\](.*)", re.DOTALL)


class _ViewChanged(Unavailable):
    """A resource a placement chose left the view before it was assumed: placing again may succeed."""


@dataclass
class _Whereabouts:
    """Where one manager, since it last registered as a new instance, says the resources of its parts are (an
    execution agent's address, say): a restart may have moved them, and a manager restarting registers again with
    a new instance id (this is then replaced: Crs._registered). Its parts reserved before `since` are asked about
    once, when a tenant reads them; those reserved since were answered by the manager as it is now."""

    since: float
    lock: threading.Lock = field(default_factory=threading.Lock)
    tenants: set[str] = field(default_factory=set)       # every active part of theirs there answered
    parts: set[str] = field(default_factory=set)         # manager reservation ids answered (or unknown to it)
    address: dict[str, str] = field(default_factory=dict)  # resource id -> address
    silent_until: float = -math.inf                      # the CRS clock's; not asked again before then
    silence: str = ""                                    # why it was not asked / did not answer


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


def _caller_still_there(context, request_id: str, when: str) -> None:  # noqa: ANN001
    """ABORTED when the Reserve's caller is gone (its deadline passed, it cancelled): nothing is reserved."""
    if context is not None and not context.is_active():
        raise Aborted(f"the caller of Reserve {request_id!r} went away {when} (its deadline passed or it "
                      "cancelled): nothing is reserved; retry under the same request_id with a longer deadline")


def part_request_ids(res_id: str, manager: str, attempts: int) -> list[str]:
    """Every request id a part of `res_id` at `manager` may have: one per attempt, and the single id parts had
    before ids were per attempt (`<res>@<manager>`)."""
    return [irm_request_id(res_id, a, manager) for a in range(max(attempts, _ATTEMPTS_ASKED))] + [
        f"{res_id}@{manager}"]


def merged_attribute(old: irm_pb2.AttributeSpec | None, new: irm_pb2.AttributeSpec) -> irm_pb2.AttributeSpec:
    """One attribute as several managers of a type describe it: the union of their domains (lowest min,
    highest max; a side one leaves open stays open) and of their allowed values. A value one manager's
    hosts can take is valid; placement then finds the manager whose hosts fit it."""
    if old is None:
        return new
    out = irm_pb2.AttributeSpec()
    out.CopyFrom(old)
    # Required or whole only if every manager says so (a value one manager takes is valid).
    out.required = old.required and new.required
    out.integer = old.integer and new.integer
    if old.HasField("domain") and new.HasField("domain"):
        a, b = old.domain, new.domain
        out.domain.ClearField("min")
        out.domain.ClearField("max")
        if a.HasField("min") and b.HasField("min"):
            out.domain.min = min(a.min, b.min)
        if a.HasField("max") and b.HasField("max"):
            out.domain.max = max(a.max, b.max)
    else:
        out.ClearField("domain")
    if old.allowed_values and new.allowed_values:
        out.allowed_values.extend(v for v in new.allowed_values if v not in old.allowed_values)
    else:
        del out.allowed_values[:]
    return out


def _default_amount(default: common_pb2.AttributeRequest) -> float | None:
    """What a manager takes of a consumable attribute a group leaves out: its default's number, or its range's
    lower bound; None if it gives neither as a finite amount of at least 0."""
    which = default.WhichOneof("value")
    if which == "number":
        amount = default.number
    elif which == "range" and default.range.HasField("min"):
        amount = default.range.min
    else:
        return None
    return amount if math.isfinite(amount) and amount >= 0 else None


def _domain(dom: common_pb2.Range) -> str:
    lo = f"{dom.min:g}" if dom.HasField("min") else "-inf"
    hi = f"{dom.max:g}" if dom.HasField("max") else "inf"
    return f"[{lo}, {hi}]"


def _err_from_rpc(manager: str, e: grpc.RpcError, field_path: Callable[[str], str] | None = None) -> HarnessError:
    """A manager's refusal for the tenant: its reason (ErrorInfo) and RetryInfo kept, the manager named in the
    metadata; a manager that did not answer is MANAGER_UNAVAILABLE."""
    error = from_rpc_error(f"manager {manager!r}", e, "nothing was reserved", field_path)
    if not error.reason and isinstance(error, Unavailable):
        error.with_reason(MANAGER_UNAVAILABLE, RETRY_LATER_S)
    if error.reason:
        error.metadata.setdefault("manager", manager)
    return error


def _not_ready(resource_type: str, providers: list[ManagerState]) -> str:
    down = [m.name for m in providers if not m.up]
    if down:
        return (f"the manager{'s' if len(down) > 1 else ''} of {resource_type!r} ({', '.join(down)}) "
                f"{'are' if len(down) > 1 else 'is'} down; retry later")
    # Up, but its description of the type has not arrived yet (it registered moments ago, or describing failed).
    return (f"the manager of {resource_type!r} ({', '.join(m.name for m in providers)}) has not described it "
            "yet; retry later")


def tenant_paths(parts: list[irm_pb2.ResourceGroup], index: dict[str, int]) -> Callable[[str], str]:
    """How a field of a manager's request (made of `parts`) is named in the tenant's, whose group `name` is
    `groups[index[name]]`: the manager's `groups[j]` is the tenant's group of that name. Other fields are the
    manager's own (its request id, say) and keep their names."""
    def path(theirs: str) -> str:
        m = _GROUP_PATH.fullmatch(theirs)
        if m is None:
            return theirs
        j = int(m.group(1))
        if j >= len(parts) or parts[j].name not in index:
            return theirs
        return f"groups[{index[parts[j].name]}]{m.group(2)}"
    return path


def serving_at(address: str, timeout: float = PROBE_TIMEOUT_S) -> bool:
    """Whether a manager's ResourceManager answers SERVING at `address` now."""
    # A channel of its own: the shared one may still be backing off from an earlier failure there.
    with tls.open_channel(address) as ch:
        try:
            reply = health_pb2_grpc.HealthStub(ch).Check(
                health_pb2.HealthCheckRequest(service="harness.v1.ResourceManager"), timeout=timeout)
        except grpc.RpcError:
            return False
    return reply.status == health_pb2.HealthCheckResponse.SERVING


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
            self._load_topology(config.topology_file)
        self.db = Database(config.database or default_url(config.state_dir, "crs"))
        self.db.migrate(MIGRATIONS, "alembic_version_crs")
        self.view = CapacityView()
        self.watchers: Broadcaster[irm_pb2.CapacityEvent] = Broadcaster(
            max_streams=MAX_WATCHES,
            full="WatchCapacity streams are open on this CRS; close one, or poll DiscoverResources")
        # Watch events are published under this lock, with a manager's state checked: a manager marked down
        # has its resources REMOVED downstream, and no event of its stream may slip in after that.
        self._publishing = threading.Lock()
        self.registry = Registry(self.view, self.clock, config.heartbeat_timeout_s,
                                 on_change=self._forward, on_up=self._manager_up, on_down=self._manager_down,
                                 max_delegations=config.max_delegations_per_manager,
                                 control_token=config.control_token, delegation_token=config.delegation_token)
        self.gate = PriorityGate()
        self._specs_cache: tuple[list, dict[str, dict[str, irm_pb2.AttributeSpec]]] | None = None
        self._parsed: tuple[object, dict[tuple[tuple[bytes, ...], tuple[bytes, ...]], PlacementRequest]] = (None, {})
        # Placements differ from one CRS process to another (several on one database follow the same managers, and
        # an identical request sent to each would pick the same host and one be refused), unless `seed` makes them
        # repeat.
        self._salt = config.seed or random.SystemRandom().getrandbits(64)
        # Named in the rows this process leaves pending while it places them (see owners.py).
        self.owner = owners.this_process()
        self._whereabouts: dict[str, _Whereabouts] = {}
        self._whereabouts_lock = threading.Lock()
        # Manager -> (address, instance id) of its last registration with this process (Crs._registered). In memory:
        # a restarted CRS asks every manager about its parts from before anyway (`_started_at`).
        self._instances: dict[str, tuple[str, str]] = {}
        # A manager not registered since this process started may have moved before: parts older are asked about.
        self._started_at = self.clock.now()
        self._stop = threading.Event()
        self._kick = threading.Event()
        # Liveness and compensation on threads of their own: a compensation pass waits on managers (up to
        # irm_timeout_s a call), and down-detection of every other manager must not wait with it.
        self._monitor = threading.Thread(target=self._run_monitor, name="crs-monitor", daemon=True)
        self._compensator = threading.Thread(target=self._run_compensator, name="crs-compensator", daemon=True)
        # Manager -> (calls in a row it did not answer, when to ask it again): one that hangs is not waited on
        # again each pass for its next row.
        self._silent: dict[str, tuple[int, float]] = {}

    _TOPOLOGY_KEYS = ("links",)
    _LINK_KEYS = ("a", "b", "latency_ms", "bandwidth_gbps")

    def _load_topology(self, path: str) -> None:
        """The links of the YAML file `path` ({links: [{a, b, latency_ms, bandwidth_gbps}, ...]}); ValueError,
        one line naming the file and what to fix, for anything else (a typo'd key would be a link lost)."""
        from services.config import known_keys, mapping_list, read_yaml

        data = read_yaml(path, "topology_file", ValueError)
        if data is None:
            data = {}
        if not isinstance(data, dict):
            raise ValueError(f"topology_file {path}: expected a mapping with 'links' (a list of "
                             f"{{a, b, latency_ms, bandwidth_gbps}}), got a {type(data).__name__}")
        where = f"topology_file {path}"
        known_keys(data, self._TOPOLOGY_KEYS, where, ValueError)
        links = mapping_list(data, "links", where, "{a, b, latency_ms, bandwidth_gbps}", ValueError)
        # Racks named with their site anywhere in the file: a bare name of one of them would be ambiguous (it
        # applies to the racks of that name in every site).
        sites_of: dict[str, set[str]] = defaultdict(set)
        for link in links:
            for side in ("a", "b"):
                site, sep, rack = str(link.get(side, "")).partition("/")
                if sep:
                    sites_of[rack].add(site)
        for i, link in enumerate(links):
            for side in ("a", "b"):
                name = str(link.get(side, ""))
                if "/" not in name and name in sites_of:
                    qualified = ", ".join(f"{site}/{name}" for site in sorted(sites_of[name]))
                    raise ConfigError(
                        f"{where}: links[{i}].{side}: rack {name!r} is ambiguous: this file names it with its "
                        f"site elsewhere ({qualified}), and a bare rack name applies to the racks of that name in "
                        "every site; write it as site/rack here too")
            known_keys(link, self._LINK_KEYS, f"{where}: links[{i}]", ValueError)
            try:
                self.topology.add_link(common_pb2.Link(a=str(link["a"]), b=str(link["b"]),
                                                       latency_ms=float(link.get("latency_ms", 0)),
                                                       bandwidth_gbps=float(link.get("bandwidth_gbps", 0))))
            except KeyError as e:
                raise ValueError(f"topology_file {path}: links[{i}]: missing {e.args[0]}") from None
            except (TypeError, ValueError) as e:
                raise ValueError(f"topology_file {path}: links[{i}]: {e}") from None

    # -- lifecycle -------------------------------------------------------
    def start(self) -> None:
        # A pending row is a crash's leftover only once no live process can still be placing it: a restart may
        # overlap the old process winding down (its Reserves still delegating). Rows older than that, or whose
        # owner is provably gone (a crash on this machine), are recovered now; the others once that long has
        # passed, if still pending then.
        started = self.clock.now()
        if self._recover(before=started - self._pending_horizon_s()):
            threading.Thread(target=self._recover_later, args=(started,), name="recover-pending",
                             daemon=True).start()
        with self.db.read() as s:
            known = list(s.scalars(select(Manager)))
        for m in known:
            # Known from before a restart: followed, but down until it heartbeats.
            state = self.registry.register(m.name, m.address, m.resource_types)
            state.last_heartbeat = -math.inf
        self._monitor.start()
        self._compensator.start()

    def quiesce(self) -> None:
        """Shutting down, before the server stops: end the WatchCapacity streams."""
        self.watchers.close()

    def stop(self) -> None:
        """After the server's calls have finished: stop following managers and the background work, close the
        database."""
        self.quiesce()
        self._stop.set()
        self._kick.set()
        self.registry.stop()
        self._monitor.join(timeout=5)
        self._compensator.join(timeout=5)
        self.db.dispose()

    def _interval(self) -> float:
        return max(0.05, min(self.config.heartbeat_interval_s, self.config.heartbeat_timeout_s) / 2)

    def _run_monitor(self) -> None:
        self._keep_running("liveness check", self.registry.check_liveness, lambda: self._stop.wait(self._interval()))

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

    def _recover(self, before: float = math.inf) -> int:
        """Reservations left pending by a crash (created before `before`, or whose owner is gone): give back
        whatever any IRM holds for them. Returns how many pending rows were left for later (younger, of an owner
        that may be placing them still)."""
        with self.db.read() as s:
            rows = list(s.scalars(select(Reservation).where(Reservation.state == "pending")))
        left = 0
        for r in rows:
            why = owners.gone(r.owner, self.owner)
            if r.created_at < before or why:
                self._recover_one(r.id, r.tenant, why or "pending longer than a Reserve takes")
            else:
                left += 1
        return left

    def _recover_one(self, res_id: str, tenant: str, why: str = "") -> bool:
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
    def _undo(self, manager: str, tenant: str, irm_request_id: str) -> str:
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
                                          timeout=self.config.irm_timeout_s)
            except grpc.RpcError as e:
                if e.code() == grpc.StatusCode.NOT_FOUND:
                    return "absent"
                raise
            stub.ReleaseReservation(irm_pb2.ReleaseReservationRequest(tenant=tenant, reservation_id=res.id),
                                    timeout=self.config.irm_timeout_s)
            return "released"
        except grpc.RpcError as e:
            log.warning("could not release at manager; will retry", extra={
                "manager": manager, "irm_request_id": irm_request_id, "code": str(e.code())})
            return "unreachable"

    def _release_part(self, manager: str, tenant: str, irm_reservation_id: str, show: bool = True) -> str:
        """Give back the part `irm_reservation_id` at `manager`: "released" (also if it was already), "absent"
        (the manager knows no such reservation) or "unreachable". `show`: free in the view at once (the
        compensator's retries do not: a part the Release showed freed already would be counted free twice)."""
        state = self.registry.get(manager)
        if state is None or not irm_reservation_id:
            return "unreachable"
        try:
            reply = state.stub().ReleaseReservation(irm_pb2.ReleaseReservationRequest(
                tenant=tenant, reservation_id=irm_reservation_id), timeout=self.config.irm_timeout_s)
        except grpc.RpcError as e:
            if e.code() == grpc.StatusCode.NOT_FOUND:
                return "absent"
            log.warning("could not release at manager; will retry", extra={
                "manager": manager, "irm_reservation_id": irm_reservation_id, "code": str(e.code())})
            return "unreachable"
        if show:
            self._show_released(manager, reply)
        return "released"

    def _show_released(self, manager: str, reply: irm_pb2.Reservation) -> None:
        """What a manager just gave back, free in the view at once: until its event arrives, a Reserve right after
        the Release was refused "capacity in use". Only where the manager says the generation its release made
        (an assumption of negative demand, settled when the view reaches it); a node already there shows it."""
        token = f"release:{manager}:{reply.id}"      # a release gives back once: one token per reservation
        caught_up: dict[str, int] = {}
        with self.view.lock:
            for g in reply.groups:
                for r in g.resources:
                    node = self.view.nodes.get(f"{manager}/{r.physical_id}")
                    if not r.physical_generation or node is None or node.generation >= r.physical_generation:
                        continue
                    freed = {k: -v for k, v in r.attributes.items() if k in node.capacity and v > 0}
                    self.view.assume(token, node, freed)
                    caught_up[node.key] = max(caught_up.get(node.key, 0), r.physical_generation)
            if caught_up:
                self.view.commit(token, caught_up)

    def _remember(self, manager: str, tenant: str, irm_request_id: str, in_doubt: bool = False) -> None:
        now = self.clock.now()

        def add(s):  # type: ignore[no-untyped-def]
            s.add(Compensation(manager=manager, tenant=tenant, irm_request_id=irm_request_id, created_at=now,
                               in_doubt=in_doubt, next_try_at=now))
        self.db.transact(add)

    def _undo_or_remember(self, manager: str, tenant: str, irm_request_id: str, in_doubt: bool = False) -> None:
        """Give back what `manager` holds for a request; remember to retry if that is not certain.

        `in_doubt`: the manager's Reserve failed without a definite answer (timed out,
        unreachable), so it may still commit later: the request is only remembered, for the
        compensator. Asking now could wait as long as the Reserve did, on the request's thread
        (a slow manager's failed reserves then held the server's workers twice as long), and
        "absent" now would prove nothing anyway (see _compensate_pending).
        """
        if in_doubt:
            self._remember(manager, tenant, irm_request_id, in_doubt=True)
            self._kick.set()
            return
        if self._undo(manager, tenant, irm_request_id) == "unreachable":
            self._remember(manager, tenant, irm_request_id)

    def _settled_after(self) -> float:
        """How long a manager may still be working on a request the CRS gave up on."""
        return 3 * self.config.irm_timeout_s

    def _backoff(self, attempts: int) -> float:
        return min(COMPENSATION_BACKOFF_MAX_S, 0.5 * 2 ** min(attempts, 20))

    def _compensate_pending(self) -> None:
        """One pass over the compensation rows of the managers up.

        A row not done waits 0.5 s x 2^attempts (at most COMPENSATION_BACKOFF_MAX_S) before its next try;
        managers take turns, a manager that did not answer is left for the rest of the pass, and no new
        try starts after irm_timeout_s: a manager that heartbeats but hangs costs a pass at most one
        call's timeout, and the other managers' rows still get their turns.
        """
        if not self.db.fetch(_ANY_COMPENSATION, {}):
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
        deadline = time.monotonic() + max(1.0, self.config.irm_timeout_s)
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
            outcome = self._release_part(c.manager, c.tenant, c.irm_reservation_id, show=False)
        else:
            outcome = self._undo(c.manager, c.tenant, c.irm_request_id)
        now = self.clock.now()
        age = now - c.created_at
        if outcome == "released":
            done = True
        elif outcome == "absent":
            # "absent" is final only once the manager cannot still be committing the request. A Reserve that
            # got no definite answer may yet commit (a manager stuck that long still finishes): its row is
            # asked about, ever more rarely, for in_doubt_horizon_s.
            horizon = self.config.in_doubt_horizon_s if c.in_doubt else self._settled_after()
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

    def pending_compensations(self) -> int:
        with self.db.read() as s:
            return len(list(s.scalars(select(Compensation.id))))

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
        req = self._parse_uncached(groups, constraints, specs)
        if sum(map(len, key[0])) + sum(map(len, key[1])) > _PARSE_CACHE_MAX_BYTES:
            return req  # not kept: a few such requests would hold megabytes
        if len(cache[1]) >= _PARSE_CACHE:
            cache[1].clear()
        cache[1][key] = req
        return req

    def _parse_uncached(self, groups: list[irm_pb2.ResourceGroup], constraints: list[irm_pb2.GroupConstraint],
                        specs: dict[str, dict[str, irm_pb2.AttributeSpec]]) -> PlacementRequest:
        v = Violations()
        demands: list[GroupDemand] = []
        names: set[str] = set()
        # Types a registered manager provides that no manager up has described: not the tenant's mistake.
        waiting: dict[str, list[ManagerState]] = {}
        v.check(len(groups) > 0, "groups", "at least one group is required")
        for i, g in enumerate(groups):
            p = f"groups[{i}]"
            if not v.check(bool(g.name), f"{p}.name", "required: a name unique within the request"):
                continue
            if not v.check(len(g.name) <= MAX_GROUP_NAME, f"{p}.name",
                           f"at most {MAX_GROUP_NAME} characters, got {len(g.name)}"):
                continue
            v.check(g.name not in names, f"{p}.name", f"duplicate group name {g.name!r}")
            names.add(g.name)
            v.check(1 <= g.count <= MAX_COUNT, f"{p}.count", f"must be between 1 and {MAX_COUNT}")
            v.check(not g.placement, f"{p}.placement", "leave empty: the CRS chooses placements")
            # No resource has a trait and lacks it: said as the managers say it, not as "never fits".
            clash = set(g.required_traits) & set(g.forbidden_traits)
            v.check(not clash, f"{p}.forbidden_traits", f"traits both required and forbidden: {sorted(clash)}")
            attrs = specs.get(g.resource_type)
            if attrs is None:
                providers = self.registry.providing(g.resource_type)
                if not providers:
                    v.add(f"{p}.resource_type", f"no manager provides {g.resource_type!r}; "
                                                f"available: {sorted(specs) or 'none'}")
                    continue
                waiting[g.resource_type] = providers
                # Checked against what its managers last described, if anything: bad input is said now,
                # not after the client waited for the manager to come back.
                attrs = {}
                for spec in (s for m in providers for s in m.specs if s.name == g.resource_type):
                    for a in spec.attributes:
                        attrs[a.name] = merged_attribute(attrs.get(a.name), a)
                if not attrs:
                    continue
            demand: dict[str, float] = {}
            props: dict[str, tuple[float, float]] = {}
            for key, req in g.attributes.items():
                spec = attrs.get(key)
                ap = f"{p}.attributes[{key}]"
                if spec is None:
                    v.add(ap, f"unknown attribute of {g.resource_type!r}; known: {sorted(attrs)}")
                    continue
                which = req.WhichOneof("value")
                if spec.kind == irm_pb2.AttributeSpec.KIND_TEXT:
                    if which != "text":
                        v.add(ap, "expected text")
                    elif spec.allowed_values and req.text not in spec.allowed_values:
                        v.add(ap, f"{req.text!r} is not one of {list(spec.allowed_values)}")
                    continue
                if which == "text" or which is None:
                    v.add(ap, f"expected a number or a range ({spec.unit})")
                    continue
                lo = req.number if which == "number" else (req.range.min if req.range.HasField("min") else -math.inf)
                hi = req.number if which == "number" else (req.range.max if req.range.HasField("max") else math.inf)
                if math.isnan(lo) or math.isnan(hi):
                    # Every comparison with NaN is false: it would pass every check below and match no host.
                    v.add(ap, f"a number ({spec.unit}), not NaN")
                    continue
                if which == "number" and not math.isfinite(lo):
                    v.add(ap, f"a finite number ({spec.unit}); for an open bound use a range")
                    continue
                if lo > hi:
                    v.add(ap, "range min must not exceed max")
                    continue
                dom = spec.domain
                if spec.consumable:
                    if not math.isfinite(lo):
                        v.add(ap, "a range for a consumable attribute needs a lower bound")
                        continue
                    if (dom.HasField("min") and lo < dom.min - 1e-9) or (dom.HasField("max") and lo > dom.max + 1e-9):
                        v.add(ap, f"{lo:g} {spec.unit} is outside {_domain(dom)}")
                        continue
                    demand[key] = lo
                else:
                    if (dom.HasField("min") and hi < dom.min - 1e-9) or (dom.HasField("max") and lo > dom.max + 1e-9):
                        asked = f"{lo:g}" if which == "number" else f"the range [{lo:g}, {hi:g}]"
                        v.add(ap, f"{asked} {spec.unit} is outside {_domain(dom)}, what the managers' resources have")
                        continue
                    props[key] = (lo, hi)
            for key, spec in attrs.items():
                # A consumable left out is taken at its default by the manager: it counts here too, or full
                # hosts would pass the capacity filter (and the manager refuse them).
                if spec.consumable and key not in g.attributes and spec.HasField("default"):
                    amount = _default_amount(spec.default)
                    if amount is not None:
                        demand[key] = amount
            demands.append(GroupDemand(g.name, g.resource_type, g.count, demand, props,
                                       frozenset(g.required_traits), frozenset(g.forbidden_traits)))
        total = sum(g.count for g in groups if g.count > 0)
        v.check(total <= MAX_INSTANCES, "groups",
                f"the groups' counts add up to {total} instances; at most {MAX_INSTANCES} per request: split it")
        parsed = cons.from_proto(list(constraints), names, v)
        v.raise_if_any()
        if waiting:
            down = sorted({m.name for providers in waiting.values() for m in providers if not m.up})
            raise Unavailable("; ".join(_not_ready(rtype, providers) for rtype, providers in waiting.items()),
                              # Down, or up but not described yet (it registered moments ago).
                              reason=MANAGER_DOWN if down else MANAGER_UNAVAILABLE, retry_after_s=RETRY_LATER_S,
                              metadata={"manager": ",".join(down or sorted(
                                  {m.name for providers in waiting.values() for m in providers}))})
        return PlacementRequest(demands, parsed, self._seed_of(demands, parsed))

    def _seed_of(self, demands: list[GroupDemand], constraints: list[cons.Constraint]) -> int:
        """The placement seed of a parsed request: its content's digest (with the configured seed), so QuotePrice
        and Reserve of one request scan the same hosts from the same offsets. (Its groups' bytes would not do: a
        map's serialization order is not fixed.)"""
        content = repr((self.config.seed, [
            (g.name, g.resource_type, g.count, sorted(g.demand.items()), sorted(g.properties.items()),
             sorted(g.required_traits), sorted(g.forbidden_traits)) for g in demands], constraints))
        return int.from_bytes(hashlib.blake2b(content.encode(), digest_size=8).digest(), "big")

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
        return irm_pb2.DescribeAllocationSpecResponse(
            resource_types=[spec for m in self.registry.up() for spec in m.specs])

    def DiscoverResources(self, request, context):  # noqa: N802
        nodes = [n for n in self.view.up_nodes() if not request.resource_type or n.resource_type == request.resource_type]
        return irm_pb2.DiscoverResourcesResponse(resources=[n.to_proto() for n in nodes],
                                                 links=self.topology.level_links())

    def QuotePrice(self, request, context):  # noqa: N802
        tenant = require_tenant(request.tenant)
        req = self._parse(list(request.groups), list(request.constraints))
        placement = self._place(req, priority=0, assume_token=None)
        return self._quote(tenant, list(request.groups), placement)

    def _quote(self, tenant: str, groups: list[irm_pb2.ResourceGroup], placement: Placement
               ) -> irm_pb2.QuotePriceResponse:
        quotes: list[irm_pb2.GroupQuote] = []
        index = {g.name: i for i, g in enumerate(groups)}
        for manager, parts in self._pinned(groups, placement).items():
            state = self.registry.get(manager)
            assert state is not None
            try:
                reply = state.stub().QuotePrice(irm_pb2.QuotePriceRequest(tenant=tenant, groups=parts),
                                                timeout=self.config.irm_timeout_s)
            except grpc.RpcError as e:
                raise _err_from_rpc(manager, e, tenant_paths(parts, index)) from None
            quotes.extend(reply.groups)
        return irm_pb2.QuotePriceResponse(price_per_minute=sum(q.price_per_minute for q in quotes), groups=quotes)

    def _place(self, req: PlacementRequest, priority: int, assume_token: str | None,
               pipeline: Pipeline | None = None) -> Placement:
        # The view's lock from placing to assuming: a watch thread must not remove a placed node in between.
        with self.gate.hold(priority), self.view.lock:
            # An RNG of the request and the view as they are: with one shared RNG, a quote and a Reserve of one
            # request on an unchanged view landed on hosts of different prices; with the request's alone, every
            # identical request scanned from one offset past the hosts the earlier ones had filled (placement
            # cost growing with the cloud), and a place again after a manager's refusal chose the same host.
            rng = random.Random(f"{self._salt}:{req.seed}:{self.view.version}:{self.view.assumptions_made}")
            try:
                placement = schedule(req, self.view, pipeline or self.pipeline, self.topology, rng)
            except Unschedulable as e:
                log.info("unschedulable", extra={"reason": str(e), "removed_by": e.removed_by})
                # A manager down that could hold it: it is the manager the client waits for (README's contract).
                error = Unavailable if e.down else FailedPrecondition if e.unresolvable else ResourceExhausted
                raise error(str(e), reason=e.reason,
                            retry_after_s=RETRY_LATER_S if e.reason in (CAPACITY_IN_USE, MANAGER_DOWN) else None,
                            metadata={"manager": ",".join(e.down)} if e.down else {}) from None
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
        if not request.request_id or len(request.request_id) > 128:
            raise InvalidArgument.of("request_id", "required: a client-chosen idempotency key of 1-128 characters")
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
            self.db.execute(_CLAIM, claim)
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
            self.db.execute(_DROP_PENDING, {"rid": res_id})
            raise

    def _find(self, tenant: str, request_id: str) -> ReservationRow | None:
        rows = self.db.fetch(_BY_REQUEST, {"tenant": tenant, "req": request_id})
        return ReservationRow(**rows[0]) if rows else None

    def _existing(self, r: ReservationRow, context=None) -> irm_pb2.Reservation:  # noqa: ANN001
        if r.state == "pending":
            # Its owner gone (the CRS that placed it crashed, and this one was started on its machine), or
            # pending longer than a live Reserve can take (its own clean-up failed, say, on a database that
            # failed): a leftover. Its parts go back; the retry after this one places afresh.
            why = owners.gone(r.owner, self.owner)
            old = r.created_at < self.clock.now() - self._pending_horizon_s()
            if (why or old) and self._recover_one(r.id, r.tenant, why or "pending longer than a Reserve takes"):
                said = f"left pending because {why}" if why else "left pending by a Reserve that failed"
                raise Aborted(f"reservation for request_id {r.request_id!r} was {said}; what it held is being "
                              "given back: retry", reason=RESERVATION_PENDING, retry_after_s=RETRY_LATER_S)
            # A client in doubt about its Reserve (the Application Manager) must tell this from "never placed": a
            # reason, and when to ask again.
            raise Aborted(f"reservation for request_id {r.request_id!r} is still being placed; retry shortly",
                          reason=RESERVATION_PENDING, retry_after_s=PENDING_RETRY_S)
        return self._current(r.tenant, [r], context)[0]

    def _reserve(self, tenant: str, res_id: str, created_at: float, request: irm_pb2.ReserveRequest,
                 req: PlacementRequest, context=None) -> irm_pb2.Reservation:  # noqa: ANN001
        groups = list(request.groups)
        by_name = {g.name: i for i, g in enumerate(groups)}
        last_error: HarnessError | None = None
        stamped = created_at
        for attempt in range(self._attempts()):
            token = f"{res_id}#{attempt}"
            placed = False
            try:
                placement = self._place(req, request.priority, token)
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
                self._give_back_unrecorded(tenant, res_id, attempt, list(pinned))
                raise
            self.view.commit(token, caught_up)
            allocated.sort(key=lambda g: by_name.get(g.name, 0))
            price = sum(g.price_per_minute for g in allocated)
            # One message: its bytes (groups only) are stored, then it is completed as the reply.
            out = irm_pb2.Reservation(groups=allocated)
            alloc = out.SerializeToString()
            try:
                activated = self.db.execute(_ACTIVATE, {"rid": res_id, "price": price, "alloc": alloc, "said": notes,
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
        if isinstance(last_error, ResourceExhausted) and not last_error.reason:
            # A manager refused what the view showed free without saying why (an older manager): in use.
            last_error.with_reason(CAPACITY_IN_USE, RETRY_LATER_S)
        raise last_error

    def _stamp(self, res_id: str, stamped: float, request_id: str) -> float:
        """The pending row `res_id`'s stamp: `stamped`, or now once that is PENDING_STAMP_S old (the row is stamped
        again). A Reserve past the placement gate is then never taken for a crash's leftover (rows older than the
        horizon are), however long it queued there or how many attempts it made. ABORTED if the row was taken
        already."""
        now = self.clock.now()
        if now - stamped < PENDING_STAMP_S:
            return stamped
        if not self.db.execute(_STAMP_PENDING, {"rid": res_id, "at": now}):
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
        table): one QuotePrice per manager, pinned to one node of each kind."""
        asks: dict[str, list[tuple[str, tuple, irm_pb2.ResourceGroup]]] = defaultdict(list)
        by_name = {g.name: g for g in groups}
        for g in req.groups:
            ctx = Context(g, [], {}, {}, self.topology, ignore_usage=True)
            checks = [f.checker(ctx) for f in self.pipeline.filters if f.relevant(ctx)]
            kinds: dict[tuple, object] = {}
            for node in self.view.of_type(g.resource_type):
                key = price_key(node)
                if key in kinds or not all(ok(node) for ok in checks):
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
            try:
                reply = state.stub().QuotePrice(irm_pb2.QuotePriceRequest(
                    tenant=tenant, groups=[one for _, _, one in items]), timeout=self.config.irm_timeout_s)
            except grpc.RpcError:
                continue  # not quoted: its nodes score as the dearest
            quoted = {q.name: q.price_per_minute for q in reply.groups}
            for name, key, one in items:
                if one.name in quoted:
                    prices[(name, key)] = quoted[one.name]
        return prices

    def _attempts(self) -> int:
        return max(1, self.config.place_attempts)

    def _give_back_unrecorded(self, tenant: str, res_id: str, attempt: int, managers: list[str]) -> None:
        """The activation failed: unless it landed after all (a commit whose answer was lost),
        the reservation is not the client's, and what the managers hold for it goes back.
        When that cannot be told, the parts stay (capacity leaks until an operator looks)
        rather than an active reservation losing its resources."""
        try:
            rows = self.db.fetch(_BY_ID, {"rid": res_id})
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
                    if e.code() not in DEFINITE_REFUSALS:
                        in_doubt.add(manager)
                    raise _err_from_rpc(manager, e, tenant_paths(parts, index)) from None
                finally:
                    state.slots.release()
                if reply.state != irm_pb2.Reservation.STATE_ACTIVE:
                    # Never activate on a part that holds nothing (it cannot happen with fresh ids; if it does,
                    # say so rather than double-book).
                    raise Aborted(f"manager {manager!r} answered with a reservation in state "
                                  f"{irm_pb2.Reservation.State.Name(reply.state)}; nothing was reserved, retry")
                allocated.extend(reply.groups)
                notes.extend(f"{manager}: {n}" for n in reply.notes)
                for g in reply.groups:
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

    def _to_proto(self, r: Reservation | ReservationRow) -> irm_pb2.Reservation:
        state = {"active": irm_pb2.Reservation.STATE_ACTIVE, "released": irm_pb2.Reservation.STATE_RELEASED
                 }.get(r.state, irm_pb2.Reservation.STATE_FAILED)
        out = irm_pb2.Reservation.FromString(r.allocation or b"")
        out.id, out.tenant, out.request_id, out.state, out.priority = r.id, r.tenant, r.request_id, state, r.priority
        out.price_per_minute, out.created_at, out.released_at = r.price_per_minute, r.created_at, r.released_at
        out.notes[:] = list(r.notes or [])
        return out

    # -- where the resources are -------------------------------------------
    def _where(self, manager: str) -> _Whereabouts:
        with self._whereabouts_lock:
            w = self._whereabouts.get(manager)
            if w is None:
                w = self._whereabouts[manager] = _Whereabouts(since=self._started_at)
            return w

    def _moved(self, manager: str) -> None:
        """`manager` registered (again): what it said before about where its resources are may be out of date."""
        with self._whereabouts_lock:
            self._whereabouts[manager] = _Whereabouts(since=self.clock.now())

    def _registered(self, manager: str, address: str, instance_id: str) -> bool:
        """`manager` registered at `address` as the instance `instance_id`: _moved unless its last registration
        with this process was that same instance there (it registered again without restarting: after missed
        heartbeats, a network blip), its resources where it said. No id (a manager older than instance_id) or no
        registration before (this CRS restarted since) is taken for a restart. True if it was _moved."""
        with self._whereabouts_lock:
            last = self._instances.get(manager)
            self._instances[manager] = (address, instance_id)
            if instance_id and last == (address, instance_id):
                w = self._whereabouts.get(manager)
                if w is not None:
                    w.silent_until = -math.inf      # it answers again: a read asks it at once what it still must
                return False
            self._whereabouts[manager] = _Whereabouts(since=self.clock.now())
            return True

    def _current(self, tenant: str, rows: list, context=None) -> list[irm_pb2.Reservation]:  # noqa: ANN001
        """`rows` (the tenant's) as the tenant reads them: the addresses of active reservations' resources as
        their managers give them now. The CRS records a part's addresses when it is reserved, and a manager that
        restarted since (its agent on another port) gives others: a part reserved before its manager last
        registered as a new instance (or before this CRS started) is asked about once per such registration -- the
        one part, or the tenant's every part there (one List, not a call per reservation). A manager that does not
        answer leaves its resources' addresses as last known, with a note saying so."""
        outs = [self._to_proto(r) for r in rows]
        where: dict[str, _Whereabouts] = {}
        unknown: dict[str, set[str]] = defaultdict(set)     # manager -> its parts not asked about since it registered
        for r, out in zip(rows, outs, strict=True):
            if r.state != "active":
                continue
            for g in out.groups:
                if g.manager and g.manager_reservation_id and any(x.address for x in g.resources):
                    if g.manager not in where:
                        where[g.manager] = self._where(g.manager)
                    w = where[g.manager]
                    if (r.created_at < w.since and tenant not in w.tenants
                            and g.manager_reservation_id not in w.parts):
                        unknown[g.manager].add(g.manager_reservation_id)
        silent = {m: why for m, parts in unknown.items() if (why := self._ask_where(m, where[m], tenant, parts,
                                                                                     context))}
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

    def _ask_where(self, manager: str, w: _Whereabouts, tenant: str, parts: set[str],
                   context) -> str:  # noqa: ANN001
        """Ask `manager` where the resources of `tenant`'s `parts` there are now (into `w`, its _Whereabouts);
        "" once it answered, else why not."""
        # Within the caller's deadline, with time left to answer it, the wait for another read's call included.
        left = context.time_remaining() if context is not None else None
        cut = left is not None and left - 0.5 < ADDRESS_TIMEOUT_S
        deadline = time.monotonic() + min(ADDRESS_TIMEOUT_S, math.inf if left is None else max(0.0, left - 0.5))
        # A burst of reads after a restart asks once; the others wait for its answer, no longer than their own
        # budget (a manager slow to answer must not hold every server thread).
        if not w.lock.acquire(timeout=max(0.0, deadline - time.monotonic())):
            return f"{manager} is slow to answer where its resources are"
        try:
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
            self.db.execute(_READDRESS, {"rid": res_id, "was": was,
                                         "alloc": irm_pb2.Reservation(groups=out.groups).SerializeToString()})
        except Exception:  # noqa: BLE001 - a read still answers; the next one records them
            log.warning("could not record a reservation's new addresses", exc_info=True,
                        extra={"reservation": res_id})

    def _get(self, tenant: str, reservation_id: str) -> ReservationRow:
        rows = self.db.fetch(_BY_ID, {"rid": reservation_id})
        if not rows or rows[0]["state"] == "pending":
            raise NotFound(f"reservation {reservation_id!r} does not exist")
        owned(tenant, rows[0]["tenant"], f"reservation {reservation_id!r}")
        return ReservationRow(**rows[0])

    def GetReservation(self, request, context):  # noqa: N802
        tenant = require_tenant(request.tenant)
        key = request.WhichOneof("key")
        if key == "reservation_id":
            if not request.reservation_id:
                raise InvalidArgument.of("reservation_id", "required: the id Reserve answered with (or give "
                                                           "request_id instead)")
            return self._current(tenant, [self._get(tenant, request.reservation_id)], context)[0]
        if key == "request_id":
            if not request.request_id:
                raise InvalidArgument.of("request_id", "required: the request_id the reservation was made with "
                                                       "(or give reservation_id instead)")
            r = self._find(tenant, request.request_id)
            if r is None:
                raise NotFound(f"no reservation of this tenant has request id {request.request_id!r}")
            # A pending one is answered as a Reserve repeated under its id would be (a leftover is recovered here
            # too): NOT_FOUND would tell a client in doubt that it was never placed.
            return self._existing(r, context)
        raise InvalidArgument.of("reservation_id", "give reservation_id or request_id")

    def ListReservations(self, request, context):  # noqa: N802
        tenant = require_tenant(request.tenant)
        states = ["active", "released"] if request.include_released else ["active"]
        with self.db.read() as s:
            rows, token = paging.page(s, select(Reservation).where(Reservation.tenant == tenant,
                                                                    Reservation.state.in_(states)),
                                      [Reservation.id], request.page_size, request.page_token)
        return irm_pb2.ListReservationsResponse(reservations=self._current(tenant, rows, context),
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
            if not _RELEASE.execute(conn, {"rid": r.id, "at": now}):
                return None
            return {part: [_COMPENSATE.first(conn, one)[0] for one in rows[part]] for part in parts}

        recorded = self.db.run(mark)
        if recorded is None:
            return self._to_proto(self._get(tenant, r.id))   # released meanwhile by another call
        for (manager, irm_id), ids in recorded.items():
            given_back = self._release_part(manager, tenant, irm_id) == "released"
            try:
                # Given back: nothing left for the compensator. Else (the manager did not answer just now, or knows
                # no such reservation: said final only once it cannot still be settling) it is asked again at once.
                self.db.run(lambda conn, ids=ids, done=given_back: (_FORGET_PART if done else _DUE_NOW)
                            .executemany(conn, [{"cid": i, "now": now} for i in ids]))
            except Exception:  # noqa: BLE001 - released all the same; the compensator finds the rows in time
                log.warning("could not update a released part's compensation rows", exc_info=True,
                            extra={"reservation": r.id, "manager": manager})
            if not given_back:
                self._kick.set()
        r.state, r.released_at = "released", now
        return self._to_proto(r)

    def GetMetrics(self, request, context):  # noqa: N802
        tenant = require_tenant(request.tenant)
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
                raise _err_from_rpc(key[0], e) from None
            series.extend(reply.series)
        return irm_pb2.GetMetricsResponse(series=series)

    def WatchCapacity(self, request, context):  # noqa: N802
        # Its caps: a tenant's, or the control plane's for a caller with the control token (services.control).
        who = control.watch_tenant(request.tenant, self.config.control_token, context)

        def snapshot():
            for n in self.view.up_nodes():
                if not request.resource_type or n.resource_type == request.resource_type:
                    yield irm_pb2.CapacityEvent(kind=irm_pb2.CapacityEvent.KIND_SNAPSHOT, resource=n.to_proto())
            yield irm_pb2.CapacityEvent(kind=irm_pb2.CapacityEvent.KIND_SNAPSHOT_END)

        # A stream over the Broadcaster's caps is refused there (RESOURCE_EXHAUSTED, STREAM_CAP).
        for ev in self.watchers.stream(snapshot, context.is_active, who):
            # The snapshot's end names no resource: it passes every filter (a client waits for it).
            if (not request.resource_type or ev.kind == irm_pb2.CapacityEvent.KIND_SNAPSHOT_END
                    or ev.resource.resource_type == request.resource_type):
                yield ev

    def _forward(self, manager: str, ev: irm_pb2.CapacityEvent) -> None:
        """A change of `manager`'s resources to the CRS's watchers (not while it is down: they have its
        resources REMOVED then, and UPDATED again when it is back)."""
        if (ev.kind in (irm_pb2.CapacityEvent.KIND_UPDATED, irm_pb2.CapacityEvent.KIND_REMOVED)
                and self.watchers.has_subscribers()):
            with self._publishing:
                if self.view.is_down(manager):
                    return
                # One event per resource downstream, as the CRS always sent them.
                out = []
                for r in (ev.resource, *ev.more):
                    one = irm_pb2.CapacityEvent(kind=ev.kind, resource=r)
                    one.resource.manager = manager
                    out.append(one)
                self.watchers.publish(out)

    def _publish_all_of(self, manager: str, kind: irm_pb2.CapacityEvent.Kind.ValueType) -> None:
        """Every resource of `manager` in the view, as `kind` events, to the watchers."""
        if not self.watchers.has_subscribers():
            return
        with self._publishing:
            if self.view.is_down(manager) != (kind == irm_pb2.CapacityEvent.KIND_REMOVED):
                return  # it changed again meanwhile: that change publishes
            with self.view.lock:
                mine = [n.to_proto() for n in self.view.nodes.values() if n.manager == manager]
            self.watchers.publish(irm_pb2.CapacityEvent(kind=kind, resource=r) for r in mine)

    def _manager_up(self, manager: str) -> None:
        self._kick.set()  # its compensations may run now
        self._publish_all_of(manager, irm_pb2.CapacityEvent.KIND_UPDATED)

    def _manager_down(self, manager: str) -> None:
        self._publish_all_of(manager, irm_pb2.CapacityEvent.KIND_REMOVED)

    # -- registry --------------------------------------------------------
    def RegisterManager(self, request, context):  # noqa: N802
        # Else anyone reaching the CRS could add a manager (or take a gone one's name) and be sent reservations.
        control.check(self.config.control_token, context, "the CRS (RegisterManager)")
        v = Violations()
        v.check(bool(request.name) and len(request.name) <= 128, "name", "required, at most 128 characters")
        v.check("/" not in request.name, "name", "must not contain '/'")
        if v.check(bool(request.address), "address", "required: host:port of the manager's ResourceManager service"):
            try:
                check_address(request.address)
                if request.address.rpartition(":")[2].lstrip("0") == "":
                    raise ConfigError("port 0")
            except ConfigError:
                v.add("address", f"{request.address!r} is not HOST:PORT with PORT in 1..65535 (an IPv6 host in "
                                 "brackets, e.g. [::1]:50061): the manager's ResourceManager address")
        v.check(len(request.resource_types) > 0, "resource_types", "at least one resource type")
        v.check(len(request.instance_id) <= MAX_INSTANCE_ID, "instance_id",
                f"at most {MAX_INSTANCE_ID} characters: an id the manager makes once per start")
        v.raise_if_any()
        old = self.registry.get(request.name)
        if old is not None and old.address != request.address and serving_at(old.address):
            # The name is taken by a manager that answers: whoever this is must not take its place (and its
            # tenants' reservations) by saying the name -- also while that one is marked down (a heartbeat gap
            # is not a departure: it still holds its tenants' parts). One that stopped answering has moved
            # (restarted on another port, say) and is let in.
            state = (f"is up at {old.address}" if old.up else
                     f"at {old.address} is marked down (its heartbeats stopped) but still answers there")
            raise FailedPrecondition(f"the manager named {request.name!r} {state}; stop it first (the registry "
                                     "has no deregistration), or register under another name")

        def upsert(s):  # type: ignore[no-untyped-def]
            row = s.get(Manager, request.name)
            if row is None:
                s.add(Manager(name=request.name, address=request.address,
                              resource_types=list(request.resource_types), registered_at=self.clock.now()))
            else:
                row.address, row.resource_types = request.address, list(request.resource_types)
        self.db.transact(upsert)
        self.registry.register(request.name, request.address, list(request.resource_types))
        # After the registry has its new address: a read in between asks there, into what this replaces.
        moved = self._registered(request.name, request.address, request.instance_id)
        log.info("manager registered", extra={"manager": request.name, "address": request.address,
                                              "instance": request.instance_id, "new_instance": moved})
        return registry_pb2.RegisterManagerResponse(heartbeat_interval_s=self.config.heartbeat_interval_s)

    def Heartbeat(self, request, context):  # noqa: N802
        # Else anyone could keep a stopped manager "up", and reservations would be sent to it.
        control.check(self.config.control_token, context, "the CRS (Heartbeat)")
        return registry_pb2.HeartbeatResponse(known=self.registry.heartbeat(request.name, request.address))

    def ListManagers(self, request, context):  # noqa: N802
        out = []
        for m in self.registry.all():
            count = sum(1 for n in list(self.view.nodes.values()) if n.manager == m.name)
            out.append(registry_pb2.ManagerInfo(name=m.name, address=m.address, resource_types=m.resource_types,
                                                up=m.up, last_heartbeat=max(m.last_heartbeat, 0.0),
                                                resources=count, follow_error=m.follow_error))
        return registry_pb2.ListManagersResponse(managers=out)


def manager_synced(state: ManagerState, timeout: float) -> bool:
    return state.synced.wait(timeout)


def component(config: CrsConfig, clock: Clock | None = None) -> Component:
    tenants.delegation(config.tenants_file, config.delegation_token, "crs")
    auth = tenants.auth(config.tenants_file, "crs", delegation_sha256=config.delegation_sha256,
                        delegation_token=config.delegation_token)
    crs = Crs(config, clock)

    def register(server: grpc.Server) -> None:
        irm_pb2_grpc.add_ResourceManagerServicer_to_server(crs, server)
        registry_pb2_grpc.add_ManagerRegistryServicer_to_server(crs, server)

    return Component(name="crs", register=register,
                     service_names=["harness.v1.ResourceManager", "harness.v1.ManagerRegistry"],
                     start=crs.start, quiesce=crs.quiesce, stop=crs.stop, probe=crs.db.probe, extra={"crs": crs},
                     auth=auth)
