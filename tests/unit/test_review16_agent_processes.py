"""Which processes are an execution's: found by one scan shared by every execution, every thread pinned, and a
daemon that double-forks, leaves the session and rewrites its environment still goes with its execution.

Real processes; the agent runs in this process (no gRPC), as a child subreaper while it is open.
"""

from __future__ import annotations

import json
import os
import select
import signal
import sys
import time
from collections import Counter
from pathlib import Path

import psutil
import pytest

from harness.v1 import agent_pb2
from irm_compute import processes
from irm_compute.agent import Agent, AgentConfig
from irm_compute.sandbox import EXECUTION_MARK, STOPPED, TIMEOUT, CpuAllocator, LocalExecution
from tests.conftest import eventually
from tests.unit.test_agent_sandbox import first_line, wait_dead
from tests.unit.test_review16_agent_start import _Compute

PY = sys.executable
# An execution's time limit that ends it after the process it starts has printed its pid (an interpreter's
# start-up and forks: over a second on a loaded machine), not before.
LIMIT_S = 4.0


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 CPUs to widen onto")
def test_a_thread_that_widens_its_cpu_affinity_is_pinned_back(tmp_path: Path) -> None:
    slot = CpuAllocator().slot("vm", 1, 1024)
    # Not the main thread: its mask is the one psutil reads, and it stays narrow.
    code = ("import os, threading, time\n"
            "out = []\n"
            "def widen():\n"
            "    os.sched_setaffinity(0, range(os.cpu_count()))\n"
            "    wide = len(os.sched_getaffinity(0))\n"
            "    deadline = time.monotonic() + 10\n"
            "    while len(os.sched_getaffinity(0)) > 1 and time.monotonic() < deadline:\n"
            "        time.sleep(0.02)\n"
            "    out.append((wide, sorted(os.sched_getaffinity(0))))\n"
            "t = threading.Thread(target=widen)\n"
            "t.start()\n"
            "t.join()\n"
            "print(out[0][0], out[0][1], flush=True)\n")
    ex = LocalExecution("ex", slot, [PY, "-c", code], working_dir=str(tmp_path), sample_interval_s=0.1,
                        timeout_s=30)
    ex.start()
    wide, now = first_line(ex).split(" ", 1)
    ex.wait(10)
    assert int(wide) > 1 and json.loads(now) == list(slot.cpus)


# --- one scan for all ---------------------------------------------------------------------------------------------


def test_sampling_walks_the_process_table_once_per_interval_however_many_executions_run(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    walks: list[float] = []
    listdir = os.listdir

    def counting(path: str | bytes = ".") -> list:  # type: ignore[type-arg]
        if path in ("/proc", b"/proc"):            # psutil's and the agent's walk of the process table
            walks.append(time.monotonic())
        return listdir(path)

    n, interval, timeout = 12, 0.1, 1.5
    slot = CpuAllocator().slot("vm", 1, 4096)
    runs = [LocalExecution(f"ex-{i}", slot, ["/bin/sh", "-c", "sleep 30 & sleep 30 & wait"],
                           working_dir=str(tmp_path), sample_interval_s=interval, timeout_s=timeout)
            for i in range(n)]
    monkeypatch.setattr(os, "listdir", counting)
    first_start = time.monotonic()
    for r in runs:
        r.start()
    for r in runs:
        x = r.wait(30)
        assert x is not None and x.reason == TIMEOUT
    monkeypatch.undo()
    # While any of them ran: from the first start to the last exit (longer than `timeout` when a loaded machine
    # staggers their starts).
    span = time.monotonic() - first_start
    for r in runs:
        assert len(r.samples) >= 0.3 * timeout / interval     # they were sampled all along
    # One walk per half interval at most while they run, plus a few to kill each at its end: not per execution
    # per sample (12 executions x 15 samples x 2 walks each).
    assert len(walks) <= span / (interval / 2) + 3 * 2 * n, (len(walks), span)


def test_a_processs_environment_is_read_once_in_its_life(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    reads: Counter[int] = Counter()
    read_mark = processes._read_mark

    def counting(pid: int) -> str:
        reads[pid] += 1
        return read_mark(pid)

    monkeypatch.setattr(processes, "_read_mark", counting)
    # A background job whose parent (a subshell) exits at once: found by its mark, not by lineage.
    slot = CpuAllocator().slot("vm", 1, 4096)
    runs = [LocalExecution(f"ex-{i}", slot, ["/bin/sh", "-c", "(sleep 30 &); sleep 30"], working_dir=str(tmp_path),
                           sample_interval_s=0.05, timeout_s=1.0) for i in range(4)]
    for r in runs:
        r.start()
    for r in runs:
        assert r.wait(30) is not None
    assert reads and max(reads.values()) == 1, reads.most_common(3)


# --- daemons ------------------------------------------------------------------------------------------------------

# Holds the FIFO `alive` open for writing (every process it starts inherits it), then leaves the session in a child
# that forks a new one every 2 ms and exits: a chain no scan-and-kill by pid keeps up with. Prints that child's pid
# (its process group's id).
HOPPER = """
import os, sys, time
os.open(sys.argv[1], os.O_WRONLY)
child = os.fork()
if child == 0:
    os.setsid()
    while True:
        time.sleep(0.002)
        if os.fork():
            os._exit(0)
print(child, flush=True)
time.sleep(60)
"""


def test_a_process_that_hops_to_a_new_child_every_few_milliseconds_goes_with_its_execution(tmp_path: Path) -> None:
    fifo = tmp_path / "alive"
    os.mkfifo(fifo)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    ex = LocalExecution("ex", CpuAllocator().slot("vm", 1, 1024), [PY, "-c", HOPPER, str(fifo)],
                        working_dir=str(tmp_path), sample_interval_s=0.1, timeout_s=LIMIT_S)
    ex.start()
    group = int(first_line(ex))       # the writer has the FIFO open by now
    try:
        x = ex.wait(30)
        assert x is not None and x.reason == TIMEOUT
        # The FIFO reads end-of-file once no process holds it: the whole chain is gone.
        assert select.select([reader], [], [], 10)[0] and os.read(reader, 1) == b"", "the chain hops on"
    finally:
        if not select.select([reader], [], [], 0)[0]:
            os.killpg(group, signal.SIGKILL)   # cleanup for a broken build: the chain, alive, holds its group's id
        os.close(reader)

# Double-forks into a session of its own and overwrites its environment area, as setproctitle does (what
# /proc/<pid>/environ shows: the execution's mark is gone), all before any scan can see it; prints its pid.
DAEMON = """
import ctypes, os, time
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        stat = open("/proc/self/stat").read()
        fields = stat[stat.rfind(")") + 2:].split()
        env_start, env_end = int(fields[47]), int(fields[48])
        ctypes.memset(env_start, 0, env_end - env_start)
        print(os.getpid(), flush=True)
        time.sleep(60)
    os._exit(0)
time.sleep(60)
"""


@pytest.fixture
def agent(tmp_path: Path):  # type: ignore[no-untyped-def]
    a = Agent(AgentConfig(work_dir=str(tmp_path / "agent"), sample_interval_s=0.1), _Compute())  # type: ignore[arg-type]
    a.open()
    try:
        yield a
    finally:
        a.shutdown()


def execute(agent: Agent, argv: list[str], timeout_s: float = 0.0) -> LocalExecution:
    req = agent_pb2.ExecuteRequest(tenant="alice", vm_id="vm-1", argv=argv, timeout_s=timeout_s)
    return agent.execute(req).execution  # type: ignore[return-value]


def daemon_of(ex: LocalExecution) -> tuple[psutil.Process, int]:
    """The daemon the execution started, and a pidfd of it (alive now: no question of pid reuse)."""
    pid = int(first_line(ex))
    daemon, pidfd = psutil.Process(pid), os.pidfd_open(pid)
    assert EXECUTION_MARK not in daemon.environ()   # nothing of the execution left to recognise it by
    return daemon, pidfd


def kill(p: psutil.Process | None) -> None:
    """Cleanup when the code under test let it escape."""
    if p is not None:
        try:
            p.kill()
        except psutil.Error:
            pass


def test_a_daemon_that_double_forks_and_rewrites_its_environment_goes_with_its_execution(agent: Agent) -> None:
    ex = execute(agent, [PY, "-c", DAEMON], timeout_s=LIMIT_S)
    daemon = None
    try:
        daemon, pidfd = daemon_of(ex)
        x = ex.wait(30)
        assert x is not None and x.reason == TIMEOUT
        wait_dead(pidfd)
        # Reaped too: it was the agent's child (adopted), and a zombie would hold its pid for the agent's life.
        eventually(lambda: not daemon.is_running(), timeout=5, what="the killed daemon reaped")
    finally:
        kill(daemon)


def test_a_daemon_two_running_executions_may_have_started_goes_at_the_latest_with_the_last_of_them(
        agent: Agent) -> None:
    other = execute(agent, [PY, "-c", "print('ready', flush=True); import time; time.sleep(60)"])
    assert first_line(other) == "ready"
    ex = execute(agent, [PY, "-c", DAEMON], timeout_s=LIMIT_S)
    daemon = None
    try:
        daemon, pidfd = daemon_of(ex)
        x = ex.wait(30)
        assert x is not None and x.reason == TIMEOUT
        # Unless a scan saw it or its parent before it hid (then it went with its execution), which of the two
        # started it is not known: it goes when neither runs any more.
        agent.stop("alice", other.execution_id)
        assert other.exited is not None and other.exited.reason == STOPPED
        wait_dead(pidfd)
        eventually(lambda: not daemon.is_running(), timeout=5, what="the killed daemon reaped")
    finally:
        kill(daemon)
