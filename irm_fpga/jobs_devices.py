"""The devices the FPGA job manager's policies share out (`irm_fpga.jobs`), and the servers that hold them.

The pool is the FPGA-servers' usable devices (blacklisted ones excluded) minus the devices of groups that are
not the active jobs' (seed 000 §III-B's broker max). A server holding job groups that does not answer holds
decisions back (its devices would count as gone, and every job shrink, for a timeout) until it has been silent
for `silent_server_s`: then it is taken as gone, with its parts of the jobs' groups.
"""

from __future__ import annotations

import logging
from typing import Any

from sqlalchemy import select

from irm_fpga.job_models import FpgaJob
from irm_fpga.models import Group
from irm_fpga.qos.throughput import broker_max
from services.clock import Clock
from services.db import Database

# The job manager's one logger: its operators (and tests) follow the manager's records under one name.
log = logging.getLogger("irm_fpga.jobs")


class JobDevices:
    """What the servers that answer hold for jobs: usable devices, the pool, and each job's live devices."""

    def __init__(self, orchestrator: Any, db: Database, clock: Clock, silent_server_s: float) -> None:
        self.orch = orchestrator
        self.db = db
        self.clock = clock
        self.silent_server_s = silent_server_s
        self.silent_since: dict[str, float] = {}             # server holding job groups -> first unanswered round
        self.gone_logged: set[str] = set()                   # servers taken as gone, already logged

    def pool(self, active: list[FpgaJob], caps: dict[str, int] | None = None) -> int:
        """The broker's max: usable devices minus those of groups that are not active jobs' (seed 000 §III-B).

        `caps`: usable devices per server, if just read (else read now)."""
        mine = {r.group_id for r in active}
        caps = self.orch._free_total_capacity() if caps is None else caps
        with self.db.read() as s:
            # Other groups' devices on the servers counted: one that did not answer is out of `usable` already.
            others = sum(n for g in s.scalars(select(Group).where(Group.deleted.is_(False))) if g.id not in mine
                         for server, n in (g.parts or {}).items() if server in caps)
        return broker_max(sum(caps.values()), reserved=others)

    def answering(self, active: list[FpgaJob]) -> tuple[dict[str, int], list[str]]:
        """Usable devices per server that answers, and the servers holding active jobs' groups that have not
        answered for less than `silent_server_s` (decisions wait for them). A server's silence is timed from
        the first call here that misses it: call it every round, not only when there is something to decide."""
        caps = self.orch._free_total_capacity()
        with self.db.read() as s:
            held = {n for r in active if r.group_id for g in [s.get(Group, r.group_id)] if g for n in (g.parts or {})}
        missing = sorted(held - set(caps))
        now = self.clock.now()
        self.silent_since = {n: self.silent_since.get(n, now) for n in missing}
        waiting = [n for n in missing if now - self.silent_since[n] < self.silent_server_s]
        gone = set(missing) - set(waiting)
        if gone - self.gone_logged:        # once per server going, not every round it stays gone
            log.warning("servers holding job groups silent for longer than silent_server_s: deciding without "
                        "their devices", extra={"servers": sorted(gone), "silent_server_s": self.silent_server_s})
        self.gone_logged = gone
        return caps, waiting

    def caps_if_known(self, active: list[FpgaJob]) -> dict[str, int] | None:
        """Usable devices per server that answers (`answering`), or None while one holding part of an active
        job's group has not answered for less than `silent_server_s`: its devices would count as gone and every
        job shrink (the next round, once it answers, decides again)."""
        caps, waiting = self.answering(active)
        if waiting:
            log.warning("job allocation skipped: servers holding job groups did not answer",
                        extra={"servers": waiting})
            return None
        return caps

    def live_devices(self, active: list[FpgaJob], caps: dict[str, int]) -> dict[str, int]:
        """Each active job's devices on the servers in `caps` (those that answer): a server taken as gone took
        its part of a job's group with it, and those devices are out of the pool already."""
        with self.db.read() as s:
            groups = {r.id: s.get(Group, r.group_id) if r.group_id else None for r in active}
        return {r.id: r.devices if (g := groups[r.id]) is None or not g.parts
                else sum(n for server, n in g.parts.items() if server in caps) for r in active}
