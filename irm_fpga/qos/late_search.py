"""An exact search for a schedule with no late job, in continuous time, knowing every arrival.

`irm_fpga.qos.late_milp` bounds late jobs from below on a time grid; this
module answers the question exactly: can every job of a sequence start within
`late_after` s of its arrival on `pool` devices, non-preemptively, each on one
of its sizes? It finds such a schedule (a clairvoyant one: the bench stores
them to show an online policy's late jobs were avoidable in hindsight), or
proves there is none (then every policy has a late job there), or runs out of
time. Like the MILP it is an offline tool, never used to decide online.

Why the search is complete although it only starts jobs at a few instants:

* Left shift. Take any schedule with no late job and move each job, in start
  order, to the earliest instant at or after its arrival at which its devices
  are free for its whole run. Nothing starts later and nothing ends later, so
  no device is overbooked and no job becomes late; each job now starts at its
  arrival or at the instant some device is released. The search only tries
  those instants (an "active" schedule).
* Identical devices. A state is the time, the next arrival, the jobs waiting
  and the multiset of release times; which device is which never matters.
  A state whose release times are all at least those of a state already
  refuted (same time, arrivals and waiting jobs) is refuted too: freeing
  devices earlier never hurts.
* Energy. A job not yet started whose start deadline is d must, on r devices
  for t(r) s, use at least min_r r * min(t(r), T - d) device-seconds of
  [now, T]; the busy devices use theirs; if the sum exceeds pool * (T - now)
  for some T no schedule exists from this state (the jobs arriving within
  `horizon_s` are counted: fewer jobs only loosen the test).

Branches are tried earliest start deadline first and fewest devices first,
then "wait for the next arrival or release", so on a light load the first
descent is a plain greedy schedule and search effort goes where the load is.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from irm_fpga.qos import hydrogen as hy

_EPS = 1e-9
ON_TIME, IMPOSSIBLE, UNKNOWN = "on_time", "impossible", "unknown"


@dataclass(frozen=True)
class SearchResult:
    verdict: str                                     # ON_TIME, IMPOSSIBLE or UNKNOWN (time limit)
    dispatches: tuple[tuple[str, float, int], ...]   # (job id, start, devices) when ON_TIME
    nodes: int
    seconds: float


def on_time_schedule(jobs: Sequence[hy.HJob], pool: int, sizes: Callable[[hy.HJob], Sequence[tuple[int, float]]], *,
                     late_after: float = hy.LATE_AFTER_S, start: float | None = None,
                     busy: Sequence[float] = (), horizon_s: float = 8.0, time_limit: float = 60.0) -> SearchResult:
    """A schedule of `jobs` (sorted by arrival) in which none starts more than `late_after` s after arriving.

    `sizes(job)`: every (devices, seconds) the job may run on. The search starts at `start` (default: the
    first arrival) with devices busy until each time in `busy` (one entry per device; the state some
    policy left), so it can continue a run; jobs arriving before `start` are waiting then. From an empty
    pool over a window of arrivals, IMPOSSIBLE certifies that every schedule of any longer run has a late
    job among them (jobs before the window only take devices away).
    """
    if pool < 1:
        raise ValueError("pool must be >= 1")
    if len(busy) > pool:
        raise ValueError(f"{len(busy)} busy devices given for a pool of {pool}")
    t_begin = time.monotonic()
    n = len(jobs)
    if n == 0:
        return SearchResult(ON_TIME, (), 0, 0.0)
    arr = [j.arrival for j in jobs]
    if any(b < a for a, b in zip(arr, arr[1:], strict=False)):
        raise ValueError("jobs must be sorted by arrival")
    dl = [a + late_after for a in arr]
    sz = [sorted((r, t) for r, t in sizes(j) if r <= pool) for j in jobs]
    refuted: dict[tuple, list[tuple[float, ...]]] = {}
    stop_at = t_begin + time_limit
    nodes = 0

    def fits_energy(t: float, nxt: int, queue: frozenset[int], rel: tuple[float, ...]) -> bool:
        must = [*queue, *(k for k in range(nxt, n) if arr[k] < t + horizon_s)]
        for T in {dl[k] + d for k in must for _, d in sz[k]}:
            room = pool * (T - t) - sum(min(b, T) - t for b in rel)
            for k in must:
                x = T - dl[k]
                if x > 0:
                    room -= min(r * min(d, x) for r, d in sz[k])
                    if room < -_EPS:
                        return False
        return True

    def refute(key: tuple, shape: tuple[float, ...]) -> None:
        refuted.setdefault(key, []).append(shape)

    def expand(t: float, nxt: int, queue: frozenset[int], rel: tuple[float, ...]):
        """The children of a state (already past its arrivals), best first, or None when it is refuted."""
        key = (round(t, 9), nxt, queue)
        shape = tuple(sorted((b - t for b in rel), reverse=True)) + (0.0,) * (pool - len(rel))
        if any(all(a >= b - _EPS for a, b in zip(shape, f, strict=True)) for f in refuted.get(key, ())):
            return None, key, shape
        # A job past its start deadline (waiting since before `start`) is late already; one with no size fits never.
        if any(not sz[q] or dl[q] < t - _EPS for q in queue) or not fits_energy(t, nxt, queue, rel):
            refute(key, shape)
            return None, key, shape
        free = pool - len(rel)
        kids = []
        for q in sorted(queue, key=lambda q: dl[q]):
            for r, d in sz[q]:
                if r > free:
                    break
                kids.append(((q, t, r), (t, nxt, queue - {q}, tuple(sorted(rel + (t + d,) * r)))))
        nt = min(arr[nxt] if nxt < n else float("inf"), rel[0] if rel else float("inf"))
        if nt != float("inf") and all(dl[q] >= nt - _EPS for q in queue):
            kids.append((None, (nt, nxt, queue, rel)))
        return kids, key, shape

    def settle(t: float, nxt: int, queue: frozenset[int], rel: tuple[float, ...]):
        rel = tuple(b for b in rel if b > t + _EPS)
        while nxt < n and arr[nxt] <= t + _EPS:
            queue = queue | {nxt}
            nxt += 1
        return t, nxt, queue, rel

    first = settle(arr[0] if start is None else start, 0, frozenset(), tuple(sorted(busy)))
    # An explicit stack (runs have thousands of jobs: recursion would hit Python's limit). A frame is
    # [children, next child, key, shape, whether its current child put a dispatch on `path`].
    stack: list[list] = []
    path: list[tuple[int, float, int]] = []
    state = first
    while True:
        t, nxt, queue, rel = state
        if not queue and nxt == n:
            out = tuple((jobs[q].job_id, s, r) for q, s, r in path)
            return SearchResult(ON_TIME, out, nodes, time.monotonic() - t_begin)
        nodes += 1
        if nodes % 512 == 0 and time.monotonic() > stop_at:
            return SearchResult(UNKNOWN, (), nodes, time.monotonic() - t_begin)
        kids, key, shape = expand(t, nxt, queue, rel)
        if kids:
            stack.append([kids, 0, key, shape, False])
        elif kids is not None:
            refute(key, shape)
        # Backtrack past exhausted states; each is refuted (no child of it led to a schedule).
        while stack and stack[-1][1] >= len(stack[-1][0]):
            frame = stack.pop()
            refute(frame[2], frame[3])
            if frame[4]:
                path.pop()
        if not stack:
            return SearchResult(IMPOSSIBLE, (), nodes, time.monotonic() - t_begin)
        frame = stack[-1]
        if frame[4]:
            path.pop()
        step, child = frame[0][frame[1]]
        frame[1] += 1
        frame[4] = step is not None
        if step is not None:
            path.append(step)
        state = settle(*child)
