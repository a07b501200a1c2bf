"""Review 13 of the FPGA job manager (irm_fpga/jobs.py), over the fake Orchestrator on SQLite and PostgreSQL:

1. a stalled WatchJobs stream holds neither other tenants' changes nor every change of its own jobs;
2. EDF gives devices that come back (another group deleted, a server back) to its jobs in the next round;
3. a ListJobs page ends at ~3 MiB, under a client's 4 MiB receive limit;
4. a request_id reused with another request is INVALID_ARGUMENT (jobs from before the hash: as before);
5. Hydrogen: a tenant's ready queue is capped, and a decision reads the window's jobs, not the whole queue.
"""

from __future__ import annotations

import time
from types import SimpleNamespace

import grpc
import pytest
from alembic import command
from alembic.config import Config
from sqlalchemy import text

from harness.v1 import fpga_jobs_pb2 as jp
from harness.v1 import fpga_jobs_pb2_grpc
from irm_fpga import jobs as jobs_mod
from irm_fpga import jobs_watch
from irm_fpga.jobs import SERVICE, JobManager, JobsConfig
from irm_fpga.orchestrator import MIGRATIONS
from services import errors
from services import server as srv
from services.db import Database
from services.errors import InvalidArgument, ResourceExhausted, field_violations
from services.server import Component
from services.tls import plain_channel
from tests.integration.fake_orchestrator import DEVICES, Irm, deadline

TIMEOUT = 20.0


def client() -> SimpleNamespace:
    """A WatchJobs caller that stays connected (and, in these tests, stops reading) for TIMEOUT s at most: a stream
    that does not end by itself ends then, so a test fails instead of hanging."""
    until = time.monotonic() + TIMEOUT
    return SimpleNamespace(is_active=lambda: time.monotonic() < until)


def register(irm: Irm, tenant: str, request_id: str, **kw) -> jp.Job:
    return irm.manager.register(jp.RegisterJobRequest(tenant=tenant, request_id=request_id, design="sleep", **kw))


def in_order(irm: Irm, make):  # noqa: ANN001, ANN201
    """`make()`, the clock a millisecond later (jobs registered at one instant are listed by their random ids)."""
    irm.clock.advance(0.001)
    return make()


def pending(irm: Irm) -> list[int]:
    """Events each open WatchJobs stream has queued and not yet sent."""
    return [s.qsize() for s in irm.manager.watchers._subs]


def serve(manager: JobManager):  # noqa: ANN201
    """The manager behind a real gRPC server (errors mapped to their status codes, as in production)."""
    running = srv.start("127.0.0.1:0", [Component(
        name="fpga-jobs", register=lambda s: fpga_jobs_pb2_grpc.add_FpgaJobsServicer_to_server(manager, s),
        service_names=[SERVICE])])
    channel = plain_channel(f"127.0.0.1:{running.port}")
    return running, channel, fpga_jobs_pb2_grpc.FpgaJobsStub(channel)


# -- 1. WatchJobs memory ------------------------------------------------------------------------------------


def test_a_stalled_watch_holds_none_of_another_tenants_changes(irm_factory):
    irm = irm_factory("edf")
    alices = irm.register("a", **deadline(600.0, 10**6))
    mallorys = register(irm, "mallory", "m", **deadline(900.0, 10))
    stream = irm.manager.WatchJobs(jp.WatchJobsRequest(tenant="mallory"), client())
    assert next(stream).id == mallorys.id          # subscribed; from here the client stops reading
    for i in range(1000):                          # alice's job changes (progress, throughput: every period)
        irm.manager._update(alices.id, achieved_throughput=float(i))
    assert pending(irm) == [0]                     # filtered at publish: nothing of alice's queued for mallory
    irm.manager._update(mallorys.id, reported_actions=3)
    got = next(stream)
    assert (got.id, got.completed_actions) == (mallorys.id, 3)
    stream.close()


def test_a_stalled_watch_keeps_only_the_latest_state_of_each_of_its_jobs(irm_factory):
    irm = irm_factory("edf")
    a = irm.register("a", **deadline(600.0, 10**6))
    b = irm.register("b", **deadline(700.0, 10**6))
    everyone = irm.manager.WatchJobs(jp.WatchJobsRequest(tenant="alice"), client())
    one = irm.manager.WatchJobs(jp.WatchJobsRequest(tenant="alice", job_id=b.id), client())
    assert {next(everyone).id, next(everyone).id} == {a.id, b.id}
    assert next(one).id == b.id
    for i in range(1000):
        irm.manager._update(a.id, achieved_throughput=float(i))
        irm.manager._update(b.id, achieved_throughput=float(i) / 2)
    assert sorted(pending(irm)) == [1, 2]          # one pending state per job (not 2000 and 1000 messages)
    got = [next(everyone), next(everyone)]
    assert [(j.id, j.achieved_throughput) for j in got] == [(a.id, 999.0), (b.id, 499.5)]
    assert next(one).achieved_throughput == 499.5
    irm.manager.retire("alice", b.id)
    assert [j.state for j in one] == [jp.Job.STATE_RETIRED]      # its last state, then the end (as before)
    everyone.close()


def test_a_watch_behind_more_jobs_than_its_backlog_ends_resource_exhausted(irm_factory, monkeypatch):
    monkeypatch.setattr(jobs_watch, "MAX_WATCH_BACKLOG", 2)
    irm = irm_factory("edf")
    mine = [in_order(irm, lambda i=i: irm.register(f"j{i}", **deadline(600.0 + i, 10**6))) for i in range(4)]
    stalled = irm.manager.WatchJobs(jp.WatchJobsRequest(tenant="alice"), client())
    reading = irm.manager.WatchJobs(jp.WatchJobsRequest(tenant="alice", job_id=mine[0].id), client())
    snapshot = [next(stalled) for _ in mine]
    assert [j.id for j in snapshot] == [j.id for j in mine] and next(reading).id == mine[0].id
    for i, job in enumerate(mine[:3]):             # a third job changing while two are pending: cut off
        irm.manager._update(job.id, achieved_throughput=float(i + 1))
    held = []
    with pytest.raises(ResourceExhausted, match="the stream fell behind.*reconnect and re-list") as behind:
        held.extend(stalled)                       # what it held, then the end with its status
    assert behind.value.reason == "STREAM_BEHIND"  # not STREAM_CAP: reconnect now, no need to close a stream
    assert [j.id for j in held] == [mine[0].id, mine[1].id]
    assert next(reading).achieved_throughput == 1.0     # a stream that keeps up is not cut off with it
    again = irm.manager.WatchJobs(jp.WatchJobsRequest(tenant="alice"), client())
    assert [next(again).achieved_throughput for _ in mine] == [1.0, 2.0, 3.0, 0.0]     # reconnected: as they are
    reading.close()
    again.close()


# -- 2. EDF and devices that come back ----------------------------------------------------------------------


def test_edf_gives_devices_another_group_gave_back_to_its_jobs_in_the_next_round(irm_factory):
    irm = irm_factory("edf")
    other = irm.orch.create_group("bob", "bobs-group", "sleep", DEVICES - 2)    # a plain group: 6 of the 8
    job = irm.register("urgent", **deadline(60.0, 100_000))
    assert irm.job(job.id).devices == 2
    irm.clock.advance(1.0)
    irm.manager.control_once()                     # the start-up round: EDF's decision again, nothing changes
    assert irm.job(job.id).devices == 2
    decisions = []
    rebalance = irm.manager._rebalance
    irm.manager._rebalance = lambda *a, **kw: (decisions.append(a[0]), rebalance(*a, **kw))[1]
    for _ in range(3):                             # rounds with the pool unchanged decide nothing
        irm.clock.advance(1.0)
        irm.manager.control_once()
    assert decisions == []
    irm.orch.delete(other)                         # bob gives his 6 devices back
    irm.clock.advance(1.0)
    irm.manager.control_once()
    assert irm.job(job.id).devices == DEVICES and irm.manager.pool_devices() == DEVICES
    assert len(decisions) == 1
    irm.orch.capacity = {"s1": DEVICES - 3}        # three devices blacklisted: the pool shrinks, so does the job
    irm.clock.advance(1.0)
    irm.manager.control_once()
    assert irm.job(job.id).devices == DEVICES - 3 and len(decisions) == 2


# -- 3. ListJobs pages under 4 MiB -------------------------------------------------------------------------


def test_a_list_jobs_page_ends_at_3_mib_and_the_pages_hold_every_job_once(irm_factory):
    irm = irm_factory("edf")
    history = [[1000.0 + i, 1 + i % 8] for i in range(jobs_mod.MAX_ALLOCATIONS)]   # the longest a job keeps
    made = []
    for i in range(320):                           # 320 x ~14 KB: over a client's 4 MiB in one page
        j = in_order(irm, lambda i=i: irm.register(f"r{i}", **deadline(600.0, 10)))
        irm.manager._update(j.id, allocations=history)
        irm.manager.retire("alice", j.id)
        made.append(j.id)
    running, channel, stub = serve(irm.manager)
    try:
        listed, token, pages = [], "", []
        while True:                                # a client with the default 4 MiB receive limit
            page = stub.ListJobs(jp.ListJobsRequest(tenant="alice", page_size=1000, page_token=token), timeout=30)
            pages.append((len(page.jobs), page.ByteSize()))
            listed += [j.id for j in page.jobs]
            token = page.next_page_token
            if not token:
                break
        assert listed == made                      # every job once, in registration order
        assert len(pages) >= 2 and all(size <= 3 * 2**20 + 4096 for _, size in pages), pages
    finally:
        channel.close()
        running.stop(grace=0)


def test_a_list_jobs_page_holds_at_least_one_job_whatever_its_size(irm_factory, monkeypatch):
    irm = irm_factory("edf")
    made = [in_order(irm, lambda i=i: irm.register(f"r{i}", **deadline(600.0 + i, 10))).id for i in range(3)]
    monkeypatch.setattr(jobs_mod, "MAX_LIST_BYTES", 1)
    listed, token = [], ""
    for _ in range(10):
        page = irm.manager.ListJobs(jp.ListJobsRequest(tenant="alice", page_token=token), None)
        assert len(page.jobs) == 1
        listed.append(page.jobs[0].id)
        token = page.next_page_token
        if not token:
            break
    assert listed == made


# -- 4. request_id reused with another request ------------------------------------------------------------


@pytest.mark.parametrize("policy", ["edf", "fcfs_min"])
def test_a_request_id_reused_with_another_request_is_invalid_argument_naming_it(irm_factory, policy):
    irm = irm_factory(policy)
    job = irm.register("r1", min_devices=1, **deadline(60.0, 30))
    assert irm.register("r1", min_devices=1, **deadline(60.0, 30)).id == job.id      # a retry: its job
    for changed in [dict(min_devices=2, **deadline(60.0, 30)), dict(min_devices=1, **deadline(61.0, 30)),
                    dict(min_devices=1, **deadline(60.0, 31)), dict(min_devices=1, priority=5, **deadline(60.0, 30)),
                    dict(min_devices=1, action_seconds=0.5, **deadline(60.0, 30))]:
        with pytest.raises(InvalidArgument) as e:
            irm.register("r1", **changed)
        assert [v.field for v in e.value.violations] == ["request_id"], changed
    # Through gRPC: INVALID_ARGUMENT, its field violation on request_id; another tenant's r1 is its own.
    running, channel, stub = serve(irm.manager)
    try:
        with pytest.raises(grpc.RpcError) as rpc:
            stub.RegisterJob(jp.RegisterJobRequest(tenant="alice", request_id="r1", design="sleep", min_devices=1,
                                                   deadline=jp.DeadlineGoal(deadline_s=60.0, size_actions=99)))
        assert rpc.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "request_id" in rpc.value.details()
        assert [f for f, _ in field_violations(rpc.value)] == ["request_id"]
        bobs = stub.RegisterJob(jp.RegisterJobRequest(tenant="bob", request_id="r1", design="sleep",
                                                      deadline=jp.DeadlineGoal(deadline_s=60.0, size_actions=99)))
        assert bobs.id != job.id
    finally:
        channel.close()
        running.stop(grace=0)
    irm.restart()                                   # the hash is kept in the database
    assert irm.register("r1", min_devices=1, **deadline(60.0, 30)).id == job.id
    with pytest.raises(InvalidArgument, match="request_id"):
        irm.register("r1", min_devices=1, **deadline(60.0, 32))


BEFORE_THE_HASH = "b8d4f0a6c2e1"


def test_jobs_registered_before_the_hash_replay_unchecked(db_url):
    db = Database(db_url)
    try:
        cfg = Config()
        cfg.set_main_option("script_location", str(MIGRATIONS))
        cfg.attributes["version_table"] = "alembic_version_fpga"
        with db.engine.connect() as conn:
            cfg.attributes["connection"] = conn
            command.upgrade(cfg, BEFORE_THE_HASH)
            conn.commit()
        with db.engine.begin() as conn:             # a retired job as the schema before the hash held it
            conn.execute(text(
                "INSERT INTO fpga_jobs (id, tenant, request_id, design, group_id, policy, goal, deadline_s, "
                "deadline_at, size_actions, action_seconds, throughput_goal, min_devices, max_devices, priority, "
                "state, devices, observed_actions, reported_actions, achieved_throughput, allocations, "
                "registered_at, retired_at) VALUES ('job-00000000000000aa', 'alice', 'old', 'sleep', '', 'edf', "
                "'deadline', 60, 1060, 10, 0, 0, 1, 0, 1, 'retired', 0, 10, 0, 0, '[]', 1000, 1010)"))
    finally:
        db.dispose()
    irm = Irm(db_url, "edf")                        # migrates to the head: the old row's hash is ""
    try:
        assert irm.register("old", **deadline(999.0, 5)).id == "job-00000000000000aa"     # as before: its job
        new = irm.register("new", **deadline(60.0, 5))
        with pytest.raises(InvalidArgument, match="request_id"):
            irm.register("new", **deadline(60.0, 6))
        assert irm.register("new", **deadline(60.0, 5)).id == new.id
    finally:
        irm.close()


# -- 5. Hydrogen: the ready queue ------------------------------------------------------------------------


def test_a_tenants_ready_queue_is_capped_by_a_setting_named_in_the_refusal(irm_factory):
    irm = irm_factory("fcfs_min", max_queued_per_tenant=3)
    hog = irm.register("hog", min_devices=DEVICES, **deadline(3600.0, 10**9))     # holds every device
    queued = [irm.register(f"q{i}", **deadline(600.0, 100)) for i in range(3)]
    assert {irm.job(j.id).state for j in queued} == {"queued"}
    with pytest.raises(ResourceExhausted, match=r"'alice' already has 3 jobs waiting in the ready queue.*"
                                                r"jobs_max_queued_per_tenant = 3"):
        irm.register("q3", **deadline(600.0, 100))
    assert irm.register("q0", **deadline(600.0, 100)).id == queued[0].id     # a retry still gets its job
    assert register(irm, "bob", "b0", **deadline(600.0, 100)).state == "queued"   # the cap is per tenant
    irm.manager.retire("alice", queued[0].id)       # room again
    assert irm.register("q3", **deadline(600.0, 100)).state == "queued"
    irm.manager.retire("alice", hog.id)             # dispatched jobs no longer count
    assert irm.job(queued[1].id).state == "active"
    assert irm.register("q4", **deadline(600.0, 100)).state in ("queued", "active")
    running, channel, stub = serve(irm.manager)
    try:
        for i in range(5, 12):
            try:
                stub.RegisterJob(jp.RegisterJobRequest(tenant="carol", request_id=f"c{i}", design="sleep",
                                                       min_devices=DEVICES,
                                                       deadline=jp.DeadlineGoal(deadline_s=600, size_actions=9)))
            except grpc.RpcError as e:
                assert e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "jobs_max_queued_per_tenant" in e.details()
                assert errors.error_info(e)[0] == "QUEUE_FULL"      # machine-readable over the wire
                break
        else:
            pytest.fail("carol's queue was not capped")
    finally:
        channel.close()
        running.stop(grace=0)


@pytest.mark.parametrize("bad", [0, -1, 2.5])
def test_the_queue_cap_setting_is_checked(irm_factory, bad):
    irm = irm_factory("edf")
    with pytest.raises(ValueError, match="max_queued_per_tenant"):
        JobManager(irm.orch, JobsConfig(policy="fcfs_min", max_queued_per_tenant=bad))


def test_a_decision_reads_the_windows_jobs_not_the_whole_queue(irm_factory, monkeypatch):
    irm = irm_factory("fcfs_min", window=4, max_queued_per_tenant=100)
    irm.register("hog", min_devices=DEVICES, **deadline(3600.0, 10**9))
    seen: list[list[str]] = []
    decide = jobs_mod.dispatch.decide

    def spy(s, queue, **kw):  # noqa: ANN001, ANN202
        seen.append([j.job_id for j in queue])
        return decide(s, queue, **kw)

    monkeypatch.setattr(jobs_mod.dispatch, "decide", spy)
    queued = [in_order(irm, lambda i=i: irm.register(f"q{i}", **deadline(600.0, 100))).id for i in range(40)]
    assert len(seen) == 40                         # every arrival decides (beyond the window too), as before
    assert seen[-1] == queued[:4]                  # ... over the window's jobs only
    irm.clock.advance(0.5)                         # none of them late yet (the first arrived 0.539 s ago)
    irm.manager.control_once()
    assert len(seen) == 40                         # a round with nothing changed decides nothing
    irm.clock.advance(1.0)                         # the queue's jobs turn late: an event
    irm.manager.control_once()
    assert len(seen) == 41


def test_the_window_leaves_out_jobs_wider_than_the_devices_now(irm_factory):
    """`decide` drops jobs wider than `hi` before it takes its window: the window read from the database too."""
    irm = irm_factory("fcfs_min", window=2)
    hog = irm.register("hog", min_devices=DEVICES, **deadline(3600.0, 10**9))
    wide = in_order(irm, lambda: irm.register("wide", min_devices=6, **deadline(600.0, 100)))
    a = in_order(irm, lambda: irm.register("a", **deadline(600.0, 100)))
    b = in_order(irm, lambda: irm.register("b", **deadline(600.0, 100)))
    irm.orch.capacity = {"s1": 4}                  # four devices blacklisted: "wide" fits no more
    irm.manager.retire("alice", hog.id)
    assert [irm.job(j.id).state for j in (wide, a, b)] == ["queued", "active", "active"]
