"""The FPGA job manager's Hydrogen policies (seed 001 §IV; `irm_fpga.jobs`): the ready queue and its dispatch.

A registered job waits in the ready queue (state "queued", no group); on every event and control round the
scheduler (`irm_fpga.qos.dispatch.decide`, the code the simulator runs, or a plug-in in a worker process)
picks the jobs of the window to start now and their devices, and each gets its group of that size until it
retires. The managed modes' elasticity manager sets the pool the jobs may use, within [pool_min, pool_max],
and the cost model (`hy.LearnedCostModel`) learns from every job run to its size.
"""

from __future__ import annotations

import logging
import threading
import uuid
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.engine import Row

from irm_fpga.job_models import FpgaJob, FpgaJobPool
from irm_fpga.jobs_config import JobsConfig
from irm_fpga.jobs_devices import JobDevices
from irm_fpga.jobs_groups import JobGroups
from irm_fpga.jobs_rows import ACTIVE, QUEUED, RETIRED, qos_job
from irm_fpga.qos import dispatch, plugins
from irm_fpga.qos import hydrogen as hy
from irm_fpga.qos.jobs import DEADLINE
from irm_fpga.qos.plugin_worker import PluginRunner
from irm_fpga.qos.plugins import is_external
from irm_fpga.qos.throughput import ControllerState, initial_state
from services.clock import Clock
from services.db import Database
from services.errors import HarnessError

# The job manager's one logger: its operators (and tests) follow the manager's records under one name.
log = logging.getLogger("irm_fpga.jobs")

DEFAULT_ACTION_S = 1.0          # Hydrogen policies: seconds per action on one device when a job gives none
WAKE_MARGIN_S = 0.1             # a wake for a held job comes this much (plus the decision's budget) before its limit
# Hydrogen: a failed scheduling decision (a plug-in's error or time-out, most often) is tried again by the next event
# or control round; from the second failure in a row on, not before min(control period, RETRY_FIRST_S) has passed,
# twice that after the third, and so on up to RETRY_MAX_S (`_decision_failed`); a decision that succeeds ends it.
RETRY_FIRST_S = 1.0
RETRY_MAX_S = 30.0
RETRY_SLACK = 0.1               # of the first delay: a round that comes this much early is not put off a whole period
MAX_LOGGED_FAILURES = 100       # distinct decision errors whose traceback is logged (then one line each time)
# Hydrogen: a decision that left jobs queued is made again once the first running job's predicted end has passed
# (it may have waited for those devices); for a job that has already overrun its prediction, whose end is only
# estimated, at most this long after the decision.
OVERDUE_RECHECK_MAX_S = 30.0
MAX_PREDICTED_S = 1e9           # an overrunning job's predicted time left at most (a rate near 0 would overflow)
FAILURE_LINE_CHARS = 500        # the most of a failed decision's error a repeated log line quotes


class HydrogenDispatch:
    """The ready queue and its decisions, as methods of the job manager (`irm_fpga.jobs.JobManager`).

    A mixin, not a part the manager composes, because a decision works under the manager's lock on most of its
    state: the active jobs (`_active`, `_retire_groupless`), the devices and groups (`devices`, `groups`), the
    throughput controllers and progress samples of the jobs it starts (`_states`, `_last`, written with their
    dispatch by `_update`), the WatchJobs streams (`_publish`, `_queued`) and the control thread's timer
    (`_timer`) that its wakes ring. Its own state (`_init_dispatch`) is the manager's too: `_loop` and `start`
    read it, and tests read and set `_wake_at`, `_pool_size`, `_plugin` and replace `_update` on the manager.
    """

    # The manager's, read here (`JobManager.__init__`).
    config: JobsConfig
    scheduler: dispatch.Scheduler | None
    orch: Any
    db: Database
    clock: Clock
    lock: threading.RLock
    devices: JobDevices
    groups: JobGroups
    _timer: threading.Condition
    _states: dict[str, ControllerState]
    _last: dict[str, tuple[float, int]]

    def _init_dispatch(self) -> None:
        # A plug-in decides in a worker process of its own, each call within plugin_timeout_s: one that loops
        # forever in this process would hold the manager's lock (and every request waiting on it) for good.
        self._plugin: PluginRunner | None = None
        if self.scheduler is not None and is_external(self.config.policy):
            self._plugin = PluginRunner(self.config.policy, timeout_s=self.config.plugin_timeout_s,
                                        late_after=self.config.late_after_s)
        self.cost = hy.LearnedCostModel()      # Hydrogen: fed with every job run to its size
        self._pool_size: int | None = None     # Hydrogen: the pool provisioned for jobs (None: the most)
        # Hydrogen: the inputs of the last decision (queue, running jobs, devices); a round that finds them
        # unchanged decides nothing, as the simulator decides on arrivals and ends only (a timer round that
        # re-ran Algorithm 3 walked the pool up and down with nothing arriving or ending).
        self._decided: tuple | None = None
        # Hydrogen: counts every job entering or leaving the ready queue (this manager is its only writer), so a
        # decision tells a changed queue without reading all of it (`_dispatch` reads the window's jobs only).
        self._queue_changes = 0
        # Hydrogen (`Scheduler.wakes`): when the last decision held back a job it could have started, the clock
        # time to decide again, before that job's start limit (the simulator's wake, `hy.wake_time`).
        self._wake_at: float | None = None
        # Hydrogen: the clock time at which the last decision is made again even if nothing it looked at changed
        # (`_dispatch`): the first predicted end of a running job it may have waited for, when jobs stayed queued.
        self._recheck_at: float | None = None
        # Hydrogen: failed decisions in a row, the clock time before which no decision is tried again (backing off
        # from a broken plug-in: `_decision_failed`), the errors whose traceback was logged, and what the queued jobs
        # are told meanwhile (their `waiting_reason`; "" once a decision succeeds).
        self._failures = 0
        self._retry_at: float | None = None
        self._logged_failures: set[str] = set()
        self._failure_reason = ""       # set by `_decision_failed`, cleared by `_decision_made`
        self._stall_reason = ""         # why no decision can be tried now (`_dispatch`), cleared once one can
        self._waiting_reason = ""       # the one queued jobs are told: the stall's, else the failure's
        self._untold = False            # it changed since queued jobs were last streamed
        # Hydrogen: what the last successful decision saw, for a queued job's `waiting_reason` while no failure or
        # stall is to be told (`queued_reason`): (clock time, pool, devices held, running jobs, jobs left queued,
        # whether it held back a job the free devices could have started).
        self._situation: tuple[float, int, int, int, int, bool] | None = None

    def wake_once(self) -> None:
        """Decide again if a held job's wake is due (`_wake_at`), whatever changed since the last decision."""
        with self.lock:
            now = self.clock.now()
            if self.scheduler is None or self._wake_at is None or now < self._wake_at:
                return
            self._wake_at = None
            self._decided = None
            self._dispatch(now)

    def _learn_from_history(self) -> None:
        """Hydrogen: the cost model learns from every job that ran to its size (dispatch to retirement)."""
        if self.scheduler is None:
            return
        with self.db.read() as s:       # in batches: years of retired jobs need not all be in memory at once
            query = select(FpgaJob).where(FpgaJob.state == RETIRED, FpgaJob.goal == DEADLINE)
            for r in s.scalars(query.execution_options(yield_per=500)):
                self._observe_run(r, r.retired_at)

    def _observe_run(self, row: FpgaJob, end: float) -> None:
        """One run the cost model can learn from: dispatched once on n devices, kept to its size.

        Its size must have been done by the servers' counters: the model is shared by every tenant of the design,
        and a tenant's own ReportProgress (a job "done" a millisecond after dispatch) must not make everyone's
        jobs look instant to the scheduler."""
        runs = [a for a in row.allocations if a[1] > 0]
        if len(runs) != 1 or row.observed_actions < row.size_actions:
            return                       # never dispatched, resized (EDF, throughput), retired early, or reported
        start, n = runs[0]
        if end > start and n >= 1:
            self.cost.observe(self._hjob(row, n), int(n), end - start)

    def _queue_length(self, tenant: str | None = None) -> int:
        """Jobs in the ready queue (`tenant`'s only, if given)."""
        q = select(func.count()).select_from(FpgaJob).where(FpgaJob.state == QUEUED)
        if tenant is not None:
            q = q.where(FpgaJob.tenant == tenant)
        with self.db.read() as s:
            return s.scalar(q) or 0

    def _window(self, hi: int) -> list[FpgaJob]:
        """The ready queue's jobs a decision looks at: the first `window` (in arrival order) of those whose minimum
        fits in `hi` devices (`dispatch.decide` leaves the others out before it takes its window)."""
        assert self.scheduler is not None
        with self.db.read() as s:
            return list(s.scalars(select(FpgaJob).where(FpgaJob.state == QUEUED, FpgaJob.min_devices <= hi)
                                  .order_by(FpgaJob.registered_at, FpgaJob.id).limit(self.scheduler.window)))

    def _wake_time(self, picked: list[str], now: float, early: float) -> float | None:
        """`hy.wake_time` of the queued jobs the decision did not pick (held back), read as one aggregate: `early`
        s before the first start deadline (arrival + late_after) still ahead of `now`."""
        late = self.config.late_after_s
        with self.db.read() as s:
            first = s.scalar(select(func.min(FpgaJob.registered_at)).where(
                FpgaJob.state == QUEUED, FpgaJob.id.not_in(picked), FpgaJob.registered_at + late - early > now))
        if first is None:
            return None
        t = first + late - early
        return t if t > now else None

    def _hjob(self, row: FpgaJob | Row, hi: int) -> hy.HJob:
        """The job as a Hydrogen scheduler sees it (seed 001 eq. 1: defaultTime = size x seconds per action)."""
        mx = max(row.min_devices, min(row.max_devices or hi, hi))
        return hy.HJob(row.id, row.registered_at, row.size_actions * (row.action_seconds or DEFAULT_ACTION_S),
                       row.min_devices, mx, row.priority, design=row.design, target=row.deadline_s,
                       actions=row.size_actions, tenant=row.tenant)

    def _recent_arrivals(self, now: float) -> list:
        """The deadline jobs registered in the last FORECAST_SPAN_S, for the schedulers that draw futures from
        them: the columns `_hjob` reads only (rows, not ORM objects: a burst's 2000 load in ~5 ms, not ~20)."""
        j = FpgaJob
        with self.db.read() as s:
            return list(s.execute(select(
                j.id, j.registered_at, j.size_actions, j.action_seconds, j.min_devices, j.max_devices, j.priority,
                j.design, j.deadline_s, j.tenant).where(j.goal == DEADLINE, j.registered_at >= now - hy.FORECAST_SPAN_S)))

    def _hydrogen_max(self, running: list[FpgaJob], pool: int | None = None) -> int:
        """The most the jobs' pool may hold: `pool` (default: `devices.pool(running)`) within jobs_pool_max."""
        hi = self.devices.pool(running) if pool is None else pool
        return min(hi, self.config.pool_max) if self.config.pool_max else hi

    def _provisioned(self, hi: int) -> int:
        """The pool now: the elasticity manager's last, within [pool_min, hi] (before any decision: hi).

        A single algorithm has no elasticity manager: its pool is all of `hi`, which grows back by itself when
        devices return (a server back from a timeout, another group retired).
        """
        assert self.scheduler is not None
        if not self.scheduler.elasticity:
            return hi
        return max(min(self._pool_size or hi, hi), min(self.scheduler.pool_min, hi))

    def _started_at(self, row: FpgaJob) -> float:
        return row.allocations[0][0] if row.allocations else row.registered_at

    def _overdue(self, row: FpgaJob, job: hy.HJob, now: float) -> bool:
        """Whether a running job has run past the cost model's time for it."""
        return self._started_at(row) + self.cost(job, max(1, row.devices)) <= now

    def _predicted_end(self, row: FpgaJob, job: hy.HJob, now: float) -> float:
        """When a running job is expected to end: its dispatch plus the cost model's time for it, as the simulator
        predicts (and its jobs end then). One that has run past that is not taken to end "now" (every decision
        would then wait on it as about to end, and hold free devices back for as long as it overruns): what is
        left of it at the rate it has achieved (the lower of its mean since dispatch and its last control
        period's, so a job that stalled is not expected to end soon), or, with no progress lately, as long again
        as it has run."""
        start = self._started_at(row)
        end = start + self.cost(job, max(1, row.devices))
        if end > now:
            return end
        ran = now - start
        done = max(row.observed_actions, row.reported_actions)
        left = max(0, row.size_actions - done)
        rate = min(done / ran, row.achieved_throughput) if ran > 0 else 0.0    # a cost model near 0 ends it at once
        return now + (min(left / rate, MAX_PREDICTED_S) if rate > 0 else ran)

    def _dispatch(self, now: float) -> None:
        """One scheduling decision over the ready queue (under the lock): start the jobs it picks.

        None while a server holding a running job's group does not answer (its devices would count as gone:
        the elastic pool would shrink for good on a timeout), nor when nothing changed since the last one
        (the queue, the running jobs, the devices, which queued jobs are late). Queued jobs are streamed after
        it if the reason they are told changed (once, with what it saw: `queued_reason`).
        """
        try:
            self._decide(now)
        finally:
            if self._untold:
                self._untold = False
                if self.watchers.has_subscribers():     # every queued job's waiting_reason changed
                    self._publish(self._queued())

    def _decide(self, now: float) -> None:
        assert self.scheduler is not None
        queued = self._queue_length()
        running = self._retire_groupless(self._active(), now)
        if not queued and not running:
            return
        caps, waiting = self.devices.answering(running)    # every round: silences are timed from when they began
        if not queued:
            return
        if waiting:
            log.warning("job dispatch skipped: servers holding job groups did not answer",
                        extra={"servers": waiting})
            self._set_reasons(stall=
                f"no scheduling decision is made while {len(waiting)} FPGA-server(s) holding running jobs' groups "
                f"do not answer (their devices cannot be counted); it resumes when they answer or their jobs are "
                f"retired")
            return
        live = self.devices.live_devices(running, caps)
        hi = self._hydrogen_max(running, self.devices.pool(running, caps))
        running = [r for r in running if live[r.id] > 0]
        if hi < 1:
            self._set_reasons(stall="no devices: every FPGA-server is unreachable or all its devices are held "
                                    "outside the job manager; jobs are dispatched when devices return")
            return
        self._set_reasons(stall="")
        if self._retry_at is not None and now < self._retry_at:
            return          # backing off after failed decisions: no event decides sooner (`_decision_failed`)
        # A job turning late is an event too: a policy that chose to wait for an arrival that never came
        # decides again then, not only when something arrives or ends. (With the queue unchanged, the late jobs
        # only grow in number: the count tells them.)
        with self.db.read() as s:
            late = s.scalar(select(func.count()).select_from(FpgaJob).where(
                FpgaJob.state == QUEUED, FpgaJob.registered_at + self.config.late_after_s < now))
        inputs = (self._queue_changes, queued, tuple((r.id, live[r.id]) for r in running), hi, late)
        if inputs == self._decided and not (self._recheck_at is not None and now >= self._recheck_at):
            return
        window = self._window(hi)
        pool = self._provisioned(hi)
        run = [hy.RunningJob(job, self._predicted_end(r, job, now), live[r.id])
               for r in running for job in [self._hjob(r, hi)]]
        recent: list = []
        if self.scheduler.lookahead or (self.scheduler.elasticity and self.scheduler.forecast):
            recent = self._recent_arrivals(now)
        try:
            # The window's jobs only: every scheduler (and a plug-in's answer, `plugins.check_allocation`) looks at
            # no more of the queue than its first `window` jobs that fit in `hi`.
            d = dispatch.decide(self.scheduler, [self._hjob(r, hi) for r in window], now=now, pool=pool,
                                pool_max=hi, running=run, cost=self.cost, history=[self._hjob(r, hi) for r in recent],
                                plugin=self._plugin)
        except Exception as e:   # noqa: BLE001 - e.g. a plug-in's bug: the jobs stay queued, tried again later
            self._decision_failed(e, now)
            return
        self._decision_made()
        if d.pool != pool:      # a change only: a pool cut to fewer devices for a while is not the manager's
            log.info("job pool resized", extra={"devices": d.pool, "was": pool, "decision": d.scaling})
            self._pool_size = d.pool
            self._save_pool(d.pool, now)
        by_id = {r.id: r for r in window}
        started = [self._start(by_id[job_id], n, now) for job_id, n in d.allocation]
        if self.scheduler.wakes:
            picked = [job_id for job_id, _ in d.allocation]
            early = (self.scheduler.budget_s or 0.0) + WAKE_MARGIN_S
            # A job whose limit is nearer than `early` is woken for at the limit itself (the decision's time
            # is its start, so it is still on time, if only just).
            wakes = [w for w in (self._wake_time(picked, now, early), self._wake_time(picked, now, hy.WAKE_EARLY_S))
                     if w is not None]
            with self._timer:
                self._wake_at = min(wakes, default=None)
                self._timer.notify_all()
        # The next round decides again when a dispatch the Orchestrator refused left its job queued, or when the
        # pool grew while jobs still wait (the paper's Algorithm 3 grows one device a decision: a job wider than
        # the pool needs several in a row, with no event between them).
        grown_for_waiting = d.pool > pool and len(d.allocation) < queued
        self._decided = inputs if all(started) and not grown_for_waiting else None
        # A job left waiting that the free devices could have started was held back for a running job's
        # devices: if that job has not ended by its predicted end (seen a control round later: its retirement
        # is), the decision rested on a wrong prediction; decide again then (no sooner: the simulator's jobs end
        # when predicted, and an end is an event). An overrunning job's end is an estimate (`_predicted_end`):
        # looked at again when it passes, and within OVERDUE_RECHECK_MAX_S.
        chosen = dict(d.allocation)
        free = d.pool - sum(rj.devices for rj in run) - sum(chosen.values())     # of the pool it provisioned
        held_back = any(r.id not in chosen and r.min_devices <= free for r in window)
        held = sum(rj.devices for rj in run) + sum(n for (_, n), ok in zip(d.allocation, started, strict=True) if ok)
        self._situation = (now, d.pool, held, len(run) + sum(started), queued - sum(started), held_back)
        period = self.config.control_period_s
        ends = [min(rj.end, now + OVERDUE_RECHECK_MAX_S) if self._overdue(r, rj.job, now) else rj.end + period
                for r, rj in zip(running, run, strict=True)]
        self._recheck_at = min(ends) if ends and held_back else None

    def _decision_failed(self, e: Exception, now: float) -> None:
        """After a failed decision: back off, log, and tell the queued jobs why they wait.

        The next event or round may try again at once after a first failure (it may be the moment's: an answer
        refused for the devices free then); after the k-th in a row (k >= 2), none is tried for
        min(control period, RETRY_FIRST_S) * 2^(k-2) s, at most RETRY_MAX_S: a plug-in that keeps failing is
        asked about once every 30 s, not every period (and every registration), with its traceback logged once
        per distinct error and a line each time after.
        """
        self._failures += 1
        base = min(self.config.control_period_s, RETRY_FIRST_S)
        delay = 0.0 if self._failures == 1 else min(RETRY_MAX_S, base * 2 ** (self._failures - 2))
        self._retry_at = now + delay - RETRY_SLACK * base if delay else None
        try:
            text = str(e)
        except Exception:    # noqa: BLE001 - not ours, maybe: its __str__ may fail
            text = ""
        first = text.strip().splitlines()[0] if text.strip() else type(e).__name__
        extra = {"policy": self.config.policy, "failures": self._failures, "retry_in_s": delay}
        key = f"{type(e).__name__}: {text}"
        if key not in self._logged_failures and len(self._logged_failures) < MAX_LOGGED_FAILURES:
            self._logged_failures.add(key)
            log.error("scheduling decision failed; the queue waits (%d in a row; next attempt in %g s at the "
                      "earliest)", self._failures, delay, exc_info=e, extra=extra)
        else:
            log.warning("scheduling decision failed again; the queue waits (%d in a row; next attempt in %g s at "
                        "the earliest; traceback logged at its first occurrence): %s", self._failures, delay,
                        plugins.clip(first, FAILURE_LINE_CHARS), extra=extra)
        # Tenants see the kind of error only: its text may quote the queue (a plug-in's answer or exception naming
        # other tenants' jobs, their designs and deadlines); the operator's log has it. Times are the manager's
        # clock's, as the Job's registered_at.
        nxt = "at the next event or control round" if not delay else f"at {now + delay:.3f} at the earliest"
        kind = ("the scheduling algorithm failed or its answer was refused" if isinstance(e, plugins.PolicyError)
                else f"an internal error ({type(e).__name__})")
        self._set_reasons(failure=
            f"the scheduler could not decide: {self._failures} failed decision(s) in a row, the last at {now:.3f}; "
            f"the next attempt is {nxt}. Error: {kind}; the service log has its details")

    def _decision_made(self) -> None:
        """A decision succeeded: no more backing off, and the queued jobs' waiting_reason is cleared."""
        self._failures = 0
        self._retry_at = None
        self._set_reasons(failure="")

    def queued_reason(self, row: FpgaJob) -> str:
        """Why a queued job waits: a failed or stalled decision's reason if any, else what the last decision saw.

        The latter is put together when read (GetJob, ListJobs, an update streamed for another reason): it
        changes with every decision, and streaming every queued job each time would cost more than the decision.
        """
        if self._waiting_reason or self._situation is None:
            return self._waiting_reason
        at, pool, held, running, left, held_back = self._situation
        free = max(0, pool - held)
        text = (f"waiting for devices: at the last scheduling decision ({at:.3f}) {held} of the pool's {pool} "
                f"device(s) were held by {running} running job(s), {free} free, and {left} job(s) stayed in the "
                f"ready queue")
        if row.min_devices > pool:
            text += (f"; this job needs at least {row.min_devices} device(s), more than the pool has now: it waits "
                     f"until the pool grows")
        elif row.min_devices > free:
            text += f"; this job needs at least {row.min_devices} device(s)"
        elif held_back:     # this job too, if it was in the window (a job that fits the free devices holds it)
            text += (f"; the policy ({self.config.policy}) left queued jobs that the free devices could start (it "
                     f"may hold them for devices of running jobs about to end)")
        else:
            text += (f"; it is not among the first {self.scheduler.window if self.scheduler else 0} queued jobs "
                     f"that the policy looks at (its window)")
        return text

    def _set_reasons(self, *, failure: str | None = None, stall: str | None = None) -> None:
        """Sets the failure's or the stall's reason (`_dispatch` streams the queued jobs if the one told changed)."""
        if failure is not None:
            self._failure_reason = failure
        if stall is not None:
            self._stall_reason = stall
        reason = self._stall_reason or self._failure_reason
        if reason != self._waiting_reason:
            self._waiting_reason = reason
            self._untold = True

    def _save_pool(self, devices: int, now: float) -> None:
        def save(s):  # type: ignore[no-untyped-def]
            row = s.get(FpgaJobPool, 1)
            if row is None:
                s.add(FpgaJobPool(id=1, devices=devices, policy=self.config.policy, updated_at=now))
            else:
                row.devices, row.policy, row.updated_at = devices, self.config.policy, now
        self.db.transact(save)

    def _start(self, row: FpgaJob, n: int, now: float) -> bool:
        """Dispatch a queued job: its group of `n` devices, kept until it retires. False: refused, still queued.

        Each attempt makes a new group (request id `job:<id>:<attempt>`), after dropping any an earlier attempt
        left (its dispatch could not be recorded, nor the group dropped then): a group whose drop failed half-way
        may have lost its devices on the servers, so it is never reused.
        """
        try:
            self.groups.drop_strays(row.tenant, row.id, keep="")
            g = self.orch.create_group(row.tenant, f"job:{row.id}:{uuid.uuid4().hex[:8]}", row.design, n,
                                       min_size=n, max_size=n)
        except HarnessError as e:       # e.g. another group took the devices meanwhile: it stays queued
            log.warning("job dispatch refused", extra={"job": row.id, "devices": n, "reason": str(e)})
            return False
        # The job turns active with its controller (the counters seen from now on) in one transaction: an
        # active job without one is taken after a restart as never read, its first reading a baseline, and
        # the actions done before that restart are lost.
        self._states[row.id] = initial_state(qos_job(row), now, 0, n)
        self._last[row.id] = (now, 0)
        try:
            row = self._update(row.id, controller_at=now, state=ACTIVE, group_id=g.id, devices=n,
                               allocations=[[now, n]])
        except Exception:
            self._states.pop(row.id, None)
            self._last.pop(row.id, None)
            try:                        # never a group without its job: the job stays queued for the next decision
                self.groups.drop(g.id)
            except Exception:           # the next attempt, or the job's retirement, drops it
                log.exception("could not drop the group of a job whose dispatch failed", extra={"job": row.id})
            raise
        return True
