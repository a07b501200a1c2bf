"""Job model for the QoS policies (seed 000 §II-B; seed 001 Table I).

A `QosJob` is what an application registers: the design its actions need, a
goal (a deadline, which needs the job size in actions, or a throughput in
actions/s), optional min/max numbers of devices, and a priority. Policies
never read a clock: the time and the progress they need come in as
arguments (`JobProgress`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

DEADLINE = "deadline"
THROUGHPUT = "throughput"


@dataclass(frozen=True)
class QosJob:
    job_id: str
    design: str = "sleep"
    goal: str = DEADLINE             # DEADLINE | THROUGHPUT
    deadline: float | None = None    # absolute time on the manager's clock (DEADLINE)
    size: int | None = None          # total actions (required with DEADLINE)
    throughput: float | None = None  # actions/s (THROUGHPUT)
    min_devices: int = 0
    max_devices: int | None = None
    priority: float = 1.0
    submitted_at: float = 0.0

    def __post_init__(self) -> None:
        if self.goal == DEADLINE:
            if self.deadline is None or not math.isfinite(self.deadline):
                raise ValueError(f"job {self.job_id}: a deadline goal needs a finite deadline")
            if self.size is None or self.size < 1:
                raise ValueError(f"job {self.job_id}: a deadline goal needs the job size in actions (>= 1)")
        elif self.goal == THROUGHPUT:
            if self.throughput is None or not self.throughput > 0 or not math.isfinite(self.throughput):
                raise ValueError(f"job {self.job_id}: a throughput goal must be > 0 actions/s")
        else:
            raise ValueError(f"job {self.job_id}: goal must be {DEADLINE!r} or {THROUGHPUT!r}, got {self.goal!r}")
        if self.min_devices < 0:
            raise ValueError(f"job {self.job_id}: min_devices must be >= 0")
        if self.max_devices is not None and self.max_devices < max(1, self.min_devices):
            raise ValueError(f"job {self.job_id}: max_devices must be >= max(1, min_devices)")

    def cap(self, n: int) -> int:
        """`n` limited to the job's max (no limit when max is None)."""
        return n if self.max_devices is None else min(n, self.max_devices)


@dataclass(frozen=True)
class JobProgress:
    """What the manager observed of a job at one control step."""

    time: float
    actions: int            # completed actions so far (observed by the data plane or reported)
    allocation: int         # devices the job holds at the end of the period (what "keep what it holds" keeps)
    held: float | None = None   # mean devices over the period (eq. 2's allocation); None: `allocation` throughout

    @property
    def period_devices(self) -> float:
        return self.allocation if self.held is None else self.held
