"""Autoscaling of FPGA groups: policies as pure functions of measurements.

The engine (`irm_fpga.engine.Engine.measurements`) gives cumulative counters;
`interval_between` turns two snapshots into one `Interval` (per group: tasks
executed per client, device-seconds busy, tasks waiting at the end, sizes and
limits). A policy maps the recent intervals (oldest first, the last one ends
now) to new group sizes. Policies never read a clock and keep no state of
their own: everything they know is in the intervals, so the same decision
comes out live and in simulation.

`Autoscaler` is the small stateful wrapper the Orchestrator (or a simulation)
calls every period: `step(engine.measurements())` returns the sizes to change
(`{group_id: size}`, only groups whose size changes), to be applied with
`Engine.apply_sizes`. A group whose `min_size == max_size` is static: no
policy resizes it.

Policies (`POLICIES`, built by name with `make_policy`; an unknown name or
parameter raises `ValueError`):

* `static` -- fixed sizes (e.g. `{"A": 2, "B": 4, "C": 2}`), or no change.
* `thesis` -- thesis §3.3.2, Algorithm 1. Per group, the measurement system of
  eq. 3.4 (one row per past interval: tasks executed per client queue times
  the unknown per-task runtime equals the time the group worked) is solved
  with NNLS (`scipy.optimize.nnls`). We write each row in device-seconds,
  sum_j A_ij t_j = S_i * I (the group of S_i devices busy for the interval I),
  so that rows taken at different group sizes stay consistent and t_j is the
  runtime of one task on one device (the thesis divides by the size instead;
  in device-seconds the size multiplies). `rhs="busy"` uses the measured busy
  device-seconds instead of assuming a saturated group. The pending work of a
  group is R = sum_j waiting_j * t_j; a group with nothing waiting shrinks to
  its minimum; the devices are shared in proportion to R (line 10 of
  Algorithm 1), within min/max, rounded by largest remainder.
* `improved` -- ours. The thesis notes that its autoscaler over-reacts and pays
  3.78 s reconfigurations for nothing under light load; Algorithm 1 also
  sizes groups by the backlog seen at one instant, which under batch
  arrivals swings from interval to interval. This policy:
  - estimates task runtimes the same way, but against the measured busy time
    (an unsaturated group does not look slow);
  - measures each group's offered load (device-seconds arriving per second:
    work done plus growth of the backlog) and its need,
    n = load + backlog / drain_horizon_s (keep up, and clear the backlog);
  - resizes only for a real shortfall: a group gets a device only if
    (n - size) x period exceeds the reconfiguration time the move costs (so
    light load never reconfigures anything, and idle groups keep their
    devices instead of shrinking to the minimum for nothing);
  - takes a device first from a group that stays comfortable without it
    (size - 1 covers its need and its recent peak load / target_utilisation);
    otherwise, in contention, only from a group whose claim (its need, or its
    mean load over the last `memory` intervals: hysteresis) per remaining
    device is below the recipient's need per device by a `margin`, so a
    device does not bounce back and forth between two groups.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from scipy.optimize import nnls

from irm_fpga.engine import ServerMeasurements

DEPARTED = ""       # executions of clients that left during the interval


@dataclass(frozen=True)
class GroupWindow:
    """One group over one measurement interval."""

    group_id: str
    size: int                       # members serving at the end of the interval
    target: int
    min_size: int
    max_size: int
    executed: Mapping[str, int]     # tasks finished during the interval, per client
    busy_s: float                   # device-seconds of tasks finished during the interval
    waiting: Mapping[str, int]      # tasks queued (not started) at the end, per client
    running: int = 0
    joining: int = 0

    @property
    def static(self) -> bool:
        return self.min_size == self.max_size


@dataclass(frozen=True)
class Interval:
    start: float
    end: float
    usable: int                     # devices of the server that are not blacklisted
    groups: Mapping[str, GroupWindow] = field(default_factory=dict)

    @property
    def length(self) -> float:
        return self.end - self.start


def interval_between(prev: ServerMeasurements, cur: ServerMeasurements) -> Interval:
    """The interval between two cumulative snapshots of one server."""
    before = {g.group_id: g for g in prev.groups}
    groups = {}
    for g in cur.groups:
        p = before.get(g.group_id)
        if p is not None and p.incarnation != g.incarnation:
            p = None                    # made again since (its counters restarted at 0): all of it is new
        pc = {c.client_id: c.executed for c in p.clients} if p else {}
        executed = {}
        for c in g.clients:
            d = c.executed - pc.get(c.client_id, 0)
            executed[c.client_id] = d if d >= 0 else c.executed     # re-attached under the same id
        total = g.executed - (p.executed if p else 0)
        rest = total - sum(executed.values())
        if rest > 0:
            executed[DEPARTED] = rest
        busy = g.busy_s - (p.busy_s if p else 0.0)
        groups[g.group_id] = GroupWindow(
            g.group_id, g.size, g.target, g.min_size, g.max_size, executed, max(busy, 0.0),
            {c.client_id: c.waiting for c in g.clients}, g.running, g.joining)
    return Interval(prev.time, cur.time, cur.usable, groups)


# -- shared pieces ------------------------------------------------------------------------------------

def estimate_task_times(rows: Sequence[tuple[Mapping[str, int], float]]) -> dict[str, float]:
    """NNLS over rows (tasks executed per client, device-seconds worked): seconds per task per client.

    Thesis eq. 3.4: A t = b with t >= 0. Clients that executed nothing in any row get no estimate.
    """
    clients = sorted({c for counts, _ in rows for c, n in counts.items() if n > 0})
    use = [(counts, b) for counts, b in rows if any(counts.get(c, 0) > 0 for c in clients)]
    if not clients or not use:
        return {}
    a = np.array([[float(counts.get(c, 0)) for c in clients] for counts, _ in use])
    b = np.array([float(x) for _, x in use])
    t, _ = nnls(a, b)
    return {c: float(x) for c, x in zip(clients, t, strict=True)}


def apportion(weights: Mapping[str, float], total: int, lo: Mapping[str, int],
              hi: Mapping[str, int]) -> dict[str, int]:
    """Integer shares of `total` proportional to `weights`, each within [lo, hi].

    Real shares are clamped by water-filling, then rounded by largest remainder (ties by name).
    Groups with zero weight get their lower bound. If the bounds cannot add up to `total`, the
    result sums to as much as they allow.
    """
    names = sorted(weights)
    if sum(lo[g] for g in names) > total:
        raise ValueError(f"minimum sizes add up to {sum(lo[g] for g in names)}, more than {total} devices")
    share = {g: float(lo[g]) for g in names}
    free = [g for g in names if weights[g] > 0 and hi[g] > lo[g]]
    fixed = {g: float(lo[g]) for g in names if g not in free}
    while free:
        rest = total - sum(fixed.values())
        w = sum(weights[g] for g in free)
        x = {g: rest * weights[g] / w for g in free}
        low = [g for g in free if x[g] < lo[g]]
        high = [g for g in free if x[g] > hi[g]]
        if low:
            for g in low:
                fixed[g] = float(lo[g])
        elif high:
            for g in high:
                fixed[g] = float(hi[g])
        else:
            fixed.update(x)
            break
        free = [g for g in free if g not in fixed]
    share.update(fixed)
    alloc = {g: max(lo[g], min(hi[g], math.floor(share[g] + 1e-9))) for g in names}
    left = total - sum(alloc.values())
    order = sorted((g for g in names if weights[g] > 0), key=lambda g: (-(share[g] - alloc[g]), g))
    while left > 0:
        progressed = False
        for g in order:
            if left > 0 and alloc[g] < hi[g] and share[g] - alloc[g] > 1e-9:
                alloc[g] += 1
                left -= 1
                progressed = True
        if not progressed:
            break
    return alloc


def _elastic(last: Interval) -> tuple[list[GroupWindow], int]:
    """Groups a policy may resize, and the devices they share (usable minus static groups' sizes)."""
    elastic = [g for g in last.groups.values() if not g.static]
    fixed = sum(g.target for g in last.groups.values() if g.static)
    return elastic, max(0, last.usable - fixed)


def _rows(history: Sequence[Interval], gid: str, rhs: str) -> list[tuple[Mapping[str, int], float]]:
    rows = []
    for iv in history:
        g = iv.groups.get(gid)
        if g is None:
            continue
        b = g.busy_s if rhs == "busy" else g.size * iv.length
        rows.append((g.executed, b))
    return rows


def _pending_work(g: GroupWindow, t: Mapping[str, float]) -> float | None:
    """Device-seconds waiting in the group's queues; None if some waiting client has no estimate."""
    known = [v for v in t.values() if v > 0]
    fallback = sum(known) / len(known) if known else None
    r = 0.0
    for c, w in g.waiting.items():
        if w <= 0:
            continue
        tc = t.get(c)
        if tc is None:
            if fallback is None:
                return None
            tc = fallback
        r += w * tc
    return r


# -- policies -----------------------------------------------------------------------------------------

class Policy:
    name = ""

    def decide(self, history: Sequence[Interval]) -> dict[str, int]:
        """New sizes of the groups (all of them, changed or not), from the intervals so far."""
        raise NotImplementedError


@dataclass(frozen=True)
class StaticPolicy(Policy):
    """Fixed sizes for the groups named; others keep theirs."""

    sizes: Mapping[str, int] | None = None
    name = "static"

    def decide(self, history: Sequence[Interval]) -> dict[str, int]:
        if not history:
            return {}
        last = history[-1]
        out = {gid: g.target for gid, g in last.groups.items()}
        for gid, n in (self.sizes or {}).items():
            if gid in out:
                g = last.groups[gid]
                out[gid] = max(g.min_size, min(g.max_size, int(n)))
        return out


@dataclass(frozen=True)
class ThesisPolicy(Policy):
    """Thesis §3.3.2, Algorithm 1: NNLS runtimes, pending work, proportional shares."""

    window: int = 6
    rhs: str = "interval"           # "interval": S_i * I (eq. 3.4 as written); "busy": measured busy time
    name = "thesis"

    def __post_init__(self) -> None:
        if self.rhs not in ("interval", "busy"):
            raise ValueError(f"rhs must be 'interval' or 'busy', got {self.rhs!r}")
        if self.window < 1:
            raise ValueError(f"window must be >= 1, got {self.window}")

    def decide(self, history: Sequence[Interval]) -> dict[str, int]:
        if not history:
            return {}
        hist = list(history)[-self.window:]
        last = hist[-1]
        elastic, devices = _elastic(last)
        out = {gid: g.target for gid, g in last.groups.items()}
        weights: dict[str, float] = {}
        keep: dict[str, int] = {}
        for g in elastic:
            t = estimate_task_times(_rows(hist, g.group_id, self.rhs))
            r = _pending_work(g, t)
            if r is None:           # work waiting but no runtime known yet: leave the group as it is
                keep[g.group_id] = g.target
            else:
                weights[g.group_id] = r
        rest = devices - sum(keep.values())
        names = list(weights)
        if names:
            lo = {n: last.groups[n].min_size for n in names}
            hi = {n: last.groups[n].max_size for n in names}
            if sum(lo.values()) > rest:     # cannot honour everyone's minimum: leave sizes alone
                return out
            out.update(apportion(weights, rest, lo, hi))
        out.update(keep)
        return out


@dataclass(frozen=True)
class Demand:
    """What the improved policy knows about one group."""

    need: float         # devices to keep up with the current load and clear the backlog within the horizon
    keep: float         # devices the group should keep: its recent peak load with headroom
    load: float         # device-seconds arriving per second in the last interval
    backlog_s: float    # device-seconds waiting now
    recent: float = 0.0  # mean load of the last `memory` intervals

    @property
    def claim(self) -> float:
        """Devices' worth a donor defends: its need, or its recent mean load (hysteresis)."""
        return max(self.need, self.recent)


@dataclass(frozen=True)
class ImprovedPolicy(Policy):
    """Load- and cost-aware sizing with hysteresis (see the module docstring)."""

    window: int = 6
    memory: int = 3                 # intervals a group keeps what its recent peak load needs
    target_utilisation: float = 0.8
    drain_horizon_s: float = 5.0    # backlog should clear within this long
    reconfig_s: float = 3.78        # what moving a device costs (it computes nothing meanwhile)
    margin: float = 0.25            # in contention, the donor must end up this much less loaded
    name = "improved"

    def __post_init__(self) -> None:
        if not 0 < self.target_utilisation <= 1:
            raise ValueError(f"target_utilisation must be in (0, 1], got {self.target_utilisation}")
        if self.drain_horizon_s <= 0 or self.reconfig_s < 0 or self.margin < 0:
            raise ValueError("drain_horizon_s must be > 0, reconfig_s and margin >= 0")
        if self.window < 1 or self.memory < 1:
            raise ValueError("window and memory must be >= 1")

    def demands(self, history: Sequence[Interval]) -> dict[str, Demand | None]:
        """Each elastic group's demand (None while its task runtimes are unknown)."""
        hist = list(history)[-self.window:]
        last = hist[-1]
        elastic, _ = _elastic(last)
        out: dict[str, Demand | None] = {}
        for g in elastic:
            gid = g.group_id
            t = estimate_task_times(_rows(hist, gid, "busy"))
            backlog = _pending_work(g, t)
            if backlog is None:
                out[gid] = None
                continue
            # offered load per interval: work done plus growth of the backlog
            loads = []
            prev: float | None = None
            for iv in hist:
                w = iv.groups.get(gid)
                if w is None:
                    prev = None
                    continue
                b_end = _pending_work(w, t) or 0.0
                arrived = w.busy_s + (b_end - prev if prev is not None else 0.0)
                loads.append(max(0.0, arrived) / iv.length if iv.length > 0 else 0.0)
                prev = b_end
            load = loads[-1] if loads else 0.0
            recent = loads[-self.memory:] or [0.0]
            out[gid] = Demand(load + backlog / self.drain_horizon_s, max(recent) / self.target_utilisation, load,
                              backlog, sum(recent) / len(recent))
        return out

    def decide(self, history: Sequence[Interval]) -> dict[str, int]:
        if not history:
            return {}
        last = history[-1]
        elastic, devices = _elastic(last)
        out = {gid: g.target for gid, g in last.groups.items()}
        dem = {gid: d for gid, d in self.demands(history).items() if d is not None}
        lo = {g.group_id: g.min_size for g in elastic}
        hi = {g.group_id: g.max_size for g in elastic}
        size = {g.group_id: max(lo[g.group_id], min(hi[g.group_id], g.target)) for g in elastic}
        free = devices - sum(size.values())
        # A device moved now serves at least until the next decision, one period away: a move pays
        # when the recipient's shortfall over that period exceeds the reconfiguration time.
        period = last.length if last.length > 0 else 10.0
        worth = self.reconfig_s / period

        def pressure(gid: str, n: int) -> float:
            need = dem[gid].need
            return need / n if n > 0 else (math.inf if need > 0 else 0.0)

        for _ in range(4 * max(1, devices)):
            short = [g for g in dem if size[g] < hi[g] and dem[g].need - size[g] > worth]
            if not short:
                break
            r = max(short, key=lambda g: (pressure(g, size[g]), g))
            if free > 0:
                size[r] += 1
                free -= 1
                continue
            # a donor that stays comfortable loses nothing ...
            spare = [d for d in dem if d != r and size[d] > lo[d]
                     and size[d] - 1 >= max(dem[d].keep, dem[d].need)]
            if spare:
                d = max(spare, key=lambda g: (size[g] - max(dem[g].keep, dem[g].need), g))
            else:
                # ... otherwise, in contention, only a clearly less loaded one gives a device up
                cands = [(dem[d].claim / (size[d] - 1), d) for d in dem if d != r and size[d] > lo[d]]
                cands = [(p, d) for p, d in cands if p * (1 + self.margin) < pressure(r, size[r])]
                if not cands:
                    break
                d = min(cands)[1]
            size[d] -= 1
            size[r] += 1
        out.update(size)
        return out


POLICIES: dict[str, type[Policy]] = {"static": StaticPolicy, "thesis": ThesisPolicy, "improved": ImprovedPolicy}


def make_policy(name: str, **params: Any) -> Policy:
    cls = POLICIES.get(name)
    if cls is None:
        raise ValueError(f"unknown autoscaling policy {name!r}; known: {', '.join(sorted(POLICIES))}")
    try:
        return cls(**params)
    except TypeError as e:
        raise ValueError(f"policy {name!r}: {e}") from None


class Autoscaler:
    """Keeps the recent intervals and asks the policy for sizes; call `step` every period."""

    def __init__(self, policy: str | Policy = "thesis", *, history: int = 12, **params: Any) -> None:
        """`policy`: a name from POLICIES (with its `params`) or a Policy; `history`: intervals kept."""
        self.policy = make_policy(policy, **params) if isinstance(policy, str) else policy
        if history < 1:
            raise ValueError(f"history must be >= 1, got {history}")
        self.history: deque[Interval] = deque(maxlen=history)
        self._last: ServerMeasurements | None = None

    def step(self, measurements: ServerMeasurements) -> dict[str, int]:
        """Record a snapshot; return `{group_id: new_size}` for the groups to resize (maybe empty)."""
        if self._last is None:
            self._last = measurements
            return {}
        iv = interval_between(self._last, measurements)
        self._last = measurements
        self.history.append(iv)
        decision = self.policy.decide(tuple(self.history))
        return {gid: n for gid, n in decision.items() if gid in iv.groups and n != iv.groups[gid].target}
