"""Policies by name. Unknown names raise `KeyError` listing the known ones.

Scheduling algorithms may also come from outside (`irm_fpga.qos.plugins`:
`package.module:function`, or an entry point of `harness.qos_algorithms`).

Two families with different shapes:

* allocation policies (seed 000): resize each running job's group;
  `edf` -> `edf_allocate(jobs, devices)`, `throughput` -> `throughput_decide(...)`;
* Hydrogen scheduling algorithms (seed 001): dispatch from a ready queue,
  `alg(queue, available, window, cost, now=...)`; the two managed modes take
  keywords for the projection (now, running_ends, pool, ...):
  `managed` (alias `managed_paper`) is seed 001 Algorithm 1 as written,
  `managed_deadline` the deadline-aware mode (`irm_fpga.qos.hydrogen`), with
  its candidates `slack_min` and `slack_amap` also selectable alone, and
  `managed_lookahead` that mode deciding by a one-step lookahead over futures
  sampled from the recent arrivals (`history=`; `irm_fpga.qos.lookahead`).
"""

from __future__ import annotations

from collections.abc import Callable

from irm_fpga.qos.edf import edf_allocate
from irm_fpga.qos.hydrogen import ALGORITHMS, managed, managed_deadline, slack_amap, slack_min
from irm_fpga.qos.lookahead import managed_lookahead
from irm_fpga.qos.plugins import is_external, single_algorithm
from irm_fpga.qos.throughput import throughput_decide

ALLOCATION_POLICIES: dict[str, Callable] = {"edf": edf_allocate, "throughput": throughput_decide}
SCHEDULING_ALGORITHMS: dict[str, Callable] = {
    **ALGORITHMS, "slack_min": slack_min, "slack_amap": slack_amap,
    "managed": managed, "managed_paper": managed, "managed_deadline": managed_deadline,
    "managed_lookahead": managed_lookahead,
}


# Names of one policy: what one sized (the elastic pool) is kept when restarted under the other.
ALIASES = {"managed_paper": "managed"}


def canonical(name: str) -> str:
    return ALIASES.get(name, name)


def is_scheduling(name: str) -> bool:
    """Whether `name` names a scheduling algorithm: built in, or a plug-in's name (not loaded here)."""
    return name in SCHEDULING_ALGORITHMS or is_external(name)


def get_policy(name: str) -> Callable:
    if name in ALLOCATION_POLICIES:
        return ALLOCATION_POLICIES[name]
    if name in SCHEDULING_ALGORITHMS:
        return SCHEDULING_ALGORITHMS[name]
    if is_external(name):
        return single_algorithm(name)     # PolicyError (a KeyError if nothing has that name) saying what is wrong
    known = ", ".join(sorted({**ALLOCATION_POLICIES, **SCHEDULING_ALGORITHMS}))
    raise KeyError(f"unknown policy {name!r}; known: {known}")
