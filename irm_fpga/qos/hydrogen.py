"""Hydrogen's scheduler and elasticity manager (seed 001 §IV, seed 002).

Jobs (`HJob`, seed 001 Table I) are one-shot computations: dispatched once
on r devices (min <= r <= max) they hold them, without preemption, for
`cost(r)` seconds, then return them to the pool.

Scheduling algorithms (seed 001 §IV-A, Algorithm 2), each a pure function
`alg(queue, available, window, cost) -> [(job_id, devices), ...]` over the
first `window` jobs of the ready queue (arrival order):

* `fcfs_max`   every job, in order, that fits at its max gets its max;
* `fcfs_min`   every job, in order, that fits at its min gets its min;
* `fcfs_amap`  every job, in order, that fits at its min gets as many devices
  as are available, up to its max;
* `sjtf`       repeatedly the job with the smallest cost (at its min) gets its
  min, until the next one does not fit;
* `priority`   highest priority first (then arrival), at its min, until the
  next one does not fit.

Algorithm 2 compares `availableResources > job.min` strictly; read literally
a job could never use the whole pool, so a job fits when the available
devices are >= what it gets.

`managed` (Algorithm 1) runs every algorithm, projects the window's schedule
each one leads to (the algorithm keeps dispatching the window's jobs as
running jobs end, on the scheduler's cost model) and keeps the best score:
"completion time" maximises the window jobs completed by the earliest
projected makespan among the candidates, then minimises the makespan;
"fairness" minimises the priority-weighted number of projected late jobs
(waiting more than `late_after` s in the ready queue, §VI), then the makespan.
Ties go to the earlier algorithm in `ALGORITHMS` order.

Cost functions: `linear_cost` is eq. 1 (defaultTime / devices);
`LearnedCostModel` fits t(r) = a + b / r per design by least squares from
measured executions (the implementation library's performance model), and
falls back to eq. 1 until two different sizes were observed.
`design_default_time` gives defaultTime from a design's device-time model.

Elasticity (seed 001 §IV-B, Algorithm 3): each job's JLO is its target time
minus its expected time on the devices the schedule gives it; jloNeg is the
sum of the negative ones, jloPos of the others; jloNeg < 0 -> scale up,
otherwise jloPos > beta -> scale down, else preserve. The slides' single
figure jloMetric = min(max(jloPos - beta, 0), jloNeg) is `jlo_metric`.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

SCALE_UP = "Scale Up"
SCALE_DOWN = "Scale Down"
PRESERVE = "Preserve"
COMPLETION_TIME = "completion time"
FAIRNESS = "fairness"
LATE_AFTER_S = 1.0


@dataclass(frozen=True)
class HJob:
    job_id: str
    arrival: float
    default_time: float          # seconds on one device (eq. 1's defaultTime)
    min_devices: int = 1
    max_devices: int = 1
    priority: float = 1.0
    design: str = "mc_bond_option"
    target: float | None = None  # JLO: target execution time (s)

    def __post_init__(self) -> None:
        if not 1 <= self.min_devices <= self.max_devices:
            raise ValueError(f"job {self.job_id}: need 1 <= min <= max")
        if not self.default_time > 0:
            raise ValueError(f"job {self.job_id}: default_time must be > 0")


Cost = Callable[[HJob, int], float]


def linear_cost(job: HJob, devices: int) -> float:
    """Seed 001 §IV, eq. 1: defaultTime / allocatedResources."""
    if devices < 1:
        raise ValueError("devices must be >= 1")
    return job.default_time / devices


class LearnedCostModel:
    """t(r) = a + b/r per design, fitted by least squares on observed (r, seconds / defaultTime).

    Observations are normalised by the job's defaultTime so jobs of one design
    but different sizes share one fit. A plain object; call it as a `Cost`.
    """

    def __init__(self) -> None:
        self._obs: dict[str, list[tuple[int, float]]] = {}
        self._fit: dict[str, tuple[float, float]] = {}

    def observe(self, job: HJob, devices: int, seconds: float) -> None:
        self._obs.setdefault(job.design, []).append((devices, seconds / job.default_time))
        self._fit.pop(job.design, None)

    def coefficients(self, design: str) -> tuple[float, float] | None:
        if design in self._fit:
            return self._fit[design]
        obs = self._obs.get(design, [])
        if len({r for r, _ in obs}) < 2:
            return None
        x = np.array([[1.0, 1.0 / r] for r, _ in obs])
        y = np.array([v for _, v in obs])
        (a, b), *_ = np.linalg.lstsq(x, y, rcond=None)
        self._fit[design] = (float(a), float(b))
        return self._fit[design]

    def __call__(self, job: HJob, devices: int) -> float:
        c = self.coefficients(job.design)
        if c is None:
            return linear_cost(job, devices)
        return max(1e-9, job.default_time * (c[0] + c[1] / devices))


def design_default_time(design: str, params: Mapping, actions: int = 1) -> float:
    """defaultTime of `actions` tasks with `params` on one device, from the design's device-time model."""
    from irm_fpga.designs import get_design
    return actions * get_design(design).prepare(params)[1]


# -- scheduling algorithms (seed 001 Algorithm 2) ---------------------------------------------

Allocation = list[tuple[str, int]]


def fcfs_max(queue: Sequence[HJob], available: int, window: int, cost: Cost = linear_cost) -> Allocation:
    out = []
    for job in queue[:window]:
        if available >= job.max_devices:
            out.append((job.job_id, job.max_devices))
            available -= job.max_devices
    return out


def fcfs_min(queue: Sequence[HJob], available: int, window: int, cost: Cost = linear_cost) -> Allocation:
    out = []
    for job in queue[:window]:
        if available >= job.min_devices:
            out.append((job.job_id, job.min_devices))
            available -= job.min_devices
    return out


def fcfs_amap(queue: Sequence[HJob], available: int, window: int, cost: Cost = linear_cost) -> Allocation:
    out = []
    for job in queue[:window]:
        if available >= job.min_devices:
            n = min(available, job.max_devices)
            out.append((job.job_id, n))
            available -= n
    return out


def sjtf(queue: Sequence[HJob], available: int, window: int, cost: Cost = linear_cost) -> Allocation:
    out = []
    for job in sorted(queue[:window], key=lambda j: (cost(j, j.min_devices), j.arrival, j.job_id)):
        if available < job.min_devices:
            break
        out.append((job.job_id, job.min_devices))
        available -= job.min_devices
    return out


def priority(queue: Sequence[HJob], available: int, window: int, cost: Cost = linear_cost) -> Allocation:
    out = []
    for job in sorted(queue[:window], key=lambda j: (-j.priority, j.arrival, j.job_id)):
        if available < job.min_devices:
            break
        out.append((job.job_id, job.min_devices))
        available -= job.min_devices
    return out


ALGORITHMS: dict[str, Callable[..., Allocation]] = {
    "fcfs_max": fcfs_max, "fcfs_min": fcfs_min, "fcfs_amap": fcfs_amap, "sjtf": sjtf, "priority": priority,
}


# -- managed mode (seed 001 Algorithm 1) -----------------------------------------------------------

@dataclass(frozen=True)
class Projection:
    algorithm: str
    allocation: Allocation        # the decision now
    starts: dict[str, float]
    finishes: dict[str, float]
    makespan: float


def project(alg: Callable[..., Allocation], name: str, queue: Sequence[HJob], now: float,
            running_ends: Sequence[tuple[float, int]], pool: int, window: int, cost: Cost) -> Projection:
    """Schedule of the first `window` queued jobs if `alg` keeps deciding (no new arrivals)."""
    pending = list(queue[:window])
    busy = list(running_ends)
    heapq.heapify(busy)
    t = now
    starts: dict[str, float] = {}
    finishes: dict[str, float] = {}
    first: Allocation | None = None
    while True:
        while busy and busy[0][0] <= t + 1e-12:
            heapq.heappop(busy)
        available = pool - sum(n for _, n in busy)
        decision = alg(pending, available, window, cost) if pending and available > 0 else []
        if first is None:
            first = decision
        if decision:
            chosen = dict(decision)
            for job in pending:
                if job.job_id in chosen:
                    n = chosen[job.job_id]
                    starts[job.job_id] = t
                    finishes[job.job_id] = t + cost(job, n)
                    heapq.heappush(busy, (finishes[job.job_id], n))
            pending = [j for j in pending if j.job_id not in chosen]
        if not pending:
            break
        if not busy:          # nothing running and nothing fits: the rest cannot be placed
            break
        t = busy[0][0]
    makespan = max(finishes.values(), default=now) - now
    return Projection(name, first or [], starts, finishes, makespan)


def score(proj: Projection, queue: Sequence[HJob], strategy: str, horizon: float, now: float,
          late_after: float = LATE_AFTER_S) -> tuple[float, ...]:
    """Higher is better."""
    window = {j.job_id: j for j in queue}
    if strategy == COMPLETION_TIME:
        done = sum(1 for f in proj.finishes.values() if f - now <= horizon + 1e-9)
        return (done, -proj.makespan)
    if strategy == FAIRNESS:
        late = 0.0
        for jid, job in window.items():
            start = proj.starts.get(jid, math.inf)
            if start - job.arrival > late_after:
                late += job.priority
        return (-late, -proj.makespan)
    raise ValueError(f"unknown scoring strategy {strategy!r}; known: {COMPLETION_TIME!r}, {FAIRNESS!r}")


def managed(queue: Sequence[HJob], available: int, window: int, cost: Cost = linear_cost, *,
            now: float = 0.0, running_ends: Sequence[tuple[float, int]] = (), pool: int | None = None,
            strategy: str = COMPLETION_TIME, algorithms: Mapping[str, Callable[..., Allocation]] | None = None,
            ) -> tuple[Allocation, str]:
    """Seed 001 Algorithm 1: the allocation of the best-scoring algorithm, and its name."""
    algs = ALGORITHMS if algorithms is None else algorithms
    if pool is None:
        pool = available + sum(n for _, n in running_ends)
    head = list(queue[:window])
    projs = [project(alg, name, head, now, running_ends, pool, window, cost) for name, alg in algs.items()]
    horizon = min(p.makespan for p in projs)
    best = max(projs, key=lambda p: score(p, head, strategy, horizon, now))
    return best.allocation, best.algorithm


# -- elasticity manager (seed 001 §IV-B, Algorithm 3) ----------------------------------------

def job_jlo(job: HJob, devices: int, cost: Cost = linear_cost) -> float:
    if job.target is None:
        raise ValueError(f"job {job.job_id} has no target time (JLO)")
    return job.target - cost(job, devices)


@dataclass(frozen=True)
class ElasticityDecision:
    decision: str
    jlo_pos: float
    jlo_neg: float
    jlos: tuple[float, ...]


def jlo_metric(jlos: Sequence[float], beta: float) -> float:
    """The slides' aggregate: min(max(sum of positive - beta, 0), sum of negative)."""
    return min(max(sum(j for j in jlos if j >= 0) - beta, 0.0), sum(j for j in jlos if j < 0))


def elasticity_decide(allocations: Sequence[tuple[HJob, int]], beta: float,
                      cost: Cost = linear_cost) -> ElasticityDecision:
    jlos = tuple(job_jlo(job, n, cost) for job, n in allocations)
    neg = sum(j for j in jlos if j < 0)
    pos = sum(j for j in jlos if j >= 0)
    if neg < 0:
        d = SCALE_UP
    elif pos > beta:
        d = SCALE_DOWN
    else:
        d = PRESERVE
    return ElasticityDecision(d, pos, neg, jlos)


def resize_pool(pool: int, decision: str, lo: int, hi: int) -> int:
    step = {SCALE_UP: 1, SCALE_DOWN: -1}.get(decision, 0)
    return max(lo, min(hi, pool + step))
