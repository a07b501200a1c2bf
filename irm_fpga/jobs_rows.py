"""A job's row (`irm_fpga.job_models.FpgaJob`) as the FPGA job manager (`irm_fpga.jobs`) reads and writes it.

Its states, the job as the policies of `irm_fpga.qos` see it, and its allocation history ([time, devices]
changes): kept bounded, and averaged over a control period (seed 000 eq. 2).
"""

from __future__ import annotations

from irm_fpga.job_models import FpgaJob
from irm_fpga.qos.jobs import DEADLINE, QosJob

ACTIVE, RETIRED, QUEUED = "active", "retired", "queued"
MAX_ALLOCATIONS = 1000          # a job's allocation history keeps its first change and its most recent (`capped_history`)


def qos_job(row: FpgaJob) -> QosJob:
    """The job as the policies of `irm_fpga.qos` see it."""
    deadline = row.goal == DEADLINE
    return QosJob(row.id, design=row.design, goal=row.goal,
                  deadline=row.deadline_at if deadline else None, size=row.size_actions if deadline else None,
                  throughput=None if deadline else row.throughput_goal, min_devices=row.min_devices,
                  max_devices=row.max_devices or None, priority=row.priority, submitted_at=row.registered_at)


def capped_history(allocations: list, keep_since: float | None = None) -> list:
    """A job's history of [time, devices] changes as stored: the first (its registration or dispatch) and the most
    recent, at most MAX_ALLOCATIONS in all (a throughput job resized every control period for days would otherwise
    make every read, write and message of the job grow without end). `keep_since`: the change in effect then and
    every later one stay whatever their number (`mean_devices` reads the current control period from them)."""
    if len(allocations) <= MAX_ALLOCATIONS:
        return allocations
    start = len(allocations) - (MAX_ALLOCATIONS - 1)
    if keep_since is not None:
        while start > 1 and allocations[start][0] > keep_since:
            start -= 1
    return [allocations[0], *allocations[start:]]


def mean_devices(allocations: list, start: float, end: float, current: int) -> float:
    """Time-weighted mean of a job's devices over [start, end] from its history of [time, devices] changes.

    Seed 000 eq. 2 divides a period's progress by the devices held over that period, not by the size
    the job ends it with (admission or EDF may resize it mid-period). Time before the first change is
    left out; `current` when nothing of the window is covered.
    """
    held, since, first, total = None, start, None, 0.0
    for when, n in allocations:
        if when >= end:
            break
        if when > start:
            if held is not None:
                total += held * (when - since)
            since = when
        first = since if first is None else first
        held = n
    if held is None or end <= first:
        return float(current)
    total += held * (end - since)
    return total / (end - first)
