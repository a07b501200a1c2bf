"""Throughput-based policy (seed 000 §III-B): job controllers + resource broker.

Pure functions; the caller runs them every control period with what it
observed (`JobProgress`) and applies the returned allocation.

* `throughput_goal` turns a deadline into the time-varying goal g_j(k): the
  remaining actions over the remaining time (seed 000 §III-B). Past the
  deadline the goal is infinite (the job wants its max).
* `controller_step` is one job controller: eq. 1 (throughput over the last
  period), eq. 2 (EMA of the per-device action time, factor `alpha`), eq. 3
  (request r = ceil(a_hat * g), clamped to the job's [min, max]) and eq. 4
  (p = t / g). A period with no completed action gives no information about
  the action time: the estimate is kept (and before any estimate the request
  is the current allocation).
* `resource_broker` is Algorithm 1, dispatching to `allocate_fit`
  (Algorithm 2) and `allocate_not_fit` (Algorithm 3).
* `broker_max` is the broker's `max`: physical devices minus blacklisted ones
  minus those reserved for jobs initialised but not started.
* `admit` is the admission rule for a new job (end of §III-B): it takes the
  unallocated devices if they cover its minimum, otherwise it takes devices
  from active jobs holding more than their request; if that is not enough it
  is rejected (returns None).

Priority (seed 000 has none; the issue's Job API carries one, default 1):
the broker ranks jobs by their *weighted* performance p_j / w_j, w_j the
job's priority, so a job of priority 2 at 80 % of its goal ranks like a job
of priority 1 at 40 %; equal ranks go to the higher priority, then to the
order given. Algorithm 2 hands out its slack in that order, Algorithm 3
sorts its entries (p_j / w_j * 0.75^i) by it. Admission takes surplus
devices from lower-priority jobs first. With every priority equal this is
the paper's broker exactly.

Two readings of the pseudo-code, stated here because the text leaves them
open: Algorithm 3 sorts `(prio, job)` entries ascending (the default order),
so the job furthest below its goal (lowest p) is served first; and in
Algorithm 2's round-robin over deadline jobs a job at its `max` is skipped
(the job constraints are enforced by the broker, §II-B).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from irm_fpga.qos.jobs import DEADLINE, JobProgress, QosJob

DEFAULT_ALPHA = 0.5
ALG3_DECAY = 0.75


@dataclass(frozen=True)
class ControllerState:
    """Per-job controller memory between control steps."""

    last_time: float
    last_actions: int
    a_hat: float | None = None      # estimated device-seconds per action (eq. 2)
    throughput: float | None = None  # t_j(k), eq. 1
    goal: float | None = None        # g_j(k)
    request: int = 0                 # r_j(k), eq. 3
    performance: float = 1.0         # p_j(k), eq. 4


def initial_state(job: QosJob, now: float, actions: int = 0, allocation: int = 0) -> ControllerState:
    """Before any estimate a job's request is its minimum (>= 1): admission may take the rest."""
    return ControllerState(last_time=now, last_actions=actions, request=job.cap(max(1, job.min_devices)))


def throughput_goal(job: QosJob, now: float, actions: int) -> float:
    """g_j(k): the throughput goal, or the deadline turned into one (seed 000 §III-B)."""
    if job.goal != DEADLINE:
        return float(job.throughput)
    remaining = max(0, int(job.size) - actions)
    if remaining == 0:
        return 0.0
    left = float(job.deadline) - now
    return math.inf if left <= 0 else remaining / left


def controller_step(job: QosJob, state: ControllerState, obs: JobProgress, *,
                    alpha: float = DEFAULT_ALPHA, max_devices: int | None = None) -> ControllerState:
    """One job controller at control step k (seed 000 §III-B, eq. 1-4)."""
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha must be in [0, 1], got {alpha}")
    dt = obs.time - state.last_time
    if dt <= 0:
        raise ValueError("control steps must move forward in time")
    t = (obs.actions - state.last_actions) / dt                                      # eq. 1
    a_hat = state.a_hat
    if t > 0 and obs.period_devices > 0:
        sample = obs.period_devices / t
        a_hat = sample if a_hat is None else alpha * sample + (1.0 - alpha) * a_hat    # eq. 2
    g = throughput_goal(job, obs.time, obs.actions)
    hi = job.cap(max_devices if max_devices is not None else 1 << 30)
    if a_hat is None:
        # No estimate yet: keep what it holds (a slow first action must not shrink it to its minimum before
        # anything is measured). Admission treats such a job's request as its minimum (`admission_request`).
        r = obs.allocation
    elif math.isinf(g):
        r = hi
    else:
        r = math.ceil(min(a_hat * g, float(hi)) - 1e-9)                                # eq. 3 (capped: no overflow)
    r = max(job.min_devices, min(r, hi)) if g > 0 or job.goal != DEADLINE else 0
    p = math.inf if g == 0 else t / g                                                 # eq. 4
    return replace(state, last_time=obs.time, last_actions=obs.actions, a_hat=a_hat,
                   throughput=t, goal=g, request=r, performance=p)


def broker_max(devices: int, blacklisted: int = 0, reserved: int = 0) -> int:
    """The broker's `max` (seed 000 §III-B): blacklisted and reserved devices excluded."""
    return max(0, devices - blacklisted - reserved)


@dataclass(frozen=True)
class BrokerJob:
    job_id: str
    request: int            # r_j
    performance: float      # p_j
    deadline_goal: bool
    max_devices: int | None = None
    priority: float = 1.0   # w_j: p_j / w_j ranks the jobs (module docstring)
    min_devices: int = 0    # never allocated fewer (the job manager keeps a job on >= 1 device)

    @property
    def rank(self) -> float:
        """p_j / w_j: lower is served first (a priority <= 0 ranks last)."""
        return self.performance / self.priority if self.priority > 0 else math.inf


def allocate_fit(jobs: Sequence[BrokerJob], max_: int) -> dict[str, int]:
    """Algorithm 2: every request granted; slack to deadline-bound jobs, worst p first."""
    alloc = {j.job_id: j.request for j in jobs}
    slack = max_ - sum(alloc.values())
    order = {j.job_id: i for i, j in enumerate(jobs)}
    dbound = sorted((j for j in jobs if j.deadline_goal), key=lambda j: (j.rank, -j.priority, order[j.job_id]))
    room = {j.job_id: (math.inf if j.max_devices is None else j.max_devices) for j in jobs}
    for j in dbound:                          # paused jobs first
        if alloc[j.job_id] == 0 and slack > 0 and room[j.job_id] >= 1:
            alloc[j.job_id] = 1
            slack -= 1
    assigned = True
    while slack > 0 and assigned:             # the rest round-robin
        assigned = False
        for j in dbound:
            if slack > 0 and alloc[j.job_id] < room[j.job_id]:
                alloc[j.job_id] += 1
                slack -= 1
                assigned = True
    return alloc


def allocate_not_fit(jobs: Sequence[BrokerJob], max_: int) -> dict[str, int]:
    """Algorithm 3: entries (p_j / w_j * 0.75^i, j) for i < r_j, sorted ascending, first `max` granted.

    Each job's minimum is granted first (seed 000 §III: the manager honours min/max; the paper's jobs have
    none), best rank first if even the minimums do not all fit; its entries then start at i = min.
    """
    alloc = {j.job_id: 0 for j in jobs}
    left = max_
    for _, j in sorted(enumerate(jobs), key=lambda e: (e[1].rank, -e[1].priority, e[0])):
        alloc[j.job_id] = min(j.min_devices, left)
        left -= alloc[j.job_id]
    available: list[tuple[float, float, int, str]] = []
    for order, j in enumerate(jobs):
        prio = j.rank * ALG3_DECAY ** alloc[j.job_id]
        for _ in range(alloc[j.job_id], j.request):
            available.append((prio, -j.priority, order, j.job_id))
            prio *= ALG3_DECAY
    available.sort(key=lambda e: e[:3])
    for *_, job_id in available[:left]:
        alloc[job_id] += 1
    return alloc


def resource_broker(jobs: Sequence[BrokerJob], max_: int) -> tuple[dict[str, int], bool]:
    """Algorithm 1. Returns (allocation, fit) where fit tells which branch ran."""
    if max_ < 0:
        raise ValueError("max must be >= 0")
    request = sum(j.request for j in jobs)
    if request <= max_:
        return allocate_fit(jobs, max_), True
    return allocate_not_fit(jobs, max_), False


def admission_request(job: QosJob, state: ControllerState | None, allocation: int) -> int:
    """What admission may leave a running job: its request, or before any estimate its minimum (>= 1) --
    a job that has completed nothing yet holds its devices for the broker but must not lock others out."""
    if state is None:
        return allocation
    return state.request if state.a_hat is not None else job.cap(max(1, job.min_devices))


def admit(job: QosJob, allocation: Mapping[str, int], requests: Mapping[str, int], max_: int,
          priorities: Mapping[str, float] | None = None) -> dict[str, int] | None:
    """Allocation after admitting `job` (seed 000 §III-B, end), or None if it is rejected.

    `allocation` and `requests` cover the active jobs (a job without an
    estimate yet should pass its minimum or current allocation as request).
    Surplus devices are taken from the lowest `priorities` first (default 1
    each), then from the job with the largest surplus, then by id.
    """
    prio = priorities or {}
    alloc = dict(allocation)
    free = max_ - sum(alloc.values())
    need = max(1, job.min_devices)
    if free >= need:
        alloc[job.job_id] = job.cap(free)
        return alloc
    got = max(0, free)
    for jid in sorted(alloc, key=lambda k: (prio.get(k, 1.0), requests.get(k, alloc[k]) - alloc[k], k)):
        surplus = alloc[jid] - requests.get(jid, alloc[jid])
        take = min(max(0, surplus), need - got)
        if take:
            alloc[jid] -= take
            got += take
        if got >= need:
            break
    if got < need:
        return None
    alloc[job.job_id] = got
    return alloc


def throughput_decide(jobs: Sequence[QosJob], states: Mapping[str, ControllerState],
                      observations: Mapping[str, JobProgress], max_: int, *,
                      alpha: float = DEFAULT_ALPHA) -> tuple[dict[str, int], dict[str, ControllerState], bool]:
    """One periodic control step: every controller, then the broker.

    Returns (allocation, new controller states, fit branch taken).
    """
    new_states = {j.job_id: controller_step(j, states[j.job_id], observations[j.job_id], alpha=alpha,
                                            max_devices=max_) for j in jobs}
    bjobs = [BrokerJob(j.job_id, new_states[j.job_id].request, new_states[j.job_id].performance,
                       j.goal == DEADLINE, j.max_devices, j.priority, j.min_devices) for j in jobs]
    alloc, fit = resource_broker(bjobs, max_)
    return alloc, new_states, fit
