"""A RegisterJob request checked by the FPGA job manager (`irm_fpga.jobs`), before it registers anything.

A retry (the same request_id) gets the job its request registered, if it asks for the same. A new request has
its fields checked all at once (INVALID_ARGUMENT naming each), then the devices the servers that answer
have for it: a job no device count could ever hold is INVALID_ARGUMENT, one that may fit once a silent server
is back UNAVAILABLE (retry), and one arriving while every device is blacklisted RESOURCE_EXHAUSTED.
"""

from __future__ import annotations

import math
from typing import Any

from harness.v1 import fpga_jobs_pb2
from irm_fpga import designs as design_lib
from irm_fpga.job_models import FpgaJob
from irm_fpga.jobs_config import JobsConfig
from irm_fpga.qos import dispatch
from irm_fpga.qos.jobs import THROUGHPUT
from services.errors import (
    MANAGER_UNAVAILABLE,
    RETRY_LATER_S,
    ResourceExhausted,
    Unavailable,
    Violations,
)
from services.idempotency import request_id_problem, reused_request_id

MAX_THROUGHPUT_GOAL = 1e9       # actions/s; a larger goal is a typo, and its device request overflows
# The farthest deadline, in seconds from registration: about ten years. Beyond, a typo (1e300 was taken, and shown
# as a deadline at 1.7e308), and the job's time-varying throughput goal is 0 for all practical purposes.
MAX_DEADLINE_S = 3.2e8
MAX_PRIORITY = 1e6              # a larger weight times a wait overflowed to inf: every schedule tied
# A job's own estimate of its seconds per action on one device (`action_seconds`): a microsecond to about
# eleven days.
MIN_ACTION_S, MAX_ACTION_S = 1e-6, 1e6


def replayed(existing: FpgaJob, fingerprint: str) -> FpgaJob:
    """The job a request_id first registered, for a retry that asks for the same (a job registered before the
    hash was recorded is not compared)."""
    if existing.request_hash and existing.request_hash != fingerprint:
        raise reused_request_id()
    return existing


class RequestChecks:
    """The checks of one manager's RegisterJob requests: its policy (`config`, `scheduler`: the Hydrogen one, or
    None) and the Orchestrator's servers."""

    def __init__(self, orchestrator: Any, config: JobsConfig, scheduler: dispatch.Scheduler | None) -> None:
        self.orch = orchestrator
        self.config = config
        self.scheduler = scheduler

    def validate(self, request: fpga_jobs_pb2.RegisterJobRequest) -> None:
        """The request's fields, all at once (INVALID_ARGUMENT naming each), before the devices are counted: a
        request wrong in itself is refused as such whatever the servers are doing (a silent one's UNAVAILABLE, or
        RESOURCE_EXHAUSTED with every device blacklisted, would have the client retry a request that can never
        succeed). A request asking for more than one device has its device counts among them too, if every
        server answered."""
        v = Violations()
        if (why := request_id_problem(request.request_id, 200)) is not None:
            v.add("request_id", why)
        if (why := design_lib.unknown_design(request.design)) is not None:
            v.add("design", why)
        goal = request.WhichOneof("goal")
        if goal is None:
            v.add("goal", "required: a deadline (deadline_s and size_actions) or a throughput (actions_per_s)")
        elif goal == "deadline":
            d = request.deadline
            v.check(math.isfinite(d.deadline_s) and 0 < d.deadline_s <= MAX_DEADLINE_S, "deadline.deadline_s",
                    f"must be a number of seconds from registration, > 0 and at most {MAX_DEADLINE_S:g} (about ten "
                    f"years; got {d.deadline_s!r})")
            v.check(d.size_actions >= 1, "deadline.size_actions", "the job's size: at least 1 action")
        else:
            g = request.throughput.actions_per_s
            v.check(math.isfinite(g) and 0 < g <= MAX_THROUGHPUT_GOAL, "throughput.actions_per_s",
                    f"must be > 0 and at most {MAX_THROUGHPUT_GOAL:g} actions/s")
            v.check(self.config.policy == THROUGHPUT, "throughput",
                    f"the job manager runs {self.config.policy!r}, which takes deadline goals only")
        mn, mx = request.min_devices, request.max_devices
        v.check(mn >= 0, "min_devices", "must be >= 0")
        v.check(mx >= 0, "max_devices", "must be >= 0 (0: no limit)")
        v.check(mx == 0 or mx >= max(1, mn), "max_devices", f"must be >= min_devices and >= 1 (got {mx})")
        if self.scheduler is not None and self.config.pool_max:
            v.check(max(1, mn) <= self.config.pool_max, "min_devices",
                    f"the job manager's pool holds at most {self.config.pool_max} devices (jobs_pool_max)")
        v.check(math.isfinite(request.priority) and 0 <= request.priority <= MAX_PRIORITY, "priority",
                f"must be >= 0 and at most {MAX_PRIORITY:g} (0: 1)")
        a = request.action_seconds
        v.check(math.isfinite(a) and (a == 0 or MIN_ACTION_S <= a <= MAX_ACTION_S), "action_seconds",
                f"seconds per action on one device: 0 (one second) or {MIN_ACTION_S:g} to {MAX_ACTION_S:g}")
        # Counted only for a request that may ask for more devices than there are: a server that hangs holds
        # the count for a timeout, and a malformed request asking for one device waits for no server.
        if v.items and max(request.min_devices, request.max_devices) > 1:
            caps = self.orch._free_total_capacity()
            if caps and not set(self.orch.servers) - set(caps):     # else the devices are not all known
                self.capacity_violations(request, sum(caps.values()), v)
        v.raise_if_any()

    @staticmethod
    def capacity_violations(request: fpga_jobs_pb2.RegisterJobRequest, usable: int, v: Violations) -> None:
        """The request's device counts against the `usable` devices of the servers."""
        mn, mx = request.min_devices, request.max_devices
        v.check(max(1, mn) <= usable, "min_devices", f"the FPGA-servers have {usable} usable devices in all")
        v.check(mx <= usable, "max_devices", f"the FPGA-servers have {usable} usable devices in all")

    def retry_silent_s(self) -> float:
        """How long a caller refused for a silent server waits: the Orchestrator tries such a server again then."""
        return getattr(self.orch.config, "server_backoff_s", None) or RETRY_LATER_S

    def usable_or_unavailable(self, request: fpga_jobs_pb2.RegisterJobRequest) -> int:
        """Usable devices of the servers that answer. A job wider than those while some server does not
        answer may fit once it is back: UNAVAILABLE (retry), not INVALID_ARGUMENT (never ask that again)."""
        caps = self.orch._free_total_capacity()
        if not caps:
            raise Unavailable("no FPGA-server can be reached: the job manager cannot count devices; retry later",
                              reason=MANAGER_UNAVAILABLE, retry_after_s=self.retry_silent_s())
        usable = sum(caps.values())
        silent = sorted(set(self.orch.servers) - set(caps))
        if silent and max(1, request.min_devices, request.max_devices) > usable:
            raise Unavailable(f"the job asks for more devices than the {usable} of the FPGA-servers that answer; "
                              f"{', '.join(silent)} did not: retry later", reason=MANAGER_UNAVAILABLE,
                              retry_after_s=self.retry_silent_s())
        if usable == 0:
            raise ResourceExhausted("every device of the FPGA-servers is blacklisted; retry once an operator "
                                    "brings devices back", retry_after_s=RETRY_LATER_S)
        return usable
