"""Applying EDF's and the throughput broker's allocations to the jobs' groups (`irm_fpga.jobs`).

"edf" and "throughput" resize each active job's group, through the Orchestrator, to the devices the policy
gave it: shrinks first (the devices they free are there for the grows), never below a group's minimum, and a
refusal is decided again every control round (logged once) until it is applied.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from irm_fpga.job_models import FpgaJob
from irm_fpga.jobs_devices import JobDevices
from irm_fpga.jobs_rows import capped_history, qos_job
from irm_fpga.qos.edf import edf_allocate
from irm_fpga.qos.jobs import THROUGHPUT
from irm_fpga.qos.throughput import ControllerState
from services.errors import HarnessError

# The job manager's one logger: its operators (and tests) follow the manager's records under one name.
log = logging.getLogger("irm_fpga.jobs")


class GroupResizer:
    """Resizes the jobs' groups to a decision's allocation. `states`: the throughput controllers' (the manager's,
    shared), whose period a resize's history keeps; `update`: the manager's write of a job's row."""

    def __init__(self, orchestrator: Any, devices: JobDevices, policy: str, states: dict[str, ControllerState],
                 update: Callable[..., FpgaJob]) -> None:
        self.orch = orchestrator
        self.devices = devices
        self.policy = policy
        self.states = states
        self.update = update
        # The last decision was not (fully) applied -- skipped while a server was silent, or a resize refused.
        # The next control round decides again; otherwise EDF decides only on events.
        self.unapplied = False
        # Resizes refused, per job: the size and the reason last logged (a refusal repeated every round is
        # logged once until that job's resize succeeds or is refused otherwise).
        self.refused: dict[str, tuple[int, str]] = {}

    def resize(self, row: FpgaJob, n: int, now: float, caps: dict[str, int] | None = None) -> FpgaJob:
        """Resize the job's group to `n` devices. `caps`: the servers that answer (`JobDevices.answering`), when the
        decision was made without those taken as gone: the job's parts on the others are given up and its `n`
        devices put on these, in one step (`Orchestrator.resize(evict=...)`).

        Never below the group's min_size (the job's minimum): EDF gives nothing to a job whose minimum no longer
        fits, and a group cannot be cut under its min, so the job keeps its minimum (`edf_allocation` counts it)."""
        gone: list[str] = []
        try:
            g = self.orch._group(row.group_id)
            gone = sorted(server for server, k in (g.parts or {}).items() if k > 0 and caps is not None
                          and server not in caps)
            n = max(1, n, g.min_size)
            if n == row.devices and not gone:
                return row
            # No max of its own: the group's (the devices usable when it was made) must not hold the job back.
            # `evict` only when there is something to give up: the Orchestrator stand-ins of the tests have none.
            self.orch.resize(g, n, max_size=None if row.max_devices else n, **({"evict": gone} if gone else {}))
        except HarnessError as e:
            self.unapplied = True
            if self.refused.get(row.id) != (n, str(e)):     # once, not every round that decides it again
                self.refused[row.id] = (n, str(e))
                log.warning("job resize refused; decided again every control round until it is applied",
                            extra={"job": row.id, "devices": n, "gone_servers": gone, "reason": str(e)})
            return row
        self.refused.pop(row.id, None)
        if n == row.devices:
            return row
        # The throughput controller's next step reads the history from the start of its period (`mean_devices`).
        st = self.states.get(row.id) if self.policy == THROUGHPUT else None
        history = capped_history([*row.allocations, [now, n]], keep_since=st.last_time if st else None)
        return self.update(row.id, devices=n, allocations=history)

    def apply(self, alloc: dict[str, int], rows: list[FpgaJob], now: float,
              caps: dict[str, int] | None = None) -> None:
        """Shrinks first, so the devices they free are there for the grows. `caps`: the servers that answer
        (a job's devices on the others, taken as gone, are not what it holds: `JobDevices.live_devices`)."""
        live = {} if caps is None else self.devices.live_devices(rows, caps)
        have = {r.id: live.get(r.id, r.devices) for r in rows}
        ordered = sorted((r for r in rows if r.id in alloc), key=lambda r: alloc[r.id] - have[r.id])
        for row in ordered:
            self.resize(row, alloc[row.id], now, caps)

    def edf_allocation(self, rows: list[FpgaJob], pool: int) -> dict[str, int]:
        """`edf_allocate` of the active jobs on `pool` devices, where the pool no longer holds every minimum (it
        shrank: devices blacklisted, a server gone): a job EDF leaves without its minimum keeps it (its group
        cannot go below; `resize`), and the others share what is left. Allocating as if those devices were free
        had a grow refused for want of them, and the same refusal come back every round."""
        jobs = [qos_job(r) for r in rows]
        kept: dict[str, int] = {}
        while True:
            alloc = edf_allocate([j for j in jobs if j.job_id not in kept], max(0, pool - sum(kept.values())))
            short = {j.job_id: max(1, j.min_devices) for j in jobs
                     if j.job_id in alloc and alloc[j.job_id] < max(1, j.min_devices)}
            if not short:
                break
            kept.update(short)
        if kept:
            log.warning("the job pool no longer holds every job's minimum: jobs keep their minimum and the "
                        "others share the rest until a job retires or devices come back",
                        extra={"pool": pool, "kept": dict(sorted(kept.items())[:20])})
        return {**alloc, **kept}
