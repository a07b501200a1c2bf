"""Jobs' progress as the FPGA-servers count it (`irm_fpga.jobs`): each job's group's `completed` counters.

A job's progress is the cumulative `completed - failed` counter of its group's part on every FPGA-server
(GetMeasurements), summed and kept monotone across part re-creations (a part made again restarts its counter
under a new incarnation). `ProgressCounters` keeps the counters last seen per job and server, and adds what
they moved to each job's `observed_actions`, saved with the counters in one transaction.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import grpc

from harness.v1 import fpga_pb2
from irm_fpga.fan_out import ask_servers
from irm_fpga.job_models import FpgaJob, FpgaJobController
from services.db import Database


class ProgressCounters:
    """The servers' progress counters of the jobs' groups, as last read; `publish`: the job rows whose observed
    progress grew (the manager's WatchJobs streams)."""

    def __init__(self, orchestrator: Any, db: Database, publish: Callable[[list[FpgaJob]], None]) -> None:
        self.orch = orchestrator
        self.db = db
        self.publish = publish
        # job -> server -> (incarnation, progress counter) of the job's part there when last read
        self.seen: dict[str, dict[str, tuple[str, int]]] = {}
        # Jobs whose counters were not saved (before the controllers' table) -> the servers that did not answer
        # when the manager started: their first reading is a baseline, not progress (it counts everything since
        # the group was made, already in observed_actions).
        self.unseen: dict[str, set[str]] = {}

    def observe(self, rows: list[FpgaJob]) -> dict[str, int]:
        """Completed actions per job: the servers' group counters (monotone) or the reports, the larger."""
        by_group = {r.group_id: r for r in rows}
        changed: set[str] = set()       # counters to save (a baseline taken included)
        moved: set[str] = set()         # jobs whose observed progress grew: what watchers see changed
        # Every server at once: one that hangs costs one timeout per round, not one per server in turn.
        for name, m in ask_servers(dict(self.orch.servers), "GetMeasurements", fpga_pb2.GetMeasurementsRequest(),
                                   self.orch.config.server_timeout_s).items():
            if isinstance(m, grpc.RpcError):
                continue
            for g in m.groups:
                row = by_group.get(g.group_id)
                if row is None:
                    continue
                seen = self.seen.setdefault(row.id, {})
                now_seen = (g.incarnation, g.completed - g.failed)      # failed tasks are no progress
                if name in self.unseen.get(row.id, ()):
                    seen[name] = now_seen              # the baseline (see `unseen`)
                    changed.add(row.id)
                    continue
                delta = _progress(seen.get(name), *now_seen)
                if seen.get(name) != now_seen:
                    changed.add(row.id)
                if delta:
                    moved.add(row.id)
                seen[name] = now_seen
                row.observed_actions += delta
            for r in rows:                             # this server answered: its baselines are taken
                pending = self.unseen.get(r.id)
                if pending is not None:
                    pending.discard(name)
                    if not pending:
                        del self.unseen[r.id]
        if changed:
            # The counters seen and the actions they added, in one transaction: a restart never counts twice.
            def save(s):  # type: ignore[no-untyped-def]
                for r in rows:
                    if r.id not in changed:
                        continue
                    s.get(FpgaJob, r.id).observed_actions = r.observed_actions
                    c = s.get(FpgaJobController, r.id)
                    if c is not None:
                        c.seen = {k: list(v) for k, v in self.seen[r.id].items()}
            self.db.transact(save)
            # A baseline or a counter that moved without adding progress changes nothing a Job shows: published, it
            # was a second identical line on every watch of a job just started.
            if moved:
                self.publish([r for r in rows if r.id in moved])
        return {r.id: max(r.observed_actions, r.reported_actions) for r in rows}


def seen_entry(value: Any) -> tuple[str, int]:
    """A stored counter reading: [incarnation, count], or a bare count (stored before incarnations: "")."""
    if isinstance(value, list | tuple):
        return str(value[0]), int(value[1])
    return "", int(value)


def _progress(last: tuple[str, int] | None, incarnation: str, count: int) -> int:
    """Actions a part's progress counter adds since `last` (its previous reading; None: never read).

    A part made again (deleted, or its server restarted) restarts its counter at 0 under a new
    incarnation: all of its count is new, however far it has got since. A reading stored before
    incarnations ("") against one that has them cannot tell: it only sets the baseline. Servers
    without incarnations (both ""): a counter that went down restarted.
    """
    if last is None:
        return count                   # the part was made for this job: everything it did is the job's
    was, before = last
    if was != incarnation:
        return 0 if was == "" else count
    return count - before if count >= before else count
