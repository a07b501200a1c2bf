"""The Orchestrator: FPGA groups over one or more emulated FPGA-servers (thesis §3.2, §5.2).

It keeps reservation state in the database and tells servers to create,
resize and delete group parts; a group may span several servers (the thesis
left this "under development"): the client library spreads tasks over the
parts. It is never on the data path, so groups keep serving while it is down;
a restarted Orchestrator re-asserts its groups and attachments on the servers.

It also implements the IRM API (resource type "vfpga") so the CRS reserves
virtual FPGAs like any other resource, and runs the autoscaler for elastic
groups.

This module holds the groups and their placement over the servers, and the
FpgaOrchestrator API; its other parts, each composed here: the client calls
(irm_fpga.orchestrator_clients), the IRM API (orchestrator_irm), the reconcile
and autoscaler rounds (orchestrator_rounds), server handles and capacity
generations (orchestrator_servers), its settings (orchestrator_config).
"""

from __future__ import annotations

import logging
import math
import threading
import time
import uuid
from collections.abc import Collection, Iterable
from pathlib import Path

import grpc
from sqlalchemy import select

from harness.v1 import fpga_pb2, fpga_pb2_grpc, irm_pb2, irm_pb2_grpc
from irm_fpga import designs as design_lib
from irm_fpga.fan_out import ask_servers
from irm_fpga.job_models import JOB_GROUP_PREFIX, FpgaJob
from irm_fpga.models import Client, Group, Reservation
from irm_fpga.orchestrator_clients import ClientAttachments
from irm_fpga.orchestrator_config import OrchestratorConfig
from irm_fpga.orchestrator_errors import check_id, rpc_error
from irm_fpga.orchestrator_irm import VfpgaReservations
from irm_fpga.orchestrator_rounds import Rounds
from irm_fpga.orchestrator_servers import VFPGA, ServerGenerations, ServerHandle, physical, usable_devices
from irm_fpga.server_breaker import ServerNotAnswering
from irm_fpga.wire import choices
from services import client as rpc
from services import paging, tenants
from services.clock import Clock, WallClock
from services.config import check_seconds, check_settings
from services.db import Database, default_url
from services.errors import (
    CAPACITY_IN_USE,
    CREDENTIALS_REFUSED,
    MANAGER_UNAVAILABLE,
    RETRY_LATER_S,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    ResourceExhausted,
    Unavailable,
    Violations,
    owned,
    require_tenant,
)
from services.idempotency import request_hash, request_id_problem, reused_request_id
from services.registration import Membership
from services.server import Component
from services.watch import CAPACITY_TENANT_FULL, CAPACITY_WATCHES_PER_TENANT, Broadcaster

log = logging.getLogger(__name__)
MIGRATIONS = Path(__file__).parent / "migrations"
# Each WatchCapacity stream holds one of the server's 32 worker threads for as long as it is open; this component
# shares them with FpgaJobs (whose WatchJobs takes up to jobs.MAX_WATCHES = 16) and every unary call.
MAX_WATCHES = 8
SILENT_RETRY_S = 15.0  # an unmapped server that timed out or refused the token: tried again after this
MAX_GROUP_REQUEST_ID_CHARS = 256    # CreateGroup's request_id (fpga_groups.request_id is String(256))


def _offered(info: fpga_pb2.ServerInfo) -> tuple[int, int, tuple[str, ...]]:
    """What watchers see of a server (orchestrator_servers.physical): usable devices, devices held, designs."""
    return usable_devices(info), sum(g.target for g in info.groups), tuple(info.designs)



class CountingLock:
    """A re-entrant lock that counts how often it was taken (`taken`): a reader of the servers' state outside it
    (the reconcile rounds, which must not stall placements on a silent server) tells by the count whether a
    decision came between its read and its taking the lock, and so whether what it read is still what the
    database says."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self.taken = 0

    def __enter__(self) -> CountingLock:
        self._lock.acquire()
        self.taken += 1
        return self

    def __exit__(self, *exc: object) -> None:
        self._lock.release()

class Orchestrator(fpga_pb2_grpc.FpgaOrchestratorServicer, irm_pb2_grpc.ResourceManagerServicer):
    """FPGA groups over the FPGA-servers, and the FPGA IRM's APIs. Its parts: `clients` (attach, detach, revoke),
    `irm` (vFPGA reservations), `rounds` (reconcile and autoscaler rounds). Methods left here that only pass a call
    on to a part (`_attach`, `_find_reservation`, `reconcile_once`, `autoscale_once`, `_reassert`) are for callers
    from outside: the parts call each other directly, so a stand-in for one of them goes on the part."""

    def __init__(self, config: OrchestratorConfig, clock: Clock | None = None) -> None:
        self.config = config
        self.clock = clock or WallClock()
        # Capacity events' generations, one per server state first seen (irm_fpga.orchestrator_servers).
        self.generations = ServerGenerations(self.clock)
        # Its seconds as `harness serve` checks them: an autoscaler_interval_s of 0 spun its loop (a core burnt,
        # SIGTERM waiting behind it), a server_timeout_s of 0 failed every call to the servers at once; the
        # backoffs and reconcile_interval_s may be 0 (documented: no breaker, no reconcile rounds).
        check_seconds(config, "orchestrator")
        price = config.price_per_device_minute
        if not (isinstance(price, int | float) and math.isfinite(price) and price >= 0):
            # A negative price passes any max_price_per_minute, and the CRS sums it into others' prices.
            raise ValueError(f"orchestrator configuration: price_per_device_minute {price!r}: expected a finite "
                             "price per minute >= 0")
        self.db = Database(config.database or default_url(config.state_dir, f"fpga-{config.name}"))
        self.db.migrate(MIGRATIONS, "alembic_version_fpga")
        self.servers: dict[str, ServerHandle] = {}
        self._silent_until: dict[str, float] = {}      # address -> monotonic time of its next discovery try
        # Servers (by name; by address if never mapped) whose last answer refused our control token: a placement
        # short of their devices says so (CREDENTIALS_REFUSED), not "did not answer; retry".
        self.refusing_token: set[str] = set()
        self._published: dict[str, tuple[int, int, tuple[str, ...]]] = {}   # server -> `_offered`, last published
        self.lock = CountingLock()  # placement decisions over servers are serialised
        self.watchers: Broadcaster[irm_pb2.CapacityEvent] = Broadcaster(   # WatchCapacity streams
            max_streams=MAX_WATCHES, full="WatchCapacity streams are open on this FPGA IRM; close one, or poll "
                                          "DiscoverResources",
            per_tenant=CAPACITY_WATCHES_PER_TENANT, tenant_full=CAPACITY_TENANT_FULL)
        self.memberships: list[Membership] = []
        # The FpgaOrchestrator API's client calls, the IRM API, and the background rounds: each its own module
        # (irm_fpga.orchestrator_clients, _irm, _rounds), reaching back here for groups, servers and the lock.
        self.clients = ClientAttachments(self)
        self.irm = VfpgaReservations(self)
        self.rounds = Rounds(self)      # checks the autoscaler policy: an unknown name fails at start-up

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
        self.rounds.start()

    def quiesce(self) -> None:
        """Shutting down, before the server stops: leave the CRS and end the WatchCapacity streams."""
        for m in self.memberships:
            m.stop()
        self.watchers.close()

    def stop(self) -> None:
        """After the server's calls have finished: stop the background work, close the database."""
        self.rounds.stop()
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
                    self.refusing_token.add(address)
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
            self.refusing_token.discard(address)
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
        """After a restart: make every server hold what the database says (irm_fpga.orchestrator_rounds)."""
        self.rounds.reassert()

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
                self.refusing_token.add(name)
                log.warning("FPGA-server refused our control token: set control_token to the same secret on the "
                            "Orchestrator and the FPGA-server (HARNESS_CONTROL_TOKEN in compose)",
                            extra={"server": name, "code": reply.code().name})
            elif isinstance(reply, grpc.RpcError):
                log.warning("FPGA-server unreachable", extra={"server": name, "code": reply.code().name})
            else:
                self.refusing_token.discard(name)
                out[name], generations[name] = self._newest(name, reply)     # type: ignore[arg-type]
        return out, generations

    def _last_known_infos(self) -> dict[str, fpga_pb2.ServerInfo]:
        """Each mapped server's newest state seen, asked of no server unless one has not been seen yet (a quote's
        view: what the reconcile rounds and placements last read)."""
        known = self.generations.known()
        if any(name not in known for name in self.servers) or not known:
            return self._server_infos()
        return {name: known[name] for name in self.servers}

    def _newest(self, server: str, info: fpga_pb2.ServerInfo) -> tuple[fpga_pb2.ServerInfo, int]:
        """`info` stamped with its generation, or the newest state of `server` seen (ServerGenerations.newest)."""
        return self.generations.newest(server, info)

    def ask_all(self, handles: dict[str, ServerHandle], method: str, request: object) -> dict[str, object]:
        """`ask_servers` with this Orchestrator's server timeout."""
        return ask_servers(handles, method, request, self.config.server_timeout_s)

    @staticmethod
    def _free(info: fpga_pb2.ServerInfo, recorded: int = 0) -> int:
        """Devices free on a server: what it reports held, or what the database gives it if more (a server
        that restarted reports nothing until it is reconciled: its devices must not be sold twice meanwhile)."""
        return usable_devices(info) - max(sum(g.target for g in info.groups), recorded)

    def _recorded(self) -> dict[str, int]:
        """Devices the live groups hold per server, by the database."""
        out: dict[str, int] = {}
        with self.db.read() as s:
            for g in s.scalars(select(Group).where(Group.deleted.is_(False))):
                for name, n in (g.parts or {}).items():
                    out[name] = out.get(name, 0) + n
        return out

    def _spread(self, size: int, current: dict[str, int], pinned: list[str] | None = None,
                silent: set[str] | None = None, evict: Iterable[str] = (),
                only: Collection[str] | None = None) -> dict[str, int]:
        """Devices per server for a group of `size`: keep what it has, grow where room is, shrink the largest.

        A shrink cuts the parts on servers that do not answer first (nothing is served there; the caller records
        them cut without a call, and the reconcile rounds set those servers' parts once they answer). `only`: the
        servers a new group may grow onto (those with its traits), unless `pinned` names them. `silent`, if
        given, gets the servers of `current` that did not answer. `evict`: servers the caller has given up on
        (the job manager's, silent past jobs_silent_server_s); those of them that still do not answer lose their
        parts whatever the size, and the group is made `size` on the others, in one step: cutting to the live
        devices first and growing after would go through a size the group's min_size may refuse, and a shrink
        from the recorded size leaves part of the group on the dead server."""
        infos = self._server_infos()
        # First make them hold what the database says: a restarted server's parts back, stale ones gone.
        changed = self.rounds.reconcile(infos)
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
            elif only is not None:
                order = [n for n in order if n in only]
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
                                            f"free there{'' if order else ' (not reachable)'}; place again",
                                            reason=CAPACITY_IN_USE, retry_after_s=RETRY_LATER_S)
                if only is not None:
                    free = sum(max(0, free_of[n]) for n in order)
                    raise ResourceExhausted(f"{size - total} more device(s) needed; {free} free on the {len(order)} "
                                            "reachable FPGA-server(s) with the group's traits; retry later",
                                            reason=CAPACITY_IN_USE, retry_after_s=RETRY_LATER_S)
                free = sum(max(0, f) for f in free_of.values())
                raise ResourceExhausted(f"{size - total} more device(s) needed; {free} free on "
                                        f"{len(infos)} reachable FPGA-server(s); retry later",
                                        reason=CAPACITY_IN_USE, retry_after_s=RETRY_LATER_S)
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
                    raise rpc_error(name, e) from None
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
        self._published = {**self._published, **{n: _offered(i) for n, i in infos.items()}}
        self.watchers.publish(irm_pb2.CapacityEvent(kind=irm_pb2.CapacityEvent.KIND_UPDATED,
                                                    resource=physical(i, generations[n], self.config))
                              for n, i in infos.items())

    def _offered_changed(self, infos: dict[str, fpga_pb2.ServerInfo]) -> bool:
        """Whether a server answering now offers other than was last published: one mapped since (down when the
        Orchestrator started), or one whose usable devices, use or designs changed by no call of this Orchestrator
        (a device blacklisted, a restart). Watchers (the CRS) see only what is published."""
        return any(self._published.get(n) != _offered(i) for n, i in infos.items())

    # -- groups ----------------------------------------------------------
    def _serving(self, groups: list[Group]) -> dict[str, int]:
        """Devices serving each of `groups` now, as its servers report them (a device reconfiguring, or
        blacklisted, does not count); a part on a server that does not answer counts as recorded."""
        holding = {n for g in groups if not g.deleted for n, size in (g.parts or {}).items() if size}
        answers = self.ask_all({n: h for n, h in self.servers.items() if n in holding}, "GetServer",
                               fpga_pb2.GetServerRequest()) if holding else {}
        infos = {n: i for n, i in answers.items() if isinstance(i, fpga_pb2.ServerInfo)}
        out = {}
        for g in groups:
            n = 0
            for name, size in (g.parts or {}).items() if not g.deleted else ():
                info = infos.get(name)
                n += size if info is None else next((p.active for p in info.groups if p.group_id == g.id), 0)
            out[g.id] = n
        return out

    def _to_proto(self, g: Group, clients: list[str] | None = None, serving: int | None = None) -> fpga_pb2.FpgaGroup:
        """`g` as the API shows it; `clients`: its attached clients, `serving` its devices serving now
        (`_serving`), when already read (else read here)."""
        if clients is None:
            clients = self._attached([g.id]).get(g.id, [])
        if serving is None:
            serving = self._serving([g])[g.id]
        return fpga_pb2.FpgaGroup(
            id=g.id, tenant=g.tenant, design=g.design, size=g.size, min_size=g.min_size, max_size=g.max_size,
            sharing=fpga_pb2.FpgaGroup.SHARING_SHARED if g.shared else fpga_pb2.FpgaGroup.SHARING_PRIVATE,
            scaling=fpga_pb2.FpgaGroup.SCALING_ELASTIC if g.elastic else fpga_pb2.FpgaGroup.SCALING_STATIC,
            parts={k: v for k, v in g.parts.items() if v}, active=serving, clients=clients,
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
        check_id("group_id", group_id)
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
            refusing = sorted(self.refusing_token - set(answering))
            if refusing:
                # Not a moment's silence: the operators' tokens differ, and no retry helps until they agree.
                raise Unavailable(f"{len(refusing)} of {len(self.config.servers)} FPGA-servers ({', '.join(refusing)}) "
                                  f"refuse this Orchestrator's control token: their devices cannot be used "
                                  f"({total} usable on the others); the operator must give the Orchestrator and the "
                                  "FPGA-servers the same control_token", reason=CREDENTIALS_REFUSED)
            raise Unavailable(f"{silent} of {len(self.config.servers)} FPGA-servers did not answer: their devices "
                              f"are unknown now ({total} usable on the others); retry", reason=MANAGER_UNAVAILABLE,
                              retry_after_s=self.config.server_backoff_s or 1.0)
        mx = max_size or total
        if not max_size:
            v.check(size <= total, f"{prefix}size", f"the FPGA-servers have {total} usable devices in all")
        v.check(mx <= total, f"{prefix}max_size", f"the FPGA-servers have {total} usable devices in all")
        return mn, mx

    def _free_total_capacity(self) -> dict[str, int]:
        return {n: usable_devices(i) for n, i in self._server_infos().items()}

    def create_group(self, tenant: str, request_id: str, design: str, size: int, min_size: int = 0,
                     max_size: int = 0, shared: bool = False, elastic: bool = False,
                     pinned: list[str] | None = None, reservation_id: str = "",
                     violations: Violations | None = None, fingerprint: str = "",
                     only: Collection[str] | None = None) -> Group:
        """`violations`: problems the caller found in its request already, reported with these. `fingerprint`:
        the request's hash (services.idempotency) when a tenant asked (CreateGroup); a group made under the same
        request_id for another request is not its replay: INVALID_ARGUMENT. `only`: the servers it may be made on
        (`_spread`)."""
        v = Violations() if violations is None else violations
        if (why := request_id_problem(request_id, MAX_GROUP_REQUEST_ID_CHARS)) is not None:
            v.add("request_id", why)
        mn, mx = self._validate_group(design, size, min_size, max_size, v)
        v.raise_if_any()
        with self.lock:  # check-then-create as one step: a concurrent retry finds the first group
            with self.db.read() as s:
                existing = s.scalar(select(Group).where(Group.tenant == tenant, Group.request_id == request_id))
            if existing is not None:
                return self._replayed_group(existing, fingerprint)
            parts = self._spread(size, {}, pinned, only=only)
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
        serving = self._serving(rows)                       # one round of the servers for the page
        return fpga_pb2.ListGroupsResponse(groups=[self._to_proto(g, clients.get(g.id, []), serving[g.id])
                                                   for g in rows], next_page_token=token)

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
        check_id("group_id", request.group_id)
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

    # Clients: irm_fpga.orchestrator_clients.
    def AttachClient(self, request, context):  # noqa: N802
        return self.clients.AttachClient(request, context)

    def _attach(self, tenant: str, g: Group, client_id: str) -> fpga_pb2.Attachment:
        """AttachClient's attach, once it is this client id's turn (`ClientAttachments.attach`)."""
        return self.clients.attach(tenant, g, client_id)

    def DetachClient(self, request, context):  # noqa: N802
        return self.clients.DetachClient(request, context)

    def RevokeClient(self, request, context):  # noqa: N802
        return self.clients.RevokeClient(request, context)

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

    # -- IRM API (resource type "vfpga"): irm_fpga.orchestrator_irm -----
    def DescribeAllocationSpec(self, request, context):  # noqa: N802
        return self.irm.DescribeAllocationSpec(request, context)

    def DiscoverResources(self, request, context):  # noqa: N802
        return self.irm.DiscoverResources(request, context)

    def QuotePrice(self, request, context):  # noqa: N802
        return self.irm.QuotePrice(request, context)

    _bound = ""     # the address this service listens on (set by `component`), advertised if none is set

    def Reserve(self, request, context):  # noqa: N802
        return self.irm.Reserve(request, context)

    def _find_reservation(self, tenant: str, request_id: str) -> Reservation | None:
        return self.irm.find_reservation(tenant, request_id)

    def GetReservation(self, request, context):  # noqa: N802
        return self.irm.GetReservation(request, context)

    def ListReservations(self, request, context):  # noqa: N802
        return self.irm.ListReservations(request, context)

    def ReleaseReservation(self, request, context):  # noqa: N802
        return self.irm.ReleaseReservation(request, context)

    def GetMetrics(self, request, context):  # noqa: N802
        return self.irm.GetMetrics(request, context)

    def WatchCapacity(self, request, context):  # noqa: N802
        return self.irm.WatchCapacity(request, context)

    # -- background rounds: irm_fpga.orchestrator_rounds ----------------
    def reconcile_once(self) -> dict[str, int]:
        """Make every reachable FPGA-server hold what the database says (`Rounds.reconcile_once`)."""
        return self.rounds.reconcile_once()

    def autoscale_once(self) -> dict[str, int]:
        """One autoscaler round (`Rounds.autoscale_once`)."""
        return self.rounds.autoscale_once()


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
        jobs_register.check()      # type: ignore[attr-defined]   # a policy refused before the CRS hears of it
        orch.start(comp.extra["port"])
        jobs_start()

    comp.start = start
    return comp
