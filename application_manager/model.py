"""The performance model (thesis §4.3.4): points of (time, cost), their Pareto frontier, and
the selection of a configuration under an SLO.

With a time bound: the cheapest frontier configuration that meets it; with a budget: the
fastest within it; with neither, the optimised metric's minimum. When nothing qualifies,
FAILED_PRECONDITION says what the best achievable is.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from application_manager.slo import Slo
from services.errors import NO_MODEL, SLO_UNATTAINABLE, FailedPrecondition


@dataclass(frozen=True)
class Point:
    config: dict[str, Any]
    time_s: float
    cost: float
    ok: bool = True
    predicted: bool = False  # extrapolated, not measured on the production input
    key: str = field(default="", compare=False)


def pareto(points: list[Point]) -> list[Point]:
    """Non-dominated ok points with a finite time and cost, fastest first (so cost falls along the list)."""
    # NaN compares false both ways: in the sort it left the order, and the result, to the input's order.
    ok = sorted((p for p in points if p.ok and math.isfinite(p.time_s) and math.isfinite(p.cost)),
                key=lambda p: (p.time_s, p.cost, p.predicted))
    front: list[Point] = []
    best_cost = float("inf")
    for p in ok:
        if p.cost < best_cost:
            front.append(p)
            best_cost = p.cost
    return front


def select(frontier: list[Point], slo: Slo) -> Point:
    if not frontier:
        raise FailedPrecondition("no performance model yet: profile the application first", reason=NO_MODEL)
    meets = [p for p in frontier if slo.holds(p.time_s, p.cost)]
    if meets:
        if slo.optimize == "%cost":
            return min(meets, key=lambda p: (p.cost, p.time_s))
        return min(meets, key=lambda p: (p.time_s, p.cost))
    fastest = min(frontier, key=lambda p: p.time_s)
    cheapest = min(frontier, key=lambda p: p.cost)
    raise FailedPrecondition(
        f"no profiled configuration meets the SLO ({slo.describe()}): the best achievable are "
        f"{fastest.time_s:.3g} s at cost {fastest.cost:.4g} (fastest) and {cheapest.time_s:.3g} s at cost "
        f"{cheapest.cost:.4g} (cheapest)", reason=SLO_UNATTAINABLE)
