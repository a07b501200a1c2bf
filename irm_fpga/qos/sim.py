"""Discrete-event simulations of the QoS policies on virtual time.

Two models, each the one its paper's experiments are defined on:

* `run_allocation` (seed 000 §IV): a fluid model of jobs made of many small,
  independent actions, time advanced in fixed ticks of a `VirtualClock`. A job
  holding n devices completes n / action_time actions per second (times a
  seeded per-period noise factor); completed actions are the floor of the
  work done. Seed 000 measures its deadline runs without reconfiguration
  overhead and with actions short against the job, which is what this model
  is; it does not drive `irm_fpga.engine.Engine` (that engine emulates every
  action as a task, which the policies do not need, and it is being changed
  concurrently). The same policy functions run live: only the progress
  source differs.
* `run_hydrogen` (seed 001 §VI, itself a discrete-event simulation): jobs
  arrive (Poisson, seeded), wait in a ready queue, are dispatched
  non-preemptively on r devices for `true_cost(job, r)` seconds (Table II's
  sub-linear scaling); the scheduler decides on every arrival and completion
  with eq. 1, as seed 001 §IV does "for this paper" (or the learned model,
  fed with the measured executions). Managed mode, the paper's or the
  deadline-aware one, can run with its elasticity manager in the loop
  (Algorithm 1, line 9). `late_lower_bound` and `late_lower_bound_energy`
  bound N_L from below for any policy on a given arrival sequence.
"""

from __future__ import annotations

import bisect
import heapq
import math
import random
from collections import deque
from collections.abc import Callable, Sequence
from contextlib import closing
from dataclasses import dataclass, field

import numpy as np

from irm_fpga.qos import dispatch
from irm_fpga.qos import hydrogen as hy
from irm_fpga.qos.edf import edf_allocate
from irm_fpga.qos.jobs import DEADLINE, JobProgress, QosJob
from irm_fpga.qos.plugin_worker import PluginRunner
from irm_fpga.qos.plugins import is_external
from irm_fpga.qos.throughput import DEFAULT_ALPHA, admit, initial_state, throughput_decide
from services.clock import VirtualClock


@dataclass
class JobTrace:
    job_id: str
    finished_at: float | None = None
    allocations: list[tuple[float, int]] = field(default_factory=list)    # (time, devices) changes
    requests: list[tuple[float, int]] = field(default_factory=list)       # controller requests (throughput)
    window_throughput: list[tuple[float, float]] = field(default_factory=list)  # per control period


@dataclass
class AllocationRun:
    traces: dict[str, JobTrace]
    busy_device_seconds: float
    makespan: float
    devices: int

    @property
    def utilisation(self) -> float:
        return self.busy_device_seconds / (self.devices * self.makespan) if self.makespan > 0 else 0.0


def run_allocation(jobs: Sequence[QosJob], policy: str, *, devices: int = 8, action_time: float = 0.1,
                   period: float = 2.0, tick: float = 0.05, alpha: float = DEFAULT_ALPHA,
                   static: dict[str, int] | None = None, noise: float = 0.0, seed: int = 0,
                   sizes: dict[str, int] | None = None, horizon: float = 1000.0,
                   blacklisted: int = 0) -> AllocationRun:
    """Run `jobs` (submitted at their `submitted_at`) under `edf`, `throughput` or `static`.

    `sizes` gives the actions of throughput jobs (deadline jobs carry `size`). A job that ends part-way
    through a tick frees its devices at that instant; EDF reallocates them then, and the other jobs run on
    the new allocation for the rest of the tick only (`static` and `throughput` reallocate on arrivals and
    control periods, so their freed devices stay idle until then).
    """
    clock = VirtualClock()
    rng = random.Random(seed)
    usable = devices - blacklisted
    size = {j.job_id: (j.size if j.goal == DEADLINE else (sizes or {}).get(j.job_id, 10**9)) for j in jobs}
    pending = sorted(jobs, key=lambda j: (j.submitted_at, j.job_id))
    active: list[QosJob] = []
    work = {j.job_id: 0.0 for j in jobs}
    alloc: dict[str, int] = {}
    states = {}
    traces = {j.job_id: JobTrace(j.job_id) for j in jobs}
    last_actions = {j.job_id: 0 for j in jobs}
    factor = {j.job_id: 1.0 for j in jobs}
    busy = 0.0
    next_control = period
    last_end = 0.0

    def set_alloc(new: dict[str, int], at: float | None = None) -> None:
        for jid, n in new.items():
            if alloc.get(jid) != n:
                traces[jid].allocations.append((clock.now() if at is None else at, n))
        alloc.clear()
        alloc.update(new)

    while (pending or active) and clock.now() < horizon:
        now = clock.now()
        changed = False
        while pending and pending[0].submitted_at <= now + 1e-9:
            j = pending.pop(0)
            active.append(j)
            changed = True
            if policy == "throughput":
                reqs = {a: states[a].request for a in alloc}
                new = admit(j, alloc, reqs, usable)
                if new is None:
                    active.remove(j)
                    continue
                set_alloc(new)
                states[j.job_id] = initial_state(j, now, 0, alloc[j.job_id])
        if policy == "static" and changed:
            set_alloc({j.job_id: static[j.job_id] for j in active})
        if policy == "edf" and changed:
            set_alloc(edf_allocate(active, usable))
        if policy == "throughput" and now >= next_control - 1e-9:
            next_control += period
            obs = {j.job_id: JobProgress(now, int(work[j.job_id]), alloc.get(j.job_id, 0)) for j in active}
            for j in active:
                traces[j.job_id].window_throughput.append(
                    (now, (obs[j.job_id].actions - last_actions[j.job_id]) / (now - states[j.job_id].last_time)))
                last_actions[j.job_id] = obs[j.job_id].actions
            new, states_new, _ = throughput_decide(active, states, obs, usable, alpha=alpha)
            states.update(states_new)
            for j in active:
                traces[j.job_id].requests.append((now, states_new[j.job_id].request))
            set_alloc(new)
            if noise:
                for j in active:
                    factor[j.job_id] = max(0.0, 1.0 + rng.uniform(-noise, noise))
        # advance one tick
        elapsed = 0.0
        while active:
            rem = max(0.0, tick - elapsed)
            start = now + elapsed
            rates = {j.job_id: alloc.get(j.job_id, 0) / action_time * factor[j.job_id] for j in active}
            ends = {j.job_id: (size[j.job_id] - work[j.job_id]) / rates[j.job_id] for j in active
                    if rates[j.job_id] > 0 and size[j.job_id] - work[j.job_id] <= rates[j.job_id] * rem}
            if policy != "edf" or not ends:
                # No allocation changes before the tick ends: each job runs at its rate for the rest of it.
                for j in list(active):
                    n = alloc.get(j.job_id, 0)
                    if j.job_id in ends:
                        dt = ends[j.job_id]
                        work[j.job_id] = size[j.job_id]
                        busy += n * dt
                        traces[j.job_id].finished_at = start + dt
                        last_end = max(last_end, start + dt)
                        active.remove(j)
                        alloc.pop(j.job_id, None)
                    else:
                        work[j.job_id] += rates[j.job_id] * rem
                        busy += n * rem
                break
            # EDF hands a finished job's devices to the others at once, so the rest of the tick runs on the new
            # allocation: the others may use those devices only from the first finish on, never for the whole
            # tick (that would count the freed devices twice).
            dt = min(ends.values())
            for j in list(active):
                n = alloc.get(j.job_id, 0)
                if j.job_id in ends and ends[j.job_id] <= dt + 1e-12:
                    work[j.job_id] = size[j.job_id]
                    busy += n * ends[j.job_id]
                    traces[j.job_id].finished_at = start + ends[j.job_id]
                    last_end = max(last_end, start + ends[j.job_id])
                    active.remove(j)
                    alloc.pop(j.job_id, None)
                else:
                    work[j.job_id] += rates[j.job_id] * dt
                    busy += n * dt
            elapsed += dt
            set_alloc(edf_allocate(active, usable), at=now + elapsed)
        clock.advance(tick)
    return AllocationRun(traces, busy, last_end or clock.now(), devices)


# -- Hydrogen -------------------------------------------------------------------------------

@dataclass(frozen=True)
class JobType:
    name: str
    default_time: float       # seconds on one device (eq. 1's defaultTime)
    min_devices: int
    max_devices: int
    share: float              # fraction of arrivals
    priority: float = 1.0
    target: float | None = None   # JLO target (s from arrival); None: late_after + eq. 1 at min


@dataclass(frozen=True)
class Scenario:
    name: str
    types: tuple[JobType, ...]
    rate: float               # arrivals per second
    duration: float
    strategy: str
    pool: int = 4
    overhead: float = 0.044   # serial fraction: Table II's speedup 3.53 on 4 FPGAs
    spread: float | None = None   # inter-arrival times uniform on mean*(1 +- spread); None: exponential


def true_cost(job: hy.HJob, devices: int, overhead: float) -> float:
    return job.default_time * (overhead + (1.0 - overhead) / devices)


@dataclass
class HydrogenMetrics:
    W_T: float
    S_T: float
    U_c: float
    N_C: int
    N_L: int
    chosen: dict[str, int]
    mean_pool: float = 0.0
    scalings: dict[str, int] = field(default_factory=dict)


def arrivals(sc: Scenario, seed: int, late_after: float = hy.LATE_AFTER_S) -> list[hy.HJob]:
    rng = random.Random(seed)
    t, out, i = 0.0, [], 0
    weights = [ty.share for ty in sc.types]
    while True:
        t += rng.expovariate(sc.rate) if sc.spread is None else rng.uniform(1 - sc.spread, 1 + sc.spread) / sc.rate
        if t >= sc.duration:
            return out
        ty = rng.choices(sc.types, weights)[0]
        target = ty.target if ty.target is not None else late_after + ty.default_time / ty.min_devices
        out.append(hy.HJob(f"{ty.name}{i}", t, ty.default_time, ty.min_devices, ty.max_devices, ty.priority,
                           design=ty.name, target=target))
        i += 1


MANAGED_MODES = dispatch.MANAGED_MODES


def run_hydrogen(sc: Scenario, algorithm: str, seed: int, *, window: int = 30, learned: bool = False,
                 late_after: float = hy.LATE_AFTER_S, elasticity: bool = False, beta: float = 2.5,
                 pool_min: int = 1, algorithms: dict | None = None, forecast: int = 0,
                 trace: list | None = None, lookahead: int = 0, plugin: Callable[..., object] | None = None,
                 plugin_timeout_s: float | None = None) -> HydrogenMetrics:
    """One run of `algorithm` (a single algorithm, "managed" or "managed_deadline") on `sc` (seed 001 §VI).

    The scheduler decides on every arrival and completion (events at one
    instant are all applied first) with eq. 1 (`learned`: the learned cost
    model, fed with the measured executions); jobs run for `true_cost`. The
    scheduler sees a running job's end as its start plus the cost model's
    time, not the true end. Single algorithms run on a fixed pool of
    `sc.pool` devices.

    "managed" (seed 001 Algorithm 1 as written) chooses among `algorithms`
    (default: the paper's four) by `sc.strategy`; with `elasticity` it also
    runs line 9: the selected schedule's JLOs (`hy.schedule_jlos`) go to
    Algorithm 3, which grows or shrinks the pool by one device within
    [pool_min, sc.pool] after the dispatch.

    "managed_deadline" (the deadline-aware mode) chooses among `algorithms`
    (default: `hy.DEADLINE_ALGORITHMS`) by `hy.deadline_score`; with
    `elasticity` it runs `hy.deadline_elasticity` before the dispatch, a
    shrink checked against `forecast` expected arrivals
    (`hy.forecast_arrivals`, 0: none).

    The pool changes at once (a device leaving while busy leaves when its
    job ends, and is counted as provisioned until then), and never exceeds
    `sc.pool`, so managed mode never has more devices than the single
    algorithms.

    With `lookahead` > 0, "managed_deadline" selects with
    `irm_fpga.qos.lookahead.lookahead_schedule` instead of its candidate
    algorithms, over `lookahead` futures sampled from the arrivals of the last
    `hy.FORECAST_SPAN_S` s (seeded by `seed` and the latest arrival: runs
    repeat, and decisions between two arrivals see the same futures).

    Every decision is `irm_fpga.qos.dispatch.decide`, the call the FPGA IRM's job
    manager makes live under a Hydrogen policy. A scheduler that may hold a
    job back with devices free (`Scheduler.wakes`: the lookahead) also
    decides at the next start deadline of a job it left waiting
    (`hy.wake_time`), as the live manager does.

    `trace`, if given, gets one (job, start, devices, seconds) per dispatch.

    A plug-in (`irm_fpga.qos.plugins`: `algorithm` is `package.module:function` or an entry point's name) is
    called in this process by default, without a time limit. With `plugin_timeout_s` it runs as it does
    live, in a worker process of its own (`plugin_worker.PluginRunner`, started for this run and stopped
    after it), each decision answered within that many seconds; `plugin` passes a runner of the caller's
    (reused across runs: `harness bench policies` does). Either way a plug-in's fault -- an exception, an
    answer `plugins.check_allocation` refuses, and with a runner a time-out, a crash or an `exit()` -- ends
    the run with a `plugins.PolicyError` naming it. Built-in algorithms always run in this process.

    N_L: jobs dispatched after waiting more than `late_after` s, plus jobs
    still waiting longer than that at the end. U_c: busy device-seconds over
    provisioned device-seconds (sc.pool * duration without elasticity).
    """
    scheduler = dispatch.Scheduler(algorithm, window=window, late_after=late_after, strategy=sc.strategy,
                                   elasticity=elasticity and algorithm in MANAGED_MODES, beta=beta,
                                   pool_min=pool_min, forecast=forecast, lookahead=lookahead, seed=seed,
                                   algorithms=algorithms)
    # (`dispatch.decide` calls `plugin` for a plug-in only: built-in algorithms and managed modes ignore it.)
    if plugin is None and plugin_timeout_s is not None and algorithm not in MANAGED_MODES and is_external(algorithm):
        with closing(PluginRunner(algorithm, timeout_s=plugin_timeout_s, late_after=late_after)) as runner:
            runner.start()      # loaded before the first decision, whose time limit is not for importing it
            return _run_hydrogen(sc, scheduler, seed, learned, late_after, trace, runner)
    return _run_hydrogen(sc, scheduler, seed, learned, late_after, trace, plugin)


def _run_hydrogen(sc: Scenario, scheduler: dispatch.Scheduler, seed: int, learned: bool, late_after: float,
                  trace: list | None, plugin: Callable[..., object] | None) -> HydrogenMetrics:
    algorithm = scheduler.algorithm
    jobs = arrivals(sc, seed, late_after)
    model: Callable = hy.LearnedCostModel() if learned else hy.linear_cost
    events: list[tuple[float, int, int, object]] = []      # (time, kind 0=end 1=arrival 2=wake, seq, payload)
    seq = 0
    for j in jobs:
        heapq.heappush(events, (j.arrival, 1, seq, j))
        seq += 1
    queue: list[hy.HJob] = []
    running: dict[str, tuple[float, int]] = {}
    running_jobs: dict[str, hy.HJob] = {}
    starts: dict[str, tuple[float, int]] = {}                # running job -> (start, devices)
    history: deque[hy.HJob] = deque()                        # recent arrivals (the forecast's input)
    waits: list[float] = []
    services: list[float] = []
    busy = 0.0
    done = 0
    chosen: dict[str, int] = {}
    scalings: dict[str, int] = {}
    pool = sc.pool
    provisioned = 0.0           # device-seconds
    last = 0.0
    now = 0.0
    while events and events[0][0] <= sc.duration:
        now = events[0][0]
        provisioned += max(pool, sum(n for _, n in running.values())) * (now - last)   # a removed busy device stays
        last = now
        while events and events[0][0] <= now:
            _, kind, _, payload = heapq.heappop(events)
            if kind == 2:
                continue                # a held job's start deadline: a decision, nothing else
            if kind == 0:
                job, n, took = payload
                running.pop(job.job_id)
                running_jobs.pop(job.job_id)
                starts.pop(job.job_id)
                done += 1
                services.append(took)
                if learned:
                    model.observe(job, n, took)
            else:
                queue.append(payload)
                history.append(payload)
                while history[0].arrival < now - hy.FORECAST_SPAN_S:
                    history.popleft()
        free = pool - sum(n for _, n in running.values())
        if not queue or (free <= 0 and not scheduler.elasticity):
            continue
        # The scheduler's view of a running job's end: its start plus the cost model's time (never before now).
        ends = [hy.RunningJob(running_jobs[k], max(now, s + model(running_jobs[k], n)), n)
                for k, (s, n) in starts.items()]
        d = dispatch.decide(scheduler, queue, now=now, pool=pool, pool_max=sc.pool, running=ends, cost=model,
                            history=list(history), plugin=plugin)
        decision, pool = d.allocation, d.pool
        if d.scaling:
            scalings[d.scaling] = scalings.get(d.scaling, 0) + 1
        if decision and algorithm in MANAGED_MODES:
            chosen[d.algorithm] = chosen.get(d.algorithm, 0) + 1
        picked = dict(decision)
        for job in [q for q in queue if q.job_id in picked]:
            n = picked[job.job_id]
            took = true_cost(job, n, sc.overhead)
            waits.append(now - job.arrival)
            if trace is not None:
                trace.append((job, now, n, took))
            end = now + took
            busy += n * (min(end, sc.duration) - now)
            running[job.job_id] = (end, n)
            running_jobs[job.job_id] = job
            starts[job.job_id] = (now, n)
            heapq.heappush(events, (end, 0, seq, (job, n, took)))
            seq += 1
        queue = [q for q in queue if q.job_id not in picked]
        if scheduler.wakes and (wake := hy.wake_time(queue, now, late_after)) is not None:
            heapq.heappush(events, (wake, 2, seq, None))
            seq += 1
    provisioned += max(pool, sum(n for _, n in running.values())) * (sc.duration - last)
    late = sum(1 for w in waits if w > late_after) + sum(1 for q in queue if sc.duration - q.arrival > late_after)
    return HydrogenMetrics(W_T=sum(waits) / len(waits) if waits else 0.0,
                           S_T=sum(services) / len(services) if services else 0.0,
                           U_c=busy / provisioned if provisioned > 0 else 0.0, N_C=done, N_L=late, chosen=chosen,
                           mean_pool=provisioned / sc.duration, scalings=scalings)


def late_lower_bound(jobs: Sequence[hy.HJob], pool: int, work: Callable[[hy.HJob], float],
                     late_after: float = hy.LATE_AFTER_S, max_span: int = 80) -> int:
    """A lower bound on N_L that holds for every policy, even one that knows the arrivals in advance.

    Take consecutive arrivals i..k (at most `max_span` of them): none is late only if each starts
    within `late_after` s of its arrival, so all start in [a_i, a_k + late_after]. Every one of them
    that is not still running at a_k + late_after did all its work inside that interval; at most
    `pool` are still running then. So the work of all but the `pool` largest must fit in `pool`
    devices over the interval; each job moved out of the set (made late), largest first, lowers
    that work. `work(job)` is a job's least device-seconds on any allowed number of devices. Bounds
    of disjoint runs of arrivals add up (weighted interval scheduling over the runs).
    """
    n = len(jobs)
    arr = [j.arrival for j in jobs]
    best_at: dict[int, list[tuple[int, int]]] = {}
    for i in range(n):
        works: list[float] = []
        for k in range(i, min(n, i + max_span)):
            bisect.insort(works, work(jobs[k]))
            rest = works[:-pool] if len(works) > pool else []
            need, cap, m = sum(rest), pool * (arr[k] + late_after - arr[i]), 0
            while need > cap + 1e-9 and rest:
                need -= rest.pop()
                m += 1
            if m:
                best_at.setdefault(k, []).append((i, m))
    total = [0] * (n + 1)
    for k in range(n):
        total[k + 1] = max([total[k], *(total[i] + m for i, m in best_at.get(k, []))])
    return total[n]


# Longest interval `late_lower_bound_energy` tries: the overloads behind seed 001 §VI scenario 2's late
# jobs last a few seconds (the one on seed 4 spans 5.5 s); longer intervals only cost time.
ENERGY_SPAN_S = 8.0


def late_lower_bound_energy(jobs: Sequence[hy.HJob], pool: int,
                            sizes: Callable[[hy.HJob], Sequence[tuple[int, float]]],
                            late_after: float = hy.LATE_AFTER_S, span: float = ENERGY_SPAN_S) -> int:
    """Another lower bound on N_L that holds for every policy, from the device-time each job must spend in an interval.

    `sizes(job)`: every (devices, seconds) the job may run on. A job that is not late starts at some s in
    [arrival, arrival + late_after] on some r of its sizes and holds r devices over [s, s + t(r)], so inside
    an interval [t1, t2] it uses at least E = min over r, and over s at either end of its start window (for
    a given r the overlap of [s, s + t(r)] with [t1, t2] is smallest at an end), of r * that overlap. The
    minimum over r matters: a wide job that straddles t1 leaves the interval sooner and may use less
    device-time in it than at its min. The pool gives `pool` * (t2 - t1) device-seconds; while the E of
    the jobs exceed it, jobs must be late, at least as many as it takes, dropping the largest E first, to
    fit (a late job may run anywhere, so it drops out whole). Jobs that are not counted only make it
    weaker. This test is known as energetic reasoning; it is not in the papers, and it catches overloads
    that `late_lower_bound` (which lets the `pool` largest jobs of a run spill out of its interval) misses.

    t1 and t2 range over the start deadlines (arrival + late_after), t2 - t1 <= `span`; returns the
    largest count over those intervals (counts of different intervals are not added: a job may be in
    several). Leave out jobs that need not start: in a run of finite length, one that arrives within
    `late_after` of the end is not late if it never starts.
    """
    js = sorted(jobs, key=lambda j: (j.arrival, j.job_id))
    if not js:
        return 0
    opts = [list(sizes(j)) for j in js]
    k = max(len(o) for o in opts)
    dev = np.array([[r for r, _ in o] + [o[-1][0]] * (k - len(o)) for o in opts], dtype=float)
    dur = np.array([[t for _, t in o] + [o[-1][1]] * (k - len(o)) for o in opts], dtype=float)
    arr = np.array([j.arrival for j in js])
    starts = np.stack([arr, arr + late_after], axis=1)                       # (n, 2): ends of each start window
    bounds = np.unique(starts[:, 1])       # the candidate t1 and t2
    reach = late_after + dur.max()         # a job arriving before t1 - reach has ended by t1 whatever it does
    work = (dev * dur).min(axis=1)         # a job's least device-seconds
    cum = np.concatenate([[0.0], np.cumsum(work)])
    best = 0
    for t1 in bounds:
        t2 = bounds[np.searchsorted(bounds, t1, "right"):np.searchsorted(bounds, t1 + span, "right")]
        lo, mid = np.searchsorted(arr, t1 - reach, "right"), np.searchsorted(arr, t1, "left")
        # Cheap upper bound on the energy first (started at arrival, a job that arrived before t1 uses at most
        # min over r of r * what is left of it after t1; one arriving in [t1, t2) at most its least work):
        # only the t2 where it exceeds the capacity need the exact sum.
        early = (dev[lo:mid] * np.clip(arr[lo:mid, None] + dur[lo:mid] - t1, 0.0, None)).min(axis=1).sum()
        upper = early + cum[np.searchsorted(arr, t2, "left")] - cum[mid]
        t2 = t2[upper > pool * (t2 - t1) * (1 + 1e-9) + 1e-9]
        if t2.size == 0:
            continue
        hi = np.searchsorted(arr, t2[-1], "left")
        if hi <= lo:
            continue
        s = starts[lo:hi, None, :]                                            # (m, 1, 2)
        d, r = dur[lo:hi, :, None], dev[lo:hi, :, None]                        # (m, k, 1)
        ends = np.minimum(s[None] + d[None], t2[:, None, None, None])          # (t2, m, k, 2)
        overlap = np.clip(ends - np.maximum(s[None], t1), 0.0, None)
        energy = (r[None] * overlap).min(axis=(2, 3))                          # (t2, m)
        cap = pool * (t2 - t1)
        total = energy.sum(axis=1)
        over = total > cap * (1 + 1e-9) + 1e-9
        if not over.any():
            continue
        e = -np.sort(-energy[over], axis=1)                                    # largest first
        dropped = np.concatenate([np.zeros((e.shape[0], 1)), np.cumsum(e, axis=1)[:, :-1]], axis=1)
        need = ((total[over, None] - dropped) > cap[over, None] * (1 + 1e-9) + 1e-9).sum(axis=1)
        best = max(best, int(need.max()))
    return best


def check_schedule(jobs: Sequence[hy.HJob], dispatches: Sequence[tuple[str, float, int]], *, pool: int,
                   overhead: float, duration: float, late_after: float = hy.LATE_AFTER_S,
                   tol: float = 1e-9) -> list[str]:
    """Check a whole run's schedule exactly, in continuous time; return the ids of its late jobs.

    `dispatches`: (job id, start, devices) per started job; each runs `true_cost` seconds. Raises
    ValueError naming the first fault: an unknown or repeated job, devices outside the job's min..max,
    a start before the arrival, or more than `pool` devices busy at some instant (a job ending at t
    frees its devices for one starting at t; `tol` absorbs float rounding there and at the arrival).
    Late: started more than `late_after` s after arriving, or never started though it arrived more
    than `late_after` s before `duration`. Used to verify schedules found offline (a clairvoyant
    search), not by the simulation.
    """
    by_id = {j.job_id: j for j in jobs}
    seen: set[str] = set()
    edges: list[tuple[float, int]] = []
    late = []
    for job_id, start, n in dispatches:
        job = by_id.get(job_id)
        if job is None or job_id in seen:
            raise ValueError(f"{job_id}: {'unknown' if job is None else 'dispatched twice'}")
        seen.add(job_id)
        if not job.min_devices <= n <= job.max_devices:
            raise ValueError(f"{job_id}: {n} devices, allowed {job.min_devices}..{job.max_devices}")
        if start < job.arrival - tol:
            raise ValueError(f"{job_id}: starts at {start} before its arrival at {job.arrival}")
        if start - job.arrival > late_after:
            late.append(job_id)
        edges += [(start + true_cost(job, n, overhead) - tol, -n), (start, n)]
    busy = 0
    for t, d in sorted(edges):
        busy += d
        if busy > pool:
            raise ValueError(f"{busy} devices busy at {t:.6f} s, pool {pool}")
    late += [j.job_id for j in jobs if j.job_id not in seen and duration - j.arrival > late_after]
    return late


def true_sizes(job: hy.HJob, overhead: float) -> list[tuple[int, float]]:
    """Every (devices, seconds) `job` may run on under `true_cost`."""
    return [(r, true_cost(job, r, overhead)) for r in range(job.min_devices, job.max_devices + 1)]


def least_work(job: hy.HJob, overhead: float) -> float:
    """A job's least device-seconds under `true_cost`: r * t(r) grows with r, so at its min."""
    return job.min_devices * true_cost(job, job.min_devices, overhead)


def mean_metrics(runs: Sequence[HydrogenMetrics]) -> dict[str, float]:
    n = len(runs)
    return {k: round(sum(getattr(r, k) for r in runs) / n, 4)
            for k in ("W_T", "S_T", "U_c", "N_C", "N_L", "mean_pool")}


# -- Table III --------------------------------------------------------------------------------

TABLE3 = (  # paths (1e6), target s, expected s, jloMetric, pool, decision -- seed 001 Table III
    (1, 5.0, 5.91, -0.91, 1, hy.SCALE_UP), (1, 5.0, 2.96, 2.05, 2, hy.PRESERVE),
    (2, 5.5, 5.89, -0.39, 2, hy.SCALE_UP), (2, 5.5, 3.93, 1.57, 3, hy.PRESERVE),
    (3, 9.0, 17.71, -8.71, 3, hy.SCALE_UP), (3, 9.0, 8.86, 0.14, 4, hy.PRESERVE),
    (2, 5.5, 2.95, 2.55, 4, hy.SCALE_DOWN), (2, 5.5, 3.93, 1.57, 3, hy.PRESERVE),
    (1, 5.0, 1.97, 3.03, 3, hy.SCALE_DOWN), (1, 5.0, 2.96, 2.04, 2, hy.PRESERVE),
)
TABLE2_ONE_FPGA = {1: 5.91, 2: 11.78, 3: 17.71}    # seed 001 Table II, measured on 1 FPGA


def replay_table3(beta: float = 2.5, lo: int = 1, hi: int = 4) -> list[dict]:
    """Replay Table III through the elasticity manager with eq. 1 on Table II's 1-FPGA times.

    The pool evolves by our decisions only. The devices each request gets are
    read off the table's Expected column (1-FPGA time / expected): equal to
    the pool except in rows 5-6, where the table's expected times are those
    of 1 and 2 FPGAs with pools of 3 and 4.
    """
    pool = lo
    rows = []
    for paths, target, expected, jlo, table_pool, table_decision in TABLE3:
        job = hy.HJob(f"paths{paths}e6", 0.0, TABLE2_ONE_FPGA[paths], 1, hi, target=target)
        devices = round(TABLE2_ONE_FPGA[paths] / expected)
        d = hy.elasticity_decide([(job, devices)], beta)
        full = hy.elasticity_decide([(job, pool)], beta)
        rows.append({"paths_1e6": paths, "target_s": target, "pool": pool, "table_pool": table_pool,
                     "devices": devices, "expected_s": round(hy.linear_cost(job, devices), 3),
                     "jlo": round(d.jlo_pos + d.jlo_neg, 3), "table_jlo": jlo,
                     "decision": d.decision, "table_decision": table_decision,
                     "decision_if_whole_pool": full.decision})
        pool = hy.resize_pool(pool, d.decision, lo, hi)
    return rows


def ceil_devices(goal: float, action_time: float) -> int:
    return math.ceil(goal * action_time - 1e-9)
