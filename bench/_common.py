"""Helpers shared by benchmarks: percentiles, a JSON printer, a private suite."""

from __future__ import annotations

import json
import math
import sys
from typing import Any


def percentile(values: list[float], q: float) -> float:
    """The `q` quantile of `values`, interpolated; NaN for no values (`emit` prints it as null)."""
    if not values:
        return float("nan")
    s = sorted(values)
    k = (len(s) - 1) * q
    lo = int(k)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def finite(value: Any) -> Any:
    """`value` with every NaN or infinite float replaced by None, in dicts, lists and tuples at any depth.

    JSON has no such numbers: json.dump would write `NaN` or `Infinity`, which strict parsers (jq, JavaScript's
    JSON.parse) refuse, so a figure that has no value (a percentile of no samples) is printed as null.
    """
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [finite(v) for v in value]
    return value


def emit(result: dict[str, Any]) -> None:
    # allow_nan=False: a non-finite number that `finite` missed fails the run instead of printing invalid JSON.
    json.dump(finite(result), sys.stdout, indent=2, sort_keys=False, allow_nan=False)
    sys.stdout.write("\n")
    sys.stdout.flush()
