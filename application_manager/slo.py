"""Service-level objectives (thesis §4.2.2): what the user expects of one execution.

    {"Manifest": "RTM",                              # the application's Name
     "Parameters": {"%arg1": "rtm_parameters_medium"},   # input parameters (default: each Default)
     "Objective": {"Constraints": ["%cost <= 0.30"], "Optimize": "%execution_time"}}

Constraints bound `%cost` (in the CRS's currency) or `%execution_time` (seconds) by a
number; they are parsed by application_manager.expr (never evaluated by Python).
`Optimize` is `%execution_time` (fastest within the budget) or `%cost` (cheapest that
meets the time bound).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from application_manager import expr
from application_manager.manifest import Manifest, _get, misspelt_keys
from services import json_text
from services.errors import Violations

METRICS = ("%cost", "%execution_time")


@dataclass(frozen=True)
class Bound:
    metric: str  # "%cost" | "%execution_time"
    op: str  # "<=" or "<"
    value: float

    def holds(self, time_s: float, cost: float) -> bool:
        x = cost if self.metric == "%cost" else time_s
        return x <= self.value if self.op == "<=" else x < self.value


@dataclass(frozen=True)
class Slo:
    manifest: str
    parameters: dict[str, Any]
    bounds: tuple[Bound, ...]
    optimize: str  # "%cost" | "%execution_time"
    raw: dict = field(compare=False, default_factory=dict)

    @property
    def time_bound(self) -> float | None:
        vals = [b.value for b in self.bounds if b.metric == "%execution_time"]
        return min(vals) if vals else None

    @property
    def cost_bound(self) -> float | None:
        vals = [b.value for b in self.bounds if b.metric == "%cost"]
        return min(vals) if vals else None

    def holds(self, time_s: float, cost: float) -> bool:
        return all(b.holds(time_s, cost) for b in self.bounds)

    def describe(self) -> str:
        parts = [f"{b.metric} {b.op} {b.value:g}" for b in self.bounds]
        return (", ".join(parts) or "no bound") + f"; optimise {self.optimize}"


def _bound(text: Any, path: str, v: Violations) -> Bound | None:
    try:
        node = expr.parse(text)
    except expr.ExprError as e:
        v.add(path, f"not a valid constraint: {e}")
        return None
    flip = {"<": ">", "<=": ">=", ">": "<", ">=": "<="}
    if isinstance(node, expr.Binary) and node.op in flip:
        left, right, op = node.left, node.right, node.op
        if isinstance(right, expr.Var) and not isinstance(left, expr.Var):
            left, right, op = right, left, flip[op]
        if isinstance(left, expr.Var) and not expr.variables(right):
            if left.name not in METRICS:
                v.add(path, f"unknown metric {left.name}; an SLO bounds {' or '.join(METRICS)}")
                return None
            if op not in ("<", "<="):
                v.add(path, f"{left.name} takes an upper bound (<= or <)")
                return None
            value = expr.evaluate(right, {})
            if not (value > 0 and math.isfinite(value)):
                v.add(path, f"the bound must be a finite number > 0, got {value:g}")
                return None
            return Bound(left.name, op, value)
    v.add(path, "expected \"%cost <= NUMBER\" or \"%execution_time <= SECONDS\"")
    return None


def parse_slo(data: Any, manifest: Manifest | None = None, field_prefix: str = "slo") -> Slo:
    """Parse JSON text or an object; raises InvalidArgument naming each bad field."""
    v = Violations()
    if isinstance(data, str | bytes):
        data = json_text.loads(data, field_prefix) if data else {}
    else:
        json_text.require_storable(data, field_prefix)
    if not isinstance(data, dict):
        v.add(field_prefix, "expected a JSON object with Manifest, Parameters and Objective")
        v.raise_if_any()
    misspelt_keys(data, ("Manifest", "Parameters", "ExecutionArgs", "Objective"), field_prefix, v)
    name = _get(data, "Manifest") or (manifest.name if manifest else "")
    if manifest is not None and name != manifest.name:
        v.add(f"{field_prefix}.Manifest", f"refers to {name!r}, but the manifest is {manifest.name!r}")
    params_raw = _get(data, "Parameters") or _get(data, "ExecutionArgs") or {}
    params: dict[str, Any] = {}
    if not isinstance(params_raw, dict):
        v.add(f"{field_prefix}.Parameters", "expected an object of \"%var\" -> value")
        params_raw = {}
    if manifest is not None:
        for p in manifest.parameters:
            if not p.tunable:
                params[p.var] = p.default
        for key, val in params_raw.items():
            p = manifest.parameter(key)
            if p is None:
                known = ", ".join(q.var for q in manifest.parameters) or "none"
                v.add(f"{field_prefix}.Parameters.{key}", f"not a parameter of {manifest.name}; known: {known}")
            elif p.tunable:
                v.add(f"{field_prefix}.Parameters.{key}", f"{p.var} is Tunable: the manager chooses it; "
                                                          "remove it here, or drop Tunable in the manifest")
            elif val not in p.values:
                v.add(f"{field_prefix}.Parameters.{key}", f"expected one of {list(p.values)}, got {val!r}")
            else:
                params[p.var] = val
    else:
        params = dict(params_raw)
    objective = _get(data, "Objective") or {}
    if not isinstance(objective, dict):
        v.add(f"{field_prefix}.Objective", "expected an object with Constraints and Optimize")
        objective = {}
    misspelt_keys(objective, ("Constraints", "Optimize"), f"{field_prefix}.Objective", v)
    cons = _get(objective, "Constraints") or []
    if not isinstance(cons, list):
        v.add(f"{field_prefix}.Objective.Constraints", "expected a list such as [\"%cost <= 0.30\"]")
        cons = []
    bounds = [b for i, c in enumerate(cons) if (b := _bound(c, f"{field_prefix}.Objective.Constraints[{i}]", v))]
    optimize = _get(objective, "Optimize")
    if optimize is None:
        has_time = any(b.metric == "%execution_time" for b in bounds)
        optimize = "%cost" if has_time else "%execution_time"
    if optimize not in METRICS:
        v.add(f"{field_prefix}.Objective.Optimize", f"expected {' or '.join(METRICS)}, got {optimize!r}")
    v.raise_if_any()
    return Slo(str(name), params, tuple(bounds), str(optimize), raw=data)
