"""An example scheduling algorithm plugged in by name: `examples.qos.longest_first:longest_first`.

Use it like a built-in one: `jobs_policy = "examples.qos.longest_first:longest_first"` in the FPGA IRM's
configuration, `run_hydrogen(scenario, "examples.qos.longest_first:longest_first", seed)`, or
`harness bench policies --algorithm examples.qos.longest_first:longest_first` (a Table IV row beside the
paper's). The contract is seed 001 §IV's: a pure function of the ready queue (arrival order), the free
devices, the window and the cost model (`cost(job, devices) -> seconds`), returning which jobs start now
on how many devices; anything else it returns is refused before it is acted on.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from irm_fpga.qos.hydrogen import Allocation, HJob


def longest_first(queue: Sequence[HJob], available: int, window: int, cost: Callable[[HJob, int], float], *,
                  now: float = 0.0) -> Allocation:
    """The longest jobs of the window first (by the cost model at their minimum), each on its minimum.

    The opposite of SJTF: long jobs that would otherwise wait behind a stream of short ones start early.
    """
    out = []
    for job in sorted(queue[:window], key=lambda j: (-cost(j, j.min_devices), j.arrival, j.job_id)):
        if job.min_devices <= available:
            out.append((job.job_id, job.min_devices))
            available -= job.min_devices
    return out
