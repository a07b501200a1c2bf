"""A virtual FPGA for a QoS job (issue 5's FpgaJobs): the job's group, with the job's progress reported as it is made.

The job manager reads each job's completed actions from the FPGA-servers' counters; a server that crashes loses
what it counted since the manager's last read (its parts are made again and count from 0), and a deadline job that
ran its whole size then never retires, keeping its devices. A `JobFpga` counts the actions whose results it
received -- work that certainly completed -- and reports the count (ReportProgress, cumulative: the manager keeps
the larger of it and the servers') at most every `report_s` while they complete, and once more when it is closed.
The data plane is the group's as ever: the reports are control calls to the FPGA IRM, the manager stays off the
data path (seed 000 §III).

Several clients of one job each report their own count: the manager keeps the largest report, so reports never
count an action twice, and the servers' counters still count the others' work.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from typing import Any

import grpc

from harness.v1 import fpga_jobs_pb2, fpga_jobs_pb2_grpc, fpga_pb2, fpga_pb2_grpc
from irm_fpga.client import VirtualFpga
from services import tenants

log = logging.getLogger(__name__)


class JobFpga(VirtualFpga):
    def __init__(self, attachment: fpga_pb2.Attachment, *, jobs: fpga_jobs_pb2_grpc.FpgaJobsStub, job_id: str,
                 report_s: float = 1.0, **kw: Any) -> None:
        self.job_id = job_id
        self._jobs = jobs
        self._completed = 0          # actions whose results came back ok
        self._reported = 0
        self._counting = threading.Lock()
        self._reporting = threading.Lock()       # one report at a time, in order
        self._job_ended = ""         # why reports stopped (the job retired, or is gone)
        self._report_s = report_s
        self._stop_reports = threading.Event()
        self._channel: grpc.Channel | None = None      # attach_job's, to the FPGA IRM
        super().__init__(attachment, **kw)
        if report_s > 0:
            threading.Thread(target=self._report_loop, name=f"job-progress-{job_id}", daemon=True).start()

    @classmethod
    def attach_job(cls, fpga_address: str, tenant: str, job_id: str, token: str | None = None,
                   report_s: float = 1.0, **kw: Any) -> JobFpga:
        """Attach to the group of the job `job_id` at the FPGA IRM `fpga_address` (its FpgaJobs and Orchestrator).
        A job still queued (a Hydrogen policy dispatches it later) has no group yet: RuntimeError saying so."""
        channel = tenants.tenant_channel(fpga_address, token)
        jobs = fpga_jobs_pb2_grpc.FpgaJobsStub(channel)
        job = jobs.GetJob(fpga_jobs_pb2.GetJobRequest(tenant=tenant, job_id=job_id), timeout=30)
        if job.state != fpga_jobs_pb2.Job.STATE_ACTIVE:
            state = fpga_jobs_pb2.Job.State.Name(job.state)
            raise RuntimeError(f"job {job_id!r} is {state}: only an active job has a group to attach to"
                               + (f" ({job.waiting_reason})" if job.waiting_reason else ""))
        orchestrator = fpga_pb2_grpc.FpgaOrchestratorStub(channel)
        att = orchestrator.AttachClient(fpga_pb2.AttachClientRequest(tenant=tenant, group_id=job.group_id),
                                        timeout=30)
        fpga = cls(att, orchestrator=orchestrator, tenant=tenant, jobs=jobs, job_id=job_id, report_s=report_s,
                   **kw)
        fpga._channel = channel          # closed with it
        return fpga

    @property
    def completed(self) -> int:
        """Actions of this client's that completed (their results received ok)."""
        with self._counting:
            return self._completed

    def _complete(self, results: Sequence[fpga_pb2.TaskResult]) -> None:
        # Only results that answer a task of this client's still waiting (the base class drops others, an id it
        # no longer knows): a count beyond the work done would retire a deadline job early.
        with self._lock:
            done = sum(1 for r in results if r.kind == fpga_pb2.Task.KIND_RUN and not r.error and r.id in self._futures)
        if done:
            with self._counting:
                self._completed += done
        super()._complete(results)

    def report(self) -> bool:
        """Report the count now if it grew; False once the job no longer takes reports (retired, gone)."""
        with self._reporting:
            if self._job_ended:
                return False
            count = self.completed
            if count <= self._reported:
                return True
            try:
                job = self._jobs.ReportProgress(fpga_jobs_pb2.ReportProgressRequest(
                    tenant=self._tenant, job_id=self.job_id, completed_actions=count), timeout=10)
            except grpc.RpcError as e:
                if e.code() in (grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.NOT_FOUND,
                                grpc.StatusCode.PERMISSION_DENIED):
                    self._job_ended = f"{e.code().name}: {e.details()}"
                    return False
                # The FPGA IRM restarting, say: the next report carries the count (it is cumulative).
                log.info("a job's progress report failed; the next one carries it",
                         extra={"job": self.job_id, "code": str(e.code())})
                return True
            self._reported = count
            if job.state == fpga_jobs_pb2.Job.STATE_RETIRED:
                self._job_ended = "the job retired"         # its size is done: nothing more to report
                return False
            return True

    def _report_loop(self) -> None:
        while not self._stop_reports.wait(self._report_s):
            if not self.report():
                return

    def close(self, detach: bool = True) -> None:
        """As VirtualFpga.close, then the last report (the tasks in flight have come back by then)."""
        try:
            super().close(detach)
        finally:
            self._stop_reports.set()
            self.report()
            if self._channel is not None:
                self._channel.close()
