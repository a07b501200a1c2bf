"""The Application Manager service (harness.v1.ApplicationManager; thesis ch. 4, §5.3).

Controller (submit: manifest + SLO validated, search space built against the resource
types the CRS offers), Profiler (a session thread drives a pure profiler through
application_manager.runner on the `local` back-end), performance model (runs, Pareto
frontier and extrapolation in the database, so it survives restarts), Configuration
Designer (selection under the SLO) and Execution Manager (the chosen configuration run for
real; predicted vs measured recorded, and the measurement joins the model: online
profiling, §4.3.5).

This module holds the servicer (ApplicationManager: loading, request ids, applications, the model, the sweeps and
heartbeat), its configuration and its component. Profiling sessions are in application_manager.sessions and
executions in application_manager.execution (mixins of the servicer), the releases kept at the CRS in
application_manager.releases (a part it composes), the messages in application_manager.messages, the bounds in
application_manager.limits and the parsed application in application_manager.loaded.
"""

from __future__ import annotations

import json
import logging
import math
import sys
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import grpc
from sqlalchemy import func
from sqlalchemy import select as sql_select
from sqlalchemy import update as sql_update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session as DbSession

from application_manager import models as m
from application_manager import owners
from application_manager.execution import PREDICTED_MARGIN as PREDICTED_MARGIN  # re-exported
from application_manager.execution import Executions
from application_manager.limits import MAX_ERROR_CHARS as MAX_ERROR_CHARS  # re-exported
from application_manager.limits import MAX_MANIFEST_BYTES, MAX_RUN_TIMEOUT_S, MAX_SLO_BYTES
from application_manager.limits import MAX_RUNS as MAX_RUNS  # re-exported
from application_manager.limits import bounded_error as bounded_error  # re-exported
from application_manager.loaded import Loaded, StaleApplication
from application_manager.local import LocalBackend
from application_manager.manifest import Manifest, parse_manifest
from application_manager.messages import application_pb, config_pb, run_pb, session_pb
from application_manager.model import Point, pareto
from application_manager.profilers import PRODUCTION, Observation
from application_manager.profilers import PROFILERS as PROFILERS  # re-exported
from application_manager.releases import IN_DOUBT_KEPT_S as IN_DOUBT_KEPT_S  # re-exported
from application_manager.releases import RELEASE_BACKOFF_MAX_S as RELEASE_BACKOFF_MAX_S  # re-exported
from application_manager.releases import Releases
from application_manager.releases import reservation_request_id as reservation_request_id  # re-exported
from application_manager.sessions import STOP_ANSWER_S as STOP_ANSWER_S  # re-exported
from application_manager.sessions import STOPPED_RUN as STOPPED_RUN  # re-exported
from application_manager.sessions import STOPPING as STOPPING  # re-exported
from application_manager.sessions import ProfilingSessions, SessionRunner
from application_manager.slo import Slo, parse_slo
from application_manager.space import Limits, Space, from_manifest
from harness.v1 import application_manager_pb2 as pb
from harness.v1 import application_manager_pb2_grpc as pb_grpc
from harness.v1 import irm_pb2, irm_pb2_grpc
from services import client, paging, tenants
from services.clock import Clock, WallClock
from services.db import Database, default_url
from services.errors import (
    RETRY_LATER_S,
    STREAM_CAP,
    InvalidArgument,
    NotFound,
    ResourceExhausted,
    Unavailable,
    Violations,
    owned,
    require_tenant,
)
from services.errors import FailedPrecondition as FailedPrecondition  # re-exported
from services.idempotency import reused_request_id
from services.server import CallCap, Component
from services.tls import TlsSettings

# Names this module held (or imported) before they moved to the modules named for them -- limits, loaded, messages,
# releases, sessions, execution -- are still reached through it (by tests and tools): those imported above as
# themselves ("re-exported").
log = logging.getLogger(__name__)
T = TypeVar("T")
MIGRATIONS = Path(__file__).parent / "migrations"
# The runs GetModel returns: the most recent ones (PerformanceModel.runs_left_out counts the rest).
MAX_MODEL_RUNS = 1000
# The sessions GetModel lists, the most recent: a model profiled again and again (a session a day for years)
# would otherwise outgrow what a client receives, as every run would.
MAX_MODEL_SESSIONS = 200
# Applications kept parsed (manifest, SLO, search space, prices), most recently used first out of the way: a
# space may hold up to space.MAX_CONFIGURATIONS configurations, so keeping every one ever loaded grows for good.
# One evicted is parsed again from the database when next asked for. Bounded by count and by configurations
# (the largest space costs ~75 MB in memory): the one just loaded always stays.
MAX_LOADED = 32
MAX_LOADED_CONFIGURATIONS = 1_000_000
# ListApplications stops filling a page at this many bytes of applications (and returns next_page_token): 100
# (the default page) of the largest would be ~32 MiB, where a client receives 4 MiB by default.
MAX_LIST_BYTES = 3 * 1024 * 1024
# The most max_long_calls may be: each is a gRPC worker thread (and a run's threads) held for as long as it lasts.
MAX_LONG_CALLS = 4096
# gRPC worker threads beyond the long calls (max_long_calls): StopProfiling, GetModel, the listings and health
# checks always find one free, however many runs are in progress (irm_compute.agent sizes its pool the same way).
CONTROL_WORKERS = 16
# How long stopping the service waits for cancelled sessions and executions to release their reservations.
SHUTDOWN_WAIT_S = 30.0


@dataclass
class AppManagerConfig(TlsSettings):
    address: str = "127.0.0.1:50101"      # the suite's am port (services.suite.DEFAULT_PORTS)
    # SQLAlchemy URL; empty: a SQLite file in state_dir.
    database: str = ""
    state_dir: str = "~/.harness"
    # The CRS that reserves configurations (and quotes their prices).
    crs_address: str = "127.0.0.1:50051"
    # Execution back-end: "local" (real runs through the CRS and the agents).
    backend: str = "local"
    # Interpreter that `%python` stands for in manifests; empty: the one running this service.
    python: str = ""
    # A profiling or execution run is killed after this many seconds unless the request says otherwise.
    run_timeout_s: float = 600.0
    # How often this process marks the sessions and executions it runs as alive. Other AM processes on the same
    # database take them as interrupted once their owner is gone: at once on this host, else after 3 of these.
    heartbeat_s: float = 5.0
    # ExecuteApplication calls and StartProfiling streams in progress at once; one more is RESOURCE_EXHAUSTED.
    # Each holds a gRPC worker thread for as long as its run or session lasts (up to days): the server gets this
    # many plus CONTROL_WORKERS, so that the short calls never queue behind them.
    max_long_calls: int = 64
    # How long the CRS's quotes of an application's configurations are kept before the next session or online
    # exploration asks for them again: a configuration the CRS refused for good (priced out: it never fits) may
    # fit once hosts are added, and a price may change with the managers' configuration.
    price_ttl_s: float = 300.0
    # Tenants and their tokens' digests (services.tenants): a call naming a tenant must carry its token. Empty:
    # any caller may name any tenant (development).
    tenants_file: str = ""
    # Sent with the calls the AM makes at the CRS and the agents for its tenants (services.tenants), whose
    # delegation_sha256 is its digest; only with a tenants_file.
    delegation_token: str = ""
    # A profiling run that failed through no fault of its configuration (the CRS or a manager away, no room for
    # now) does not count against the session's max_runs: the next run waits transient_backoff_s, doubled after
    # each such failure in a row up to transient_backoff_max_s (longer if the CRS asks to), and a session whose
    # runs have failed so for transient_give_up_s ends FAILED, saying why (runner.Patience).
    transient_backoff_s: float = 0.5
    transient_backoff_max_s: float = 30.0
    transient_give_up_s: float = 300.0


class ApplicationManager(ProfilingSessions, Executions, pb_grpc.ApplicationManagerServicer):
    """The servicer: its loading, request ids, applications and model here; profiling sessions
    (application_manager.sessions) and executions (application_manager.execution) are mixins of it, the releases at
    the CRS (application_manager.releases) a part it composes."""

    def __init__(self, config: AppManagerConfig, clock: Clock | None = None) -> None:
        if not (math.isfinite(config.run_timeout_s) and 0 < config.run_timeout_s <= MAX_RUN_TIMEOUT_S):
            raise ValueError(f"run_timeout_s {config.run_timeout_s!r}: seconds, more than 0 and at most "
                             f"{MAX_RUN_TIMEOUT_S:g} ({MAX_RUN_TIMEOUT_S / 86400:g} days)")
        if config.backend != "local":
            raise ValueError(f"backend {config.backend!r}: the service runs the 'local' back-end "
                             "(the replay back-end is for `harness bench profilers`)")
        if not (math.isfinite(config.heartbeat_s) and 0 < config.heartbeat_s <= 300):
            raise ValueError(f"heartbeat_s {config.heartbeat_s!r}: seconds, more than 0 and at most 300")
        if not (isinstance(config.max_long_calls, int) and not isinstance(config.max_long_calls, bool)
                and 1 <= config.max_long_calls <= MAX_LONG_CALLS):
            raise ValueError(f"max_long_calls {config.max_long_calls!r}: a whole number of calls (ExecuteApplication "
                             f"and StartProfiling in progress at once), 1 to {MAX_LONG_CALLS}")
        for name in ("transient_backoff_s", "transient_backoff_max_s", "transient_give_up_s"):
            value = getattr(config, name)
            if not (math.isfinite(value) and 0 <= value <= MAX_RUN_TIMEOUT_S):
                raise ValueError(f"{name} {value!r}: seconds, 0 to {MAX_RUN_TIMEOUT_S:g}")
        self.config = config
        self.clock = clock or WallClock()
        self.owner = owners.new_owner()
        self._stale_after = owners.STALE_BEATS * config.heartbeat_s
        self.db = Database(config.database or default_url(config.state_dir, "application-manager"))
        self.db.migrate(MIGRATIONS, "alembic_version_am")
        self.crs = irm_pb2_grpc.ResourceManagerStub(tenants.delegating(client.channel(config.crs_address),
                                                                       config.delegation_token))
        self.python = config.python or sys.executable
        self._loaded: OrderedDict[str, Loaded] = OrderedDict()     # LRU of at most MAX_LOADED (`_remember`)
        self._lock = threading.Lock()
        self._sessions: dict[str, SessionRunner] = {}
        self._busy: dict[str, str] = {}  # application id -> running session id
        # Held from the look for an earlier request with the same request id to the insert of a new row:
        # concurrent retries otherwise both miss and both insert (the loser an INTERNAL IntegrityError).
        self._request_ids = threading.Lock()
        # Set when the service stops: no run starts after it, and the ones in progress are cancelled.
        self._shutdown = threading.Event()
        # The cancellation event of every execution in progress (set on stop), and a condition to wait for them.
        self._executions: set[threading.Event] = set()
        self._execution_ids: dict[str, threading.Event] = {}    # running execution -> its cancellation
        self._executions_done = threading.Condition(self._lock)
        # ExecuteApplication calls and StartProfiling streams, each holding a worker thread while it lasts.
        self._long_calls = CallCap(config.max_long_calls, self._long_calls_refusal)
        # What ended runs may have left reserved at the CRS: kept, and released by the sweeps.
        self._releases = Releases(self.db, self.crs, self.clock, config.heartbeat_s, config.crs_address)
        self._sweep()
        # Marking rows alive makes no remote call, so nothing slow (a CRS that answers late while a sweep
        # releases what a dead process left) can hold it past `stale_after`; it stops last, once the runs
        # have ended. The sweep runs on a thread of its own.
        self._beating = threading.Event()
        self._heartbeat = threading.Thread(target=self._beat_loop, name="am-heartbeat", daemon=True)
        self._heartbeat.start()
        self._sweeper = threading.Thread(target=self._sweep_loop, name="am-sweeper", daemon=True)
        self._sweeper.start()

    def _gone(self, owner: str | None, heartbeat_at: float | None) -> str | None:
        return owners.gone(owner, heartbeat_at, me=self.owner, now=time.time(), stale_after=self._stale_after)

    def _sweep(self) -> None:
        """Sessions and executions whose AM process is gone (`owners.gone`) end as interrupted, and the
        reservations their runs left are released -- those of earlier sweeps too, until the CRS confirms -- as
        are those ended runs could not release (Releases.release_kept)."""
        def fix(s) -> None:  # type: ignore[no-untyped-def]
            for row in s.scalars(sql_select(m.Session).where(m.Session.state == "running")).all():
                if (why := self._gone(row.owner, row.heartbeat_at)) is not None:
                    self._end_gone_session(s, row, why)
            for row in s.scalars(sql_select(m.Execution).where(m.Execution.state == "running")).all():
                if (why := self._gone(row.owner, row.heartbeat_at)) is None:
                    continue
                s.execute(sql_update(m.Execution).where(
                    m.Execution.id == row.id, m.Execution.state == "running",
                    m.Execution.owner.is_not_distinct_from(row.owner)).values(
                    state="failed", error=why, ended_at=self.clock.now(), release_pending=True))
        self.db.transact(fix)
        self._releases.release_pending()
        self._releases.release_kept()

    def _beat(self) -> None:
        """Mark this process's running rows alive; stop the sessions another process was asked to stop, and
        cancel the runs whose rows another process took as interrupted (this one was silent too long): their
        reservations were released, and the application may be profiled elsewhere now."""
        me, now = str(self.owner), time.time()

        def go(s) -> tuple[set[str], set[str], list[str]]:  # type: ignore[no-untyped-def]
            s.execute(sql_update(m.Session).where(m.Session.owner == me, m.Session.state == "running")
                      .values(heartbeat_at=now))
            s.execute(sql_update(m.Execution).where(m.Execution.owner == me, m.Execution.state == "running")
                      .values(heartbeat_at=now))
            sessions = set(s.scalars(sql_select(m.Session.id).where(m.Session.owner == me,
                                                                    m.Session.state == "running")))
            executions = set(s.scalars(sql_select(m.Execution.id).where(m.Execution.owner == me,
                                                                        m.Execution.state == "running")))
            return sessions, executions, list(s.scalars(sql_select(m.Session.id).where(
                m.Session.owner == me, m.Session.state == "running", m.Session.stop_requested.is_(True))))
        with self._lock:        # before the look: a run registered after it is not taken for lost
            sessions_before = {sid for sid, r in self._sessions.items() if not r.done.is_set()}
            executions_before = dict(self._execution_ids)
        sessions, executions, stops = self.db.transact(go)
        for sid in stops:
            runner = self._sessions.get(sid)
            if runner is not None and not runner.stop.is_set():
                log.info("stopping a session as asked through another AM process", extra={"session": sid})
                runner.stop.set()
        for sid in sessions_before - sessions:
            runner = self._sessions.get(sid)
            if runner is not None and not runner.done.is_set() and not runner.stop.is_set():
                log.warning("another AM process took this session as interrupted: stopping its run",
                            extra={"session": sid})
                runner.stop.set()
        for eid, cancel in executions_before.items():
            if eid not in executions and not cancel.is_set():
                log.warning("another AM process took this execution as interrupted: stopping its run",
                            extra={"execution": eid})
                cancel.set()

    def _beat_loop(self) -> None:
        while not self._beating.wait(self.config.heartbeat_s):
            try:
                self._beat()
            except Exception:  # noqa: BLE001 - a database hiccup: the next beat tries again
                log.exception("heartbeat failed", extra={"owner": str(self.owner)})

    def _sweep_loop(self) -> None:
        while not self._shutdown.wait(self.config.heartbeat_s):
            try:
                self._sweep()
            except Exception:  # noqa: BLE001 - a database or CRS hiccup: the next sweep tries again
                log.exception("sweep failed", extra={"owner": str(self.owner)})

    @staticmethod
    def _long_calls_refusal(n: int, limit: int, what: str) -> ResourceExhausted:
        """Past max_long_calls a long call would hold one of the worker threads the short calls (StopProfiling,
        GetModel, health) are kept."""
        return ResourceExhausted(
            f"{what}: {n} long calls (ExecuteApplication runs and StartProfiling streams) are in progress on this "
            f"Application Manager, its most (max_long_calls={limit}); retry once one ends, or raise max_long_calls "
            "in the am section of its configuration (harness serve am --set max_long_calls=N)", reason=STREAM_CAP,
            retry_after_s=RETRY_LATER_S, metadata={"max_long_calls": str(limit)})

    def quiesce(self) -> None:
        """Shutting down, before the server stops: refuse new sessions and executions, cancel what runs (each
        run stops its modules and releases its reservation; an ExecuteApplication in flight ends)."""
        self._cancel_all()

    def _cancel_all(self) -> list[SessionRunner]:
        with self._lock:
            # Under the lock StartProfiling registers a session under: it is one of `runners`, or it is refused.
            self._shutdown.set()
            runners = list(self._sessions.values())
            for ev in self._executions:
                ev.set()
        for r in runners:
            r.stop.set()
        return runners

    def stop(self) -> None:
        """Cancel what runs (each run stops its modules and releases its reservation), wait for it, close."""
        runners = self._cancel_all()
        self._sweeper.join(timeout=SHUTDOWN_WAIT_S)
        for r in runners:
            if r.thread:
                r.thread.join(timeout=SHUTDOWN_WAIT_S)
        with self._executions_done:
            self._executions_done.wait_for(lambda: not self._executions, timeout=SHUTDOWN_WAIT_S)
        # Marked alive until here: winding down may take a while, and another process must not take the rows.
        self._beating.set()
        self._heartbeat.join(timeout=SHUTDOWN_WAIT_S)
        self.db.dispose()

    # -- loading ---------------------------------------------------------------
    def _offered_types(self) -> Offered:
        """The resource types the CRS offers, with the ranges of their attributes."""
        try:
            spec = self.crs.DescribeAllocationSpec(irm_pb2.DescribeAllocationSpecRequest(), timeout=10)
        except grpc.RpcError as e:
            raise Unavailable(f"the CRS at {self.config.crs_address} did not answer: {e.code().name}") from None
        return Offered.of(spec)

    def _load(self, tenant: str, application_id: str) -> Loaded:
        if not application_id:
            raise InvalidArgument.of("application_id", "required")
        with self._lock:
            hit = self._loaded.get(application_id)
            if hit is not None:
                self._loaded.move_to_end(application_id)
        if hit is not None:
            owned(tenant, hit.app.tenant, f"application {application_id}")
            return hit
        with self.db.read() as s:
            app = s.get(m.Application, application_id)
        if app is None:
            raise NotFound(f"no application {application_id}")
        owned(tenant, app.tenant, f"application {application_id}")
        try:
            manifest = parse_manifest(app.manifest, "manifest_json")
            slo = parse_slo(app.slo or "{}", manifest, "slo_json")
        except InvalidArgument as e:
            # Accepted by an earlier version whose checks were looser: not the caller's request that is wrong.
            raise StaleApplication(application_id, e.message) from None
        try:
            # The types offered now, but not the ranges: judged at submit, they may be narrower now for a while (a
            # CRS restarted describes a manager only once it is back), and configurations would leave the space.
            space = from_manifest(manifest, slo.parameters, set(self._offered_types()))
        except (Unavailable, InvalidArgument) as e:
            # It was accepted once: an application whose resource types are not offered now (an IRM away, or the
            # CRS) stays readable -- its model, runs, executions -- over all of its implementations, uncached
            # (the next call asks again); runs of what is not offered fail to reserve, saying why.
            space = from_manifest(manifest, slo.parameters, None)
            space.notes.append(f"not every resource type it needs is offered now ({e.message}); "
                               "its configurations cannot all run until they are")
            return Loaded(app, manifest, slo, space)
        loaded = Loaded(app, manifest, slo, space)
        self._remember(loaded)
        return loaded

    def _remember(self, loaded: Loaded) -> None:
        with self._lock:
            self._loaded[loaded.app.id] = loaded
            self._loaded.move_to_end(loaded.app.id)
            while len(self._loaded) > 1 and (len(self._loaded) > MAX_LOADED or sum(
                    len(x.space) for x in self._loaded.values()) > MAX_LOADED_CONFIGURATIONS):
                self._loaded.popitem(last=False)

    def _backend(self, loaded: Loaded, slo: Slo | None = None, cancelled: threading.Event | None = None,
                 cancel_reason: str = "", tenant_token: str = "") -> LocalBackend:
        """`tenant_token`: the token the tenant's call sent (services.tenants.bearer), for its application."""
        slo = slo or loaded.slo
        b = LocalBackend(self.config.crs_address, loaded.app.tenant, loaded.manifest, loaded.space, slo.parameters,
                         loaded.app.app_dir, self.python, self.config.run_timeout_s, cancelled,
                         delegation_token=self.config.delegation_token, tenant_token=tenant_token,
                         release_later=self._releases.release_later)
        if cancel_reason:
            b.cancel_reason = cancel_reason
        return b

    # -- idempotency -------------------------------------------------------------
    def _add_once(self, request_id: str, prior: Callable[[], T | None], add: Callable[[DbSession], None]) -> T | None:
        """Insert with `add` unless an earlier request with this request id got there first: its row (from
        `prior`), or None when `add` inserted."""
        if not request_id:
            self.db.transact(add)
            return None
        with self._request_ids:
            if (earlier := prior()) is not None:
                return earlier
            try:
                self.db.transact(add)
            except IntegrityError:
                # Another AM process on the same database inserted between our look and our insert (the lock
                # is this process's only); the unique (tenant, request_id) refused ours.
                if (earlier := prior()) is None:
                    raise
                return earlier
        return None

    def _prior_application(self, tenant: str, request_id: str) -> m.Application | None:
        with self.db.read() as s:
            return s.scalar(sql_select(m.Application).where(m.Application.tenant == tenant,
                                                            m.Application.request_id == request_id))

    def _prior_execution(self, tenant: str, request_id: str) -> m.Execution | None:
        with self.db.read() as s:
            return s.scalar(sql_select(m.Execution).where(m.Execution.tenant == tenant,
                                                          m.Execution.request_id == request_id))

    @staticmethod
    def _same_request(same: bool) -> None:
        """A retry must ask for what its request id first asked for: answering another request with the first
        one's application or execution would hand the client something it did not ask for."""
        if not same:
            raise reused_request_id()

    def _replayed_application(self, tenant: str, prior: m.Application, request) -> pb.Application:  # type: ignore[no-untyped-def]
        self._same_request((prior.manifest, prior.slo, prior.app_dir)
                           == (request.manifest_json, request.slo_json or "{}", request.app_dir))
        return application_pb(self._load(tenant, prior.id))

    # -- applications ------------------------------------------------------------
    def SubmitApplication(self, request, context):  # noqa: N802
        tenant = require_tenant(request.tenant)
        if request.request_id and (prior := self._prior_application(tenant, request.request_id)) is not None:
            return self._replayed_application(tenant, prior, request)
        if not request.manifest_json.strip():
            raise InvalidArgument.of("manifest_json", "required: the application manifest (JSON, thesis appendix A)")
        v = Violations()
        v.check(len(request.manifest_json.encode()) <= MAX_MANIFEST_BYTES, "manifest_json",
                f"at most {MAX_MANIFEST_BYTES} bytes ({MAX_MANIFEST_BYTES // 1024} KiB) of UTF-8")
        v.check(len(request.slo_json.encode()) <= MAX_SLO_BYTES, "slo_json",
                f"at most {MAX_SLO_BYTES} bytes ({MAX_SLO_BYTES // 1024} KiB) of UTF-8")
        v.raise_if_any()
        manifest = parse_manifest(request.manifest_json, "manifest_json")
        slo = parse_slo(request.slo_json or "{}", manifest, "slo_json")
        v = Violations()
        v.check(len(request.app_dir) <= 1024, "app_dir", "at most 1024 characters")
        # Runs start in a scratch directory of the agent's: a relative %app_dir would name nothing there, and every
        # run would fail as if the configuration did.
        v.check(not request.app_dir or request.app_dir.startswith("/"), "app_dir",
                f"an absolute path on the agents' machines (or empty), got {request.app_dir[:200]!r}")
        v.check(len(request.request_id) <= 128, "request_id", "at most 128 characters")
        v.raise_if_any()
        space = _space(manifest, slo, self._offered_types())
        app = m.Application(id=f"app-{uuid.uuid4().hex[:12]}", tenant=tenant, request_id=request.request_id or None,
                            name=manifest.name, manifest=request.manifest_json, slo=request.slo_json or "{}",
                            app_dir=request.app_dir, created_at=self.clock.now())

        def add(s) -> None:  # type: ignore[no-untyped-def]
            s.add(app)
            s.add(m.Model(application_id=app.id, frontier=[], predictions=[], extrapolation=None,
                          updated_at=self.clock.now()))
        earlier = self._add_once(request.request_id, lambda: self._prior_application(tenant, request.request_id), add)
        if earlier is not None:
            return self._replayed_application(tenant, earlier, request)
        loaded = Loaded(app, manifest, slo, space)
        self._remember(loaded)
        log.info("application submitted", extra={"application": app.id, "configurations": len(space)})
        return application_pb(loaded)

    def GetApplication(self, request, context):  # noqa: N802
        tenant = require_tenant(request.tenant)
        return application_pb(self._load(tenant, request.application_id))

    def ListApplications(self, request, context):  # noqa: N802
        tenant = require_tenant(request.tenant)
        with self.db.read() as s:
            rows, token = paging.page(s, sql_select(m.Application).where(m.Application.tenant == tenant),
                                      [m.Application.created_at, m.Application.id], request.page_size,
                                      request.page_token)
        out: list[pb.Application] = []
        size = 0
        for n, row in enumerate(rows):
            try:
                a = application_pb(self._load(tenant, row.id))
            except StaleApplication as e:
                # Stored under older rules that now refuse it: listed as it is, saying why, never failing the list.
                a = pb.Application(id=row.id, tenant=row.tenant, name=row.name, manifest_json=row.manifest,
                                   slo_json=row.slo, app_dir=row.app_dir, created_at=row.created_at,
                                   notes=[f"no longer valid: {e.why}; submit it again, fixed"])
            size += a.ByteSize() + 8        # each one's field tag and length too
            if out and size > MAX_LIST_BYTES:
                # The page ends here (at least one per page: one application is far below the budget); the next
                # one starts after the last listed, as a page of `n` would.
                token = paging.token_after(rows[n - 1], [m.Application.created_at, m.Application.id])
                break
            out.append(a)
        return pb.ListApplicationsResponse(applications=out, next_page_token=token)

    # -- the model -------------------------------------------------------------------
    def _observations(self, loaded: Loaded) -> list[Observation]:
        with self.db.read() as s:
            # Transient runs (refused, lost, cancelled) are no measurement: a profiler must not take their
            # configurations as tried, so a later session may try them again.
            rows = list(s.scalars(sql_select(m.Run).where(m.Run.application_id == loaded.app.id,
                                                          m.Run.transient.is_(False)).order_by(m.Run.id)))
        out = []
        for r in rows:
            i = loaded.space.index(r.config)
            if i is not None:
                out.append(Observation(i, r.ok, r.time_s, r.cost, r.input, r.cpu_percent, r.memory_percent, r.error))
        return out

    @staticmethod
    def _points(s: DbSession, loaded: Loaded, predictions: list[dict]) -> list[Point]:
        """Measured production points (repeated configurations averaged) plus predictions of the rest, as `s`
        sees them (runs it added included).

        A configuration whose newest measurement failed is not ok, whatever ok runs came before: every failure
        counted here is the configuration's own (transient ones are left out), be it an execution killed at the
        limit drawn from the model (more than twice its time: the model's point is wrong), a crash or memory
        running out. Kept on the frontier, the next execution would choose it again and fail the same way; an ok
        run after the failure brings it back."""
        rows = list(s.scalars(sql_select(m.Run).where(m.Run.application_id == loaded.app.id,
                                                      m.Run.input == PRODUCTION, m.Run.transient.is_(False))
                              .order_by(m.Run.id)))
        by_key: dict[str, list[m.Run]] = {}
        for r in rows:
            by_key.setdefault(json.dumps(r.config, sort_keys=True), []).append(r)
        points = []
        for key, runs in by_key.items():
            ok = [r for r in runs if r.ok]
            use = ok or runs
            points.append(Point(use[0].config, sum(r.time_s for r in use) / len(use),
                                sum(r.cost for r in use) / len(use), runs[-1].ok, key=key))
        measured = set(by_key)
        for p in predictions:
            key = json.dumps(p["config"], sort_keys=True)
            if key not in measured:
                points.append(Point(p["config"], p["time_s"], p["cost"], True, predicted=True, key=key))
        return points

    def _refresh_model(self, loaded: Loaded, predictions: list[dict] | None = None,
                       extrapolation: dict | None = None) -> list[Point]:
        return self.db.transact(lambda s: self._refresh_in(s, loaded, predictions, extrapolation))

    def _refresh_in(self, s: DbSession, loaded: Loaded, predictions: list[dict] | None = None,
                    extrapolation: dict | None = None) -> list[Point]:
        """The model rebuilt within `s`: in the transaction that records a run, so no crash between the two can
        leave a measured run out of the frontier for good."""
        # The model's row locked before the runs are read: two runs recorded at once (an execution, a profiling
        # run) would each rebuild the frontier without the other's, and the later commit would drop one
        # (PostgreSQL's read committed; SQLite's writers take turns anyway).
        row = s.get(m.Model, loaded.app.id, with_for_update=True)
        preds = predictions if predictions is not None else list(row.predictions or [])
        front = pareto(self._points(s, loaded, preds))
        row.frontier = [{"config": p.config, "time_s": p.time_s, "cost": p.cost, "predicted": p.predicted}
                        for p in front]
        if predictions is not None:
            row.predictions = predictions
        if extrapolation is not None:
            row.extrapolation = extrapolation
        row.updated_at = self.clock.now()
        return front

    def GetModel(self, request, context):  # noqa: N802
        tenant = require_tenant(request.tenant)
        loaded = self._load(tenant, request.application_id)
        with self.db.read() as s:
            # The most recent MAX_MODEL_RUNS (executions add one each, for good): every run in one message would
            # outgrow what a client receives.
            total = s.scalar(sql_select(func.count()).select_from(m.Run).where(m.Run.application_id == loaded.app.id))
            runs = list(s.scalars(sql_select(m.Run).where(m.Run.application_id == loaded.app.id)
                                  .order_by(m.Run.id.desc()).limit(MAX_MODEL_RUNS)))[::-1]
            model = s.get(m.Model, loaded.app.id)
            sessions_total = s.scalar(sql_select(func.count()).select_from(m.Session)
                                      .where(m.Session.application_id == loaded.app.id))
            sessions = list(s.scalars(sql_select(m.Session).where(m.Session.application_id == loaded.app.id)
                                      .order_by(m.Session.started_at.desc(), m.Session.id.desc())
                                      .limit(MAX_MODEL_SESSIONS)))[::-1]
        out = pb.PerformanceModel(application_id=loaded.app.id, runs=[run_pb(r) for r in runs],
                                  sessions=[session_pb(x) for x in sessions],
                                  updated_at=model.updated_at if model else 0.0,
                                  runs_left_out=max(0, (total or 0) - len(runs)),
                                  sessions_left_out=max(0, (sessions_total or 0) - len(sessions)))
        for p in (model.frontier if model else []):
            out.frontier.append(pb.ProfileRun(configuration=config_pb(p["config"]), ok=True,
                                              input=pb.ProfileRun.INPUT_PRODUCTION, execution_time_s=p["time_s"],
                                              cost=p["cost"], predicted=p["predicted"]))
        if model and model.extrapolation:
            x = model.extrapolation
            out.extrapolation.CopyFrom(pb.Extrapolation(family=x["family"], params=x["params"], r2=x["r2"],
                                                        points=x["points"], constraints=x.get("constraints", [])))
        return out


class Offered(set):
    """Resource types the CRS offers, and `limits`: per type and attribute the range its managers offer."""

    limits: Limits

    @classmethod
    def of(cls, spec: irm_pb2.DescribeAllocationSpecResponse) -> Offered:
        out = cls(t.name for t in spec.resource_types)
        out.limits = {}
        for t in spec.resource_types:        # several managers of a type: the union of their ranges
            mine = out.limits.setdefault(t.name, {})
            for a in t.attributes:
                if a.kind != irm_pb2.AttributeSpec.KIND_NUMBER:
                    continue
                lo = a.domain.min if a.domain.HasField("min") else None
                hi = a.domain.max if a.domain.HasField("max") else None
                if a.name in mine:
                    was_lo, was_hi, _ = mine[a.name]
                    lo = None if lo is None or was_lo is None else min(lo, was_lo)
                    hi = None if hi is None or was_hi is None else max(hi, was_hi)
                mine[a.name] = (lo, hi, a.unit)
        return out


def _space(manifest: Manifest, slo: Slo, offered: set[str]) -> Space:
    """The application's search space over what the CRS offers: its types and, when known, their ranges."""
    return from_manifest(manifest, slo.parameters, offered, limits=getattr(offered, "limits", None))


def component(config: AppManagerConfig, clock: Clock | None = None) -> Component:
    tenants.delegation(config.tenants_file, config.delegation_token, "am")
    auth = tenants.auth(config.tenants_file, "am", takes_delegation=False)
    am = ApplicationManager(config, clock)

    def register(server: grpc.Server) -> None:
        pb_grpc.add_ApplicationManagerServicer_to_server(am, server)

    # Every long call holds a worker thread while it lasts: the pool has a thread for each (the rest refused,
    # `_take_long_call`) and CONTROL_WORKERS more, so that the short calls never wait behind them.
    return Component(name="application-manager", register=register,
                     service_names=["harness.v1.ApplicationManager"], quiesce=am.quiesce, stop=am.stop,
                     probe=am.db.probe, extra={"am": am}, max_workers=config.max_long_calls + CONTROL_WORKERS,
                     auth=auth)


def main(argv: list[str] | None = None) -> int:
    """`python -m application_manager.service [--address A] [--config F] [--set k=v] [--port-file F]`: the same as
    `harness serve am ...` (its checks, TLS and exit statuses)."""
    from services import cli

    return cli.main(["serve", "am", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    raise SystemExit(main())
