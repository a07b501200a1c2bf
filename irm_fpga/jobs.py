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
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import grpc
from sqlalchemy import select

from harness.v1 import fpga_jobs_pb2, fpga_jobs_pb2_grpc
from irm_fpga.job_models import FpgaJob, FpgaJobController, FpgaJobPool
from irm_fpga.jobs_config import MAX_CONTROL_PERIOD_S, JobsConfig, checked_scheduler
from irm_fpga.jobs_devices import JobDevices
from irm_fpga.jobs_groups import JobGroups
from irm_fpga.jobs_hydrogen import (
    DEFAULT_ACTION_S,
    FAILURE_LINE_CHARS,
    MAX_LOGGED_FAILURES,
    MAX_PREDICTED_S,
    OVERDUE_RECHECK_MAX_S,
    RETRY_FIRST_S,
    RETRY_MAX_S,
    RETRY_SLACK,
    WAKE_MARGIN_S,
    HydrogenDispatch,
)
from irm_fpga.jobs_progress import ProgressCounters, seen_entry
from irm_fpga.jobs_resizing import GroupResizer
from irm_fpga.jobs_rows import ACTIVE, MAX_ALLOCATIONS, QUEUED, RETIRED, capped_history, mean_devices, qos_job
from irm_fpga.jobs_validation import (
    MAX_ACTION_S,
    MAX_PRIORITY,
    MAX_THROUGHPUT_GOAL,
    MIN_ACTION_S,
    RequestChecks,
    replayed,
)
from irm_fpga.jobs_watch import (
    MAX_WATCH_BACKLOG,
    MAX_WATCHES,
    MAX_WATCHES_PER_TENANT,
    job_watchers,
    watch_stream,
)
from irm_fpga.qos import dispatch
from irm_fpga.qos.edf import edf_allocate
from irm_fpga.qos.jobs import DEADLINE, THROUGHPUT, JobProgress
from irm_fpga.qos.registry import canonical, is_scheduling
from irm_fpga.qos.throughput import (
    ControllerState,
    admission_request,
    admit,
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
from services.idempotency import request_hash
from services.watch import Broadcaster

# The manager's parts (`irm_fpga.jobs_*`: config, rows, progress, devices, groups, resizing, hydrogen, validation,
# watch) took names tests, the Orchestrator and benchmarks import from here: still here. A limit is read where it
# is used: patch it in its own module (`irm_fpga.jobs_watch.MAX_WATCH_BACKLOG`), not here.
__all__ = [
    "ACTIVE", "DEFAULT_ACTION_S", "FAILURE_LINE_CHARS", "LOAD_WAIT_S", "MAX_ACTION_S", "MAX_ALLOCATIONS",
    "MAX_CONTROL_PERIOD_S", "MAX_ID_CHARS", "MAX_LIST_BYTES", "MAX_LOGGED_FAILURES", "MAX_PREDICTED_S", "MAX_PRIORITY",
    "MAX_THROUGHPUT_GOAL", "MAX_WATCHES", "MAX_WATCHES_PER_TENANT", "MAX_WATCH_BACKLOG", "MIN_ACTION_S",
    "OVERDUE_RECHECK_MAX_S", "QUEUED", "RETIRED", "RETRY_FIRST_S", "RETRY_LOADING_S", "RETRY_MAX_S", "RETRY_SLACK",
    "SERVICE", "WAKE_MARGIN_S", "JobManager", "JobsConfig", "capped_history", "dispatch", "job_component_parts",
    "mean_devices",
]

log = logging.getLogger(__name__)
SERVICE = "harness.v1.FpgaJobs"
_STATES = {ACTIVE: fpga_jobs_pb2.Job.STATE_ACTIVE, RETIRED: fpga_jobs_pb2.Job.STATE_RETIRED,
           QUEUED: fpga_jobs_pb2.Job.STATE_QUEUED}
LOAD_WAIT_S = 10.0              # a request that comes while the manager loads waits this long, then UNAVAILABLE
MAX_ID_CHARS = 64               # job ids are stored in 64 characters
# A ListJobs page also ends at this many bytes of jobs (next_page_token goes on from there; at least one job a
# page): 1000 jobs (the largest page) with long allocation histories are ~14 MiB, where a client receives 4 MiB
# by default (as the Application Manager's ListApplications).
MAX_LIST_BYTES = 3 * 1024 * 1024
RETRY_LOADING_S = 1.0           # UNAVAILABLE while the manager loads its jobs: try again this much later


class JobManager(HydrogenDispatch, fpga_jobs_pb2_grpc.FpgaJobsServicer):
    def __init__(self, orchestrator: Any, config: JobsConfig | None = None, clock: Clock | None = None) -> None:
        self.config = config or JobsConfig()
        # A Hydrogen policy dispatches from a ready queue; None: "edf" or "throughput" resize groups.
        self.scheduler: dispatch.Scheduler | None = checked_scheduler(self.config)
        self._init_dispatch()                  # the ready queue's state (`HydrogenDispatch`)
        self._timer = threading.Condition()    # the control thread sleeps on it: a new wake or a stop rings it
        self.orch = orchestrator
        self.db = orchestrator.db
        self.clock: Clock = clock or orchestrator.clock
        self.lock = threading.RLock()          # one decision at a time
        self._states: dict[str, ControllerState] = {}
        # The servers' progress counters of the jobs' groups (`ProgressCounters`): the counters last seen, per job
        # and server, saved with each job's controller, and the jobs whose first reading is a baseline.
        self.progress = ProgressCounters(orchestrator, self.db, lambda rows: self._publish(rows))
        self._seen = self.progress.seen
        self._unseen = self.progress.unseen
        # The devices the policies share out, and the servers holding job groups that have gone silent.
        self.devices = JobDevices(orchestrator, self.db, self.clock, self.config.silent_server_s)
        self._last: dict[str, tuple[float, int]] = {}        # job -> (time, actions) at the last sample
        self._stop = threading.Event()
        # Set once `start` has loaded the persisted state: the server may take requests before (the
        # Orchestrator's start-up reconcile runs first), and a retirement read against empty counters
        # would count a job's whole progress again.
        self._ready = threading.Event()
        # EDF and throughput apply their decisions through it; its `unapplied` is this manager's `_unapplied`.
        self.resizer = GroupResizer(orchestrator, self.devices, self.config.policy, self._states,
                                    lambda *a, **kw: self._update(*a, **kw))   # late: tests replace `_update`
        # EDF: the pool (`JobDevices.pool`) its last decision shared out. Each control round computes it again:
        # devices another group gave back (or a server that came back) are an event too, or they would stay idle
        # until a job registers or retires.
        self._edf_pool: int | None = None
        self.checks = RequestChecks(orchestrator, self.config, self.scheduler)     # RegisterJob's
        self.groups = JobGroups(orchestrator, self.db)          # the jobs' groups: strays and orphans dropped
        self._thread = threading.Thread(target=self._loop, name="fpga-jobs", daemon=True)
        self.watchers: Broadcaster[fpga_jobs_pb2.Job] = job_watchers()      # WatchJobs streams

    @property
    def _unapplied(self) -> bool:
        """EDF: the last decision was not (fully) applied -- skipped while a server was silent, or a resize
        refused (`GroupResizer.unapplied`). The next control round decides again; otherwise EDF decides only on
        events."""
        return self.resizer.unapplied

    @_unapplied.setter
    def _unapplied(self, value: bool) -> None:
        self.resizer.unapplied = value

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

    def check_policy(self) -> None:
        """The refusal of `start` (ValueError) over jobs the policy cannot manage, read only: the FPGA IRM asks
        before it offers anything (registers with a CRS, reconciles its servers) so that a start refused for
        its policy leaves no trace there. A job whose group is gone (its retirement cut short) does not count."""
        rows = self._active()
        self._check_compatible(self._with_groups(rows), self._queued() if self.scheduler is None else [])

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
                self._states[row.id] = initial_state(qos_job(row), now, actions, row.devices)
                self._last[row.id] = (now, actions)
                self._unseen[row.id] = set(self.orch.servers)
                continue
            self._states[row.id] = ControllerState(
                last_time=c.last_time, last_actions=c.last_actions, a_hat=c.a_hat, throughput=c.throughput,
                goal=c.goal, request=c.request, performance=c.performance)
            self._last[row.id] = (c.sample_time, c.sample_actions)
            self._seen[row.id] = {k: seen_entry(v) for k, v in (c.seen or {}).items()}
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

    # -- decisions -----------------------------------------------------------
    def _observe(self, rows: list[FpgaJob]) -> dict[str, int]:
        """Completed actions per job: the servers' group counters (monotone) or the reports, the larger."""
        return self.progress.observe(rows)

    def _pool(self, active: list[FpgaJob], caps: dict[str, int] | None = None) -> int:
        """`JobDevices.pool` (tests read the pool here)."""
        return self.devices.pool(active, caps)

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
                    st = self._states[r.id] = initial_state(qos_job(r), r.registered_at, 0, r.devices)
                if now > st.last_time:
                    stepping.append(r)
            caps = self.devices.caps_if_known(rows) if stepping else None
            if caps is None:
                self._save_controllers([r.id for r in rows], now)
                return {}
            pool = self.devices.pool(rows, caps)
            # The devices each job has on servers that answer: a server taken as gone took its parts with it
            # (their devices are out of the pool; the resize below gives them up).
            live = self.devices.live_devices(rows, caps)
            jobs, obs = [], {}
            for r in stepping:
                st = self._states[r.id]
                held = mean_devices(capped_history(r.allocations, st.last_time), st.last_time, now, r.devices)
                if r.devices > live[r.id]:
                    held *= live[r.id] / r.devices
                jobs.append(qos_job(r))
                obs[r.id] = JobProgress(now, actions[r.id], live[r.id], held=held)
            # A job with no step to take (registered this very instant) keeps its devices: the broker shares
            # what the others hold, or it would hand that job's devices out again.
            pool -= sum(live[r.id] for r in rows if r.id not in obs)
            alloc, states, _ = throughput_decide(jobs, {j.job_id: self._states[j.job_id] for j in jobs}, obs,
                                                 pool, alpha=self.config.alpha)
            self._states.update(states)
            self._save_controllers([r.id for r in rows], now)
            self.resizer.apply(alloc, [r for r in rows if r.id in alloc], now, caps)
            return alloc

    # -- API ---------------------------------------------------------------
    def _registered(self, tenant: str, request_id: str) -> FpgaJob | None:
        with self.db.read() as s:
            return s.scalar(select(FpgaJob).where(FpgaJob.tenant == tenant, FpgaJob.request_id == request_id))

    def register(self, request: fpga_jobs_pb2.RegisterJobRequest) -> FpgaJob:
        tenant = require_tenant(request.tenant)
        self._wait_loaded()
        fingerprint = request_hash(request)
        # A retry gets its job whatever the devices are doing now (blacklisted, unreachable).
        if request.request_id and (existing := self._registered(tenant, request.request_id)) is not None:
            return replayed(existing, fingerprint)
        self.checks.validate(request)
        usable = self.checks.usable_or_unavailable(request)
        v = Violations()
        self.checks.capacity_violations(request, usable, v)
        v.raise_if_any()
        with self.lock:      # check-then-create as one step: a concurrent retry finds the first job
            if (existing := self._registered(tenant, request.request_id)) is not None:
                return replayed(existing, fingerprint)
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
            job = qos_job(row)
            rows = self._retire_groupless(self._active(), now)
            caps = self.devices.caps_if_known(rows)
            if caps is None:                    # the others' devices cannot be counted: shrinking them would
                raise Unavailable("an FPGA-server holding job groups did not answer: the job manager cannot "
                                  "count its devices now; retry later", reason=MANAGER_UNAVAILABLE,
                                  retry_after_s=self.checks.retry_silent_s())
            pool = self.devices.pool(rows, caps)
            live = self.devices.live_devices(rows, caps)       # parts on servers taken as gone hold nothing
            if self.config.policy == THROUGHPUT:
                reqs = {r.id: admission_request(qos_job(r), self._states.get(r.id), live[r.id]) for r in rows}
                alloc = admit(job, live, reqs, pool, priorities={r.id: r.priority for r in rows})
            else:
                alloc = edf_allocate([*(qos_job(r) for r in rows), job], pool)
            n = (alloc or {}).get(row.id, 0)
            if n < 1:
                raise ResourceExhausted(f"no device for the job's minimum ({row.min_devices}) under "
                                        f"{self.config.policy!r}: {pool} device(s) in the pool; retry once a "
                                        f"job retires or ask for fewer devices",
                                        reason=CAPACITY_IN_USE, retry_after_s=RETRY_LATER_S)
            # A job's group never goes below one device: refuse before touching the others' groups.
            starved = [r for r in rows if alloc.get(r.id, 0) < 1]
            if starved:
                # Each job keeps at least its minimum, and one device: what the others' minimums take is the limit
                # -- or, under throughput control, devices on servers taken as gone, which count for no job.
                floors = sum(max(1, r.min_devices) for r in rows)
                need = floors + max(1, row.min_devices)
                why = (f"the job's minimum ({max(1, row.min_devices)}) and the {len(rows)} active job(s)' minimums "
                       f"({floors} device(s)) need {need} device(s); the pool has {pool}" if need > pool else
                       f"{pool} device(s) in the pool, the devices on servers taken as gone counting for no job")
                # The caller's own jobs by id; other tenants' only counted (their ids are theirs).
                own = [r.id for r in starved if r.tenant == tenant]
                others = len(starved) - len(own)
                named = ", ".join([*own[:5], *([f"{others} job(s) of other tenants"] if others else [])])
                raise ResourceExhausted(
                    f"{why}: {self.config.policy!r} would leave {named} without a device; ask for fewer devices or "
                    "wait for a job to retire", reason=CAPACITY_IN_USE, retry_after_s=RETRY_LATER_S)
            self.resizer.apply({k: v for k, v in alloc.items() if k != row.id}, [r for r in rows if alloc[r.id] < r.devices],
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
                self.groups.drop(row.group_id)     # never a group without its job
                self._rebalance(now)
                raise
            self.resizer.apply(alloc, [r for r in self._active() if r.id != row.id], now, caps)
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
        with self.lock:                          # no registration or dispatch half-made meanwhile
            for gid in self.groups.orphans():
                log.warning("dropping a job group no job owns", extra={"group": gid})
                self.groups.drop(gid)

    def _retire_groupless(self, rows: list[FpgaJob], now: float) -> list[FpgaJob]:
        """`rows` (active jobs) but those whose group is gone, which are retired (under the lock). A retirement cut
        short after deleting the group (`_finish`) left such a job active for good: every decision gave it devices
        it cannot use (its resizes refused) and the other jobs the rest. Looked at on start and before decisions:
        the running manager meets it too, after a write that failed."""
        kept = self._with_groups(rows)
        for r in rows:
            if r not in kept:
                log.warning("retiring an active job whose FPGA group is gone: its retirement was cut short after "
                            "the group was deleted (the FPGA IRM stopped, or a database write failed, in between); "
                            "it held no devices since", extra={"job": r.id, "tenant": r.tenant, "group": r.group_id})
                self._finish(r.id, now, cut_short=True)
        return kept

    def _with_groups(self, rows: list[FpgaJob]) -> list[FpgaJob]:
        """`rows` (active jobs) but those whose FPGA group is gone (deleted)."""
        live = self.groups.live({r.group_id for r in rows if r.group_id})
        return [r for r in rows if r.group_id in live]

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
            caps = self.devices.caps_if_known(rows) if rows else None
        self._unapplied = bool(rows) and caps is None      # a silent server: decided again next round
        if caps is not None:                                # a refusal sets it
            pool = self.devices.pool(rows, caps)
            self.resizer.apply(self.resizer.edf_allocation(rows, pool), rows, now, caps)
            self._edf_pool = pool

    def _edf_pool_changed(self, rows: list[FpgaJob]) -> dict[str, int] | None:
        """EDF, every control round: the servers' usable devices (`JobDevices.answering`) if the pool is no longer the one
        the last decision shared out (devices freed by another group, a server back or gone), else None (also
        while a server holding job groups is silent: the round after it answers, or is taken as gone, looks
        again)."""
        if self.config.policy != "edf" or self.scheduler is not None or not rows:
            return None
        caps, waiting = self.devices.answering(rows)
        if waiting or self.devices.pool(rows, caps) == self._edf_pool:
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
        self.groups.drop(row.group_id)
        if self.scheduler is not None:
            self.groups.drop_strays(row.tenant, row.id, keep=row.group_id)    # an earlier failed dispatch's, if any
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
        for d in (self._states, self._seen, self._last, self.resizer.refused):
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
            if row.goal == DEADLINE:
                completed = min(completed, row.size_actions)    # its size is all a deadline job has to do
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
            waiting_reason=self.queued_reason(row) if row.state == QUEUED else "")
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

    def _watch(self, tenant: str, one: str, context: Any) -> Iterator[fpga_jobs_pb2.Job]:
        """The stream of one WatchJobs call (`watch_stream`): snapshot, changes, then the end or an error."""

        def snapshot() -> list[fpga_jobs_pb2.Job]:
            if one:
                return [self.to_proto(self._job(tenant, one))]
            with self.db.read() as s:
                rows = list(s.scalars(select(FpgaJob).where(FpgaJob.tenant == tenant, FpgaJob.state != RETIRED)
                                      .order_by(FpgaJob.registered_at, FpgaJob.id)))
            return [self.to_proto(r) for r in rows]

        return watch_stream(self.watchers, tenant, one, context, snapshot, stopping_retry_s=RETRY_LOADING_S)

    def pool_devices(self) -> int:
        """Devices the manager may give jobs now (a Hydrogen managed mode: its elastic pool)."""
        with self.lock:
            active = self._active()
            if self.scheduler is None:
                return self.devices.pool(active)
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
    register.check = manager.check_policy  # type: ignore[attr-defined]
    return register, [SERVICE], manager.start, manager.stop
