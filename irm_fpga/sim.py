"""Discrete-event reproductions of thesis chapter 3 on the real engine and policies.

Both experiments drive `irm_fpga.engine.Engine` (the emulated FPGA-server the
live service wraps) and, for autoscaling, `irm_fpga.autoscaler.Autoscaler`
(the same policy objects the Orchestrator runs), on virtual time: the clock is
`SimClock`, moved by this module only, so 300 s of FPGA time take as long as
their computation.

Elasticity (thesis §3.4.2, Fig. 3.5): `elasticity_cell(rate, size)`: one
client sends 1 ms tasks as a Poisson stream of `rate` tasks/s for `duration`
seconds to a group of `size` devices; every task is followed to its end
(overloaded groups keep working after the stream stops). Latency is from
arrival to result; queueing is arrival to start.

Autoscaling (thesis §3.4.3, Figs. 3.6 and 3.7): `autoscaling_run(trace, policy)`:
one 8-device server, three groups A, B, C starting at 2/4/2 devices, the
autoscaler called every 10 s, reconfiguration N(3.78 s, 0.13 s). Like the
thesis, the applications are sleep functions, but each has its own design
(`sleep_A`, ...), as distinct bitstreams would: moving a device between
groups costs a reconfiguration. Application A sends batches of 300 tasks of
0.33 ms, B batches of 300 x 1 ms, C batches of 3 x 100 ms. Batch latency is
from a batch's arrival to the end of its last task. The run lasts until the
last batch is done (at least the trace's 300 s); utilisation is the device
time spent on tasks over 8 devices x that span, so work a static split
leaves queued at the end of the trace lengthens its run and lowers it.

Traces (`make_trace(kind, seed)`): each application's offered load, in
devices' worth of work (device-seconds per second), is piecewise constant;
batches arrive as a Poisson process at load / (work per batch). Skeletons
before the seeded jitter (every level x U(0.85, 1.15), inner phase boundaries
+/- 4 s), after which each application is rescaled to its total:

    high    0-150 s   150-190 s   190-240 s   240-245 s   245-300 s
    A       0.1       2.6         0.1         0.1         4.8
    B       2.84      5.6         2.84        0           0
    C       1.0 and 1.6, alternating every 30 s

    low     A: 0.5 (0-60 s), 1.5 (60-120), 0.4 (120-200), 1.2 (200-260), 0.4
            B: 1.6 (0-100 s), 0.6 (100-160), 1.4 (160-300)
            C: 0.5 and 0.8, alternating every 30 s

Totals are in the ratio 1 : 2 : 1 (the ratio the static 2/4/2 split is
proportional to, thesis §3.4.3): high A 384, B 768, C 384 device-seconds
(64 % of 8 x 300), low exactly half (32 %). In the high trace A peaks at
4.8 devices, far beyond its static share of 2, while B is idle (from 240 s
to the end, so a static A carries its backlog past the trace), and between
150 s and 190 s A and B together ask for 8.2 devices, more than the server.
In the low trace every application stays within its static share: nothing
needs resizing.
"""

from __future__ import annotations

import gc
import random
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np

from irm_fpga.autoscaler import Autoscaler
from irm_fpga.designs import DESIGNS, Sleep
from irm_fpga.engine import RUN, Engine, EngineConfig, Task


class SimClock:
    """Virtual time moved only by the simulation (a `services.clock.Clock`)."""

    def __init__(self, start: float = 0.0) -> None:
        self.t = start

    def now(self) -> float:
        return self.t

    def advance_to(self, t: float) -> None:
        if t < self.t:
            raise ValueError("time does not run backwards")
        self.t = t

    def sleep(self, seconds: float) -> None:
        self.advance_to(self.t + max(0.0, seconds))


@contextmanager
def _quiet_gc() -> Iterator[None]:
    """Millions of short-lived tuples: collect rarely (no reference cycles are made)."""
    old = gc.get_threshold()
    gc.collect()
    gc.set_threshold(200_000, 50, 1000)
    try:
        yield
    finally:
        gc.set_threshold(*old)


# -- elasticity (Fig. 3.5) -------------------------------------------------------------------------

@dataclass(frozen=True)
class CellResult:
    rate: float
    size: int
    tasks: int
    latency_mean_ms: float
    latency_std_ms: float
    queue_mean_ms: float
    queue_std_ms: float
    latency_p99_ms: float
    completed_in_window: float      # fraction finished before the stream stopped
    seconds: float                  # wall time the cell took


def elasticity_cell(rate: float, size: int, *, duration: float = 300.0, task_s: float = 0.001,
                    seed: int = 1, devices: int = 8) -> CellResult:
    wall = time.perf_counter()
    clock = SimClock()
    engine = Engine(clock, EngineConfig(devices=devices, seed=seed))
    engine.create_group("g", "sleep", size, max_size=devices)
    warm = 10.0
    clock.advance_to(warm)
    engine.advance()
    engine.attach_client("g", "c")
    rng = np.random.default_rng(seed)
    params = {"duration": float(task_s)}
    lat: list[np.ndarray] = []
    que: list[np.ndarray] = []
    fin_in_window = 0
    n = 0
    t = warm
    end = warm + duration
    chunk = 1.0
    with _quiet_gc():
        while t < end:
            hi = min(t + chunk, end)
            k = rng.poisson(rate * (hi - t))
            times = np.sort(rng.uniform(t, hi, size=k)).tolist()
            engine.schedule("c", [(n + i, params, RUN) for i in range(k)], times)
            n += k
            clock.advance_to(hi)
            res = engine.advance()
            fin_in_window += len(res)
            _collect(res, lat, que)
            t = hi
        while True:
            nxt = engine.next_event_time()
            if nxt is None:
                break
            clock.advance_to(max(clock.t, nxt) + 10.0)
            _collect(engine.advance(), lat, que)
    la = np.concatenate(lat) if lat else np.zeros(0)
    qa = np.concatenate(que) if que else np.zeros(0)
    assert la.size == n, (la.size, n)
    return CellResult(rate, size, n, float(la.mean() * 1e3), float(la.std() * 1e3), float(qa.mean() * 1e3),
                      float(qa.std() * 1e3), float(np.percentile(la, 99) * 1e3), fin_in_window / max(n, 1),
                      time.perf_counter() - wall)


def _collect(res: list, lat: list[np.ndarray], que: list[np.ndarray]) -> None:
    if not res:
        return
    sub = np.fromiter((r[6] for r in res), float, len(res))
    start = np.fromiter((r[7] for r in res), float, len(res))
    fin = np.fromiter((r[8] for r in res), float, len(res))
    lat.append(fin - sub)
    que.append(start - sub)


# -- traces (§3.4.3) ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class App:
    name: str
    task_s: float
    batch: int

    @property
    def batch_work(self) -> float:
        return self.task_s * self.batch


APPS = (App("A", 0.00033, 300), App("B", 0.001, 300), App("C", 0.1, 3))
STATIC_SIZES = {"A": 2, "B": 4, "C": 2}
TOTALS_HIGH = {"A": 384.0, "B": 768.0, "C": 384.0}       # device-seconds over 300 s


@dataclass(frozen=True)
class Trace:
    kind: str
    seed: int
    duration: float
    segments: dict[str, list[tuple[float, float, float]]]     # app -> [(start, end, load in devices)]
    arrivals: dict[str, np.ndarray]                           # app -> batch arrival times

    def offered_load(self) -> dict[str, float]:
        """Device-seconds each application offers over the trace."""
        return {a: sum((e - s) * lv for s, e, lv in segs) for a, segs in self.segments.items()}


def _skeleton(kind: str) -> dict[str, list[tuple[float, float, float]]]:
    """Offered load per application, (start, end, devices' worth), before jitter and rescaling."""
    if kind == "high":
        c = [(float(s), float(s + 30), 1.0 if (s // 30) % 2 == 0 else 1.6) for s in range(0, 300, 30)]
        return {
            "A": [(0, 150, 0.1), (150, 190, 2.6), (190, 245, 0.1), (245, 300, 4.8)],
            "B": [(0, 150, 2.84), (150, 190, 5.6), (190, 240, 2.84), (240, 300, 0.0)],
            "C": c,
        }
    c = [(float(s), float(s + 30), 0.5 if (s // 30) % 2 == 0 else 0.8) for s in range(0, 300, 30)]
    return {
        "A": [(0, 60, 0.5), (60, 120, 1.5), (120, 200, 0.4), (200, 260, 1.2), (260, 300, 0.4)],
        "B": [(0, 100, 1.6), (100, 160, 0.6), (160, 300, 1.4)],
        "C": c,
    }


def make_trace(kind: str, seed: int = 7, *, apps: Sequence[App] = APPS, duration: float = 300.0) -> Trace:
    """The low or high trace (see the module docstring), drawn from `seed`."""
    if kind not in ("low", "high"):
        raise ValueError(f"trace kind must be 'low' or 'high', got {kind!r}")
    rng = random.Random(seed)
    scale = duration / 300.0
    segments: dict[str, list[tuple[float, float, float]]] = {}
    for app, segs in _skeleton(kind).items():
        cuts = [segs[0][0]] + [e for _, e, _ in segs]
        # jitter the inner boundaries (same for both traces: drawn before the kind matters)
        for i in range(1, len(cuts) - 1):
            cuts[i] = min(max(cuts[i] + rng.uniform(-4, 4), cuts[i - 1] + 1), cuts[i + 1] - 1)
        levels = [lv * rng.uniform(0.85, 1.15) for _, _, lv in segs]
        total = sum((cuts[i + 1] - cuts[i]) * levels[i] for i in range(len(levels)))
        k = TOTALS_HIGH[app] / total * (0.5 if kind == "low" else 1.0)     # low: half the work
        segments[app] = [(cuts[i] * scale, cuts[i + 1] * scale, levels[i] * k) for i in range(len(levels))]
    arr_rng = np.random.default_rng(seed * 1000 + (1 if kind == "low" else 2))
    arrivals = {}
    by_name = {a.name: a for a in apps}
    for app, segs in segments.items():
        times = []
        for s, e, lv in segs:
            lam = lv / by_name[app].batch_work
            k = arr_rng.poisson(lam * (e - s))
            times.append(np.sort(arr_rng.uniform(s, e, size=k)))
        arrivals[app] = np.concatenate(times)
    return Trace(kind, seed, duration, segments, arrivals)


# -- autoscaling run (§3.4.3) -------------------------------------------------------------------------

@dataclass(frozen=True)
class AutoscaleResult:
    trace: str
    policy: str
    utilisation: float
    mean_batch_latency_s: float
    reconfigurations: int
    batches: int
    per_app_latency_s: dict[str, float]
    max_batch_latency_s: float
    span_s: float                   # from the trace's start to the end of the last batch
    size_timeline: list[tuple[float, dict[str, int]]]
    seconds: float


def autoscaling_run(trace: Trace, policy: str, *, apps: Sequence[App] = APPS, task_scale: int = 1,
                    period: float = 10.0, reconfig_mean_s: float = 3.78, reconfig_std_s: float = 0.13,
                    seed: int = 1, devices: int = 8) -> AutoscaleResult:
    """Run one trace under one policy. `task_scale` > 1 merges that many tasks into one (quick runs)."""
    wall = time.perf_counter()
    clock = SimClock()
    designs = {**DESIGNS, **{f"sleep_{a.name}": Sleep(f"sleep_{a.name}") for a in apps}}
    engine = Engine(clock, EngineConfig(devices=devices, reconfig_mean_s=reconfig_mean_s,
                                        reconfig_std_s=reconfig_std_s, seed=seed), designs)
    for name, n in STATIC_SIZES.items():
        engine.create_group(name, f"sleep_{name}", n, min_size=1, max_size=devices)
    params = {"static": {"sizes": dict(STATIC_SIZES)}, "improved": {"reconfig_s": reconfig_mean_s}}
    scaler = Autoscaler(policy, **params.get(policy, {}))
    warm = 10.0                      # initial configuration of the 8 devices
    clock.advance_to(warm)
    engine.advance()
    initial_reconfigs = engine.measurements().reconfigurations
    for a in apps:
        engine.attach_client(a.name, a.name)
    shaped = []
    for a in apps:
        per = max(1, a.batch // task_scale) if task_scale > 1 else a.batch
        shaped.append((a, per, {"duration": a.task_s * a.batch / per}))
    # task ids: batch number << 9 | index in the batch (batches are at most 300 tasks)
    batch_app: list[int] = []
    batch_at: list[float] = []
    batch_size: list[int] = []
    order = []
    for i, a in enumerate(apps):
        for x in trace.arrivals[a.name]:
            order.append((float(x), i))
    order.sort()
    cursor = 0
    end = warm + trace.duration
    t = warm
    ids: list[np.ndarray] = []
    starts: list[np.ndarray] = []
    fins: list[np.ndarray] = []
    devt: list[np.ndarray] = []
    timeline = [(0.0, dict(STATIC_SIZES))]
    scaler.step(engine.measurements())
    with _quiet_gc():
        while True:
            hi = t + period
            per_app: dict[int, tuple[list[Task], list[float]]] = {}
            while cursor < len(order) and order[cursor][0] + warm < hi:
                at, i = order[cursor]
                cursor += 1
                a, per, p = shaped[i]
                b = len(batch_at)
                batch_app.append(i)
                batch_at.append(at + warm)
                batch_size.append(per)
                tasks, times = per_app.setdefault(i, ([], []))
                base = b << 9
                tasks.extend(Task(base + k, p) for k in range(per))
                times.extend([at + warm] * per)
            for i, (tasks, times) in per_app.items():
                engine.schedule(apps[i].name, tasks, times)
            clock.advance_to(hi)
            res = engine.advance()
            if res:
                ids.append(np.fromiter((r[0] for r in res), np.int64, len(res)))
                starts.append(np.fromiter((r[7] for r in res), float, len(res)))
                fins.append(np.fromiter((r[8] for r in res), float, len(res)))
                devt.append(np.fromiter((r[9] for r in res), float, len(res)))
            t = hi
            done = cursor >= len(order) and all(g.waiting == 0 and g.running == 0 for g in engine.groups())
            if t >= end and done:
                break
            decision = scaler.step(engine.measurements())
            if decision:
                engine.apply_sizes(decision)
                timeline.append((t - warm, {g.group_id: g.target for g in engine.groups()}))
    reconfigs = engine.measurements().reconfigurations - initial_reconfigs
    idv = np.concatenate(ids)
    st = np.concatenate(starts)
    fi = np.concatenate(fins)
    # the run lasts until its last batch is done (at least the trace's length)
    span = max(trace.duration, float(fi.max()) - warm)
    busy = float((fi - st).sum())
    nb = len(batch_at)
    bfin = np.full(nb, -np.inf)
    np.maximum.at(bfin, idv >> 9, fi)
    count = np.bincount(idv >> 9, minlength=nb)
    assert np.array_equal(count, np.array(batch_size)), "a task was lost or duplicated"
    lat = bfin - np.array(batch_at)
    app_idx = np.array(batch_app)
    per_app_lat = {a.name: float(lat[app_idx == i].mean()) if (app_idx == i).any() else 0.0
                   for i, a in enumerate(apps)}
    return AutoscaleResult(trace.kind, policy, busy / (devices * span), float(lat.mean()),
                           int(reconfigs), nb, per_app_lat, float(lat.max()), span, timeline,
                           time.perf_counter() - wall)


def summary(r: AutoscaleResult) -> dict[str, object]:
    return {"utilisation": round(r.utilisation, 4), "mean_batch_latency_s": round(r.mean_batch_latency_s, 4),
            "reconfigurations": r.reconfigurations, "batches": r.batches,
            "per_app_latency_s": {k: round(v, 4) for k, v in r.per_app_latency_s.items()},
            "max_batch_latency_s": round(r.max_batch_latency_s, 3), "span_s": round(r.span_s, 2),
            "seconds": round(r.seconds, 2)}


def sizes_at(timeline: list[tuple[float, dict[str, int]]], t: float) -> dict[str, int]:
    cur = timeline[0][1]
    for at, sizes in timeline:
        if at <= t:
            cur = sizes
    return cur


