"""The Application Manager service (harness.v1.ApplicationManager; thesis ch. 4, §5.3).

Controller (submit: manifest + SLO validated, search space built against the resource
types the CRS offers), Profiler (a session thread drives a pure profiler through
application_manager.runner on the `local` back-end), performance model (runs, Pareto
frontier and extrapolation in the database, so it survives restarts), Configuration
Designer (selection under the SLO) and Execution Manager (the chosen configuration run for
real; predicted vs measured recorded, and the measurement joins the model: online
profiling, §4.3.5).
"""

from __future__ import annotations

import json
import logging
import math
import queue
import sys
import threading
import time
import uuid
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TypeVar

import grpc
import numpy as np
from sqlalchemy import delete as sql_delete
from sqlalchemy import func
from sqlalchemy import select as sql_select
from sqlalchemy import update as sql_update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session as DbSession

from application_manager import models as m
from application_manager import owners
from application_manager.local import TRANSIENT_CODES, LocalBackend, Unreleased, cloud_away, transient_error
from application_manager.manifest import Manifest, _get, parse_manifest
from application_manager.model import Point, pareto, select
from application_manager.profilers import BENCHMARK, PRODUCTION, PROFILERS, History, Observation, Proposal
from application_manager.runner import Patience, StopRules, profile
from application_manager.slo import Slo, parse_slo
from application_manager.space import Space, from_manifest
from harness.v1 import application_manager_pb2 as pb
from harness.v1 import application_manager_pb2_grpc as pb_grpc
from harness.v1 import irm_pb2, irm_pb2_grpc
from services import client, paging, tenants
from services.clock import Clock, WallClock
from services.db import Database, default_url
from services.errors import (
    APPLICATION_STALE,
    NO_MODEL,
    PROFILING_IN_PROGRESS,
    RESERVATION_PENDING,
    RETRY_LATER_S,
    SLO_UNATTAINABLE,
    STREAM_CAP,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    ResourceExhausted,
    Unavailable,
    Violations,
    error_info,
    owned,
    require_tenant,
)
from services.idempotency import reused_request_id
from services.server import CallCap, Component
from services.tls import TlsSettings

log = logging.getLogger(__name__)
T = TypeVar("T")
MIGRATIONS = Path(__file__).parent / "migrations"
MAX_RUNS = 200
# A run's or execution's error as stored: "exit code N: <the program's last output line>", "could not reserve:
# CODE: ...", a cancellation's reason... The head says what kind of failure it is (transient_error, bottleneck
# detection and timeouts read it); the tail holds the end of the last output line. Unbounded, one program
# printing a long last line grows every GetModel (which returns every run) towards the 4 MiB a client receives.
MAX_ERROR_CHARS = 2000
_ERROR_HEAD = 400
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
# Every Application message carries its manifest and SLO, and ListApplications returns them all in one
# message: unbounded, a few large ones would exceed a client's receive limit (4 MiB by default) for good.
MAX_MANIFEST_BYTES = 256 * 1024
MAX_SLO_BYTES = 64 * 1024
# ListApplications stops filling a page at this many bytes of applications (and returns next_page_token): 100
# (the default page) of the largest would be ~32 MiB, where a client receives 4 MiB by default.
MAX_LIST_BYTES = 3 * 1024 * 1024
# The longest a run may be given: the agent's stream deadline is the limit plus a margin, and gRPC turns an
# unbounded one (1e300, inf) into an immediate DEADLINE_EXCEEDED -- every run would fail at once.
MAX_RUN_TIMEOUT_S = 7 * 24 * 3600.0
# A Reserve in doubt whose request id the CRS does not know (NOT_FOUND) is taken as holding nothing only after this
# long from when it was kept. Until then its request may still reach the CRS and claim the id: up to its deadline
# (local.RESERVE_TIMEOUT_S after it was sent, before the row was kept: a lost connection fails the call early, not the
# request the CRS may have read), then the CRS's parsing and its database's waits before the claim (a connection
# from the pool, a lock: ~30 s each); gRPC starts no handler past a call's deadline. A CRS from before
# RESERVATION_PENDING also answers NOT_FOUND while it places the Reserve, for as long as it keeps one pending (its
# pending horizon: ~3 min with default settings), and may activate it then: this covers both.
IN_DOUBT_KEPT_S = 900.0
# A release the CRS refuses for good (PERMISSION_DENIED, FAILED_PRECONDITION...) is asked again after heartbeat_s,
# doubled at each refusal in a row up to this: its reservation may still be held, so the row is never dropped, but
# it costs one call and one warning an hour rather than one each sweep.
RELEASE_BACKOFF_MAX_S = 3600.0
# Failures that stop the pass over the kept rows: the CRS is out of reach for all of them (the next sweep tries).
_CRS_AWAY = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
# An execution given no timeout_s may take this many times the model's time of its configuration (when that is
# more than run_timeout_s): a run the model expects to take 20 minutes is not killed at the default 10.
PREDICTED_MARGIN = 2.0
# The most max_long_calls may be: each is a gRPC worker thread (and a run's threads) held for as long as it lasts.
MAX_LONG_CALLS = 4096
# gRPC worker threads beyond the long calls (max_long_calls): StopProfiling, GetModel, the listings and health
# checks always find one free, however many runs are in progress (irm_compute.agent sizes its pool the same way).
CONTROL_WORKERS = 16
# How long StopProfiling waits for the cancelled run to wind down (stop its modules, release its reservation)
# before answering with the session as it is then (still RUNNING; it ends STOPPED by itself).
STOP_ANSWER_S = 1.5
# How long stopping the service waits for cancelled sessions and executions to release their reservations.
SHUTDOWN_WAIT_S = 30.0
STOPPING = ("the Application Manager is stopping: start profiling again once it is back (or through another AM "
            "process on the same database)")
STOPPED_RUN = "stopped: profiling was stopped (StopProfiling, or the service stopping) while it ran"
_SESSION_STATE = {"running": pb.ProfilingSession.STATE_RUNNING, "done": pb.ProfilingSession.STATE_DONE,
                  "stopped": pb.ProfilingSession.STATE_STOPPED, "failed": pb.ProfilingSession.STATE_FAILED}
_EXEC_STATE = {"running": pb.ApplicationExecution.STATE_RUNNING,
               "succeeded": pb.ApplicationExecution.STATE_SUCCEEDED,
               "failed": pb.ApplicationExecution.STATE_FAILED}


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


@dataclass
class Loaded:
    app: m.Application
    manifest: Manifest
    slo: Slo
    space: Space
    # The CRS's quote per configuration of this `space` (index for index), kept up to `price_ttl_s` from when it
    # was asked (`prices_at`): kept with the space it belongs to, so a space built otherwise (some resource types
    # away) never reads another's prices.
    prices: np.ndarray | None = None
    prices_at: float = 0.0

    def prices_from(self, backend: LocalBackend, now: float, ttl_s: float) -> np.ndarray:
        """The kept quotes if younger than `ttl_s`, else the CRS's now (kept if complete)."""
        if self.prices is not None and now - self.prices_at < ttl_s:
            return self.prices
        prices = backend.prices()
        # NaN is "the CRS could not quote this now": not kept, a momentary failure would price the space for good.
        if not np.isnan(prices).any():
            self.prices, self.prices_at = prices, now
        return prices


class SessionRunner:
    """One profiling session: a thread, a stop flag, and the streams following it."""

    def __init__(self, session_id: str) -> None:
        self.id = session_id
        self.stop = threading.Event()
        self.done = threading.Event()
        self.lock = threading.Lock()
        self.followers: list[queue.Queue] = []
        self.thread: threading.Thread | None = None

    def follow(self) -> queue.Queue:
        q: queue.Queue = queue.Queue()
        with self.lock:
            self.followers.append(q)
        return q

    def publish(self, event: pb.ProfilingEvent, final: bool = False) -> None:
        with self.lock:
            for q in self.followers:
                q.put((event, final))


class StaleApplication(FailedPrecondition):
    """A stored application today's checks refuse (accepted by an earlier, looser version)."""

    def __init__(self, application_id: str, why: str) -> None:
        super().__init__(f"application {application_id} was accepted by an earlier version of the Application "
                         f"Manager, but its stored manifest or SLO is no longer valid ({why}); submit it again",
                         reason=APPLICATION_STALE)
        self.why = why


def reservation_request_id(owner: str, run: int | None = None) -> str:
    """The CRS request id of a run: derived from its session (and the run's number in it) or execution, so a
    reservation left by an AM that died mid-run is found again (`_release_left`)."""
    return f"am-{owner}" if run is None else f"am-{owner}-{run}"


def bounded_error(error: str) -> str:
    """`error` within MAX_ERROR_CHARS: its head (the kind of failure) and its tail (the end of the last output
    line), the middle elided."""
    if len(error) <= MAX_ERROR_CHARS:
        return error
    # The count left out has at most as many digits as the whole length: the marker is never longer than this.
    tail = MAX_ERROR_CHARS - _ERROR_HEAD - len(f" [... {len(error)} characters left out ...] ")
    return f"{error[:_ERROR_HEAD]} [... {len(error) - _ERROR_HEAD - tail} characters left out ...] {error[-tail:]}"


def _config_pb(config: dict[str, Any]) -> pb.Configuration:
    return pb.Configuration(
        implementation=str(config.get("implementation", "")),
        values={k: str(v) for k, v in config.items() if k != "implementation" and v is not None},
        summary=", ".join(f"{k}={v}" for k, v in config.items() if v is not None),
    )


class ApplicationManager(pb_grpc.ApplicationManagerServicer):
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

    def _end_gone_session(self, s: DbSession, row: m.Session, why: str) -> bool:
        """Fail `row` (running, its owner gone) unless another process did first, marked for its runs'
        reservations to be released (`_release_pending`); whether this call ended it."""
        return bool(s.execute(sql_update(m.Session).where(
            m.Session.id == row.id, m.Session.state == "running",
            m.Session.owner.is_not_distinct_from(row.owner)).values(
            state="failed", message=why, ended_at=self.clock.now(), release_pending=True)).rowcount)

    def _sweep(self) -> None:
        """Sessions and executions whose AM process is gone (`owners.gone`) end as interrupted, and the
        reservations their runs left are released -- those of earlier sweeps too, until the CRS confirms -- as
        are those ended runs could not release (`_release_kept`)."""
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
        self._release_pending()
        self._release_kept()

    def _release_later(self, left: Unreleased) -> None:
        """Keep what a run may have left reserved (LocalBackend.release_later) for the sweeps to release: in the
        database, so that neither a restart nor the CRS staying away for a while loses it."""
        row = m.Release(tenant=left.tenant, request_id=left.request_id, reservation_id=left.reservation_id,
                        reserve_request=None if left.request is None else
                        left.request.SerializeToString(deterministic=True), created_at=self.clock.now())
        self.db.transact(lambda s: s.add(row))

    def _release_kept(self) -> None:
        """Release what ended runs may have left at the CRS (`m.Release`), each forgotten once the CRS confirms
        nothing is held under it; a CRS out of reach ends the pass, a refusal that waiting may cure leaves that one
        to the next sweep, any other one to a later sweep (`_back_off`). Only ended runs' request ids are kept, so
        nothing a run in progress holds is released."""
        with self.db.read() as s:
            rows = list(s.scalars(sql_select(m.Release).where(m.Release.next_try_at <= self.clock.now())
                                  .order_by(m.Release.id)))
        for row in rows:
            try:
                done = self._release_one(row)
            except grpc.RpcError as e:
                if e.code() not in TRANSIENT_CODES:
                    self._back_off(row, e)
                    continue
                log.warning("could not release a reservation a run left: the next sweep tries again (or release it "
                            "at the CRS: ReleaseReservation)",
                            extra={"tenant": row.tenant, "request_id": row.request_id,
                                   "reservation": row.reservation_id, "code": str(e.code()),
                                   "crs": self.config.crs_address})
                if e.code() in _CRS_AWAY:
                    return
                continue
            if done:
                self.db.transact(lambda s, rid=row.id: s.execute(sql_delete(m.Release).where(m.Release.id == rid)))
                log.info("released a reservation a run had left", extra={"request_id": row.request_id})
            elif row.attempts:
                # Answered (its Reserve still on its way or being placed): the refusals in a row are over.
                self.db.transact(lambda s, rid=row.id: s.execute(sql_update(m.Release).where(
                    m.Release.id == rid).values(attempts=0)))

    def _back_off(self, row: m.Release, e: grpc.RpcError) -> None:
        """The CRS refused `row` in a way waiting does not cure (its delegation refused, the request invalid...):
        asked again later and later, up to RELEASE_BACKOFF_MAX_S, and kept -- its reservation may still be held."""
        attempts = row.attempts + 1
        # The exponent bounded: a row refused for years would overflow a float.
        delay = min(RELEASE_BACKOFF_MAX_S, self.config.heartbeat_s * 2.0 ** min(attempts - 1, 32))
        self.db.transact(lambda s: s.execute(sql_update(m.Release).where(m.Release.id == row.id).values(
            attempts=attempts, next_try_at=self.clock.now() + delay)))
        what = (f"reservation {row.reservation_id}" if row.reservation_id
                else f"the reservation under request id {row.request_id!r}, if the CRS placed one")
        log.warning(f"the CRS refused to release a reservation a run may have left ({e.code().name}: "
                    f"{(e.details() or '')[:300]}); asked again in {delay:g} s. Release it yourself at the CRS "
                    f"(ReleaseReservation) as tenant {row.tenant!r}: {what} (`harness reservations --tenant "
                    f"{row.tenant}` lists its id), or fix what the CRS refuses (the AM's delegation, say)",
                    extra={"tenant": row.tenant, "request_id": row.request_id, "reservation": row.reservation_id,
                           "code": str(e.code()), "attempts": attempts, "crs": self.config.crs_address})

    def _release_one(self, row: m.Release) -> bool:
        """Whether nothing is held under `row` at the CRS any more (released now, or never placed); False while its
        Reserve is still being placed, or may still reach the CRS. RpcError: the CRS did not answer, or refused."""
        reservation_id = row.reservation_id
        if not reservation_id:
            try:
                held = self.crs.GetReservation(irm_pb2.GetReservationRequest(tenant=row.tenant,
                                                                             request_id=row.request_id), timeout=10)
            except grpc.RpcError as e:
                if e.code() == grpc.StatusCode.ABORTED and (error_info(e) or ("",))[0] == RESERVATION_PENDING:
                    return False        # its outcome is not decided yet: asked again next sweep
                if e.code() != grpc.StatusCode.NOT_FOUND:
                    raise
                # Not even pending. Reserving again under its id to tell "never placed" from "on its way" would
                # place what nobody uses: the request's deadline is what says it can no longer land.
                return self.clock.now() - row.created_at > IN_DOUBT_KEPT_S
            if held.state != irm_pb2.Reservation.STATE_ACTIVE:
                return True
            reservation_id = held.id
            # Found: a release that fails below is tried again by its id.
            self.db.transact(lambda s: s.execute(sql_update(m.Release).where(m.Release.id == row.id).values(
                reservation_id=reservation_id)))
        try:
            self.crs.ReleaseReservation(irm_pb2.ReleaseReservationRequest(tenant=row.tenant,
                                                                          reservation_id=reservation_id), timeout=30)
        except grpc.RpcError as e:
            if e.code() != grpc.StatusCode.NOT_FOUND:
                raise
        return True

    def _release_pending(self, session_ids: set[str] | None = None) -> None:
        """Release at the CRS what the runs of rows marked `release_pending` (ended as interrupted) left reserved,
        and clear the mark once it confirms; a CRS out of reach leaves it for the next sweep (every heartbeat_s).
        `session_ids`: only those sessions'."""
        with self.db.read() as s:
            q = (sql_select(m.Session.id, m.Application.tenant).join(m.Application,
                                                                     m.Application.id == m.Session.application_id)
                 .where(m.Session.release_pending.is_(True)))
            if session_ids is not None:
                q = q.where(m.Session.id.in_(session_ids))
            sessions = list(s.execute(q))
            executions = [] if session_ids is not None else list(s.execute(
                sql_select(m.Execution.id, m.Execution.tenant).where(m.Execution.release_pending.is_(True))))
        by_tenant: dict[str, tuple[list[str], list[str]]] = {}
        for sid, tenant in sessions:
            by_tenant.setdefault(tenant, ([], []))[0].append(sid)
        for eid, tenant in executions:
            by_tenant.setdefault(tenant, ([], []))[1].append(eid)
        for tenant, (sids, eids) in by_tenant.items():
            # Every run of a session reserved under am-<session>-<n> (a prefix here); an execution under am-<id>.
            request_ids = ([reservation_request_id(x, 0).removesuffix("0") for x in sids]
                           + [reservation_request_id(x) for x in eids])
            if not self._release_left(tenant, request_ids):
                return      # the CRS is out of reach: for every tenant; the next sweep tries them all again

            def released(s, sids=sids, eids=eids) -> None:  # type: ignore[no-untyped-def]
                if sids:
                    s.execute(sql_update(m.Session).where(m.Session.id.in_(sids)).values(release_pending=False))
                if eids:
                    s.execute(sql_update(m.Execution).where(m.Execution.id.in_(eids)).values(release_pending=False))
            self.db.transact(released)

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

    def _release_left(self, tenant: str, request_ids: list[str]) -> bool:
        """Release the tenant's active reservations whose request id is one of `request_ids` (an execution's) or
        starts with one ending in "-" (a session's runs): what a run in progress held when the AM died.
        Whether the CRS confirmed (none of them is active now); a CRS out of reach is logged, and False."""
        exact = {p for p in request_ids if not p.endswith("-")}
        starts = tuple(p for p in request_ids if p.endswith("-"))
        token = ""
        try:
            while True:
                page = self.crs.ListReservations(irm_pb2.ListReservationsRequest(
                    tenant=tenant, page_size=1000, page_token=token), timeout=10)
                for r in page.reservations:
                    if r.state != irm_pb2.Reservation.STATE_ACTIVE:
                        continue
                    if r.request_id in exact or (starts and r.request_id.startswith(starts)):
                        self.crs.ReleaseReservation(irm_pb2.ReleaseReservationRequest(
                            tenant=tenant, reservation_id=r.id), timeout=30)
                        log.info("released a reservation an interrupted run left",
                                 extra={"reservation": r.id, "request_id": r.request_id})
                token = page.next_page_token
                if not token:
                    return True
        except grpc.RpcError as e:
            log.warning("could not release the reservations interrupted runs left: the next sweep tries again "
                        "(or release them at the CRS: ReleaseReservation; their request ids start with the ones "
                        "logged here)",
                        extra={"tenant": tenant, "request_ids": request_ids, "code": str(e.code()),
                               "crs": self.config.crs_address})
            return False

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
    def _offered_types(self) -> set[str]:
        try:
            spec = self.crs.DescribeAllocationSpec(irm_pb2.DescribeAllocationSpecRequest(), timeout=10)
        except grpc.RpcError as e:
            raise Unavailable(f"the CRS at {self.config.crs_address} did not answer: {e.code().name}") from None
        return {t.name for t in spec.resource_types}

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
            space = from_manifest(manifest, slo.parameters, self._offered_types())
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
                         release_later=self._release_later)
        if cancel_reason:
            b.cancel_reason = cancel_reason
        return b

    def _application_pb(self, loaded: Loaded) -> pb.Application:
        a = loaded.app
        return pb.Application(id=a.id, tenant=a.tenant, name=a.name, manifest_json=a.manifest, slo_json=a.slo,
                              app_dir=a.app_dir, configurations=len(loaded.space),
                              dimensions=[d.name for d in loaded.space.dims], notes=loaded.space.notes,
                              created_at=a.created_at)

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
        return self._application_pb(self._load(tenant, prior.id))

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
        space = from_manifest(manifest, slo.parameters, self._offered_types())
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
        return self._application_pb(loaded)

    def GetApplication(self, request, context):  # noqa: N802
        tenant = require_tenant(request.tenant)
        return self._application_pb(self._load(tenant, request.application_id))

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
                a = self._application_pb(self._load(tenant, row.id))
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

    def _run_pb(self, loaded: Loaded, r: m.Run) -> pb.ProfileRun:
        return pb.ProfileRun(
            ordinal=r.ordinal, configuration=_config_pb(r.config),
            input=pb.ProfileRun.INPUT_BENCHMARK if r.input == BENCHMARK else pb.ProfileRun.INPUT_PRODUCTION,
            ok=r.ok, error=r.error, execution_time_s=r.time_s, cost=r.cost, cpu_percent=r.cpu_percent or 0.0,
            memory_percent=r.memory_percent or 0.0, session_id=r.session_id, reason=r.reason)

    def _session_pb(self, s: m.Session) -> pb.ProfilingSession:
        return pb.ProfilingSession(id=s.id, application_id=s.application_id, profiler=s.profiler,
                                   state=_SESSION_STATE[s.state], runs=s.runs, max_runs=s.max_runs, spent=s.spent,
                                   message=s.message, started_at=s.started_at, ended_at=s.ended_at)

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
        out = pb.PerformanceModel(application_id=loaded.app.id, runs=[self._run_pb(loaded, r) for r in runs],
                                  sessions=[self._session_pb(x) for x in sessions],
                                  updated_at=model.updated_at if model else 0.0,
                                  runs_left_out=max(0, (total or 0) - len(runs)),
                                  sessions_left_out=max(0, (sessions_total or 0) - len(sessions)))
        for p in (model.frontier if model else []):
            out.frontier.append(pb.ProfileRun(configuration=_config_pb(p["config"]), ok=True,
                                              input=pb.ProfileRun.INPUT_PRODUCTION, execution_time_s=p["time_s"],
                                              cost=p["cost"], predicted=p["predicted"]))
        if model and model.extrapolation:
            x = model.extrapolation
            out.extrapolation.CopyFrom(pb.Extrapolation(family=x["family"], params=x["params"], r2=x["r2"],
                                                        points=x["points"], constraints=x.get("constraints", [])))
        return out

    # -- profiling -------------------------------------------------------------------
    def _history(self, loaded: Loaded) -> History | None:
        """Other applications of the tenant with the same dimensions, aligned to this space."""
        dims = [d.name for d in loaded.space.dims]
        with self.db.read() as s:
            others = [a.id for a in s.scalars(sql_select(m.Application).where(
                m.Application.tenant == loaded.app.tenant, m.Application.id != loaded.app.id))]
        rows_lt, rows_f = [], []
        for oid in others:
            try:
                other = self._load(loaded.app.tenant, oid)
            except StaleApplication as e:
                # Stored under older rules that now refuse it: no history to learn from, and no reason to fail
                # this application's session (ListApplications lists it, saying why).
                log.warning("warm start: left out an application today's checks refuse",
                            extra={"application": oid, "why": e.why})
                continue
            if [d.name for d in other.space.dims] != dims:
                continue
            lt = np.full(len(loaded.space), np.nan)
            fl = np.full(len(loaded.space), np.nan)
            for o in self._observations(other):
                if o.input != PRODUCTION:
                    continue
                i = loaded.space.index(other.space.configs[o.config])
                if i is not None and o.time_s > 0:
                    # A failed run's time stays in (with `failed`): masking it lost the timeouts' message that a
                    # configuration is slow, and `bo --warm` found the fastest configuration less often (profilers
                    # bench, budget 10: 0.821 -> 0.750).
                    lt[i], fl[i] = math.log(o.time_s), 0.0 if o.ok else 1.0
            if np.isfinite(lt).any():
                rows_lt.append(lt)
                rows_f.append(fl)
        if not rows_lt:
            return None
        return History(np.array(rows_lt), np.array(rows_f))

    def StartProfiling(self, request, context):  # noqa: N802
        tenant = require_tenant(request.tenant)
        v = Violations()
        name = request.profiler or "bo"
        v.check(name in PROFILERS, "profiler", f"expected one of {', '.join(PROFILERS)}, got {name!r}")
        max_runs = request.max_runs or 10
        v.check(1 <= max_runs <= MAX_RUNS, "max_runs", f"between 1 and {MAX_RUNS}")
        v.check(request.max_cost >= 0 and math.isfinite(request.max_cost), "max_cost", "a cost >= 0 (0: no budget)")
        v.check(request.max_duration_s >= 0 and math.isfinite(request.max_duration_s), "max_duration_s",
                "seconds >= 0 (0: no limit)")
        v.check(math.isfinite(request.run_timeout_s) and 0 <= request.run_timeout_s <= MAX_RUN_TIMEOUT_S,
                "run_timeout_s", f"seconds, 0 (the service's default) to {MAX_RUN_TIMEOUT_S:g} "
                f"({MAX_RUN_TIMEOUT_S / 86400:g} days)")
        # numpy seeds its generator with non-negative integers only: a negative one would fail the session.
        v.check(request.seed >= 0, "seed", f"a whole number >= 0 (the same seed, the same choices), got {request.seed}")
        v.raise_if_any()
        loaded = self._load(tenant, request.application_id)
        # Taken before the session starts: refused, nothing runs; taken, it is given back when the stream ends.
        self._long_calls.take("StartProfiling")
        try:
            yield from self._start_and_follow(loaded, request, context, name, max_runs)
        finally:
            self._long_calls.give_back()

    def _start_and_follow(self, loaded: Loaded, request, context, name: str,  # type: ignore[no-untyped-def]
                          max_runs: int) -> Iterator[pb.ProfilingEvent]:
        sid = f"prof-{uuid.uuid4().hex[:12]}"
        with self._lock:
            if self._shutdown.is_set():
                raise Unavailable(STOPPING)
            if loaded.app.id in self._busy:
                raise FailedPrecondition(f"application {loaded.app.id} is being profiled by session "
                                         f"{self._busy[loaded.app.id]}; stop it first", reason=PROFILING_IN_PROGRESS,
                                         metadata={"session": self._busy[loaded.app.id]})
            self._busy[loaded.app.id] = sid
        runner = SessionRunner(sid)
        follower = runner.follow()
        try:
            row = m.Session(id=sid, application_id=loaded.app.id, profiler=name, state="running", runs=0,
                            max_runs=max_runs, spent=0.0, message="",
                            params={"max_cost": request.max_cost, "max_duration_s": request.max_duration_s,
                                    "seed": request.seed, "warm_start": request.warm_start},
                            started_at=self.clock.now(), ended_at=0.0, owner=str(self.owner),
                            heartbeat_at=time.time())
            self._add_session(row)
            with self._lock:
                # stop() sets the flag and takes the sessions to stop under this lock: a session registered
                # here is one it stops and waits for; after it, the session never starts.
                stopping = self._shutdown.is_set()
                if not stopping:
                    self._sessions[sid] = runner
                    runner.thread = threading.Thread(target=self._profile, name=f"profile-{sid}", daemon=True,
                                                     args=(loaded, row, request, runner, tenants.bearer(context)))
                    runner.thread.start()
            if stopping:
                self._end_unstarted(sid)
                raise Unavailable(STOPPING)
        except BaseException:
            with self._lock:
                self._busy.pop(loaded.app.id, None)
            raise
        yield pb.ProfilingEvent(session=self._session_pb(row))
        while True:
            try:
                event, final = follower.get(timeout=1.0)
            except queue.Empty:
                if not context.is_active():
                    return
                continue
            yield event
            if final:
                return

    def _end_unstarted(self, sid: str) -> None:
        """A session inserted while the service began to stop: it ends STOPPED without a run."""
        def end(s) -> None:  # type: ignore[no-untyped-def]
            s.execute(sql_update(m.Session).where(m.Session.id == sid, m.Session.state == "running",
                                                  m.Session.owner == str(self.owner)).values(
                state="stopped", message="stopped: the service stopped before the session's first run",
                ended_at=self.clock.now()))
        self.db.transact(end)

    def _add_session(self, row: m.Session) -> None:
        """Insert `row` unless a session runs on its application in any AM process (one whose owner is gone
        ends as interrupted first)."""
        ended: set[str] = set()

        def add(s) -> None:  # type: ignore[no-untyped-def]
            ended.clear()
            other = s.scalars(sql_select(m.Session).where(m.Session.application_id == row.application_id,
                                                          m.Session.state == "running")).first()
            if other is not None:
                why = self._gone(other.owner, other.heartbeat_at)
                if why is None:
                    raise FailedPrecondition(f"application {row.application_id} is being profiled by session "
                                             f"{other.id} (in AM process {other.owner}); stop it first",
                                             reason=PROFILING_IN_PROGRESS, metadata={"session": other.id})
                if self._end_gone_session(s, other, why):
                    ended.add(other.id)
            s.add(row)
        try:
            self.db.transact(add)
        except IntegrityError:
            # Another AM process started one between our look and our insert (the index allows one running).
            raise FailedPrecondition(f"application {row.application_id} is being profiled by a session of "
                                     "another AM process; stop it first", reason=PROFILING_IN_PROGRESS) from None
        if ended:
            self._release_pending(ended)

    def _profile(self, loaded: Loaded, row: m.Session, request, runner: SessionRunner,  # type: ignore[no-untyped-def]
                 tenant_token: str = "") -> None:
        sid = row.id
        state, message, frontier_size = "failed", "", 0
        try:
            # The session's stop flag cancels the run in progress (StopProfiling, or the service stopping).
            backend = self._backend(loaded, cancelled=runner.stop, cancel_reason=STOPPED_RUN,
                                    tenant_token=tenant_token)
            prices = loaded.prices_from(backend, self.clock.now(), self.config.price_ttl_s)
            history = self._history(loaded) if request.warm_start else None
            prof = PROFILERS[row.profiler](loaded.space, np.random.default_rng(request.seed), prices=prices,
                                           history=history, max_runs=row.max_runs,
                                           has_benchmark=backend.has_benchmark)
            before = self._observations(loaded)
            offset = len(before)
            timeout = request.run_timeout_s or self.config.run_timeout_s
            reasons: dict[int, str] = {}

            made = 0
            spent = 0.0
            # The stop rule (duration, budget) that cut a run short: the session ends by it, after that run.
            ended_by = ""
            unrun: Observation | None = None
            started = self.clock.now()

            def limit_for(p: Proposal) -> tuple[float, str]:
                """The run's time limit and the rule that sets it: run_timeout_s, or, when less, what is left of
                the session's duration or of its budget at the configuration's price (when quoted). A run is
                bounded, not only the gap between runs: one would otherwise overrun a duration with seconds left
                by up to run_timeout_s. Services' start-up and the reservation come on top of the agent's limit,
                so a session may overrun its rule by that much."""
                limit, rule = timeout, "run_timeout_s"
                if request.max_duration_s > 0:
                    left = request.max_duration_s - (self.clock.now() - started)
                    if left < limit:
                        limit, rule = left, "duration"
                price = float(prices[p.config])     # per second; NaN: the CRS could not quote it
                if request.max_cost > 0 and math.isfinite(price) and price > 0:
                    left = (request.max_cost - spent) / price
                    if left < limit:
                        limit, rule = left, "budget"
                return limit, rule

            def execute(p: Proposal) -> Observation:
                nonlocal made, spent, ended_by, unrun
                limit, rule = limit_for(p)
                if limit <= 0:
                    # The duration ran out while the profiler chose (after the runner's check): no run, and the
                    # session ends by its rule. An agent takes a limit of 0 as none.
                    ended_by = rule
                    unrun = Observation(p.config, False, 0.0, 0.0, p.input, transient=True,
                                        error=f"stopped: the session's {rule} ran out before this run started")
                    return unrun
                made += 1
                reasons[p.config] = p.why
                o = backend.run(p, request_id=reservation_request_id(sid, made), timeout_s=limit).observation
                spent += o.cost
                if (rule != "run_timeout_s" and not o.ok and not o.transient
                        and o.error.split(":")[0].strip() == "timeout"):
                    # Cut short by the session's own rule, not by run_timeout_s: says nothing of the configuration
                    # (as a run the agent ended from outside), and the rule ends the session.
                    ended_by = rule
                    setting = "max_duration_s" if rule == "duration" else "max_cost"
                    return replace(o, transient=True, error=(
                        f"timeout: cut at {limit:.4g} s, what was left of the session's {rule} ({setting}="
                        f"{getattr(request, setting):g}); not a failure of the configuration"))
                return o if o.ok or o.transient or not transient_error(o.error) else replace(o, transient=True)

            def on_run(p: Proposal, o: Observation, obs: list[Observation]) -> None:
                nonlocal frontier_size
                if o is unrun:
                    return      # nothing ran: nothing to record
                cfg = loaded.space.configs[o.config]
                run = m.Run(application_id=loaded.app.id, session_id=sid, ordinal=len(obs), config=cfg, input=o.input,
                            ok=o.ok, error=bounded_error(o.error), time_s=o.time_s, cost=o.cost, cpu_percent=o.cpu_percent,
                            memory_percent=o.memory_percent, reason=p.why, created_at=self.clock.now(),
                            transient=o.transient)

                def save(s) -> tuple[m.Session, list[Point]]:  # type: ignore[no-untyped-def]
                    s.add(run)
                    srow = s.get(m.Session, sid)
                    srow.runs += 1
                    srow.spent += o.cost
                    return srow, self._refresh_in(s, loaded)
                srow, front = self.db.transact(save)
                frontier_size = len(front)
                runner.publish(pb.ProfilingEvent(session=self._session_pb(srow), run=self._run_pb(loaded, run),
                                                 frontier_size=frontier_size))

            patience = Patience(self.config.transient_backoff_s, self.config.transient_backoff_max_s,
                                self.config.transient_give_up_s)
            # The wait between transient failures ends as soon as the session is stopped.
            obs, why = profile(prof, execute, StopRules(row.max_runs, request.max_cost, request.max_duration_s),
                               clock=self.clock, stopped=lambda: runner.stop.is_set() or bool(ended_by),
                               on_run=on_run, observed=before, patience=patience, wait=runner.stop.wait,
                               again=cloud_away)
            if why == "stopped" and ended_by and not runner.stop.is_set():
                why = ended_by
            if unrun is not None:
                obs = [o for o in obs if o is not unrun]
            preds = [{"config": loaded.space.configs[c], "time_s": t, "cost": k}
                     for c, t, k in prof.predictions(obs)]
            fit = getattr(prof, "fit", None)
            if preds or fit:
                frontier_size = len(self._refresh_model(loaded, preds, fit))
            state = {"stopped": "stopped", "transient": "failed"}.get(why, "done")
            # A profiler that ended short of its runs says why (e.g. no benchmark run to extrapolate from).
            message = prof.ended if why == "exhausted" and prof.ended else why
            if why == "transient":
                message = self._gave_up(obs[offset:], patience)
            if prof.note:
                message = f"{message}; {prof.note}"
            log.info("profiling ended", extra={"session": sid, "why": why, "runs": len(obs) - offset})
        except Exception as e:  # noqa: BLE001 - the session records the failure; the service goes on
            log.exception("profiling failed", extra={"session": sid})
            message = f"{type(e).__name__}: {e}"
        finally:
            def end(s) -> m.Session:  # type: ignore[no-untyped-def]
                srow = s.get(m.Session, sid)
                if srow.state != "running" or srow.owner != str(self.owner):
                    # Taken as interrupted by another AM process meanwhile: that ending stands.
                    log.warning("the session was ended by another AM process while it ran; its end here is not "
                                "recorded", extra={"session": sid, "state": srow.state})
                    return srow
                srow.state, srow.message, srow.ended_at = state, message, self.clock.now()
                return srow
            srow = self.db.transact(end)
            with self._lock:
                self._busy.pop(loaded.app.id, None)
                # Nothing reads the runner once its last event is out: the streams following it hold their
                # own queues, and GetModel and StopProfiling read the session's row.
                self._sessions.pop(sid, None)
            runner.done.set()
            runner.publish(pb.ProfilingEvent(session=self._session_pb(srow), frontier_size=frontier_size), final=True)

    @staticmethod
    def _gave_up(obs: list[Observation], patience: Patience) -> str:
        """Why a session ended on runs that failed through no fault of their configuration, one after another."""
        streak = len(obs) - next((i + 1 for i in range(len(obs) - 1, -1, -1) if not obs[i].transient), 0)
        measured = sum(1 for o in obs if not o.transient)
        return (f"transient: the last {streak} run(s) in a row failed through no fault of their configuration (the "
                f"CRS or a resource manager away, or no room), and the session waits at most "
                f"{patience.give_up_s:g} s or {patience.max_in_row} runs for the cloud to come back (the last: "
                f"{obs[-1].error[:300] if obs else 'none'}); {measured} run(s) were measured and are in the "
                "model: profile again once the cloud can run them")

    def StopProfiling(self, request, context):  # noqa: N802
        tenant = require_tenant(request.tenant)
        if not request.session_id:
            raise InvalidArgument.of("session_id", "required")
        with self.db.read() as s:
            row = s.get(m.Session, request.session_id)
            app = s.get(m.Application, row.application_id) if row else None
        if row is None or app is None:
            raise NotFound(f"no profiling session {request.session_id}")
        owned(tenant, app.tenant, f"session {request.session_id}")
        runner = self._sessions.get(row.id)
        elsewhere = ""
        if runner is not None:
            # The run in progress is cancelled through the stop flag: waiting a moment lets it end STOPPED in
            # this answer; a run slow to stop (its program ignoring the kill) does not hold the call.
            runner.stop.set()
            runner.done.wait(timeout=STOP_ANSWER_S)
        elif row.state == "running":
            if (why := self._gone(row.owner, row.heartbeat_at)) is not None:
                # Its process is gone: it ends now, and what its runs reserved is released, that only -- a sweep
                # here would make the caller wait on every tenant's leftovers; the background one settles those.
                if self.db.transact(lambda s: self._end_gone_session(s, row, why)):
                    self._release_pending({row.id})
            else:
                # Run by another AM process: its heartbeat sees the request and stops it.
                def ask(s) -> None:  # type: ignore[no-untyped-def]
                    s.execute(sql_update(m.Session).where(m.Session.id == row.id, m.Session.state == "running")
                              .values(stop_requested=True))
                self.db.transact(ask)
                elsewhere = (f" by the AM process running it ({row.owner}) within {self.config.heartbeat_s:g} s "
                             "of now")
        with self.db.read() as s:
            out = self._session_pb(s.get(m.Session, request.session_id))
        if out.state == pb.ProfilingSession.STATE_RUNNING:
            out.message = (f"stopping: the run in progress is being cancelled{elsewhere} (its reservation "
                           "released); the session ends STOPPED shortly (GetModel shows it)")
        return out

    # -- execution -------------------------------------------------------------------
    @staticmethod
    def _execution_pb(e: m.Execution) -> pb.ApplicationExecution:
        return pb.ApplicationExecution(
            id=e.id, application_id=e.application_id, tenant=e.tenant, state=_EXEC_STATE[e.state],
            configuration=_config_pb(e.config), predicted_time_s=e.predicted_time_s,
            predicted_cost=e.predicted_cost, measured_time_s=e.measured_time_s, measured_cost=e.measured_cost,
            slo_met=e.slo_met, error=e.error, output_tail=e.output_tail, reservation_id=e.reservation_id,
            started_at=e.started_at, ended_at=e.ended_at, slo=e.slo)

    def ExecuteApplication(self, request, context):  # noqa: N802
        tenant = require_tenant(request.tenant)
        loaded = self._load(tenant, request.application_id)
        v = Violations()
        v.check(math.isfinite(request.timeout_s) and 0 <= request.timeout_s <= MAX_RUN_TIMEOUT_S,
                "timeout_s", f"seconds, 0 (the service's default) to {MAX_RUN_TIMEOUT_S:g} "
                f"({MAX_RUN_TIMEOUT_S / 86400:g} days)")
        v.check(len(request.request_id) <= 128, "request_id", "at most 128 characters")
        v.check(len(request.slo_json.encode()) <= MAX_SLO_BYTES, "slo_json",
                f"at most {MAX_SLO_BYTES} bytes ({MAX_SLO_BYTES // 1024} KiB) of UTF-8")
        v.raise_if_any()
        slo = self._execution_slo(loaded, request.slo_json) if request.slo_json else loaded.slo
        if request.request_id and (prior := self._prior_execution(tenant, request.request_id)) is not None:
            self._same_request((prior.application_id, prior.slo) == (loaded.app.id, slo.describe()))
            return self._execution_pb(prior)
        self._long_calls.take("ExecuteApplication")
        try:
            return self._execute(tenant, loaded, slo, request, context)
        finally:
            self._long_calls.give_back()

    def _execute(self, tenant: str, loaded: Loaded, slo: Slo, request,  # type: ignore[no-untyped-def]
                 context) -> pb.ApplicationExecution:
        with self.db.read() as s:
            model = s.get(m.Model, loaded.app.id)
        front = [Point(p["config"], p["time_s"], p["cost"], True, p["predicted"]) for p in (model.frontier or [])]
        try:
            if not front:
                self._why_no_model(loaded)
            chosen = select(front, slo)
        except FailedPrecondition:
            if not request.online:
                raise
            chosen = self._explore(loaded)
        i = loaded.space.index(chosen.config)
        if i is None:
            raise FailedPrecondition("the model's configuration is no longer in the search space; profile again",
                                     reason=NO_MODEL)
        row = m.Execution(id=f"exec-{uuid.uuid4().hex[:12]}", application_id=loaded.app.id, tenant=tenant,
                          request_id=request.request_id or None, state="running", config=chosen.config,
                          slo=slo.describe(), predicted_time_s=chosen.time_s, predicted_cost=chosen.cost,
                          started_at=self.clock.now(), owner=str(self.owner), heartbeat_at=time.time())
        earlier = self._add_once(request.request_id, lambda: self._prior_execution(tenant, request.request_id),
                                 lambda s: s.add(row))
        if earlier is not None:
            # A concurrent retry won: it runs the application; this one answers with what it has so far.
            self._same_request((earlier.application_id, earlier.slo) == (loaded.app.id, slo.describe()))
            return self._execution_pb(earlier)
        # Once the RPC ends (the client cancelled, or its deadline passed) nobody waits for the result: the
        # run stops instead of holding its reservation and this worker thread to the end.
        cancelled = threading.Event()
        if not context.add_callback(cancelled.set):
            cancelled.set()
        # The service stopping cancels it too (its reservation released, not left behind).
        with self._lock:
            self._executions.add(cancelled)
            self._execution_ids[row.id] = cancelled
        if self._shutdown.is_set():
            cancelled.set()
        limit = request.timeout_s or self._execution_limit(chosen)
        try:
            detail = self._backend(loaded, slo, cancelled, tenant_token=tenants.bearer(context)).run(
                Proposal(i), request_id=reservation_request_id(row.id), timeout_s=limit)
        except Exception as exc:
            # Never an execution left "running" (a retry with its request id would return it so forever).
            why = f"{type(exc).__name__}: {exc}"[:2000]

            def fail(s):  # type: ignore[no-untyped-def]
                e = s.get(m.Execution, row.id)
                if e.state == "running" and e.owner == str(self.owner):    # else another process ended it
                    e.state, e.error, e.ended_at = "failed", why, self.clock.now()
            self.db.transact(fail)
            raise
        finally:
            with self._executions_done:
                self._executions.discard(cancelled)
                self._execution_ids.pop(row.id, None)
                self._executions_done.notify_all()
        o = detail.observation
        timed_out = not o.ok and o.error.split(":")[0].strip() == "timeout"
        if timed_out and not request.timeout_s and chosen.time_s > 0:
            o = replace(o, error=f"timeout: the run took longer than {limit:g} s, the limit given when the request "
                        f"names none (the larger of run_timeout_s={self.config.run_timeout_s:g} and "
                        f"{PREDICTED_MARGIN:g} x the model's {chosen.time_s:.4g} s, at most "
                        f"{MAX_RUN_TIMEOUT_S / 86400:g} days); give a longer timeout_s if it needs more")
        if not o.ok and not o.transient and (transient_error(o.error) or (timed_out and request.timeout_s)):
            # Refused or lost, or killed at the bound this caller chose (the bound was short): says nothing of the
            # configuration, which stays on the frontier. Killed at the limit drawn from the model, it took more
            # than twice the model's time (or run_timeout_s): the model's point is wrong, and the configuration
            # leaves the frontier as a run failing in a profiling session would (kept, the next execution would
            # choose it again and wait as long again).
            o = replace(o, transient=True)

        def finish(s) -> m.Execution:  # type: ignore[no-untyped-def]
            e = s.get(m.Execution, row.id)
            if e.state != "running" or e.owner != str(self.owner):
                # Taken as interrupted by another AM process while it ran (its reservation released there):
                # that ending stands, and the run is no measurement.
                log.warning("the execution was ended by another AM process while it ran; its end here is not "
                            "recorded", extra={"execution": e.id, "state": e.state})
                return e
            e.state = "succeeded" if o.ok else "failed"
            e.measured_time_s, e.measured_cost = o.time_s, o.cost
            e.slo_met = o.ok and slo.holds(o.time_s, o.cost)
            e.error, e.output_tail, e.reservation_id = bounded_error(o.error), detail.output_tail, detail.reservation_id
            e.ended_at = self.clock.now()
            if detail.cancelled:
                return e    # cut short by the client: no measurement of the configuration
            # Online profiling (§4.3.5): the real execution is one more measurement of the model.
            s.add(m.Run(application_id=loaded.app.id, session_id=f"execution:{row.id}", ordinal=0,
                        config=chosen.config, input=PRODUCTION, ok=o.ok, error=bounded_error(o.error), time_s=o.time_s,
                        cost=o.cost,
                        cpu_percent=o.cpu_percent, memory_percent=o.memory_percent, reason="execution under the SLO",
                        created_at=self.clock.now(), transient=o.transient))
            if not o.transient:
                self._refresh_in(s, loaded)     # in this transaction: a crash cannot part the run from the model
            return e
        e = self.db.transact(finish)
        return self._execution_pb(e)

    def _execution_limit(self, chosen: Point) -> float:
        """How long an execution whose request names no timeout_s may run: the service's run_timeout_s, or
        PREDICTED_MARGIN x the time the model gives the chosen configuration when that is longer (a run the model
        expects to take longer than run_timeout_s would otherwise be killed before it could end), at most
        MAX_RUN_TIMEOUT_S."""
        predicted = chosen.time_s if math.isfinite(chosen.time_s) and chosen.time_s > 0 else 0.0
        return min(MAX_RUN_TIMEOUT_S, max(self.config.run_timeout_s, PREDICTED_MARGIN * predicted))

    def _why_no_model(self, loaded: Loaded) -> None:
        """No frontier: say whether nothing ran, or everything that ran failed (and how, most often)."""
        with self.db.read() as s:
            runs = list(s.scalars(sql_select(m.Run).where(m.Run.application_id == loaded.app.id,
                                                          m.Run.input == PRODUCTION)))
        unmeasured = [r for r in runs if r.transient]
        runs = [r for r in runs if not r.transient]
        if not runs and unmeasured:
            top, n = Counter(r.error or "no error recorded" for r in unmeasured).most_common(1)[0]
            raise FailedPrecondition(
                f"no performance model yet: none of the {len(unmeasured)} run(s) could be measured ({n} of them: "
                f"{top[:300]}), which says nothing of the configurations; profile again when the cloud has room",
                reason=NO_MODEL)
        if not runs:
            raise FailedPrecondition("no performance model yet: profile the application first", reason=NO_MODEL)
        errors = Counter(r.error or "no error recorded" for r in runs if not r.ok)
        if len(errors) and all(not r.ok for r in runs):
            top, n = errors.most_common(1)[0]
            raise FailedPrecondition(
                f"no performance model: all {len(runs)} run(s) on {len({json.dumps(r.config, sort_keys=True) for r in runs})} "
                f"configuration(s) failed ({n} of them: {top[:300]}); fix the application or its resources, then "
                f"profile again", reason=NO_MODEL)

    @staticmethod
    def _execution_slo(loaded: Loaded, text: str) -> Slo:
        """An execution's own SLO: its bounds; the input parameters are the ones the model was profiled on.

        Other parameters are another input: the frontier says nothing of it (and the run, recorded as one more
        measurement, would skew the model), so they are refused; left out, they are the application's.
        """
        slo = parse_slo(text, loaded.manifest, "slo_json")
        given = _get(slo.raw, "Parameters") or _get(slo.raw, "ExecutionArgs")
        if not given:
            return replace(slo, parameters=dict(loaded.slo.parameters))
        if slo.parameters != loaded.slo.parameters:
            differ = sorted(k for k in {*slo.parameters, *loaded.slo.parameters}
                            if slo.parameters.get(k) != loaded.slo.parameters.get(k))
            raise InvalidArgument.of("slo_json.Parameters", "the model was profiled with " + ", ".join(
                f"{k}={loaded.slo.parameters.get(k)!r}" for k in differ) + "; leave Parameters out, or submit "
                "the application again with these parameters and profile it")
        return slo

    def _explore(self, loaded: Loaded) -> Point:
        """Online profiling: the next configuration the model-based profiler would try."""
        prices = loaded.prices_from(self._backend(loaded), self.clock.now(), self.config.price_ttl_s)
        prof = PROFILERS["bo"](loaded.space, np.random.default_rng(0), prices=prices,
                               max_runs=MAX_RUNS)
        proposal = prof.propose(self._observations(loaded))
        if proposal is None:
            # The profiler says why when that is not simply "all run" (the rest never fit: priced out).
            why = getattr(prof, "ended", "") or "every configuration has been run"
            raise FailedPrecondition(f"{why} and none satisfies the SLO", reason=SLO_UNATTAINABLE)
        return Point(loaded.space.configs[proposal.config], 0.0, 0.0, True)

    def ListExecutions(self, request, context):  # noqa: N802
        tenant = require_tenant(request.tenant)
        q = sql_select(m.Execution).where(m.Execution.tenant == tenant)
        if request.application_id:
            self._load(tenant, request.application_id)
            q = q.where(m.Execution.application_id == request.application_id)
        with self.db.read() as s:
            rows, token = paging.page(s, q, [m.Execution.started_at, m.Execution.id], request.page_size,
                                      request.page_token)
        # Rows are the tenant's by the query: no application is loaded (one a newer version no longer accepts
        # would fail the whole listing).
        return pb.ListExecutionsResponse(executions=[self._execution_pb(r) for r in rows], next_page_token=token)


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
