"""The job manager of the FPGA IRM (issue 5): FPGA jobs with QoS goals (seed 000, seed 001).

An application registers a job (design, a deadline with the job size in
actions or a throughput goal in actions/s, min/max devices, priority) and
gets a private FPGA group; it attaches to it with `VirtualFpga.attach` and
sends its tasks straight to the FPGA-servers. The manager is passive on the
data path (seed 000 §III): it only resizes each job's group, through the
Orchestrator (`create_group`, `resize`, `delete`), under one policy chosen
by name (`irm_fpga.qos.registry`):

* "edf" (seed 000 §III-A): `edf_allocate` on events only: a job registered or
  retired, or the pool changed since the last decision (looked at every control
  period: devices another group gave back, a server back or gone); deadline
  goals only.
* "throughput" (seed 000 §III-B): `admit` on registration, then every
  control period (`control_period_s`, default 1 s) the job controllers and
  the resource broker (`throughput_decide`) from the measured progress;
  deadline goals become time-varying throughput goals.
* a Hydrogen scheduler (seed 001 §IV: "fcfs_max", "fcfs_min", "fcfs_amap",
  "sjtf", "priority", "slack_min", "slack_amap", "managed" (alias
  "managed_paper"), "managed_deadline", "managed_lookahead"): a registered
  job waits in a ready queue (state "queued", no group; at most
  `max_queued_per_tenant` of one tenant's); on every event (a
  registration, a retirement) and every control period the scheduler
  (`irm_fpga.qos.dispatch.decide`, the code the simulator runs) picks the
  jobs of the window to start now and their devices, and each gets its group
  of that size until it retires (no resizing: seed 001's accelerators are
  not preempted). The managed modes' elasticity manager sets the pool the
  jobs may use, within [pool_min, pool_max]. Jobs need a deadline goal (a
  size); the scheduler's cost model is learned from the jobs run so far
  (`LearnedCostModel`, t(r) = a + b/r per design; rebuilt from the database
  on start), starting from eq. 1 with the job's `action_seconds` x size.

Progress is the cumulative `completed` counter of the job's group on every
FPGA-server (GetMeasurements), summed and kept monotone across part
re-creations; a job may also report its completed actions, and the larger
count is used. Decisions are pure calls into `irm_fpga.qos`; every time stamp
comes from the injected clock (the control loop's period is a wall-clock
wait). The policy's `max` (the pool) is the FPGA-servers' usable devices
(blacklisted ones excluded) minus the devices of groups that are not jobs'.

A deadline job is retired by the manager itself once its completed actions
(observed or reported) reach its size: its group is deleted, its devices go
back to the pool, and under "edf" that is an event (the other jobs are
reallocated at once; under "throughput" the broker redistributes them in the
same control round).

Priority (>= 0; 0 registers as 1): EDF breaks deadline ties by it (higher
first; `irm_fpga.qos.edf`); the throughput broker ranks jobs by performance
over priority, and admission takes surplus devices from lower priorities
first (`irm_fpga.qos.throughput`). Equal priorities give the papers' policies.

Every job's group holds at least one device (an FPGA group cannot be empty),
so a job's minimum is at least 1. State lives in the Orchestrator's database
(table `fpga_jobs`, `irm_fpga.job_models`), and so does what the manager keeps
between periods (table `fpga_job_controllers`: the throughput controller's
EMA estimate and last request, the last progress sample, the servers'
counters last seen), written every control round: a restarted Orchestrator
carries on from the last round instead of starting its estimates afresh.
"""

from __future__ import annotations

import logging
import math
import re
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import grpc
from sqlalchemy import func, select
from sqlalchemy.engine import Row

from harness.v1 import fpga_jobs_pb2, fpga_jobs_pb2_grpc, fpga_pb2
from irm_fpga import designs as design_lib
from irm_fpga.fan_out import ask_servers
from irm_fpga.job_models import JOB_GROUP_PREFIX, FpgaJob, FpgaJobController, FpgaJobPool
from irm_fpga.models import Group
from irm_fpga.qos import dispatch, plugins
from irm_fpga.qos import hydrogen as hy
from irm_fpga.qos.edf import edf_allocate
from irm_fpga.qos.jobs import DEADLINE, THROUGHPUT, JobProgress, QosJob
from irm_fpga.qos.plugin_worker import PluginRunner
from irm_fpga.qos.plugins import is_external
from irm_fpga.qos.registry import ALLOCATION_POLICIES, SCHEDULING_ALGORITHMS, canonical, is_scheduling
from irm_fpga.qos.throughput import (
    DEFAULT_ALPHA,
    ControllerState,
    admission_request,
    admit,
    broker_max,
    initial_state,
    throughput_decide,
)
from services import paging
from services.clock import Clock
from services.errors import (
    CAPACITY_IN_USE,
    MANAGER_UNAVAILABLE,
    QUEUE_FULL,
    RETRY_LATER_S,
    STREAM_BEHIND,
    FailedPrecondition,
    HarnessError,
    InvalidArgument,
    NotFound,
    ResourceExhausted,
    Unavailable,
    Violations,
    owned,
    require_tenant,
)
from services.idempotency import request_hash, reused_request_id
from services.watch import Broadcaster

log = logging.getLogger(__name__)
ACTIVE, RETIRED, QUEUED = "active", "retired", "queued"
# The request ids of the groups this manager makes: job:<job id>, and job:<job id>:<attempt> (Hydrogen).
_MANAGER_GROUP = re.compile(re.escape(JOB_GROUP_PREFIX) + r"job-[0-9a-f]{16}(:[0-9a-f]{8})?")
SERVICE = "harness.v1.FpgaJobs"
_STATES = {ACTIVE: fpga_jobs_pb2.Job.STATE_ACTIVE, RETIRED: fpga_jobs_pb2.Job.STATE_RETIRED,
           QUEUED: fpga_jobs_pb2.Job.STATE_QUEUED}
MAX_THROUGHPUT_GOAL = 1e9       # actions/s; a larger goal is a typo, and its device request overflows
MAX_PRIORITY = 1e6              # a larger weight times a wait overflowed to inf: every schedule tied
DEFAULT_ACTION_S = 1.0          # Hydrogen policies: seconds per action on one device when a job gives none
MIN_ACTION_S, MAX_ACTION_S = 1e-6, 1e6   # a job's own estimate of that: a microsecond to about eleven days
# Open WatchJobs streams at most: each holds one of the server's 32 worker threads, which the Orchestrator,
# the CRS's calls and health checks share.
MAX_WATCHES = 16
MAX_WATCHES_PER_TENANT = 4      # of those, one tenant's: the others can still watch (one stream follows all of its jobs)
# A WatchJobs stream holds the latest state of each of its jobs that changed since it last sent (only its tenant's
# jobs, or its one job, are queued for it); a stream not read while more than this many of its jobs changed is
# ended RESOURCE_EXHAUSTED (the client reconnects, and its snapshot is the jobs' state then).
MAX_WATCH_BACKLOG = 1000
LOAD_WAIT_S = 10.0              # a request that comes while the manager loads waits this long, then UNAVAILABLE
MAX_CONTROL_PERIOD_S = 86400.0  # a longer period is a typo (and overflows the thread's wait)
MAX_ALLOCATIONS = 1000          # a job's allocation history keeps its first change and its most recent (`capped_history`)
MAX_ID_CHARS = 64               # job ids are stored in 64 characters
# A ListJobs page also ends at this many bytes of jobs (next_page_token goes on from there; at least one job a
# page): 1000 jobs (the largest page) with long allocation histories are ~14 MiB, where a client receives 4 MiB
# by default (as the Application Manager's ListApplications).
MAX_LIST_BYTES = 3 * 1024 * 1024
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
RETRY_LOADING_S = 1.0           # UNAVAILABLE while the manager loads its jobs: try again this much later
FAILURE_LINE_CHARS = 500        # the most of a failed decision's error a repeated log line quotes


@dataclass
class JobsConfig:
    policy: str = "edf"                # "edf" | "throughput" | a Hydrogen scheduler (module docstring)
    control_period_s: float = 1.0      # throughput: control period; all: progress sampling (Hydrogen: dispatch)
    alpha: float = DEFAULT_ALPHA       # EMA factor of the job controllers (seed 000 eq. 2)
    window: int = 30                   # Hydrogen: ready-queue jobs each decision looks at (seed 001 §VI)
    late_after_s: float = hy.LATE_AFTER_S   # Hydrogen: a job waiting longer to start is late (seed 001 §VI)
    pool_min: int = 1                  # Hydrogen managed modes: the elasticity manager's bounds on the pool
    pool_max: int = 0                  # 0: every usable device not held by other groups
    beta: float = 2.5                  # Hydrogen managed modes: Algorithm 3's shrink threshold
    lookahead_budget_s: float = 0.25   # managed_lookahead: search time per decision (it holds the manager's lock)
    plugin_timeout_s: float = 1.0      # a plug-in algorithm (module:function) answers each decision within this
    # A server holding job groups that does not answer holds decisions back (its devices would count as gone and
    # jobs shrink for a timeout); silent longer than this, it is taken as gone and decisions go on without it.
    silent_server_s: float = 60.0
    # Hydrogen: jobs one tenant may have waiting in the ready queue (state queued); one more is RESOURCE_EXHAUSTED.
    max_queued_per_tenant: int = 1000

    @classmethod
    def of(cls, config: Any) -> JobsConfig:
        """A JobsConfig, or one read from the `jobs_*` fields of another config (e.g. `jobs_policy`)."""
        if isinstance(config, JobsConfig):
            return config
        d = cls()
        return cls(**{f: getattr(config, f"jobs_{f}", getattr(d, f)) for f in cls.__dataclass_fields__})


class JobManager(fpga_jobs_pb2_grpc.FpgaJobsServicer):
    def __init__(self, orchestrator: Any, config: JobsConfig | None = None, clock: Clock | None = None) -> None:
        self.config = config or JobsConfig()
        if len(self.config.policy) > 255:
            raise ValueError("job manager configuration: a policy name is at most 255 characters")
        if self.config.policy not in ALLOCATION_POLICIES and not is_scheduling(self.config.policy):
            raise ValueError(f"job manager configuration: unknown policy {self.config.policy!r}; "
                             f"known: {', '.join(sorted({*ALLOCATION_POLICIES, *SCHEDULING_ALGORITHMS}))}; "
                             f"or a scheduling algorithm of your own as 'package.module:function'")
        if not self.config.silent_server_s >= 0:
            raise ValueError("job manager configuration: silent_server_s must be >= 0 seconds")
        if not (isinstance(self.config.max_queued_per_tenant, int) and self.config.max_queued_per_tenant >= 1):
            raise ValueError(f"job manager configuration: max_queued_per_tenant must be a whole number >= 1 "
                             f"(got {self.config.max_queued_per_tenant!r})")
        if not self.config.lookahead_budget_s >= 0:
            raise ValueError("job manager configuration: lookahead_budget_s must be >= 0 seconds")
        if not 0 < self.config.plugin_timeout_s <= MAX_CONTROL_PERIOD_S:
            raise ValueError(f"job manager configuration: plugin_timeout_s must be > 0 and at most "
                             f"{MAX_CONTROL_PERIOD_S:g} seconds (got {self.config.plugin_timeout_s!r})")
        # A Hydrogen policy dispatches from a ready queue; None: "edf" or "throughput" resize groups.
        self.scheduler: dispatch.Scheduler | None = None
        if is_scheduling(self.config.policy):
            if not (1 <= self.config.pool_min
                    and (self.config.pool_max == 0 or self.config.pool_min <= self.config.pool_max)):
                raise ValueError("job manager configuration: need 1 <= pool_min <= pool_max (pool_max 0: all)")
            try:
                s = dispatch.scheduler_for(self.config.policy, window=self.config.window,
                                           late_after=self.config.late_after_s)
                self.scheduler = replace(s, beta=self.config.beta, pool_min=self.config.pool_min,
                                         budget_s=self.config.lookahead_budget_s)
            except ValueError as e:
                raise ValueError(f"job manager configuration: {e}") from None
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
        self._waiting_reason = ""
        self._timer = threading.Condition()    # the control thread sleeps on it: a new wake or a stop rings it
        if not 0 < self.config.control_period_s <= MAX_CONTROL_PERIOD_S:
            raise ValueError(f"job manager configuration: control_period_s must be > 0 and at most "
                             f"{MAX_CONTROL_PERIOD_S:g} seconds (got {self.config.control_period_s!r})")
        if not 0.0 <= self.config.alpha <= 1.0:
            raise ValueError("job manager configuration: alpha must be in [0, 1]")
        self.orch = orchestrator
        self.db = orchestrator.db
        self.clock: Clock = clock or orchestrator.clock
        self.lock = threading.RLock()          # one decision at a time
        self._states: dict[str, ControllerState] = {}
        # job -> server -> (incarnation, progress counter) of the job's part there when last read
        self._seen: dict[str, dict[str, tuple[str, int]]] = {}
        # Jobs whose counters were not saved (before the controllers' table) -> the servers that did not answer
        # when the manager started: their first reading is a baseline, not progress (it counts everything since
        # the group was made, already in observed_actions).
        self._unseen: dict[str, set[str]] = {}
        self._silent_since: dict[str, float] = {}            # server holding job groups -> first unanswered round
        self._gone_logged: set[str] = set()                  # servers taken as gone, already logged
        self._last: dict[str, tuple[float, int]] = {}        # job -> (time, actions) at the last sample
        self._stop = threading.Event()
        # Set once `start` has loaded the persisted state: the server may take requests before (the
        # Orchestrator's start-up reconcile runs first), and a retirement read against empty counters
        # would count a job's whole progress again.
        self._ready = threading.Event()
        # EDF: the last decision was not (fully) applied -- skipped while a server was silent, or a resize
        # refused. The next control round decides again; otherwise EDF decides only on events.
        self._unapplied = False
        # Resizes refused, per job: the size and the reason last logged (a refusal repeated every round is
        # logged once until that job's resize succeeds or is refused otherwise).
        self._refused: dict[str, tuple[int, str]] = {}
        # EDF: the pool (`_pool`) its last decision shared out. Each control round computes it again: devices
        # another group gave back (or a server that came back) are an event too, or they would stay idle until a
        # job registers or retires.
        self._edf_pool: int | None = None
        self._thread = threading.Thread(target=self._loop, name="fpga-jobs", daemon=True)
        self.watchers: Broadcaster[fpga_jobs_pb2.Job] = Broadcaster(      # WatchJobs streams
            max_streams=MAX_WATCHES, full="WatchJobs streams are open on this FPGA IRM; close one, or poll GetJob",
            per_tenant=MAX_WATCHES_PER_TENANT,
            tenant_full="close one of your WatchJobs streams (one without job_id follows all of your jobs), or "
                        "poll GetJob")

    # -- lifecycle -------------------------------------------------------
    def start(self, loop: bool = True) -> None:
        """Load every active job's persisted controller state (jobs without one start afresh), then run the
        control loop (`loop=False`: none; a caller on a virtual clock steps `control_once`/`wake_once`).

        Refuses (ValueError) to run over jobs the policy cannot manage, registered under another
        one: throughput goals need "throughput", queued jobs a Hydrogen policy, and a Hydrogen
        policy takes deadline goals only. Retire them under the old policy first.
        """
        if self._plugin is not None:
            self._plugin.start()     # loaded before the first decision, whose time limit is not for importing it
        with self.lock:     # the server may already take RegisterJob: none may be half-made while this looks
            self._load()
            # EDF reconciles at its first round: the jobs may come from another policy (the broker's split),
            # or from a process that stopped between an event and its resizes.
            self._unapplied = self.config.policy == "edf"
        self._ready.set()
        if loop:
            self._thread.start()

    def _wait_loaded(self) -> None:
        if not self._ready.wait(LOAD_WAIT_S):
            raise Unavailable("the FPGA job manager is still loading its jobs (the FPGA IRM is starting); retry",
                              reason=MANAGER_UNAVAILABLE, retry_after_s=RETRY_LOADING_S)

    def _load(self) -> None:
        now = self.clock.now()
        # Before the policy check: a job whose retirement was cut short is no job to refuse a start over.
        rows = self._retire_groupless(self._active(), now)
        self._check_compatible(rows, self._queued() if self.scheduler is None else [])
        self._drop_orphans()
        self._learn_from_history()
        with self.db.read() as s:
            saved = {c.job_id: c for c in s.scalars(select(FpgaJobController))}
            kept = s.get(FpgaJobPool, 1)
        if self.scheduler is not None and self.scheduler.elasticity and kept is not None \
                and canonical(kept.policy) == canonical(self.config.policy):
            self._pool_size = kept.devices          # `_provisioned` bounds it by today's devices and pool_min
        for row in rows:
            c = saved.get(row.id)
            if c is None:
                actions = max(row.observed_actions, row.reported_actions)
                self._states[row.id] = initial_state(self._qos(row), now, actions, row.devices)
                self._last[row.id] = (now, actions)
                self._unseen[row.id] = set(self.orch.servers)
                continue
            self._states[row.id] = ControllerState(
                last_time=c.last_time, last_actions=c.last_actions, a_hat=c.a_hat, throughput=c.throughput,
                goal=c.goal, request=c.request, performance=c.performance)
            self._last[row.id] = (c.sample_time, c.sample_actions)
            self._seen[row.id] = {k: _seen_entry(v) for k, v in (c.seen or {}).items()}
        if self._unseen:
            self._observe([r for r in rows if r.id in self._unseen])      # the baselines, where servers answer

    def _check_compatible(self, active: list[FpgaJob], queued: list[FpgaJob]) -> None:
        policy = self.config.policy
        bad = [r for r in active if r.goal == THROUGHPUT and policy != THROUGHPUT]
        if self.scheduler is None:       # queued jobs, and groups a Hydrogen scheduler fixed at their size
            bad += queued + [r for r in active if is_scheduling(r.policy)]
        if bad:
            raise ValueError(
                f"job manager configuration: policy {policy!r} cannot manage {len(bad)} job(s) registered under "
                f"another policy ({', '.join(f'{r.id} ({r.policy}, {r.goal}, {r.state})' for r in bad[:5])}); "
                f"run their policy and retire them first")

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

    def quiesce(self) -> None:
        """Shutting down, before the server stops: the WatchJobs streams end (clients reconnect elsewhere)."""
        self.watchers.close()

    def stop(self) -> None:
        """After the server's calls have finished: stop the control rounds and the plugin."""
        self.quiesce()
        self._stop.set()
        with self._timer:
            self._timer.notify_all()
        if self._thread.is_alive():
            self._thread.join(timeout=10)
        if self._plugin is not None:
            self._plugin.close()

    def _loop(self) -> None:
        period = self.config.control_period_s
        next_round = time.monotonic() + period
        while True:
            with self._timer:       # a wake set after this look rings the condition: the wait is cut short
                wait = next_round - time.monotonic()
                if self._wake_at is not None:
                    wait = min(wait, self._wake_at - self.clock.now())
                if wait > 0 and not self._stop.is_set():
                    self._timer.wait(wait)
            if self._stop.is_set():
                return
            try:
                if time.monotonic() >= next_round:
                    next_round = time.monotonic() + period
                    self.control_once()
                else:
                    self.wake_once()
            except Exception:  # noqa: BLE001 - the loop must survive a bad round
                log.exception("job control round failed")

    def wake_once(self) -> None:
        """Decide again if a held job's wake is due (`_wake_at`), whatever changed since the last decision."""
        with self.lock:
            now = self.clock.now()
            if self.scheduler is None or self._wake_at is None or now < self._wake_at:
                return
            self._wake_at = None
            self._decided = None
            self._dispatch(now)

    # -- state -------------------------------------------------------------
    def _active(self) -> list[FpgaJob]:
        with self.db.read() as s:
            return list(s.scalars(select(FpgaJob).where(FpgaJob.state == ACTIVE)
                                  .order_by(FpgaJob.registered_at, FpgaJob.id)))

    def _queued(self) -> list[FpgaJob]:
        """The ready queue (Hydrogen policies), in arrival order."""
        with self.db.read() as s:
            return list(s.scalars(select(FpgaJob).where(FpgaJob.state == QUEUED)
                                  .order_by(FpgaJob.registered_at, FpgaJob.id)))

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

    def _job(self, tenant: str, job_id: str) -> FpgaJob:
        if not job_id:
            raise InvalidArgument.of("job_id", "required: a job's id as RegisterJob returned it")
        if len(job_id) > MAX_ID_CHARS:        # not echoed: its message would not fit in gRPC's metadata
            raise InvalidArgument.of("job_id", f"at most {MAX_ID_CHARS} characters (got {len(job_id)}): a job's id as "
                                               f"RegisterJob returned it")
        with self.db.read() as s:
            row = s.get(FpgaJob, job_id)
        if row is None:
            raise NotFound(f"job {job_id!r} does not exist")
        owned(tenant, row.tenant, f"job {job_id!r}")
        return row

    def _update(self, job_id: str, controller_at: float | None = None, **fields: Any) -> FpgaJob:
        """Write `fields` of a job; `controller_at`: its controller state too, in the same transaction."""
        changed = [False]

        def save(s):  # type: ignore[no-untyped-def]
            row = s.get(FpgaJob, job_id)
            for k, v in fields.items():
                changed[0] = changed[0] or getattr(row, k) != v
                setattr(row, k, v)
            if controller_at is not None:
                self._write_controllers(s, [job_id], controller_at)
            return row
        row = self.db.transact(save)
        if "state" in fields:
            self._queue_changes += 1        # a job dispatched or retired (from the queue, maybe)
        if changed[0]:                  # a periodic write of the same values is no change to stream
            self._publish([row])
        return row

    def _publish(self, rows: list[FpgaJob]) -> None:
        """Every job row written goes to the WatchJobs streams (built only when someone watches)."""
        if rows and self.watchers.has_subscribers():
            try:
                self.watchers.publish([self.to_proto(r) for r in rows])
            except Exception:     # a watcher's event must never undo or fail the change it reports
                log.exception("could not publish a job change to WatchJobs streams")

    def _save_controllers(self, job_ids: list[str], now: float) -> None:
        """Persist the in-memory controller state of `job_ids` (one transaction)."""
        if job_ids:
            self.db.transact(lambda s: self._write_controllers(s, job_ids, now))

    def _write_controllers(self, s: Any, job_ids: list[str], now: float) -> None:
        """`_save_controllers` in the session `s` (so a job's dispatch and its controller commit together)."""
        for jid in job_ids:
            st = self._states.get(jid)
            if st is None:
                continue
            t, a = self._last.get(jid, (st.last_time, st.last_actions))
            c = s.get(FpgaJobController, jid)
            if c is None:
                c = FpgaJobController(job_id=jid)
                s.add(c)
            c.last_time, c.last_actions, c.a_hat, c.throughput = st.last_time, st.last_actions, st.a_hat, \
                st.throughput
            c.goal, c.request, c.performance = st.goal, st.request, st.performance
            c.sample_time, c.sample_actions = t, a
            c.seen = {k: list(v) for k, v in self._seen.get(jid, {}).items()}
            c.updated_at = now

    @staticmethod
    def _qos(row: FpgaJob) -> QosJob:
        deadline = row.goal == DEADLINE
        return QosJob(row.id, design=row.design, goal=row.goal,
                      deadline=row.deadline_at if deadline else None, size=row.size_actions if deadline else None,
                      throughput=None if deadline else row.throughput_goal, min_devices=row.min_devices,
                      max_devices=row.max_devices or None, priority=row.priority, submitted_at=row.registered_at)

    def _usable(self) -> int:
        return sum(self.orch._free_total_capacity().values())

    def _pool(self, active: list[FpgaJob], caps: dict[str, int] | None = None) -> int:
        """The broker's max: usable devices minus those of groups that are not active jobs' (seed 000 §III-B).

        `caps`: usable devices per server, if just read (else read now)."""
        mine = {r.group_id for r in active}
        caps = self.orch._free_total_capacity() if caps is None else caps
        with self.db.read() as s:
            # Other groups' devices on the servers counted: one that did not answer is out of `usable` already.
            others = sum(n for g in s.scalars(select(Group).where(Group.deleted.is_(False))) if g.id not in mine
                         for server, n in (g.parts or {}).items() if server in caps)
        return broker_max(sum(caps.values()), reserved=others)

    def _answering(self, active: list[FpgaJob]) -> tuple[dict[str, int], list[str]]:
        """Usable devices per server that answers, and the servers holding active jobs' groups that have not
        answered for less than `silent_server_s` (decisions wait for them). A server's silence is timed from
        the first call here that misses it: call it every round, not only when there is something to decide."""
        caps = self.orch._free_total_capacity()
        with self.db.read() as s:
            held = {n for r in active if r.group_id for g in [s.get(Group, r.group_id)] if g for n in (g.parts or {})}
        missing = sorted(held - set(caps))
        now = self.clock.now()
        self._silent_since = {n: self._silent_since.get(n, now) for n in missing}
        waiting = [n for n in missing if now - self._silent_since[n] < self.config.silent_server_s]
        gone = set(missing) - set(waiting)
        if gone - self._gone_logged:        # once per server going, not every round it stays gone
            log.warning("servers holding job groups silent for longer than silent_server_s: deciding without "
                        "their devices", extra={"servers": sorted(gone), "silent_server_s": self.config.silent_server_s})
        self._gone_logged = gone
        return caps, waiting

    def _caps_if_known(self, active: list[FpgaJob]) -> dict[str, int] | None:
        """Usable devices per server that answers (`_answering`), or None while one holding part of an active
        job's group has not answered for less than `silent_server_s`: its devices would count as gone and every
        job shrink (the next round, once it answers, decides again)."""
        caps, waiting = self._answering(active)
        if waiting:
            log.warning("job allocation skipped: servers holding job groups did not answer",
                        extra={"servers": waiting})
            return None
        return caps

    def _live_devices(self, active: list[FpgaJob], caps: dict[str, int]) -> dict[str, int]:
        """Each active job's devices on the servers in `caps` (those that answer): a server taken as gone took
        its part of a job's group with it, and those devices are out of the pool already."""
        with self.db.read() as s:
            groups = {r.id: s.get(Group, r.group_id) if r.group_id else None for r in active}
        return {r.id: r.devices if (g := groups[r.id]) is None or not g.parts
                else sum(n for server, n in g.parts.items() if server in caps) for r in active}

    # -- applying decisions ------------------------------------------------
    def _resize(self, row: FpgaJob, n: int, now: float, caps: dict[str, int] | None = None) -> FpgaJob:
        """Resize the job's group to `n` devices. `caps`: the servers that answer (`_answering`), when the
        decision was made without those taken as gone: the job's parts on the others are given up and its `n`
        devices put on these, in one step (`Orchestrator.resize(evict=...)`).

        Never below the group's min_size (the job's minimum): EDF gives nothing to a job whose minimum no longer
        fits, and a group cannot be cut under its min, so the job keeps its minimum (`_edf_allocation` counts it)."""
        gone: list[str] = []
        try:
            g = self.orch._group(row.group_id)
            gone = sorted(server for server, k in (g.parts or {}).items() if k > 0 and caps is not None
                          and server not in caps)
            n = max(1, n, g.min_size)
            if n == row.devices and not gone:
                return row
            # No max of its own: the group's (the devices usable when it was made) must not hold the job back.
            # `evict` only when there is something to give up: the Orchestrator stand-ins of the tests have none.
            self.orch.resize(g, n, max_size=None if row.max_devices else n, **({"evict": gone} if gone else {}))
        except HarnessError as e:
            self._unapplied = True
            if self._refused.get(row.id) != (n, str(e)):     # once, not every round that decides it again
                self._refused[row.id] = (n, str(e))
                log.warning("job resize refused; decided again every control round until it is applied",
                            extra={"job": row.id, "devices": n, "gone_servers": gone, "reason": str(e)})
            return row
        self._refused.pop(row.id, None)
        if n == row.devices:
            return row
        # The throughput controller's next step reads the history from the start of its period (`mean_devices`).
        st = self._states.get(row.id) if self.config.policy == THROUGHPUT else None
        history = capped_history([*row.allocations, [now, n]], keep_since=st.last_time if st else None)
        return self._update(row.id, devices=n, allocations=history)

    def _apply(self, alloc: dict[str, int], rows: list[FpgaJob], now: float,
               caps: dict[str, int] | None = None) -> None:
        """Shrinks first, so the devices they free are there for the grows. `caps`: the servers that answer
        (a job's devices on the others, taken as gone, are not what it holds: `_live_devices`)."""
        live = {} if caps is None else self._live_devices(rows, caps)
        have = {r.id: live.get(r.id, r.devices) for r in rows}
        ordered = sorted((r for r in rows if r.id in alloc), key=lambda r: alloc[r.id] - have[r.id])
        for row in ordered:
            self._resize(row, alloc[row.id], now, caps)

    def _edf_allocation(self, rows: list[FpgaJob], pool: int) -> dict[str, int]:
        """`edf_allocate` of the active jobs on `pool` devices, where the pool no longer holds every minimum (it
        shrank: devices blacklisted, a server gone): a job EDF leaves without its minimum keeps it (its group
        cannot go below; `_resize`), and the others share what is left. Allocating as if those devices were free
        had a grow refused for want of them, and the same refusal come back every round."""
        jobs = [self._qos(r) for r in rows]
        kept: dict[str, int] = {}
        while True:
            alloc = edf_allocate([j for j in jobs if j.job_id not in kept], max(0, pool - sum(kept.values())))
            short = {j.job_id: max(1, j.min_devices) for j in jobs
                     if j.job_id in alloc and alloc[j.job_id] < max(1, j.min_devices)}
            if not short:
                break
            kept.update(short)
        if kept:
            log.warning("the job pool no longer holds every job's minimum: jobs keep their minimum and the "
                        "others share the rest until a job retires or devices come back",
                        extra={"pool": pool, "kept": dict(sorted(kept.items())[:20])})
        return {**alloc, **kept}

    # -- Hydrogen: the ready queue ---------------------------------------------
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
        """The most the jobs' pool may hold: `pool` (default: `_pool(running)`) within jobs_pool_max."""
        hi = self._pool(running) if pool is None else pool
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
        (the queue, the running jobs, the devices, which queued jobs are late).
        """
        assert self.scheduler is not None
        queued = self._queue_length()
        running = self._retire_groupless(self._active(), now)
        if not queued and not running:
            return
        caps, waiting = self._answering(running)    # every round: silences are timed from when they began
        if not queued:
            return
        if waiting:
            log.warning("job dispatch skipped: servers holding job groups did not answer",
                        extra={"servers": waiting})
            return
        if self._retry_at is not None and now < self._retry_at:
            return          # backing off after failed decisions: no event decides sooner (`_decision_failed`)
        live = self._live_devices(running, caps)
        hi = self._hydrogen_max(running, self._pool(running, caps))
        running = [r for r in running if live[r.id] > 0]
        if hi < 1:
            return
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
        self._set_waiting_reason(
            f"the scheduler could not decide: {self._failures} failed decision(s) in a row, the last at {now:.3f}; "
            f"the next attempt is {nxt}. Error: {kind}; the service log has its details")

    def _decision_made(self) -> None:
        """A decision succeeded: no more backing off, and the queued jobs' waiting_reason is cleared."""
        self._failures = 0
        self._retry_at = None
        self._set_waiting_reason("")

    def _set_waiting_reason(self, reason: str) -> None:
        if reason == self._waiting_reason:
            return
        self._waiting_reason = reason
        if self.watchers.has_subscribers():     # every queued job's waiting_reason changed
            self._publish(self._queued())

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
            self._drop_strays(row.tenant, row.id, keep="")
            g = self.orch.create_group(row.tenant, f"job:{row.id}:{uuid.uuid4().hex[:8]}", row.design, n,
                                       min_size=n, max_size=n)
        except HarnessError as e:       # e.g. another group took the devices meanwhile: it stays queued
            log.warning("job dispatch refused", extra={"job": row.id, "devices": n, "reason": str(e)})
            return False
        # The job turns active with its controller (the counters seen from now on) in one transaction: an
        # active job without one is taken after a restart as never read, its first reading a baseline, and
        # the actions done before that restart are lost.
        self._states[row.id] = initial_state(self._qos(row), now, 0, n)
        self._last[row.id] = (now, 0)
        try:
            row = self._update(row.id, controller_at=now, state=ACTIVE, group_id=g.id, devices=n,
                               allocations=[[now, n]])
        except Exception:
            self._states.pop(row.id, None)
            self._last.pop(row.id, None)
            try:                        # never a group without its job: the job stays queued for the next decision
                self._drop_group(g.id)
            except Exception:           # the next attempt, or the job's retirement, drops it
                log.exception("could not drop the group of a job whose dispatch failed", extra={"job": row.id})
            raise
        return True

    # -- decisions -----------------------------------------------------------
    def _observe(self, rows: list[FpgaJob]) -> dict[str, int]:
        """Completed actions per job: the servers' group counters (monotone) or the reports, the larger."""
        by_group = {r.group_id: r for r in rows}
        changed: set[str] = set()       # counters to save (a baseline taken included)
        moved: set[str] = set()         # jobs whose observed progress grew: what watchers see changed
        # Every server at once: one that hangs costs one timeout per round, not one per server in turn.
        for name, m in ask_servers(dict(self.orch.servers), "GetMeasurements", fpga_pb2.GetMeasurementsRequest(),
                                   self.orch.config.server_timeout_s).items():
            if isinstance(m, grpc.RpcError):
                continue
            for g in m.groups:
                row = by_group.get(g.group_id)
                if row is None:
                    continue
                seen = self._seen.setdefault(row.id, {})
                now_seen = (g.incarnation, g.completed - g.failed)      # failed tasks are no progress
                if name in self._unseen.get(row.id, ()):
                    seen[name] = now_seen              # the baseline (see `_unseen`)
                    changed.add(row.id)
                    continue
                delta = _progress(seen.get(name), *now_seen)
                if seen.get(name) != now_seen:
                    changed.add(row.id)
                if delta:
                    moved.add(row.id)
                seen[name] = now_seen
                row.observed_actions += delta
            for r in rows:                             # this server answered: its baselines are taken
                pending = self._unseen.get(r.id)
                if pending is not None:
                    pending.discard(name)
                    if not pending:
                        del self._unseen[r.id]
        if changed:
            # The counters seen and the actions they added, in one transaction: a restart never counts twice.
            def save(s):  # type: ignore[no-untyped-def]
                for r in rows:
                    if r.id not in changed:
                        continue
                    s.get(FpgaJob, r.id).observed_actions = r.observed_actions
                    c = s.get(FpgaJobController, r.id)
                    if c is not None:
                        c.seen = {k: list(v) for k, v in self._seen[r.id].items()}
            self.db.transact(save)
            # A baseline or a counter that moved without adding progress changes nothing a Job shows: published, it
            # was a second identical line on every watch of a job just started.
            if moved:
                self._publish([r for r in rows if r.id in moved])
        return {r.id: max(r.observed_actions, r.reported_actions) for r in rows}

    def control_once(self) -> dict[str, int]:
        """One period: sample progress; under "throughput", run the controllers and the broker."""
        with self.lock:
            now = self.clock.now()
            active = self._active()
            rows = self._retire_groupless(active, now)
            if not rows:
                if self.scheduler is not None:
                    self._dispatch(now)          # the period is also a timer: devices freed by other groups
                return {}
            actions = self._observe(rows)
            done = [r for r in rows if r.goal == DEADLINE and actions[r.id] >= r.size_actions]
            for r in done:                       # a deadline job whose size is done: retire it
                self._finish(r.id, now)
            decided = self.scheduler is None and bool(done or self._unapplied or len(rows) < len(active))
            if decided:
                self._rebalance(now)             # EDF's event (or its last decision again, see `_unapplied`);
                                                 # the broker below redistributes under throughput (a Hydrogen
                                                 # decision follows below: one per instant)
            rows = [r for r in rows if r not in done]
            if not decided and (caps := self._edf_pool_changed(rows)) is not None:
                self._rebalance(now, rows, caps)     # EDF: the pool grew or shrank since its last decision
            for r in rows:
                t0, a0 = self._last.get(r.id, (r.registered_at, 0))
                if now > t0:
                    self._update(r.id, achieved_throughput=(actions[r.id] - a0) / (now - t0))
                    self._last[r.id] = (now, actions[r.id])
            if self.config.policy != THROUGHPUT:
                self._save_controllers([r.id for r in rows], now)
                if self.scheduler is not None:
                    self._dispatch(now)
                return {r.id: r.devices for r in self._active()}
            stepping = []
            for r in rows:
                st = self._states.get(r.id)
                if st is None:
                    st = self._states[r.id] = initial_state(self._qos(r), r.registered_at, 0, r.devices)
                if now > st.last_time:
                    stepping.append(r)
            caps = self._caps_if_known(rows) if stepping else None
            if caps is None:
                self._save_controllers([r.id for r in rows], now)
                return {}
            pool = self._pool(rows, caps)
            # The devices each job has on servers that answer: a server taken as gone took its parts with it
            # (their devices are out of the pool; the resize below gives them up).
            live = self._live_devices(rows, caps)
            jobs, obs = [], {}
            for r in stepping:
                st = self._states[r.id]
                held = mean_devices(capped_history(r.allocations, st.last_time), st.last_time, now, r.devices)
                if r.devices > live[r.id]:
                    held *= live[r.id] / r.devices
                jobs.append(self._qos(r))
                obs[r.id] = JobProgress(now, actions[r.id], live[r.id], held=held)
            # A job with no step to take (registered this very instant) keeps its devices: the broker shares
            # what the others hold, or it would hand that job's devices out again.
            pool -= sum(live[r.id] for r in rows if r.id not in obs)
            alloc, states, _ = throughput_decide(jobs, {j.job_id: self._states[j.job_id] for j in jobs}, obs,
                                                 pool, alpha=self.config.alpha)
            self._states.update(states)
            self._save_controllers([r.id for r in rows], now)
            self._apply(alloc, [r for r in rows if r.id in alloc], now, caps)
            return alloc

    # -- API ---------------------------------------------------------------
    def _validate(self, request: fpga_jobs_pb2.RegisterJobRequest) -> None:
        """The request's fields, all at once (INVALID_ARGUMENT naming each), before the devices are counted: a
        request wrong in itself is refused as such whatever the servers are doing (a silent one's UNAVAILABLE, or
        RESOURCE_EXHAUSTED with every device blacklisted, would have the client retry a request that can never
        succeed). A request asking for more than one device has its device counts among them too, if every
        server answered."""
        v = Violations()
        v.check(bool(request.request_id) and len(request.request_id) <= 200, "request_id",
                "required: an idempotency key of at most 200 characters")
        if (why := design_lib.unknown_design(request.design)) is not None:
            v.add("design", why)
        goal = request.WhichOneof("goal")
        if goal is None:
            v.add("goal", "required: a deadline (deadline_s and size_actions) or a throughput (actions_per_s)")
        elif goal == "deadline":
            d = request.deadline
            v.check(math.isfinite(d.deadline_s) and d.deadline_s > 0, "deadline.deadline_s",
                    f"must be a finite number of seconds > 0 from registration (got {d.deadline_s!r})")
            v.check(d.size_actions >= 1, "deadline.size_actions", "the job's size: at least 1 action")
        else:
            g = request.throughput.actions_per_s
            v.check(math.isfinite(g) and 0 < g <= MAX_THROUGHPUT_GOAL, "throughput.actions_per_s",
                    f"must be > 0 and at most {MAX_THROUGHPUT_GOAL:g} actions/s")
            v.check(self.config.policy == THROUGHPUT, "throughput",
                    f"the job manager runs {self.config.policy!r}, which takes deadline goals only")
        mn, mx = request.min_devices, request.max_devices
        v.check(mn >= 0, "min_devices", "must be >= 0")
        v.check(mx >= 0, "max_devices", "must be >= 0 (0: no limit)")
        v.check(mx == 0 or mx >= max(1, mn), "max_devices", f"must be >= min_devices and >= 1 (got {mx})")
        if self.scheduler is not None and self.config.pool_max:
            v.check(max(1, mn) <= self.config.pool_max, "min_devices",
                    f"the job manager's pool holds at most {self.config.pool_max} devices (jobs_pool_max)")
        v.check(math.isfinite(request.priority) and 0 <= request.priority <= MAX_PRIORITY, "priority",
                f"must be >= 0 and at most {MAX_PRIORITY:g} (0: 1)")
        a = request.action_seconds
        v.check(math.isfinite(a) and (a == 0 or MIN_ACTION_S <= a <= MAX_ACTION_S), "action_seconds",
                f"seconds per action on one device: 0 (one second) or {MIN_ACTION_S:g} to {MAX_ACTION_S:g}")
        # Counted only for a request that may ask for more devices than there are: a server that hangs holds
        # the count for a timeout, and a malformed request asking for one device waits for no server.
        if v.items and max(request.min_devices, request.max_devices) > 1:
            caps = self.orch._free_total_capacity()
            if caps and not set(self.orch.servers) - set(caps):     # else the devices are not all known
                self._capacity_violations(request, sum(caps.values()), v)
        v.raise_if_any()

    @staticmethod
    def _capacity_violations(request: fpga_jobs_pb2.RegisterJobRequest, usable: int, v: Violations) -> None:
        """The request's device counts against the `usable` devices of the servers."""
        mn, mx = request.min_devices, request.max_devices
        v.check(max(1, mn) <= usable, "min_devices", f"the FPGA-servers have {usable} usable devices in all")
        v.check(mx <= usable, "max_devices", f"the FPGA-servers have {usable} usable devices in all")

    def _retry_silent_s(self) -> float:
        """How long a caller refused for a silent server waits: the Orchestrator tries such a server again then."""
        return getattr(self.orch.config, "server_backoff_s", None) or RETRY_LATER_S

    def _usable_or_unavailable(self, request: fpga_jobs_pb2.RegisterJobRequest) -> int:
        """Usable devices of the servers that answer. A job wider than those while some server does not
        answer may fit once it is back: UNAVAILABLE (retry), not INVALID_ARGUMENT (never ask that again)."""
        caps = self.orch._free_total_capacity()
        if not caps:
            raise Unavailable("no FPGA-server can be reached: the job manager cannot count devices; retry later",
                              reason=MANAGER_UNAVAILABLE, retry_after_s=self._retry_silent_s())
        usable = sum(caps.values())
        silent = sorted(set(self.orch.servers) - set(caps))
        if silent and max(1, request.min_devices, request.max_devices) > usable:
            raise Unavailable(f"the job asks for more devices than the {usable} of the FPGA-servers that answer; "
                              f"{', '.join(silent)} did not: retry later", reason=MANAGER_UNAVAILABLE,
                              retry_after_s=self._retry_silent_s())
        if usable == 0:
            raise ResourceExhausted("every device of the FPGA-servers is blacklisted; retry once an operator "
                                    "brings devices back", retry_after_s=RETRY_LATER_S)
        return usable

    def _registered(self, tenant: str, request_id: str) -> FpgaJob | None:
        with self.db.read() as s:
            return s.scalar(select(FpgaJob).where(FpgaJob.tenant == tenant, FpgaJob.request_id == request_id))

    @staticmethod
    def _replayed(existing: FpgaJob, fingerprint: str) -> FpgaJob:
        """The job a request_id first registered, for a retry that asks for the same (a job registered before the
        hash was recorded is not compared)."""
        if existing.request_hash and existing.request_hash != fingerprint:
            raise reused_request_id()
        return existing

    def register(self, request: fpga_jobs_pb2.RegisterJobRequest) -> FpgaJob:
        tenant = require_tenant(request.tenant)
        self._wait_loaded()
        fingerprint = request_hash(request)
        # A retry gets its job whatever the devices are doing now (blacklisted, unreachable).
        if request.request_id and (existing := self._registered(tenant, request.request_id)) is not None:
            return self._replayed(existing, fingerprint)
        self._validate(request)
        usable = self._usable_or_unavailable(request)
        v = Violations()
        self._capacity_violations(request, usable, v)
        v.raise_if_any()
        with self.lock:      # check-then-create as one step: a concurrent retry finds the first job
            if (existing := self._registered(tenant, request.request_id)) is not None:
                return self._replayed(existing, fingerprint)
            now = self.clock.now()
            deadline = request.WhichOneof("goal") == "deadline"
            row = FpgaJob(id=f"job-{uuid.uuid4().hex[:16]}", tenant=tenant, request_id=request.request_id,
                          request_hash=fingerprint, design=request.design, group_id="", policy=self.config.policy,
                          goal=DEADLINE if deadline else THROUGHPUT,
                          deadline_s=request.deadline.deadline_s if deadline else 0.0,
                          deadline_at=now + request.deadline.deadline_s if deadline else 0.0,
                          size_actions=request.deadline.size_actions if deadline else 0,
                          throughput_goal=0.0 if deadline else request.throughput.actions_per_s,
                          min_devices=max(1, request.min_devices), max_devices=request.max_devices,
                          priority=request.priority or 1.0, state=ACTIVE, devices=0, observed_actions=0,
                          reported_actions=0, achieved_throughput=0.0, allocations=[], registered_at=now,
                          retired_at=0.0, action_seconds=request.action_seconds)
            if self.scheduler is not None:          # Hydrogen: into the ready queue, then a decision
                cap = self.config.max_queued_per_tenant
                if (waiting := self._queue_length(tenant)) >= cap:
                    raise ResourceExhausted(
                        f"tenant {tenant!r} already has {waiting} jobs waiting in the ready queue, the most one "
                        f"tenant may (jobs_max_queued_per_tenant = {cap}); retire some of them or wait until they "
                        f"are dispatched, then register again", reason=QUEUE_FULL)
                row.state = QUEUED
                self._insert(row)
                self._dispatch(now)
                return self._job(tenant, row.id)
            job = self._qos(row)
            rows = self._retire_groupless(self._active(), now)
            caps = self._caps_if_known(rows)
            if caps is None:                    # the others' devices cannot be counted: shrinking them would
                raise Unavailable("an FPGA-server holding job groups did not answer: the job manager cannot "
                                  "count its devices now; retry later", reason=MANAGER_UNAVAILABLE,
                                  retry_after_s=self._retry_silent_s())
            pool = self._pool(rows, caps)
            live = self._live_devices(rows, caps)       # parts on servers taken as gone hold nothing
            if self.config.policy == THROUGHPUT:
                reqs = {r.id: admission_request(self._qos(r), self._states.get(r.id), live[r.id]) for r in rows}
                alloc = admit(job, live, reqs, pool, priorities={r.id: r.priority for r in rows})
            else:
                alloc = edf_allocate([*(self._qos(r) for r in rows), job], pool)
            n = (alloc or {}).get(row.id, 0)
            if n < 1:
                raise ResourceExhausted(f"no device for the job's minimum ({row.min_devices}) under "
                                        f"{self.config.policy!r}: {pool} device(s) in the pool; retry once a "
                                        f"job retires or ask for fewer devices",
                                        reason=CAPACITY_IN_USE, retry_after_s=RETRY_LATER_S)
            # A job's group never goes below one device: refuse before touching the others' groups.
            starved = [r.id for r in rows if alloc.get(r.id, 0) < 1]
            if starved:
                raise ResourceExhausted(
                    f"the job's minimum ({row.min_devices}) does not fit beside one device for each of the "
                    f"{len(rows)} active job(s) ({pool} device(s) in the pool): {self.config.policy!r} would leave "
                    f"{', '.join(starved[:5])} without one; ask for fewer devices or wait for a job to retire",
                    reason=CAPACITY_IN_USE, retry_after_s=RETRY_LATER_S)
            self._apply({k: v for k, v in alloc.items() if k != row.id}, [r for r in rows if alloc[r.id] < r.devices],
                        now, caps)
            try:
                g = self.orch.create_group(tenant, f"job:{row.id}", row.design, n, min_size=row.min_devices,
                                           max_size=row.max_devices or usable)
            except HarnessError:
                self._rebalance(now)     # give the shrunk jobs their devices back
                raise
            row.group_id, row.devices, row.allocations = g.id, n, [[now, n]]
            self._states[row.id] = initial_state(job, now, 0, n)
            self._last[row.id] = (now, 0)
            try:
                self._insert(row, controller_at=now)     # with its controller (see `_start`)
            except Exception:
                self._states.pop(row.id, None)
                self._last.pop(row.id, None)
                self._drop_group(row.group_id)     # never a group without its job
                self._rebalance(now)
                raise
            self._apply(alloc, [r for r in self._active() if r.id != row.id], now, caps)
            if self.config.policy == "edf":
                self._edf_pool = pool        # the pool this decision shared out (the new job's group is in it)
            return self._job(tenant, row.id)

    def _insert(self, row: FpgaJob, controller_at: float | None = None) -> None:
        """Add a job's row; `controller_at`: its controller state too, in the same transaction."""
        def add(s):  # type: ignore[no-untyped-def]
            s.add(FpgaJob(**{c.name: getattr(row, c.name) for c in FpgaJob.__table__.c}))
            if controller_at is not None:
                s.flush()                   # the job first: its controller refers to it
                self._write_controllers(s, [row.id], controller_at)
        self.db.transact(add)
        if row.state == QUEUED:
            self._queue_changes += 1
        self._publish([row])

    def _drop_orphans(self) -> None:
        """Drop the job groups no job owns: a process that died between making a job's group and recording the job
        (or a dispatch) left them holding devices nobody would ever give back. Tenants cannot make such groups
        (`JOB_GROUP_PREFIX` is refused from them)."""
        prefix = JOB_GROUP_PREFIX
        with self.lock:                          # no registration or dispatch half-made meanwhile
            with self.db.read() as s:
                owned = set(s.scalars(select(FpgaJob.group_id).where(FpgaJob.state != RETIRED)))
                # Only ids this manager makes: a tenant's "job:..." group from before the prefix was refused stays.
                orphans = [g.id for g in s.scalars(select(Group).where(
                    Group.deleted.is_(False), func.substr(Group.request_id, 1, len(prefix)) == prefix))
                    if g.id not in owned and _MANAGER_GROUP.fullmatch(g.request_id)]
            for gid in orphans:
                log.warning("dropping a job group no job owns", extra={"group": gid})
                self._drop_group(gid)

    def _retire_groupless(self, rows: list[FpgaJob], now: float) -> list[FpgaJob]:
        """`rows` (active jobs) but those whose group is gone, which are retired (under the lock). A retirement cut
        short after deleting the group (`_finish`) left such a job active for good: every decision gave it devices
        it cannot use (its resizes refused) and the other jobs the rest. Looked at on start and before decisions:
        the running manager meets it too, after a write that failed."""
        ids = {r.group_id for r in rows if r.group_id}
        with self.db.read() as s:
            live = set(s.scalars(select(Group.id).where(Group.id.in_(ids), Group.deleted.is_(False)))) if ids else set()
        for r in rows:
            if r.group_id not in live:
                log.warning("retiring an active job whose FPGA group is gone: its retirement was cut short after "
                            "the group was deleted (the FPGA IRM stopped, or a database write failed, in between); "
                            "it held no devices since", extra={"job": r.id, "tenant": r.tenant, "group": r.group_id})
                self._finish(r.id, now, cut_short=True)
        return [r for r in rows if r.group_id in live]

    def _drop_strays(self, tenant: str, job_id: str, keep: str) -> None:
        """Drop the live groups made for the job (request id `job:<id>` or `job:<id>:...`) other than `keep`."""
        with self.db.read() as s:
            prefix = f"job:{job_id}:"     # compared exactly: SQLite's LIKE ignores case
            strays = [g.id for g in s.scalars(select(Group).where(
                Group.tenant == tenant, Group.deleted.is_(False), Group.id != keep,
                (Group.request_id == f"job:{job_id}") | (func.substr(Group.request_id, 1, len(prefix)) == prefix)))]
        for gid in strays:
            self._drop_group(gid)

    def _drop_group(self, group_id: str) -> None:
        if not group_id:
            return
        try:
            self.orch.delete(self.orch._group(group_id))
        except NotFound:
            pass

    def _rebalance(self, now: float, rows: list[FpgaJob] | None = None,
                   caps: dict[str, int] | None = None) -> None:
        """An event: EDF's allocation of the active jobs now, or a Hydrogen decision (throughput waits).
        `rows`, `caps`: the active jobs and the servers' usable devices, if just read (else read now)."""
        if self.scheduler is not None:
            self._dispatch(now)
            return
        if self.config.policy != "edf":
            return
        if rows is None:
            rows = self._active()
        if caps is None:
            caps = self._caps_if_known(rows) if rows else None
        self._unapplied = bool(rows) and caps is None      # a silent server: decided again next round
        if caps is not None:                                # a refusal sets it
            pool = self._pool(rows, caps)
            self._apply(self._edf_allocation(rows, pool), rows, now, caps)
            self._edf_pool = pool

    def _edf_pool_changed(self, rows: list[FpgaJob]) -> dict[str, int] | None:
        """EDF, every control round: the servers' usable devices (`_answering`) if the pool is no longer the one
        the last decision shared out (devices freed by another group, a server back or gone), else None (also
        while a server holding job groups is silent: the round after it answers, or is taken as gone, looks
        again)."""
        if self.config.policy != "edf" or self.scheduler is not None or not rows:
            return None
        caps, waiting = self._answering(rows)
        if waiting or self._pool(rows, caps) == self._edf_pool:
            return None
        return caps

    def retire(self, tenant: str, job_id: str) -> FpgaJob:
        tenant = require_tenant(tenant)
        self._wait_loaded()
        with self.lock:          # the row read under the lock: a control round may be updating it
            row = self._job(tenant, job_id)
            if row.state == RETIRED:
                return row
            now = self.clock.now()
            self._observe([row])
            row = self._finish(job_id, now)
            self._rebalance(now)
            return row

    def _finish(self, job_id: str, now: float, cut_short: bool = False) -> FpgaJob:
        """Retire a job (under the lock): delete its group, close its history, drop its controller.

        The group goes first: a job recorded retired never holds devices. A retirement cut short in between (the
        process killed, the write failing) leaves an active job without a group, which `_retire_groupless`
        retires, `cut_short`: its end was not now, so it teaches the cost model nothing and keeps its last rate."""
        with self.db.read() as s:
            row = s.get(FpgaJob, job_id)
        if row.state == RETIRED:
            return row
        self._drop_group(row.group_id)
        if self.scheduler is not None:
            self._drop_strays(row.tenant, row.id, keep=row.group_id)    # an earlier failed dispatch's, if any
        if self.scheduler is not None and row.state == ACTIVE and not cut_short:
            self._observe_run(row, now)        # a run to its size: the cost model learns its time
        end = max(row.observed_actions, row.reported_actions)
        t0, a0 = self._last.get(row.id, (row.registered_at, 0))
        # The policy it retires under is the last that managed it (`to_proto` shows the current one until then).
        fields: dict[str, Any] = {"state": RETIRED, "devices": 0, "retired_at": now, "policy": self.config.policy,
                                  "allocations": capped_history([*row.allocations, [now, 0]])
                                  if row.allocations else []}
        # The rate over the time since the last sample, unless that is a sliver of a period and a period's
        # rate is already known (a few actions over milliseconds are no rate).
        if now > t0 and (now - t0 >= self.config.control_period_s or not row.achieved_throughput) and not cut_short:
            fields["achieved_throughput"] = (end - a0) / (now - t0)
        row = self._update(row.id, **fields)
        for d in (self._states, self._seen, self._last, self._refused):
            d.pop(job_id, None)

        def drop(s):  # type: ignore[no-untyped-def]
            c = s.get(FpgaJobController, job_id)
            if c is not None:
                s.delete(c)
        self.db.transact(drop)
        return row

    def report(self, tenant: str, job_id: str, completed: int) -> FpgaJob:
        tenant = require_tenant(tenant)
        self._wait_loaded()
        v = Violations()
        v.check(completed >= 0, "completed_actions", "must be >= 0")
        v.raise_if_any()
        with self.lock:        # the state read under the lock: a retirement cannot slip in between
            row = self._job(tenant, job_id)
            if row.state == RETIRED:
                raise FailedPrecondition(f"job {job_id!r} is retired")
            if row.state == QUEUED:
                raise FailedPrecondition(f"job {job_id!r} is queued: it has no devices yet (GetJob shows "
                                         f"STATE_ACTIVE once it is dispatched)")
            row = self._update(job_id, reported_actions=max(row.reported_actions, completed))
            if row.state == ACTIVE and row.goal == DEADLINE and \
                    max(row.observed_actions, row.reported_actions) >= row.size_actions:
                now = self.clock.now()
                # The servers' counters read once more, as `retire` does: the tasks done since the last round are
                # the job's, and a run the servers saw to its size teaches the cost model.
                self._observe([row])
                row = self._finish(job_id, now)     # its size is done: retired, devices back to the pool
                self._rebalance(now)
            return row

    def to_proto(self, row: FpgaJob) -> fpga_jobs_pb2.Job:
        actions = max(row.observed_actions, row.reported_actions)
        end = row.retired_at if row.state == RETIRED else self.clock.now()
        job = fpga_jobs_pb2.Job(
            id=row.id, tenant=row.tenant, request_id=row.request_id, design=row.design, group_id=row.group_id,
            state=_STATES[row.state], dispatched_at=row.allocations[0][0] if row.allocations else 0.0,
            action_seconds=row.action_seconds,
            min_devices=row.min_devices, max_devices=row.max_devices, priority=row.priority,
            # A job not retired is managed by this manager's policy, whatever it was registered under (the
            # Orchestrator may have restarted under another since).
            policy=row.policy if row.state == RETIRED else self.config.policy,
            devices=row.devices, completed_actions=actions, achieved_throughput=row.achieved_throughput,
            mean_throughput=actions / (end - row.registered_at) if end > row.registered_at else 0.0,
            allocations=[fpga_jobs_pb2.AllocationChange(time=t, devices=n)
                         for t, n in capped_history(row.allocations)],
            registered_at=row.registered_at, deadline_at=row.deadline_at, retired_at=row.retired_at,
            waiting_reason=self._waiting_reason if row.state == QUEUED else "")
        if row.goal == DEADLINE:
            job.deadline.CopyFrom(fpga_jobs_pb2.DeadlineGoal(deadline_s=row.deadline_s,
                                                             size_actions=row.size_actions))
        else:
            job.throughput.CopyFrom(fpga_jobs_pb2.ThroughputGoal(actions_per_s=row.throughput_goal))
        return job

    # -- FpgaJobs servicer ---------------------------------------------------
    def RegisterJob(self, request, context):  # noqa: N802
        return self.to_proto(self.register(request))

    def RetireJob(self, request, context):  # noqa: N802
        return self.to_proto(self.retire(request.tenant, request.job_id))

    def ReportProgress(self, request, context):  # noqa: N802
        return self.to_proto(self.report(request.tenant, request.job_id, request.completed_actions))

    def GetJob(self, request, context):  # noqa: N802
        return self.to_proto(self._job(require_tenant(request.tenant), request.job_id))

    def ListJobs(self, request, context):  # noqa: N802
        tenant = require_tenant(request.tenant)
        with self.db.read() as s:
            q = select(FpgaJob).where(FpgaJob.tenant == tenant)
            if request.active_only:
                q = q.where(FpgaJob.state != RETIRED)
            order = [FpgaJob.registered_at, FpgaJob.id]
            rows, token = paging.page(s, q, order, request.page_size, request.page_token)
        jobs: list[fpga_jobs_pb2.Job] = []
        size = 0
        for n, row in enumerate(rows):
            job = self.to_proto(row)
            size += job.ByteSize() + 8          # its field tag and length too
            if jobs and size > MAX_LIST_BYTES:
                # The page ends here (at least one job a page: one is far below the budget); the next one starts
                # after the last listed, as a page of `n` would.
                token = paging.token_after(rows[n - 1], order)
                break
            jobs.append(job)
        return fpga_jobs_pb2.ListJobsResponse(jobs=jobs, pool_devices=self.pool_devices(), next_page_token=token)

    def WatchJobs(self, request, context):  # noqa: N802
        tenant = require_tenant(request.tenant)
        one = request.job_id
        if one:
            self._job(tenant, one)           # NOT_FOUND before the stream starts
        yield from self._watch(tenant, one, context)

    def _watch(self, tenant: str, one: str, context: Any):  # type: ignore[no-untyped-def]
        """The stream of one WatchJobs call: snapshot, changes, then the end or an error."""

        def snapshot() -> list[fpga_jobs_pb2.Job]:
            if one:
                return [self.to_proto(self._job(tenant, one))]
            with self.db.read() as s:
                rows = list(s.scalars(select(FpgaJob).where(FpgaJob.tenant == tenant, FpgaJob.state != RETIRED)
                                      .order_by(FpgaJob.registered_at, FpgaJob.id)))
            return [self.to_proto(r) for r in rows]

        def mine(job: fpga_jobs_pb2.Job) -> bool:
            return job.tenant == tenant and (not one or job.id == one)

        # Subscribed before the snapshot is read: a change in between is sent (again), never lost. Only this
        # stream's jobs are queued for it, the latest state of each (a stalled stream holds at most
        # MAX_WATCH_BACKLOG jobs, not every tenant's changes).
        for batch in self.watchers.stream_batches(snapshot, context.is_active, tenant=tenant, accept=mine,
                                                  key=_job_id, max_backlog=MAX_WATCH_BACKLOG):
            for job in batch:
                if not mine(job):
                    continue
                yield job
                if one and job.state == fpga_jobs_pb2.Job.STATE_RETIRED:
                    return
        if not context.is_active():
            return                           # the client went away
        # Not the end the contract promises: say so, so that the client reconnects (its first message is the
        # current state again) instead of taking an OK end for a retired job.
        if self.watchers.closed:
            raise Unavailable("the FPGA IRM's job manager is stopping; reconnect to go on watching",
                              reason=MANAGER_UNAVAILABLE, retry_after_s=RETRY_LOADING_S)
        raise ResourceExhausted(f"the stream fell behind: more than {MAX_WATCH_BACKLOG} of the jobs it follows "
                                f"changed while it was not read; reconnect and re-list (a new stream starts with "
                                f"the jobs' current state)", reason=STREAM_BEHIND)

    def pool_devices(self) -> int:
        """Devices the manager may give jobs now (a Hydrogen managed mode: its elastic pool)."""
        with self.lock:
            active = self._active()
            if self.scheduler is None:
                return self._pool(active)
            return self._provisioned(self._hydrogen_max(active))


def job_component_parts(orchestrator: Any, config: Any = None
                        ) -> tuple[Callable[[grpc.Server], None], list[str], Callable[[], None], Callable[[], None]]:
    """(register, service names, start, stop) of the FpgaJobs service over `orchestrator`.

    `config`: a `JobsConfig`, or a config with `jobs_policy`, `jobs_control_period_s`,
    `jobs_alpha` (e.g. OrchestratorConfig); missing fields take the defaults.
    """
    manager = JobManager(orchestrator, JobsConfig.of(config))

    def register(server: grpc.Server) -> None:
        fpga_jobs_pb2_grpc.add_FpgaJobsServicer_to_server(manager, server)

    register.manager = manager  # type: ignore[attr-defined]   # for tests and diagnostics
    return register, [SERVICE], manager.start, manager.stop


def _job_id(job: fpga_jobs_pb2.Job) -> str:
    """The key a WatchJobs stream keeps one pending event per: a job's latest state replaces the one not sent."""
    return job.id


def _seen_entry(value: Any) -> tuple[str, int]:
    """A stored counter reading: [incarnation, count], or a bare count (stored before incarnations: "")."""
    if isinstance(value, list | tuple):
        return str(value[0]), int(value[1])
    return "", int(value)


def _progress(last: tuple[str, int] | None, incarnation: str, count: int) -> int:
    """Actions a part's progress counter adds since `last` (its previous reading; None: never read).

    A part made again (deleted, or its server restarted) restarts its counter at 0 under a new
    incarnation: all of its count is new, however far it has got since. A reading stored before
    incarnations ("") against one that has them cannot tell: it only sets the baseline. Servers
    without incarnations (both ""): a counter that went down restarted.
    """
    if last is None:
        return count                   # the part was made for this job: everything it did is the job's
    was, before = last
    if was != incarnation:
        return 0 if was == "" else count
    return count - before if count >= before else count


def capped_history(allocations: list, keep_since: float | None = None) -> list:
    """A job's history of [time, devices] changes as stored: the first (its registration or dispatch) and the most
    recent, at most MAX_ALLOCATIONS in all (a throughput job resized every control period for days would otherwise
    make every read, write and message of the job grow without end). `keep_since`: the change in effect then and
    every later one stay whatever their number (`mean_devices` reads the current control period from them)."""
    if len(allocations) <= MAX_ALLOCATIONS:
        return allocations
    start = len(allocations) - (MAX_ALLOCATIONS - 1)
    if keep_since is not None:
        while start > 1 and allocations[start][0] > keep_since:
            start -= 1
    return [allocations[0], *allocations[start:]]


def mean_devices(allocations: list, start: float, end: float, current: int) -> float:
    """Time-weighted mean of a job's devices over [start, end] from its history of [time, devices] changes.

    Seed 000 eq. 2 divides a period's progress by the devices held over that period, not by the size
    the job ends it with (admission or EDF may resize it mid-period). Time before the first change is
    left out; `current` when nothing of the window is covered.
    """
    held, since, first, total = None, start, None, 0.0
    for when, n in allocations:
        if when >= end:
            break
        if when > start:
            if held is not None:
                total += held * (when - since)
            since = when
        first = since if first is None else first
        held = n
    if held is None or end <= first:
        return float(current)
    total += held * (end - since)
    return total / (end - first)
