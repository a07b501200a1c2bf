"""One dispatching decision of a Hydrogen scheduler (seed 001 Algorithm 1), the same live and simulated.

`decide` is what both the simulator (`irm_fpga.qos.sim.run_hydrogen`) and
the FPGA IRM's job manager (`irm_fpga.jobs`, a Hydrogen policy) call on
every event: the ready queue, the running jobs and the pool in, the jobs to
start now (and on how many devices) and the pool to provision out. A
`Scheduler` says which algorithm decides: a single one (FCFSMax, ..., or
`slack_min`/`slack_amap`), the paper's managed mode (with Algorithm 3 after
the dispatch: line 9), or the deadline-aware managed mode (its elasticity
manager before the dispatch; optionally the one-step lookahead of
`irm_fpga.qos.lookahead`). `scheduler_for(name)` builds the one a policy
name of `irm_fpga.qos.registry` stands for.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from irm_fpga.qos import hydrogen as hy
from irm_fpga.qos import lookahead as la
from irm_fpga.qos import plugins

MANAGED_MODES = ("managed", "managed_deadline")
SINGLE_ALGORITHMS: dict[str, Callable[..., hy.Allocation]] = plugins.BUILT_IN   # and plug-ins by name (plugins)
FORECAST = 30       # expected arrivals the deadline-aware elasticity manager checks a shrink against (= window)


@dataclass(frozen=True)
class Scheduler:
    """Which Hydrogen scheduler decides, and with what settings."""

    algorithm: str                              # a single algorithm (or plug-in), "managed" or "managed_deadline"
    window: int = 30                            # jobs of the ready queue each decision looks at
    late_after: float = hy.LATE_AFTER_S         # a job waiting longer than this to start is late
    strategy: str = hy.COMPLETION_TIME          # the paper's managed mode scores by it
    elasticity: bool = False                    # run the mode's elasticity manager (managed modes only)
    beta: float = 2.5                           # Algorithm 3's shrink threshold
    pool_min: int = 1                           # the elasticity manager's lower bound on the pool
    forecast: int = 0                           # deadline-aware shrink: expected arrivals checked (0: none)
    lookahead: int = 0                          # deadline-aware mode: futures of the lookahead (0: candidates)
    seed: int = 0                               # seeds the lookahead's futures
    budget_s: float | None = None               # lookahead: seconds one decision may search (None: no limit)
    algorithms: Mapping[str, Callable[..., hy.Allocation]] | None = None   # managed candidates (None: default)

    def __post_init__(self) -> None:
        if self.algorithm not in MANAGED_MODES:
            plugins.single_algorithm(self.algorithm)     # UnknownPolicy / PolicyError saying what is wrong
        if self.lookahead and self.algorithm != "managed_deadline":
            raise ValueError(f"lookahead={self.lookahead} needs algorithm 'managed_deadline' (got {self.algorithm!r})")
        if self.elasticity and self.algorithm not in MANAGED_MODES:
            raise ValueError(f"{self.algorithm!r} has no elasticity manager (only {', '.join(MANAGED_MODES)})")
        if self.window < 1 or not self.late_after > 0 or self.pool_min < 1 or not self.beta >= 0:
            raise ValueError("need window >= 1, late_after > 0, pool_min >= 1 and beta >= 0")
        if self.budget_s is not None and not self.budget_s >= 0:
            raise ValueError(f"budget_s must be >= 0 seconds or None (got {self.budget_s!r})")

    @property
    def wakes(self) -> bool:
        """Whether it must decide again at the start deadline of a job it left waiting (`hy.wake_time`): the
        lookahead may wait with devices free for a sampled arrival, and nothing else would come before the
        job turns late if that arrival does not."""
        return self.lookahead > 0


@dataclass(frozen=True)
class Decision:
    allocation: hy.Allocation   # (job, devices) to start now
    algorithm: str              # whose schedule a managed mode took ("" for a single algorithm)
    pool: int                   # the pool to provision from now on
    scaling: str = ""           # the elasticity manager's decision, if one ran


def scheduler_for(name: str, *, seed: int = 0, window: int = 30, late_after: float = hy.LATE_AFTER_S) -> Scheduler:
    """The scheduler a Hydrogen policy name stands for (`irm_fpga.qos.registry.SCHEDULING_ALGORITHMS`).

    Single algorithms run on a fixed pool; "managed"/"managed_paper" is
    Algorithm 1 with Algorithm 3; "managed_deadline" the deadline-aware mode
    with its elasticity manager (a shrink checked against `FORECAST` expected
    arrivals); "managed_lookahead" that mode deciding by the lookahead.
    """
    common = {"window": window, "late_after": late_after, "seed": seed}
    if name in ("managed", "managed_paper"):
        return Scheduler("managed", elasticity=True, **common)
    if name == "managed_deadline":
        return Scheduler("managed_deadline", elasticity=True, forecast=FORECAST, **common)
    if name == "managed_lookahead":
        return Scheduler("managed_deadline", elasticity=True, forecast=FORECAST, lookahead=la.SAMPLES, **common)
    return Scheduler(name, **common)


def decide(s: Scheduler, queue: Sequence[hy.HJob], *, now: float, pool: int, pool_max: int,
           running: Sequence[hy.RunningJob] = (), cost: hy.Cost = hy.linear_cost,
           history: Sequence[hy.HJob] = (), plugin: Callable[..., object] | None = None) -> Decision:
    """Which queued jobs start now, on how many devices, and the pool from now on.

    `queue`: the ready queue in arrival order; `pool`: the devices provisioned
    now, of which `running` hold some (a running job's `end` is the cost
    model's prediction); `pool_max`: the most the elasticity manager may
    provision; `history`: the recent arrivals (the deadline-aware mode's
    forecast and the lookahead's futures are drawn from them). Jobs whose
    min exceeds `pool_max` wait, left out of the decision. `plugin`: what
    to call in place of a plug-in algorithm (the live manager's
    `plugin_worker.PluginRunner`, which runs it in a process of its own
    under a time limit); None: call it here.
    """
    # A job wider than any pool the manager may provision now cannot start: it stays queued, out of this
    # decision (FCFS and SJTF stopped at it, holding back every job behind it) and out of the futures drawn.
    queue = [j for j in queue if j.min_devices <= pool_max]
    history = [j for j in history if j.min_devices <= pool_max]
    used = sum(r.devices for r in running)
    free = max(0, pool - used)
    lo = min(s.pool_min, pool_max)          # fewer devices than pool_min may be left (other groups hold them)
    ends = [(r.end, r.devices) for r in running]
    if s.algorithm not in MANAGED_MODES:
        alg = hy.with_late_after(plugins.single_algorithm(s.algorithm), s.late_after)
        if s.algorithm in SINGLE_ALGORITHMS:
            return Decision(alg(queue, free, s.window, cost, now=now), "", pool)
        # A plug-in's answer is checked before anyone acts on it, against the queue as it was before the call:
        # it gets a copy, so one that sorts or pops the list it is given cannot move the window it is checked by.
        # Whatever the plug-in's code raises (its call, or its answer's iteration while it is checked) is its
        # PolicyError, as it is live (`plugin_worker`): the caller contains it (the simulator's bench fails that
        # plug-in's rows only) instead of taking it for a fault of its own.
        try:
            picked = (plugin or alg)(list(queue), free, s.window, cost, now=now)
            return Decision(plugins.check_allocation(s.algorithm, picked, queue, s.window, free), "", pool)
        except plugins.PolicyError:
            raise
        except SystemExit as e:         # a plug-in's exit() must not end the caller's thread
            raise plugins.PolicyError(f"scheduling algorithm {s.algorithm!r} called "
                                      f"exit({plugins.describe(e.code)})") from None
        except KeyboardInterrupt:
            if threading.current_thread() is threading.main_thread():
                raise                   # the user's Ctrl-C (a simulation in the foreground), not the plug-in's
            raise plugins.PolicyError(f"scheduling algorithm {s.algorithm!r} failed: KeyboardInterrupt") from None
        except BaseException as e:      # noqa: BLE001 - the plug-in's bug (chained: its traceback is kept), a
            # BaseException of its own included: live, the worker makes it a PolicyError too
            raise plugins.PolicyError(f"scheduling algorithm {s.algorithm!r} failed: {plugins.reason(e)}") from e
    if s.algorithm == "managed_deadline":
        algs = hy.DEADLINE_ALGORITHMS if s.algorithms is None else s.algorithms
        schedule = None
        # One deadline for the whole decision: the elasticity manager may search on several pool sizes.
        stop_at = None if s.budget_s is None else time.monotonic() + s.budget_s
        if s.lookahead > 0:
            futures = la.futures_for(list(history), now, samples=s.lookahead, span=hy.FORECAST_SPAN_S, seed=s.seed)
            schedule = functools.partial(la.lookahead_schedule, futures=futures, late_after=s.late_after,
                                         stop_at=stop_at)
        if s.elasticity:
            expected = hy.forecast_arrivals(list(history), now, s.forecast) if s.forecast else ()
            plan = hy.deadline_elasticity(queue, s.window, cost, now=now, pool=pool, lo=lo, hi=pool_max,
                                          beta=s.beta, algorithms=algs, late_after=s.late_after, running=running,
                                          expected=expected, schedule=schedule,
                                          out_of_time=lambda: stop_at is not None and time.monotonic() >= stop_at)
            return Decision(plan.schedule.allocation, plan.schedule.algorithm, plan.pool, plan.decision)
        if schedule is not None:
            best = schedule(queue, free, s.window, cost, now=now, running_ends=ends, pool=pool)
        else:
            best = hy.managed_deadline_schedule(queue, free, s.window, cost, now=now, running_ends=ends, pool=pool,
                                                algorithms=algs, late_after=s.late_after)
        return Decision(best.allocation, best.algorithm, pool)
    algs = hy.PAPER_ALGORITHMS if s.algorithms is None else s.algorithms
    best = hy.managed_schedule(queue, free, s.window, cost, now=now, running_ends=ends, pool=pool,
                               strategy=s.strategy, algorithms=algs, late_after=s.late_after)
    if not s.elasticity:
        return Decision(best.allocation, best.algorithm, pool)
    # Seed 001 Algorithm 1, line 9: the selected schedule's JLOs go to Algorithm 3 after the dispatch.
    d = hy.elasticity_from_jlos(hy.schedule_jlos(best, queue[:s.window], cost), s.beta)
    return Decision(best.allocation, best.algorithm, hy.resize_pool(pool, d.decision, lo, pool_max),
                    d.decision)
