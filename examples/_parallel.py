"""Shared by the examples: run chunks of numpy work on as many threads as the VM has CPUs.

numpy releases the GIL inside its array operations, so threads give real parallelism; the
execution agent pins the process to the VM's cores, so `os.sched_getaffinity` is the VM.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor


def cpus() -> int:
    return max(1, len(os.sched_getaffinity(0)))


def parallel(fn: Callable[[int, int], object], n: int) -> list:
    """fn(start, stop) over `cpus()` contiguous slices of range(n)."""
    k = min(cpus(), max(1, n))
    bounds = [(i * n // k, (i + 1) * n // k) for i in range(k)]
    if k == 1:
        return [fn(*bounds[0])]
    with ThreadPoolExecutor(k) as pool:
        return list(pool.map(lambda b: fn(*b), bounds))
