"""A one-step lookahead (rollout) for the deadline-aware managed mode. Not in the papers.

What the deadline-aware mode (`hydrogen.managed_deadline_schedule`) cannot
do is choose a dispatch that none of its candidate algorithms would make.
An exact search on seed 001 §VI scenario 2 (seeds 3 and 7, where that mode
starts a job late) found schedules that start every job on time by starting
long jobs early, holding short ones close to their 1 s limit and, for a
moment, leaving a device idle while a job waits: decisions no FCFS, SJTF or
slack order makes. And the candidates' projections see only the jobs
already queued, so a schedule that fills every device now looks free until
the next arrival finds none.

The lookahead decides among every first step instead of among algorithms:
which of the first jobs in slack order start now and on how many devices
(or none of them), each first step continued by `slack_amap` (the
continuation, or base policy, of a rollout), projected over a few futures
sampled from the recent arrivals (a bootstrap of their inter-arrival gaps
and job shapes: only what has been seen), and kept by the fewest mean
predicted late jobs, then the least mean sojourn (start latency plus
completion time, the sum of which also decides how many jobs a run
completes by a given time). Sampled futures, not one expected stream nor
none (late jobs per run of seed 001 §VI scenario 2, measured while designing
it): over `hydrogen.forecast_arrivals` (evenly spaced jobs at 1.5 x the
recent rate, 2 s ahead) 3.8 on seeds 0-9; with no future at all 0.3 on
seeds 0-9 but 0.65 on seeds 10-29; with 6 sampled futures 0.3-0.4 and 0.25;
with the true arrivals of the next 3 s (a clairvoyant diagnostic, not a
policy) 0.2 on seeds 0-9.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace

from irm_fpga.qos.hydrogen import (
    LATE_AFTER_S,
    Allocation,
    Cost,
    HJob,
    Projection,
    deadline_score,
    linear_cost,
    project,
    slack_amap,
    slack_order,
    with_late_after,
)

BASE = slack_amap       # the continuation of every first step (the rollout's base policy)
SAMPLES = 6             # futures per decision
HORIZON_S = 1.0         # how far each sampled future reaches (a job's start limit)
HISTORY_S = 30.0        # the recent arrivals the futures are drawn from
EXTRA_JOBS = 2          # first steps consider the jobs that fit on the free devices, and this many more
MAX_JOBS = 4            # ... but no more than this many before the extra ones (first steps grow combinatorially)
MAX_SIZES = 4           # device counts tried per job: min..max when that is at most this many, else spread


def first_steps(queue: Sequence[HJob], available: int, now: float, late_after: float = LATE_AFTER_S,
                extra: int = EXTRA_JOBS) -> list[Allocation]:
    """Every dispatch of the first `min(available, MAX_JOBS) + extra` jobs in slack order: each skipped or given
    one of `sizes` (min..max devices, or `MAX_SIZES` of them spread over that range).

    The empty dispatch (wait) comes first; every allocation fits in `available`. The caps keep a
    decision on a large pool to hundreds of first steps (8 free devices and jobs of up to 8: 43,758
    without them, about a minute per decision); on seed 001 §VI's 4 devices they change nothing.
    """
    return list(iter_first_steps(queue, available, now, late_after, extra))


def iter_first_steps(queue: Sequence[HJob], available: int, now: float, late_after: float = LATE_AFTER_S,
                     extra: int = EXTRA_JOBS) -> Iterator[Allocation]:
    """`first_steps` one at a time, in the same order (a search cut short builds no more of them)."""
    order = slack_order(queue, now, late_after)[:min(max(0, available), MAX_JOBS) + extra]

    def grow(i: int, left: int, cur: Allocation) -> Iterator[Allocation]:
        for k in range(i, len(order)):
            job = order[k]
            for r in sizes(job.min_devices, min(job.max_devices, left)):
                nxt = [*cur, (job.job_id, r)]
                yield nxt
                yield from grow(k + 1, left - r, nxt)

    yield []
    yield from grow(0, available, [])


def sizes(lo: int, hi: int, most: int = MAX_SIZES) -> list[int]:
    """lo..hi, or `most` device counts spread evenly over it (both ends included)."""
    if hi - lo + 1 <= most:
        return list(range(lo, hi + 1))
    return sorted({lo + round(i * (hi - lo) / (most - 1)) for i in range(most)})


def sample_arrivals(history: Sequence[HJob], now: float, *, samples: int = SAMPLES, horizon: float = HORIZON_S,
                    span: float = HISTORY_S, rng: random.Random) -> list[list[HJob]]:
    """`samples` futures of `horizon` s after `now`, drawn from the arrivals of the last `span` s.

    Each future repeats gaps drawn (with replacement) from the recent
    inter-arrival gaps, the first one counted from the last arrival (if that
    lands in the past, the first job arrives uniformly within one gap of
    `now`), and gives each arrival the shape of a recent job drawn the same
    way. Fewer than three recent arrivals: no future is known, one empty
    future is returned. Ids are "~s.k" (never a real job's).
    """
    recent = sorted((j for j in history if now - span <= j.arrival <= now), key=lambda j: (j.arrival, j.job_id))
    if len(recent) < 3:
        return [[]]
    gaps = [b.arrival - a.arrival for a, b in zip(recent, recent[1:], strict=False)]
    if max(gaps) <= 0:
        return [[]]
    futures = []
    for s in range(samples):
        fut: list[HJob] = []
        g = rng.choice(gaps)
        t = recent[-1].arrival + g
        if t <= now:
            t = now + rng.uniform(0.0, g)
        while t <= now + horizon:
            fut.append(replace(rng.choice(recent), job_id=f"~{s}.{len(fut)}", arrival=t))
            t += rng.choice(gaps)
        futures.append(fut)
    return futures


def futures_for(history: Sequence[HJob], now: float, *, samples: int = SAMPLES, span: float = HISTORY_S,
                seed: int = 0) -> list[list[HJob]]:
    """`sample_arrivals` seeded by `seed` and the latest arrival in `history` up to `now`, not by `now`.

    Every decision between two arrivals then plans against the same futures: a completion brings no
    news about arrivals, and re-drawing the futures there made plans flip and cost late jobs
    (scenario 2, seeds 10-59: 6-9 late jobs in all over three random streams, against 8-9).
    """
    last = max((j.arrival for j in history if j.arrival <= now), default=None)
    return sample_arrivals(history, now, samples=samples, span=span, rng=random.Random(f"{seed}:{last!r}"))


def _then(step: Allocation, now: float, base: Callable[..., Allocation]) -> Callable[..., Allocation]:
    """`step` at the decision instant `now` (once), `base` at every later decision."""
    t0, used = now, [False]

    def alg(queue: Sequence[HJob], available: int, window: int, cost: Cost, *, now: float = now) -> Allocation:
        if not used[0] and now == t0:
            used[0] = True
            return list(step)
        return base(queue, available, window, cost, now=now)

    return alg


def lookahead_schedule(queue: Sequence[HJob], available: int, window: int, cost: Cost = linear_cost, *,
                       now: float, running_ends: Sequence[tuple[float, int]] = (), pool: int | None = None,
                       futures: Sequence[Sequence[HJob]] = ((),), base: Callable[..., Allocation] = BASE,
                       late_after: float = LATE_AFTER_S, stop_at: float | None = None,
                       clock: Callable[[], float] = time.monotonic) -> Projection:
    """The first step (`first_steps`) whose schedules, continued by `base` over `futures`, are best on average.

    Best: fewest priority-weighted late jobs (window and future jobs), then
    fewest jobs never started (`hydrogen.deadline_score`), then least sojourn
    (start latency + completion time, priority-weighted, of the jobs
    started). Ties go to the earlier first step.
    Returns the chosen step's projection on the first future (its
    `allocation` is the dispatch now; its `algorithm` is "lookahead").

    `stop_at` (a `clock()` time; None: no limit) bounds the search: the
    step `base` itself would take now is weighed first (and wins ties),
    then first steps in order until it has passed, so a cut-short search
    is never worse (in its own projections) than `base` alone, and waiting
    is chosen only if it was weighed and found strictly better.
    """
    if pool is None:
        pool = available + sum(n for _, n in running_ends)
    base = with_late_after(base, late_after)
    head = list(queue[:window])
    futures = list(futures) or [[]]
    best: Projection | None = None
    best_key: tuple[float, float, float] | None = None

    def weigh(step: Allocation) -> None:
        nonlocal best, best_key
        late = never = sojourn = 0.0
        shown: Projection | None = None
        for fut in futures:
            proj = project(_then(step, now, base), "lookahead", head, now, running_ends, pool, window, cost,
                           fut, available, wake_late_after=late_after)
            shown = shown or proj
            neg_late, neg_never, neg_waits, neg_ends = deadline_score(proj, [*head, *fut], late_after)
            late -= neg_late
            never -= neg_never
            sojourn -= neg_waits + neg_ends
        key = (-late, -never, -sojourn)
        if best_key is None or key > best_key:
            best, best_key = shown, key

    if stop_at is None:
        for step in iter_first_steps(head, available, now, late_after):
            weigh(step)
    else:
        first = base(head, available, window, cost, now=now)
        weigh(first)
        for step in iter_first_steps(head, available, now, late_after):
            if clock() >= stop_at:
                break
            if sorted(step) != sorted(first):
                weigh(step)
    assert best is not None
    return best


def managed_lookahead(queue: Sequence[HJob], available: int, window: int, cost: Cost = linear_cost, *,
                      now: float = 0.0, running_ends: Sequence[tuple[float, int]] = (), pool: int | None = None,
                      history: Sequence[HJob] = (), samples: int = SAMPLES, seed: int = 0,
                      late_after: float = LATE_AFTER_S) -> tuple[Allocation, str]:
    """`lookahead_schedule` over `samples` futures drawn from `history` (recent arrivals): the dispatch, and its name.

    Seeded as `futures_for`: the same inputs give the same dispatch.
    """
    futures = futures_for(history, now, samples=samples, seed=seed)
    best = lookahead_schedule(queue, available, window, cost, now=now, running_ends=running_ends, pool=pool,
                              futures=futures, late_after=late_after)
    return best.allocation, best.algorithm
