"""Helpers shared by benchmarks: percentiles, a JSON printer, a private suite."""

from __future__ import annotations

import json
import sys
from typing import Any


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    k = (len(s) - 1) * q
    lo = int(k)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def emit(result: dict[str, Any]) -> None:
    json.dump(result, sys.stdout, indent=2, sort_keys=False)
    sys.stdout.write("\n")
    sys.stdout.flush()
