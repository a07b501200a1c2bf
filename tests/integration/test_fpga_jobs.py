"""The FpgaJobs API (issue 5): jobs with QoS goals on private FPGA groups, resized by EDF or throughput control.

FPGA-servers run as processes (the `suite` fixture); the Orchestrator and the
job manager share one in-process gRPC server, as `component()` wires them.
"""

from __future__ import annotations

import math
import os
import threading
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest

from harness.v1 import fpga_jobs_pb2 as jp
from harness.v1 import fpga_jobs_pb2_grpc, fpga_pb2, fpga_pb2_grpc
from irm_fpga.client import VirtualFpga
from irm_fpga.jobs import JobsConfig, job_component_parts
from irm_fpga.orchestrator import Orchestrator, OrchestratorConfig
from services import server as srv
from services.errors import field_violations
from services.server import Component
from services.tls import plain_channel
from tests.conftest import eventually

FAST = {"reconfig_mean_s": 0.05, "reconfig_std_s": 0.0}
TASK_S = 0.1


def start_irm(suite, policy: str, period: float = 1.0, servers=None, **config):
    """FPGA-servers (unless given: a restart reuses them), then the Orchestrator and the job manager."""
    servers = servers or [suite.start("fpga-server", name=f"fpga-{i}", devices=4, **FAST) for i in range(2)]
    cfg = OrchestratorConfig(address="127.0.0.1:0", servers=[s.address for s in servers], autoscaler="none",
                             database=f"sqlite:///{os.path.join(suite.tmp, f'fpga-{policy}.db')}")
    orch = Orchestrator(cfg)

    def register_orch(server: grpc.Server) -> None:
        fpga_pb2_grpc.add_FpgaOrchestratorServicer_to_server(orch, server)

    orch_comp = Component(name="fpga", register=register_orch, service_names=["harness.v1.FpgaOrchestrator"],
                          stop=orch.stop)
    orch_comp.start = lambda: orch.start(orch_comp.extra["port"])
    register, names, start, stop = job_component_parts(orch, JobsConfig(policy=policy, control_period_s=period,
                                                                               **config))
    running = srv.start("127.0.0.1:0", [orch_comp, Component(name="fpga-jobs", register=register,
                                                             service_names=names, start=start, stop=stop)])
    address = f"127.0.0.1:{running.port}"
    ch = plain_channel(address)
    register.servers = servers  # type: ignore[attr-defined]
    return running, address, fpga_jobs_pb2_grpc.FpgaJobsStub(ch), fpga_pb2_grpc.FpgaOrchestratorStub(ch), register


def stop_irm(running, register) -> None:
    running.stop(grace=0)        # each component's stop: the job manager's loop, the Orchestrator


@pytest.fixture
def edf(suite):
    running, address, jobs, orch, register = start_irm(suite, "edf")
    yield {"address": address, "jobs": jobs, "orch": orch}
    stop_irm(running, register)


@pytest.fixture
def throughput(suite):
    running, address, jobs, orch, register = start_irm(suite, "throughput", period=0.4)
    yield {"address": address, "jobs": jobs, "orch": orch}
    stop_irm(running, register)


def deadline_job(request_id: str, deadline_s: float, size: int = 1000, tenant: str = "alice", **kw):
    return jp.RegisterJobRequest(tenant=tenant, request_id=request_id, design="sleep",
                                 deadline=jp.DeadlineGoal(deadline_s=deadline_s, size_actions=size), **kw)


def group_size(orch, tenant: str, group_id: str) -> int:
    return orch.GetGroup(fpga_pb2.GetGroupRequest(tenant=tenant, group_id=group_id)).size


def test_edf_gives_the_devices_to_the_earliest_deadline_and_back_on_retire(edf):
    jobs, orch = edf["jobs"], edf["orch"]
    late = jobs.RegisterJob(deadline_job("late", 100.0))
    assert late.state == jp.Job.STATE_ACTIVE and late.policy == "edf" and late.devices == 8
    assert group_size(orch, "alice", late.group_id) == 8
    assert jobs.RegisterJob(deadline_job("late", 100.0)).id == late.id           # idempotent

    soon = jobs.RegisterJob(deadline_job("soon", 30.0))
    # Minimums first (one each), the allocable six to the earliest deadline.
    assert soon.devices == 7 and group_size(orch, "alice", soon.group_id) == 7
    late = jobs.GetJob(jp.GetJobRequest(tenant="alice", job_id=late.id))
    assert late.devices == 1 and group_size(orch, "alice", late.group_id) == 1
    assert [a.devices for a in late.allocations] == [8, 1]
    assert soon.deadline_at == pytest.approx(soon.registered_at + 30.0)

    # The earliest-deadline job's group really serves tasks on its devices.
    with VirtualFpga.attach(edf["address"], "alice", soon.group_id) as f:
        outs = f.map([{"duration": 0.01}] * 14)
    assert len({(o.server, o.device) for o in outs}) > 1
    eventually(lambda: jobs.GetJob(jp.GetJobRequest(tenant="alice", job_id=soon.id)).completed_actions >= 14,
               what="progress observed from the servers' counters")

    retired = jobs.RetireJob(jp.RetireJobRequest(tenant="alice", job_id=soon.id))
    assert retired.state == jp.Job.STATE_RETIRED and retired.devices == 0
    assert [a.devices for a in retired.allocations] == [7, 0]
    late = jobs.GetJob(jp.GetJobRequest(tenant="alice", job_id=late.id))
    assert late.devices == 8 and group_size(orch, "alice", late.group_id) == 8
    assert [a.devices for a in late.allocations] == [8, 1, 8]
    with pytest.raises(grpc.RpcError) as e:
        orch.GetGroup(fpga_pb2.GetGroupRequest(tenant="alice", group_id=soon.group_id))
    assert e.value.code() == grpc.StatusCode.NOT_FOUND                              # its group is gone

    # Reported progress counts when it is ahead of the observed one.
    reported = jobs.ReportProgress(jp.ReportProgressRequest(tenant="alice", job_id=late.id, completed_actions=500))
    assert reported.completed_actions == 500
    assert [j.id for j in jobs.ListJobs(jp.ListJobsRequest(tenant="alice", active_only=True)).jobs] == [late.id]
    assert len(jobs.ListJobs(jp.ListJobsRequest(tenant="alice")).jobs) == 2


def test_tenant_isolation_and_bad_input(edf):
    jobs = edf["jobs"]
    mine = jobs.RegisterJob(deadline_job("a1", 60.0))
    for call in (lambda: jobs.GetJob(jp.GetJobRequest(tenant="bob", job_id=mine.id)),
                 lambda: jobs.RetireJob(jp.RetireJobRequest(tenant="bob", job_id=mine.id)),
                 lambda: jobs.ReportProgress(jp.ReportProgressRequest(tenant="bob", job_id=mine.id,
                                                                      completed_actions=1))):
        with pytest.raises(grpc.RpcError) as e:
            call()
        assert e.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert list(jobs.ListJobs(jp.ListJobsRequest(tenant="bob")).jobs) == []
    with pytest.raises(grpc.RpcError) as e:                     # bob cannot attach to alice's job group either
        VirtualFpga.attach(edf["address"], "bob", mine.group_id)
    assert e.value.code() == grpc.StatusCode.PERMISSION_DENIED
    # Nor can alice herself resize or delete her job's group: the job manager sizes it (it would never notice).
    orch = edf["orch"]
    for call in (lambda: orch.ResizeGroup(fpga_pb2.ResizeGroupRequest(tenant="alice", group_id=mine.group_id, size=8)),
                 lambda: orch.DeleteGroup(fpga_pb2.DeleteGroupRequest(tenant="alice", group_id=mine.group_id))):
        with pytest.raises(grpc.RpcError) as e:
            call()
        assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION and "RetireJob" in e.value.details()
    assert group_size(orch, "alice", mine.group_id) == jobs.GetJob(jp.GetJobRequest(tenant="alice",
                                                                                   job_id=mine.id)).devices
    with pytest.raises(grpc.RpcError) as e:     # job groups' request ids are the manager's (it drops orphans by them)
        orch.CreateGroup(fpga_pb2.CreateGroupRequest(tenant="alice", request_id=f"job:{mine.id}", design="sleep",
                                                     size=1))
    assert [f for f, _ in field_violations(e.value)] == ["request_id"]
    with pytest.raises(grpc.RpcError) as e:
        jobs.GetJob(jp.GetJobRequest(tenant="alice", job_id="job-nope"))
    assert e.value.code() == grpc.StatusCode.NOT_FOUND

    bad = jp.RegisterJobRequest(tenant="alice", request_id="", design="nope", min_devices=5, max_devices=2,
                                priority=-1)
    with pytest.raises(grpc.RpcError) as e:
        jobs.RegisterJob(bad)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    fields = {f for f, _ in field_violations(e.value)}
    assert fields == {"request_id", "design", "goal", "max_devices", "priority"}
    with pytest.raises(grpc.RpcError) as e:
        jobs.RegisterJob(deadline_job("b1", -1.0, size=0, max_devices=9))
    assert {f for f, _ in field_violations(e.value)} == {"deadline.deadline_s", "deadline.size_actions",
                                                          "max_devices"}
    with pytest.raises(grpc.RpcError) as e:                     # EDF takes deadline goals only
        jobs.RegisterJob(jp.RegisterJobRequest(tenant="alice", request_id="t1", design="sleep",
                                               throughput=jp.ThroughputGoal(actions_per_s=10)))
    assert [f for f, _ in field_violations(e.value)] == ["throughput"]
    with pytest.raises(grpc.RpcError) as e:
        jobs.RegisterJob(deadline_job("n1", 10.0, tenant=""))
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    with pytest.raises(grpc.RpcError) as e:                     # PostgreSQL cannot store it: refused everywhere
        jobs.GetJob(jp.GetJobRequest(tenant="alice", job_id=f"{mine.id}\x00"))
    assert [f for f, _ in field_violations(e.value)] == ["job_id"]
    assert [j.id for j in jobs.ListJobs(jp.ListJobsRequest(tenant="alice")).jobs] == [mine.id]


def test_throughput_job_reaches_its_goal_through_real_tasks(throughput):
    jobs = throughput["jobs"]
    goal = 25.0                                                  # 0.1 s tasks: 3 devices needed
    need = math.ceil(goal * TASK_S - 1e-9)
    job = jobs.RegisterJob(jp.RegisterJobRequest(tenant="alice", request_id="tp", design="sleep",
                                                 throughput=jp.ThroughputGoal(actions_per_s=goal)))
    assert job.devices == 8                                      # admission: the unallocated devices
    stop = threading.Event()

    def load() -> None:                                          # keep the group busy: a backlog of tasks
        with VirtualFpga.attach(throughput["address"], "alice", job.group_id) as f:
            pending = []
            while not stop.is_set():
                pending = [p for p in pending if not p.done()]
                while len(pending) < 24:
                    pending.append(f.submit({"duration": TASK_S}))
                stop.wait(0.02)
            for p in pending:
                p.result(30)

    t = threading.Thread(target=load, daemon=True)
    t.start()
    try:
        def at_goal():
            j = jobs.GetJob(jp.GetJobRequest(tenant="alice", job_id=job.id))
            return j if need <= j.devices <= need + 1 and j.achieved_throughput >= goal else None

        j = eventually(at_goal, timeout=30, what="throughput at goal with at most one spare device")
        sizes = [a.devices for a in j.allocations]
        assert sizes[0] == 8 and min(sizes[1:]) >= need - 1    # came down from the admission's 8
        assert j.completed_actions > 0 and j.mean_throughput > 0
        # It stays there over the next control periods.
        j = eventually(lambda: (lambda x: x if x.completed_actions >= j.completed_actions + 2 * goal else None)(
            jobs.GetJob(jp.GetJobRequest(tenant="alice", job_id=job.id))), timeout=15, what="more progress")
        assert j.devices <= need + 1 and j.achieved_throughput >= 0.9 * goal
    finally:
        stop.set()
        t.join(30)
    done = jobs.RetireJob(jp.RetireJobRequest(tenant="alice", job_id=job.id))
    assert done.state == jp.Job.STATE_RETIRED and done.allocations[-1].devices == 0


def test_a_deadline_job_whose_size_is_done_retires_itself_and_frees_its_devices(edf):
    jobs, orch = edf["jobs"], edf["orch"]
    other = jobs.RegisterJob(deadline_job("other", 100.0))
    small = jobs.RegisterJob(deadline_job("small", 30.0, size=20))
    assert (small.devices, jobs.GetJob(jp.GetJobRequest(tenant="alice", job_id=other.id)).devices) == (7, 1)
    with VirtualFpga.attach(edf["address"], "alice", small.group_id) as f:
        f.map([{"duration": 0.01}] * 20)
    done = eventually(lambda: (lambda j: j if j.state == jp.Job.STATE_RETIRED else None)(
        jobs.GetJob(jp.GetJobRequest(tenant="alice", job_id=small.id))), what="auto-retired once 20 actions done")
    assert done.completed_actions >= 20 and done.devices == 0 and done.allocations[-1].devices == 0
    with pytest.raises(grpc.RpcError) as e:
        orch.GetGroup(fpga_pb2.GetGroupRequest(tenant="alice", group_id=small.group_id))
    assert e.value.code() == grpc.StatusCode.NOT_FOUND
    # EDF's event, in the same control round (which may still be applying it when the retirement shows).
    other = eventually(lambda: (lambda j: j if j.devices == 8 else None)(
        jobs.GetJob(jp.GetJobRequest(tenant="alice", job_id=other.id))), what="the other job gets every device")
    assert group_size(orch, "alice", other.group_id) == 8 and [a.devices for a in other.allocations] == [8, 1, 8]
    with pytest.raises(grpc.RpcError) as e:                                           # no more reports
        jobs.ReportProgress(jp.ReportProgressRequest(tenant="alice", job_id=small.id, completed_actions=30))
    assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION


def test_throughput_controller_state_survives_an_orchestrator_restart(suite):
    running, address, jobs, _, register = start_irm(suite, "throughput", period=0.4)
    try:
        job = jobs.RegisterJob(jp.RegisterJobRequest(tenant="alice", request_id="tp", design="sleep",
                                                     throughput=jp.ThroughputGoal(actions_per_s=20.0)))
        with VirtualFpga.attach(address, "alice", job.group_id) as f:
            f.map([{"duration": 0.05}] * 60)
        manager = register.manager
        eventually(lambda: (s := manager._states.get(job.id)) is not None and s.a_hat is not None
                   and s.last_actions >= 60, what="an action-time estimate from all 60 actions")
        with manager.lock:                     # a consistent snapshot between two control rounds
            before = manager._states[job.id]
            seen = dict(manager._seen[job.id])
    finally:
        stop_irm(running, register)
    servers = register.servers
    running, address, jobs, _, register = start_irm(suite, "throughput", period=0.4, servers=servers)
    try:
        manager = register.manager
        loaded = manager._states[job.id]
        assert (loaded.a_hat, loaded.request, loaded.last_actions) == (before.a_hat, before.request,
                                                                      before.last_actions)
        assert manager._seen[job.id] == seen
        # Control rounds go on from there; the servers' counters are not counted a second time.
        eventually(lambda: manager._states[job.id].last_time > loaded.last_time, what="a round after the restart")
        again = jobs.GetJob(jp.GetJobRequest(tenant="alice", job_id=job.id))
        assert again.completed_actions == 60 and again.state == jp.Job.STATE_ACTIVE
        assert manager._states[job.id].a_hat == pytest.approx(before.a_hat)   # no progress: estimate kept
    finally:
        stop_irm(running, register)


def test_a_hydrogen_policy_queues_dispatches_and_learns_from_real_tasks(suite):
    """managed_deadline live: a job waits in the ready queue while the pool is busy, is dispatched when a job
    that ran its size on the FPGA-servers retires, and the manager learns the design's time from that run."""
    # The pool held at 8 (pool_min = 8): the elastic pool is test_fpga_jobs_hydrogen's; here, the queue.
    running, address, jobs, orch, register = start_irm(suite, "managed_deadline", period=0.3, pool_min=8)
    try:
        get = lambda jid: jobs.GetJob(jp.GetJobRequest(tenant="alice", job_id=jid))  # noqa: E731
        first = jobs.RegisterJob(deadline_job("first", 60.0, size=40, max_devices=8, action_seconds=TASK_S))
        assert first.state == jp.Job.STATE_ACTIVE and first.devices >= 1 and first.dispatched_at > 0
        queued = []
        for i in range(8):                         # more jobs than devices: some must wait
            j = jobs.RegisterJob(deadline_job(f"j{i}", 60.0, size=10, min_devices=1, max_devices=1))
            if j.state == jp.Job.STATE_QUEUED:
                assert j.devices == 0 and j.group_id == "" and j.dispatched_at == 0
                queued.append(j.id)
        assert queued, "8 single-device jobs beside a running one must not all fit on 8 devices"
        listed = jobs.ListJobs(jp.ListJobsRequest(tenant="alice", active_only=True))
        assert listed.pool_devices == 8 and sum(j.devices for j in listed.jobs) == 8
        with VirtualFpga.attach(address, "alice", first.group_id) as f:
            f.map([{"duration": TASK_S}] * 40)
        done = eventually(lambda: (lambda j: j if j.state == jp.Job.STATE_RETIRED else None)(get(first.id)),
                          what="the first job retires once its 40 actions ran")
        assert done.completed_actions >= 40
        # Its devices went back to the pool: a queued job is dispatched onto them (the next event or period).
        started = eventually(lambda: (lambda j: j if j.state == jp.Job.STATE_ACTIVE else None)(get(queued[0])),
                             what="the head of the queue dispatched")
        assert started.dispatched_at >= done.retired_at and started.devices == 1
        assert group_size(orch, "alice", started.group_id) == 1
        model = register.manager.cost
        assert list(model.observed("sleep", "alice")) == [first.devices]     # learned from the run on its devices
    finally:
        stop_irm(running, register)


class _FlakyCreates:
    """Fault injection at the network edge: the next `n` CreateGroupPart calls to any FPGA-server time out."""

    class Timeout(grpc.RpcError):
        def code(self):
            return grpc.StatusCode.DEADLINE_EXCEEDED

        def details(self):
            return "injected: CreateGroupPart timed out"

    def __init__(self, orch: Orchestrator, n: int) -> None:
        self.left = n
        for name, handle in list(orch.servers.items()):
            orch.servers[name] = self._wrap(handle)

    def _wrap(self, handle):
        flaky = self

        class Stub:
            def __init__(self, real):
                self._real = real

            def __getattr__(self, name):
                return getattr(self._real, name)

            def CreateGroupPart(self, *args, **kwargs):  # noqa: N802
                if flaky.left > 0:
                    flaky.left -= 1
                    raise _FlakyCreates.Timeout()
                return self._real.CreateGroupPart(*args, **kwargs)

        class Handle:
            name, address = handle.name, handle.address

            def stub(self):
                return Stub(handle.stub())

        return Handle()


def test_a_dispatch_that_failed_on_a_server_is_retried_onto_a_working_group(suite):
    """A Hydrogen job whose group could not be made (a server timed out) stays queued; the next decision makes
    it a group that exists and runs its tasks (the failed attempt's request id must not answer with a dead one)."""
    running, address, jobs, orch, register = start_irm(suite, "fcfs_min", period=0.2)
    try:
        flaky = _FlakyCreates(register.manager.orch, 1)
        job = jobs.RegisterJob(deadline_job("j", 60.0, size=4, min_devices=2, max_devices=2))
        assert flaky.left == 0 and job.state == jp.Job.STATE_QUEUED and job.group_id == ""
        get = lambda: jobs.GetJob(jp.GetJobRequest(tenant="alice", job_id=job.id))  # noqa: E731
        active = eventually(lambda: (lambda j: j if j.state == jp.Job.STATE_ACTIVE else None)(get()),
                            what="the job dispatched by a later decision")
        assert group_size(orch, "alice", active.group_id) == 2
        with VirtualFpga.attach(address, "alice", active.group_id) as f:
            assert len(f.map([{"duration": 0.01}] * 4)) == 4
    finally:
        stop_irm(running, register)


def test_concurrent_registrations_under_the_lookahead_lose_no_job_and_overbook_no_device(suite):
    """managed_lookahead live over gRPC: 4 tenants register 16 jobs at once while the control loop decides;
    every registration answers (each decision's search is bounded by its budget), every job is queued or
    active, the active ones hold at most the 8 devices, and all of them end up dispatched once others retire."""
    running, address, jobs, orch, register = start_irm(suite, "managed_lookahead", period=0.2, pool_min=8,
                                                       lookahead_budget_s=0.05)
    try:
        def reg(i: int) -> jp.Job:
            return jobs.RegisterJob(deadline_job(f"c{i}", 120.0, size=10, tenant=f"t{i % 4}", min_devices=1,
                                                 max_devices=2, action_seconds=TASK_S), timeout=30)

        with ThreadPoolExecutor(8) as pool:
            made = list(pool.map(reg, range(16)))
        assert len({j.id for j in made}) == 16
        assert {j.state for j in made} <= {jp.Job.STATE_ACTIVE, jp.Job.STATE_QUEUED}

        def listed() -> list[jp.Job]:
            return [j for t in range(4) for j in jobs.ListJobs(jp.ListJobsRequest(tenant=f"t{t}", active_only=True),
                                                               timeout=30).jobs]

        def active() -> list[jp.Job]:
            return [j for j in listed() if j.state == jp.Job.STATE_ACTIVE]

        assert len(listed()) == 16 and 1 <= sum(j.devices for j in active()) <= 8
        # Retire the active jobs as they come: the queue drains onto the devices they free.
        retired: set[str] = set()

        def drain() -> bool:
            for j in active():
                jobs.RetireJob(jp.RetireJobRequest(tenant=j.tenant, job_id=j.id), timeout=30)
                retired.add(j.id)
            return len(retired) == 16

        eventually(drain, what="every job dispatched and retired", timeout=60)
        assert listed() == []
    finally:
        stop_irm(running, register)


def test_watch_jobs_streams_a_queued_job_until_it_is_dispatched_and_retires(suite):
    running, address, jobs, orch, register = start_irm(suite, "fcfs_min", period=0.2)
    try:
        big = jobs.RegisterJob(deadline_job("big", 120.0, size=10, min_devices=8, max_devices=8))
        w = jobs.RegisterJob(deadline_job("w", 120.0, size=10))
        assert (big.state, w.state) == (jp.Job.STATE_ACTIVE, jp.Job.STATE_QUEUED)
        # The whole tenant: the jobs not retired, as they are now.
        everyone = jobs.WatchJobs(jp.WatchJobsRequest(tenant="alice"), timeout=30)
        assert {next(everyone).id, next(everyone).id} == {big.id, w.id}
        everyone.cancel()
        stream = jobs.WatchJobs(jp.WatchJobsRequest(tenant="alice", job_id=w.id), timeout=30)
        assert next(stream).state == jp.Job.STATE_QUEUED            # its state now, first
        jobs.RetireJob(jp.RetireJobRequest(tenant="alice", job_id=big.id))
        seen = next(j for j in stream if j.state != jp.Job.STATE_QUEUED)
        assert seen.state == jp.Job.STATE_ACTIVE and seen.devices == 1 and seen.dispatched_at > 0
        with VirtualFpga.attach(address, "alice", seen.group_id) as f:      # progress the servers count
            f.map([{"duration": 0.01}] * 3)
        assert next(j for j in stream if j.completed_actions >= 3).state == jp.Job.STATE_ACTIVE
        jobs.RetireJob(jp.RetireJobRequest(tenant="alice", job_id=w.id))
        rest = list(stream)                                          # ends once the job has retired
        assert rest and rest[-1].state == jp.Job.STATE_RETIRED
        # A retired job: its last state, then the end.
        assert [j.state for j in jobs.WatchJobs(jp.WatchJobsRequest(tenant="alice", job_id=w.id), timeout=30)] \
            == [jp.Job.STATE_RETIRED]
        for tenant, job_id, code in [("alice", "job-unknown", grpc.StatusCode.NOT_FOUND),
                                     ("mallory", w.id, grpc.StatusCode.PERMISSION_DENIED)]:
            with pytest.raises(grpc.RpcError) as e:
                next(jobs.WatchJobs(jp.WatchJobsRequest(tenant=tenant, job_id=job_id), timeout=30))
            assert e.value.code() == code
    finally:
        stop_irm(running, register)


def test_watch_jobs_is_capped_and_ends_unavailable_when_the_manager_stops(suite):
    running, address, jobs, orch, register = start_irm(suite, "edf", period=0.2)
    try:
        # Four tenants, four streams each (the most one tenant may hold): the manager's 16.
        tenants = ["alice", "bob", "carol", "dave", "erin"]
        mine = {t: jobs.RegisterJob(deadline_job("w", 120.0, size=10, tenant=t)) for t in tenants}
        job = mine["alice"]

        def watch(tenant: str = "alice"):  # noqa: ANN202
            return jobs.WatchJobs(jp.WatchJobsRequest(tenant=tenant, job_id=mine[tenant].id), timeout=30)
        streams = [watch(t) for t in tenants[:4] for _ in range(4)]
        assert [next(s).id for s in streams] == [mine[t].id for t in tenants[:4] for _ in range(4)]
        with pytest.raises(grpc.RpcError) as e:                    # one too many: refused, not a stuck server
            next(watch("erin"))
        assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "16 WatchJobs" in e.value.details()
        assert jobs.GetJob(jp.GetJobRequest(tenant="alice", job_id=job.id), timeout=5).id == job.id
        for s in streams[1:]:
            s.cancel()

        def opens() -> bool:
            s = watch()
            try:
                return next(s).id == job.id
            except grpc.RpcError as err:
                assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
                return False
            finally:
                s.cancel()

        eventually(opens, what="a slot freed by the cancelled streams")
        # The manager stops: an open stream ends UNAVAILABLE (not OK, which would read as "retired"), and so
        # does one opened after.
        register.manager.stop()
        with pytest.raises(grpc.RpcError) as e:
            list(streams[0])
        assert e.value.code() == grpc.StatusCode.UNAVAILABLE
        with pytest.raises(grpc.RpcError) as e:
            list(watch())
        assert e.value.code() == grpc.StatusCode.UNAVAILABLE
    finally:
        stop_irm(running, register)


def test_a_job_client_reports_what_completed_so_a_crashed_servers_lost_counts_do_not_keep_the_job(suite):
    # Session 24's review: the servers' counters since the manager's last read die with a server killed -9; a
    # deadline job that ran its whole size then never retired, holding its devices. A JobFpga reports what it saw
    # complete. (A control period of an hour: the manager reads the counters only on events.)
    from irm_fpga.job_client import JobFpga

    running, address, jobs, _, register = start_irm(suite, "edf", period=3600.0)
    try:
        job = jobs.RegisterJob(deadline_job("crash", 600.0, size=20, max_devices=2))
        fpga = JobFpga.attach_job(address, "alice", job.id, report_s=0)     # reports when closed, here
        outcomes = fpga.map([{"duration": 0.01}] * 20)
        assert len(outcomes) == 20 and fpga.completed == 20
        for server in register.servers:
            server.kill()                                                     # their counters die with them
        fpga.close(detach=False)
        done = jobs.GetJob(jp.GetJobRequest(tenant="alice", job_id=job.id))
        assert done.state == jp.Job.STATE_RETIRED and done.completed_actions == 20
        with pytest.raises(RuntimeError, match="is STATE_RETIRED: only an active job has a group"):
            JobFpga.attach_job(address, "alice", job.id)
    finally:
        stop_irm(running, register)


def test_a_job_client_reports_its_progress_while_it_runs(suite):
    from irm_fpga.job_client import JobFpga

    running, address, jobs, _, register = start_irm(suite, "edf", period=3600.0)
    try:
        job = jobs.RegisterJob(deadline_job("live", 600.0, size=30, max_devices=2))
        with JobFpga.attach_job(address, "alice", job.id, report_s=0.05) as fpga:
            fpga.map([{"duration": 0.01}] * 10)
            seen = eventually(lambda: [j for j in [jobs.GetJob(jp.GetJobRequest(tenant="alice", job_id=job.id))]
                                       if j.completed_actions >= 10], what="the first 10 actions reported")
            assert seen[0].state == jp.Job.STATE_ACTIVE
            # A result for no task of this client's waiting (an id it no longer knows) counts for nothing.
            fpga._complete([fpga_pb2.TaskResult(id=10 ** 9, kind=fpga_pb2.Task.KIND_RUN)])
            assert fpga.completed == 10
            fpga.map([{"duration": 0.01}] * 20)
            eventually(lambda: jobs.GetJob(jp.GetJobRequest(tenant="alice", job_id=job.id)).state
                       == jp.Job.STATE_RETIRED, what="the job retired at its size, its client still open")
            assert fpga.report() is False                   # a retired job takes no more reports: they stop
    finally:
        stop_irm(running, register)
