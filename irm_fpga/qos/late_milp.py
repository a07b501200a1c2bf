"""An exact-in-the-limit lower bound on late jobs for any schedule: a time-indexed MILP relaxation.

`irm_fpga.qos.sim.late_lower_bound` and `late_lower_bound_energy` are cheap
counting arguments; they miss overloads where no single interval is over
capacity but the jobs' start windows cannot all be packed. This bound asks
HiGHS (scipy's `milp`) for the fewest late jobs of a relaxed packing problem
whose optimum is at most that of any real schedule, of any policy, even one
that knows every arrival in advance. It is for the bench's certificates (is
a late job of ours avoidable by anyone?), never for deciding online.

The relaxation, on a grid of cells [k h, (k + 1) h):

* a job that is not late starts at some s in [a, a + late_after] on r of its
  sizes and runs t(r) s. Map it to start cell k = ceil(s / h) and let it hold
  r devices over K = floor(t(r) / h) cells k .. k + K - 1. Each such cell m
  has s <= k h <= m h < s + K h <= s + t(r): the real job runs at the instant
  m h, so the load the relaxation puts on a cell is at most the real load at
  one instant, which is at most `pool`. Every real schedule thus maps to a
  feasible point with the same late jobs;
* a late job is dropped (it may run anywhere, later: it uses no cell);
* jobs outside the set given are left out (fewer jobs only loosen it).

Minimising the dropped jobs thus bounds N_L from below. Halving the step
never loosens it (the grids nest; h -> 0 loses only the rounding) and makes
it larger. Holds are counted in exact arithmetic (`_cells_within`). The
MILP's dual bound is valid even when the time limit stops the search, so
the bound stays sound -- but the LP relaxation alone proves nothing on the
overloads we met, so a search cut short usually certifies 0.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from fractions import Fraction

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp
from scipy.sparse import coo_matrix

from irm_fpga.qos import hydrogen as hy

# Float slack in the start windows: they widen by it (wider is always sound).
_EPS = 1e-9


def _cells_within(t: float, step: float) -> int:
    """The most whole cells K with K * step <= t, in exact arithmetic: a float floor(t / step) can round up past
    t (t a hair under a multiple of the step), which a chain of jobs ending just before the next one starts
    turns into a late job no real schedule has. The grid is the decimal step (0.02 is 1/50, not the binary
    float a hair above it, which would cut a 0.5 s hold to 24 cells); start windows absorb the difference."""
    return math.floor(Fraction(t) / Fraction(step).limit_denominator(10**9))


@dataclass(frozen=True)
class MilpBound:
    late: int            # at least this many of the jobs are late in every schedule
    optimal: bool        # the search finished (else `late` is the dual bound when the time limit struck)
    jobs: int
    variables: int
    seconds: float


def late_lower_bound_milp(jobs: Sequence[hy.HJob], pool: int,
                          sizes: Callable[[hy.HJob], Sequence[tuple[int, float]]], *,
                          late_after: float = hy.LATE_AFTER_S, step: float = 0.02,
                          time_limit: float = 60.0) -> MilpBound:
    """The fewest late jobs among `jobs` on `pool` devices in any schedule (a lower bound; see the module).

    `sizes(job)`: every (devices, seconds) the job may run on. Leave out jobs that need not start (those
    arriving within `late_after` of a run's end).
    """
    if step <= 0 or pool < 1:
        raise ValueError("step must be > 0 and pool >= 1")
    # Options: (job, devices, first cell, cells held); x_v = 1 runs job on that option, else the job is dropped.
    opts: list[tuple[int, int, int, int]] = []
    for i, j in enumerate(jobs):
        first = math.ceil(j.arrival / step - _EPS)
        last = math.ceil((j.arrival + late_after) / step + _EPS)
        for r, t in sizes(j):
            if r > pool:
                continue
            held = _cells_within(t, step)
            opts += [(i, r, k, held) for k in range(first, last + 1)]
    n, nx = len(jobs), len(opts)
    if n == 0:
        return MilpBound(0, True, 0, 0, 0.0)
    if nx == 0:
        return MilpBound(n, True, n, 0, 0.0)
    k0 = min(o[2] for o in opts)
    k1 = max(o[2] + o[3] for o in opts)
    cells = k1 - k0
    # Variables: x (options), y (one drop per job), L (load per cell). Rows: one choice per job; the load flow
    # L_k - L_{k-1} = devices starting at k - devices ending at k, with 0 <= L_k <= pool (sparser than summing
    # every option over every cell it holds).
    rows, cols, vals = [], [], []
    for v, (i, r, k, held) in enumerate(opts):
        rows.append(i), cols.append(v), vals.append(1.0)
        if held == 0:
            continue
        rows.append(n + k - k0), cols.append(v), vals.append(-float(r))
        if k + held < k1:
            rows.append(n + k + held - k0), cols.append(v), vals.append(float(r))
    for i in range(n):
        rows.append(i), cols.append(nx + i), vals.append(1.0)
    for c in range(cells):
        rows.append(n + c), cols.append(nx + n + c), vals.append(1.0)
        if c > 0:
            rows.append(n + c), cols.append(nx + n + c - 1), vals.append(-1.0)
    a = coo_matrix((vals, (rows, cols)), shape=(n + cells, nx + n + cells)).tocsr()
    eq = np.concatenate([np.ones(n), np.zeros(cells)])
    cost = np.concatenate([np.zeros(nx), np.ones(n), np.zeros(cells)])
    integral = np.concatenate([np.ones(nx + n), np.zeros(cells)])
    upper = np.concatenate([np.ones(nx + n), np.full(cells, float(pool))])
    t0 = time.monotonic()
    res = milp(cost, constraints=LinearConstraint(a, eq, eq), integrality=integral,
               bounds=Bounds(np.zeros(nx + n + cells), upper),
               options={"time_limit": time_limit, "disp": False, "mip_rel_gap": 0.0})
    optimal = res.status == 0
    dual = res.fun if optimal else getattr(res, "mip_dual_bound", None)
    # An integer count: the dual bound rounded up, less a hair for the solver's tolerances (never up past it).
    late = 0 if dual is None or not math.isfinite(dual) else max(0, math.ceil(dual - 1e-6))
    return MilpBound(late, optimal, n, nx + n + cells, time.monotonic() - t0)


def late_windows(late_arrivals: Sequence[float], *, before: float = 2.5, after: float = 2.0,
                 gap: float = 5.0) -> list[tuple[float, float]]:
    """Intervals of arrivals worth a MILP: around each cluster of late jobs' arrivals (closer than `gap` s).

    Only where to look; the bound on any interval is sound whatever it is. The overload behind a late job
    starts a few seconds before it arrives (the jobs ahead of it) and ends soon after.
    """
    out: list[tuple[float, float]] = []
    for a in sorted(late_arrivals):
        if out and a <= out[-1][1] - after + gap:
            out[-1] = (out[-1][0], a + after)
        else:
            out.append((a - before, a + after))
    return out
