"""The `local` back-end of the execution agent: a VM is a confined local process tree.

A VM of `cores` cores and `memory_mb` MB becomes, on this machine:

* CPU affinity to at most `cores` of the CPUs the agent may use, handed out so
  that VMs spread over the machine (`CpuAllocator`), and thread-pool variables
  (OMP_NUM_THREADS, ...) telling numeric libraries how many CPUs they have;
* a memory allowance -- the VM's memory, but never more than this machine can
  give it (`CpuAllocator`: its RAM or its cgroup's limit, less a reserve) --
  enforced twice: RLIMIT_DATA on the child, so a growing
  allocation fails inside the program like it would in a full VM, and a
  watchdog over the whole process tree, which catches what a per-process,
  address-space limit cannot (several processes, small VMs; see
  `data_rlimit_bytes`) and kills the tree. It counts proportional set size
  (PSS): a page shared by several processes (copy-on-write after a fork, a
  library) counts once in all, as in a real VM's memory. The allowance is the
  VM's, shared by all the executions running in it (`VmMemory`);
* utilisation samples (CPU as a percentage of the pinned CPUs, memory as a
  percentage of the allowance) every `sample_interval_s`;
* an execution's processes are found by one scan of the machine shared by all
  executions (irm_compute.processes): by lineage, by a mark in their
  environment, by session, and -- the agent being a child subreaper -- as
  orphans it adopts; so one that leaves the tree (a double fork into a new
  session) is still watched and killed with it, and a thread that widens its
  CPU affinity is pinned back at the next sample. This confines honest
  programs so their measurements mean something; it is not a security
  boundary (cgroups are).

`LocalExecution` runs one command and reports through a queue of events
(`Started`, `Output`, `Sample`, `Exited`) that one consumer drains, while the
execution itself never depends on that consumer: output is always read (a full
pipe would stall the program) and the process outlives a consumer that leaves.
What waits in the queue is bounded by bytes (consecutive output merges) and
dropped when the consumer detaches; the samples an execution keeps are bounded
too (`MAX_SAMPLES`). Nothing here knows about gRPC.
"""

from __future__ import annotations

import errno
import logging
import math
import os
import re
import resource
import shutil
import signal
import subprocess
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import IO, Literal

import psutil

from irm_compute.cpu_ledger import CpuLedger
from irm_compute.processes import EXECUTION_MARK, PROCESSES, ProcessTable, pin_threads

log = logging.getLogger(__name__)

MEMORY_LIMIT_EXCEEDED = "memory limit exceeded"
TIMEOUT = "timeout"
STOPPED = "stopped"

# The agent's environment is not the tenant's: only these pass through.
BASIC_ENV = (
    "PATH",
    "HOME",
    "USER",
    "LOGNAME",
    "SHELL",
    "LANG",
    "LANGUAGE",
    "LC_ALL",
    "LC_CTYPE",
    "TZ",
    "TMPDIR",
    "LD_LIBRARY_PATH",
    "PYTHONPATH",
    "VIRTUAL_ENV",
    "CONDA_PREFIX",
)
# Numeric libraries size their thread pools from these, not from the affinity
# mask; left alone, OpenBLAS on a 64-core host starts 64 threads in a 1-core VM.
THREAD_ENV = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMEXPR_NUM_THREADS")

# RLIMIT_DATA counts reserved writable address space, not touched memory: every
# thread stack (8 MB) and OpenBLAS's per-thread buffer (~32 MB) count in full.
# Measured on CPython 3.11 + numpy 2.4: `import numpy` needs about 10 + 40 MB per
# OpenBLAS thread of it, and with too little OpenBLAS spins forever rather than
# failing (128 MB, 2 threads). Below these sizes only the memory watchdog enforces
# the allowance, and `Started.notes` says so.
RLIMIT_FLOOR_MB = 512.0
RLIMIT_PER_CPU_MB = 64.0

# How long the end of an execution waits for output still in the pipes after
# the process tree is gone (a daemon that escaped the tree may hold them open).
_PIPE_DRAIN_S = 2.0
_READ_CHUNK = 64 * 1024
# Output waiting for the consumer merges into events of up to this many bytes: a program writing 2 bytes at a
# time made one event (~170 bytes of objects) per write, 23 MB of them for 2 MB of output nobody read.
_MERGED_OUTPUT = 64 * 1024
# The samples an execution keeps (for GetExecution and GetVmMetrics): beyond, the older half is merged in pairs
# (mean CPU, peak memory), so a run of any length keeps at most this many, the recent ones at full resolution
# (at 0.5 s an unbounded series passed gRPC's 4 MiB message limit after ~14.5 h).
MAX_SAMPLES = 1024
_STDERR_TAIL = 8 * 1024
# How a program says it ran out of memory, in the last lines of its stderr (`said_out_of_memory`): a Python
# exception line (MemoryError, numpy's _ArrayMemoryError), C++'s std::bad_alloc, Java's OutOfMemoryError, or
# strerror(ENOMEM) ending a line ("malloc: Cannot allocate memory"). Not the words anywhere: a test named
# test_evicts_on_MemoryError, or "Cannot allocate memory (remote side)" from another machine, is no such failure.
_MEMORY_ERROR_LINE = re.compile(
    rb"^[\w.]*MemoryError(?::.*)?$|std::bad_alloc|OutOfMemoryError|Cannot allocate memory[.!]?$")
_MEMORY_ERROR_LINES = 10

# The share of the machine's memory no VM may take, at least _RESERVE_MIN_MB and at most half the machine:
# the kernel, the agent itself and whatever runs beside the VMs on one machine (the suite's other services, a
# database) need it, and a VM allowed all of it is stopped by the kernel's OOM killer, not by its limit.
MEMORY_RESERVE_SHARE = 0.1
_RESERVE_MIN_MB = 512.0
_MB = 1024 * 1024


def _cgroup_memory_limit_files(proc_cgroup: str = "/proc/self/cgroup") -> list[str]:
    """The memory limit files of this process's cgroup and its ancestors (v2 `memory.max`, v1
    `memory.limit_in_bytes`): the tightest one binds, and a container's limit may sit on an ancestor."""
    try:
        with open(proc_cgroup) as f:
            lines = f.read().splitlines()
    except OSError:
        return []
    out = []
    for line in lines:
        fields = line.split(":", 2)
        if len(fields) != 3:
            continue
        _, controllers, path = fields
        if controllers == "":
            base, name = "/sys/fs/cgroup", "memory.max"
        elif "memory" in controllers.split(","):
            base, name = "/sys/fs/cgroup/memory", "memory.limit_in_bytes"
        else:
            continue
        # Under a cgroup namespace the path may not exist below the mount: its ancestors (the mount's root) do.
        parts = [p for p in path.split("/") if p]
        out += [os.path.join(base, *parts[:n], name) for n in range(len(parts), -1, -1)]
    return out


def machine_memory_mb() -> float:
    """The memory this agent and the VMs it starts may use, in MB: the machine's RAM, or less where a cgroup
    (a container's memory limit) caps it, since the VMs' processes are the agent's children, in its cgroup."""
    limit = psutil.virtual_memory().total
    for path in _cgroup_memory_limit_files():
        try:
            with open(path) as f:
                text = f.read().strip()
        except OSError:
            continue
        if text.isdigit():  # "max" (v2) is no limit; v1 writes a huge number for none, which the RAM undercuts
            limit = min(limit, int(text))
    return limit / _MB


def default_memory_reserve_mb(machine_mb: float) -> float:
    return min(max(_RESERVE_MIN_MB, MEMORY_RESERVE_SHARE * machine_mb), machine_mb / 2)


def _oom_kills() -> int | None:
    """How many processes the kernel's OOM killer has killed since boot (/proc/vmstat, Linux >= 4.13; a
    cgroup's OOM killer counts too), or None where it cannot be read."""
    try:
        with open("/proc/vmstat", "rb") as f:
            for line in f:
                if line.startswith(b"oom_kill "):
                    return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return None


@dataclass(frozen=True)
class VmSlot:
    """A VM as this machine confines it: its shape and the CPUs it was given.

    `memory_mb` is the memory limit its executions get; `vm_memory_mb` the VM's memory as reserved, more than
    `memory_mb` when this machine has less to give (0: not known, taken to be `memory_mb`).
    """

    vm_id: str
    cores: float
    memory_mb: float
    cpus: tuple[int, ...]
    notes: tuple[str, ...] = ()
    vm_memory_mb: float = 0.0


def data_rlimit_bytes(memory_mb: float, ncpus: int) -> int | None:
    """RLIMIT_DATA for a VM of `memory_mb` on `ncpus` CPUs, or None if only the watchdog applies."""
    if memory_mb < max(RLIMIT_FLOOR_MB, RLIMIT_PER_CPU_MB * ncpus):
        return None
    return int(memory_mb * 1024 * 1024)


class CpuAllocator:
    """Hands out CPUs to VMs: fewest VMs per CPU first, round-robin among equals; and bounds their memory.

    Two 1-core VMs on a 2-CPU machine get different CPUs; a third shares with
    the first. CPUs are not exclusive (a host may be oversubscribed), only spread.

    A VM's memory limit is at most `vm_memory_cap_mb`: the machine's memory (`machine_mb`, read from the
    machine when not given) less `reserve_mb` (negative or None: `default_memory_reserve_mb`). A larger VM
    is confined to that, as one with more cores than the machine has CPUs is, rather than refused: its
    reservation is the compute IRM's (an inventory may describe hosts larger than the machine the agent
    stands in for), and a run that fits in what exists should still run. But unconfined, its limits would
    never bind: the run would grow until the kernel's OOM killer ended it with a bare SIGKILL, or killed
    another process instead. So it runs under what the machine can give, its start notes say so, and a run
    that outgrows that dies of "memory limit exceeded", saying it was confined.
    """

    def __init__(self, cpus: Sequence[int] | None = None, machine_mb: float | None = None,
                 reserve_mb: float | None = None) -> None:
        self._cpus = sorted(os.sched_getaffinity(0) if cpus is None else cpus)
        if not self._cpus:
            raise ValueError("no CPUs to allocate")
        self.machine_memory_mb = machine_memory_mb() if machine_mb is None else float(machine_mb)
        if reserve_mb is None or reserve_mb < 0:
            reserve_mb = default_memory_reserve_mb(self.machine_memory_mb)
        if not (math.isfinite(reserve_mb) and reserve_mb < self.machine_memory_mb):
            raise ValueError(
                f"agent memory_reserve_mb {reserve_mb:g}: this machine has {self.machine_memory_mb:.0f} MB, so "
                f"nothing would be left for VMs; give less (negative: automatic, "
                f"{default_memory_reserve_mb(self.machine_memory_mb):.0f} MB here)")
        self.memory_reserve_mb = float(reserve_mb)
        self.vm_memory_cap_mb = float(math.floor(self.machine_memory_mb - self.memory_reserve_mb))
        self._load = dict.fromkeys(self._cpus, 0)
        self._next = 0
        self._lock = threading.Lock()

    @property
    def cpus(self) -> tuple[int, ...]:
        return tuple(self._cpus)

    def slot(self, vm_id: str, cores: float, memory_mb: float) -> VmSlot:
        want = max(1, math.ceil(cores - 1e-9))
        have = len(self._cpus)
        notes: list[str] = []
        if want > have:
            notes.append(f"VM has {cores:g} cores; this machine has {have}: confined to {have} CPUs")
        n = min(want, have)
        with self._lock:
            rotated = self._cpus[self._next :] + self._cpus[: self._next]
            chosen = sorted(rotated, key=lambda c: self._load[c])[:n]  # stable: ties keep rotation order
            for c in chosen:
                self._load[c] += 1
            self._next = (self._cpus.index(chosen[-1]) + 1) % have
        limit_mb = min(memory_mb, self.vm_memory_cap_mb)
        if limit_mb < memory_mb:
            notes.append(
                f"VM has {memory_mb:.0f} MB of memory; this machine has {self.machine_memory_mb:.0f} MB, "
                f"{self.memory_reserve_mb:.0f} MB of it kept from VMs: confined to {limit_mb:.0f} MB")
        if data_rlimit_bytes(limit_mb, n) is None:
            notes.append(
                f"memory allowance of {limit_mb:g} MB enforced by the memory watchdog only "
                f"(RLIMIT_DATA needs at least {max(RLIMIT_FLOOR_MB, RLIMIT_PER_CPU_MB * n):g} MB on {n} CPUs)"
            )
        return VmSlot(vm_id, cores, limit_mb, tuple(sorted(chosen)), tuple(notes), memory_mb)

    def free(self, slot: VmSlot) -> None:
        with self._lock:
            for c in slot.cpus:
                if self._load.get(c, 0) > 0:
                    self._load[c] -= 1


# --- events -------------------------------------------------------------------


@dataclass(frozen=True)
class Started:
    execution_id: str
    pid: int
    cpus: tuple[int, ...]
    memory_limit_mb: float
    notes: tuple[str, ...]


@dataclass(frozen=True)
class Output:
    stream: Literal["stdout", "stderr"]
    data: bytes


@dataclass(frozen=True)
class Sample:
    time: float  # seconds since the epoch
    cpu_percent: float  # of the pinned CPUs: 100 = all busy
    memory_percent: float  # of the memory allowance
    memory_mb: float  # PSS summed over the process tree
    # The seconds it stands for, up to `time` (a merged sample: its parts'); 0: not known, counted as the others
    # (merged CPU is their mean weighted by these, so an old sample merged again and again keeps its weight).
    span_s: float = 0.0


@dataclass(frozen=True)
class Exited:
    exit_code: int  # -N when killed by signal N
    wall_time_s: float
    reason: str
    peak_memory_mb: float
    mean_cpu_percent: float
    replayed_cost: float = 0.0  # the replay back-end's measured cost


Event = Started | Output | Sample | Exited


def said_out_of_memory(stderr_tail: bytes) -> bool:
    """Whether one of the last lines of a program's stderr says it ran out of memory (_MEMORY_ERROR_LINE)."""
    lines = [line.strip() for line in stderr_tail.splitlines() if line.strip()][-_MEMORY_ERROR_LINES:]
    return any(_MEMORY_ERROR_LINE.search(line) for line in lines)


def exit_reason(
    killed_for: str | None, exit_code: int, peak_mb: float, limit_mb: float, stderr_tail: bytes, *,
    oom_killed: bool = False, vm_memory_mb: float = 0.0,
) -> str:
    """Why an execution ended: the agent's own reason, else a guess at a memory failure, else ''.

    Under RLIMIT_DATA a program that outgrows its VM dies by itself (a Python
    MemoryError, a failed malloc), so a failure is put down to memory when the
    program got near its allowance or said it ran out. A program whose peak
    went over the allowance outgrew its VM even if it finished: a real VM that
    small would have stopped it, and only the watchdog's sampling (late on a
    loaded machine) let it through.

    `oom_killed`: it died of a SIGKILL nobody in the agent sent while the kernel's OOM killer was at work.
    Below its own limit, that is the machine running out of memory first (other VMs or processes on it): the
    reason says so, with its peak and limit (the evidence that the VM did not outgrow itself), since
    "exit code -9" alone explains nothing. A VM confined below its reserved memory (`vm_memory_mb`) says so
    in its "memory limit exceeded": at 20 GB of a VM reserved with 64 GB, the bare words would read as a
    bug. That one names the VM's sizes, not the run's peak (`Exited.peak_memory_mb` has it): runs of one
    shape fail alike, and whoever counts failures by their reason should count them as one.
    """
    over = MEMORY_LIMIT_EXCEEDED
    if vm_memory_mb > limit_mb:
        over += f" (the VM's {vm_memory_mb:.0f} MB confined to the {limit_mb:.0f} MB this machine can give it)"
    if killed_for:
        return over if killed_for == MEMORY_LIMIT_EXCEEDED else killed_for
    if peak_mb > limit_mb:
        return over
    if exit_code != 0 and (peak_mb >= 0.9 * limit_mb or said_out_of_memory(stderr_tail)):
        return over
    if oom_killed:
        at = (f"at a peak of {peak_mb:.0f} MB of its {limit_mb:.0f} MB limit" if peak_mb > 0 else
              f"before its first memory sample, under a {limit_mb:.0f} MB limit")
        return (f"out of memory: the kernel's OOM killer killed it (SIGKILL) {at}: this machine ran out of memory "
                "first (other VMs or processes on it)")
    return ""


def child_env(
    slot: VmSlot, requested: Mapping[str, str], base: Mapping[str, str] | None = None
) -> dict[str, str]:
    """The environment of a command in `slot`.

    The thread-pool sizes are defaults a command may override (a manifest asking
    for one thread); the HARNESS_VM_* facts are not.
    """
    base = os.environ if base is None else base
    env = {k: base[k] for k in BASIC_ENV if k in base}
    env.update(dict.fromkeys(THREAD_ENV, str(len(slot.cpus))))
    env.update(requested)
    env.update(
        HARNESS_VM_ID=slot.vm_id,
        HARNESS_VM_CORES=f"{slot.cores:g}",
        HARNESS_VM_MEMORY_MB=str(round(slot.memory_mb)),
    )
    return env


@contextmanager
def _spawning_thread_pinned(cpus: tuple[int, ...]) -> Iterator[None]:
    """Pin the calling thread to `cpus` while it spawns a process.

    A new process inherits the CPU mask of the thread that creates it, so the
    command is confined from its first instruction, and everything it starts
    after it. This replaces a preexec_fn, which would make subprocess fork the
    whole agent and run Python in the child: the gRPC runtime's mutexes do not
    survive that (measured: the child aborts or segfaults before exec).
    """
    previous = os.sched_getaffinity(0)  # pid 0 is the calling thread, not the process
    os.sched_setaffinity(0, cpus)
    try:
        yield
    finally:
        os.sched_setaffinity(0, previous)


_PRLIMIT = shutil.which("prlimit")


def _require_program(prog: str, cwd: str | None, path: str | None) -> str:
    """The program's path; FileNotFoundError if there is none, PermissionError if it is no executable file.

    Checked before every spawn, not left to the exec: behind the prlimit wrapper a failed exec is only a
    run exiting 126 or 127, while a direct spawn raises, so a VM's size would decide which answer the
    caller gets.
    """
    if os.sep in prog:
        found: str | None = prog if os.path.isabs(prog) else os.path.join(cwd or os.getcwd(), prog)
        if not os.path.lexists(found):
            found = None
    else:
        # As execvp: the first executable match on PATH; failing that, a mere file is EACCES, not ENOENT.
        found = shutil.which(prog, path=path) or shutil.which(prog, mode=os.F_OK, path=path)
    if not found:
        raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), prog)
    if not os.path.isfile(found) or not os.access(found, os.X_OK):  # a directory passes X_OK
        raise PermissionError(errno.EACCES, "not an executable file", prog)
    return found


def _capped(limit: int) -> int:
    hard = resource.getrlimit(resource.RLIMIT_DATA)[1]
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)  # raising a hard limit needs privileges the agent should not have
    return limit


def _limit_data(pid: int, limit: int) -> None:
    """RLIMIT_DATA of a running process (it and what it starts from now on)."""
    limit = _capped(limit)
    try:
        resource.prlimit(pid, resource.RLIMIT_DATA, (limit, limit))
    except ProcessLookupError:
        pass  # already gone; the reaper reports it


def _vm_hwm_mb(pid: int | str) -> float:
    """VmHWM of a process: the peak resident set of its current program (0 if unreadable, e.g. a zombie)."""
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            for line in f:
                if line.startswith(b"VmHWM:"):
                    return int(line.split()[1]) / 1024  # kB
    except OSError:
        pass
    return 0.0


def _reset_own_hwm() -> None:
    """Lower this process's high-water mark to its current RSS ("5" to clear_refs, Linux >= 4.0).

    A child inherits it as the floor of its ru_maxrss: reset, the floor is what the agent holds now, not
    the most it ever held, so ru_maxrss tells the peak of any command bigger than the agent is.
    """
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass  # an older kernel: the floor stays higher, and the peak of fewer commands is known exactly


# Held from the reset of the agent's high-water mark to reading it after the exec: another spawn's reset
# in between would lower the reading below what the child inherited.
_SPAWN_LOCK = threading.Lock()


# The share of one sampling interval the agent may spend reading PSS for one execution: the kernel walks
# every page (~12 ms per resident GB), so a large program's PSS is read every few samples, its RSS (cheap)
# less the last shared excess (RSS - PSS) in between.
PSS_BUDGET = 0.1


def _rss_pss_bytes(p: psutil.Process) -> tuple[int, int]:
    """(RSS, proportional set size): PSS from /proc/<pid>/smaps_rollup, one read, no per-mapping walk.

    RSS would count a page shared by n processes n times: a program that forks read-only workers would
    look n times its size. RSS for both where PSS cannot be read (another user's process that joined the tree).
    """
    try:
        full = p.memory_full_info()
        return full.rss, full.pss
    except psutil.AccessDenied:
        rss = p.memory_info().rss
        return rss, rss


class VmMemory:
    """The memory of one VM, shared by every execution running in it.

    Each execution reports its tree's use at every sample; when the VM's total goes over its memory the
    largest execution is killed ("memory limit exceeded"), the others run on. That is what a real VM
    does when it runs out: its OOM killer picks the largest process and spares the rest; killing all
    of the VM's runs would also end runs that fit and were not the cause.
    """

    def __init__(self, memory_mb: float) -> None:
        self.memory_mb = memory_mb
        self._lock = threading.Lock()
        self._use: dict[LocalExecution, float] = {}
        self._dying: set[LocalExecution] = set()

    def report(self, execution: LocalExecution, mb: float) -> tuple[LocalExecution, float] | None:
        """Record `execution`'s use; the execution to kill and the VM's total if the VM is over its memory."""
        with self._lock:
            if execution in self._dying:
                return None
            self._use[execution] = mb
            total = sum(self._use.values())
            if total <= self.memory_mb:
                return None
            victim = max(self._use, key=lambda e: self._use[e])
            # Out of the sum at once: a dying tree's last report must not condemn the runs that remain.
            del self._use[victim]
            self._dying.add(victim)
        return victim, total

    def leave(self, execution: LocalExecution) -> None:
        with self._lock:
            self._use.pop(execution, None)
            self._dying.discard(execution)

    def total_mb(self) -> float:
        with self._lock:
            return sum(self._use.values())


def find_marked(prefix: str) -> list[psutil.Process]:
    """Every process whose execution mark starts with `prefix` (readable ones: this user's)."""
    out = []
    for p in psutil.process_iter():
        try:
            if p.pid != os.getpid() and p.environ().get(EXECUTION_MARK, "").startswith(prefix):
                out.append(p)
        except psutil.Error:
            continue  # gone, a zombie, or not ours to read
    return out


_DETACHED = object()


class _PendingOutput:
    """Output queued for the consumer, grown in place while it is the newest event (see `_EventQueue`)."""

    __slots__ = ("stream", "data")

    def __init__(self, stream: Literal["stdout", "stderr"], data: bytes) -> None:
        self.stream = stream
        self.data = bytearray(data)


class _EventQueue:
    """The events one consumer has not read yet.

    Output of one stream following output of the same stream merges into one event (up to `_MERGED_OUTPUT`
    bytes), so what waits is bounded by bytes (output beyond `max_output_bytes` is never queued) rather than by
    how many writes made it. `close` (the consumer left) drops what waits and queues nothing more.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._items: deque[object] = deque()
        self._closed = False

    def put(self, event: Event) -> None:
        with self._cond:
            if self._closed:
                return
            if isinstance(event, Output):
                last = self._items[-1] if self._items else None
                if (isinstance(last, _PendingOutput) and last.stream == event.stream
                        and len(last.data) + len(event.data) <= _MERGED_OUTPUT):
                    last.data += event.data
                    return
                self._items.append(_PendingOutput(event.stream, event.data))
            else:
                self._items.append(event)
            self._cond.notify()

    def get(self) -> object:
        """The oldest event, waiting for one; `_DETACHED` once closed."""
        with self._cond:
            while not self._items and not self._closed:
                self._cond.wait()
            if not self._items:
                return _DETACHED
            item = self._items.popleft()
        # Popped, it is no longer the newest: nothing grows it any more.
        return Output(item.stream, bytes(item.data)) if isinstance(item, _PendingOutput) else item

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._items.clear()
            self._cond.notify_all()

    def __len__(self) -> int:
        with self._cond:
            return len(self._items)


def _merge_pair(a: Sample, b: Sample) -> Sample:
    """One sample for two consecutive ones: the later time, the CPU over both (their mean weighted by the time
    each stands for; equal when a span is not known), the peak memory."""
    if a.span_s > 0 and b.span_s > 0:
        cpu = (a.cpu_percent * a.span_s + b.cpu_percent * b.span_s) / (a.span_s + b.span_s)
    else:
        cpu = (a.cpu_percent + b.cpu_percent) / 2
    return Sample(b.time, cpu, max(a.memory_percent, b.memory_percent), max(a.memory_mb, b.memory_mb),
                  a.span_s + b.span_s if a.span_s > 0 and b.span_s > 0 else 0.0)


def keep_sample(samples: list[Sample], sample: Sample, limit: int | None = None) -> None:
    """Append `sample`; past `limit` (MAX_SAMPLES), merge the older half in pairs (the newer half keeps full
    resolution)."""
    limit = MAX_SAMPLES if limit is None else limit
    samples.append(sample)
    if len(samples) > limit:
        half = limit // 2
        samples[:half] = [_merge_pair(samples[i], samples[i + 1]) if i + 1 < half else samples[i]
                          for i in range(0, half, 2)]


def decimate(samples: Sequence[Sample], limit: int) -> list[Sample]:
    """At most `limit` samples (>= 1): consecutive pairs merged (mean CPU, peak memory) as often as needed."""
    out = list(samples)
    while len(out) > limit:
        out = [_merge_pair(out[i], out[i + 1]) if i + 1 < len(out) else out[i] for i in range(0, len(out), 2)]
    return out


class LocalExecution:
    """One command running in a VM slot: spawn, stream, sample, enforce, reap.

    Threads: one reader per output pipe, a monitor (samples, memory watchdog,
    timeout) and a reaper that waits for the process and writes the final
    `Exited`. `start()` returns once the process runs; `events()` yields what
    happens to one consumer; `wait()` blocks until the end.
    """

    def __init__(
        self,
        execution_id: str,
        slot: VmSlot,
        argv: Sequence[str],
        *,
        working_dir: str,
        env: Mapping[str, str] | None = None,
        timeout_s: float = 0.0,
        sample_interval_s: float = 0.5,
        max_output_bytes: int = 16 * 1024 * 1024,
        on_exit: Callable[[LocalExecution], None] | None = None,
        vm_memory: VmMemory | None = None,
        mark_prefix: str = "",
        processes: ProcessTable | None = None,
    ) -> None:
        if not argv:
            raise ValueError("argv is empty")
        self.execution_id = execution_id
        self.slot = slot
        self.argv = list(argv)
        self.working_dir = working_dir
        # A mark every descendant inherits: one whose parent exits before a scan sees it is still found (see
        # irm_compute.processes). The prefix names the owner (an agent), so a successor can find what a crashed
        # one left running.
        self._mark = f"{mark_prefix}{uuid.uuid4().hex}"
        self.env = {**child_env(slot, env or {}), EXECUTION_MARK: self._mark}
        self.timeout_s = timeout_s
        self.sample_interval_s = sample_interval_s
        self.max_output_bytes = max_output_bytes
        self._on_exit = on_exit
        self._memory = vm_memory if vm_memory is not None else VmMemory(slot.memory_mb)
        self._processes = processes if processes is not None else PROCESSES
        self._killed_for_vm = False  # killed because the VM's executions together outgrew it

        self._lock = threading.Lock()
        self._events = _EventQueue()
        self._samples: list[Sample] = []
        self._started: Started | None = None
        self._exited: Exited | None = None
        self._done = threading.Event()
        self._stop_monitor = threading.Event()
        self._killed_for: str | None = None
        self._leader_exited = False  # set before reaping: the pid (and group id) is ours until then
        self._output_bytes = 0
        self._truncated = False
        self._stderr_tail = b""
        self._peak_mb = 0.0
        # RSS - PSS (bytes) of the tree and of its root at the last PSS read: what RSS-only readings (the
        # root's VmHWM, ru_maxrss, samples between PSS reads) count beyond PSS, so the verdict judges by the
        # measure the limit uses (a program mapping a file others map too is not "over" by pages it shares).
        # Subtracted, not scaled: what a program grows by is its own (private) memory, so the excess of its
        # shared pages stays put -- a ratio read while it was a bare interpreter (PSS/RSS ~0.67) made a death
        # at 512 MB of data look like 450 MB. 0 until read.
        self._tree_shared = 0.0
        self._root_shared = 0.0
        # The largest RSS - PSS of any one process at any PSS read, and the most processes a sample saw: ru_maxrss
        # is the largest RSS of any one process of the tree, not necessarily the root's (see _reap).
        self._proc_shared = 0.0
        self._most_processes = 0
        self._pss_every = 1      # PSS read every this many samples (see PSS_BUDGET)
        self._since_pss = 0
        self._pss_pids: frozenset[int] = frozenset()    # the tree when PSS was last read
        self._spawner_hwm_mb = math.inf  # the agent's high-water mark just after the spawn (see _reap)
        self._oom_kills_at_start: int | None = None  # the kernel's OOM kill count before the spawn
        self._cpu_seconds = 0.0  # cumulative CPU of the tree: at the last sample, or the last tally if later
        self._sampled_cpu = 0.0  # cumulative CPU of the tree at the last sample (`_sampled_at`)
        # Each process's last CPU reading, those gone since included (irm_compute.cpu_ledger); its own lock: a
        # kill tallies it from the caller's thread while the monitor may sample.
        self._cpu = CpuLedger()
        self._cpu_lock = threading.Lock()
        self._sampled_at = 0.0  # monotonic time of the last sample
        self._popen: subprocess.Popen[bytes] | None = None
        self._t0 = 0.0
        self.started_at = 0.0  # epoch seconds
        self.ended_at: float | None = None

    # --- public -----------------------------------------------------------

    def start(self) -> Started:
        """Spawn the command. OSError (e.g. FileNotFoundError for a missing program) propagates.

        Whatever fails once the command runs (a thread that cannot start) kills its tree and reaps it before
        propagating: nobody would watch, time out or stop it otherwise.
        """
        cpus = self.slot.cpus
        self._t0, self.started_at = time.monotonic(), time.time()
        limit = data_rlimit_bytes(self.slot.memory_mb, len(cpus))
        program = _require_program(self.argv[0], self.working_dir, self.env.get("PATH"))
        # util-linux's prlimit sets the limit on itself, then execs the program: the limit
        # holds from the program's first instruction (no preexec_fn: unsafe beside gRPC threads).
        wrapper = [_PRLIMIT, f"--data={_capped(limit)}", "--"] if limit is not None and _PRLIMIT else []
        self._oom_kills_at_start = _oom_kills()

        def spawn() -> subprocess.Popen[bytes]:
            try:
                return self._spawn([*wrapper, *self.argv])
            except OSError as e:
                if e.errno != errno.ENOEXEC:
                    raise
                # A file the kernel cannot execute (a script without "#!"): run it with /bin/sh, as execvp
                # (so prlimit, in large VMs) and shells do; one answer whatever the VM's size.
                return self._spawn([*wrapper, "/bin/sh", program, *self.argv[1:]])

        with _SPAWN_LOCK:
            _reset_own_hwm()
            popen = self._processes.spawn(self, self._mark, spawn)
            # Read after the exec: the child's ru_maxrss starts from at most this (see _reap).
            self._spawner_hwm_mb = _vm_hwm_mb("self")
        self._popen = popen
        started: list[threading.Thread] = []
        try:
            # Without prlimit: set it right after the exec, microseconds into the program's start-up;
            # whatever slips through before that, the watchdog sees.
            if limit is not None and not _PRLIMIT:
                _limit_data(popen.pid, limit)
            self._started = Started(self.execution_id, popen.pid, cpus, self.slot.memory_mb, self.slot.notes)
            self._push(self._started)
            assert popen.stdout is not None and popen.stderr is not None
            readers = [
                threading.Thread(
                    target=self._read,
                    args=(popen.stdout, "stdout"),
                    name=f"{self.execution_id}-stdout",
                    daemon=True,
                ),
                threading.Thread(
                    target=self._read,
                    args=(popen.stderr, "stderr"),
                    name=f"{self.execution_id}-stderr",
                    daemon=True,
                ),
            ]
            monitor = threading.Thread(target=self._monitor, name=f"{self.execution_id}-monitor", daemon=True)
            reaper = threading.Thread(
                target=self._reap, args=(readers, monitor), name=f"{self.execution_id}-reaper", daemon=True
            )
            for t in (*readers, monitor, reaper):
                t.start()
                started.append(t)
        except BaseException:
            self._abort_start(popen, started)
            raise
        return self._started

    def events(self) -> Iterator[Event]:
        """`started`, output and samples as they happen, then `exited`; ends early after `detach()`."""
        while True:
            event = self._events.get()
            if event is _DETACHED:
                return
            yield event  # type: ignore[misc]
            if isinstance(event, Exited):
                return

    def detach(self) -> None:
        """The consumer left: drop what it did not read and queue nothing more (the command keeps running)."""
        self._events.close()

    def _tally_cpu(self, max_age: float) -> float:
        """The tree's CPU seconds so far (the ledger updated from a scan at most `max_age` old)."""
        with self._cpu_lock:
            return self._cpu.update(self._processes.cpu_readings(self, max_age))

    def _tally_at_the_end(self) -> None:
        """What the tree used up to now, before it is killed (its processes are then reaped by the agent, not by
        a process of the run: their time since the last sample would be lost), best effort."""
        try:
            total = self._tally_cpu(0.0)
            with self._lock:
                self._cpu_seconds = max(self._cpu_seconds, total)
        except Exception:  # noqa: BLE001 -- a measurement must never keep the tree from being killed
            log.exception("could not read the CPU of a tree at its end", extra={"execution": self.execution_id})

    def kill(self, reason: str = STOPPED) -> bool:
        """SIGKILL the process tree; False if it had already exited. The first reason given is kept."""
        with self._lock:
            if self._popen is None or self._leader_exited:
                return False
            if self._killed_for is None:
                self._killed_for = reason
            # Safe from pid reuse: the leader is not reaped while `_leader_exited` is False.
            _killpg(self._popen.pid)
        # Read after the SIGKILL, which it does not delay: the killed processes read their final times until the
        # agent reaps them, and what another session holds (a daemon) is read before it is killed below.
        self._tally_at_the_end()
        self._processes.kill(self)
        return True

    def wait(self, timeout: float | None = None) -> Exited | None:
        self._done.wait(timeout)
        return self._exited

    @property
    def running(self) -> bool:
        return self._popen is not None and self._exited is None

    @property
    def started(self) -> Started | None:
        return self._started

    @property
    def exited(self) -> Exited | None:
        return self._exited

    @property
    def samples(self) -> list[Sample]:
        with self._lock:
            return list(self._samples)

    def _spawn(self, argv: list[str]) -> subprocess.Popen[bytes]:
        with _spawning_thread_pinned(self.slot.cpus):
            return subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                cwd=self.working_dir,
                env=self.env,
                start_new_session=True,  # its own process group: the whole tree can be killed at once
                bufsize=0,
            )

    def _abort_start(self, popen: subprocess.Popen[bytes], started: list[threading.Thread]) -> None:
        """`start` failed with the command running: kill its tree and reap it (no reaper thread runs)."""
        with self._lock:
            _killpg(popen.pid)
            self._leader_exited = True
        self._stop_monitor.set()
        try:
            self._processes.kill(self)
        finally:
            popen.wait()
            self._processes.unregister(self)
            self._memory.leave(self)
            self._events.close()
            for pipe, reader in ((popen.stdout, 0), (popen.stderr, 1)):
                if pipe is not None and len(started) <= reader:
                    pipe.close()  # a reader that started closes its own at the end of the output

    def _kill_for_vm(self) -> None:
        """Killed because the VM's executions together outgrew it (VmMemory picked this one)."""
        with self._lock:
            if self._killed_for is None and not self._leader_exited:
                self._killed_for_vm = True
        self.kill(MEMORY_LIMIT_EXCEEDED)

    # --- threads ----------------------------------------------------------

    def _push(self, event: Event) -> None:
        self._events.put(event)

    def _read(self, pipe: IO[bytes], stream: Literal["stdout", "stderr"]) -> None:
        # Popen(bufsize=0) gives unbuffered pipes: read(n) returns whatever is there, at once.
        with pipe:
            while chunk := pipe.read(_READ_CHUNK):
                if stream == "stderr":
                    self._stderr_tail = (self._stderr_tail + chunk)[-_STDERR_TAIL:]
                with self._lock:
                    room = self.max_output_bytes - self._output_bytes
                    self._output_bytes += min(len(chunk), max(room, 0))
                    notice = room < len(chunk) and not self._truncated
                    self._truncated = self._truncated or notice
                # Keep reading past the cap (a blocked writer would stall the program), drop the bytes.
                if room > 0:
                    self._push(Output(stream, chunk[:room]))
                if notice:
                    msg = f"\n[harness agent: output beyond {self.max_output_bytes} bytes discarded]\n"
                    self._push(Output("stderr", msg.encode()))

    def _monitor(self) -> None:
        """Sample every interval; enforce the memory allowance and the timeout."""
        deadline = self._t0 + self.timeout_s if self.timeout_s > 0 else math.inf
        last_t, last_cpu = self._t0, 0.0
        while True:
            wait = min(self.sample_interval_s, max(0.0, deadline - time.monotonic()))
            if self._stop_monitor.wait(wait):
                return
            now = time.monotonic()
            if now >= deadline:
                self.kill(TIMEOUT)
                return
            measured = self._measure()
            if measured is None:
                continue
            cpu_seconds, mem_mb, root_hwm_mb = measured
            cpu_percent = _cpu_percent(cpu_seconds - last_cpu, now - last_t, len(self.slot.cpus))
            span = now - last_t
            last_t, last_cpu = now, cpu_seconds
            sample = Sample(time.time(), cpu_percent, mem_mb / self.slot.memory_mb * 100, mem_mb, span)
            with self._lock:
                keep_sample(self._samples, sample)
                # The root's own high-water mark catches a spike of it between two samples.
                self._peak_mb = max(self._peak_mb, mem_mb, self._root_pss_mb(root_hwm_mb))
                self._cpu_seconds = max(self._cpu_seconds, cpu_seconds)
                self._sampled_cpu = cpu_seconds
                self._sampled_at = now
            self._push(sample)
            over = self._memory.report(self, mem_mb)
            if over is not None:
                victim, total = over
                log.warning("VM over its memory: killing its largest execution",
                            extra={"vm": self.slot.vm_id, "total_mb": round(total),
                                   "limit_mb": self.slot.memory_mb, "execution_id": victim.execution_id})
                if victim is self and mem_mb > self.slot.memory_mb:
                    self.kill(MEMORY_LIMIT_EXCEEDED)  # over the VM's memory on its own
                else:
                    victim._kill_for_vm()
                if victim is self:
                    return  # a dying tree has nothing more to say; this sample shows why it dies

    def _measure(self) -> tuple[float, float, float] | None:
        """(cumulative CPU seconds, PSS MB, the root's VmHWM MB) of the process tree, or None if it is gone.

        PSS is read every `_pss_every` samples (RSS less the last shared excess in between)."""
        assert self._popen is not None
        # From a scan at most half an interval old: all executions' monitors share one.
        procs = self._processes.members(self, self.sample_interval_s / 2)
        root = procs[0] if procs and procs[0].pid == self._popen.pid else None
        try:
            if root is None or root.status() == psutil.STATUS_ZOMBIE:
                return None  # the command has ended; a sample now would read an empty tree
        except psutil.Error:
            return None
        allowed = frozenset(self.slot.cpus)
        rss = 0.0
        alive: list[psutil.Process] = []
        rss_of: dict[int, int] = {}
        for p in procs:
            try:
                with p.oneshot():
                    rss_of[p.pid] = p.memory_info().rss
            except psutil.Error:
                continue  # exited between listing and reading
            rss += rss_of[p.pid]
            # A thread may widen its own affinity (sched_setaffinity): every thread pinned back at every sample.
            if allowed:
                pin_threads(p.pid, allowed)
            # children_* hold descendants already reaped, so the total does not drop when one exits.
            alive.append(p)
        if rss <= 0:
            return None  # the tree is exiting (its memory already torn down): no sample, not "0 MB"
        self._most_processes = max(self._most_processes, len(alive))
        # PSS when due, when the tree changed (a new process: the last ratio says nothing of its pages), and
        # whenever the RSS estimate nears the allowance: no run is ever judged over it on an estimate.
        self._since_pss += 1
        pids = frozenset(p.pid for p in alive)
        mem = max(0.0, rss - self._tree_shared)
        if (self._since_pss >= self._pss_every or pids != self._pss_pids
                or mem >= 0.8 * self.slot.memory_mb * 1024 * 1024):
            began = time.perf_counter()
            read_rss = pss = 0.0
            # The sample is the PSS read now: a process exiting since its RSS was read (its memory torn down)
            # would otherwise count in full against a shared excess read without it.
            mem = 0.0
            for p in alive:
                try:
                    p_rss, p_pss = _rss_pss_bytes(p)
                except psutil.NoSuchProcess:     # ZombieProcess too: it exited since its RSS was read and holds
                    continue                     # no memory now (its survivors' PSS grew by what it shared)
                except psutil.Error:
                    mem += rss_of[p.pid]         # there but unreadable: its RSS, the most it can hold
                    continue
                mem += p_pss
                read_rss, pss = read_rss + p_rss, pss + p_pss
                self._proc_shared = max(self._proc_shared, p_rss - p_pss)
                if p.pid == root.pid:
                    self._root_shared = max(0.0, p_rss - p_pss)
            spent = time.perf_counter() - began
            self._since_pss, self._pss_pids = 0, pids
            self._pss_every = max(1, math.ceil(spent / (PSS_BUDGET * self.sample_interval_s)))
            if pss > 0:
                self._tree_shared = max(0.0, read_rss - pss)
        # From the scan `members` used (at most half an interval old then): never a second scan for this sample.
        return self._tally_cpu(self.sample_interval_s), mem / (1024 * 1024), _vm_hwm_mb(root.pid)

    def _root_pss_mb(self, root_rss_mb: float) -> float:
        """The PSS an RSS reading of the root (its VmHWM, ru_maxrss) stands for."""
        return max(0.0, root_rss_mb - self._root_shared / (1024 * 1024))

    def _record_death_at_peak(self, peak_mb: float, cpu_seconds: float, end: float) -> None:
        """A last sample at the exit of a command that ran out of memory.

        Such a command dies at its peak (an allocation failed, or the watchdog
        caught it over the line), often between two samples: without this the
        series would miss the very bottleneck that ended the run. Under the
        rlimit the failing allocation is refused before it is resident, so the
        measured memory understates the demand; the demand did reach the
        allowance, and that is what this sample reports (the Exited record
        keeps the measured peak). Its CPU is measured over the last,
        partial interval.
        """
        since = self._sampled_at or self._t0
        cpu = _cpu_percent(cpu_seconds - self._sampled_cpu, end - since, len(self.slot.cpus))
        at = max(peak_mb, self.slot.memory_mb)
        sample = Sample(time.time(), cpu, at / self.slot.memory_mb * 100, at, max(0.0, end - since))
        with self._lock:
            keep_sample(self._samples, sample)
        self._push(sample)

    def _oom_killer_struck(self) -> bool:
        """Whether the kernel's OOM killer killed any process since this run began. Only the machine's count
        is readable (the kernel names its victim only in its log), so a SIGKILL sent by someone else while
        the OOM killer took another process would be put down to it too: rare, and said as what it is."""
        before, now = self._oom_kills_at_start, _oom_kills()
        return before is not None and now is not None and now > before

    def _reap(self, readers: list[threading.Thread], monitor: threading.Thread) -> None:
        try:
            self._end(readers, monitor)
        except BaseException as e:
            # The end must come anyway: a command left unreaped stays a zombie, and whoever waits for it
            # (StopExecution, ReleaseVm, the Execute stream) would wait forever.
            log.exception("ending execution %s failed", self.execution_id)
            self._end_after_failure(e)

    def _end(self, readers: list[threading.Thread], monitor: threading.Thread) -> None:
        assert self._popen is not None
        pid = self._popen.pid
        # Wait without reaping, so the group can still be killed by its id without racing pid reuse:
        # the command's exit ends the execution, and whatever it left running goes with it.
        os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)
        # The command is a zombie now, its reading final; a child it left a zombie, or running, still reads too.
        self._tally_at_the_end()
        with self._lock:
            _killpg(pid)
            self._leader_exited = True
        self._processes.kill(self)
        _, status, usage = os.wait4(pid, 0)
        wall = time.monotonic() - self._t0
        exit_code = os.waitstatus_to_exitcode(status)
        self._popen.returncode = exit_code  # keep the Popen object consistent; we reaped it ourselves
        self._processes.unregister(self)
        self._stop_monitor.set()
        monitor.join()
        self._memory.leave(self)  # at once: a dead tree's last use must not count against its VM's others
        for t in readers:
            t.join(_PIPE_DRAIN_S)

        died = exit_code != 0 or self._killed_for is not None
        # ru_maxrss (KiB) is the peak RSS of the command and the descendants it waited for, and catches a
        # spike between two samples; but Linux carries the spawning process's high-water mark across exec,
        # so it is at least the agent's size at the spawn. Above that it can only be the command's own. It is
        # the largest of any one process, not necessarily the root's: in a tree of several, what it counts
        # beyond PSS is at most the largest shared excess seen of any process (a child mapping a file other
        # processes map too), and a short-lived one no sample saw may count more -- too uncertain to call a run
        # that finished well "over its limit", so there it only counts for a run that failed.
        maxrss_mb = usage.ru_maxrss / 1024
        peak = self._peak_mb
        if maxrss_mb > self._spawner_hwm_mb:
            if self._most_processes <= 1:
                peak = max(peak, self._root_pss_mb(maxrss_mb))
            elif died:
                shared = max(self._root_shared, self._proc_shared)
                peak = max(peak, maxrss_mb - shared / (1024 * 1024))
        # The command's own and its waited-for descendants' (rusage), and the processes of the run reaped
        # outside it (the ledger's gone: in no one's rusage), or the ledger's total at the last sample if more.
        with self._cpu_lock:
            gone = self._cpu.gone
        cpu_seconds = max(self._cpu_seconds, gone + usage.ru_utime + usage.ru_stime)
        reason = exit_reason(self._killed_for, exit_code, peak, self.slot.memory_mb, self._stderr_tail,
                             oom_killed=exit_code == -signal.SIGKILL and self._oom_killer_struck(),
                             vm_memory_mb=self.slot.vm_memory_mb)
        # A run killed for the VM's total did not itself reach the allowance: its samples say what it used. A run
        # that finished well did not die at its peak.
        if reason.startswith(MEMORY_LIMIT_EXCEEDED) and not self._killed_for_vm and died:
            self._record_death_at_peak(peak, cpu_seconds, self._t0 + wall)
        self._finish(Exited(
            exit_code=exit_code,
            wall_time_s=wall,
            reason=reason,
            peak_memory_mb=peak,
            mean_cpu_percent=_cpu_percent(cpu_seconds, wall, len(self.slot.cpus)),
        ), wall)

    def _end_after_failure(self, error: BaseException) -> None:
        """What `_end` owes, after it raised: the tree killed, the command reaped, an `Exited` saying why."""
        assert self._popen is not None
        pid = self._popen.pid
        exit_code = -signal.SIGKILL
        with self._lock:
            if not self._leader_exited:
                try:
                    os.killpg(pid, signal.SIGKILL)
                except OSError:
                    pass
                self._leader_exited = True
        try:
            self._processes.kill(self)
        except Exception:  # noqa: BLE001 - reaping comes first
            log.exception("killing the processes of execution %s failed", self.execution_id)
        if self._popen.returncode is None:
            try:
                _, status = os.waitpid(pid, 0)
                exit_code = os.waitstatus_to_exitcode(status)
                self._popen.returncode = exit_code
            except ChildProcessError:
                pass
        else:
            exit_code = self._popen.returncode
        try:
            self._processes.unregister(self)
        except Exception:  # noqa: BLE001 - the end must still be reported
            log.exception("forgetting the processes of execution %s failed", self.execution_id)
        self._stop_monitor.set()
        self._memory.leave(self)
        wall = time.monotonic() - self._t0
        self._finish(Exited(
            exit_code=exit_code,
            wall_time_s=wall,
            reason=f"agent error: ending the execution failed ({type(error).__name__}: {error}); see the agent's log",
            peak_memory_mb=self._peak_mb,
            mean_cpu_percent=_cpu_percent(self._cpu_seconds, wall, len(self.slot.cpus)),
        ), wall)

    def _finish(self, exited: Exited, wall: float) -> None:
        with self._lock:
            if self._exited is not None:
                return
            self._exited = exited
            self.ended_at = self.started_at + wall
        # Owner's bookkeeping first, so whoever sees `exited` sees its effects too.
        if self._on_exit is not None:
            try:
                self._on_exit(self)
            except Exception:  # noqa: BLE001 - the end must still be reported
                log.exception("on_exit of %s failed", self.execution_id)
        self._push(exited)
        self._done.set()


def _cpu_percent(cpu_seconds: float, wall_seconds: float, ncpus: int) -> float:
    """CPU time over wall time as a share of `ncpus` CPUs: 100 = all of them busy throughout.

    Clamped to [0, 100]: a tree pinned to `ncpus` CPUs cannot use more, so more
    is measurement noise (/proc counts CPU in 10 ms ticks, which over a short
    interval is a large error), as is a dip when a process leaves the tree.
    """
    return min(100.0, max(0.0, cpu_seconds) / max(wall_seconds, 1e-6) / ncpus * 100)


def _killpg(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def merge_utilisation(runs: Sequence[tuple[Sequence[Sample], float | None]]) -> list[Sample]:
    """One VM-wide series from its executions' `(samples, ended_at)`.

    Executions of one VM share its CPUs and memory, so at each sample time the
    VM's utilisation is the sum of the latest sample of every execution running
    then (`ended_at` None: still running). Sequential runs pass through unchanged.
    CPU is at most 100 (all of the VM's CPUs): executions pinned to the same CPUs
    cannot use more together, and a sum above it is their samples' staggered
    times (each one's latest, taken up to an interval apart).
    """
    ends = [math.inf if end is None else end for _, end in runs]
    points = sorted(((s, i) for i, (samples, _) in enumerate(runs) for s in samples), key=lambda p: p[0].time)
    latest: dict[int, Sample] = {}
    merged: list[Sample] = []
    for s, i in points:
        latest[i] = s
        live = [x for j, x in latest.items() if j == i or ends[j] >= s.time]
        merged.append(
            Sample(
                time=s.time,
                cpu_percent=min(100.0, sum(x.cpu_percent for x in live)),
                memory_percent=sum(x.memory_percent for x in live),
                memory_mb=sum(x.memory_mb for x in live),
                # What this point stands for in the merged series (decimate weighs by it): since the one before.
                span_s=s.time - merged[-1].time if merged else s.span_s,
            )
        )
    return merged
