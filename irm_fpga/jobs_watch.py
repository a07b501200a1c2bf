"""The FPGA job manager's WatchJobs streams (`irm_fpga.jobs`): how many may be open, and one stream's messages.

Every job row the manager writes is published to its streams (`JobManager._publish`); a stream sends its
snapshot (its tenant's jobs not retired, or its one job), then the latest state of each of its jobs that
changed, until its job retires, the client goes, the manager stops, or the stream falls behind.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from harness.v1 import fpga_jobs_pb2
from services.errors import MANAGER_UNAVAILABLE, STREAM_BEHIND, ResourceExhausted, Unavailable
from services.watch import Broadcaster

# Open WatchJobs streams at most: each holds one of the server's 32 worker threads, which the Orchestrator,
# the CRS's calls and health checks share.
MAX_WATCHES = 16
MAX_WATCHES_PER_TENANT = 4      # of those, one tenant's: the others can still watch (one stream follows all of its jobs)
# A WatchJobs stream holds the latest state of each of its jobs that changed since it last sent (only its tenant's
# jobs, or its one job, are queued for it); a stream not read while more than this many of its jobs changed is
# ended RESOURCE_EXHAUSTED (the client reconnects, and its snapshot is the jobs' state then).
MAX_WATCH_BACKLOG = 1000


def job_watchers() -> Broadcaster[fpga_jobs_pb2.Job]:
    """A manager's WatchJobs streams."""
    return Broadcaster(
        max_streams=MAX_WATCHES, full="WatchJobs streams are open on this FPGA IRM; close one, or poll GetJob",
        per_tenant=MAX_WATCHES_PER_TENANT,
        tenant_full="close one of your WatchJobs streams (one without job_id follows all of your jobs), or "
                    "poll GetJob")


def watch_stream(watchers: Broadcaster[fpga_jobs_pb2.Job], tenant: str, one: str, context: Any,
                 snapshot: Callable[[], list[fpga_jobs_pb2.Job]], stopping_retry_s: float
                 ) -> Iterator[fpga_jobs_pb2.Job]:
    """The stream of one WatchJobs call: snapshot, changes, then the end or an error. `one`: its one job's id ("":
    all of `tenant`'s); `stopping_retry_s`: when a client the stopping manager ends the stream of reconnects."""

    def mine(job: fpga_jobs_pb2.Job) -> bool:
        return job.tenant == tenant and (not one or job.id == one)

    # Subscribed before the snapshot is read: a change in between is sent (again), never lost. Only this
    # stream's jobs are queued for it, the latest state of each (a stalled stream holds at most
    # MAX_WATCH_BACKLOG jobs, not every tenant's changes).
    for batch in watchers.stream_batches(snapshot, context.is_active, tenant=tenant, accept=mine,
                                         key=_job_id, max_backlog=MAX_WATCH_BACKLOG):
        for job in batch:
            if not mine(job):
                continue
            yield job
            if one and job.state == fpga_jobs_pb2.Job.STATE_RETIRED:
                return
    if not context.is_active():
        return                           # the client went away
    # Not the end the contract promises: say so, so that the client reconnects (its first message is the
    # current state again) instead of taking an OK end for a retired job.
    if watchers.closed:
        raise Unavailable("the FPGA IRM's job manager is stopping; reconnect to go on watching",
                          reason=MANAGER_UNAVAILABLE, retry_after_s=stopping_retry_s)
    raise ResourceExhausted(f"the stream fell behind: more than {MAX_WATCH_BACKLOG} of the jobs it follows "
                            f"changed while it was not read; reconnect and re-list (a new stream starts with "
                            f"the jobs' current state)", reason=STREAM_BEHIND)


def _job_id(job: fpga_jobs_pb2.Job) -> str:
    """The key a WatchJobs stream keeps one pending event per: a job's latest state replaces the one not sent."""
    return job.id
