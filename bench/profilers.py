"""`harness bench profilers [--dataset PATH] [--quick] [--table]`: every profiler on every workload, as JSON.

On a dataset in the replay format (application_manager.replay; the IBM multi-cloud CSV is
recognised and converted on the fly), each profiler profiles each workload through the
replay back-end, for many seeds, with budgets of 5, 10, 15 and 20 runs, both cold (no
history) and warm (history = the dataset's other workloads: leave-one-workload-out).
Profilers that use no history give the same figures warm and cold.

Figures, averaged over workloads and seeds:
* p_cost_within_10pct: the cheapest ok configuration of the profiler's model (measured, or
  predicted by extrapolation) truly costs <= 1.1 x the dataset's cheapest ok configuration;
* p_time_within_10pct: the same for the fastest;
* slo_fail_rate: over time bounds at the 25th and 50th percentile of the workload's ok
  runtimes, the share where the model's choice (cheapest frontier point meeting the
  bound) truly violates the bound or fails, or none is offered (one always exists);
* profiling_cost: sum of the cost of the runs made (failed runs included), per profiling.
`summary` names, per mode and budget, the best profiler by p_cost_within_10pct (then lower
slo_fail_rate, then lower profiling_cost) with its figures.
Workloads without any ok run have no cheapest configuration; they are listed as skipped.
The result is printed as JSON (as every `harness bench`); `--table` also writes the summary as a short table
to stderr, so standard output stays one JSON document.
"""

from __future__ import annotations

import argparse
import sys
import time
import zlib
from pathlib import Path

import numpy as np

from application_manager.model import Point, pareto
from application_manager.profilers import PROFILERS
from application_manager.replay import Dataset, ReplayBackend
from application_manager.runner import StopRules, profile
from bench._common import emit, percentile

DEFAULT_DATASET = Path(__file__).resolve().parents[2] / "shared" / "datasets" / "ibm-multi-cloud" / \
    "multi-cloud-configuration.csv"
BUDGETS = (5, 10, 15, 20)
QUANTILES = (0.25, 0.5)


def _session(dataset: Dataset, backend: ReplayBackend, truth, prices, history, name: str, seed: int,
             budget: int, ctx: dict) -> dict:
    cls = PROFILERS[name]
    rng = np.random.default_rng([seed, zlib.crc32(backend.workload.encode()), budget])
    prof = cls(backend.space, rng, prices=prices, history=history, max_runs=budget,
               has_benchmark=backend.has_benchmark)
    obs, _ = profile(prof, backend.execute, StopRules(max_runs=budget))
    points = [Point({"i": o.config}, o.time_s, o.cost, o.ok) for o in obs if o.input == "production"]
    points += [Point({"i": c}, t, k, True, predicted=True) for c, t, k in prof.predictions(obs)]
    ok = [p for p in points if p.ok]
    out = {"cost_hit": 0.0, "time_hit": 0.0, "profiling_cost": float(sum(o.cost for o in obs)), "runs": len(obs)}
    if ok:
        c = truth[min(ok, key=lambda p: p.cost).config["i"]]
        out["cost_hit"] = float(bool(c and c.ok and c.cost <= 1.1 * ctx["best_cost"]))
        t = truth[min(ok, key=lambda p: p.time_s).config["i"]]
        out["time_hit"] = float(bool(t and t.ok and t.time_s <= 1.1 * ctx["best_time"]))
    front = pareto(points)
    fails = 0
    for bound in ctx["bounds"]:
        meets = [p for p in front if p.time_s <= bound]
        if not meets:
            fails += 1
            continue
        r = truth[min(meets, key=lambda p: p.cost).config["i"]]
        fails += int(not (r and r.ok and r.time_s <= bound))
    out["slo_fail"] = fails / len(ctx["bounds"])
    return out


def run(dataset: Dataset, names: list[str], seeds: int, budgets: tuple[int, ...]) -> dict:
    acc: dict = {n: {m: {b: [] for b in budgets} for m in ("cold", "warm")} for n in names}
    skipped = []
    for w in dataset.workloads:
        backend = ReplayBackend(dataset, w)
        truth = dataset.truth(w, backend.space, backend.production)
        ok = [r for r in truth if r and r.ok]
        if not ok:
            skipped.append(w)
            continue
        times = [r.time_s for r in ok]
        ctx = {"best_cost": min(r.cost for r in ok), "best_time": min(times),
               "bounds": [percentile(times, q) for q in QUANTILES]}
        prices = dataset.prices(backend.space)
        warm = dataset.history(backend.space, [x for x in dataset.workloads if x != w])
        for n in names:
            modes = ("cold", "warm") if PROFILERS[n].uses_history else ("cold",)
            for mode in modes:
                for b in budgets:
                    for s in range(seeds):
                        acc[n][mode][b].append(_session(dataset, backend, truth, prices,
                                                        warm if mode == "warm" else None, n, s, b, ctx))
            if not PROFILERS[n].uses_history:
                acc[n]["warm"] = acc[n]["cold"]
    figures: dict = {}
    for n in names:
        figures[n] = {}
        for mode in ("cold", "warm"):
            figures[n][mode] = {}
            for b in budgets:
                rows = acc[n][mode][b]
                figures[n][mode][str(b)] = {
                    "p_cost_within_10pct": round(float(np.mean([r["cost_hit"] for r in rows])), 4),
                    "p_time_within_10pct": round(float(np.mean([r["time_hit"] for r in rows])), 4),
                    "slo_fail_rate": round(float(np.mean([r["slo_fail"] for r in rows])), 4),
                    "profiling_cost": round(float(np.mean([r["profiling_cost"] for r in rows])), 6),
                    "runs": round(float(np.mean([r["runs"] for r in rows])), 2),
                    "sessions": len(rows),
                }
    summary: dict = {}
    for mode in ("cold", "warm"):
        summary[mode] = {}
        for b in budgets:
            best = min(names, key=lambda n: (-figures[n][mode][str(b)]["p_cost_within_10pct"],
                                             figures[n][mode][str(b)]["slo_fail_rate"],
                                             figures[n][mode][str(b)]["profiling_cost"]))
            summary[mode][str(b)] = {"profiler": best, **figures[best][mode][str(b)]}
    return {"figures": figures, "summary": summary, "skipped_workloads": skipped,
            "workloads": len(dataset.workloads) - len(skipped)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="harness bench profilers", description=__doc__.splitlines()[0])
    p.add_argument("--dataset", default=str(DEFAULT_DATASET), help="CSV in the replay format (or the IBM CSV)")
    p.add_argument("--json", action="store_true", help="print JSON (the only output format)")
    p.add_argument("--table", action="store_true", help="also write the summary as a table, to stderr")
    p.add_argument("--quick", action="store_true", help="fewer seeds (under 60 s on the IBM data)")
    p.add_argument("--seeds", type=int, default=0, help="seeds per (profiler, workload, budget); default 10, quick 2")
    p.add_argument("--profilers", default=",".join(PROFILERS), help="comma-separated names")
    args = p.parse_args(argv)
    names = [n.strip() for n in args.profilers.split(",") if n.strip()]
    unknown = [n for n in names if n not in PROFILERS]
    if unknown:
        print(f"unknown profiler(s) {unknown}; known: {', '.join(PROFILERS)}", file=sys.stderr)
        return 2
    try:
        dataset = Dataset.load(args.dataset)
    except (OSError, ValueError) as e:
        print(f"harness bench profilers: {e}", file=sys.stderr)
        return 2
    seeds = args.seeds or (2 if args.quick else 10)
    t0 = time.monotonic()
    result = run(dataset, names, seeds, BUDGETS)
    out = {"benchmark": "profilers", "dataset": args.dataset, "quick": args.quick, "seeds": seeds,
           "budgets": list(BUDGETS), "workloads": result["workloads"],
           "skipped_workloads": result["skipped_workloads"],
           "configurations_per_workload": round(float(np.mean(
               [len(dataset.space(w, dataset.input_sizes(w)[-1])) for w in dataset.workloads])), 1),
           "profilers": result["figures"], "summary": result["summary"],
           "elapsed_s": round(time.monotonic() - t0, 1)}
    emit(out)
    if args.table:
        for mode in ("cold", "warm"):
            for b, s in out["summary"][mode].items():
                print(f"{mode:5} budget {b:>2}: best {s['profiler']:13} p_cost {s['p_cost_within_10pct']:.2f} "
                      f"p_time {s['p_time_within_10pct']:.2f} slo_fail {s['slo_fail_rate']:.3f} "
                      f"profiling_cost {s['profiling_cost']:.4f}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
