"""An execution whose start or end fails half-way leaves nothing running, unwatched or unreaped; and the agent runs
at most `max_executions` at once (a cancelled stream leaves its run going, so the stream cap does not bound them).

Real child processes; what the tests break (a thread that cannot start, a failing wait) is patched in.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from pathlib import Path

import pytest

from harness.v1 import agent_pb2, compute_pb2
from irm_compute.agent import Agent, AgentConfig
from irm_compute.sandbox import STOPPED, CpuAllocator, Exited, LocalExecution
from services.errors import CAPACITY_IN_USE, ResourceExhausted

PY = sys.executable
SLEEP = [PY, "-c", "import time; time.sleep(60)"]


def reaped(pid: int) -> bool:
    """Whether `pid`, a child of this process, has been reaped (not running, not a zombie; one is reaped here)."""
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return True
    return False


def kill_if_ours(pid: int) -> None:
    """Cleanup for a broken build: SIGKILL and reap a child the code under test left behind."""
    try:
        if os.waitpid(pid, os.WNOHANG) == (0, 0):
            os.killpg(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
    except (ChildProcessError, ProcessLookupError):
        pass


def test_a_thread_that_cannot_start_after_the_spawn_kills_and_reaps_the_command(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real_start = threading.Thread.start

    def start(self: threading.Thread) -> None:
        if self.name.endswith("-monitor"):
            raise RuntimeError("can't start new thread")
        real_start(self)

    ex = LocalExecution("ex-1", CpuAllocator().slot("vm", 1, 1024), SLEEP, working_dir=str(tmp_path),
                        timeout_s=1.0)
    monkeypatch.setattr(threading.Thread, "start", start)
    with pytest.raises(RuntimeError, match="can't start new thread"):
        ex.start()
    monkeypatch.undo()
    assert ex.started is not None
    pid = ex.started.pid
    try:
        # Nobody would have watched it: no timeout, no stop, its scratch directory removed under it.
        assert reaped(pid), "the command runs on, untracked"
        assert not ex.kill()     # nothing left to kill, and no pid of someone else's signalled
    finally:
        kill_if_ours(pid)


def test_a_reaper_that_fails_still_reaps_the_command_and_reports_its_end(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*args: object) -> None:
        raise OSError("waitid failed")

    monkeypatch.setattr(os, "waitid", broken)
    ex = LocalExecution("ex-1", CpuAllocator().slot("vm", 1, 1024), SLEEP, working_dir=str(tmp_path))
    started = ex.start()
    try:
        x = ex.wait(10)
        assert x is not None, "whoever waits for the end (StopExecution, the stream) would wait forever"
        assert x.reason.startswith("agent error: ending the execution failed (OSError: waitid failed)"), x
        assert x.exit_code == -signal.SIGKILL
        assert reaped(started.pid), "left a zombie"
        assert list(ex.events())[-1] == x
    finally:
        monkeypatch.undo()
        kill_if_ours(started.pid)


class _Compute:
    """The compute IRM as the agent asks it: every VM is alice's, active, of 1 core and 1 GB."""

    def get_vm(self, vm_id: str) -> compute_pb2.Vm:
        return compute_pb2.Vm(id=vm_id, tenant="alice", reservation_id="r", host="h", cores=1, memory_gb=1,
                              state=compute_pb2.Vm.STATE_ACTIVE)

    def close(self) -> None:
        pass


def test_the_agent_runs_at_most_max_executions_at_once(tmp_path: Path) -> None:
    agent = Agent(AgentConfig(work_dir=str(tmp_path), max_executions=2), _Compute())  # type: ignore[arg-type]

    def execute() -> LocalExecution:
        req = agent_pb2.ExecuteRequest(tenant="alice", vm_id="vm-1", argv=SLEEP)
        return agent.execute(req).execution  # type: ignore[return-value]

    try:
        first, second = execute(), execute()
        # Their streams may be long gone (a cancelled stream leaves its run going): the runs count, not streams.
        first.detach()
        second.detach()
        with pytest.raises(ResourceExhausted) as refused:
            execute()
        assert refused.value.reason == CAPACITY_IN_USE and refused.value.retry_after_s
        assert "max_executions=2" in str(refused.value)
        # Nothing of the refused one is left behind: only the two runs' scratch directories.
        assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("ex-")) == sorted(
            [first.execution_id, second.execution_id])
        agent.stop("alice", first.execution_id)
        assert isinstance(first.exited, Exited) and first.exited.reason == STOPPED
        third = execute()             # room again once one ended
        assert third.running
    finally:
        agent.shutdown()


def test_max_executions_must_be_at_least_one(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="max_executions 0: at least 1"):
        Agent(AgentConfig(work_dir=str(tmp_path), max_executions=0), _Compute())  # type: ignore[arg-type]
