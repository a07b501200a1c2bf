"""Execution under an SLO: the Configuration Designer's choice on the model's frontier (or the
next configuration to explore, online), the run for real, predicted vs measured recorded, and the measurement
joining the model (online profiling, thesis §4.3.5).
"""

from __future__ import annotations

import json
import logging
import math
import threading
import time
import uuid
from collections import Counter
from dataclasses import replace
from typing import TYPE_CHECKING

import numpy as np
from sqlalchemy import select as sql_select

from application_manager import models as m
from application_manager.limits import MAX_RUN_TIMEOUT_S, MAX_RUNS, MAX_SLO_BYTES, bounded_error
from application_manager.loaded import Loaded
from application_manager.local import transient_error
from application_manager.manifest import _get
from application_manager.messages import execution_pb
from application_manager.model import Point, select
from application_manager.profilers import PRODUCTION, PROFILERS, Proposal
from application_manager.releases import reservation_request_id
from application_manager.slo import Slo, parse_slo
from harness.v1 import application_manager_pb2 as pb
from services import paging, tenants
from services.errors import (
    NO_MODEL,
    SLO_UNATTAINABLE,
    FailedPrecondition,
    InvalidArgument,
    Violations,
    require_tenant,
)

if TYPE_CHECKING:
    from application_manager.owners import Owner
    from application_manager.service import AppManagerConfig
    from services.clock import Clock
    from services.db import Database
    from services.server import CallCap

# The service's logger: the records keep the name they had before this module was split out of
# application_manager.service (log filters read it).
log = logging.getLogger("application_manager.service")

# An execution given no timeout_s may take this many times the model's time of its configuration (when that is
# more than run_timeout_s): a run the model expects to take 20 minutes is not killed at the default 10.
PREDICTED_MARGIN = 2.0


class Executions:
    """The ApplicationManager's execution calls (ExecuteApplication, ListExecutions).

    A mixin, not a part the servicer composes: an execution reads and changes most of the servicer's state -- the
    executions in progress (under its lock, waited for as the service stops), the shutdown flag, the cap on long
    calls, the database, owner and clock -- and calls its loading (`_load`, `_backend`), its request-id checks
    (`_add_once`, `_prior_execution`, `_same_request`) and its model (`_observations`, `_refresh_in`). Set by
    ApplicationManager.__init__; annotated here.
    """

    config: AppManagerConfig
    clock: Clock
    db: Database
    owner: Owner
    _lock: threading.Lock
    _shutdown: threading.Event
    _executions: set[threading.Event]
    _execution_ids: dict[str, threading.Event]
    _executions_done: threading.Condition
    _long_calls: CallCap

    def ExecuteApplication(self, request, context):  # noqa: N802
        tenant = require_tenant(request.tenant)
        loaded = self._load(tenant, request.application_id)
        v = Violations()
        v.check(math.isfinite(request.timeout_s) and 0 <= request.timeout_s <= MAX_RUN_TIMEOUT_S,
                "timeout_s", f"seconds, 0 (the service's default) to {MAX_RUN_TIMEOUT_S:g} "
                f"({MAX_RUN_TIMEOUT_S / 86400:g} days)")
        v.check(len(request.request_id) <= 128, "request_id", "at most 128 characters")
        v.check(len(request.slo_json.encode()) <= MAX_SLO_BYTES, "slo_json",
                f"at most {MAX_SLO_BYTES} bytes ({MAX_SLO_BYTES // 1024} KiB) of UTF-8")
        v.raise_if_any()
        slo = self._execution_slo(loaded, request.slo_json) if request.slo_json else loaded.slo
        if request.request_id and (prior := self._prior_execution(tenant, request.request_id)) is not None:
            self._same_request((prior.application_id, prior.slo) == (loaded.app.id, slo.describe()))
            return execution_pb(prior)
        self._long_calls.take("ExecuteApplication")
        try:
            return self._execute(tenant, loaded, slo, request, context)
        finally:
            self._long_calls.give_back()

    def _execute(self, tenant: str, loaded: Loaded, slo: Slo, request,  # type: ignore[no-untyped-def]
                 context) -> pb.ApplicationExecution:
        with self.db.read() as s:
            model = s.get(m.Model, loaded.app.id)
        front = [Point(p["config"], p["time_s"], p["cost"], True, p["predicted"]) for p in (model.frontier or [])]
        try:
            if not front:
                self._why_no_model(loaded)
            chosen = select(front, slo)
        except FailedPrecondition:
            if not request.online:
                raise
            chosen = self._explore(loaded)
        i = loaded.space.index(chosen.config)
        if i is None:
            raise FailedPrecondition("the model's configuration is no longer in the search space; profile again",
                                     reason=NO_MODEL)
        row = m.Execution(id=f"exec-{uuid.uuid4().hex[:12]}", application_id=loaded.app.id, tenant=tenant,
                          request_id=request.request_id or None, state="running", config=chosen.config,
                          slo=slo.describe(), predicted_time_s=chosen.time_s, predicted_cost=chosen.cost,
                          started_at=self.clock.now(), owner=str(self.owner), heartbeat_at=time.time())
        earlier = self._add_once(request.request_id, lambda: self._prior_execution(tenant, request.request_id),
                                 lambda s: s.add(row))
        if earlier is not None:
            # A concurrent retry won: it runs the application; this one answers with what it has so far.
            self._same_request((earlier.application_id, earlier.slo) == (loaded.app.id, slo.describe()))
            return execution_pb(earlier)
        # Once the RPC ends (the client cancelled, or its deadline passed) nobody waits for the result: the
        # run stops instead of holding its reservation and this worker thread to the end.
        cancelled = threading.Event()
        if not context.add_callback(cancelled.set):
            cancelled.set()
        # The service stopping cancels it too (its reservation released, not left behind).
        with self._lock:
            self._executions.add(cancelled)
            self._execution_ids[row.id] = cancelled
        if self._shutdown.is_set():
            cancelled.set()
        limit = request.timeout_s or self._execution_limit(chosen)

        def reserved(reservation_id: str) -> None:
            def show(s) -> None:  # type: ignore[no-untyped-def]
                e = s.get(m.Execution, row.id)
                if e.state == "running" and e.owner == str(self.owner):
                    e.reservation_id = reservation_id
            self.db.transact(show)
        try:
            backend = self._backend(loaded, slo, cancelled, tenant_token=tenants.bearer(context))
            backend.on_reserved = reserved      # shown while it runs (ListExecutions, GetExecution)
            detail = backend.run(Proposal(i), request_id=reservation_request_id(row.id), timeout_s=limit)
        except Exception as exc:
            # Never an execution left "running" (a retry with its request id would return it so forever).
            why = f"{type(exc).__name__}: {exc}"[:2000]

            def fail(s):  # type: ignore[no-untyped-def]
                e = s.get(m.Execution, row.id)
                if e.state == "running" and e.owner == str(self.owner):    # else another process ended it
                    e.state, e.error, e.ended_at = "failed", why, self.clock.now()
            self.db.transact(fail)
            raise
        finally:
            with self._executions_done:
                self._executions.discard(cancelled)
                self._execution_ids.pop(row.id, None)
                self._executions_done.notify_all()
        o = detail.observation
        timed_out = not o.ok and o.error.split(":")[0].strip() == "timeout"
        if timed_out and not request.timeout_s and chosen.time_s > 0:
            o = replace(o, error=f"timeout: the run took longer than {limit:g} s, the limit given when the request "
                        f"names none (the larger of run_timeout_s={self.config.run_timeout_s:g} and "
                        f"{PREDICTED_MARGIN:g} x the model's {chosen.time_s:.4g} s, at most "
                        f"{MAX_RUN_TIMEOUT_S / 86400:g} days); give a longer timeout_s if it needs more")
        if not o.ok and not o.transient and (transient_error(o.error) or (timed_out and request.timeout_s)):
            # Refused or lost, or killed at the bound this caller chose (the bound was short): says nothing of the
            # configuration, which stays on the frontier. Killed at the limit drawn from the model, it took more
            # than twice the model's time (or run_timeout_s): the model's point is wrong, and the configuration
            # leaves the frontier as a run failing in a profiling session would (kept, the next execution would
            # choose it again and wait as long again).
            o = replace(o, transient=True)

        def finish(s) -> m.Execution:  # type: ignore[no-untyped-def]
            e = s.get(m.Execution, row.id)
            if e.state != "running" or e.owner != str(self.owner):
                # Taken as interrupted by another AM process while it ran (its reservation released there):
                # that ending stands, and the run is no measurement.
                log.warning("the execution was ended by another AM process while it ran; its end here is not "
                            "recorded", extra={"execution": e.id, "state": e.state})
                return e
            e.state = "succeeded" if o.ok else "failed"
            e.measured_time_s, e.measured_cost = o.time_s, o.cost
            e.slo_met = o.ok and slo.holds(o.time_s, o.cost)
            e.error, e.output_tail, e.reservation_id = bounded_error(o.error), detail.output_tail, detail.reservation_id
            e.ended_at = self.clock.now()
            if detail.cancelled:
                return e    # cut short by the client: no measurement of the configuration
            # Online profiling (§4.3.5): the real execution is one more measurement of the model.
            s.add(m.Run(application_id=loaded.app.id, session_id=f"execution:{row.id}", ordinal=1,
                        config=chosen.config, input=PRODUCTION, ok=o.ok, error=bounded_error(o.error), time_s=o.time_s,
                        cost=o.cost,
                        cpu_percent=o.cpu_percent, memory_percent=o.memory_percent, reason="execution under the SLO",
                        created_at=self.clock.now(), transient=o.transient))
            if not o.transient:
                self._refresh_in(s, loaded)     # in this transaction: a crash cannot part the run from the model
            return e
        e = self.db.transact(finish)
        return execution_pb(e)

    def _execution_limit(self, chosen: Point) -> float:
        """How long an execution whose request names no timeout_s may run: the service's run_timeout_s, or
        PREDICTED_MARGIN x the time the model gives the chosen configuration when that is longer (a run the model
        expects to take longer than run_timeout_s would otherwise be killed before it could end), at most
        MAX_RUN_TIMEOUT_S."""
        predicted = chosen.time_s if math.isfinite(chosen.time_s) and chosen.time_s > 0 else 0.0
        return min(MAX_RUN_TIMEOUT_S, max(self.config.run_timeout_s, PREDICTED_MARGIN * predicted))

    def _why_no_model(self, loaded: Loaded) -> None:
        """No frontier: say whether nothing ran, or everything that ran failed (and how, most often)."""
        with self.db.read() as s:
            runs = list(s.scalars(sql_select(m.Run).where(m.Run.application_id == loaded.app.id,
                                                          m.Run.input == PRODUCTION)))
        unmeasured = [r for r in runs if r.transient]
        runs = [r for r in runs if not r.transient]
        if not runs and unmeasured:
            top, n = Counter(r.error or "no error recorded" for r in unmeasured).most_common(1)[0]
            raise FailedPrecondition(
                f"no performance model yet: none of the {len(unmeasured)} run(s) could be measured ({n} of them: "
                f"{top[:300]}), which says nothing of the configurations; profile again when the cloud has room",
                reason=NO_MODEL)
        if not runs:
            raise FailedPrecondition("no performance model yet: profile the application first", reason=NO_MODEL)
        errors = Counter(r.error or "no error recorded" for r in runs if not r.ok)
        if len(errors) and all(not r.ok for r in runs):
            top, n = errors.most_common(1)[0]
            raise FailedPrecondition(
                f"no performance model: all {len(runs)} run(s) on {len({json.dumps(r.config, sort_keys=True) for r in runs})} "
                f"configuration(s) failed ({n} of them: {top[:300]}); fix the application or its resources, then "
                f"profile again", reason=NO_MODEL)

    @staticmethod
    def _execution_slo(loaded: Loaded, text: str) -> Slo:
        """An execution's own SLO: its bounds; the input parameters are the ones the model was profiled on.

        Other parameters are another input: the frontier says nothing of it (and the run, recorded as one more
        measurement, would skew the model), so they are refused; left out, they are the application's.
        """
        slo = parse_slo(text, loaded.manifest, "slo_json")
        given = _get(slo.raw, "Parameters") or _get(slo.raw, "ExecutionArgs")
        if not given:
            return replace(slo, parameters=dict(loaded.slo.parameters))
        if slo.parameters != loaded.slo.parameters:
            differ = sorted(k for k in {*slo.parameters, *loaded.slo.parameters}
                            if slo.parameters.get(k) != loaded.slo.parameters.get(k))
            raise InvalidArgument.of("slo_json.Parameters", "the model was profiled with " + ", ".join(
                f"{k}={loaded.slo.parameters.get(k)!r}" for k in differ) + "; leave Parameters out, or submit "
                "the application again with these parameters and profile it")
        return slo

    def _explore(self, loaded: Loaded) -> Point:
        """Online profiling: the next configuration the model-based profiler would try."""
        prices = loaded.prices_from(self._backend(loaded), self.clock.now(), self.config.price_ttl_s)
        prof = PROFILERS["bo"](loaded.space, np.random.default_rng(0), prices=prices,
                               max_runs=MAX_RUNS)
        observed = self._observations(loaded)
        proposal = prof.propose(observed)
        if proposal is None:
            # The profiler says why when that is not simply "all run" (the rest never fit: priced out).
            why = getattr(prof, "ended", "") or "every configuration has been run"
            if observed and not any(o.ok for o in observed):
                # Not an SLO out of reach: the application fails everywhere (a program not found, a crash).
                last = observed[-1].error[:300]
                raise FailedPrecondition(f"{why} and every run failed (the last: {last}): fix the application "
                                         "(GetModel lists its runs' errors), then submit it again",
                                         reason=NO_MODEL)      # no usable model, not an SLO out of reach
            raise FailedPrecondition(f"{why} and none satisfies the SLO", reason=SLO_UNATTAINABLE)
        return Point(loaded.space.configs[proposal.config], 0.0, 0.0, True)

    def ListExecutions(self, request, context):  # noqa: N802
        tenant = require_tenant(request.tenant)
        q = sql_select(m.Execution).where(m.Execution.tenant == tenant)
        if request.application_id:
            self._load(tenant, request.application_id)
            q = q.where(m.Execution.application_id == request.application_id)
        with self.db.read() as s:
            rows, token = paging.page(s, q, [m.Execution.started_at, m.Execution.id], request.page_size,
                                      request.page_token)
        # Rows are the tenant's by the query: no application is loaded (one a newer version no longer accepts
        # would fail the whole listing).
        return pb.ListExecutionsResponse(executions=[execution_pb(r) for r in rows], next_page_token=token)

