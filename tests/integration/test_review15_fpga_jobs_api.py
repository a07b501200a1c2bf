"""Review 15 of the FPGA job manager's API (irm_fpga/jobs.py), over the fake Orchestrator on SQLite and PostgreSQL:

3. RegisterJob checks the request's fields before it counts devices: a malformed request is INVALID_ARGUMENT
   (every field named) even while no server answers or every device is blacklisted; its UNAVAILABLE carries reason
   MANAGER_UNAVAILABLE and a retry delay, its capacity refusal reason CAPACITY_IN_USE;
4. a job retired by its own ReportProgress counts the servers' last tasks and teaches the cost model;
5. an empty job_id is INVALID_ARGUMENT on job_id, not "job '' does not exist";
6. Job.policy is the policy managing the job now, after a restart under another.
"""

from __future__ import annotations

import time
from types import SimpleNamespace

import grpc
import pytest

from harness.v1 import fpga_jobs_pb2 as jp
from irm_fpga import jobs as jobs_mod
from irm_fpga.jobs import ACTIVE, RETIRED, JobManager, JobsConfig
from services.errors import (
    CAPACITY_IN_USE,
    MANAGER_UNAVAILABLE,
    InvalidArgument,
    ResourceExhausted,
    Unavailable,
    error_info,
    field_violations,
    retry_delay_s,
)
from tests.integration.fake_orchestrator import DEVICES, deadline
from tests.integration.test_fpga_jobs_review13_fixes import serve

# What the reviewer sent (/tmp/r1/repro3.py): an unknown design, no goal, a NaN priority, a negative minimum.
MALFORMED = {"tenant": "alice", "request_id": "bad1", "design": "nope", "priority": float("nan"), "min_devices": -5}
MALFORMED_FIELDS = {"design", "goal", "priority", "min_devices"}


def fields(e: InvalidArgument) -> set[str]:
    return {v.field for v in e.violations}


# -- 3. RegisterJob: fields first, reasons -------------------------------------------------------------------


@pytest.mark.parametrize("answering", [{}, {"s1": 0}], ids=["no-server-answers", "every-device-blacklisted"])
def test_a_malformed_registration_is_invalid_argument_whatever_the_servers_do(irm_factory, answering):
    irm = irm_factory("edf")
    irm.orch.capacity = answering
    with pytest.raises(InvalidArgument) as e:         # was UNAVAILABLE, or RESOURCE_EXHAUSTED
        irm.manager.register(jp.RegisterJobRequest(**MALFORMED))
    assert fields(e.value) == MALFORMED_FIELDS


def test_a_malformed_registration_names_the_device_counts_too_when_every_server_answers(irm_factory):
    irm = irm_factory("edf")
    with pytest.raises(InvalidArgument) as e:
        irm.manager.register(jp.RegisterJobRequest(**{**MALFORMED, "max_devices": DEVICES + 1}))
    assert fields(e.value) == MALFORMED_FIELDS | {"max_devices"}
    irm.orch.capacity = {}                            # unknown now: only the fields, at once
    with pytest.raises(InvalidArgument) as e:
        irm.manager.register(jp.RegisterJobRequest(**{**MALFORMED, "max_devices": DEVICES + 1}))
    assert fields(e.value) == MALFORMED_FIELDS


def test_a_malformed_registration_for_at_most_one_device_waits_for_no_server(irm_factory):
    irm = irm_factory("edf")
    asked = []
    real = irm.orch._free_total_capacity
    irm.orch._free_total_capacity = lambda: (asked.append(1), real())[1]      # a hung server: a timeout each
    with pytest.raises(InvalidArgument) as e:
        irm.manager.register(jp.RegisterJobRequest(**MALFORMED))
    assert fields(e.value) == MALFORMED_FIELDS and asked == []


def test_unavailable_from_the_job_api_says_manager_unavailable_with_a_retry_delay(irm_factory):
    irm = irm_factory("edf")
    irm.orch.capacity = {}                            # no server answers
    with pytest.raises(Unavailable) as no_server:
        irm.register("a", **deadline(60.0, 100))
    irm.orch.capacity = {"s2": 2}                     # s1 does not answer; the job is wider than s2's devices
    with pytest.raises(Unavailable) as too_wide:
        irm.register("b", min_devices=4, **deadline(60.0, 100))
    irm.orch.capacity = {"s1": DEVICES}
    held = irm.register("c", **deadline(60.0, 100))
    irm.orch.capacity = {}                            # s1, holding c's group, misses a round
    irm.orch.servers["s2"] = irm.server               # a second server, answering
    irm.orch.capacity = {"s2": DEVICES}
    with pytest.raises(Unavailable) as holding:
        irm.register("d", **deadline(60.0, 100))
    for e in (no_server, too_wide, holding):
        assert e.value.reason == MANAGER_UNAVAILABLE and e.value.retry_after_s > 0, e.value
    assert irm.job(held.id).devices == DEVICES


def test_a_registration_while_the_manager_loads_is_manager_unavailable(irm_factory, monkeypatch):
    irm = irm_factory("edf")
    monkeypatch.setattr(jobs_mod, "LOAD_WAIT_S", 0.0)
    loading = JobManager(irm.orch, JobsConfig(policy="edf"))          # not started: still loading
    with pytest.raises(Unavailable, match="still loading") as e:
        loading.register(jp.RegisterJobRequest(tenant="alice", request_id="a", design="sleep",
                                               **deadline(60.0, 100)))
    assert e.value.reason == MANAGER_UNAVAILABLE and e.value.retry_after_s > 0


def test_no_device_for_the_minimum_is_capacity_in_use_with_a_retry_delay(irm_factory):
    irm = irm_factory("edf")
    irm.orch.create_group("bob", "bobs", "sleep", DEVICES - 1)      # a plain group holds 7 of the 8
    with pytest.raises(ResourceExhausted, match="no device for the job's minimum") as e:
        irm.register("a", min_devices=2, **deadline(60.0, 100))
    assert e.value.reason == CAPACITY_IN_USE and e.value.retry_after_s > 0
    irm.register("one", **deadline(60.0, 100))        # the last device
    with pytest.raises(ResourceExhausted, match=r"the job's minimum \(1\) and the 1 active job\(s\)' minimums "
                                                r"\(1 device\(s\)\) need 2 device\(s\); the pool has 1") as e:
        irm.register("b", **deadline(30.0, 100))
    assert e.value.reason == CAPACITY_IN_USE and e.value.retry_after_s > 0


def test_a_refusal_names_the_minimums_that_do_not_fit(irm_factory):
    # Under EDF the earlier deadlines get their minimums first: the latest job's 3 would not fit. The message said
    # "does not fit beside one device for each of the 2 active job(s)", which 3 + 1 + 1 devices of 8 would.
    irm = irm_factory("edf")
    late = irm.register("late", min_devices=3, **deadline(100.0, 1000))
    irm.register("mid", min_devices=3, **deadline(50.0, 1000))
    with pytest.raises(ResourceExhausted) as e:
        irm.register("early", min_devices=3, **deadline(10.0, 1000))
    assert ("the job's minimum (3) and the 2 active job(s)' minimums (6 device(s)) need 9 device(s); the pool has "
            f"{DEVICES}: 'edf' would leave {late.id} without a device") in str(e.value)


def test_a_refusal_counts_other_tenants_jobs_without_naming_them(irm_factory):
    # Session 24's review: the refusal quoted another tenant's job id.
    irm = irm_factory("edf")
    irm.register("mid", min_devices=3, **deadline(100.0, 1000))
    bobs = irm.manager.register(jp.RegisterJobRequest(tenant="bob", request_id="b", design="sleep", min_devices=3,
                                                      **deadline(200.0, 1000)))
    with pytest.raises(ResourceExhausted) as e:
        irm.register("early", min_devices=3, **deadline(10.0, 1000))
    assert "'edf' would leave 1 job(s) of other tenants without a device" in str(e.value)
    assert bobs.id not in str(e.value)


def test_over_grpc_the_reason_and_the_retry_delay_reach_the_caller(irm_factory):
    irm = irm_factory("edf")
    irm.orch.capacity = {}
    running, channel, stub = serve(irm.manager)
    try:
        with pytest.raises(grpc.RpcError) as e:
            stub.RegisterJob(jp.RegisterJobRequest(tenant="alice", request_id="a", design="sleep",
                                                   **deadline(60.0, 100)), timeout=30)
        assert e.value.code() == grpc.StatusCode.UNAVAILABLE
        assert error_info(e.value)[0] == MANAGER_UNAVAILABLE and retry_delay_s(e.value) > 0
        with pytest.raises(grpc.RpcError) as e:
            stub.RegisterJob(jp.RegisterJobRequest(**MALFORMED), timeout=30)
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert {f for f, _ in field_violations(e.value)} == MALFORMED_FIELDS
    finally:
        channel.close()
        running.stop(grace=0)


def test_a_watch_ended_by_a_stopping_manager_says_manager_unavailable(irm_factory):
    irm = irm_factory("edf")
    job = irm.register("a", **deadline(60.0, 100))
    until = time.monotonic() + 20.0
    stream = irm.manager.WatchJobs(jp.WatchJobsRequest(tenant="alice"),
                                   SimpleNamespace(is_active=lambda: time.monotonic() < until))
    assert next(stream).id == job.id
    irm.manager.quiesce()
    with pytest.raises(Unavailable, match="stopping") as e:
        next(stream)
    assert e.value.reason == MANAGER_UNAVAILABLE and e.value.retry_after_s is not None


# -- 4. retired by its own report ------------------------------------------------------------------------------


def test_a_job_retired_by_its_report_counts_the_servers_last_tasks_and_teaches_the_cost_model(irm_factory):
    irm = irm_factory("fcfs_min")
    job = irm.register("a", min_devices=2, max_devices=2, **deadline(60.0, 100))
    assert irm.job(job.id).state == ACTIVE
    irm.clock.advance(5.0)
    irm.complete(irm.job(job.id), 100)               # the servers ran all of it; no control round since
    done = irm.manager.report("alice", job.id, 100)
    assert done.state == RETIRED and done.observed_actions == 100
    assert irm.manager.cost.observed("sleep", "alice") == {2: (1, pytest.approx(5.0 / 100))}


# -- 5. an empty job id ----------------------------------------------------------------------------------------


def test_an_empty_job_id_is_invalid_argument_on_job_id(irm_factory):
    irm = irm_factory("edf")
    m = irm.manager
    for call in (lambda: m.GetJob(jp.GetJobRequest(tenant="alice"), None),
                 lambda: m.RetireJob(jp.RetireJobRequest(tenant="alice"), None),
                 lambda: m.ReportProgress(jp.ReportProgressRequest(tenant="alice", completed_actions=1), None)):
        with pytest.raises(InvalidArgument, match="job_id: required") as e:
            call()
        assert fields(e.value) == {"job_id"}


# -- 6. Job.policy after a restart under another policy ------------------------------------------------------


def test_job_policy_is_the_policy_managing_it_now(irm_factory):
    irm = irm_factory("edf")
    kept = irm.register("kept", **deadline(600.0, 10**6))
    done = irm.register("done", **deadline(900.0, 10**6))
    irm.manager.retire("alice", done.id)
    irm.policy = "throughput"
    irm.restart()

    def policy(job_id: str) -> str:
        return irm.manager.GetJob(jp.GetJobRequest(tenant="alice", job_id=job_id), None).policy

    assert policy(kept.id) == "throughput" and policy(done.id) == "edf"     # retired under edf
    irm.manager.retire("alice", kept.id)
    irm.policy = "edf"
    irm.restart()
    assert policy(kept.id) == "throughput"            # the last policy that managed it


def test_a_refusal_with_the_minimums_fitting_names_what_counts_for_no_job(irm_factory, monkeypatch):
    # Under throughput control a job's devices on a server taken as gone count for none: the broker may leave it
    # without one though the minimums fit the pool. The message said the minimums "need" a number the pool has.
    irm = irm_factory("throughput")
    other = irm.register("other", throughput=jp.ThroughputGoal(actions_per_s=10))
    monkeypatch.setattr(jobs_mod, "admit", lambda job, live, reqs, pool, priorities: {other.id: 0, job.job_id: 1})
    with pytest.raises(ResourceExhausted) as e:
        irm.register("new", throughput=jp.ThroughputGoal(actions_per_s=10))
    assert str(e.value).startswith(f"{DEVICES} device(s) in the pool, the devices on servers taken as gone counting "
                                   f"for no job: 'throughput' would leave {other.id} without a device")
    assert e.value.reason == CAPACITY_IN_USE
