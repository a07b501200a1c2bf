"""A VM's memory limit is never more than the machine can give, and a run that dies of memory says so.

The machine's memory is injected (a fake reading), never this machine's own size; the programs are small
real ones (at most ~400 MB), confined to limits of 128 MB.
"""

from __future__ import annotations

import logging
import re
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from harness.v1 import agent_pb2, compute_pb2
from irm_compute import sandbox
from irm_compute.agent import Agent, AgentConfig
from irm_compute.sandbox import (
    MEMORY_LIMIT_EXCEEDED,
    CpuAllocator,
    Exited,
    LocalExecution,
    Output,
    Sample,
    Started,
    child_env,
    exit_reason,
)

PY = sys.executable

# Grows to 400 MB in 4 MB steps (each written, so resident), then exits 0: unconfined, it just succeeds.
GROW_AND_EXIT = """
held = []
for _ in range(100):
    held.append(bytearray(b"\\x01") * (4 << 20))
print("allocated", flush=True)
"""

# Holds 64 MB until the file `release` appears in its working directory, then dies of SIGKILL, as a process
# the kernel's OOM killer picks does.
HOLD_THEN_SIGKILL = """
import os, signal, time
b = bytearray(b"\\x01") * (64 << 20)
print("held", flush=True)
deadline = time.monotonic() + 60
while not os.path.exists("release") and time.monotonic() < deadline:
    time.sleep(0.02)
os.kill(os.getpid(), signal.SIGKILL)
"""


def stdout(events: list[object]) -> str:
    return b"".join(e.data for e in events if isinstance(e, Output) and e.stream == "stdout").decode()


# --- (a) the limit is what the machine can give ------------------------------------------------------------


def test_a_vm_larger_than_the_machine_is_confined_to_the_machine_less_its_reserve() -> None:
    alloc = CpuAllocator([0], machine_mb=4096, reserve_mb=512)
    big = alloc.slot("big", 1, 65536)
    assert (big.memory_mb, big.vm_memory_mb) == (3584, 65536)
    assert ("VM has 65536 MB of memory; this machine has 4096 MB, 512 MB of it kept from VMs: confined to 3584 MB"
            in big.notes)
    # What the program is told it has is what it may use: sizing itself by the VM's 64 GB would kill it.
    assert child_env(big, {})["HARNESS_VM_MEMORY_MB"] == "3584"
    small = alloc.slot("small", 1, 1024)
    assert (small.memory_mb, small.vm_memory_mb) == (1024, 1024)
    assert not any("confined" in n for n in small.notes)


def test_the_automatic_reserve_is_a_tenth_of_the_machine_at_least_512_mb_at_most_half() -> None:
    assert CpuAllocator([0], machine_mb=24000).vm_memory_cap_mb == 21600
    assert CpuAllocator([0], machine_mb=2048).vm_memory_cap_mb == 2048 - 512
    assert CpuAllocator([0], machine_mb=800).vm_memory_cap_mb == 400
    assert CpuAllocator([0], machine_mb=24000, reserve_mb=-1).vm_memory_cap_mb == 21600


def test_a_reserve_leaving_nothing_for_vms_is_refused_at_start_up(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sandbox, "machine_memory_mb", lambda: 4096.0)
    with pytest.raises(ValueError, match=r"memory_reserve_mb 4096: this machine has 4096 MB"):
        Agent(AgentConfig(work_dir=str(tmp_path), memory_reserve_mb=4096), None)  # type: ignore[arg-type]


class _Compute:
    """ComputeControl/GetVm answering with one VM of 64 GB."""

    def get_vm(self, vm_id: str) -> compute_pb2.Vm:
        return compute_pb2.Vm(id=vm_id, tenant="alice", reservation_id="r", host="big-host", cores=1,
                              memory_gb=64, state=compute_pb2.Vm.STATE_ACTIVE)

    def close(self) -> None:
        pass


def test_the_agent_runs_a_vm_its_machine_cannot_hold_within_what_the_machine_has(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(sandbox, "machine_memory_mb", lambda: 4096.0)
    agent = Agent(AgentConfig(work_dir=str(tmp_path), memory_reserve_mb=1024), _Compute())  # type: ignore[arg-type]
    try:
        with caplog.at_level(logging.WARNING, logger="irm_compute.agent"):
            run = agent.execute(agent_pb2.ExecuteRequest(tenant="alice", vm_id="vm-1", argv=["/bin/true"]))
        events = list(run.execution.events())
        started = events[0]
        assert isinstance(started, Started) and started.memory_limit_mb == 3072
        assert any("confined to 3072 MB" in n for n in started.notes)
        assert isinstance(events[-1], Exited) and events[-1].exit_code == 0
        assert any("VM larger than this machine" in r.getMessage() for r in caplog.records)
    finally:
        agent.shutdown()


# --- (b) a run that dies of memory says so --------------------------------------------------------------------


def test_a_program_outgrowing_a_confined_vm_dies_of_its_limit_and_says_it_was_confined(tmp_path: Path) -> None:
    # A 64 GB VM on a "machine" of 640 MB with a 512 MB reserve: 128 MB, below the RLIMIT floor, so the watchdog
    # (or the peak it measured) is what stops the program's 400 MB.
    slot = CpuAllocator(machine_mb=640, reserve_mb=512).slot("vm", 1, 65536)
    ex = LocalExecution("ex", slot, [PY, "-c", GROW_AND_EXIT], working_dir=str(tmp_path), sample_interval_s=0.05,
                        timeout_s=30)
    ex.start()
    events = list(ex.events())
    x = events[-1]
    assert isinstance(x, Exited)
    assert isinstance(events[0], Started) and events[0].memory_limit_mb == 128
    assert x.reason == (f"{MEMORY_LIMIT_EXCEEDED} (the VM's 65536 MB confined to the 128 MB this machine can "
                        "give it)"), (x, stdout(events))
    assert x.peak_memory_mb >= 0.9 * 128


def _run_until_sampled_then_sigkilled(tmp_path: Path) -> tuple[list[object], Exited]:
    """HOLD_THEN_SIGKILL in a 128 MB VM: released once a sample has measured its 64 MB."""
    slot = CpuAllocator(machine_mb=65536).slot("vm", 1, 128)
    ex = LocalExecution("ex", slot, [PY, "-c", HOLD_THEN_SIGKILL], working_dir=str(tmp_path),
                        sample_interval_s=0.05, timeout_s=60)
    ex.start()
    events: list[object] = []
    for event in ex.events():
        events.append(event)
        if isinstance(event, Sample) and event.memory_mb > 60 and not (tmp_path / "release").exists():
            (tmp_path / "release").touch()
    x = events[-1]
    assert isinstance(x, Exited) and x.exit_code == -9, x
    return events, x


def test_a_sigkill_from_the_kernels_oom_killer_below_the_limit_says_the_machine_ran_out(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    kills = iter([7, 8])            # the kernel's count before the run, and after: it killed a process meanwhile
    monkeypatch.setattr(sandbox, "_oom_kills", lambda: next(kills))
    _, x = _run_until_sampled_then_sigkilled(tmp_path)
    m = re.fullmatch(r"out of memory: the kernel's OOM killer killed it \(SIGKILL\) at a peak of (\d+) MB of its "
                     r"128 MB limit: this machine ran out of memory first \(other VMs or processes on it\)", x.reason)
    assert m, x.reason
    assert int(m.group(1)) == round(x.peak_memory_mb) and 60 < x.peak_memory_mb < 0.9 * 128


def test_a_sigkill_while_the_oom_killer_was_idle_is_not_put_down_to_memory(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sandbox, "_oom_kills", lambda: 7)
    _, x = _run_until_sampled_then_sigkilled(tmp_path)
    assert x.reason == ""           # someone's `kill -9`: the run's exit code says what is known


def test_exit_reason_for_confined_and_oom_killed_runs() -> None:
    confined = f"{MEMORY_LIMIT_EXCEEDED} (the VM's 65536 MB confined to the 3584 MB this machine can give it)"
    assert exit_reason(MEMORY_LIMIT_EXCEEDED, -9, 3600, 3584, b"", vm_memory_mb=65536) == confined   # watchdog
    assert exit_reason(None, 1, 20, 3584, b"MemoryError", vm_memory_mb=65536) == confined          # the rlimit
    assert exit_reason("timeout", -9, 20, 3584, b"", vm_memory_mb=65536) == "timeout"
    # Near its own limit, the VM outgrew itself whoever sent the SIGKILL.
    assert exit_reason(None, -9, 500, 512, b"", oom_killed=True) == MEMORY_LIMIT_EXCEEDED
    assert exit_reason(None, -9, 0, 512, b"", oom_killed=True) == (
        "out of memory: the kernel's OOM killer killed it (SIGKILL) before its first memory sample, under a 512 MB "
        "limit: this machine ran out of memory first (other VMs or processes on it)")


def test_the_machines_memory_is_its_cgroups_limit_where_that_is_lower(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A container of 1 GB on a machine of 8 GB: its VMs' processes are the agent's children, in its cgroup.
    monkeypatch.setattr(sandbox.psutil, "virtual_memory", lambda: SimpleNamespace(total=8 << 30))
    unlimited, limit = tmp_path / "memory.max", tmp_path / "parent.memory.max"
    unlimited.write_text("max\n")
    limit.write_text(f"{1 << 30}\n")
    monkeypatch.setattr(sandbox, "_cgroup_memory_limit_files", lambda: [str(unlimited), str(tmp_path / "absent")])
    assert sandbox.machine_memory_mb() == 8192
    monkeypatch.setattr(sandbox, "_cgroup_memory_limit_files", lambda: [str(unlimited), str(limit)])
    assert sandbox.machine_memory_mb() == 1024


def test_the_cgroup_limit_files_are_the_processs_cgroup_and_its_ancestors(tmp_path: Path) -> None:
    v2 = tmp_path / "v2"
    v2.write_text("0::/system.slice/agent.service\n")
    assert sandbox._cgroup_memory_limit_files(str(v2)) == [
        "/sys/fs/cgroup/system.slice/agent.service/memory.max", "/sys/fs/cgroup/system.slice/memory.max",
        "/sys/fs/cgroup/memory.max"]
    v1 = tmp_path / "v1"
    v1.write_text("5:cpu,cpuacct:/docker/abc\n4:memory:/docker/abc\n0::/\n")
    assert sandbox._cgroup_memory_limit_files(str(v1)) == [
        "/sys/fs/cgroup/memory/docker/abc/memory.limit_in_bytes", "/sys/fs/cgroup/memory/docker/memory.limit_in_bytes",
        "/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory.max"]


def test_the_agent_says_at_start_up_how_much_memory_a_vm_can_have_here(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(sandbox, "machine_memory_mb", lambda: 4096.0)
    agent = Agent(AgentConfig(work_dir=str(tmp_path), memory_reserve_mb=1024), _Compute())  # type: ignore[arg-type]
    with caplog.at_level(logging.INFO, logger="irm_compute.agent"):
        agent.open()
    try:
        said = [r for r in caplog.records if r.getMessage() == "VM memory limited to what this machine can give"]
        assert [(r.machine_memory_mb, r.memory_reserve_mb, r.vm_memory_cap_mb) for r in said] == [(4096, 1024, 3072)]
    finally:
        agent.shutdown()
