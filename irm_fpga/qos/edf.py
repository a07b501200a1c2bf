"""Earliest Deadline First (seed 000 §III-A).

Every job first receives its `min_devices` (earliest deadline first when even
the minimums do not fit); the *allocable* devices, those in excess of the
minimums, all go to the active job with the earliest deadline, up to its max;
what its max leaves over goes to the next deadline, and so on. The policy is
evaluated on events only (a job submitted or retired); a submission changes
the allocation exactly when the new job is due before the current holder.
Ties on the deadline go to the higher priority (the Job API's `priority`;
seed 000 has none), then to the earlier submission, then to the job id. The
priority is only a tie-breaker: an earlier deadline always comes first.
"""

from __future__ import annotations

from collections.abc import Sequence

from irm_fpga.qos.jobs import DEADLINE, QosJob


def edf_order(jobs: Sequence[QosJob]) -> list[QosJob]:
    return sorted(jobs, key=lambda j: (j.deadline, -j.priority, j.submitted_at, j.job_id))


def edf_allocate(jobs: Sequence[QosJob], devices: int) -> dict[str, int]:
    """Allocation {job_id: devices} for the active `jobs` on `devices` usable devices."""
    if devices < 0:
        raise ValueError("devices must be >= 0")
    for j in jobs:
        if j.goal != DEADLINE:
            raise ValueError(f"EDF supports deadline goals only; job {j.job_id} has a {j.goal} goal")
    order = edf_order(jobs)
    alloc = {j.job_id: 0 for j in order}
    free = devices
    for j in order:                                   # constraints first
        give = min(j.cap(j.min_devices), free)
        if give < j.min_devices:                      # its minimum does not fit: it waits
            continue
        alloc[j.job_id] = give
        free -= give
    for j in order:                                   # allocable devices to the earliest deadline
        if free == 0:
            break
        if alloc[j.job_id] < j.min_devices:
            continue
        extra = j.cap(alloc[j.job_id] + free) - alloc[j.job_id]
        alloc[j.job_id] += extra
        free -= extra
    return alloc
