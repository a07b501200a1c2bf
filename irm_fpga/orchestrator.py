"""The Orchestrator: FPGA groups over one or more emulated FPGA-servers (thesis §3.2, §5.2).

It keeps reservation state in the database and tells servers to create,
resize and delete group parts; a group may span several servers (the thesis
left this "under development"): the client library spreads tasks over the
parts. It is never on the data path, so groups keep serving while it is down;
a restarted Orchestrator re-asserts its groups and attachments on the servers.

It also implements the IRM API (resource type "vfpga") so the CRS reserves
virtual FPGAs like any other resource, and runs the autoscaler for elastic
groups.
"""

from __future__ import annotations

import logging
import math
import secrets
import threading
import time
import uuid
import zlib
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from sqlalchemy import delete, select, update
from sqlalchemy.exc import IntegrityError

from harness.v1 import common_pb2, fpga_pb2, fpga_pb2_grpc, irm_pb2, irm_pb2_grpc
from irm_fpga import autoscaler
from irm_fpga import designs as design_lib
from irm_fpga import engine as eng
from irm_fpga.fan_out import ask_servers
from irm_fpga.job_models import JOB_GROUP_PREFIX, FpgaJob
from irm_fpga.models import Client, Group, Reservation
from irm_fpga.server_breaker import ServerBreaker, ServerNotAnswering, intercept
from irm_fpga.wire import choices
from services import client as rpc
from services import control, paging, tenants
from services.clock import Clock, WallClock
from services.config import check_seconds, check_settings
from services.db import Database, default_url
from services.errors import (
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
from services.registration import Membership
from services.server import Component
from services.tls import TlsSettings
from services.watch import Broadcaster

log = logging.getLogger(__name__)
MIGRATIONS = Path(__file__).parent / "migrations"
VFPGA = "vfpga"
# A reservation still being made (its groups' devices reconfiguring: seconds) is asked about again after this long.
PENDING_RETRY_S = 1.0
MAX_DEVICES = 4096     # devices per virtual FPGA of a reservation: beyond any cluster this emulates
# Each WatchCapacity stream holds one of the server's 32 worker threads for as long as it is open; this component
# shares them with FpgaJobs (whose WatchJobs takes up to jobs.MAX_WATCHES = 16) and every unary call.
MAX_WATCHES = 8
ATTACH_LOCK_STRIPES = 64
SILENT_RETRY_S = 15.0  # an unmapped server that timed out or refused the token: tried again after this
ATTACHING = "attaching"    # a client row whose AttachClient call has not completed
MAX_ID_CHARS = 64      # group and client ids are stored in 64 characters: a longer one is refused unechoed
MAX_GROUP_REQUEST_ID_CHARS = 256    # CreateGroup's request_id (fpga_groups.request_id is String(256))
MAX_RESERVE_REQUEST_ID_CHARS = 128  # Reserve's, as every resource manager's (irm.proto)
PRICE_SLACK = 1e-9     # a cap equal to the quote, give or take float rounding, is met (as the compute IRM's)


@dataclass
class OrchestratorConfig(TlsSettings):
    address: str = "127.0.0.1:50091"
    name: str = "fpga"
    database: str = ""
    state_dir: str = "~/.harness"
    # FPGA-server addresses (comma-separated in env/--set).
    servers: list[str] = field(default_factory=lambda: ["127.0.0.1:50081"])
    # Sent with every call to the FPGA-servers, whose `control_token` must match (services.control); a
    # WatchCapacity without a tenant that sends it (the CRS's) takes a control-plane slot.
    control_token: str = ""
    # Tenants and their tokens' digests (services.tenants): a call naming a tenant must carry its token, or the
    # delegation token of the services acting for tenants (the CRS, the AM), checked against `delegation_sha256`.
    # Empty: any caller may name any tenant (development).
    tenants_file: str = ""
    # The SHA-256 of the CRS's and the AM's delegation_token ("sha256:<hex>"; `harness tenant delegation`): never
    # the token itself, which would let whoever reads this service's settings act for every tenant.
    delegation_sha256: str = ""
    site: str = "site-a"
    rack: str = "rack-fpga"
    crs_address: str = ""
    advertise_address: str = ""
    heartbeat_interval_s: float = 2.0
    # Price of one device per minute (an FPGA-equipped instance, roughly).
    price_per_device_minute: float = 0.05
    # Autoscaler for elastic groups: a policy name from irm_fpga.autoscaler
    # ("thesis", "improved", "static"), or "none".
    autoscaler: str = "improved"
    autoscaler_interval_s: float = 10.0
    server_timeout_s: float = 10.0
    # A server that hangs (a stopped process, a partition; not one that refuses connections) would cost every
    # call its server_timeout_s: once a call to it timed out, calls to it fail at once (UNAVAILABLE) for this
    # long, then one call tries it again (irm_fpga.server_breaker); each try that fails doubles the wait, up to
    # server_backoff_max_s. 0: no breaker.
    server_backoff_s: float = 2.0
    server_backoff_max_s: float = 30.0
    # How often every FPGA-server is made to hold what the database says (a server that restarted came back
    # empty; a delete that could not reach one left its part there). 0: only at start.
    reconcile_interval_s: float = 5.0
    # QoS job manager (harness.v1.FpgaJobs): "edf" | "throughput" (seed 000 §III), or a Hydrogen
    # scheduler (seed 001: "fcfs_min", ..., "managed_deadline", "managed_lookahead"; irm_fpga.jobs).
    jobs_policy: str = "edf"
    jobs_control_period_s: float = 1.0
    jobs_alpha: float = 0.5
    # Hydrogen policies: window, start-latency bound, the managed modes' elastic pool (0: all) and beta.
    jobs_window: int = 30
    jobs_late_after_s: float = 1.0
    jobs_pool_min: int = 1
    jobs_pool_max: int = 0
    jobs_beta: float = 2.5
    # managed_lookahead: seconds one dispatching decision may search (registrations wait for it).
    jobs_lookahead_budget_s: float = 0.25
    # A plug-in scheduling algorithm (module:function) runs in a process of its own and answers each decision
    # within this (else its process is killed and the queue waits for the next decision).
    jobs_plugin_timeout_s: float = 1.0
    # Jobs of one tenant waiting in a Hydrogen ready queue at once; one more RegisterJob is RESOURCE_EXHAUSTED.
    jobs_max_queued_per_tenant: int = 1000
    # A server holding job groups silent longer than this is taken as gone by the job manager (irm_fpga.jobs).
    jobs_silent_server_s: float = 60.0


@dataclass
class ServerHandle:
    name: str
    address: str
    token: str = ""            # the servers' control token (services.control)
    # Calls through `stub()` fail at once for a while after one timed out (irm_fpga.server_breaker); 0: never.
    backoff_s: float = 0.0
    backoff_max_s: float = 0.0
    breaker: ServerBreaker | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.breaker is None and self.backoff_s > 0:
            self.breaker = ServerBreaker(self.name, self.address, self.backoff_s, self.backoff_max_s)

    def stub(self) -> fpga_pb2_grpc.FpgaServerStub:
        return fpga_pb2_grpc.FpgaServerStub(intercept(control.channel(rpc.channel(self.address), self.token),
                                                      self.breaker))


def _pending(request_id: str) -> Aborted:
    return Aborted(f"the reservation with request_id {request_id!r} is being made (its devices reconfigure); ask "
                   "again shortly", reason=RESERVATION_PENDING, retry_after_s=PENDING_RETRY_S)


def _check_id(field_path: str, value: str) -> None:
    """INVALID_ARGUMENT for an id longer than any this service makes (it is not echoed back)."""
    if len(value) > MAX_ID_CHARS:
        raise InvalidArgument.of(field_path, f"at most {MAX_ID_CHARS} characters (got {len(value)}): an id as this "
                                             f"service returned it")


def _rpc_error(server: str, e: grpc.RpcError) -> HarnessError:
    return from_rpc_error(f"FPGA-server {server!r}", e)


class Orchestrator(fpga_pb2_grpc.FpgaOrchestratorServicer, irm_pb2_grpc.ResourceManagerServicer):
    def __init__(self, config: OrchestratorConfig, clock: Clock | None = None) -> None:
        self.config = config
        self.clock = clock or WallClock()
        # Capacity events' generations, strictly increasing, one per server state first seen: the CRS's view keeps
        # the highest, so a higher one must never carry an older state. Concurrent reads are answered and
        # published in any order; each server numbers its reads as it takes them (ServerInfo.read_seq), and an
        # answer older than one already stamped stands for that newer one (`_newest`). Stamping at ask time was
        # not enough: the read asked later could be the one the server answered first. A count from this
        # process's start time: a restarted one starts above the last (and a reconnect's snapshot resets the
        # view anyway). Not the clock at publish time: a wall clock stepping back made every event stale.
        self._generation = int(self.clock.now() * 1e6)
        self._generation_lock = threading.Lock()
        self._newest_read: dict[str, tuple[str, int, fpga_pb2.ServerInfo, int]] = {}   # server -> boot, seq, info, gen
        self._old_boots: dict[str, deque[str]] = {}     # server -> its earlier runs' boot ids (answers still in flight)
        # Its seconds as `harness serve` checks them: an autoscaler_interval_s of 0 spun its loop (a core burnt,
        # SIGTERM waiting behind it), a server_timeout_s of 0 failed every call to the servers at once; the
        # backoffs and reconcile_interval_s may be 0 (documented: no breaker, no reconcile rounds).
        check_seconds(config, "orchestrator")
        self.db = Database(config.database or default_url(config.state_dir, f"fpga-{config.name}"))
        self.db.migrate(MIGRATIONS, "alembic_version_fpga")
        self.servers: dict[str, ServerHandle] = {}
        self._silent_until: dict[str, float] = {}      # address -> monotonic time of its next discovery try
        self.lock = threading.RLock()  # placement decisions over servers are serialised
        # Attaches under one client id take turns (a client's retry after a timeout waits for its first call):
        # a first call that failed would otherwise delete the row a concurrent retry had just attached under.
        # Striped, so memory stays bounded whatever ids clients send.
        self._attach_locks = tuple(threading.Lock() for _ in range(ATTACH_LOCK_STRIPES))
        self.watchers: Broadcaster[irm_pb2.CapacityEvent] = Broadcaster(   # WatchCapacity streams
            max_streams=MAX_WATCHES, full="WatchCapacity streams are open on this FPGA IRM; close one, or poll "
                                          "DiscoverResources")
        self.memberships: list[Membership] = []
        self._stop = threading.Event()
        # One Autoscaler per server (it keeps that server's recent intervals); the
        # policy is built here so an unknown name fails at start-up.
        self._scalers: dict[str, autoscaler.Autoscaler] = {}
        if config.autoscaler != "none":
            try:
                autoscaler.make_policy(config.autoscaler)
            except ValueError as e:
                raise ValueError(f"orchestrator configuration: {e}") from None
        self._scaler = threading.Thread(target=self._autoscale_loop, name="autoscaler", daemon=True)
        self._reconciler = threading.Thread(target=self._reconcile_loop, name="reconcile", daemon=True)

    # -- lifecycle -------------------------------------------------------
    def start(self, port: int) -> None:
        self._discover_servers(strict=True)
        self._reassert()
        host = self.config.address.rsplit(":", 1)[0]
        advertise = self.config.advertise_address or f"{host}:{port}"
        for crs in [a.strip() for a in self.config.crs_address.split(",") if a.strip()]:
            m = Membership(crs, self.config.name, advertise, [VFPGA], self.config.heartbeat_interval_s,
                           control_token=self.config.control_token)
            m.start()
            self.memberships.append(m)
        if self.config.autoscaler != "none":
            self._scaler.start()
        if self.config.reconcile_interval_s > 0:
            self._reconciler.start()

    def quiesce(self) -> None:
        """Shutting down, before the server stops: leave the CRS and end the WatchCapacity streams."""
        for m in self.memberships:
            m.stop()
        self.watchers.close()

    def stop(self) -> None:
        """After the server's calls have finished: stop the background work, close the database."""
        self._stop.set()
        self.quiesce()
        self.db.dispose()

    def _discover_servers(self, strict: bool = False) -> None:
        """Map the configured addresses not yet mapped to the names their FPGA-servers report.

        One server down (maintenance, a restart) must not keep the Orchestrator, and so every group on the
        others, from being managed: an address that does not answer is tried again every reconcile round (one
        that timed out, or refused the token, after SILENT_RETRY_S).
        A token the server rejects is a configuration error: at start (`strict`) it stops the Orchestrator.
        """
        known = {h.address for h in self.servers.values()}
        now = time.monotonic()
        for address in self.config.servers:
            if address in known or (not strict and self._silent_until.get(address, 0.0) > now):
                continue
            try:
                info = ServerHandle("?", address, self.config.control_token).stub().GetServer(
                    fpga_pb2.GetServerRequest(), timeout=self.config.server_timeout_s)
            except grpc.RpcError as e:
                if e.code() in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.DEADLINE_EXCEEDED):
                    # A host that drops packets costs a whole timeout, and a token that is wrong stays wrong: with
                    # no reconcile rounds every placement tries unmapped servers (under the placement lock), so
                    # these wait a while before the next try.
                    self._silent_until[address] = now + SILENT_RETRY_S
                if e.code() == grpc.StatusCode.UNAUTHENTICATED:   # it answered: the tokens disagree
                    message = (f"control token rejected by FPGA-server at {address}: set control_token to the "
                               "FPGA-server's")
                    if strict:
                        raise OSError(message) from None
                    log.error(message)
                else:
                    log.warning("FPGA-server unreachable; its groups are managed once it answers",
                                extra={"address": address, "code": e.code().name})
                    # The next try connects afresh: a cached channel would still be backing off (up to 1 s) from
                    # this failure when the server is back, and fail that try too.
                    rpc.drop(address)
                continue
            # A new dict, not an update: other threads iterate `self.servers` without the lock.
            self.servers = {**self.servers, info.name: ServerHandle(
                info.name, address, self.config.control_token, backoff_s=self.config.server_backoff_s,
                backoff_max_s=self.config.server_backoff_max_s)}

    def _handle(self, name: str) -> ServerHandle:
        h = self.servers.get(name)
        if h is None:
            raise Unavailable(f"FPGA-server {name!r} has not answered since the Orchestrator started; retry once "
                              "it is back")
        return h

    def _reassert(self) -> None:
        """After a restart: make every server hold what the database says (all calls idempotent)."""
        with self.db.read() as s:
            groups = list(s.scalars(select(Group).where(Group.deleted.is_(False))))
            clients = list(s.scalars(select(Client).where(Client.state == "attached")))
            live = {r.id for r in s.scalars(select(Reservation).where(Reservation.state != "pending"))}
            unfinished = [r.id for r in s.scalars(select(Reservation).where(Reservation.state == "pending"))]
            cut_short = list(s.scalars(select(Client.id).where(Client.state == ATTACHING)))
        # A crash in the middle of AttachClient: its caller was never answered; take it back, so the id can be used.
        for client_id in cut_short:
            self._revoke_everywhere(client_id, list(self.servers.values()))
            self.db.transact(lambda s, c=client_id: s.execute(delete(Client).where(Client.id == c,
                                                                                   Client.state == ATTACHING)))
        # A crash in the middle of Reserve left groups its reservation never got: give them back.
        orphans = [g for g in groups if g.reservation_id and g.reservation_id not in live]
        for g in orphans:
            self._delete_parts(g, {name: 0 for name in self.servers})
            self.db.transact(lambda s, gid=g.id: setattr(s.get(Group, gid), "deleted", True))
        if unfinished:
            self.db.transact(lambda s: s.execute(delete(Reservation).where(Reservation.id.in_(unfinished))))
        groups = [g for g in groups if g not in orphans]
        # Parts made, set to their recorded size (a resize cut short), dropped (a delete that could not reach a
        # server); then every client re-attached, also where its part survived.
        self._reconcile(self._server_infos())
        by_group = {g.id: g for g in groups}
        for c in clients:
            g = by_group.get(c.group_id)
            if g is None:
                continue
            for server in g.parts:
                h = self.servers.get(server)
                if h is not None:
                    try:
                        h.stub().AttachClient(fpga_pb2.ServerAttachRequest(group_id=g.id, client_id=c.id,
                                                                           token=c.token),
                                              timeout=self.config.server_timeout_s)
                    except grpc.RpcError:
                        pass

    # -- servers ---------------------------------------------------------
    def _server_infos(self) -> dict[str, fpga_pb2.ServerInfo]:
        return self._stamped_infos()[0]

    def _stamped_infos(self) -> tuple[dict[str, fpga_pb2.ServerInfo], dict[str, int]]:
        """The servers' states, each the newest known (`_newest`), and each one's generation."""
        if self.config.reconcile_interval_s <= 0 and len(self.servers) < len(self.config.servers):
            # No reconcile rounds to map a server that was down at start: each placement (and listing) tries.
            self._discover_servers()
        out, generations = {}, {}
        for name, reply in self.ask_all(self.servers, "GetServer", fpga_pb2.GetServerRequest()).items():
            if isinstance(reply, ServerNotAnswering):      # its breaker said so once, when it opened
                log.debug("FPGA-server not asked: it did not answer lately", extra={"server": name})
            elif isinstance(reply, grpc.RpcError) and reply.code() == grpc.StatusCode.UNAUTHENTICATED:
                log.warning("FPGA-server refused our control token: set control_token to the same secret on the "
                            "Orchestrator and the FPGA-server (HARNESS_CONTROL_TOKEN in compose)",
                            extra={"server": name, "code": reply.code().name})
            elif isinstance(reply, grpc.RpcError):
                log.warning("FPGA-server unreachable", extra={"server": name, "code": reply.code().name})
            else:
                out[name], generations[name] = self._newest(name, reply)     # type: ignore[arg-type]
        return out, generations

    def _newest(self, server: str, info: fpga_pb2.ServerInfo) -> tuple[fpga_pb2.ServerInfo, int]:
        """`info`, stamped with the next generation if it is the newest state of `server` seen yet; else the
        newest seen and its generation (an answer that took longer to reach us than a later read's).

        A server that does not number its reads (no boot_id) is taken as newest, as before read_seq existed.
        """
        with self._generation_lock:
            known = self._newest_read.get(server)
            if known is not None and info.boot_id:
                boot, seq, newest, generation = known
                if (info.boot_id == boot and info.read_seq <= seq) or info.boot_id in self._old_boots.get(server, ()):
                    return newest, generation
                if info.boot_id != boot:        # the server restarted: answers of its last run are older now
                    self._old_boots.setdefault(server, deque(maxlen=8)).append(boot)
            self._generation += 1
            self._newest_read[server] = (info.boot_id, info.read_seq, info, self._generation)
            return info, self._generation

    def ask_all(self, handles: dict[str, ServerHandle], method: str, request: object) -> dict[str, object]:
        """`ask_servers` with this Orchestrator's server timeout."""
        return ask_servers(handles, method, request, self.config.server_timeout_s)

    @staticmethod
    def _free(info: fpga_pb2.ServerInfo, recorded: int = 0) -> int:
        """Devices free on a server: what it reports held, or what the database gives it if more (a server
        that restarted reports nothing until it is reconciled: its devices must not be sold twice meanwhile)."""
        usable = sum(1 for d in info.devices if d.state != fpga_pb2.DeviceInfo.STATE_BLACKLISTED)
        return usable - max(sum(g.target for g in info.groups), recorded)

    def _recorded(self) -> dict[str, int]:
        """Devices the live groups hold per server, by the database."""
        out: dict[str, int] = {}
        with self.db.read() as s:
            for g in s.scalars(select(Group).where(Group.deleted.is_(False))):
                for name, n in (g.parts or {}).items():
                    out[name] = out.get(name, 0) + n
        return out

    def _spread(self, size: int, current: dict[str, int], pinned: list[str] | None = None,
                silent: set[str] | None = None, evict: Iterable[str] = ()) -> dict[str, int]:
        """Devices per server for a group of `size`: keep what it has, grow where room is, shrink the largest.

        A shrink cuts the parts on servers that do not answer first (nothing is served there; the caller records
        them cut without a call, and the reconcile rounds set those servers' parts once they answer). `silent`, if
        given, gets the servers of `current` that did not answer. `evict`: servers the caller has given up on
        (the job manager's, silent past jobs_silent_server_s); those of them that still do not answer lose their
        parts whatever the size, and the group is made `size` on the others, in one step: cutting to the live
        devices first and growing after would go through a size the group's min_size may refuse, and a shrink
        from the recorded size leaves part of the group on the dead server."""
        infos = self._server_infos()
        # First make them hold what the database says: a restarted server's parts back, stale ones gone.
        changed = self._reconcile(infos)
        if changed["made"] or changed["dropped"]:
            infos = self._server_infos()
        if silent is not None:
            silent.update(n for n in current if n not in infos)
        recorded = self._recorded()
        free_of = {n: self._free(i, recorded.get(n, 0)) for n, i in infos.items()}
        parts = dict(current)
        for name in evict:
            if name in parts and name not in infos:     # one that answers again keeps its part
                parts[name] = 0
        total = sum(parts.values())
        if size > total:
            need = size - total
            order = sorted(infos, key=lambda n: (n not in parts, -free_of[n]))
            if pinned:
                # Chosen by the CRS for its hop, latency and same-host constraints: only there, or not at all.
                order = [n for n in pinned if n in infos]
            for name in order:
                take = min(need, max(0, free_of[name]))
                if take:
                    parts[name] = parts.get(name, 0) + take
                    need -= take
                if need == 0:
                    break
            if need:
                if pinned:
                    free = sum(max(0, free_of[n]) for n in order)
                    raise ResourceExhausted(f"{size - total} more device(s) needed on {', '.join(pinned)}; {free} "
                                            f"free there{'' if order else ' (not reachable)'}; place again")
                free = sum(max(0, f) for f in free_of.values())
                raise ResourceExhausted(f"{size - total} more device(s) needed; {free} free on "
                                        f"{len(infos)} reachable FPGA-server(s)")
        elif size < total:
            # Every part keeps a device while it can: a part shrunk to nothing would
            # strand the tasks clients already queued there. Below one device per
            # part, the smallest parts go first.
            cut = total - size
            for name in sorted((n for n in parts if n not in infos), key=lambda n: (-parts[n], n)):
                take = min(cut, parts[name])
                parts[name] -= take
                cut -= take
                if cut == 0:
                    return parts
            for floor in (1, 0):
                for name in sorted(parts, key=lambda n: (-parts[n], n) if floor else (parts[n], n)):
                    take = min(cut, max(0, parts[name] - floor))
                    parts[name] -= take
                    cut -= take
                    if cut == 0:
                        return parts
        return parts

    def _apply(self, g: Group, parts: dict[str, int], silent: set[str] | frozenset[str] = frozenset()) -> None:
        """Make the servers hold `parts` of `g` (whose `parts` are what they hold now, by the database).

        All or nothing, as far as the servers answer: a failure puts back the parts already changed, so the
        database (which the caller leaves as it was) stays true; what cannot be put back now, the reconcile
        rounds do. A part shrinking on a server in `silent` (one that did not answer) is not called for: the
        caller records its size, and the reconcile rounds set it there once the server answers.
        """
        touched: list[str] = []
        try:
            for name, n in parts.items():
                if name in g.parts and n == g.parts[name]:
                    continue
                if name in silent and name in g.parts and n < g.parts[name]:
                    log.warning("group part cut on an FPGA-server that does not answer; the reconcile rounds set "
                                "it there once it does", extra={"group": g.id, "server": name, "devices": n})
                    continue
                h = self._handle(name)
                touched.append(name)
                try:
                    if name in g.parts:
                        # Cut to nothing while other parts keep devices: what waits here goes to them.
                        hand_back = n == 0 and any(m > 0 for k, m in parts.items() if k != name)
                        h.stub().ResizeGroupPart(fpga_pb2.ResizeGroupPartRequest(group_id=g.id, size=n,
                                                                                 hand_back=hand_back),
                                                 timeout=self.config.server_timeout_s)
                    else:
                        h.stub().CreateGroupPart(fpga_pb2.CreateGroupPartRequest(group_id=g.id, design=g.design,
                                                                                 size=n),
                                                 timeout=self.config.server_timeout_s)
                        with self.db.read() as s:
                            clients = list(s.scalars(select(Client).where(Client.group_id == g.id,
                                                                          Client.state == "attached")))
                        for c in clients:
                            h.stub().AttachClient(fpga_pb2.ServerAttachRequest(group_id=g.id, client_id=c.id,
                                                                               token=c.token),
                                                  timeout=self.config.server_timeout_s)
                except grpc.RpcError as e:
                    raise _rpc_error(name, e) from None
        except BaseException:
            # The failing server is put back too: its call may have been done even though no answer came.
            self._put_back(g, touched)
            raise
        self._publish()

    def _put_back(self, g: Group, names: list[str]) -> None:
        """Best effort: the parts of `g` on `names` as the database has them (gone where it has none)."""
        for name in reversed(names):
            h = self.servers.get(name)
            if h is None:
                continue
            try:
                if name in g.parts:
                    h.stub().ResizeGroupPart(fpga_pb2.ResizeGroupPartRequest(group_id=g.id, size=g.parts[name]),
                                             timeout=self.config.server_timeout_s)
                else:
                    h.stub().DeleteGroupPart(fpga_pb2.DeleteGroupPartRequest(group_id=g.id),
                                             timeout=self.config.server_timeout_s)
            except grpc.RpcError as e:
                log.warning("could not put a group part back; the reconcile rounds will",
                            extra={"group": g.id, "server": name, "code": e.code().name})

    def _publish(self) -> None:
        infos, generations = self._stamped_infos()
        self.watchers.publish(irm_pb2.CapacityEvent(kind=irm_pb2.CapacityEvent.KIND_UPDATED,
                                                    resource=self._physical(i, generations[n])) for n, i in infos.items())

    # -- groups ----------------------------------------------------------
    def _to_proto(self, g: Group, clients: list[str] | None = None) -> fpga_pb2.FpgaGroup:
        """`g` as the API shows it; `clients`: its attached clients when already read (else read here)."""
        if clients is None:
            clients = self._attached([g.id]).get(g.id, [])
        return fpga_pb2.FpgaGroup(
            id=g.id, tenant=g.tenant, design=g.design, size=g.size, min_size=g.min_size, max_size=g.max_size,
            sharing=fpga_pb2.FpgaGroup.SHARING_SHARED if g.shared else fpga_pb2.FpgaGroup.SHARING_PRIVATE,
            scaling=fpga_pb2.FpgaGroup.SCALING_ELASTIC if g.elastic else fpga_pb2.FpgaGroup.SCALING_STATIC,
            parts={k: v for k, v in g.parts.items() if v}, active=sum(g.parts.values()), clients=clients,
            created_at=g.created_at, deleted=g.deleted)

    def _attached(self, group_ids: list[str]) -> dict[str, list[str]]:
        """group -> its attached clients, for all of `group_ids` in one query."""
        out: dict[str, list[str]] = {}
        with self.db.read() as s:
            for c in s.scalars(select(Client).where(Client.group_id.in_(group_ids), Client.state == "attached")
                               .order_by(Client.id)):
                out.setdefault(c.group_id, []).append(c.id)
        return out

    def _group(self, group_id: str) -> Group:
        _check_id("group_id", group_id)
        with self.db.read() as s:
            g = s.get(Group, group_id)
        if g is None or g.deleted:
            raise NotFound(f"FPGA group {group_id!r} does not exist")
        return g

    def _validate_group(self, design: str, size: int, min_size: int, max_size: int, v: Violations,
                        prefix: str = "") -> tuple[int, int]:
        answering = self._free_total_capacity()
        total = sum(answering.values()) or 0
        silent = max(0, len(self.config.servers) - len(answering))
        if (why := design_lib.unknown_design(design)) is not None:
            v.add(f"{prefix}design", why)
        mn = min_size if min_size else min(1, size)
        v.check(size >= 1, f"{prefix}size", "at least 1 device")
        v.check(0 <= mn <= size, f"{prefix}min_size", f"must be between 0 and size ({size})")
        v.check(not max_size or size <= max_size, f"{prefix}max_size", f"must be >= size ({size})")
        if silent and not v.items and (size > total or max_size > total):
            # A request right in itself that only the servers answering cannot hold: the devices of those that do
            # not answer (down, partitioned, refusing our control token) are unknown now. INVALID_ARGUMENT would
            # tell the client never to retry.
            raise Unavailable(f"{silent} of {len(self.config.servers)} FPGA-servers did not answer: their devices "
                              f"are unknown now ({total} usable on the others); retry", reason=MANAGER_UNAVAILABLE,
                              retry_after_s=self.config.server_backoff_s or 1.0)
        mx = max_size or total
        if not max_size:
            v.check(size <= total, f"{prefix}size", f"the FPGA-servers have {total} usable devices in all")
        v.check(mx <= total, f"{prefix}max_size", f"the FPGA-servers have {total} usable devices in all")
        return mn, mx

    def _free_total_capacity(self) -> dict[str, int]:
        return {n: sum(1 for d in i.devices if d.state != fpga_pb2.DeviceInfo.STATE_BLACKLISTED)
                for n, i in self._server_infos().items()}

    def create_group(self, tenant: str, request_id: str, design: str, size: int, min_size: int = 0,
                     max_size: int = 0, shared: bool = False, elastic: bool = False,
                     pinned: list[str] | None = None, reservation_id: str = "",
                     violations: Violations | None = None, fingerprint: str = "") -> Group:
        """`violations`: problems the caller found in its request already, reported with these. `fingerprint`:
        the request's hash (services.idempotency) when a tenant asked (CreateGroup); a group made under the same
        request_id for another request is not its replay: INVALID_ARGUMENT."""
        v = Violations() if violations is None else violations
        v.check(bool(request_id) and len(request_id) <= MAX_GROUP_REQUEST_ID_CHARS, "request_id",
                f"required: an idempotency key of 1-{MAX_GROUP_REQUEST_ID_CHARS} characters")
        mn, mx = self._validate_group(design, size, min_size, max_size, v)
        v.raise_if_any()
        with self.lock:  # check-then-create as one step: a concurrent retry finds the first group
            with self.db.read() as s:
                existing = s.scalar(select(Group).where(Group.tenant == tenant, Group.request_id == request_id))
            if existing is not None:
                return self._replayed_group(existing, fingerprint)
            parts = self._spread(size, {}, pinned)
            g = Group(id=f"fg-{uuid.uuid4().hex[:16]}", tenant=tenant, request_id=request_id,
                      request_hash=fingerprint, design=design,
                      size=size, min_size=mn, max_size=mx, shared=shared, elastic=elastic, parts=dict(parts),
                      created_at=self.clock.now(), deleted=False, reservation_id=reservation_id)
            # The parts are recorded before any server makes them: an Orchestrator that dies in between leaves a
            # group whose parts the database knows (a restart makes or finds them, a retry gets the whole group),
            # never devices held on a server for a group that has none.
            self.db.transact(lambda s: s.add(Group(**{c.name: getattr(g, c.name) for c in Group.__table__.c})))
            try:
                self._apply(Group(id=g.id, design=design, parts={}), parts)
            except BaseException:
                self._delete_parts(g, parts)
                # A creation that failed leaves no group, so a retry of the same request tries again (a row kept
                # as deleted would answer every retry with a dead group).
                self.db.transact(lambda s: s.delete(s.get(Group, g.id)))
                raise
        return g

    @staticmethod
    def _replayed_group(existing: Group, fingerprint: str) -> Group:
        """The group a request_id first made, for a retry of the same request. A group made before requests were
        hashed is not compared (as before); one the Orchestrator made for a reservation is no CreateGroup's."""
        comparable = bool(existing.request_hash or existing.reservation_id)   # else: from before hashing
        if fingerprint and existing.request_hash != fingerprint and comparable:
            raise reused_request_id()
        return existing

    def resize(self, g: Group, size: int, *, max_size: int | None = None, pinned: list[str] | None = None,
               evict: Iterable[str] = ()) -> Group:
        """`max_size` above the group's raises it first: a job's group (the job manager's) may grow onto devices
        that were not usable when it was made, which capped its max then. `evict`: servers whose parts go to
        nothing if they still do not answer, the group being `size` on the others (`_spread`)."""
        mx = max(g.max_size, max_size or 0)
        if not g.min_size <= size <= mx:
            raise FailedPrecondition(f"size {size} is outside the group's [{g.min_size}, {mx}]")
        with self.lock:
            g = self._group(g.id)
            silent: set[str] = set()
            parts = self._spread(size, g.parts, pinned, silent=silent, evict=evict)
            self._apply(g, parts, silent)

            def save(s):  # type: ignore[no-untyped-def]
                row = s.get(Group, g.id)
                row.size, row.parts, row.max_size = size, dict(parts), max(row.max_size, mx)
                return row
            return self.db.transact(save)

    def _delete_parts(self, g: Group, parts: dict[str, int]) -> None:
        handles = {name: h for name in parts if (h := self.servers.get(name)) is not None}
        for name, reply in self.ask_all(handles, "DeleteGroupPart",
                                         fpga_pb2.DeleteGroupPartRequest(group_id=g.id)).items():
            if isinstance(reply, grpc.RpcError):
                log.warning("could not delete a group part", extra={"group": g.id, "server": name,
                                                                    "code": reply.code().name})

    def delete(self, g: Group) -> Group:
        with self.lock:
            with self.db.read() as s:
                now = s.get(Group, g.id)    # the parts as they are now, not as the caller saw them
            if now is None:                 # its creation failed meanwhile (a failed creation leaves no group)
                raise NotFound(f"group {g.id!r} does not exist (its creation failed)")
            g = now
            self._delete_parts(g, g.parts)

            def save(s):  # type: ignore[no-untyped-def]
                row = s.get(Group, g.id)
                row.deleted = True
                for c in s.scalars(select(Client).where(Client.group_id == g.id, Client.state == "attached")):
                    c.state = "revoked"
                return row
            row = self.db.transact(save)
        self._publish()
        return row

    # -- FpgaOrchestrator API -------------------------------------------
    def CreateGroup(self, request, context):  # noqa: N802
        tenant = require_tenant(request.tenant)
        if request.request_id.startswith(JOB_GROUP_PREFIX):
            # The job manager finds the groups it made (and drops those a crash left without their job) by it.
            raise InvalidArgument.of("request_id", f"request ids starting with {JOB_GROUP_PREFIX!r} are the job "
                                                   f"manager's; register a job (FpgaJobs.RegisterJob) or pick another")
        v = Violations()
        # An unknown number would be read as the default (private, static): not what the caller asked for.
        for name, value, enum in (("sharing", request.sharing, fpga_pb2.FpgaGroup.Sharing),
                                  ("scaling", request.scaling, fpga_pb2.FpgaGroup.Scaling)):
            v.check(value in enum.values(), name, f"unknown value {value}; one of {choices(enum)}")
        g = self.create_group(tenant, request.request_id, request.design, request.size, request.min_size,
                              request.max_size, request.sharing == fpga_pb2.FpgaGroup.SHARING_SHARED,
                              request.scaling == fpga_pb2.FpgaGroup.SCALING_ELASTIC, violations=v,
                              fingerprint=request_hash(request))
        return self._to_proto(g)

    def GetGroup(self, request, context):  # noqa: N802
        tenant = require_tenant(request.tenant)
        g = self._group(request.group_id)
        if not g.shared:
            owned(tenant, g.tenant, f"FPGA group {g.id!r}")
        return self._to_proto(g)

    def ListGroups(self, request, context):  # noqa: N802
        tenant = require_tenant(request.tenant)
        with self.db.read() as s:
            rows, token = paging.page(s, select(Group).where(Group.tenant == tenant, Group.deleted.is_(False)),
                                      [Group.created_at, Group.id], request.page_size, request.page_token)
        clients = self._attached([g.id for g in rows])      # one query for the page, not one per group
        return fpga_pb2.ListGroupsResponse(groups=[self._to_proto(g, clients.get(g.id, [])) for g in rows],
                                           next_page_token=token)

    def ResizeGroup(self, request, context):  # noqa: N802
        tenant = require_tenant(request.tenant)
        g = self._group(request.group_id)
        owned(tenant, g.tenant, f"FPGA group {g.id!r}")
        if request.size < 1:
            raise InvalidArgument.of("size", "at least 1 device")
        self._not_a_jobs(g, "resized")
        self._not_a_reservations(g, "resized")
        return self._to_proto(self.resize(g, request.size))

    def DeleteGroup(self, request, context):  # noqa: N802
        tenant = require_tenant(request.tenant)
        _check_id("group_id", request.group_id)
        with self.db.read() as s:
            g = s.get(Group, request.group_id)
        if g is None:
            raise NotFound(f"FPGA group {request.group_id!r} does not exist")
        owned(tenant, g.tenant, f"FPGA group {g.id!r}")
        if g.deleted:
            return self._to_proto(g)
        self._not_a_jobs(g, "deleted")
        self._not_a_reservations(g, "deleted")
        return self._to_proto(self.delete(g))

    def _not_a_jobs(self, g: Group, what: str) -> None:
        """A job's group is sized by the job manager alone: a tenant resizing it would keep devices the manager
        gave others (it never looks), one deleting it would leave the job counting devices it no longer has."""
        with self.db.read() as s:
            job = s.scalars(select(FpgaJob.id).where(FpgaJob.group_id == g.id, FpgaJob.state != "retired")).first()
        if job is not None:
            raise FailedPrecondition(f"FPGA group {g.id!r} belongs to job {job!r}, whose devices the job manager "
                                     f"decides; it cannot be {what} directly: retire the job (FpgaJobs.RetireJob)")

    def _not_a_reservations(self, g: Group, what: str) -> None:
        """A virtual FPGA of a reservation (ResourceManager.Reserve, the CRS's too) lives as long as the
        reservation: deleted or resized directly, the reservation would stay active, and billed, for devices it no
        longer holds, which would be sold again. A group left by a reservation that never completed (a crash in
        Reserve; a restart gives those back) or that was released is not held."""
        if not g.reservation_id:
            return
        with self.db.read() as s:
            r = s.get(Reservation, g.reservation_id)
        if r is None or r.state == "released":
            return
        raise FailedPrecondition(f"FPGA group {g.id!r} is a virtual FPGA of reservation {r.id!r}; it cannot be "
                                 f"{what} directly: release reservation {r.id!r} instead "
                                 "(ResourceManager.ReleaseReservation; if it was reserved through the CRS, release "
                                 "the CRS's reservation that holds it)")

    def AttachClient(self, request, context):  # noqa: N802
        tenant = require_tenant(request.tenant)
        g = self._group(request.group_id)
        if not g.shared:
            owned(tenant, g.tenant, f"FPGA group {g.id!r} (private)")
        # What the FPGA-servers refuse (a NUL: their gRPC layer; empty is ours to fill) must be refused before
        # the row is written: a row no server takes would break every later part of the group (and PostgreSQL
        # cannot store a NUL at all).
        if len(request.client_id) > 64:
            raise InvalidArgument.of("client_id", "at most 64 characters (or leave it empty for one to be made)")
        if "\x00" in request.client_id:
            raise InvalidArgument.of("client_id", "must not contain a NUL character (\\x00)")
        client_id = request.client_id or f"fc-{uuid.uuid4().hex[:16]}"
        with self._attach_lock(client_id):
            return self._attach(tenant, g, client_id)

    def _attach_lock(self, client_id: str) -> threading.Lock:
        return self._attach_locks[zlib.crc32(client_id.encode()) % len(self._attach_locks)]

    def _attach(self, tenant: str, g: Group, client_id: str) -> fpga_pb2.Attachment:
        g = self._group(g.id)            # as it is now: a resize may have moved its parts while this call waited
        with self.db.read() as s:
            existing = s.get(Client, client_id)
        new = existing is None
        if new:
            token = secrets.token_hex(16)
            try:
                # "attaching" until every server took it: a concurrent call (another Orchestrator's) is told to
                # retry, never that the client is attached, since this call may yet fail and take it back.
                self.db.transact(lambda s: s.add(Client(id=client_id, group_id=g.id, tenant=tenant, token=token,
                                                        state=ATTACHING)))
            except IntegrityError:
                # A concurrent attach under this id (a retry after a timeout) wrote it first.
                with self.db.read() as s:
                    existing = s.get(Client, client_id)
                if existing is None:
                    raise Aborted(f"client {client_id!r} is being attached by another call; retry") from None
                new = False
        if existing is not None:
            owned(tenant, existing.tenant, f"client {client_id!r}")
            if existing.state == ATTACHING:
                raise Aborted(f"client {client_id!r} is being attached by another call; retry")
            if existing.state != "attached" or existing.group_id != g.id:
                raise FailedPrecondition(f"client {client_id!r} was {existing.state} or belongs to another group; "
                                         "attach under a new client id")
            token = existing.token
        accepted: list[ServerHandle] = []
        # Parts on servers that did not answer: left out of the answer (the client uses the others, and learns of
        # them on a later attach), the client put on them by the reconcile rounds once they answer. One silent
        # server of a group spread over several must not keep every client off the parts that work.
        silent: dict[str, HarnessError] = {}

        def attach_on(parts: dict[str, int]) -> None:
            for name, n in parts.items():
                # A server silent to this call is not asked again under the lock (with no breaker, each ask would
                # hold every placement for server_timeout_s); only parts a resize added meanwhile are new.
                if n <= 0 or name in silent or any(h.name == name for h in accepted):
                    continue
                try:
                    h = self._handle(name)
                    h.stub().AttachClient(fpga_pb2.ServerAttachRequest(group_id=g.id, client_id=client_id,
                                                                       token=token),
                                          timeout=self.config.server_timeout_s)
                except Unavailable as e:
                    silent[name] = e
                    continue
                except grpc.RpcError as e:
                    if e.code() not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                        raise _rpc_error(name, e) from None
                    silent[name] = _rpc_error(name, e)
                    continue
                accepted.append(h)

        try:
            attach_on(g.parts)          # outside the lock: the servers' answers must not hold up placements
            with self.lock:
                # Resizes and deletes take this lock and attach (or revoke) only clients already "attached": one
                # that ran while this call attached would leave this client off a part it added (a resize onto a
                # new server) or attached to a deleted group. So: the group as it is now, the client put on any
                # part it gained, and marked attached before either can run again.
                g = self._group(g.id)   # NotFound if deleted meanwhile: taken back below
                if not new:
                    # Revokes and detaches mark the row under this lock: one that came after this call read the
                    # row must not be undone by the attach made meanwhile (a client library refreshes every
                    # second, with its old token).
                    with self.db.read() as s:
                        now_row = s.get(Client, client_id)
                    if now_row is None or now_row.state != "attached":
                        ended = now_row.state if now_row is not None else "removed"
                        self._revoke_everywhere(client_id, accepted,
                                                "DetachClient" if ended == "detached" else "RevokeClient")
                        raise FailedPrecondition(f"client {client_id!r} was {ended} or belongs to another group; "
                                                 "attach under a new client id")
                attach_on(g.parts)
                if not accepted and silent:
                    raise next(iter(silent.values()))       # no part answered: nothing to use yet
                if new and not self.db.transact(lambda s: s.execute(
                        update(Client).where(Client.id == client_id, Client.state == ATTACHING)
                        .values(state="attached")).rowcount):
                    raise Aborted(f"client {client_id!r} was detached or cleared while it was being attached; retry")
            ok = {h.name for h in accepted}
            parts = [fpga_pb2.AttachedPart(server=name, address=self._handle(name).address, devices=n)
                     for name, n in g.parts.items() if n > 0 and name in ok]
            if silent:
                log.warning("client attached without the parts on FPGA-servers that did not answer; the reconcile "
                            "rounds attach it there once they do",
                            extra={"client": client_id, "group": g.id, "servers": sorted(silent)})
        except BaseException:
            if new:
                # Not attached anywhere, then: a retry under the same id starts afresh, and no row is left that
                # the reconcile rounds (and every later part of the group) would try to attach again.
                self._revoke_everywhere(client_id, accepted)
                self.db.transact(lambda s: s.execute(delete(Client).where(Client.id == client_id,
                                                                          Client.state == ATTACHING)))
            raise
        return fpga_pb2.Attachment(client_id=client_id, group_id=g.id, token=token, parts=parts, design=g.design)

    def _revoke_everywhere(self, client_id: str, handles: list[ServerHandle], method: str = "RevokeClient") -> None:
        """Take an attach that did not complete (or should not have) back from `handles` with `method` (best
        effort: a server that does not answer is logged; it holds a client no one was given, until the rounds)."""
        replies = self.ask_all({h.name: h for h in handles}, method, fpga_pb2.ServerClientRequest(client_id=client_id))
        for name, reply in replies.items():
            if isinstance(reply, grpc.RpcError):
                log.warning("could not take back an attach that did not complete",
                            extra={"client": client_id, "server": name, "code": reply.code().name})

    def _client(self, tenant: str, request: fpga_pb2.ClientRequest) -> tuple[Group, Client]:
        g = self._group(request.group_id)
        _check_id("client_id", request.client_id)
        with self.db.read() as s:
            c = s.get(Client, request.client_id)
        if c is None or c.group_id != g.id:
            raise NotFound(f"client {request.client_id!r} is not attached to {g.id!r}")
        return g, c

    def _to_servers(self, g: Group, method: str, client_id: str) -> int:
        """`method` for the client on every server of `g` at once: the tasks cancelled. A server that does not
        answer is UNAVAILABLE naming it, after the others have done it (the reconcile rounds finish it there)."""
        handles = {name: h for name in g.parts if (h := self.servers.get(name)) is not None}
        total, failed = 0, []
        for name, reply in self.ask_all(handles, method, fpga_pb2.ServerClientRequest(client_id=client_id)).items():
            if isinstance(reply, grpc.RpcError):
                failed.append((name, reply))
            else:
                total += reply.cancelled           # type: ignore[attr-defined]
        if failed:
            name, e = failed[0]
            done = sorted(set(handles) - {n for n, _ in failed})
            raise Unavailable(f"{method} of client {client_id!r}: FPGA-server {name!r} did not answer "
                              f"({e.code().name}); done on {', '.join(done) or 'no other server'} "
                              f"({total} queued tasks cancelled); it holds there once that server answers "
                              "(the reconcile rounds), or retry", reason=MANAGER_UNAVAILABLE,
                              retry_after_s=RETRY_LATER_S)
        return total

    def _end_client(self, g: Group, c: Client, method: str, state: str) -> int:
        """`c` marked `state`, then taken off every part of `g` (`method` on its servers): tasks cancelled.

        Marked first, under the lock resizes take: a resize after it puts the client on no new part (resizes
        attach "attached" clients only), and the parts read with it include any a resize before it gave the
        client. Taken off the servers after, it was put back on a part a resize added meanwhile, and kept its
        access there. A server that does not answer now is set right by the reconcile rounds (they take every
        client the database does not hold attached off the servers); the call fails, and may be retried.
        """
        with self.lock:
            g = self._group(g.id)
            self.db.transact(lambda s: setattr(s.get(Client, c.id), "state", state))
        return self._to_servers(g, method, c.id)

    def DetachClient(self, request, context):  # noqa: N802
        tenant = require_tenant(request.tenant)
        g, c = self._client(tenant, request)
        owned(tenant, c.tenant, f"client {c.id!r}")
        self._end_client(g, c, "DetachClient", "detached")
        return fpga_pb2.ClientResponse()

    def RevokeClient(self, request, context):  # noqa: N802
        tenant = require_tenant(request.tenant)
        g, c = self._client(tenant, request)
        owned(tenant, g.tenant, f"FPGA group {g.id!r} (only its owner revokes clients)")
        return fpga_pb2.ClientResponse(cancelled=self._end_client(g, c, "RevokeClient", "revoked"))

    def ListDevices(self, request, context):  # noqa: N802
        tenant = require_tenant(request.tenant)
        infos = self._server_infos()
        with self.db.read() as s:
            own = set(s.scalars(select(Group.id).where(Group.tenant == tenant, Group.deleted.is_(False))))
            guest: dict[str, set[str]] = {}
            for c in s.scalars(select(Client).where(Client.tenant == tenant, Client.state == "attached")):
                if c.group_id not in own:
                    guest.setdefault(c.group_id, set()).add(c.id)
        return fpga_pb2.ListDevicesResponse(servers=[self._tenant_view(i, own, guest) for i in infos.values()])

    @staticmethod
    def _tenant_view(info: fpga_pb2.ServerInfo, own: set[str], guest: dict[str, set[str]]) -> fpga_pb2.ServerInfo:
        """A server as one tenant may see it: every device (the capacity there is everyone's business), but group
        and client ids only of its own groups, and of others' shared groups only its own clients there. What other
        tenants hold is one anonymous part per server (no group id, no clients) with their devices in it."""
        view = fpga_pb2.ServerInfo(name=info.name, designs=info.designs, reconfiguration_s=info.reconfiguration_s,
                                   events=info.events)
        for d in info.devices:
            known = d.group_id in own or d.group_id in guest
            view.devices.add(index=d.index, state=d.state, design=d.design, failures=d.failures,
                             group_id=d.group_id if known else "")
        others = fpga_pb2.GroupPart(server=info.name)
        for p in info.groups:
            if p.group_id in own:
                view.groups.append(p)
            elif p.group_id in guest:
                part = view.groups.add()
                part.CopyFrom(p)
                part.clients[:] = [c for c in p.clients if c in guest[p.group_id]]
            else:
                others.target += p.target
                others.active += p.active
        if others.target or others.active:
            view.groups.append(others)
        return view

    # -- IRM API (resource type "vfpga") ---------------------------------
    def _physical(self, info: fpga_pb2.ServerInfo, generation: int) -> common_pb2.PhysicalResource:
        usable = sum(1 for d in info.devices if d.state != fpga_pb2.DeviceInfo.STATE_BLACKLISTED)
        used = sum(g.target for g in info.groups)
        return common_pb2.PhysicalResource(
            id=info.name, resource_type=VFPGA, capacity={"devices": usable}, used={"devices": used},
            properties={"reconfiguration_s": info.reconfiguration_s}, traits=["fpga", *info.designs],
            location=common_pb2.Location(site=self.config.site, rack=self.config.rack, host=info.name),
            manager=self.config.name, generation=generation)

    def DescribeAllocationSpec(self, request, context):  # noqa: N802
        total = sum(self._free_total_capacity().values())
        return irm_pb2.DescribeAllocationSpecResponse(resource_types=[irm_pb2.ResourceTypeSpec(
            name=VFPGA, manager=self.config.name,
            description="A virtual FPGA: an FPGA group of devices configured with one design (thesis §3.2).",
            metrics=["completed", "queued", "busy_device_s"],
            attributes=[
                irm_pb2.AttributeSpec(name="devices", kind=irm_pb2.AttributeSpec.KIND_NUMBER, unit="devices",
                                      domain=common_pb2.Range(min=1, max=max(1, total)), consumable=True,
                                      integer=True,
                                      # What _parse takes when a group leaves it out: the CRS counts it too.
                                      default=common_pb2.AttributeRequest(number=1),
                                      description="Devices backing the virtual FPGA (default 1)."),
                irm_pb2.AttributeSpec(name="design", kind=irm_pb2.AttributeSpec.KIND_TEXT,
                                      allowed_values=sorted(design_lib.DESIGNS),
                                      required=True,     # _parse refuses a group without it (no default)
                                      description="The design every device of the group is configured with "
                                                  "(required)."),
            ])])

    def DiscoverResources(self, request, context):  # noqa: N802
        if request.resource_type and request.resource_type != VFPGA:
            return irm_pb2.DiscoverResourcesResponse()
        infos, generations = self._stamped_infos()
        return irm_pb2.DiscoverResourcesResponse(resources=[self._physical(i, generations[n]) for n, i in infos.items()])

    def _parse(self, groups: list[irm_pb2.ResourceGroup],
               violations: Violations | None = None) -> list[tuple[irm_pb2.ResourceGroup, str, int]]:
        """`violations`: problems the caller found in its request already, reported with these."""
        v = Violations() if violations is None else violations
        out = []
        v.check(len(groups) > 0, "groups", "at least one group is required")
        for i, g in enumerate(groups):
            p = f"groups[{i}]"
            v.check(bool(g.name) and len(g.name) <= 128, f"{p}.name", "required, at most 128 characters")
            v.check(g.resource_type == VFPGA, f"{p}.resource_type", f"this manager provides {VFPGA!r}")
            v.check(1 <= g.count <= 64, f"{p}.count", "between 1 and 64 virtual FPGAs")
            design = g.attributes["design"].text if "design" in g.attributes else ""
            v.check(design in design_lib.DESIGNS, f"{p}.attributes[design]",
                    f"required: one of {sorted(design_lib.DESIGNS)}")
            devices = g.attributes["devices"].number if "devices" in g.attributes else 1
            # Finite first: int(inf) raises (it read as INTERNAL).
            if not (math.isfinite(devices) and 1 <= devices <= MAX_DEVICES and devices == int(devices)):
                v.add(f"{p}.attributes[devices]", f"a whole number from 1 to {MAX_DEVICES}, got {devices:g}")
                devices = 1
            for key in g.attributes:
                v.check(key in ("design", "devices"), f"{p}.attributes[{key}]", "unknown; use design, devices")
            if g.placement:
                v.check(len(g.placement) == g.count, f"{p}.placement", "one FPGA-server per instance, or none")
                unknown = sorted(set(g.placement) - set(self.servers))
                v.check(not unknown, f"{p}.placement", f"unknown FPGA-server(s) {unknown}; this manager has "
                                                       f"{sorted(self.servers)}")
            out.append((g, design, int(devices)))
        v.raise_if_any()
        return out

    def _group_price(self, count: int, devices: int) -> float:
        """Per minute, for `count` virtual FPGAs of `devices` each: what QuotePrice quotes and Reserve charges."""
        return count * devices * self.config.price_per_device_minute

    def _price(self, parsed: list[tuple[irm_pb2.ResourceGroup, str, int]]) -> float:
        return sum(self._group_price(g.count, n) for g, _, n in parsed)

    def QuotePrice(self, request, context):  # noqa: N802
        require_tenant(request.tenant)
        parsed = self._parse(list(request.groups))
        quotes = [irm_pb2.GroupQuote(name=g.name, manager=self.config.name,
                                     price_per_minute=self._group_price(g.count, n)) for g, _, n in parsed]
        return irm_pb2.QuotePriceResponse(price_per_minute=self._price(parsed), groups=quotes)

    def _reservation(self, r: Reservation) -> irm_pb2.Reservation:
        groups = []
        for entry in r.groups:
            resources = []
            for gid in entry["groups"]:
                with self.db.read() as s:
                    g = s.get(Group, gid)
                if g is None:
                    continue
                resources.append(irm_pb2.AllocatedResource(
                    id=g.id, physical_id=",".join(sorted(g.parts)), address=self._advertised(),
                    attributes={"devices": g.size},
                    location=common_pb2.Location(site=self.config.site, rack=self.config.rack,
                                                 host=",".join(sorted(g.parts))),
                    notes=[f"design {g.design}; attach with harness.v1.FpgaOrchestrator/AttachClient"]))
            groups.append(irm_pb2.AllocatedGroup(name=entry["name"], resource_type=VFPGA, manager=self.config.name,
                                                 manager_reservation_id=r.id, resources=resources,
                                                 price_per_minute=entry.get("price", 0.0)))
        state = {"active": irm_pb2.Reservation.STATE_ACTIVE, "released": irm_pb2.Reservation.STATE_RELEASED
                 }.get(r.state, irm_pb2.Reservation.STATE_FAILED)
        return irm_pb2.Reservation(id=r.id, tenant=r.tenant, request_id=r.request_id, state=state, groups=groups,
                                   price_per_minute=r.price_per_minute, created_at=r.created_at,
                                   released_at=r.released_at)

    def _advertised(self) -> str:
        return self.config.advertise_address or self._bound

    _bound = ""

    def Reserve(self, request, context):  # noqa: N802
        tenant = require_tenant(request.tenant)
        if not request.request_id or len(request.request_id) > MAX_RESERVE_REQUEST_ID_CHARS:
            raise InvalidArgument.of("request_id", "required: a client-chosen idempotency key of "
                                                   f"1-{MAX_RESERVE_REQUEST_ID_CHARS} characters")
        v = Violations()
        cap = request.max_price_per_minute if request.HasField("max_price_per_minute") else None
        v.check(cap is None or (math.isfinite(cap) and cap >= 0), "max_price_per_minute",
                f"a finite price per minute >= 0 (or leave it unset), got {cap}")
        parsed = self._parse(list(request.groups), v)
        fingerprint = request_hash(request)
        # A retry of a request already made is answered first, whatever the servers' state (or prices) now.
        existing = self._find_reservation(tenant, request.request_id)
        if existing is not None:
            return self._replayed_reservation(existing, fingerprint)
        # What QuotePrice quotes; refused before anything is claimed, so the request_id stays unused.
        price = self._price(parsed)
        if cap is not None and price > cap + PRICE_SLACK:
            raise FailedPrecondition(
                f"price {price:.4f}/min exceeds max_price_per_minute {cap:.4f}; nothing was reserved: raise the "
                "cap, or ask for fewer or smaller virtual FPGAs (QuotePrice says what a request costs)",
                reason=OVER_PRICE, metadata={"pricePerMinute": f"{price:.4f}", "maxPricePerMinute": f"{cap:.4f}"})
        # Checked here, in this request's terms: create_group would name its own fields (max_size).
        capacity = self._free_total_capacity()
        if not capacity:
            raise Unavailable("no FPGA-server answers; nothing was reserved, retry")
        total = sum(capacity.values())
        if len(capacity) < len(self.config.servers) and any(devices > total for _, _, devices in parsed):
            # Short only of servers that do not answer now: not the request's fault.
            raise Unavailable(f"{len(capacity)} of the {len(self.config.servers)} FPGA-servers answer, with {total} "
                              "usable devices; nothing was reserved, retry once the others are back")
        v = Violations()
        for i, (g, _, devices) in enumerate(parsed):
            v.check(devices <= total, f"groups[{i}].attributes[devices]",
                    f"group {g.name!r} asks for {devices} devices per virtual FPGA; the FPGA-servers have {total} "
                    "usable devices in all")
        v.raise_if_any()
        rid = f"fres-{uuid.uuid4().hex[:16]}"
        claim = dict(id=rid, tenant=tenant, request_id=request.request_id, request_hash=fingerprint, state="pending",
                     price_per_minute=0.0, created_at=self.clock.now(), released_at=0.0, groups=[])
        try:
            # The unique (tenant, request_id) index claims the request before any device is taken.
            self.db.transact(lambda s: s.add(Reservation(**claim)))
        except IntegrityError:
            existing = self._find_reservation(tenant, request.request_id)
            if existing is None:
                raise Aborted("a reservation with this request_id is being made; retry shortly",
                              reason=RESERVATION_PENDING, retry_after_s=PENDING_RETRY_S) from None
            return self._replayed_reservation(existing, fingerprint)
        made: list[Group] = []
        entries = []
        try:
            for g, design, devices in parsed:
                ids = []
                for i in range(g.count):
                    pinned = [g.placement[i]] if g.placement else None
                    grp = self.create_group(tenant, f"{rid}/{g.name}/{i}", design, devices, min_size=devices,
                                            max_size=devices, pinned=pinned, reservation_id=rid)
                    made.append(grp)
                    ids.append(grp.id)
                entries.append({"name": g.name, "groups": ids, "price": self._group_price(g.count, devices)})
            price = sum(e["price"] for e in entries)

            def activate(s):  # type: ignore[no-untyped-def]
                row = s.get(Reservation, rid)
                row.state, row.price_per_minute, row.groups = "active", price, entries
                return row
            row = self.db.transact(activate)
        except BaseException:
            for grp in made:
                self.delete(grp)
            self.db.transact(lambda s: s.execute(delete(Reservation).where(Reservation.id == rid)))
            raise
        return self._reservation(row)

    def _replayed_reservation(self, existing: Reservation, fingerprint: str) -> irm_pb2.Reservation:
        """The reservation a request_id first made, for a retry that asks for the same (one made before requests
        were hashed is not compared)."""
        if existing.request_hash and existing.request_hash != fingerprint:
            raise reused_request_id()
        if existing.state == "pending":
            raise _pending(existing.request_id)
        return self._reservation(existing)

    def _find_reservation(self, tenant: str, request_id: str) -> Reservation | None:
        with self.db.read() as s:
            return s.scalar(select(Reservation).where(Reservation.tenant == tenant,
                                                      Reservation.request_id == request_id))

    def _get_reservation(self, tenant: str, reservation_id: str = "", request_id: str = "") -> Reservation:
        with self.db.read() as s:
            if reservation_id:
                r = s.get(Reservation, reservation_id)
            else:
                r = s.scalar(select(Reservation).where(Reservation.tenant == tenant,
                                                       Reservation.request_id == request_id))
        if r is not None and r.state == "pending" and not reservation_id:
            # By request id: "being made" -- NOT_FOUND would tell a caller in doubt (the CRS's compensator) that
            # nothing is held, while the devices of its groups are still reconfiguring. (Its id is given out by
            # no one yet: by id, it is not found.)
            raise _pending(request_id)
        if r is None or r.state == "pending":
            raise NotFound(f"reservation {reservation_id or request_id!r} does not exist")
        owned(tenant, r.tenant, f"reservation {r.id!r}")
        return r

    def GetReservation(self, request, context):  # noqa: N802
        tenant = require_tenant(request.tenant)
        return self._reservation(self._get_reservation(tenant, request.reservation_id, request.request_id))

    def ListReservations(self, request, context):  # noqa: N802
        tenant = require_tenant(request.tenant)
        with self.db.read() as s:
            q = select(Reservation).where(Reservation.tenant == tenant, Reservation.state != "pending")
            if not request.include_released:
                q = q.where(Reservation.state == "active")
            rows, token = paging.page(s, q, [Reservation.created_at, Reservation.id], request.page_size,
                                      request.page_token)
        return irm_pb2.ListReservationsResponse(reservations=[self._reservation(r) for r in rows],
                                                next_page_token=token)

    def ReleaseReservation(self, request, context):  # noqa: N802
        tenant = require_tenant(request.tenant)
        r = self._get_reservation(tenant, request.reservation_id)
        if r.state == "active":
            for entry in r.groups:
                for gid in entry["groups"]:
                    with self.db.read() as s:
                        g = s.get(Group, gid)
                    if g is not None and not g.deleted:
                        self.delete(g)

            def mark(s):  # type: ignore[no-untyped-def]
                row = s.get(Reservation, r.id)
                row.state, row.released_at = "released", self.clock.now()
                return row
            r = self.db.transact(mark)
        return self._reservation(r)

    def GetMetrics(self, request, context):  # noqa: N802
        tenant = require_tenant(request.tenant)
        r = self._get_reservation(tenant, request.reservation_id)
        ids = {gid for e in r.groups for gid in e["groups"]}
        now = self.clock.now()
        series = []
        for name, m in self.ask_all(self.servers, "GetMeasurements", fpga_pb2.GetMeasurementsRequest()).items():
            if isinstance(m, grpc.RpcError):
                continue
            for g in m.groups:  # type: ignore[attr-defined]
                if g.group_id in ids:
                    for metric, value in (("completed", g.completed), ("queued", g.queued),
                                          ("busy_device_s", g.busy_device_s)):
                        series.append(common_pb2.Series(name=metric, resource_id=f"{g.group_id}@{name}",
                                                        samples=[common_pb2.Sample(time=now, value=value)]))
        return irm_pb2.GetMetricsResponse(series=series)

    def WatchCapacity(self, request, context):  # noqa: N802
        # Its caps: a tenant's, or the control plane's for a caller with the control token (services.control).
        who = control.watch_tenant(request.tenant, self.config.control_token, context)

        def snapshot():
            if request.resource_type in ("", VFPGA):
                infos, generations = self._stamped_infos()
                for name, info in infos.items():
                    yield irm_pb2.CapacityEvent(kind=irm_pb2.CapacityEvent.KIND_SNAPSHOT,
                                                resource=self._physical(info, generations[name]))
            yield irm_pb2.CapacityEvent(kind=irm_pb2.CapacityEvent.KIND_SNAPSHOT_END)

        yield from self.watchers.stream(snapshot, context.is_active, who)

    # -- background rounds -----------------------------------------------
    def _every(self, interval_s: float, round_: Callable[[], object], what: str) -> None:
        while not self._stop.wait(interval_s):
            try:
                round_()
            except Exception:  # noqa: BLE001 - the loop must survive a bad round
                log.exception("%s round failed", what)

    def _reconcile_loop(self) -> None:
        self._every(self.config.reconcile_interval_s, self.reconcile_once, "reconcile")

    def reconcile_once(self) -> dict[str, int]:
        """Make every reachable FPGA-server hold what the database says; returns the parts (re)made and dropped.

        A server that restarted comes back empty: the live groups' parts there are made again and their clients
        attached again. A resize or creation cut short (a server that failed mid-way, an Orchestrator that died)
        left parts of other sizes than recorded, or parts the group's row does not have: they are set to the
        recorded size ("made" counts them) or dropped. A delete that could not reach a server left its part
        running (its clients served, its devices held): it is dropped now. Servers that did not answer at start
        are mapped once they do. Under the lock: no group is being made, resized or deleted meanwhile.
        """
        self._discover_servers()
        infos = self._server_infos()      # asked before the lock: a silent server must not stall placements
        with self.lock:
            out = self._reconcile(infos)
        if out["made"] or out["dropped"]:
            self._publish()
        return out

    def _reconcile(self, infos: dict[str, fpga_pb2.ServerInfo]) -> dict[str, int]:
        """`reconcile_once` on servers already asked (under the lock: also before every placement)."""
        made = dropped = 0
        with self.lock:
            with self.db.read() as s:
                live = {g.id: g for g in s.scalars(select(Group).where(Group.deleted.is_(False)))}
                clients = list(s.scalars(select(Client).where(Client.state == "attached")))
                # Being attached: its call puts it on the servers before the row says attached (and takes it back
                # if it fails); the rounds leave it alone.
                attaching = set(s.scalars(select(Client.id).where(Client.state == ATTACHING)))
                # Detached: the server drains them (their queued and running tasks end, then they go); revoking
                # would cancel that work.
                detached = set(s.scalars(select(Client.id).where(Client.state == "detached")))
            for name, info in infos.items():
                h = self.servers[name]
                held = {p.group_id: p.target for p in info.groups}
                on_part = {p.group_id: set(p.clients) for p in info.groups}
                try:
                    # Gone from the database, or never recorded on this server (every part is recorded before
                    # a server makes it, and under this lock: nothing here is on its way to being recorded).
                    for gid in sorted(gid for gid in held if gid not in live or name not in (live[gid].parts or {})):
                        h.stub().DeleteGroupPart(fpga_pb2.DeleteGroupPartRequest(group_id=gid),
                                                 timeout=self.config.server_timeout_s)
                        dropped += 1
                    for gid, g in live.items():
                        if name not in (g.parts or {}):
                            continue
                        n = g.parts[name]        # 0 too: the part must exist for the group to grow there again
                        if gid in held:
                            if held[gid] != n:
                                hand_back = n == 0 and any(m > 0 for k, m in g.parts.items() if k != name)
                                h.stub().ResizeGroupPart(fpga_pb2.ResizeGroupPartRequest(
                                    group_id=gid, size=n, hand_back=hand_back), timeout=self.config.server_timeout_s)
                                made += 1
                            # The part's clients as the database has them: one an attach left off while this
                            # server was silent is put on; one revoked or detached while it was is taken off.
                            want = {c.id: c for c in clients if c.group_id == gid}
                            for cid in sorted(set(want) - on_part[gid]):
                                h.stub().AttachClient(fpga_pb2.ServerAttachRequest(group_id=gid, client_id=cid,
                                                                                   token=want[cid].token),
                                                      timeout=self.config.server_timeout_s)
                                made += 1
                            for cid in sorted(on_part[gid] - set(want) - attaching):
                                if cid in detached:     # idempotent; not a change (listed until it has drained)
                                    h.stub().DetachClient(fpga_pb2.ServerClientRequest(client_id=cid),
                                                          timeout=self.config.server_timeout_s)
                                    continue
                                h.stub().RevokeClient(fpga_pb2.ServerClientRequest(client_id=cid),
                                                      timeout=self.config.server_timeout_s)
                                dropped += 1
                            continue
                        h.stub().CreateGroupPart(fpga_pb2.CreateGroupPartRequest(group_id=gid, design=g.design,
                                                                                 size=n),
                                                 timeout=self.config.server_timeout_s)
                        for c in clients:
                            if c.group_id == gid:
                                h.stub().AttachClient(fpga_pb2.ServerAttachRequest(group_id=gid, client_id=c.id,
                                                                                   token=c.token),
                                                      timeout=self.config.server_timeout_s)
                        made += 1
                except grpc.RpcError as e:
                    log.warning("could not reconcile an FPGA-server", extra={"server": name, "code": e.code().name})
        if made or dropped:
            log.warning("FPGA-servers reconciled with the database", extra={"made": made, "dropped": dropped})
        return {"made": made, "dropped": dropped}

    def _autoscale_loop(self) -> None:
        self._every(self.config.autoscaler_interval_s, self.autoscale_once, "autoscaler")

    def autoscale_once(self) -> dict[str, int]:
        """One autoscaler round: per server, the policy resizes the elastic groups living there.

        The policy sees the server's groups with their limits: an elastic group
        that lives on this server alone keeps its own min/max; every other group
        (static, or spread over servers) is pinned to its size for the policy.
        """
        if self.config.autoscaler == "none":
            return {}
        with self.db.read() as s:
            groups = {g.id: g for g in s.scalars(select(Group).where(Group.deleted.is_(False)))}
        decided: dict[str, int] = {}
        where: dict[str, str] = {}          # group -> the server whose policy decided it
        servers = self.servers
        for name, m in self.ask_all(servers, "GetMeasurements", fpga_pb2.GetMeasurementsRequest()).items():
            if isinstance(m, grpc.RpcError):
                continue
            try:
                scaler = self._scalers.get(name) or self._scalers.setdefault(name, self._new_scaler(servers[name]))
            except grpc.RpcError:
                continue
            for gid, size in scaler.step(self._engine_view(m, groups)).items():  # type: ignore[arg-type]
                decided[gid] = size
                where[gid] = name
        # Shrinks first: a policy that moves a device from one group to another on a server means the device
        # the shrink frees; and a grow stays on that server (it would otherwise spread the group elsewhere).
        changes = [(gid, size) for gid, size in decided.items()
                   if (g := groups.get(gid)) is not None and g.elastic and size != g.size]
        for gid, size in sorted(changes, key=lambda c: c[1] - groups[c[0]].size):
            g = groups[gid]
            try:
                self.resize(g, max(g.min_size, min(g.max_size, size)), pinned=[where[gid]])
            except HarnessError as e:
                log.info("autoscaler resize refused", extra={"group": gid, "reason": str(e)})
        return decided

    def _new_scaler(self, h: ServerHandle) -> autoscaler.Autoscaler:
        """A policy that knows what a reconfiguration costs on this server (when it weighs that)."""
        info = h.stub().GetServer(fpga_pb2.GetServerRequest(), timeout=self.config.server_timeout_s)
        try:
            return autoscaler.Autoscaler(self.config.autoscaler, reconfig_s=info.reconfiguration_s)
        except ValueError:
            return autoscaler.Autoscaler(self.config.autoscaler)

    @staticmethod
    def _engine_view(m: fpga_pb2.ServerMeasurements, groups: dict[str, Group]) -> eng.ServerMeasurements:
        out = []
        for c in m.groups:
            g = groups.get(c.group_id)
            movable = g is not None and g.elastic and len([n for n in g.parts.values() if n]) <= 1
            lo, hi = (g.min_size, g.max_size) if movable else (c.target, c.target)  # type: ignore[union-attr]
            out.append(eng.GroupMeasurement(
                c.group_id, c.design, c.active, c.target, c.joining, c.draining, min(lo, c.target),
                max(hi, c.target), c.completed, c.busy_device_s, c.waiting, c.running,
                tuple(eng.ClientMeasurement(k.client_id, k.completed, k.waiting, k.running) for k in c.clients),
                c.failed, c.incarnation))
        return eng.ServerMeasurements(m.time, m.devices, m.usable_devices, m.reconfigurations,
                                      m.reconfiguration_failures, tuple(out))


def component(config: OrchestratorConfig, clock: Clock | None = None) -> Component:
    from irm_fpga.jobs import job_component_parts

    # A service (`harness serve fpga`) checks what `harness serve` does, whoever built its config: no FPGA-server
    # at all (`servers` empty) is refused, not an IRM without a device to offer. (An Orchestrator alone, without
    # servers, is a test's.)
    check_settings(config, "orchestrator")
    auth = tenants.auth(config.tenants_file, "fpga", delegation_sha256=config.delegation_sha256)
    orch = Orchestrator(config, clock)
    jobs_register, jobs_services, jobs_start, jobs_stop = job_component_parts(orch, config)

    def register(server: grpc.Server) -> None:
        fpga_pb2_grpc.add_FpgaOrchestratorServicer_to_server(orch, server)
        irm_pb2_grpc.add_ResourceManagerServicer_to_server(orch, server)
        jobs_register(server)

    def quiesce() -> None:
        jobs_register.manager.quiesce()     # type: ignore[attr-defined]
        orch.quiesce()

    def stop() -> None:
        jobs_stop()
        orch.stop()

    comp = Component(name=f"fpga:{config.name}", register=register,
                     service_names=["harness.v1.FpgaOrchestrator", "harness.v1.ResourceManager", *jobs_services],
                     quiesce=quiesce, stop=stop, probe=orch.db.probe, extra={"orchestrator": orch}, auth=auth)

    def start() -> None:
        host = config.address.rsplit(":", 1)[0]
        orch._bound = f"{host}:{comp.extra['port']}"
        orch.start(comp.extra["port"])
        jobs_start()

    comp.start = start
    return comp
