"""The FPGA groups the job manager (`irm_fpga.jobs`) makes for its jobs, and dropping those no job needs.

A job's group has the request id `job:<job id>` ("edf", "throughput") or `job:<job id>:<attempt>` (a Hydrogen
dispatch: each attempt a new group). Tenants cannot make such groups (`JOB_GROUP_PREFIX` is refused from them),
so one that no job owns was left by a process that died between making it and recording its job, or by a
dispatch whose record failed: the manager drops it.
"""

from __future__ import annotations

import re
from typing import Any

from sqlalchemy import func, select

from irm_fpga.job_models import JOB_GROUP_PREFIX, FpgaJob
from irm_fpga.jobs_rows import RETIRED
from irm_fpga.models import Group
from services.db import Database
from services.errors import NotFound

# The request ids of the groups this manager makes: job:<job id>, and job:<job id>:<attempt> (Hydrogen).
_MANAGER_GROUP = re.compile(re.escape(JOB_GROUP_PREFIX) + r"job-[0-9a-f]{16}(:[0-9a-f]{8})?")


class JobGroups:
    """The jobs' groups in the Orchestrator's database, dropped through the Orchestrator."""

    def __init__(self, orchestrator: Any, db: Database) -> None:
        self.orch = orchestrator
        self.db = db

    def orphans(self) -> list[str]:
        """The live job groups no job owns (call it under the manager's lock: no registration or dispatch may be
        half-made meanwhile)."""
        prefix = JOB_GROUP_PREFIX
        with self.db.read() as s:
            owned = set(s.scalars(select(FpgaJob.group_id).where(FpgaJob.state != RETIRED)))
            # Only ids this manager makes: a tenant's "job:..." group from before the prefix was refused stays.
            return [g.id for g in s.scalars(select(Group).where(
                Group.deleted.is_(False), func.substr(Group.request_id, 1, len(prefix)) == prefix))
                if g.id not in owned and _MANAGER_GROUP.fullmatch(g.request_id)]

    def live(self, ids: set[str]) -> set[str]:
        """Those of the groups `ids` not deleted."""
        with self.db.read() as s:
            return set(s.scalars(select(Group.id).where(Group.id.in_(ids), Group.deleted.is_(False)))) if ids else set()

    def drop_strays(self, tenant: str, job_id: str, keep: str) -> None:
        """Drop the live groups made for the job (request id `job:<id>` or `job:<id>:...`) other than `keep`."""
        with self.db.read() as s:
            prefix = f"job:{job_id}:"     # compared exactly: SQLite's LIKE ignores case
            strays = [g.id for g in s.scalars(select(Group).where(
                Group.tenant == tenant, Group.deleted.is_(False), Group.id != keep,
                (Group.request_id == f"job:{job_id}") | (func.substr(Group.request_id, 1, len(prefix)) == prefix)))]
        for gid in strays:
            self.drop(gid)

    def drop(self, group_id: str) -> None:
        if not group_id:
            return
        try:
            self.orch.delete(self.orch._group(group_id))
        except NotFound:
            pass
