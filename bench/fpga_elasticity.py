"""`harness bench fpga-elasticity`: thesis Fig. 3.5 on the virtual clock.

One client sends 1 ms tasks (design `sleep`) as a Poisson stream of 1500,
3000 or 6000 tasks/s for 300 s to an FPGA group of 1..8 devices of the
emulated FPGA-server (`irm_fpga.engine`, the code the live server runs);
every task is followed to its result, so an undersized group's backlog shows
in full. Per cell: mean and standard deviation of the task latency (arrival to
result, 1 ms of device time included) and of the queueing time (arrival to
start), the 99th percentile, and the share of tasks done before the stream
stopped. `--quick` runs 30 s streams (under 60 s on two cores).

The thesis reports, for 1500 tasks/s, very high and variable latencies on one
device, about 0.64 ms on two and 0.23 ms on eight; with Poisson arrivals the
queueing time here is 0.65 ms on two devices (M/D/2 at 75 % load).
"""

from __future__ import annotations

import argparse
import time

from bench._common import emit
from irm_fpga.sim import elasticity_cell


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="harness bench fpga-elasticity")
    p.add_argument("--quick", action="store_true", help="30 s streams instead of 300 s")
    p.add_argument("--json", action="store_true", help="print JSON (the only output format)")
    p.add_argument("--duration", type=float, help="seconds of virtual time per stream")
    p.add_argument("--rates", default="1500,3000,6000", help="tasks per second, comma-separated")
    p.add_argument("--sizes", default="1,2,3,4,5,6,7,8", help="group sizes, comma-separated")
    p.add_argument("--seed", type=int, default=1)
    args = p.parse_args([a for a in argv if a != "--"])
    duration = args.duration or (30.0 if args.quick else 300.0)
    rates = [float(x) for x in args.rates.split(",") if x]
    sizes = [int(x) for x in args.sizes.split(",") if x]
    wall = time.perf_counter()
    cells = []
    table: dict[str, dict[str, list[float]]] = {}
    for rate in rates:
        for size in sizes:
            c = elasticity_cell(rate, size, duration=duration, seed=args.seed)
            cells.append({
                "rate": int(rate), "size": size, "tasks": c.tasks,
                "latency_mean_ms": round(c.latency_mean_ms, 4), "latency_std_ms": round(c.latency_std_ms, 4),
                "queue_mean_ms": round(c.queue_mean_ms, 4), "queue_std_ms": round(c.queue_std_ms, 4),
                "latency_p99_ms": round(c.latency_p99_ms, 3),
                "completed_in_window": round(c.completed_in_window, 4),
                "sim_seconds": round(c.seconds, 2),
            })
            table.setdefault(str(int(rate)), {})[str(size)] = [round(c.latency_mean_ms, 3), round(c.latency_std_ms, 3)]
    total_tasks = sum(c["tasks"] for c in cells)
    elapsed = time.perf_counter() - wall
    emit({
        "benchmark": "fpga-elasticity",
        "clock": "virtual",
        "duration_s": duration,
        "task_ms": 1.0,
        "arrivals": "poisson",
        "latency_ms_mean_std": table,
        "cells": cells,
        "tasks": total_tasks,
        "wall_s": round(elapsed, 2),
        "tasks_per_wall_s": round(total_tasks / elapsed, 1),
    })
    return 0


if __name__ == "__main__":
    import sys

    raise SystemExit(main(sys.argv[1:]))
