"""The `local` back-end: every run is real (thesis §5.3, steps 2-4).

A configuration becomes a CRS reservation (one group per manifest group, Distances as
constraints between groups); the implementation's Command, with `%var` substituted, runs
through the execution agent of the MASTER group's first VM (confined to its cores and
memory); time is the agent's wall time, cost is the reservation's price per minute (the CRS
quote) x minutes run, utilisation is the agent's samples; the reservation is released
whatever happens. A failed run (non-zero exit, memory limit, timeout) is an observation
with its cost, not an error.

A multi-module application (application_manager.manifest) runs its service modules first,
each on its own MASTER VM, waits for each one's `HARNESS_READY` line, runs the main module,
then stops the services. The run costs the reservation for the services' start-up plus the
main module's time; a service that dies before the main module ends fails the run.

A run given a `cancelled` event (an execution whose client went away) is cut short once it is set: its
modules are stopped through their agents, as a timeout stops them, the reservation is released, and the
run is a failed observation marked `cancelled` (the configuration did not fail: the caller left).

Failures that are not the configuration's doing -- the CRS refusing for now (no room, a manager away), the run
lost with its agent, a cancelled run -- are observations marked `transient`: recorded, never measurements.

A run reserves under the caller's `request_id` (the service derives it from the session or execution), so a
reservation an AM that died left behind is found by its request id and released when it starts again. A
reservation the run could not release (the CRS away or slow as it ended), or a Reserve whose answer was lost (the
CRS may have placed it), is handed to `release_later` (`Unreleased`): the service keeps it and releases it once
the CRS answers.
"""

from __future__ import annotations

import logging
import math
import shlex
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import grpc
import numpy as np

from application_manager.manifest import (
    READY_LINE,
    Implementation,
    Manifest,
    Variant,
    crs_attribute,
    substitute,
)
from application_manager.profilers.base import BENCHMARK, Observation, Proposal
from application_manager.space import IMPLEMENTATION, Space
from harness.v1 import agent_pb2, agent_pb2_grpc, common_pb2, irm_pb2, irm_pb2_grpc
from services import client, tenants
from services.errors import error_info, retry_delay_s

log = logging.getLogger(__name__)
CANCELLED = "cancelled: the client cancelled or its deadline passed"
# CRS refusals that say nothing of the configuration: capacity in use, a manager away, the CRS slow or restarting.
# FAILED_PRECONDITION ("never fits", proven) and INVALID_ARGUMENT are the configuration's own and stay failures.
TRANSIENT_CODES = frozenset({grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.UNAVAILABLE,
                             grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.ABORTED, grpc.StatusCode.CANCELLED})
# Refusals of credentials (the services' tokens differ, a tenant's token changed or is not allowed): the operators'
# to fix, not the configuration's fault either. A failed run so is transient (tried again once fixed), not written
# off; the releases' retries treat them as lasting (`releases`: backed off).
CREDENTIAL_CODES = frozenset({grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED})
RUN_TRANSIENT_CODES = TRANSIENT_CODES | CREDENTIAL_CODES
# A Reserve that failed so without the CRS's considered answer (no ErrorInfo: the connection lost, the deadline
# passed) may have been placed all the same: the CRS commits before it answers.
RESERVE_IN_DOUBT = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED,
                              grpc.StatusCode.CANCELLED, grpc.StatusCode.UNKNOWN})
# How gRPC fails a call it could not send: no connection to the server could be made.
_NEVER_SENT = "failed to connect to all addresses"
# Quote refusals that hold for as long as the datacenter's make-up does: the configuration is priced out.
PERMANENT_QUOTE_CODES = frozenset({grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.FAILED_PRECONDITION})
# The most distinct requests one pricing of a space asks the CRS to quote (~1 ms each); the others are left
# unquoted (NaN: the profilers take them as gaps).
MAX_QUOTES = 1000
# How long a run's Reserve may take. Its deadline also bounds when the request can still reach the CRS (gRPC starts
# no handler for a call past its deadline): what a Reserve in doubt may still place (service.IN_DOUBT_KEPT_S).
RESERVE_TIMEOUT_S = 60.0
# How often a wait looks at the cancellation flag: how late, at most, a cancelled run starts stopping.
_POLL_S = 0.2
# After StopExecution (which waits for the kill itself), how long the exit status may take to arrive.
_STOP_WAIT_S = 30.0

_TRANSIENT_PREFIXES = ("could not reserve: ", "could not run: ", "the run was lost: ")
# Why the agent ended a run that say nothing of its configuration: its VM was released (by the tenant, say), the
# agent was stopped (a restart, a deploy), or someone stopped the execution (irm_compute.agent.RELEASED,
# AGENT_STOPPED; irm_compute.sandbox.STOPPED).
ENDED_FROM_OUTSIDE = frozenset({"vm released", "agent stopped", "stopped"})
# How the agent says the kernel's OOM killer ended a run below its own memory limit (irm_compute.sandbox
# `exit_reason`): the machine ran out of memory first (other VMs, other processes), not the configuration.
MACHINE_OUT_OF_MEMORY = "out of memory: the kernel's OOM killer"
# How a replaying agent says it ended a run at the ExecuteRequest's replay_cost_limit (irm_compute.replay).
COST_LIMIT = "cost limit"


def never_quoted(e: grpc.RpcError) -> bool:
    """Whether a refused quote is the configuration's own for good: the request is invalid or it never fits (the
    CRS's NEVER_FITS), and the CRS did not say that waiting helps. Run, it would fail the same way (not
    transient, as TRANSIENT_CODES has it)."""
    return e.code() in PERMANENT_QUOTE_CODES and retry_delay_s(e) is None


def reserve_in_doubt(e: grpc.RpcError) -> bool:
    """Whether a failed Reserve may have reserved all the same (RESERVE_IN_DOUBT). The CRS's own refusals say why
    (ErrorInfo): it answers them once its claim on the request id is dropped, nothing held. A channel that could
    not connect failed the call before sending it (the CRS down, for as long as it restarts)."""
    return (e.code() in RESERVE_IN_DOUBT and error_info(e) is None
            and not (e.code() == grpc.StatusCode.UNAVAILABLE and _NEVER_SENT in (e.details() or "")))


def run_cost(exited: agent_pb2.ExecutionExited, live_cost: float) -> float:
    """What a run cost: a replaying agent knows what the measured run cost (0 included: a free run), a live run
    costs its reservation (`live_cost`). An agent from before `replayed` says a replay only by a cost above 0."""
    return exited.replayed_cost if replayed(exited) else live_cost


def replayed(exited: agent_pb2.ExecutionExited) -> bool:
    """Whether a replaying agent ran it (`run_cost`)."""
    return exited.replayed or exited.replayed_cost > 0


def transient_error(error: str) -> bool:
    """Whether a failed run's error is one of the ones above that say nothing of the configuration: a CRS or
    agent refusal with a code in RUN_TRANSIENT_CODES, or a run lost without a code. For observations that did not
    come through `LocalBackend.run` with their flag set (another back-end's, a stand-in's)."""
    for prefix in _TRANSIENT_PREFIXES:
        if error.startswith(prefix):
            code = error[len(prefix):].split(":", 1)[0].strip()
            known = {c.name for c in grpc.StatusCode}
            return code in {c.name for c in RUN_TRANSIENT_CODES} or (prefix == _TRANSIENT_PREFIXES[2] and code not in known)
    return (error.startswith("cancelled: ") or error.startswith("stopped: ") or error in ENDED_FROM_OUTSIDE
            or error.startswith(MACHINE_OUT_OF_MEMORY))


def cloud_away(o: Observation) -> bool:
    """Whether a transient failure was the cloud's as a whole -- the CRS, a manager or an agent away or slow before
    the run started -- so that the same configuration is worth running again once it is back. Not when the CRS had
    no room for it (RESOURCE_EXHAUSTED: others may fit meanwhile, and a later session tries it again), nor for a run
    that started and was lost or ended by the machine's memory: its configuration may be why, and running it again
    and again would spend the session's patience on it."""
    return o.transient and o.error.startswith(("could not reserve: ", "could not run: ")) and \
        not o.error.startswith("could not reserve: RESOURCE_EXHAUSTED")


@dataclass(frozen=True)
class Unreleased:
    """A reservation a run may have left at the CRS: `reservation_id` when its release failed; without it, a Reserve
    in doubt (`reserve_in_doubt`) under `request_id` (`request`: what it asked for), whose outcome the service asks the
    CRS for by that request id."""
    tenant: str
    request_id: str
    reservation_id: str = ""
    request: irm_pb2.ReserveRequest | None = None


@dataclass
class RunDetail:
    observation: Observation
    reservation_id: str = ""
    output_tail: str = ""
    notes: list[str] = field(default_factory=list)
    # Cut short because the caller went away: says nothing of the configuration.
    cancelled: bool = False


def _wait(event: threading.Event, timeout: float | None, cancelled: threading.Event | None) -> bool:
    """`event.wait(timeout)` that gives up (False) as soon as `cancelled` is set."""
    if cancelled is None:
        return event.wait(timeout)
    end = None if timeout is None else time.monotonic() + timeout
    while not event.is_set():
        if cancelled.is_set():
            return False
        step = _POLL_S if end is None else min(_POLL_S, end - time.monotonic())
        if step <= 0:
            return False
        event.wait(step)
    return True


class LocalBackend:
    def __init__(self, crs_address: str, tenant: str, manifest: Manifest, space: Space,
                 parameters: dict[str, Any], app_dir: str, python: str, timeout_s: float,
                 cancelled: threading.Event | None = None, cancel_reason: str = CANCELLED,
                 delegation_token: str = "", tenant_token: str = "",
                 release_later: Callable[[Unreleased], None] | None = None) -> None:
        # The delegation token goes with every call to the CRS and the agents: they take the AM's calls for its
        # tenants (services.tenants), whatever tenant tokens they check. The tenant's own
        # token (of the call that asked for the runs, if it sent one) goes to the application, which acts as its
        # tenant where the AM is not in between (a virtual FPGA's Orchestrator); it is never stored.
        self.delegation_token = delegation_token
        self.tenant_token = tenant_token
        self.crs = irm_pb2_grpc.ResourceManagerStub(tenants.delegating(client.channel(crs_address), delegation_token))
        self.tenant = tenant
        self.manifest = manifest
        self.space = space
        self.parameters = dict(parameters)
        self.app_dir = app_dir
        self.python = python
        self.timeout_s = timeout_s
        self.has_benchmark = any(p.benchmark is not None for p in manifest.parameters)
        self.ready_timeout_s = 60.0
        self.cancelled = cancelled
        # What a cancelled run's error says: the caller went away (an execution) or profiling was stopped.
        self.cancel_reason = cancel_reason
        # Where a reservation the run could not release goes, to be released later (by the service, which keeps
        # it across restarts); without it, it is only logged.
        self.release_later = release_later
        # Whether the agents replay measured runs (irm_compute.replay), as the last run that ended said (None: no
        # run yet): a replayed run costs what it was measured to, not the reservation's price for its time.
        self.replaying: bool | None = None
        # Told a run's CRS reservation id once it is made (an execution shows it while it runs).
        self.on_reserved: Callable[[str], None] | None = None
        # The last prices() has gaps worth asking again soon (the CRS could not quote some now, or it was cut
        # short); the configurations a large space leaves unquoted on purpose are not such gaps.
        self.momentary_gaps = False

    def implementation(self, config: dict[str, Any]) -> Implementation | Variant:
        name = config.get(IMPLEMENTATION)
        for impl in self.manifest.variants:
            if impl.name == name:
                return impl
        return self.manifest.variants[0]

    def values(self, config: dict[str, Any], input: str = "production") -> dict[str, Any]:
        impl = self.implementation(config)
        params = dict(self.parameters)
        if input == BENCHMARK:
            for p in self.manifest.parameters:
                if p.benchmark is not None:
                    params[p.var] = p.benchmark
        env = {**params, **impl.fixed(), **{k: v for k, v in config.items() if k.startswith("%") and v is not None}}
        env["%python"] = self.python
        env["%app_dir"] = self.app_dir
        return env

    def request(self, config: dict[str, Any]) -> tuple[list[irm_pb2.ResourceGroup], list[irm_pb2.GroupConstraint]]:
        impl = self.implementation(config)
        env = self.values(config)
        groups = []
        for g in impl.groups:
            count = int(env.get(g.instances.var, g.instances.values[0]) if g.instances.var else g.instances.values[0])
            attrs = {}
            for aname, choice in g.attributes.items():
                val = env.get(choice.var, choice.values[0]) if choice.var else choice.values[0]
                key, val = crs_attribute(g.type, aname, val)
                if isinstance(val, int | float):
                    attrs[key] = common_pb2.AttributeRequest(number=float(val))
                else:
                    attrs[key] = common_pb2.AttributeRequest(text=str(val))
            groups.append(irm_pb2.ResourceGroup(name=g.id, resource_type=g.type, count=count, attributes=attrs))
        constraints = [irm_pb2.GroupConstraint(expression=c) for d in impl.distances for c in d.constraints]
        return groups, constraints

    def quote_per_minute(self, config: dict[str, Any]) -> float:
        groups, constraints = self.request(config)
        return self.crs.QuotePrice(irm_pb2.QuotePriceRequest(tenant=self.tenant, groups=groups,
                                                             constraints=constraints), timeout=10).price_per_minute

    def prices(self) -> np.ndarray:
        """Price per second of every configuration, from CRS quotes: +inf where the CRS refuses it for good (it
        never fits: priced out), NaN where it cannot quote it now (capacity in use, a manager away, a slow CRS),
        and where it was not asked: one quote per distinct request, at most MAX_QUOTES of them, spread evenly over
        the space (a space of 200 000 configurations asked one by one kept a session pricing for minutes), and none
        once the run is cancelled (StopProfiling stops a session still pricing)."""
        out = np.full(len(self.space), math.nan)
        requests: dict[str, list[int]] = {}
        for i, c in enumerate(self.space.configs):
            groups, _ = self.request(c)
            requests.setdefault(str([g.SerializeToString(deterministic=True) for g in groups]), []).append(i)
        asked = list(requests.values())
        if len(asked) > MAX_QUOTES:
            step = len(asked) / MAX_QUOTES
            asked = [asked[int(k * step)] for k in range(MAX_QUOTES)]
            log.info("quoting a sample of the configurations", extra={"requests": len(requests),
                                                                       "quoted": MAX_QUOTES})
        refused: dict[str, int] = {}
        example = ""
        self.momentary_gaps = False
        for members in asked:
            if self._is_cancelled():
                break
            try:
                price = self.quote_per_minute(self.space.configs[members[0]]) / 60.0
            except grpc.RpcError as e:
                # A refusal for good is an answer (the caller keeps it); only a momentary one is asked again.
                price = math.inf if never_quoted(e) else math.nan
                self.momentary_gaps = self.momentary_gaps or math.isnan(price)
                refused[e.code().name] = refused.get(e.code().name, 0) + 1
                example = example or f"{self.space.describe(members[0])}: {e.code().name}: {(e.details() or '')[:300]}"
            out[members] = price
        if self._is_cancelled():
            self.momentary_gaps = True           # cut short: the rest were never asked, not left out on purpose
        if refused:
            # One line for the whole space: a line per configuration wrote tens of megabytes for a large one.
            log.warning("no quote for some configurations", extra={"refused": refused, "example": example})
        return out

    def argv_env(self, config: dict[str, Any], input: str, part: Implementation | None = None,
                 extra: dict[str, Any] | None = None) -> tuple[list[str], dict[str, str]]:
        impl = part or self.implementation(config).parts[0]
        values = {**self.values(config, input), **(extra or {})}
        argv = [substitute(a, values) for a in impl.command]
        if impl.execution_args.strip():
            # Split the template, then substitute into each word: a value (a directory with a space or an
            # apostrophe) is one argument, never re-parsed as shell words. The service refuses a template
            # shlex cannot split at submit time.
            argv += [substitute(a, values) for a in shlex.split(impl.execution_args)]
        env = {k: substitute(v, values) for k, v in impl.env.items()}
        if impl.deployment_args:
            env["HARNESS_DEPLOYMENT_ARGS"] = substitute(impl.deployment_args, values)
        return argv, env

    def _is_cancelled(self) -> bool:
        return self.cancelled is not None and self.cancelled.is_set()

    def _cancelled_detail(self, proposal: Proposal, res: irm_pb2.Reservation | None, t0: float | None,
                          module: _ModuleRun | None = None) -> RunDetail:
        # The reservation was held from t0 until now: that much is spent, whatever the run measured.
        elapsed = time.monotonic() - t0 if t0 is not None else 0.0
        cost = res.price_per_minute * elapsed / 60.0 if res is not None else 0.0
        return RunDetail(Observation(proposal.config, False, elapsed, cost, proposal.input, error=self.cancel_reason,
                                     transient=True),
                         res.id if res is not None else "", module.tail()[-2000:] if module else "",
                         module.notes if module else [], cancelled=True)

    def run(self, proposal: Proposal, *, request_id: str = "", timeout_s: float = 0.0,
            cost_limit: float = 0.0) -> RunDetail:
        """One real run of `proposal`: reserved, run through the agents, measured, released. `timeout_s` bounds its
        time (0: this backend's), `cost_limit` a replayed run's cost (0: none; a live run's cost is its
        reservation's for its time, which `timeout_s` bounds)."""
        config = self.space.configs[proposal.config]
        groups, constraints = self.request(config)
        variant = self.implementation(config)
        rid = request_id or f"am-{uuid.uuid4().hex[:16]}"
        if self._is_cancelled():
            return self._cancelled_detail(proposal, None, None)
        reserve = irm_pb2.ReserveRequest(tenant=self.tenant, request_id=rid, groups=groups, constraints=constraints)
        try:
            res = self.crs.Reserve(reserve, timeout=RESERVE_TIMEOUT_S)
        except grpc.RpcError as e:
            if reserve_in_doubt(e):
                # The session goes on under new request ids: what the CRS may hold under this one is released later.
                self._release_later(Unreleased(self.tenant, rid, request=reserve), e)
            return RunDetail(Observation(proposal.config, False, 0.0, 0.0, proposal.input,
                                         error=f"could not reserve: {e.code().name}: {e.details()}",
                                         transient=e.code() in RUN_TRANSIENT_CODES, retry_after_s=retry_delay_s(e)))
        services: list[_ModuleRun] = []
        t0 = time.monotonic()
        try:
            if self.on_reserved is not None:
                try:
                    self.on_reserved(res.id)
                except Exception:  # noqa: BLE001 - shown at the end all the same; the run goes on
                    log.warning("could not record the run's reservation while it runs", exc_info=True,
                                extra={"reservation": res.id})
            if self._is_cancelled():
                return self._cancelled_detail(proposal, res, t0)
            env_common = resource_env(self.tenant, res, self.tenant_token)
            addresses = {f"%{g.name}_address": g.resources[0].address for g in res.groups if g.resources}
            limit = timeout_s or self.timeout_s
            # Services first, in manifest order, each ready before the next starts (it may need them).
            for part in variant.parts[1:]:
                svc = self._start(part, res, config, proposal.input, {**env_common}, addresses, limit)
                services.append(svc)
                if not svc.wait_ready(self.ready_timeout_s, self.cancelled):
                    if self._is_cancelled():
                        return self._cancelled_detail(proposal, res, t0, svc)
                    why = svc.failure() or f"did not print {READY_LINE} within {self.ready_timeout_s:g} s"
                    minutes = (time.monotonic() - t0) / 60.0
                    return RunDetail(Observation(proposal.config, False, 0.0, res.price_per_minute * minutes,
                                                 proposal.input, error=f"service module {part.module!r}: {why}"),
                                     res.id, svc.tail())
                env_common[f"HARNESS_MODULE_{_env_key(part.module)}_ENDPOINT"] = svc.endpoint
            startup_s = time.monotonic() - t0
            main = self._start(variant.parts[0], res, config, proposal.input, env_common, addresses, limit,
                               cost_limit)
            if not main.join(self.cancelled):
                # Stopped through the agent, as its timeout would stop it: the process must not outlive the
                # reservation released below.
                main.stop()
                if not main.join(timeout=_STOP_WAIT_S):
                    main.abandon()
                return self._cancelled_detail(proposal, res, t0, main)
            exited = main.exited
            if exited is None:
                # The agent went away mid-run (its stream broke): a failed run that held its reservation this long,
                # not an error of the caller's -- an execution must end "failed", a session go on to the next run.
                elapsed = time.monotonic() - t0
                why = main.error or "the agent's stream ended without an exit status"
                return RunDetail(Observation(proposal.config, False, elapsed, res.price_per_minute * elapsed / 60.0,
                                             proposal.input, error=f"the run was lost: {why}",
                                             transient=main.error_code is None or main.error_code in RUN_TRANSIENT_CODES),
                                 res.id, main.tail())
            minutes = (exited.wall_time_s + startup_s) / 60.0
            cost = run_cost(exited, res.price_per_minute * minutes)
            self.replaying = replayed(exited)
            ok = exited.exit_code == 0 and not exited.reason
            tail = main.tail()
            error = ""
            if not ok:
                last = tail.splitlines()[-1] if tail else ""
                error = exited.reason or f"exit code {exited.exit_code}" + (f": {last}" if last else "")
            for svc in services:
                if ok and (why := svc.failure()):
                    ok, error = False, f"service module {svc.part.module!r} {why} while the application ran"
            samples = main.samples
            mem = max((s.memory_percent for s in samples), default=None)
            if main.memory_limit_mb > 0 and exited.peak_memory_mb > 0:
                # The peak the agent measured (its high-water marks catch what falls between samples): a run
                # shorter than one sampling interval has no sample at all, and read as using no memory.
                mem = max(mem or 0.0, exited.peak_memory_mb / main.memory_limit_mb * 100.0)
            neighbours = exited.reason.startswith(MACHINE_OUT_OF_MEMORY)
            if exited.reason and "memory" in exited.reason and not neighbours:
                mem = max(mem or 0.0, 100.0)
            cpu = exited.mean_cpu_percent if samples else None
            # A run the machine's shortage ended says nothing of its configuration's memory: transient, and no
            # bottleneck for the profilers to grow memory for.
            transient = not ok and (exited.reason in ENDED_FROM_OUTSIDE or neighbours)
            return RunDetail(Observation(proposal.config, ok, exited.wall_time_s, cost, proposal.input, cpu, mem, error,
                                         transient=transient),
                             res.id, tail[-2000:], main.notes)
        except grpc.RpcError as e:
            # The agent out of reach is the cloud's trouble, not the configuration's; a refusal of the request is.
            return RunDetail(Observation(proposal.config, False, 0.0, 0.0, proposal.input,
                                         error=f"could not run: {e.code().name}: {e.details()}",
                                         transient=e.code() in RUN_TRANSIENT_CODES),
                             res.id)
        finally:
            for svc in services:
                svc.stop()
            try:
                self.crs.ReleaseReservation(irm_pb2.ReleaseReservationRequest(tenant=self.tenant,
                                                                              reservation_id=res.id), timeout=30)
            except grpc.RpcError as e:
                if e.code() != grpc.StatusCode.NOT_FOUND:
                    self._release_later(Unreleased(self.tenant, rid, res.id), e)

    def _release_later(self, left: Unreleased, e: grpc.RpcError) -> None:
        log.warning("could not release a run's reservation now" if left.reservation_id else
                    "a Reserve failed without an answer: the CRS may hold a reservation under its request id",
                    extra={"reservation": left.reservation_id, "request_id": left.request_id, "code": str(e.code()),
                           "kept": self.release_later is not None})
        if self.release_later is not None:
            try:
                self.release_later(left)
            except Exception:  # noqa: BLE001 - a run's outcome stands; the log above names what to release
                log.exception("could not keep a reservation to release later: release it at the CRS",
                              extra={"reservation": left.reservation_id, "request_id": left.request_id})

    def _start(self, part: Implementation, res: irm_pb2.Reservation, config: dict[str, Any], input: str,
               env_common: dict[str, str], addresses: dict[str, str], limit: float,
               cost_limit: float = 0.0) -> _ModuleRun:
        vm = next(r for g in res.groups if g.name == part.master().id for r in g.resources)
        argv, env = self.argv_env(config, input, part, addresses)
        env.update(env_common)
        stub = agent_pb2_grpc.ExecutionAgentStub(tenants.delegating(client.channel(vm.address),
                                                                    self.delegation_token))
        run = _ModuleRun(part, stub, self.tenant, vm.id)
        run.start(argv, env, limit, cost_limit)
        return run


def _env_key(name: str) -> str:
    return "".join(ch if ch.isalnum() else "_" for ch in name).upper()


class _ModuleRun:
    """One module's execution through its agent, its event stream drained on its own thread."""

    def __init__(self, part: Implementation, stub: agent_pb2_grpc.ExecutionAgentStub, tenant: str, vm_id: str) -> None:
        self.part = part
        self.stub = stub
        self.tenant = tenant
        self.vm_id = vm_id
        self.execution_id = ""
        self.exited: agent_pb2.ExecutionExited | None = None
        self.samples: list[agent_pb2.UtilisationSample] = []
        self.notes: list[str] = []
        self.memory_limit_mb = 0.0       # the VM's memory as the agent enforces it (ExecutionStarted)
        self.endpoint = ""
        self.error = ""
        self.error_code: grpc.StatusCode | None = None
        self._stream: Any = None
        self._out = b""
        self._lines = b""
        self._ready = threading.Event()
        self._started = threading.Event()
        self._done = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, argv: list[str], env: dict[str, str], limit: float, cost_limit: float = 0.0) -> None:
        stream = self.stub.Execute(agent_pb2.ExecuteRequest(tenant=self.tenant, vm_id=self.vm_id, argv=argv,
                                                            env=env, timeout_s=limit, replay_cost_limit=cost_limit),
                                   timeout=limit + 60)
        self._stream = stream
        self._thread = threading.Thread(target=self._drain, args=(stream,), name=f"module-{self.part.module}",
                                        daemon=True)
        self._thread.start()

    def _drain(self, stream: Any) -> None:
        try:
            for ev in stream:
                kind = ev.WhichOneof("event")
                if kind in ("stdout", "stderr"):
                    chunk = getattr(ev, kind)
                    self._out = (self._out + chunk)[-4000:]
                    if kind == "stdout" and not self._ready.is_set():
                        self._scan(chunk)
                elif kind == "sample":
                    self.samples.append(ev.sample)
                elif kind == "started":
                    self.execution_id = ev.started.execution_id
                    self.notes = list(ev.started.notes)
                    self.memory_limit_mb = ev.started.memory_limit_mb
                    self._started.set()
                elif kind == "exited":
                    self.exited = ev.exited
        except grpc.RpcError as e:
            self.error = f"{e.code().name}: {e.details()}"
            self.error_code = e.code()
        finally:
            self._done.set()
            self._started.set()
            self._ready.set()  # a module that ended is not going to become ready: wake the waiter

    def _scan(self, chunk: bytes) -> None:
        self._lines += chunk
        *lines, self._lines = self._lines.split(b"\n")
        for line in lines:
            text = line.decode(errors="replace").strip()
            if text == READY_LINE or text.startswith(READY_LINE + " "):
                self.endpoint = text[len(READY_LINE):].strip()
                self._ready.set()
                return

    def wait_ready(self, timeout: float, cancelled: threading.Event | None = None) -> bool:
        return _wait(self._ready, timeout, cancelled) and not self._done.is_set()

    def join(self, cancelled: threading.Event | None = None, timeout: float | None = None) -> bool:
        """Whether the module ended (False: `cancelled` was set, or `timeout` passed, first)."""
        return _wait(self._done, timeout, cancelled)

    def abandon(self) -> None:
        """Stop following it: the agent detaches, and its own timeout still ends the command."""
        if self._stream is not None:
            self._stream.cancel()

    def failure(self) -> str:
        """Why this service is no longer serving, or "" while it runs."""
        if self.error:
            return f"failed: {self.error}"
        if self.exited is not None:
            e = self.exited
            return f"exited ({e.reason or f'exit code {e.exit_code}'})"
        if self._done.is_set():
            return "ended without an exit status"
        return ""

    def tail(self) -> str:
        return self._out.decode(errors="replace").strip()

    def stop(self) -> None:
        # Stopped right after it was asked for, its id may not have arrived yet: without it there is
        # nothing to stop, and the command would run on.
        self._started.wait(_STOP_WAIT_S)
        if self._done.is_set() or not self.execution_id:
            return
        try:
            self.stub.StopExecution(agent_pb2.StopExecutionRequest(tenant=self.tenant,
                                                                   execution_id=self.execution_id), timeout=10)
        except grpc.RpcError as e:
            log.warning("could not stop a service module", extra={"module": self.part.module,
                                                                  "code": str(e.code())})


def resource_env(tenant: str, res: irm_pb2.Reservation, token: str = "") -> dict[str, str]:
    """What the application learns of its reservation: per group, the resource ids and addresses.

    HARNESS_TENANT, HARNESS_GROUP_<GROUPID>_IDS (comma-separated) and
    HARNESS_GROUP_<GROUPID>_ADDRESSES; for a virtual FPGA the id is the FPGA
    group to attach to and the address the Orchestrator. HARNESS_TENANT_TOKEN: the tenant's token, when the
    call that asked for the run sent one (the client library sends it, e.g. VirtualFpga.attach).
    """
    env = {"HARNESS_TENANT": tenant}
    if token:
        env[tenants.ENV_TOKEN] = token
    for g in res.groups:
        key = _env_key(g.name)
        ids = [r.id for r in g.resources]
        addrs = [r.address for r in g.resources]
        prev_ids = env.get(f"HARNESS_GROUP_{key}_IDS")
        env[f"HARNESS_GROUP_{key}_IDS"] = ",".join(([prev_ids] if prev_ids else []) + ids)
        prev = env.get(f"HARNESS_GROUP_{key}_ADDRESSES")
        env[f"HARNESS_GROUP_{key}_ADDRESSES"] = ",".join(([prev] if prev else []) + addrs)
    return env
