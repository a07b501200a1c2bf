"""A sample's PSS read (irm_compute.sandbox.LocalExecution._measure) when a process of the tree exits during it.

Forked workers that exit together: one gone by the time its PSS is read holds no memory any more (the survivors'
PSS grew by the pages it shared with them). Counting it at the RSS read just before made a 300 MB tree of three
copy-on-write workers look like ~500 MB. Only a process that is there but cannot be read counts at its RSS.
"""

from __future__ import annotations

import functools
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from irm_compute import processes, sandbox
from irm_compute.sandbox import CpuAllocator, LocalExecution

HOLD_MB = 64
HOLDS = f"import sys; b = bytearray(b'\\x01') * ({HOLD_MB} << 20); print('held', flush=True); sys.stdin.read()"
IDLE = "import sys; print('held', flush=True); sys.stdin.read()"
MB = 1024 * 1024


class Members:
    """A process table that says the tree is `procs` (its command first)."""

    def __init__(self, procs: list[psutil.Process]) -> None:
        self.procs = procs

    def members(self, key: object, max_age: float) -> list[psutil.Process]:
        return list(self.procs)

    def cpu_readings(self, key: object, max_age: float) -> dict:
        """As ProcessTable's, of these processes (read from /proc as it does)."""
        out = {}
        for p in self.procs:
            start = processes._read_stat(p.pid)
            reading = processes._read_cpu(p.pid, start[4]) if start is not None else None
            if reading is not None:
                out[(p.pid, start[4])] = (p.pid, reading)
        return out


@pytest.fixture
def tree(tmp_path: Path):
    """(execution, root, worker): a command and a worker of its tree holding HOLD_MB, both running."""
    popens = [subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
              for code in (IDLE, HOLDS)]
    try:
        for p in popens:
            assert p.stdout.readline() == b"held\n"
        root, worker = (psutil.Process(p.pid) for p in popens)
        ex = LocalExecution("ex", CpuAllocator().slot("vm", 1, 1024), [sys.executable], working_dir=str(tmp_path),
                            sample_interval_s=0.1, processes=Members([root, worker]))  # type: ignore[arg-type]
        ex._popen = popens[0]
        yield ex, root, popens[1]
    finally:
        for p in popens:
            p.kill()
            p.wait()


def _recording(monkeypatch: pytest.MonkeyPatch) -> tuple[dict[int, int], dict[int, int]]:
    """The RSS (memory_info) and PSS (memory_full_info) each pid was last read at."""
    rss: dict[int, int] = {}
    pss: dict[int, int] = {}
    real_info, real_full = psutil.Process.memory_info, psutil.Process.memory_full_info

    @functools.wraps(real_info)     # its oneshot() cache hooks too
    def info(self: psutil.Process):  # noqa: ANN202
        got = real_info(self)
        rss[self.pid] = got.rss
        return got

    def full(self: psutil.Process):  # noqa: ANN202
        got = real_full(self)
        pss[self.pid] = got.pss
        return got
    monkeypatch.setattr(psutil.Process, "memory_info", info)
    monkeypatch.setattr(psutil.Process, "memory_full_info", full)
    return rss, pss


@pytest.mark.parametrize("how", ["reaped", "zombie"])
def test_a_process_that_exits_during_the_pss_read_counts_nothing(tree, monkeypatch: pytest.MonkeyPatch,
                                                                 how: str) -> None:
    ex, root, worker = tree
    rss, pss = _recording(monkeypatch)
    recorded_full = psutil.Process.memory_full_info

    def exits_when_read(self: psutil.Process):  # noqa: ANN202
        if self.pid != worker.pid:
            return recorded_full(self)
        worker.kill()                       # it exits between the RSS read and its PSS read
        if how == "zombie":
            raise psutil.ZombieProcess(self.pid)
        worker.wait()                       # reaped: the real read finds no such process
        return recorded_full(self)
    monkeypatch.setattr(psutil.Process, "memory_full_info", exits_when_read)

    measured = ex._measure()
    assert measured is not None
    _, mem_mb, _ = measured
    assert rss[worker.pid] >= HOLD_MB * MB          # it held its memory when its RSS was read
    assert set(pss) == {root.pid}                   # only the survivor's PSS was read
    assert mem_mb == pytest.approx(pss[root.pid] / MB)   # the sample is the survivor's PSS: not the worker's RSS
    assert mem_mb < HOLD_MB


def test_a_process_that_is_there_but_cannot_be_read_counts_at_its_rss(tree, monkeypatch: pytest.MonkeyPatch) -> None:
    ex, root, worker = tree
    rss, pss = _recording(monkeypatch)
    real = sandbox._rss_pss_bytes

    def denied(p: psutil.Process) -> tuple[int, int]:
        if p.pid == worker.pid:
            raise psutil.AccessDenied(p.pid)   # neither its PSS nor its RSS readable now
        return real(p)
    monkeypatch.setattr(sandbox, "_rss_pss_bytes", denied)

    measured = ex._measure()
    assert measured is not None
    _, mem_mb, _ = measured
    assert mem_mb == pytest.approx((pss[root.pid] + rss[worker.pid]) / MB)
    assert mem_mb >= HOLD_MB
