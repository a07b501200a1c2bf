"""Policies by name. Unknown names raise `KeyError` listing the known ones.

Two families with different shapes:

* allocation policies (seed 000): resize each running job's group;
  `edf` -> `edf_allocate(jobs, devices)`, `throughput` -> `throughput_decide(...)`;
* Hydrogen scheduling algorithms (seed 001): dispatch from a ready queue,
  `alg(queue, available, window, cost)`; `managed` takes keywords for the
  projection (now, running_ends, pool, strategy).
"""

from __future__ import annotations

from collections.abc import Callable

from irm_fpga.qos.edf import edf_allocate
from irm_fpga.qos.hydrogen import ALGORITHMS, managed
from irm_fpga.qos.throughput import throughput_decide

ALLOCATION_POLICIES: dict[str, Callable] = {"edf": edf_allocate, "throughput": throughput_decide}
SCHEDULING_ALGORITHMS: dict[str, Callable] = {**ALGORITHMS, "managed": managed}


def get_policy(name: str) -> Callable:
    if name in ALLOCATION_POLICIES:
        return ALLOCATION_POLICIES[name]
    if name in SCHEDULING_ALGORITHMS:
        return SCHEDULING_ALGORITHMS[name]
    known = ", ".join(sorted({**ALLOCATION_POLICIES, **SCHEDULING_ALGORITHMS}))
    raise KeyError(f"unknown policy {name!r}; known: {known}")
