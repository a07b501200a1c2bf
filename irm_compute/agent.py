"""The execution agent of the compute IRM (thesis §5.1.3, the ConPaaS agent).

One agent per physical host serves `harness.v1.ExecutionAgent`: it runs
tenants' commands inside their VMs' confines and measures them. It learns a
VM's shape and owner from the compute IRM (`ComputeControl/GetVm`), caches it
per VM and forgets it when the compute IRM calls `ReleaseVm`.

The back-end is `local` (irm_compute.sandbox): a VM is a confined local
process tree. Executions live in memory: running ones until they end, finished
ones (with their samples, for GetExecution and GetVmMetrics) up to
`max_history` in all, beyond which the oldest of the VM holding the most go, scratch directory included (one
tenant's many runs push out its own, never another's).

An agent that died without its shutdown (SIGKILL, the OOM killer, a crash)
could not kill what it ran: its successor on the same `work_dir` does, at
start-up, finding the processes by their execution mark (whose prefix names
the work dir) and by the ledger the agent keeps in the work dir
(`processes.json`: what its scans placed, and their groups and sessions: a
child that dropped the mark with an environment of its own), and removes the
scratch directories no execution owns any more. What those executions were is
not kept: the successor knows none of them (GetExecution: NOT_FOUND).

While it serves, the agent is a child subreaper (irm_compute.processes): what its
executions' processes orphan becomes its child, not init's, so a daemon that
leaves an execution's tree is still that execution's. Its process must
therefore start nothing but executions (`harness serve agent` starts nothing else).
"""

from __future__ import annotations

import errno
import hashlib
import logging
import math
import os
import re
import shutil
import threading
import time
import uuid
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

import grpc
import psutil

from harness.v1 import agent_pb2, agent_pb2_grpc, common_pb2, compute_pb2, compute_pb2_grpc
from irm_compute.processes import PROCESSES, leftovers
from irm_compute.replay import ReplayBackend, ReplayedExited
from irm_compute.sandbox import (
    CpuAllocator,
    Event,
    Exited,
    LocalExecution,
    Output,
    Sample,
    Started,
    VmMemory,
    VmSlot,
    decimate,
    find_marked,
    merge_utilisation,
)
from services import control, pidlock, tenants, tls
from services.config import check_seconds
from services.errors import (
    CAPACITY_IN_USE,
    MANAGER_UNAVAILABLE,
    RETRY_LATER_S,
    STREAM_CAP,
    VM_RELEASED,
    FailedPrecondition,
    HarnessError,
    InvalidArgument,
    NotFound,
    ResourceExhausted,
    Unavailable,
    Violations,
    owned,
    require_since,
    require_tenant,
)
from services.server import CallCap, Component
from services.tls import TlsSettings

log = logging.getLogger(__name__)
# How often a misconfiguration the compute IRM's answers show (another control token, no compute IRM there) is
# logged at most.
MISCONFIGURED_LOG_S = 60.0

SERVICE_NAME = agent_pb2.DESCRIPTOR.services_by_name["ExecutionAgent"].full_name

RELEASED = "vm released"
AGENT_STOPPED = "agent stopped"
# In the work dir: the processes of running executions, for a successor to kill (irm_compute.processes).
LEDGER_NAME = "processes.json"
# How long StopExecution / ReleaseVm / shutdown wait for a killed tree to be reaped.
_KILL_WAIT_S = 5.0
# Released VM ids remembered so a late Execute cannot start on one (bounded: ids are never reused).
_RELEASED_MEMORY = 10_000
# An execution's scratch directory: its id (removed at start-up if no execution owns it).
_SCRATCH_NAME = re.compile(r"ex-[0-9a-f]{32}")
# gRPC worker threads beyond the Execute streams: unary calls (StopExecution, GetExecution, ReleaseVm,
# GetVmMetrics, health) always find one free.
_CONTROL_WORKERS = 16
# The points of each series GetVmMetrics answers with, at most (older ones merged: mean CPU, peak memory): a VM's
# executions' samples together, unbounded, would pass gRPC's 4 MiB message limit.
MAX_VM_METRICS_SAMPLES = 4096
# The most bytes the kernel passes to a program as one argument or environment variable (MAX_ARG_STRLEN,
# 32 pages, with its terminating NUL); a larger one fails the exec with E2BIG.
_MAX_ARG_STRLEN = 32 * 4096


@dataclass
class AgentConfig(TlsSettings):
    address: str = "127.0.0.1:50071"
    # The compute IRM's ComputeControl service, asked for VM shapes.
    compute_address: str = "127.0.0.1:50061"
    sample_interval_s: float = 0.5
    # Scratch directories, one per execution that names no working_dir.
    work_dir: str = "~/.harness/agent"
    # Output streamed per execution; beyond it output is read and dropped.
    max_output_bytes: int = 16 * 1024 * 1024
    # Finished executions kept in memory (and their scratch directories on disk), in all; beyond, the oldest of
    # the VM that holds the most go.
    max_history: int = 1000
    # Deadline of the GetVm call to the compute IRM.
    compute_timeout_s: float = 5.0
    # "local": run commands for real; "replay": answer each execution with a
    # measured run from `dataset` (see irm_compute.replay), without running it.
    backend: str = "local"
    dataset: str = ""
    # How stale the agent's knowledge that a VM is still reserved may be: an Execute on a VM not confirmed
    # for this long asks the compute IRM first (0: every time), and a background check (at least every
    # 0.1 s) kills what runs on VMs it released. The IRM also tells the agent of a release, once and best
    # effort; this makes a missed one harmless.
    vm_check_interval_s: float = 2.0
    # Shared with the compute IRM (services.control): sent with GetVm, required on ReleaseVm and GetVmMetrics
    # (the compute IRM's calls). Empty: nothing sent or checked (development).
    control_token: str = ""
    # Tenants and their tokens' digests (services.tenants): a call naming a tenant must carry its token, or the
    # delegation token of the services acting for tenants (the CRS, the AM), checked against `delegation_sha256`.
    # Empty: any caller may name any tenant (development).
    tenants_file: str = ""
    # The SHA-256 of the CRS's and the AM's delegation_token ("sha256:<hex>"; `harness tenant delegation`): never
    # the token itself, which would let whoever reads this service's settings act for every tenant.
    delegation_sha256: str = ""
    # The hosts (inventory ids, comma-separated) whose VMs this agent runs: one per agent on a real host
    # ("r1-h1"); an Execute on a VM reserved on any other host is refused, since it would run outside the
    # capacity reserved for it. Empty: every host, one agent standing in for the whole inventory (the
    # single-machine suite `harness up` and compose start, whose compute IRM names this agent for all hosts).
    hosts: str = ""
    # Execute streams open at once; one more is RESOURCE_EXHAUSTED. Each holds a gRPC worker thread while it
    # streams; the server gets this many plus a reserve for the other calls, which therefore never wait.
    max_execute_streams: int = 64
    # Executions running at once; one more Execute is RESOURCE_EXHAUSTED (CAPACITY_IN_USE). A client that cancels
    # its stream leaves its run going (GetExecution follows it), so max_execute_streams does not bound the runs:
    # this does, and with them the processes and threads (four per run) the agent keeps.
    max_executions: int = 256
    # Memory (MB) of this machine no VM may have: a VM's memory limit is at most the machine's memory (its RAM,
    # or its cgroup's limit) less this; a larger VM runs confined to that, and its executions say so. Negative:
    # automatic, a tenth of the machine, at least 512 MB and at most half.
    memory_reserve_mb: float = -1.0


class ComputeClient:
    """`ComputeControl/GetVm` with a deadline, its failures as domain errors."""

    def __init__(self, address: str, timeout_s: float = 5.0, control_token: str = "") -> None:
        self.address = address
        self.timeout_s = timeout_s
        self.control_token = control_token
        self._lock = threading.Lock()
        self._channel: grpc.Channel | None = None
        self._stub: compute_pb2_grpc.ComputeControlStub | None = None
        self._said: dict[str, float] = {}      # misconfigurations logged: when (see _misconfigured)

    def get_vm(self, vm_id: str) -> compute_pb2.Vm:
        with self._lock:
            # Created on first use, not at import or construction: gRPC objects must not cross a fork.
            if self._stub is None:
                self._channel = tls.open_channel(self.address)
                self._stub = compute_pb2_grpc.ComputeControlStub(control.channel(self._channel, self.control_token))
            stub = self._stub
        try:
            return stub.GetVm(compute_pb2.GetVmRequest(vm_id=vm_id), timeout=self.timeout_s)
        except grpc.RpcError as e:
            code, details = e.code(), e.details()  # type: ignore[attr-defined]
            if code == grpc.StatusCode.NOT_FOUND:
                raise NotFound(f"VM {vm_id!r} is unknown to the compute IRM") from None
            if code == grpc.StatusCode.INVALID_ARGUMENT:
                raise InvalidArgument.of("vm_id", details or "rejected by the compute IRM") from None
            if code == grpc.StatusCode.UNAUTHENTICATED:
                # Not UNAVAILABLE: retrying cannot help until an operator makes the tokens agree -- who is told
                # here too (the tenant's refusal alone reached no operator).
                self._misconfigured("the compute IRM rejects this agent's control token",
                                    "set the agent's control_token to the compute IRM's")
                raise FailedPrecondition(
                    f"compute IRM at {self.address} rejected this agent's control token while looking up VM "
                    f"{vm_id!r}: the agent's control_token differs from the compute IRM's; set both to the same "
                    "secret"
                ) from None
            if code == grpc.StatusCode.UNIMPLEMENTED:
                self._misconfigured(f"the service at compute_address {self.address} is no compute IRM (it has no "
                                    "ComputeControl)", "set the agent's compute_address to its compute IRM's")
                raise FailedPrecondition(
                    f"this agent's compute_address {self.address} is no compute IRM (it answers UNIMPLEMENTED for "
                    f"ComputeControl.GetVm) while looking up VM {vm_id!r}: the operator must point the agent at its "
                    "compute IRM"
                ) from None
            if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                raise Unavailable(
                    f"compute IRM at {self.address} unreachable ({code.name}) while looking up VM {vm_id!r}; retry later",
                    reason=MANAGER_UNAVAILABLE, retry_after_s=RETRY_LATER_S,
                ) from None
            raise Unavailable(
                f"compute IRM at {self.address} failed to describe VM {vm_id!r}: {code.name}: {details}"
            ) from None

    def _misconfigured(self, what: str, fix: str) -> None:
        """Log an operator's misconfiguration the compute IRM's answer shows, once a minute."""
        now = time.monotonic()
        with self._lock:
            if now - self._said.get(what, -math.inf) < MISCONFIGURED_LOG_S:
                return
            self._said[what] = now
        log.error(f"{what} (logged once a minute)", extra={"compute_address": self.address, "fix": fix})

    def close(self) -> None:
        with self._lock:
            if self._channel is not None:
                self._channel.close()
            self._channel = self._stub = None


@dataclass
class _Vm:
    tenant: str
    slot: VmSlot
    memory: VmMemory            # shared by the VM's executions
    confirmed: float = 0.0      # monotonic time the compute IRM last said it is active (set under the lock)


@dataclass
class _Run:
    execution: LocalExecution
    tenant: str
    vm_id: str
    scratch: Path | None  # removed with the execution when it leaves the history


def mark_prefix(work_dir: str) -> str:
    """How the execution marks of an agent on `work_dir` begin: a digest of the directory, so a restarted agent
    (same dir) recognises what its predecessor left running, and agents on other dirs leave each other alone."""
    work = str(Path(work_dir).expanduser().resolve())
    return f"agent-{hashlib.sha256(work.encode()).hexdigest()[:16]}-"


def kill_leftovers(work: Path) -> int:
    """Kill the processes of executions an agent on `work` left running (by their mark and its ledger) and return
    how many: what a restarted agent does first, and what `harness down` and a suite giving up on its agent do
    (no agent starting again, its tenants' programs would run on past the suite)."""
    killed = 0
    prefix = mark_prefix(str(work))
    for _ in range(3):  # a process may fork between the scan and the kill: its child is found next round
        left = list({p.pid: p for p in [*find_marked(prefix), *leftovers(work / LEDGER_NAME)]}.values())
        if not left:
            break
        for p in left:
            try:
                p.kill()
            except psutil.Error:
                pass
        psutil.wait_procs(left, timeout=_KILL_WAIT_S)
        killed += len(left)
    return killed


class Agent:
    """The agent's state and operations; the servicer below only translates messages."""

    def __init__(
        self, config: AgentConfig, compute: ComputeClient, allocator: CpuAllocator | None = None
    ) -> None:
        self.config = config
        self.compute = compute
        # The machine's memory is read here, at start-up: a reserve leaving nothing for VMs is refused now.
        self.allocator = allocator or CpuAllocator(reserve_mb=config.memory_reserve_mb)
        self._lock = threading.Lock()
        self._vms: dict[str, _Vm] = {}
        self._released: OrderedDict[str, str] = OrderedDict()  # vm_id -> tenant
        self._runs: dict[str, _Run] = {}
        self._born = time.time()
        # Finished executions by VM, oldest first in each (`_finished_one`), and how many in all.
        self._finished: dict[str, OrderedDict[str, None]] = {}
        self._finished_count = 0
        self.replay: ReplayBackend | None = None
        self._stop = threading.Event()
        self._checker: threading.Thread | None = None
        self._work_lock: int | None = None     # see `_lock_work_dir`
        self._adopting = False                 # a child subreaper (see `open`)
        self._ledger: Path | None = None       # the process ledger kept for a successor (see `open`)
        if config.backend == "replay":
            self.replay = ReplayBackend.load(config.dataset)
        elif config.backend != "local":
            raise ValueError(f"agent backend {config.backend!r}: use 'local' or 'replay'")
        if config.max_execute_streams < 1:
            raise ValueError(f"agent max_execute_streams {config.max_execute_streams}: at least 1")
        if config.max_executions < 1:
            raise ValueError(f"agent max_executions {config.max_executions}: at least 1")
        # Its seconds as `harness serve` checks them: a compute_timeout_s of 0 failed every GetVm at once, a
        # sample_interval_s of 0 spun every execution's sampler (vm_check_interval_s may be 0: documented).
        check_seconds(config, "agent")
        self.hosts = frozenset(h.strip() for h in config.hosts.split(",") if h.strip())
        self.mark_prefix = mark_prefix(config.work_dir)

    # --- VMs ------------------------------------------------------------------

    def _vm(self, tenant: str, vm_id: str) -> _Vm:
        with self._lock:
            cached = self._vms.get(vm_id)
            released_owner = self._released.get(vm_id)
        if released_owner:
            owned(tenant, released_owner, f"VM {vm_id}")
            raise FailedPrecondition(f"VM {vm_id} was released", reason=VM_RELEASED)
        if cached is not None:
            owned(tenant, cached.tenant, f"VM {vm_id}")
            if time.monotonic() - cached.confirmed <= self.config.vm_check_interval_s:
                return cached
            if self._released_at_compute(vm_id):
                raise FailedPrecondition(f"VM {vm_id} was released", reason=VM_RELEASED)
            return cached

        # Outside the lock: a slow compute IRM must not stall other VMs. Also asked for a VM released
        # before it ever ran here (owner unknown), so another tenant learns nothing but "not yours".
        vm = self.compute.get_vm(vm_id)
        owned(tenant, vm.tenant, f"VM {vm_id}")
        if vm.state == compute_pb2.Vm.STATE_RELEASED or released_owner is not None:
            raise FailedPrecondition(f"VM {vm_id} was released", reason=VM_RELEASED)
        if self.hosts and vm.host not in self.hosts:
            raise FailedPrecondition(
                f"VM {vm_id} is reserved on host {vm.host!r}; this agent serves host(s) "
                f"{', '.join(sorted(self.hosts))}: run it through the agent at the VM's address (its reservation "
                "gives it)")
        if not (vm.cores > 0 and vm.memory_gb > 0):
            raise FailedPrecondition(
                f"VM {vm_id} has no usable shape ({vm.cores:g} cores, {vm.memory_gb:g} GB)"
            )
        slot = None
        with self._lock:
            if vm_id in self._released:  # released while we were asking
                raise FailedPrecondition(f"VM {vm_id} was released", reason=VM_RELEASED)
            cached = self._vms.get(vm_id)  # another request may have cached it meanwhile
            if cached is None:
                slot = self.allocator.slot(vm_id, vm.cores, vm.memory_gb * 1024)
                cached = self._vms[vm_id] = _Vm(vm.tenant, slot, VmMemory(slot.memory_mb), time.monotonic())
        if slot is not None and slot.memory_mb < slot.vm_memory_mb:
            # The compute IRM promised more than is here: its inventory describes a host larger than this machine.
            log.warning("VM larger than this machine: its memory confined to what the machine can give",
                        extra={"vm": vm_id, "host": vm.host, "vm_memory_mb": round(slot.vm_memory_mb),
                               "limit_mb": round(slot.memory_mb)})
        return cached

    def _released_at_compute(self, vm_id: str) -> bool:
        """Ask the compute IRM whether the VM is still reserved; if not, release it here (kill what runs).

        Unreachable, the answer is "still reserved" (the agent keeps serving on what it knew) and the next
        check asks again.
        """
        try:
            vm = self.compute.get_vm(vm_id)
        except NotFound:
            released = True
        except HarnessError as e:
            log.warning("could not confirm a VM with the compute IRM", extra={"vm": vm_id, "reason": str(e)})
            return False
        else:
            released = vm.state == compute_pb2.Vm.STATE_RELEASED
        if released:
            log.warning("VM released at the compute IRM without word to this agent: releasing it",
                        extra={"vm": vm_id})
            self.release_vm(vm_id)
            return True
        with self._lock:
            cached = self._vms.get(vm_id)
            if cached is not None:
                cached.confirmed = time.monotonic()
        return False

    def _check_vms(self) -> None:
        while not self._stop.wait(max(self.config.vm_check_interval_s, 0.1)):
            with self._lock:
                stale = [k for k, v in self._vms.items()
                         if time.monotonic() - v.confirmed > self.config.vm_check_interval_s]
            for vm_id in stale:
                try:
                    self._released_at_compute(vm_id)
                except Exception:  # noqa: BLE001 - the checker must outlive one bad answer
                    log.exception("VM check failed", extra={"vm": vm_id})

    def release_confirmed(self, vm_id: str) -> int:
        """ReleaseVm: `release_vm` once the compute IRM says the VM is released (or never was): the call names
        no tenant, and anyone who can reach the agent could otherwise kill a reserved VM's executions."""
        if not vm_id:
            raise InvalidArgument.of("vm_id", "required")
        try:
            vm = self.compute.get_vm(vm_id)
        except NotFound:
            pass
        except FailedPrecondition:
            raise                                   # the tokens disagree: "retry later" would not help
        except HarnessError as e:
            raise Unavailable(f"cannot confirm with the compute IRM that VM {vm_id} is released ({e}); "
                              "retry later (the agent also re-checks its VMs on its own)",
                              reason=MANAGER_UNAVAILABLE, retry_after_s=RETRY_LATER_S) from None
        else:
            if vm.state != compute_pb2.Vm.STATE_RELEASED:
                raise FailedPrecondition(f"VM {vm_id} is still reserved at the compute IRM: release its "
                                         "reservation there")
        return self.release_vm(vm_id)

    def release_vm(self, vm_id: str) -> int:
        """Kill the VM's running executions and forget it; returns how many were killed."""
        if not vm_id:
            raise InvalidArgument.of("vm_id", "required")
        with self._lock:
            vm = self._vms.pop(vm_id, None)
            self._released[vm_id] = vm.tenant if vm else self._released.get(vm_id, "")
            self._released.move_to_end(vm_id)
            while len(self._released) > _RELEASED_MEMORY:
                self._released.popitem(last=False)
            running = [r.execution for r in self._runs.values() if r.vm_id == vm_id and r.execution.running]
        if vm is not None:
            self.allocator.free(vm.slot)
        killed = sum(e.kill(RELEASED) for e in running)
        for e in running:
            e.wait(_KILL_WAIT_S)
        log.info("vm released", extra={"vm_id": vm_id, "killed": killed})
        return killed

    # --- executions -----------------------------------------------------------

    def execute(self, request: agent_pb2.ExecuteRequest) -> _Run:
        v = Violations()
        v.check(bool(request.tenant), "tenant", "required: name the calling tenant")
        v.check(bool(request.vm_id), "vm_id", "required")
        if v.check(len(request.argv) > 0, "argv", "required: the program and its arguments"):
            v.check(bool(request.argv[0]), "argv", "argv[0], the program, must not be empty")
            v.check(all("\0" not in a for a in request.argv), "argv", "must not contain NUL characters")
        v.check(
            math.isfinite(request.timeout_s) and request.timeout_s >= 0,
            "timeout_s",
            "seconds >= 0 (0: no limit)",
        )
        v.check(math.isfinite(request.replay_cost_limit) and request.replay_cost_limit >= 0, "replay_cost_limit",
                "a cost >= 0 (0: no limit)")
        for key, value in request.env.items():
            if v.check(
                bool(key) and "=" not in key and "\0" not in key + value,
                f"env[{key!r}]",
                "not a valid variable",
            ):
                size = len(f"{key}={value}".encode()) + 1
                v.check(size <= _MAX_ARG_STRLEN, f"env[{key!r}]",
                        f"{size} bytes as a variable; the kernel passes at most {_MAX_ARG_STRLEN} bytes per variable "
                        "to a program: pass it in a file instead")
        for i, arg in enumerate(request.argv):
            size = len(arg.encode()) + 1
            v.check(size <= _MAX_ARG_STRLEN, "argv",
                    f"argument {i} is {size} bytes; the kernel passes at most {_MAX_ARG_STRLEN} bytes per argument to "
                    "a program: pass it in a file instead")
        if request.working_dir:
            v.check(
                os.path.isabs(request.working_dir) and os.path.isdir(request.working_dir),
                "working_dir",
                "an existing absolute directory on the VM's host (empty for a fresh scratch directory)",
            )
        v.raise_if_any()
        require_tenant(request.tenant)
        vm = self._vm(request.tenant, request.vm_id)

        execution_id = f"ex-{uuid.uuid4().hex}"
        if self.replay is not None:
            # Nothing runs, so no scratch directory; a refused replay (no measured run) leaves nothing.
            execution = self.replay.execution(execution_id, list(request.argv), dict(request.env),
                                              on_exit=self._finished_one, timeout_s=request.timeout_s,
                                              cost_limit=request.replay_cost_limit)
            scratch = None
        else:
            scratch = None if request.working_dir else Path(self.config.work_dir).expanduser() / execution_id
            execution = LocalExecution(
                execution_id,
                vm.slot,
                list(request.argv),
                working_dir=request.working_dir or str(scratch),
                env={**self._platform_env(), **request.env},
                timeout_s=request.timeout_s,
                sample_interval_s=self.config.sample_interval_s,
                max_output_bytes=self.config.max_output_bytes,
                on_exit=self._finished_one,
                vm_memory=vm.memory,
                mark_prefix=self.mark_prefix,
            )
        with self._lock:
            self._check_running_cap()     # before making anything; checked again, for sure, at the spawn
        if scratch is not None:
            self._make_scratch(scratch)
        run = _Run(execution, request.tenant, request.vm_id, scratch)
        try:
            # Spawn under the lock: ReleaseVm then either sees this execution and kills it, or
            # has marked the VM released before we look, so nothing starts on a released VM.
            with self._lock:
                if request.vm_id in self._released:
                    raise FailedPrecondition(f"VM {request.vm_id} was released", reason=VM_RELEASED)
                self._check_running_cap()
                execution.start()
                self._runs[execution_id] = run
        except FileNotFoundError:
            self._remove_scratch(scratch)
            raise InvalidArgument.of(
                "argv", f"program {request.argv[0]!r} not found on the VM's host"
            ) from None
        except PermissionError:
            self._remove_scratch(scratch)
            raise InvalidArgument.of(
                "argv", f"program {request.argv[0]!r} is not an executable file (a directory, or no execute "
                "permission)") from None
        except OSError as e:
            self._remove_scratch(scratch)
            if e.errno == errno.E2BIG:
                # Each argument and variable passed the per-string check: together they are over the exec's limit.
                raise InvalidArgument.of(
                    "env", f"{request.argv[0]!r} cannot start with this environment and these arguments: together "
                    f"they are larger than the kernel passes to a program (E2BIG, {e.strerror}); pass large "
                    "values in files instead") from None
            raise FailedPrecondition(f"could not start {request.argv[0]!r}: {e}") from None
        except ValueError as e:  # e.g. NUL in env
            self._remove_scratch(scratch)
            raise FailedPrecondition(f"could not start {request.argv[0]!r}: {e}") from None
        except BaseException:
            self._remove_scratch(scratch)
            raise
        log.info(
            "execution started",
            extra={"execution_id": execution_id, "vm_id": request.vm_id, "cpus": vm.slot.cpus},
        )
        return run

    def _check_running_cap(self) -> None:
        """(Under the lock.) RESOURCE_EXHAUSTED if `max_executions` run already."""
        running = sum(1 for r in self._runs.values() if r.execution.running)
        if running >= self.config.max_executions:
            raise ResourceExhausted(
                f"{running} executions are running on this agent, its most (max_executions="
                f"{self.config.max_executions}); retry when one ends", reason=CAPACITY_IN_USE,
                retry_after_s=RETRY_LATER_S)

    def _make_scratch(self, scratch: Path) -> None:
        try:
            scratch.mkdir(parents=True)
        except OSError as e:
            if e.errno in (errno.ENOSPC, errno.EDQUOT):
                raise ResourceExhausted(
                    f"no space on this agent's host for the execution's scratch directory ({scratch}: {e.strerror});"
                    " retry later, or name a working_dir", retry_after_s=RETRY_LATER_S) from None
            raise FailedPrecondition(
                f"this agent cannot create the execution's scratch directory {scratch} ({e.strerror}): its work_dir "
                "must be writable (an operator's fix); or name a working_dir") from None

    def _finished_one(self, execution: LocalExecution) -> None:
        """Keep at most `max_history` finished executions; beyond, the oldest of the VM that holds the most go, with
        their scratch dirs. Agent-wide oldest-first let one tenant running many short commands push every other
        tenant's executions out -- their GetExecution, their scratch files and the utilisation history of their VMs
        (GetVmMetrics is built from the executions kept)."""
        evicted: list[_Run] = []
        with self._lock:
            run = self._runs.get(execution.execution_id)
            vm = run.vm_id if run is not None else ""
            self._finished.setdefault(vm, OrderedDict())[execution.execution_id] = None
            self._finished_count += 1
            while self._finished_count > self.config.max_history:
                fullest = max(self._finished, key=lambda v: len(self._finished[v]))
                old, _ = self._finished[fullest].popitem(last=False)
                if not self._finished[fullest]:
                    del self._finished[fullest]
                self._finished_count -= 1
                if (gone := self._runs.pop(old, None)) is not None:
                    evicted.append(gone)
        for gone in evicted:
            self._remove_scratch(gone.scratch)

    @staticmethod
    def _remove_scratch(scratch: Path | None) -> None:
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)

    def get(self, tenant: str, execution_id: str) -> _Run:
        require_tenant(tenant)
        if not execution_id:
            raise InvalidArgument.of("execution_id", "required")
        with self._lock:
            run = self._runs.get(execution_id)
        if run is None:
            born = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self._born))
            raise NotFound(
                f"execution {execution_id!r} not found: unknown, dropped from the agent's history, or run by an "
                f"earlier agent process (this one started at {born}; executions are not kept across a restart, "
                "and one still running when its agent died was killed)")
        owned(tenant, run.tenant, f"execution {execution_id}")
        return run

    def stop(self, tenant: str, execution_id: str) -> _Run:
        run = self.get(tenant, execution_id)
        run.execution.kill()
        run.execution.wait(_KILL_WAIT_S)
        return run

    def vm_metrics(self, tenant: str, vm_id: str, since: float) -> list[common_pb2.Series]:
        tenant = require_tenant(tenant)
        if not vm_id:
            raise InvalidArgument.of("vm_id", "required")
        with self._lock:
            cached = self._vms.get(vm_id)
            owner = cached.tenant if cached is not None else self._released.get(vm_id)
            runs = [r for r in self._runs.values() if r.vm_id == vm_id]
        for who in {owner, *(r.tenant for r in runs)} - {None, ""}:
            owned(tenant, who, f"VM {vm_id}")
        runs = [r.execution for r in runs]
        merged = [s for s in merge_utilisation([(e.samples, e.ended_at) for e in runs]) if s.time >= since]
        merged = decimate(merged, MAX_VM_METRICS_SAMPLES)
        return [
            common_pb2.Series(
                name="cpu_percent",
                resource_id=vm_id,
                samples=[common_pb2.Sample(time=s.time, value=s.cpu_percent) for s in merged],
            ),
            common_pb2.Series(
                name="memory_percent",
                resource_id=vm_id,
                samples=[common_pb2.Sample(time=s.time, value=s.memory_percent) for s in merged],
            ),
        ]

    def _platform_env(self) -> dict[str, str]:
        """What every command learns of the platform (its own env wins): the CA the services' TLS certificates
        are signed by, so that a program using our client libraries (VirtualFpga.attach) reaches them."""
        ca = self.config.tls_ca_file
        return {tls.ENV_CA: str(Path(ca).expanduser().absolute())} if ca else {}

    def open(self) -> None:
        """Fail at start-up, not at the first Execute, if scratch space cannot be made, or if another agent
        runs on this work dir; clear what a predecessor on it left behind."""
        work = Path(self.config.work_dir).expanduser()
        work.mkdir(parents=True, exist_ok=True)
        self._work_lock = _lock_work_dir(work)
        self._reap_leftovers(work)
        if self.replay is None and self._ledger is None:
            self._ledger = work / LEDGER_NAME
            PROCESSES.record(self._ledger, self.mark_prefix)
        if self.replay is None and not self._adopting:
            self._adopting = PROCESSES.adopt_orphans()
            if not self._adopting:
                log.warning("could not make the agent a child subreaper (prctl refused): a daemon that leaves an "
                            "execution's tree and rewrites its environment may escape its execution's end")
        # Once, at start-up: an operator whose inventory describes hosts larger than this machine learns here
        # what their VMs really get (each VM larger than this is confined, and says so when it runs).
        a = self.allocator
        log.info("VM memory limited to what this machine can give",
                 extra={"machine_memory_mb": round(a.machine_memory_mb),
                        "memory_reserve_mb": round(a.memory_reserve_mb), "vm_memory_cap_mb": round(a.vm_memory_cap_mb)})
        if self._checker is None:
            self._checker = threading.Thread(target=self._check_vms, name="vm-check", daemon=True)
            self._checker.start()

    def _reap_leftovers(self, work: Path) -> None:
        """Kill the processes of executions an earlier agent on `work` left running, and remove scratch
        directories no execution owns: it died without its shutdown (SIGKILL, the OOM killer), so they ran
        on unwatched, past their timeouts and their VMs' releases, and nobody else knows of them."""
        killed = kill_leftovers(work)
        with self._lock:
            owned_dirs = {r.scratch for r in self._runs.values()}
        removed = 0
        for entry in work.iterdir():
            # Only names this agent gives: a work dir pointed at a shared directory loses nothing else.
            if _SCRATCH_NAME.fullmatch(entry.name) and entry.is_dir() and entry not in owned_dirs:
                shutil.rmtree(entry, ignore_errors=True)
                removed += 1
        if killed or removed:
            log.warning("cleared what an earlier agent left", extra={"work_dir": str(work), "killed": killed,
                                                                     "scratch_removed": removed})

    def quiesce(self) -> None:
        """Shutting down, before the server stops: kill every running execution (its Execute stream ends)."""
        self._stop.set()
        with self._lock:
            running = [r.execution for r in self._runs.values() if r.execution.running]
        for e in running:
            e.kill(AGENT_STOPPED)
        for e in running:
            e.wait(_KILL_WAIT_S)

    def shutdown(self) -> None:
        """Kill every running execution (the agent's processes must not outlive it; one started since
        `quiesce` too), then let go of the compute IRM and the work dir."""
        self.quiesce()
        self.compute.close()
        if self._ledger is not None:
            PROCESSES.stop_recording(self._ledger)
            self._ledger = None
        if self._adopting:
            PROCESSES.release_orphans()
            self._adopting = False
        if self._work_lock is not None:
            os.close(self._work_lock)
            self._work_lock = None


class WorkDirInUse(OSError):
    """Another agent runs on the work dir."""


def _lock_work_dir(work: Path) -> int:
    """An exclusive lock on `work` (held while the agent lives), or WorkDirInUse. A second agent on one work
    dir would take the first one's running executions for a crashed agent's leftovers and kill them. The
    descriptor is not inherited: a run left behind never holds it."""
    try:
        return pidlock.take(work / ".agent.lock")
    except pidlock.Held as e:
        raise WorkDirInUse(f"another agent (pid {e.owner}) runs on work_dir {work}; give this one a work_dir of "
                           "its own") from None


# --- messages -------------------------------------------------------------------


def _started_pb(s: Started) -> agent_pb2.ExecutionStarted:
    return agent_pb2.ExecutionStarted(
        execution_id=s.execution_id,
        pid=s.pid,
        cpus=list(s.cpus),
        memory_limit_mb=s.memory_limit_mb,
        notes=list(s.notes),
    )


def _sample_pb(s: Sample) -> agent_pb2.UtilisationSample:
    return agent_pb2.UtilisationSample(
        time=s.time, cpu_percent=s.cpu_percent, memory_percent=s.memory_percent, memory_mb=s.memory_mb
    )


def _exited_pb(x: Exited) -> agent_pb2.ExecutionExited:
    return agent_pb2.ExecutionExited(
        exit_code=x.exit_code,
        wall_time_s=x.wall_time_s,
        reason=x.reason,
        peak_memory_mb=x.peak_memory_mb,
        mean_cpu_percent=x.mean_cpu_percent,
        replayed_cost=x.replayed_cost,
        replayed=isinstance(x, ReplayedExited),
    )


def _event_pb(event: Event) -> agent_pb2.ExecuteEvent:
    if isinstance(event, Output):
        return agent_pb2.ExecuteEvent(**{event.stream: event.data})
    if isinstance(event, Sample):
        return agent_pb2.ExecuteEvent(sample=_sample_pb(event))
    if isinstance(event, Started):
        return agent_pb2.ExecuteEvent(started=_started_pb(event))
    return agent_pb2.ExecuteEvent(exited=_exited_pb(event))


def _execution_pb(run: _Run) -> agent_pb2.Execution:
    e = run.execution
    exited = e.exited
    out = agent_pb2.Execution(
        execution_id=e.execution_id,
        vm_id=run.vm_id,
        tenant=run.tenant,
        state=agent_pb2.Execution.STATE_RUNNING if exited is None else agent_pb2.Execution.STATE_EXITED,
        argv=e.argv,
        samples=[_sample_pb(s) for s in e.samples],
    )
    if e.started is not None:
        out.started.CopyFrom(_started_pb(e.started))
    if exited is not None:
        out.exited.CopyFrom(_exited_pb(exited))
    return out


class ExecutionAgentServicer(agent_pb2_grpc.ExecutionAgentServicer):
    def __init__(self, agent: Agent) -> None:
        self.agent = agent
        self._streams = CallCap(agent.config.max_execute_streams, lambda n, limit: ResourceExhausted(
            f"{n} executions are streaming from this agent, its most (max_execute_streams={limit}); retry when one "
            "ends (a client may cancel its stream and follow the run with GetExecution)", reason=STREAM_CAP))

    def Execute(self, request, context):  # type: ignore[no-untyped-def]  # noqa: N802
        self._streams.take()
        try:
            run = self.agent.execute(request)
            # A client that cancels leaves the command running (GetExecution / StopExecution reach it);
            # detaching wakes this handler so the worker thread is not held until the command ends.
            if not context.add_callback(run.execution.detach):
                run.execution.detach()
            for event in run.execution.events():
                yield _event_pb(event)
        finally:
            self._streams.give_back()

    def GetExecution(self, request, context):  # type: ignore[no-untyped-def]  # noqa: N802
        return _execution_pb(self.agent.get(request.tenant, request.execution_id))

    def StopExecution(self, request, context):  # type: ignore[no-untyped-def]  # noqa: N802
        return _execution_pb(self.agent.stop(request.tenant, request.execution_id))

    def ReleaseVm(self, request, context):  # type: ignore[no-untyped-def]  # noqa: N802
        control.check(self.agent.config.control_token, context, "the agent")
        return agent_pb2.ReleaseVmResponse(killed=self.agent.release_confirmed(request.vm_id))

    def GetVmMetrics(self, request, context):  # type: ignore[no-untyped-def]  # noqa: N802
        control.check(self.agent.config.control_token, context, "the agent")
        return agent_pb2.GetVmMetricsResponse(series=self.agent.vm_metrics(request.tenant, request.vm_id,
                                                                          require_since(request.since)))


def component(config: AgentConfig) -> Component:
    """The agent as a server component; `stop` kills every running execution."""
    auth = tenants.auth(config.tenants_file, "agent", delegation_sha256=config.delegation_sha256)
    agent = Agent(config, ComputeClient(config.compute_address, config.compute_timeout_s, config.control_token))
    servicer = ExecutionAgentServicer(agent)
    return Component(
        name="agent",
        register=lambda server: agent_pb2_grpc.add_ExecutionAgentServicer_to_server(servicer, server),
        service_names=[SERVICE_NAME],
        start=agent.open,
        quiesce=agent.quiesce,
        stop=agent.shutdown,
        extra={"agent": agent},
        max_workers=config.max_execute_streams + _CONTROL_WORKERS,
        auth=auth,
    )
