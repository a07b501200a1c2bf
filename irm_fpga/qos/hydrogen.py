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
  next one does not fit (the issue's fifth algorithm; not in seed 001's
  Table IV, whose managed mode chooses among `PAPER_ALGORITHMS`).

Algorithm 2 compares `availableResources > job.min` strictly; read literally
a job could never use the whole pool, so a job fits when the available
devices are >= what it gets. Its FCFS loops go on past a job that does not
fit (no `break`), and so do ours.

`managed` (Algorithm 1) runs every algorithm on the first `window` jobs of
the ready queue, scores the schedule each one produces and keeps the best.
An algorithm's schedule is the window's execution schedule (§III-B stage
2b, §IV-B "based on an execution schedule"): the algorithm keeps
dispatching the window's jobs as running jobs end, on the scheduler's cost
model (`project`); its makespan is "the time taken between the first job
starting and the last job finishing" (§IV-A). Scores (§IV-A):

* "completion time": maximise the jobs completed while minimising the
  makespan -> (jobs the schedule completes by the earliest makespan among
  the candidates, shortest makespan);
* "fairness": minimise the priority-weighted number of late jobs (a job is
  late when it waits more than `late_after` s, §VI's N_L) -> (fewest
  weighted late jobs, shortest makespan).

Ties go to the earlier algorithm in the order given. Algorithm 1 line 9
then hands the selected schedule to the elasticity manager
(`managed_schedule` returns it; `schedule_jlos` gives each job's JLO in it).

Every algorithm also takes `now` (keyword; the paper's ignore it) so that
deadline-aware ones can tell how long a job has waited.

The deadline-aware managed mode (`managed_deadline`, with `slack_min`,
`slack_amap`, `deadline_score` and `deadline_elasticity`; last section of this
module) is this project's improvement on Algorithm 1, not the paper's; the
paper's stays `managed`. `irm_fpga.qos.lookahead` makes that mode decide by
a one-step lookahead over sampled futures instead of among algorithms.

`forecast_arrivals` (expected arrivals from the recent arrival rate and mix,
projected with the window through `managed(..., expected=...)`) is an
extension beyond the paper; seed 001 §VI's Table IV reproduction does not
use it.

Cost functions: `linear_cost` is eq. 1 (defaultTime / devices);
`LearnedCostModel` fits t(r) = a + b / r per design by least squares from
measured executions (the implementation library's performance model), and
falls back to eq. 1 until two different sizes were observed.
`design_default_time` gives defaultTime from a design's device-time model.

Elasticity (seed 001 §IV-B, Algorithm 3): each job's JLO is its target time
minus its expected time on the devices the schedule gives it, counted "from
the moment jobs enter the queue" (`schedule_jlos`: target - (projected
finish - arrival); for a job dispatched on arrival that is Table III's
target - expected); jloNeg is the sum of the negative ones, jloPos of the
others; jloNeg < 0 -> scale up, otherwise jloPos > beta -> scale down, else
preserve (`elasticity_from_jlos`). The slides' single figure
jloMetric = min(max(jloPos - beta, 0), jloNeg) is `jlo_metric`.
"""

from __future__ import annotations

import functools
import heapq
import inspect
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np
from scipy.optimize import nnls

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
    actions: int = 0             # the job's size in actions, when known (live jobs): the learned model's unit
    tenant: str = ""             # whose job, when known (live jobs): the learned model is per tenant and design

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
    """t(r) = a + b/r per design (per tenant and design for jobs that name a tenant), fitted by least squares on
    observed (r, seconds / size).

    Observations are normalised by the job's size so jobs of one design but
    different sizes share one fit: its actions when known (live jobs, whose
    defaultTime rests on each tenant's own guess of seconds per action, which
    must not skew the fit once runs are measured), else its defaultTime (the
    simulator's jobs). A live action is whatever task its tenant sends (a
    `sleep` of any duration, an option priced over any number of paths), so
    one tenant's seconds per action say nothing of another's: shared, a tenant
    sending its size in empty tasks made every tenant's jobs of the design look
    instant to the scheduler. A plain object; call it as a `Cost`.
    """

    def __init__(self) -> None:
        # fit (`_key`) -> devices -> [runs, sum of seconds per unit of size]: what the fit needs, and no more (the
        # runs themselves grew without bound on a long-lived manager, and each refit went over all of them).
        self._sums: dict[str, dict[int, list[float]]] = {}
        self._fit: dict[str, tuple[float, float]] = {}

    @staticmethod
    def _size(job: HJob) -> float:
        return float(job.actions) if job.actions > 0 else job.default_time

    def observe(self, job: HJob, devices: int, seconds: float) -> None:
        share = seconds / self._size(job)
        if devices < 1 or not math.isfinite(share) or share <= 0:
            return                      # nothing to learn from a run that took no (or no finite) time
        key = self._key(job.design, job.tenant)
        acc = self._sums.setdefault(key, {}).setdefault(devices, [0.0, 0.0])
        acc[0] += 1.0
        acc[1] += share
        self._fit.pop(key, None)

    @staticmethod
    def _key(design: str, tenant: str) -> str:
        """The fit of `design`, or of `tenant`'s runs of it (\x00 is in no tenant id)."""
        return f"{tenant}\x00{design}" if tenant else design

    def observed(self, design: str, tenant: str = "") -> dict[int, tuple[int, float]]:
        """What was learned of `design` (`tenant`'s runs of it, for a tenant): devices -> (runs on that many, mean
        seconds per unit of size)."""
        return {r: (int(n), total / n) for r, (n, total) in self._sums.get(self._key(design, tenant), {}).items()}

    def coefficients(self, design: str, tenant: str = "") -> tuple[float, float] | None:
        key = self._key(design, tenant)
        if key in self._fit:
            return self._fit[key]
        sums = self._sums.get(key, {})
        if len(sums) < 2:
            return None
        # Least squares over every run equals least squares over each size's mean weighted by its runs (the
        # spread within a size adds a constant): row sqrt(n_r) [1, 1/r], target sqrt(n_r) mean_r.
        w = np.sqrt([n for n, _ in sums.values()])
        x = np.array([[1.0, 1.0 / r] for r in sums]) * w[:, None]
        y = np.array([total / n for n, total in sums.values()]) * w
        # Non-negative: live times carry up to a control period of noise, and two noisy points fitted freely
        # can give b < 0 (more devices predicted slower) or a < 0 (a cost below zero on many devices).
        (a, b), _ = nnls(x, y)
        self._fit[key] = (float(a), float(b))
        return self._fit[key]

    def __call__(self, job: HJob, devices: int) -> float:
        c = self.coefficients(job.design, job.tenant)
        if c is None:
            return linear_cost(job, devices)
        return max(1e-9, self._size(job) * (c[0] + c[1] / devices))


def design_default_time(design: str, params: Mapping, actions: int = 1) -> float:
    """defaultTime of `actions` tasks with `params` on one device, from the design's device-time model."""
    from irm_fpga.designs import get_design
    return actions * get_design(design).prepare(params)[1]


# -- scheduling algorithms (seed 001 Algorithm 2) ---------------------------------------------

Allocation = list[tuple[str, int]]


def fcfs_max(queue: Sequence[HJob], available: int, window: int, cost: Cost = linear_cost, *,
             now: float = 0.0) -> Allocation:
    out = []
    for job in queue[:window]:
        if available >= job.max_devices:
            out.append((job.job_id, job.max_devices))
            available -= job.max_devices
    return out


def fcfs_min(queue: Sequence[HJob], available: int, window: int, cost: Cost = linear_cost, *,
             now: float = 0.0) -> Allocation:
    out = []
    for job in queue[:window]:
        if available >= job.min_devices:
            out.append((job.job_id, job.min_devices))
            available -= job.min_devices
    return out


def fcfs_amap(queue: Sequence[HJob], available: int, window: int, cost: Cost = linear_cost, *,
              now: float = 0.0) -> Allocation:
    out = []
    for job in queue[:window]:
        if available >= job.min_devices:
            n = min(available, job.max_devices)
            out.append((job.job_id, n))
            available -= n
    return out


def sjtf(queue: Sequence[HJob], available: int, window: int, cost: Cost = linear_cost, *,
         now: float = 0.0) -> Allocation:
    out = []
    for job in sorted(queue[:window], key=lambda j: (cost(j, j.min_devices), j.arrival, j.job_id)):
        if available < job.min_devices:
            break
        out.append((job.job_id, job.min_devices))
        available -= job.min_devices
    return out


def priority(queue: Sequence[HJob], available: int, window: int, cost: Cost = linear_cost, *,
             now: float = 0.0) -> Allocation:
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
# Seed 001 §VI: the four standalone algorithms of Table IV, which its managed mode chooses among.
PAPER_ALGORITHMS: dict[str, Callable[..., Allocation]] = {
    k: ALGORITHMS[k] for k in ("fcfs_max", "fcfs_min", "fcfs_amap", "sjtf")
}


# -- managed mode (seed 001 Algorithm 1) -----------------------------------------------------------

@dataclass(frozen=True)
class Projection:
    algorithm: str
    allocation: Allocation        # the decision now
    starts: dict[str, float]
    finishes: dict[str, float]
    makespan: float


FORECAST_SPAN_S = 30.0
FORECAST_BURST = 1.5


def forecast_arrivals(history: Sequence[HJob], now: float, count: int, *, span: float = FORECAST_SPAN_S,
                      burst: float = FORECAST_BURST) -> list[HJob]:
    """`count` expected arrivals after `now`, from the jobs that arrived in the last `span` s.

    The rate is the number of those arrivals over the observed span (at most
    `span`), times `burst` (> 1 plans for the bursts of a Poisson stream
    rather than its mean); the k-th expected job arrives at now + k / rate and
    is shaped like the k-th most recent arrival (cycling), so the forecast
    keeps the observed job mix. Needs two arrivals in the span; otherwise
    nothing is expected. Ids are "~k" (never a real job's). Not in the paper.
    """
    recent = [j for j in history if now - span <= j.arrival <= now]
    if count <= 0 or len(recent) < 2:
        return []
    observed = min(span, now - min(j.arrival for j in recent))
    if observed <= 0:
        return []
    rate = burst * len(recent) / observed
    recent.sort(key=lambda j: (-j.arrival, j.job_id))
    return [replace(recent[k % len(recent)], job_id=f"~{k}", arrival=now + (k + 1) / rate)
            for k in range(count)]


def project(alg: Callable[..., Allocation], name: str, queue: Sequence[HJob], now: float,
            running_ends: Sequence[tuple[float, int]], pool: int, window: int, cost: Cost,
            expected: Sequence[HJob] = (), available: int | None = None,
            wake_late_after: float | None = None) -> Projection:
    """Schedule of the first `window` queued jobs, and of `expected` arrivals, if `alg` keeps deciding.

    Events are the running jobs' ends and the expected arrivals; an expected
    job joins the ready queue (after the queued ones) when it arrives.
    `available` (default: pool minus the running jobs) caps the decision now
    (the allocation returned); the projection then goes on from the same
    instant with every device not running a job. `wake_late_after`: the
    scheduler also decides at each waiting job's start deadline
    (`wake_time`), as one that wakes for a job it held does.
    """
    pending = list(queue[:window])
    future = sorted(expected, key=lambda j: (j.arrival, j.job_id))
    busy = list(running_ends)
    heapq.heapify(busy)
    t = now
    starts: dict[str, float] = {}
    finishes: dict[str, float] = {}
    first: Allocation | None = None
    while True:
        while busy and busy[0][0] <= t + 1e-12:
            heapq.heappop(busy)
        while future and future[0].arrival <= t + 1e-12:
            pending.append(future.pop(0))
        free = pool - sum(n for _, n in busy)
        capped = first is None and available is not None and available < free
        if capped:
            free = available
        decision = alg(pending, free, window, cost, now=t) if pending and free > 0 else []
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
        if not pending and not future:
            break
        if capped:                    # devices of jobs ending now: the projection may use them at once
            continue
        wake = math.inf if wake_late_after is None else wake_time(pending, t, wake_late_after) or math.inf
        if not busy and not future and wake == math.inf:   # nothing running, coming or due: the rest never starts
            break
        t = min(busy[0][0] if busy else math.inf, future[0].arrival if future else math.inf, wake)
    # A schedule that leaves some of the window's jobs unstarted never finishes them all.
    makespan = math.inf if pending else max(finishes.values(), default=now) - now
    return Projection(name, first or [], starts, finishes, makespan)


def late_weight(proj: Projection, jobs: Sequence[HJob], late_after: float = LATE_AFTER_S) -> float:
    """Priority-weighted number of `jobs` that would wait more than `late_after` s (never started: late)."""
    return sum(j.priority for j in jobs if proj.starts.get(j.job_id, math.inf) - j.arrival > late_after + 1e-9)


def score(proj: Projection, queue: Sequence[HJob], strategy: str, horizon: float, now: float,
          late_after: float = LATE_AFTER_S) -> tuple[float, ...]:
    """Higher is better (seed 001 §IV-A). `queue`: the jobs whose lateness counts (the window)."""
    if strategy == COMPLETION_TIME:
        done = sum(1 for f in proj.finishes.values() if f - now <= horizon + 1e-9)
        return (done, -proj.makespan)
    if strategy == FAIRNESS:
        return (-late_weight(proj, queue, late_after), -proj.makespan)
    raise ValueError(f"unknown scoring strategy {strategy!r}; known: {COMPLETION_TIME!r}, {FAIRNESS!r}")


def managed_schedule(queue: Sequence[HJob], available: int, window: int, cost: Cost = linear_cost, *,
                     now: float = 0.0, running_ends: Sequence[tuple[float, int]] = (), pool: int | None = None,
                     strategy: str = COMPLETION_TIME,
                     algorithms: Mapping[str, Callable[..., Allocation]] | None = None,
                     expected: Sequence[HJob] = (), late_after: float = LATE_AFTER_S) -> Projection:
    """Seed 001 Algorithm 1, lines 2-8: the best-scoring algorithm's schedule of the window.

    `expected`: forecast arrivals (`forecast_arrivals`, beyond the paper),
    projected and scored with the window's jobs; the caller sizes it.
    """
    if strategy not in (COMPLETION_TIME, FAIRNESS):
        raise ValueError(f"unknown scoring strategy {strategy!r}; known: {COMPLETION_TIME!r}, {FAIRNESS!r}")
    algs = ALGORITHMS if algorithms is None else algorithms
    if pool is None:
        pool = available + sum(n for _, n in running_ends)
    head = list(queue[:window])
    projs = [project(with_late_after(alg, late_after), name, head, now, running_ends, pool, window, cost, expected,
                     available) for name, alg in algs.items()]
    horizon = min(p.makespan for p in projs)    # inf when no schedule starts every job: count all finishes
    counted = head + list(expected)
    return max(projs, key=lambda p: score(p, counted, strategy, horizon, now, late_after))


def managed(queue: Sequence[HJob], available: int, window: int, cost: Cost = linear_cost, *,
            now: float = 0.0, running_ends: Sequence[tuple[float, int]] = (), pool: int | None = None,
            strategy: str = COMPLETION_TIME, algorithms: Mapping[str, Callable[..., Allocation]] | None = None,
            expected: Sequence[HJob] = (), late_after: float = LATE_AFTER_S) -> tuple[Allocation, str]:
    """Seed 001 Algorithm 1: the allocation of the best-scoring algorithm, and its name."""
    best = managed_schedule(queue, available, window, cost, now=now, running_ends=running_ends, pool=pool,
                            strategy=strategy, algorithms=algorithms, expected=expected, late_after=late_after)
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


def elasticity_from_jlos(jlos: Sequence[float], beta: float) -> ElasticityDecision:
    """Seed 001 Algorithm 3 on the jobs' JLOs."""
    jlos = tuple(jlos)
    neg = sum(j for j in jlos if j < 0)
    pos = sum(j for j in jlos if j >= 0)
    if neg < 0:
        d = SCALE_UP
    elif pos > beta:
        d = SCALE_DOWN
    else:
        d = PRESERVE
    return ElasticityDecision(d, pos, neg, jlos)


def elasticity_decide(allocations: Sequence[tuple[HJob, int]], beta: float,
                      cost: Cost = linear_cost) -> ElasticityDecision:
    """Algorithm 3 on jobs dispatched now on the given devices (Table III)."""
    return elasticity_from_jlos([job_jlo(job, n, cost) for job, n in allocations], beta)


def schedule_jlos(proj: Projection, jobs: Sequence[HJob], cost: Cost = linear_cost) -> list[float]:
    """Each of `jobs`' JLO in the schedule `proj`: target - (projected finish - arrival) (seed 001 §IV-B).

    A job the schedule could not start (its min exceeds the pool) misses
    its JLO by its time at its min: it cannot end at all on this pool, so
    the elasticity manager must not shrink the pool further, and grows it.
    """
    out = []
    for job in jobs:
        if job.target is None:
            raise ValueError(f"job {job.job_id} has no target time (JLO)")
        fin = proj.finishes.get(job.job_id)
        out.append(-cost(job, job.min_devices) if fin is None else job.target - (fin - job.arrival))
    return out


def resize_pool(pool: int, decision: str, lo: int, hi: int) -> int:
    step = {SCALE_UP: 1, SCALE_DOWN: -1}.get(decision, 0)
    return max(lo, min(hi, pool + step))


# -- deadline-aware managed mode and elasticity manager (issue 5's "better" variant) ------------
#
# Seed 001 §IV leaves room for it (algorithms can be added to the scheduling library, and cost
# functions can be more detailed than eq. 1, per job); what follows changes three things and keeps
# the rest (window, projection of each candidate's execution schedule, Algorithm 3's JLOs):
#
# 1. Two more candidate algorithms, `slack_min` and `slack_amap`, that dispatch by start deadline
#    (a job is late when it waits more than `late_after` s, seed 001 §VI's N_L): jobs that can still
#    start on time first, earliest start deadline first (higher priority first on a tie); jobs already
#    late after them, by priority then arrival (they are late whatever happens now; serving them first
#    would make the on-time ones late too, the idea of Moore-Hodgson's rule). `slack_amap` then gives
#    the devices left over, when the whole window is dispatched, to the dispatched jobs with the
#    longest predicted time first, up to their max: a wide job frees its devices sooner.
# 2. Scoring that counts predicted late jobs first (`deadline_score`): the priority-weighted number
#    of window jobs the schedule starts late (§IV-A's fairness criterion, for both strategies), then
#    the priority-weighted sum of start latencies (§III-B's "minimising job start latency"), then the
#    priority-weighted sum of completion times (§IV's objective, sum w_j C_j). Start latency before
#    completion time: a schedule that spreads the window's jobs over every device finishes them
#    sooner but leaves nothing for the next arrival, which is what made the paper's scoring pick
#    FCFSMax and then run late.
# 3. The cost model is the caller's: the simulation runs this mode with the learned model
#    (`LearnedCostModel`, fed with measured executions, the implementation library's performance
#    model of §III-B) instead of eq. 1, under which spreading a job looks free.
#
# The elasticity manager (`deadline_elasticity`) keeps Algorithm 3's inputs (each job's JLO in the
# selected schedule, beta) but (a) grows the pool before dispatching, by as many devices as it takes
# for the selected schedule to meet every JLO (§IV-B notes that the jloMetric's magnitude could
# justify more than one device at a time), and (b) never shrinks while a queued or running job is
# predicted to miss its JLO, nor when the window re-projected on one device fewer would miss one,
# nor (given expected arrivals, `forecast_arrivals`) when the window and the expected jobs on one
# device fewer would; otherwise it shrinks by one device when the JLOs' positive sum exceeds beta.

DEADLINE_EPS = 1e-9


def start_deadline(job: HJob, late_after: float = LATE_AFTER_S) -> float:
    """The latest start that is not late (seed 001 §VI: waiting more than `late_after` s is late)."""
    return job.arrival + late_after


WAKE_EARLY_S = 1e-6     # a wake at a start deadline comes this much before it (a start at the wake is on time)


def wake_time(jobs: Sequence[HJob], now: float, late_after: float = LATE_AFTER_S,
              early: float = WAKE_EARLY_S) -> float | None:
    """When a scheduler that held `jobs` back must decide again: `early` s before the first start deadline
    still ahead of `now` (None: none is). A decision to wait with devices free (the lookahead's) is otherwise
    looked at again only when something arrives or ends, maybe after the job has turned late."""
    due = [t for j in jobs if (t := start_deadline(j, late_after) - early) > now]
    return min(due, default=None)


@functools.lru_cache(maxsize=64)      # the signature check per call had slowed the simulator by 13 %
def _takes_late_after_cached(alg: Callable[..., Allocation]) -> bool:
    return "late_after" in inspect.signature(alg).parameters


def _takes_late_after(alg: Callable[..., Allocation]) -> bool:
    try:
        return _takes_late_after_cached(alg)
    except TypeError:                 # an unhashable callable: checked each time
        return "late_after" in inspect.signature(alg).parameters


def with_late_after(alg: Callable[..., Allocation], late_after: float) -> Callable[..., Allocation]:
    """`alg` with `late_after` bound if it takes one (the slack orders), so it counts lateness as its caller does."""
    if _takes_late_after(alg):
        return functools.partial(alg, late_after=late_after)
    return alg


def slack_order(jobs: Sequence[HJob], now: float, late_after: float = LATE_AFTER_S) -> list[HJob]:
    """On-time jobs by (start deadline, -priority, id), then jobs already late by (-priority, arrival, id)."""
    on_time = [j for j in jobs if now <= start_deadline(j, late_after) + DEADLINE_EPS]
    late = [j for j in jobs if now > start_deadline(j, late_after) + DEADLINE_EPS]
    on_time.sort(key=lambda j: (start_deadline(j, late_after), -j.priority, j.job_id))
    late.sort(key=lambda j: (-j.priority, j.arrival, j.job_id))
    return on_time + late


def slack_min(queue: Sequence[HJob], available: int, window: int, cost: Cost = linear_cost, *,
              now: float = 0.0, late_after: float = LATE_AFTER_S) -> Allocation:
    """Every window job, in `slack_order`, that fits at its min gets its min (goes on past one that does not)."""
    out = []
    for job in slack_order(queue[:window], now, late_after):
        if available >= job.min_devices:
            out.append((job.job_id, job.min_devices))
            available -= job.min_devices
    return out


def slack_amap(queue: Sequence[HJob], available: int, window: int, cost: Cost = linear_cost, *,
               now: float = 0.0, late_after: float = LATE_AFTER_S) -> Allocation:
    """`slack_min`; when it dispatches the whole window, the devices left go to the longest jobs first."""
    head = list(queue[:window])
    base = dict(slack_min(head, available, window, cost, now=now, late_after=late_after))
    left = available - sum(base.values())
    if len(base) == len(head) and left > 0:
        for job in sorted((j for j in head if j.job_id in base),
                          key=lambda j: (-cost(j, base[j.job_id]), j.arrival, j.job_id)):
            add = min(left, job.max_devices - base[job.job_id])
            base[job.job_id] += add
            left -= add
    return [(j.job_id, base[j.job_id]) for j in slack_order(head, now, late_after) if j.job_id in base]


# The candidates of the deadline-aware managed mode: the paper's four and the two above.
DEADLINE_ALGORITHMS: dict[str, Callable[..., Allocation]] = {
    **PAPER_ALGORITHMS, "slack_min": slack_min, "slack_amap": slack_amap,
}


def deadline_score(proj: Projection, jobs: Sequence[HJob], late_after: float = LATE_AFTER_S) -> tuple[float, ...]:
    """Higher is better: (-weighted late jobs, -weighted jobs never started, -weighted start latency,
    -weighted completion time), latency and completion time summed over the jobs the schedule starts.

    A job the schedule never starts (its min above the pool) is late, and counted apart: summed in as an
    infinite latency it made every schedule tie at -inf, and the first one tried (waiting) won, holding
    back jobs that could start.
    """
    late = late_weight(proj, jobs, late_after)
    started = [j for j in jobs if j.job_id in proj.starts]
    never = sum(j.priority for j in jobs if j.job_id not in proj.starts)
    waits = sum(j.priority * (proj.starts[j.job_id] - j.arrival) for j in started)
    ends = sum(j.priority * (proj.finishes[j.job_id] - j.arrival) for j in started)
    return (-late, -never, -waits, -ends)


def managed_deadline_schedule(queue: Sequence[HJob], available: int, window: int, cost: Cost = linear_cost, *,
                              now: float = 0.0, running_ends: Sequence[tuple[float, int]] = (),
                              pool: int | None = None,
                              algorithms: Mapping[str, Callable[..., Allocation]] | None = None,
                              late_after: float = LATE_AFTER_S) -> Projection:
    """Seed 001 Algorithm 1, lines 2-8, with `deadline_score`: the best candidate's schedule of the window.

    Candidates default to `DEADLINE_ALGORITHMS`; ties go to the earlier one in that order.
    """
    algs = DEADLINE_ALGORITHMS if algorithms is None else algorithms
    if pool is None:
        pool = available + sum(n for _, n in running_ends)
    head = list(queue[:window])
    projs = [project(with_late_after(alg, late_after), name, head, now, running_ends, pool, window, cost, (),
                     available) for name, alg in algs.items()]
    return max(projs, key=lambda p: deadline_score(p, head, late_after))


def managed_deadline(queue: Sequence[HJob], available: int, window: int, cost: Cost = linear_cost, *,
                     now: float = 0.0, running_ends: Sequence[tuple[float, int]] = (), pool: int | None = None,
                     algorithms: Mapping[str, Callable[..., Allocation]] | None = None,
                     late_after: float = LATE_AFTER_S) -> tuple[Allocation, str]:
    """The deadline-aware managed mode: the allocation of the best candidate, and its name."""
    best = managed_deadline_schedule(queue, available, window, cost, now=now, running_ends=running_ends,
                                     pool=pool, algorithms=algorithms, late_after=late_after)
    return best.allocation, best.algorithm


@dataclass(frozen=True)
class RunningJob:
    """A dispatched job, as the elasticity manager sees it: when it is predicted to end, on how many devices."""

    job: HJob
    end: float
    devices: int


@dataclass(frozen=True)
class ElasticPlan:
    pool: int                       # the pool to provision now
    decision: str                   # SCALE_UP | SCALE_DOWN | PRESERVE (relative to the pool given)
    schedule: Projection            # the selected schedule on `pool` devices
    jlos: tuple[float, ...]         # the window's JLOs in it


def _misses(jlos: Sequence[float]) -> bool:
    return any(j < -DEADLINE_EPS for j in jlos)


def deadline_elasticity(queue: Sequence[HJob], window: int, cost: Cost = linear_cost, *, now: float,
                        running: Sequence[RunningJob] = (), pool: int, lo: int, hi: int, beta: float,
                        algorithms: Mapping[str, Callable[..., Allocation]] | None = None,
                        late_after: float = LATE_AFTER_S, expected: Sequence[HJob] = (),
                        schedule: Callable[..., Projection] | None = None,
                        out_of_time: Callable[[], bool] = lambda: False) -> ElasticPlan:
    """The deadline-aware managed mode with its elasticity manager (seed 001 Algorithm 1 line 9, Algorithm 3).

    * Grow: while the selected schedule predicts a window job missing its JLO (target - (finish -
      arrival) < 0, counted from arrival as §IV-B does) and the pool is below `hi`, add a device and
      schedule again; all before dispatching.
    * Shrink by one device only if no running job is predicted to end after its JLO, the selected
      schedule meets every window JLO, the JLOs' positive sum exceeds `beta` (Algorithm 3's test;
      with an empty window the sum is 0 and the pool is kept), the window re-projected on one
      device fewer still meets every JLO, and so do the window and the `expected` arrivals there
      (under at least one of the candidate algorithms). A busy device that is removed leaves when
      its job ends.

    `schedule(window_jobs, available, window, cost, now=, running_ends=, pool=)` selects the schedule
    on a given pool (default: `managed_deadline_schedule` over `algorithms`; the lookahead,
    `irm_fpga.qos.lookahead.lookahead_schedule`, fits too).

    `pool` is the pool now; devices in use are those of `running`. Jobs need `target` (their JLO).
    Returns the pool to provision and the selected schedule on it (its `allocation` is the dispatch).

    `out_of_time()` true (a live decision past its budget): the pool grows by doubling steps instead
    of one device at a time (from 1 to 128 devices: 8 schedules, not 128; it may overshoot, and
    later decisions shrink it), and it does not shrink in this decision.
    """
    if not lo <= hi:
        raise ValueError("need lo <= hi")
    ends = [(r.end, r.devices) for r in running]
    used = sum(r.devices for r in running)
    head = list(queue[:window])

    def plan(p: int) -> tuple[Projection, list[float]]:
        if schedule is not None:
            best = schedule(head, max(0, p - used), window, cost, now=now, running_ends=ends, pool=p)
        else:
            best = managed_deadline_schedule(head, max(0, p - used), window, cost, now=now, running_ends=ends,
                                             pool=p, algorithms=algorithms, late_after=late_after)
        return best, schedule_jlos(best, head, cost)

    def holds_with_expected(p: int) -> bool:
        """The selected algorithm on `p` devices meets the JLOs of the window and of the expected arrivals."""
        if not expected:
            return True
        algs = DEADLINE_ALGORITHMS if algorithms is None else algorithms
        runs = [project(with_late_after(alg, late_after), name, head, now, ends, p, window, cost, expected,
                        max(0, p - used)) for name, alg in algs.items()]
        return any(not _misses(schedule_jlos(r, [*head, *expected], cost)) for r in runs)

    start = max(lo, min(hi, pool))
    best, jlos = plan(start)
    p = start
    while _misses(jlos) and p < hi:
        p = min(hi, p + (max(1, p - start) if out_of_time() else 1))
        best, jlos = plan(p)
    if p > pool:
        return ElasticPlan(p, SCALE_UP, best, tuple(jlos))
    running_late = any(r.job.target is not None and r.end - r.job.arrival > r.job.target + DEADLINE_EPS
                       for r in running)
    if p > lo and not running_late and not _misses(jlos) and sum(j for j in jlos if j >= 0) > beta \
            and not out_of_time():
        smaller, small_jlos = plan(p - 1)
        if not _misses(small_jlos) and holds_with_expected(p - 1):
            return ElasticPlan(p - 1, SCALE_DOWN, smaller, tuple(small_jlos))
    return ElasticPlan(p, PRESERVE if p == pool else SCALE_DOWN, best, tuple(jlos))
