"""`harness jobs watch`: one JSON line per change. The first control round after a job's dispatch takes its
servers' counters as a baseline; published, that was a second Job identical to the first on every new watch.
And a deadline of inf is refused as what it is (not finite), not as "must be > 0"."""

from __future__ import annotations

import pytest

from harness.v1 import fpga_jobs_pb2 as jp
from services.errors import field_violations
from tests.integration.test_fpga_jobs import deadline_job, start_irm, stop_irm


def test_a_baseline_round_publishes_nothing_and_progress_does(suite):
    # A control period of an hour: rounds run here, by hand, only.
    running, _, jobs, _, register = start_irm(suite, "edf", period=3600.0)
    try:
        job = jobs.RegisterJob(deadline_job("w", 600.0, size=10))
        assert job.state == jp.Job.STATE_ACTIVE
        stream = jobs.WatchJobs(jp.WatchJobsRequest(tenant="alice", job_id=job.id), timeout=30)
        first = next(stream)
        assert first.completed_actions == 0
        register.manager.control_once()         # the servers' counters read: the baseline
        register.manager.control_once()         # and again, nothing done
        jobs.ReportProgress(jp.ReportProgressRequest(tenant="alice", job_id=job.id, completed_actions=3))
        second = next(stream)
        assert second != first and second.completed_actions == 3
        stream.cancel()
    finally:
        stop_irm(running, register)


@pytest.mark.parametrize("deadline", [float("inf"), float("nan"), 1e300, 3.3e8])
def test_a_deadline_that_is_not_finite_or_absurdly_far_is_refused_saying_so(suite, deadline):
    import grpc

    running, _, jobs, _, register = start_irm(suite, "edf", period=3600.0)
    try:
        with pytest.raises(grpc.RpcError) as e:
            jobs.RegisterJob(deadline_job("inf", deadline, size=10))
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        why = dict(field_violations(e.value))["deadline.deadline_s"]
        assert why.startswith("must be a number of seconds from registration, > 0 and at most 3.2e+08 (about ten "
                              "years") and repr(deadline) in why
    finally:
        stop_irm(running, register)
