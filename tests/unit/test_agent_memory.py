"""What the local back-end counts as a VM's memory, on real processes (no gRPC).

* a peak belongs to the command, not to the process that spawned it (Linux
  carries the parent's high-water mark into ru_maxrss across exec);
* pages a forked worker shares copy-on-write count once (PSS, not RSS);
* the allowance is the VM's, shared by every execution running in it.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from irm_compute.sandbox import (
    MEMORY_LIMIT_EXCEEDED,
    CpuAllocator,
    Exited,
    LocalExecution,
    Output,
    Sample,
    VmMemory,
    _vm_hwm_mb,
)
from tests.conftest import eventually

PY = sys.executable


def run(tmp_path: Path, memory_mb: float, argv: list[str], interval: float = 0.1,
        timeout_s: float = 30) -> tuple[list[object], Exited]:
    slot = CpuAllocator().slot("vm", 1, memory_mb)
    ex = LocalExecution("ex", slot, argv, working_dir=str(tmp_path), sample_interval_s=interval,
                        timeout_s=timeout_s)
    ex.start()
    events = list(ex.events())
    assert isinstance(events[-1], Exited)
    return events, events[-1]


def out(events: list[object]) -> bytes:
    return b"".join(e.data for e in events if isinstance(e, Output) and e.stream == "stdout")


def resident(mb: int) -> bytearray:
    """`mb` MB resident in this, the spawning, process (as an agent holds its own memory)."""
    return bytearray(b"\x01") * (mb << 20)


# --- the spawner's peak is not the command's ---------------------------------------------------


@pytest.mark.parametrize("argv", [["/bin/true"], [PY, "-c", "import time; time.sleep(0.5)"]],
                         ids=["true", "python-sleep"])
def test_a_small_program_in_a_small_vm_is_not_charged_with_its_spawners_memory(
        tmp_path: Path, argv: list[str]) -> None:
    spawner = resident(300)                          # the spawner (this process) is big
    assert _vm_hwm_mb("self") >= 300
    events, x = run(tmp_path, 32, argv)              # a 32 MB VM: far below the spawner's size
    del spawner
    assert (x.exit_code, x.reason) == (0, "")
    assert x.peak_memory_mb < 32
    if argv[0] == PY:                                # lived through samples: they measured it
        assert [s for s in events if isinstance(s, Sample)] and x.peak_memory_mb > 1


def test_a_spike_between_two_samples_still_counts_when_it_exceeds_what_the_spawner_holds(tmp_path: Path) -> None:
    spawner_was_big = resident(700)
    # No sample in its lifetime (10 s interval): only ru_maxrss sees it. The spawner has been big, but holds
    # less than the spike now: its high-water mark is reset at the spawn, so the spike can only be the command's.
    del spawner_was_big
    spike = 600
    code = f"b = bytearray(b'\\x01') * ({spike} << 20); del b"
    events, x = run(tmp_path, 256, [PY, "-c", code], interval=10)  # 256 MB: no RLIMIT_DATA, watchdog only
    assert x.wall_time_s < 10                   # over before the watchdog's first sample
    assert x.exit_code == 0 and x.reason == MEMORY_LIMIT_EXCEEDED
    assert x.peak_memory_mb >= spike


# --- copy-on-write pages count once --------------------------------------------------------------

# 300 MB resident, then 3 forked workers that read every page (`write`: write it, making a private copy),
# hold for `hold` seconds and exit.
COW = """
import os, sys, time
write = {write}
data = bytearray(b"\\x01") * (300 << 20)
kids = []
for _ in range(3):
    pid = os.fork()
    if pid == 0:
        s = 0
        for i in range(0, len(data), 4096):
            if write:
                data[i] = 2
            else:
                s += data[i]
        print("worker", flush=True)
        time.sleep({hold})
        os._exit(0)
    kids.append(pid)
for k in kids:
    os.waitpid(k, 0)
print("done", flush=True)
"""


def test_pages_shared_copy_on_write_by_forked_workers_count_once(tmp_path: Path) -> None:
    events, x = run(tmp_path, 1024, [PY, "-c", COW.format(write=False, hold=2)], interval=0.1)
    assert (x.exit_code, x.reason) == (0, ""), out(events)
    assert out(events).count(b"worker") == 3 and out(events).endswith(b"done\n")
    samples = [e for e in events if isinstance(e, Sample)]
    # The workers were sampled (2 s at 0.1 s), and 4 processes mapping 300 MB came to ~300 MB, not 1.2 GB.
    assert 290 < max(s.memory_mb for s in samples) < 500


def test_pages_the_workers_copy_do_count(tmp_path: Path) -> None:
    # Written, every worker's 300 MB is its own: 1.2 GB in a 1 GB VM, killed by the watchdog.
    events, x = run(tmp_path, 1024, [PY, "-c", COW.format(write=True, hold=30)], interval=0.1)
    assert (x.exit_code, x.reason) == (-9, MEMORY_LIMIT_EXCEEDED)
    assert b"done" not in out(events)


# --- the VM's memory is shared by its executions ----------------------------------------------------

# Holds `mb` MB, says so, and keeps it until the file `release` appears in its working directory.
HOLD = """
import os, time
b = bytearray(b"\\x01") * ({mb} << 20)
print("held", flush=True)
deadline = time.monotonic() + 60
while not os.path.exists("release") and time.monotonic() < deadline:
    time.sleep(0.02)
print("done", flush=True)
"""


MAPS = ("import mmap, sys, time\n"
        "f = open(sys.argv[1], 'rb'); m = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)\n"
        "s = sum(m[i] for i in range(0, len(m), 4096))\n"
        "print('ok', flush=True); time.sleep(float(sys.argv[2]))\n")


def test_a_file_mapped_by_other_processes_too_is_judged_by_its_share_not_in_full(tmp_path: Path) -> None:
    import subprocess

    data = tmp_path / "data.bin"
    data.write_bytes(b"\x01" * (160 << 20))
    # Two processes outside the run map the same 160 MB: the run's share of those pages is about a third.
    others = [subprocess.Popen([PY, "-c", MAPS, str(data), "60"], stdout=subprocess.PIPE) for _ in range(2)]
    try:
        for o in others:
            assert o.stdout.readline().startswith(b"ok")
        events, x = run(tmp_path, 128, [PY, "-c", MAPS, str(data), "1.5"])
        samples = [e.memory_mb for e in events if isinstance(e, Sample)]
        # Its samples (PSS) say ~55-60 MB in a 128 MB VM: the verdict agrees, though its RSS peak is 170 MB.
        assert samples and max(samples) < 128
        assert x.exit_code == 0 and x.reason == "" and x.peak_memory_mb < 128, x
    finally:
        for o in others:
            o.kill()
            o.wait()


def test_executions_of_one_vm_share_its_memory_and_the_largest_goes(tmp_path: Path) -> None:
    slot = CpuAllocator().slot("vm", 1, 1024)
    memory = VmMemory(slot.memory_mb)
    runs = [LocalExecution(f"ex-{i}", slot, [PY, "-c", HOLD.format(mb=mb)], working_dir=str(tmp_path),
                           sample_interval_s=0.1, timeout_s=60, vm_memory=memory)
            for i, mb in enumerate((400, 700))]
    try:
        for r in runs:
            r.start()
        small, large = runs
        # 1.1 GB of a 1 GB VM: the larger goes, as a real VM's OOM killer would choose.
        x = large.wait(30)
        assert x is not None and (x.exit_code, x.reason) == (-9, MEMORY_LIMIT_EXCEEDED)
        assert small.running
        # It was not the one over the line, so no sample claims it reached the VM's memory by itself.
        assert max(s.memory_mb for s in large.samples) < 1024
        eventually(lambda: memory.total_mb() > 390, what="the survivor's use reported after the kill")
        (tmp_path / "release").touch()
        y = small.wait(30)
        assert y is not None and (y.exit_code, y.reason) == (0, "")
        assert 390 < y.peak_memory_mb < 1024
        assert memory.total_mb() == 0                       # both left the VM's account
    finally:
        for r in runs:
            r.kill()
            r.wait(10)


def test_executions_of_different_vms_do_not_share_memory(tmp_path: Path) -> None:
    alloc = CpuAllocator()
    runs = [LocalExecution(f"ex-{i}", alloc.slot(f"vm-{i}", 1, 1024), [PY, "-c", HOLD.format(mb=700)],
                           working_dir=str(tmp_path), sample_interval_s=0.1, timeout_s=60)
            for i in range(2)]
    try:
        for r in runs:
            r.start()
        # Both hold 700 MB, each in its own 1 GB VM, and both are sampled there.
        eventually(lambda: all(r.samples and r.samples[-1].memory_mb > 690 for r in runs), timeout=30,
                   what="both runs sampled holding 700 MB")
        (tmp_path / "release").touch()
        for r in runs:
            x = r.wait(30)
            assert x is not None and (x.exit_code, x.reason) == (0, "")
    finally:
        for r in runs:
            r.kill()
            r.wait(10)


def test_vm_memory_accounting() -> None:
    memory = VmMemory(100)
    a, b, c = object(), object(), object()
    assert memory.report(a, 40) is None  # type: ignore[arg-type]
    assert memory.report(b, 50) is None  # type: ignore[arg-type]
    assert memory.report(c, 30) == (b, 120)  # type: ignore[arg-type]  # the largest, not the last
    assert memory.report(b, 60) is None  # type: ignore[arg-type]  # a dying run's last word condemns nobody
    assert memory.total_mb() == 70
    memory.leave(b)  # type: ignore[arg-type]  # reaped: out of the account, dying or not
    assert memory.report(b, 10) is None and memory.total_mb() == 80  # type: ignore[arg-type]


def test_pss_is_read_less_often_when_reading_it_costs_more_than_its_budget(tmp_path: Path, monkeypatch) -> None:
    from irm_compute import sandbox

    reads: list[int] = []
    real = sandbox._rss_pss_bytes

    def counted(p):  # noqa: ANN001, ANN202
        reads.append(p.pid)
        return real(p)
    monkeypatch.setattr(sandbox, "_rss_pss_bytes", counted)
    monkeypatch.setattr(sandbox, "PSS_BUDGET", 1e-9)     # every read "costs" far more than its budget
    events, x = run(tmp_path, 1024, [PY, "-c", "import time; time.sleep(1.5)"], interval=0.05)
    samples = [e for e in events if isinstance(e, Sample)]
    assert x.exit_code == 0 and len(samples) >= 10
    assert len(reads) == 1                               # the first sample's; the rest scale RSS by its ratio
    assert all(s.memory_mb > 0 for s in samples)
