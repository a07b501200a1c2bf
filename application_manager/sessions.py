"""Profiling sessions: their start (one at a time per application, across AM processes), the thread
that drives a profiler through application_manager.runner, the streams following it, and their stop.
"""

from __future__ import annotations

import logging
import math
import queue
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import replace
from typing import TYPE_CHECKING

import numpy as np
from sqlalchemy import select as sql_select
from sqlalchemy import update as sql_update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session as DbSession

from application_manager import models as m
from application_manager.limits import MAX_RUN_TIMEOUT_S, MAX_RUNS, bounded_error
from application_manager.loaded import Loaded, StaleApplication
from application_manager.local import COST_LIMIT, cloud_away, transient_error
from application_manager.messages import run_pb, session_pb
from application_manager.model import Point
from application_manager.profilers import PRODUCTION, PROFILERS, History, Observation, Proposal
from application_manager.releases import reservation_request_id
from application_manager.runner import Patience, StopRules, profile
from harness.v1 import application_manager_pb2 as pb
from services import tenants
from services.errors import (
    PROFILING_IN_PROGRESS,
    FailedPrecondition,
    HarnessError,
    InvalidArgument,
    NotFound,
    Unavailable,
    Violations,
    owned,
    require_tenant,
)

if TYPE_CHECKING:
    from application_manager.owners import Owner
    from application_manager.releases import Releases
    from application_manager.service import AppManagerConfig
    from services.clock import Clock
    from services.db import Database
    from services.server import CallCap

# The service's logger: the records keep the name they had before this module was split out of
# application_manager.service (log filters read it).
log = logging.getLogger("application_manager.service")

# How long StopProfiling waits for the cancelled run to wind down (stop its modules, release its reservation)
# before answering with the session as it is then (still RUNNING; it ends STOPPED by itself).
STOP_ANSWER_S = 1.5
STOPPING = ("the Application Manager is stopping: start profiling again once it is back (or through another AM "
            "process on the same database)")
STOPPED_RUN = "stopped: profiling was stopped (StopProfiling, or the service stopping) while it ran"


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


class ProfilingSessions:
    """The ApplicationManager's profiling calls (StartProfiling, StopProfiling) and the sessions they run.

    A mixin, not a part the servicer composes: a session reads and changes most of the servicer's state -- the
    sessions this process runs and the applications they hold (under its lock), the shutdown flag, the cap on long
    calls, the database, owner and clock -- and calls its loading (`_load`, `_backend`), its model (`_observations`,
    `_refresh_in`, `_refresh_model`), its look at owners (`_gone`) and its releases. Set by
    ApplicationManager.__init__; annotated here.
    """

    config: AppManagerConfig
    clock: Clock
    db: Database
    owner: Owner
    _lock: threading.Lock
    _sessions: dict[str, SessionRunner]
    _busy: dict[str, str]
    _shutdown: threading.Event
    _long_calls: CallCap
    _releases: Releases

    def _end_gone_session(self, s: DbSession, row: m.Session, why: str) -> bool:
        """Fail `row` (running, its owner gone) unless another process did first, marked for its runs'
        reservations to be released (Releases.release_pending); whether this call ended it."""
        return bool(s.execute(sql_update(m.Session).where(
            m.Session.id == row.id, m.Session.state == "running",
            m.Session.owner.is_not_distinct_from(row.owner)).values(
            state="failed", message=why, ended_at=self.clock.now(), release_pending=True)).rowcount)

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
        yield pb.ProfilingEvent(session=session_pb(row))
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
            self._releases.release_pending(ended)

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
            recorded = 0        # runs recorded: each one's ordinal within the session
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
                if request.max_cost > 0 and spent >= request.max_cost:
                    limit, rule = 0.0, "budget"
                elif request.max_cost > 0 and math.isfinite(price) and price > 0 and not backend.replaying:
                    # A live run costs its price for its time. A replayed one costs what was measured: the agent
                    # ends it at `cost_left` (execute), and a limit from the price could cut it short of that.
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
                # A replayed run costs what the measured run cost, not the quoted price for its time: the agent
                # ends it at what is left of the budget (a live run's time limit above already does).
                cost_left = max(0.0, request.max_cost - spent) if request.max_cost > 0 else 0.0
                o = backend.run(p, request_id=reservation_request_id(sid, made), timeout_s=limit,
                                cost_limit=cost_left).observation
                spent += o.cost
                ended = o.error.split(":")[0].strip() if not o.ok and not o.transient else ""
                if ended == COST_LIMIT:
                    # Cut short by the session's own rule, not by run_timeout_s: says nothing of the configuration
                    # (as a run the agent ended from outside), and the rule ends the session.
                    ended_by = "budget"
                    return replace(o, transient=True, error=(
                        f"cost limit: cut at {o.time_s:.4g} s, where its cost reached what was left of the "
                        f"session's budget (max_cost={request.max_cost:g}); not a failure of the configuration"))
                if rule == "budget" and ended == "timeout" and backend.replaying and spent < request.max_cost:
                    # The session's first run, bounded by a time from the quote before the agents were seen to
                    # replay: it cost what was measured for that long, not what was left. Not a measurement of its
                    # configuration, and the session goes on (its next runs are bounded by their cost).
                    return replace(o, transient=True, error=(
                        f"timeout: cut at {limit:.4g} s, a limit from the quoted price; the run was replayed (it "
                        "costs what was measured) and left budget: not a failure of the configuration"))
                if rule == "run_timeout_s" and ended == "timeout" and 0 < request.run_timeout_s < \
                        self.config.run_timeout_s:
                    # This session's own bound, shorter than the service's: the run takes longer than this caller
                    # would wait. A failed run of this session (it counts, and is not retried here), but stored as
                    # no evidence about the configuration: a later session may run it (a failure would rule it out
                    # for good). At the service's bound, or beyond, it is the configuration's failure.
                    return replace(o, session_only=True, error=f"timeout: cut at {limit:.4g} s, this session's "
                                                               "run_timeout_s; a later session may run it again")
                if rule != "run_timeout_s" and ended == "timeout":
                    ended_by = rule
                    setting = "max_duration_s" if rule == "duration" else "max_cost"
                    return replace(o, transient=True, error=(
                        f"timeout: cut at {limit:.4g} s, what was left of the session's {rule} ({setting}="
                        f"{getattr(request, setting):g}); not a failure of the configuration"))
                return o if o.ok or o.transient or not transient_error(o.error) else replace(o, transient=True)

            def on_run(p: Proposal, o: Observation, obs: list[Observation]) -> None:
                nonlocal frontier_size, recorded
                if o is unrun:
                    return      # nothing ran: nothing to record
                recorded += 1
                cfg = loaded.space.configs[o.config]
                run = m.Run(application_id=loaded.app.id, session_id=sid, ordinal=recorded, config=cfg, input=o.input,
                            ok=o.ok, error=bounded_error(o.error), time_s=o.time_s, cost=o.cost, cpu_percent=o.cpu_percent,
                            memory_percent=o.memory_percent, reason=p.why, created_at=self.clock.now(),
                            transient=o.transient or o.session_only)

                def save(s) -> tuple[m.Session, list[Point]]:  # type: ignore[no-untyped-def]
                    s.add(run)
                    srow = s.get(m.Session, sid)
                    srow.runs += 1
                    srow.spent += o.cost
                    return srow, self._refresh_in(s, loaded)
                srow, front = self.db.transact(save)
                frontier_size = len(front)
                runner.publish(pb.ProfilingEvent(session=session_pb(srow), run=run_pb(run),
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
        except HarnessError as e:   # a refusal meant for the caller (a service's answer, a limit): said as it is
            log.exception("profiling failed", extra={"session": sid})
            message = f"{type(e).__name__}: {e}"
        except Exception as e:  # noqa: BLE001 - the session records the failure; the service goes on
            # A bug's text (a library's ValueError, say) tells the tenant nothing they can fix: the log has it.
            log.exception("profiling failed", extra={"session": sid})
            message = f"an internal error of the application manager ({type(e).__name__}); its log has the " \
                      f"details under session {sid}"
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
            runner.publish(pb.ProfilingEvent(session=session_pb(srow), frontier_size=frontier_size), final=True)

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
                    self._releases.release_pending({row.id})
            else:
                # Run by another AM process: its heartbeat sees the request and stops it.
                def ask(s) -> None:  # type: ignore[no-untyped-def]
                    s.execute(sql_update(m.Session).where(m.Session.id == row.id, m.Session.state == "running")
                              .values(stop_requested=True))
                self.db.transact(ask)
                elsewhere = (f" by the AM process running it ({row.owner}) within {self.config.heartbeat_s:g} s "
                             "of now")
        with self.db.read() as s:
            out = session_pb(s.get(m.Session, request.session_id))
        if out.state == pb.ProfilingSession.STATE_RUNNING:
            out.message = (f"stopping: the run in progress (or the pricing of the configurations before the first "
                           f"run) is being cancelled{elsewhere}, a run's reservation released; the session ends "
                           "STOPPED shortly (GetModel shows it)")
        return out
