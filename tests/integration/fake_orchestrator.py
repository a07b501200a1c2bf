"""A job manager over an in-memory stand-in for the Orchestrator, on virtual time (issue 5's tests).

Groups live in the real database (SQLite or PostgreSQL: the `db_url`
fixture's two parameters), FPGA-servers are reduced to the `completed`
counters the manager reads, and every step is a direct call.
`tests/integration/conftest.py` makes `db_url` and `irm_factory` fixtures of these.
"""

from __future__ import annotations

import uuid
from types import SimpleNamespace

from sqlalchemy import select

from harness.v1 import fpga_jobs_pb2 as jp
from harness.v1 import fpga_pb2
from irm_fpga.job_models import FpgaJob
from irm_fpga.jobs import JobManager, JobsConfig
from irm_fpga.models import Group
from irm_fpga.orchestrator import MIGRATIONS, Orchestrator
from services.clock import VirtualClock
from services.db import Database
from services.errors import FailedPrecondition, InvalidArgument

DEVICES = 8


class FakeServer:
    """An FPGA-server as the job manager sees it: cumulative `completed` (and `failed`) counters per group,
    and each group part's incarnation ("" until a test remakes it: a server without incarnations)."""

    def __init__(self) -> None:
        self.completed: dict[str, int] = {}
        self.failed: dict[str, int] = {}
        self.incarnation: dict[str, str] = {}

    def stub(self) -> FakeServer:
        return self

    def remake(self, group_id: str) -> None:
        """The part is made again (the server restarted): a new incarnation, counters from 0."""
        self.incarnation[group_id] = uuid.uuid4().hex[:16]
        self.completed[group_id] = self.failed[group_id] = 0

    def GetMeasurements(self, request, timeout=None):  # noqa: N802
        return fpga_pb2.ServerMeasurements(
            groups=[fpga_pb2.GroupCounters(group_id=g, completed=c, failed=self.failed.get(g, 0),
                                           incarnation=self.incarnation.get(g, ""))
                    for g, c in self.completed.items()]
        )


class FakeOrchestrator:
    """Groups in the database (so the manager's pool is computed as live), devices counted, nothing placed."""

    def __init__(self, url: str, clock: VirtualClock, servers: dict[str, FakeServer]) -> None:
        self.db = Database(url)
        self.db.migrate(MIGRATIONS, "alembic_version_fpga")
        self.clock = clock
        self.servers = servers
        self.config = SimpleNamespace(server_timeout_s=1.0)
        self.capacity = {"s1": DEVICES}     # usable devices per server now (tests change it)

    def _free_total_capacity(self) -> dict[str, int]:
        return dict(self.capacity)

    _group = Orchestrator._group  # the real lookup: it needs only `db`

    def create_group(self, tenant, request_id, design, size, min_size=0, max_size=0, **_):
        with self.db.read() as s:      # idempotent by (tenant, request_id), as the real one
            existing = s.scalar(select(Group).where(Group.tenant == tenant, Group.request_id == request_id))
        if existing is not None:
            return existing
        total = sum(self._free_total_capacity().values())
        max_size = max_size or total
        if max_size > total:        # as the real one's _validate_group
            raise InvalidArgument.of("max_size", f"the FPGA-servers have {total} usable devices in all")
        g = Group(
            id=f"fg-{uuid.uuid4().hex[:12]}",
            tenant=tenant,
            request_id=request_id,
            design=design,
            size=size,
            min_size=min_size,
            max_size=max_size,
            shared=False,
            elastic=False,
            parts={"s1": size},
            created_at=self.clock.now(),
            deleted=False,
            reservation_id="",
        )
        self.db.transact(lambda s: s.add(Group(**{c.name: getattr(g, c.name) for c in Group.__table__.c})))
        return g

    def resize(self, g: Group, size: int, *, max_size: int | None = None) -> Group:
        mx = max(g.max_size, max_size or 0)
        if not g.min_size <= size <= mx:           # as the real one's
            raise FailedPrecondition(f"size {size} is outside the group's [{g.min_size}, {mx}]")

        def save(s):  # noqa: ANN001, ANN202
            row = s.get(Group, g.id)
            row.size, row.parts, row.max_size = size, {"s1": size}, mx
            return row

        return self.db.transact(save)

    def delete(self, g: Group) -> Group:
        def save(s):  # noqa: ANN001, ANN202
            row = s.get(Group, g.id)
            row.deleted = True
            return row

        return self.db.transact(save)

    def size_of(self, group_id: str) -> int:
        return self._group(group_id).size


class Irm:
    """A manager over a fake Orchestrator; `restart()` builds both afresh on the same database and servers."""

    def __init__(self, url: str, policy: str, alpha: float = 0.5, **config) -> None:
        self.url, self.policy, self.alpha, self.config = url, policy, alpha, config
        self.clock = VirtualClock(1000.0)
        self.server = FakeServer()
        self.orch: FakeOrchestrator | None = None
        self.manager: JobManager | None = None
        self._build()

    def _build(self) -> None:
        self.orch = FakeOrchestrator(self.url, self.clock, {"s1": self.server})
        self.manager = JobManager(
            self.orch, JobsConfig(policy=self.policy, control_period_s=3600.0, alpha=self.alpha, **self.config)
        )
        self.manager.start(loop=False)  # loads the persisted state; no control thread: we step by hand

    def restart(self) -> None:
        self.close()
        self._build()

    def close(self) -> None:
        self.manager.stop()
        self.orch.db.dispose()

    def register(self, request_id: str, **kw) -> FpgaJob:
        return self.manager.register(
            jp.RegisterJobRequest(tenant="alice", request_id=request_id, design="sleep", **kw)
        )

    def job(self, job_id: str) -> FpgaJob:
        return self.manager._job("alice", job_id)

    def complete(self, job: FpgaJob, n: int) -> None:
        """The data plane completes `n` more of the job's actions."""
        self.server.completed[job.group_id] = self.server.completed.get(job.group_id, 0) + n


def watched_manager(url: str, policy: str, start: float = 1000.0, **config) -> tuple[JobManager, list[jp.Job]]:
    """A manager over a fake Orchestrator (one FakeServer "s1") on a VirtualClock at `start`, control period 1 s,
    started without its control thread (step it by hand), and the Job messages a WatchJobs stream would get."""
    orch = FakeOrchestrator(url, VirtualClock(start), {"s1": FakeServer()})
    m = JobManager(orch, JobsConfig(policy=policy, control_period_s=1.0, **config))
    m.start(loop=False)
    published: list[jp.Job] = []
    m.watchers.has_subscribers = lambda: True          # a WatchJobs stream would get these
    m.watchers.publish = published.extend
    return m, published


def deadline(seconds: float, size: int) -> dict:
    return {"deadline": jp.DeadlineGoal(deadline_s=seconds, size_actions=size)}
