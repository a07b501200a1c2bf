"""Review 12 of the FPGA job manager: servers taken as gone, bounded histories and errors, the shared cost model,
per-tenant watches, and the job table's indexes.

FPGA-servers are real processes where the Orchestrator's calls to them are the subject (a partition is a server
handle pointed at an address nothing answers on); elsewhere the job manager runs over the fake Orchestrator.
"""

from __future__ import annotations

from types import SimpleNamespace

import grpc
import pytest
from sqlalchemy import inspect

from harness.v1 import fpga_jobs_pb2 as jp
from harness.v1 import fpga_jobs_pb2_grpc, fpga_pb2, fpga_pb2_grpc
from irm_fpga.job_models import FpgaJob
from irm_fpga.jobs import MAX_ALLOCATIONS, MAX_WATCHES_PER_TENANT, capped_history, mean_devices
from irm_fpga.orchestrator import MIGRATIONS, Orchestrator, OrchestratorConfig
from services import server as srv
from services.db import Database
from services.errors import (
    MAX_MESSAGE_BYTES,
    FieldViolation,
    InvalidArgument,
    NotFound,
    ResourceExhausted,
    field_violations,
)
from services.server import Component
from services.tls import plain_channel
from tests.integration.fake_orchestrator import deadline
from tests.integration.test_fpga_jobs import deadline_job, start_irm, stop_irm

FAST = {"devices": 4, "reconfig_mean_s": 0.01, "reconfig_std_s": 0.0}
NOWHERE = "127.0.0.1:9"        # nothing answers there: a partition


def held(address: str) -> dict[str, int]:
    """The parts an FPGA-server holds, asked of it directly: group -> devices."""
    stub = fpga_pb2_grpc.FpgaServerStub(plain_channel(address))
    return {p.group_id: p.target for p in stub.GetServer(fpga_pb2.GetServerRequest(), timeout=10).groups}


# -- 1. a server taken as gone ---------------------------------------------------------------------------


@pytest.fixture
def two_servers(suite):
    return {name: suite.start("fpga-server", name=name, **FAST) for name in ("A", "B")}


def test_a_shrink_cuts_the_parts_of_a_silent_server_first_without_calling_it_and_reconcile_sets_them(
        two_servers, db_url):
    o = Orchestrator(OrchestratorConfig(servers=[p.address for p in two_servers.values()], database=db_url,
                                        autoscaler="none", reconcile_interval_s=0, server_timeout_s=2.0))
    try:
        o._discover_servers(strict=True)
        g = o.create_group("alice", "g", "sleep", 8)
        assert g.parts == {"A": 4, "B": 4}
        b = o.servers["B"].address
        o.servers["B"].address = NOWHERE                       # B stops answering
        shrunk = o.resize(o._group(g.id), 5)
        assert shrunk.parts == {"A": 4, "B": 1}                # B's part cut first (recorded), A's kept whole
        assert held(two_servers["A"].address) == {g.id: 4}
        shrunk = o.resize(o._group(g.id), 3)
        assert shrunk.parts == {"A": 3, "B": 0}                # B's to nothing first, then A's
        assert held(two_servers["A"].address) == {g.id: 3}
        assert held(b) == {g.id: 4}                            # B was never called
        o.servers["B"].address = b                             # back: the reconcile round sets its part
        assert o.reconcile_once() == {"made": 1, "dropped": 0}
        assert held(b) == {g.id: 0}
        assert o.reconcile_once() == {"made": 0, "dropped": 0}
        assert o.resize(o._group(g.id), 8).parts == {"A": 4, "B": 4}      # and the group grows there again
        assert held(b) == {g.id: 4}
    finally:
        o.stop()


def _partition(register, server: str) -> str:
    """Point the Orchestrator's handle of `server` where nothing answers; its real address is returned."""
    handle = register.manager.orch.servers[server]
    address, handle.address = handle.address, NOWHERE
    return address


def group_parts(orch, group_id: str) -> dict[str, int]:
    return dict(orch.GetGroup(fpga_pb2.GetGroupRequest(tenant="alice", group_id=group_id)).parts)


def test_edf_resizes_jobs_with_parts_on_a_gone_server_and_the_server_gets_the_recorded_size_back(suite):
    running, _, jobs, orch, register = start_irm(suite, "edf", period=3600.0, silent_server_s=0.0)
    try:
        a = jobs.RegisterJob(deadline_job("a", 100.0, size=10**6))
        assert group_parts(orch, a.group_id) == {"fpga-0": 4, "fpga-1": 4}
        fpga1 = _partition(register, "fpga-1")              # taken as gone at once (silent_server_s=0)
        b = jobs.RegisterJob(deadline_job("b", 50.0, size=10**6))
        # EDF over the 4 devices left: one each, the rest to b's earlier deadline; a's gone part cut first.
        assert b.state == jp.Job.STATE_ACTIVE and b.devices == 3
        a = jobs.GetJob(jp.GetJobRequest(tenant="alice", job_id=a.id))
        assert a.devices == 1 and group_parts(orch, a.group_id) == {"fpga-0": 1}
        assert held(fpga1) == {a.group_id: 4}                # nobody could tell it
        register.manager.orch.servers["fpga-1"].address = fpga1
        register.manager.orch.reconcile_once()
        assert held(fpga1) == {a.group_id: 0}                # the recorded size, once it answers
        jobs.RetireJob(jp.RetireJobRequest(tenant="alice", job_id=b.id))
        a = jobs.GetJob(jp.GetJobRequest(tenant="alice", job_id=a.id))
        assert a.devices == 8 and group_parts(orch, a.group_id) == {"fpga-0": 4, "fpga-1": 4}
        assert held(fpga1) == {a.group_id: 4}
    finally:
        stop_irm(running, register)


def test_edf_counts_only_the_live_devices_of_a_job_whose_server_is_gone(suite):
    servers = [suite.start("fpga-server", name=f"fpga-{i}", **FAST) for i in range(3)]
    running, _, jobs, orch, register = start_irm(suite, "edf", period=3600.0, servers=servers, silent_server_s=0.0)
    try:
        a = jobs.RegisterJob(deadline_job("a", 50.0, size=10**6, max_devices=8))
        assert group_parts(orch, a.group_id) == {"fpga-0": 4, "fpga-1": 4}
        _partition(register, "fpga-1")
        b = jobs.RegisterJob(deadline_job("b", 100.0, size=10**6))
        # 8 devices answer (fpga-0, fpga-2): one for b, seven for a's earlier deadline -- seven it really has,
        # not its recorded eight less one (which would keep its four gone devices and leave three idle).
        assert b.devices == 1
        a = jobs.GetJob(jp.GetJobRequest(tenant="alice", job_id=a.id))
        assert a.devices == 7 and group_parts(orch, a.group_id) == {"fpga-0": 4, "fpga-2": 3}
        assert group_parts(orch, b.group_id) == {"fpga-2": 1}
    finally:
        stop_irm(running, register)


def test_the_throughput_controller_resizes_a_job_with_parts_on_a_gone_server(suite):
    running, _, jobs, orch, register = start_irm(suite, "throughput", period=3600.0, silent_server_s=0.0)
    try:
        a = jobs.RegisterJob(jp.RegisterJobRequest(tenant="alice", request_id="a", design="sleep",
                                                   throughput=jp.ThroughputGoal(actions_per_s=25)))
        assert a.devices == 8
        _partition(register, "fpga-1")
        alloc = register.manager.control_once()
        assert 1 <= alloc[a.id] <= 4                         # the broker's pool: fpga-0's four
        a = jobs.GetJob(jp.GetJobRequest(tenant="alice", job_id=a.id))
        assert a.devices == alloc[a.id] and group_parts(orch, a.group_id) == {"fpga-0": a.devices}
    finally:
        stop_irm(running, register)


# -- 2. the allocation history is bounded ----------------------------------------------------------------


def test_the_allocation_history_keeps_its_first_and_latest_changes(irm_factory):
    irm = irm_factory("edf")
    a = irm.register("a", **deadline(1000.0, 10**6))
    first = irm.job(a.id).allocations[0]
    long = [first] + [[first[0] + i, 1 + i % 2] for i in range(1, 5000)]

    def write(s):  # noqa: ANN001, ANN202 - what years of resizes stored before the cap
        s.get(FpgaJob, a.id).allocations = long
    irm.orch.db.transact(write)
    assert len(irm.manager.to_proto(irm.job(a.id)).allocations) == MAX_ALLOCATIONS     # a row from before
    irm.clock.advance(10_000.0)
    irm.register("b", **deadline(10.0, 10**6))              # EDF resizes a: its history is written again
    history = irm.job(a.id).allocations
    assert len(history) == MAX_ALLOCATIONS
    assert history[0] == first and history[-1] == [irm.clock.now(), irm.job(a.id).devices] != long[-1]
    assert history[1:-1] == long[-(MAX_ALLOCATIONS - 2):]
    irm.clock.advance(1.0)
    retired = irm.manager.retire("alice", a.id)
    assert len(retired.allocations) == MAX_ALLOCATIONS and retired.allocations[-1] == [irm.clock.now(), 0]
    assert retired.allocations[0] == first


def test_a_capped_history_gives_the_same_mean_devices_over_the_current_period():
    # A pathological period with more changes than the cap: every change since the period began stays.
    history = [[0.0, 1]] + [[100.0 + i * 0.01, 1 + i % 7] for i in range(3 * MAX_ALLOCATIONS)]
    start, end = 100.0 + 0.01 * 500, 200.0
    kept = capped_history(history, keep_since=start)
    assert kept[0] == history[0] and len(kept) < len(history)
    assert mean_devices(kept, start, end, 3) == pytest.approx(mean_devices(history, start, end, 3))
    assert len(capped_history(history)) == MAX_ALLOCATIONS


# -- 3. the shared cost model learns from the servers' counters only ---------------------------------------


def test_a_tenants_reports_do_not_teach_the_shared_cost_model(irm_factory):
    irm = irm_factory("managed_deadline")
    for i, n in enumerate((1, 2)):      # bob: runs "done" by his own report a millisecond after dispatch
        j = irm.manager.register(jp.RegisterJobRequest(
            tenant="bob", request_id=f"b{i}", design="sleep", min_devices=n, max_devices=n,
            deadline=jp.DeadlineGoal(deadline_s=1000, size_actions=10**9)))
        assert irm.manager._job("bob", j.id).state == "active"
        irm.clock.advance(0.001)
        assert irm.manager.report("bob", j.id, 10**9).state == "retired"
    assert irm.manager.cost.observed("sleep", "alice") == {}
    irm.restart()                                           # nor when it relearns the history
    assert irm.manager.cost.observed("sleep", "alice") == {}
    # A run the servers counted to its size still teaches it.
    a = irm.register("a", min_devices=2, max_devices=2, action_seconds=1.0, **deadline(100.0, 10))
    irm.clock.advance(4.0)
    irm.complete(irm.job(a.id), 10)
    irm.manager.control_once()
    assert irm.job(a.id).state == "retired"
    assert irm.manager.cost.observed("sleep", "alice") == {2: (1, pytest.approx(0.4))}


# -- 4. WatchJobs slots per tenant -------------------------------------------------------------------------


def test_one_tenant_cannot_take_every_watch_job_stream(irm_factory):
    irm = irm_factory("edf")
    m = irm.manager
    irm.register("a", **deadline(100.0, 10))
    m.register(jp.RegisterJobRequest(tenant="bob", request_id="b", design="sleep",
                                     deadline=jp.DeadlineGoal(deadline_s=100, size_actions=10)))
    ctx = SimpleNamespace(is_active=lambda: True)
    opened = []
    try:
        for _ in range(MAX_WATCHES_PER_TENANT):
            w = m.WatchJobs(jp.WatchJobsRequest(tenant="alice"), ctx)
            assert next(w).tenant == "alice"
            opened.append(w)
        with pytest.raises(ResourceExhausted, match=f"tenant 'alice' already holds {MAX_WATCHES_PER_TENANT}.*"
                                                    "close one of your WatchJobs streams"):
            next(m.WatchJobs(jp.WatchJobsRequest(tenant="alice"), ctx))
        w = m.WatchJobs(jp.WatchJobsRequest(tenant="bob"), ctx)     # another tenant still watches
        assert next(w).tenant == "bob"
        opened.append(w)
        opened.pop(0).close()                               # alice closes one: she may open one again
        w = m.WatchJobs(jp.WatchJobsRequest(tenant="alice"), ctx)
        assert next(w).tenant == "alice"
        opened.append(w)
    finally:
        for w in opened:
            w.close()


# -- 5. long ids and bounded error messages ---------------------------------------------------------------


def test_ids_and_designs_too_long_are_refused_by_name_not_echoed(suite):
    running, _, jobs, orch, register = start_irm(suite, "edf", period=3600.0)
    try:
        long = "j" * 10_000
        calls = [
            ("job_id", lambda: jobs.GetJob(jp.GetJobRequest(tenant="alice", job_id=long))),
            ("job_id", lambda: jobs.RetireJob(jp.RetireJobRequest(tenant="alice", job_id=long))),
            ("job_id", lambda: jobs.ReportProgress(jp.ReportProgressRequest(tenant="alice", job_id=long,
                                                                             completed_actions=1))),
            ("job_id", lambda: next(jobs.WatchJobs(jp.WatchJobsRequest(tenant="alice", job_id=long)))),
            ("design", lambda: jobs.RegisterJob(jp.RegisterJobRequest(
                tenant="alice", request_id="r", design=long, deadline=jp.DeadlineGoal(deadline_s=10,
                                                                                     size_actions=1)))),
            ("group_id", lambda: orch.GetGroup(fpga_pb2.GetGroupRequest(tenant="alice", group_id=long))),
            ("group_id", lambda: orch.DeleteGroup(fpga_pb2.DeleteGroupRequest(tenant="alice", group_id=long))),
            ("design", lambda: orch.CreateGroup(fpga_pb2.CreateGroupRequest(tenant="alice", request_id="r",
                                                                            design=long, size=1))),
        ]
        for field, call in calls:
            with pytest.raises(grpc.RpcError) as e:
                call()
            assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT, (field, e.value.details()[:200])
            assert "at most 64 characters" in e.value.details() and long not in e.value.details()
            assert [f for f, _ in field_violations(e.value)] == [field]
    finally:
        stop_irm(running, register)


class _Echoes(fpga_jobs_pb2_grpc.FpgaJobsServicer):
    """A servicer whose errors echo what it was sent, however long."""

    def GetJob(self, request, context):  # noqa: N802
        raise NotFound(f"job {request.job_id!r} does not exist")

    def ListJobs(self, request, context):  # noqa: N802
        long = request.page_token
        raise InvalidArgument("; ".join(f"f{i}: {long}" for i in range(50)),
                              [FieldViolation(f"f{i}", long) for i in range(50)])


def test_an_error_that_echoes_a_huge_input_still_reaches_the_caller_bounded():
    running = srv.start("127.0.0.1:0", [Component(
        name="echo", register=lambda s: fpga_jobs_pb2_grpc.add_FpgaJobsServicer_to_server(_Echoes(), s),
        service_names=["harness.v1.FpgaJobs"])])
    try:
        stub = fpga_jobs_pb2_grpc.FpgaJobsStub(plain_channel(f"127.0.0.1:{running.port}"))
        # Percent-encoded on the wire, or not. Many times: trailers over gRPC's soft limit (8 KiB) are refused
        # only now and then.
        for text in ("é" * 50_000, "%" * 50_000, "x" * 100_000) * 20:
            with pytest.raises(grpc.RpcError) as e:
                stub.GetJob(jp.GetJobRequest(tenant="alice", job_id=text), timeout=10)
            assert e.value.code() == grpc.StatusCode.NOT_FOUND, e.value.details()[:200]
            assert e.value.details().startswith("job '") and "cut to fit a gRPC status" in e.value.details()
            assert len(e.value.details().encode()) <= MAX_MESSAGE_BYTES
            with pytest.raises(grpc.RpcError) as e:
                stub.ListJobs(jp.ListJobsRequest(tenant="alice", page_token=text), timeout=10)
            assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT, e.value.details()[:200]
            violations = field_violations(e.value)
            assert violations and violations[0][0] == "f0" and "cut to fit a gRPC status" in violations[0][1]
    finally:
        running.stop(grace=0)


# -- 6. the job table's indexes ----------------------------------------------------------------------------


def test_the_migrated_job_table_has_the_indexes_the_control_rounds_read_by(db_url):
    db = Database(db_url)
    try:
        db.migrate(MIGRATIONS, "alembic_version_fpga")
        indexes = {tuple(i["column_names"]) for i in inspect(db.engine).get_indexes("fpga_jobs")}
        assert {("state", "registered_at"), ("registered_at",), ("group_id",), ("tenant",)} <= indexes
    finally:
        db.dispose()

