"""A run's memory verdict and the samples it keeps.

* ru_maxrss is the largest RSS of any one process of the tree: for a tree of several, the root's shared excess
  does not turn it into PSS, so a run that finished well is not called over its limit on it;
* the samples an execution keeps, and a VM's series GetVmMetrics answers with, are bounded, the peak kept.

Real processes (at most ~170 MB resident, a file mapped by others), except where samples are made up.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from irm_compute import sandbox
from irm_compute.agent import Agent, AgentConfig, _Run
from irm_compute.sandbox import CpuAllocator, Exited, LocalExecution, Sample
from tests.unit.test_agent_memory import MAPS
from tests.unit.test_review16_agent_start import _Compute

PY = sys.executable


def test_a_tree_whose_child_maps_a_file_others_map_is_not_over_its_limit_by_the_childs_rss(tmp_path: Path) -> None:
    data = tmp_path / "data.bin"
    data.write_bytes(b"\x01" * (160 << 20))
    # Two processes outside the run map the same 160 MB: the child's share is about a third, its RSS 160 MB.
    others = [subprocess.Popen([PY, "-c", MAPS, str(data), "60"], stdout=subprocess.PIPE) for _ in range(2)]
    try:
        for o in others:
            assert o.stdout is not None and o.stdout.readline().startswith(b"ok")
        slot = CpuAllocator().slot("vm", 1, 128)
        # The shell stays, so the mapping child is not the root: ru_maxrss is the child's RSS (~170 MB).
        ex = LocalExecution("ex", slot, ["/bin/sh", "-c", f"{PY} -c \"$0\" {data} 1.5; true", MAPS],
                            working_dir=str(tmp_path), sample_interval_s=0.1, timeout_s=30)
        ex.start()
        events = list(ex.events())
        x = events[-1]
        assert isinstance(x, Exited)
        samples = [e for e in events if isinstance(e, Sample)]
        assert samples and max(s.memory_mb for s in samples) < 128       # its PSS, sampled, fits
        assert (x.exit_code, x.reason) == (0, ""), x
        assert x.peak_memory_mb < 128
        # No "death at its peak" sample at the allowance for a run that did not die.
        assert max(s.memory_percent for s in samples) < 100
    finally:
        for o in others:
            o.kill()
            o.wait()


# --- bounded samples ----------------------------------------------------------------------------------------------

# Holds 150 MB for a few samples, drops it, and idles on for ~60 samples.
SPIKE_THEN_IDLE = """
import time
b = bytearray(b"\\x01") * (150 << 20)
time.sleep(0.3)
del b
time.sleep(3.0)
"""


def test_an_execution_keeps_a_bounded_number_of_samples_with_its_peak(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sandbox, "MAX_SAMPLES", 16, raising=False)
    ex = LocalExecution("ex", CpuAllocator().slot("vm", 1, 1024), [PY, "-c", SPIKE_THEN_IDLE],
                        working_dir=str(tmp_path), sample_interval_s=0.05, timeout_s=30)
    ex.start()
    streamed = [e for e in ex.events() if isinstance(e, Sample)]
    kept = ex.samples
    assert len(streamed) > 32                       # the stream has every one of them...
    assert 8 <= len(kept) <= 16                     # ...the execution keeps a bounded series
    assert max(s.memory_mb for s in kept) == max(s.memory_mb for s in streamed) > 140   # its peak among them
    assert [s.time for s in kept] == sorted(s.time for s in kept)
    assert kept[-8:] == streamed[-8:]               # the newest at full resolution


def test_merging_keeps_the_peak_memory_and_the_mean_cpu() -> None:
    samples: list[Sample] = []
    for i in range(5000):
        sandbox.keep_sample(samples, Sample(float(i), 50.0 + (10 if i % 2 else -10), 10.0, 100.0 + (i == 7) * 900))
    assert len(samples) <= sandbox.MAX_SAMPLES
    assert max(s.memory_mb for s in samples) == 1000.0
    assert all(abs(s.cpu_percent - 50.0) < 1e-9 for s in samples[: sandbox.MAX_SAMPLES // 4])   # pairs' means
    assert samples[-1].time == 4999.0


def test_get_vm_metrics_answers_with_a_bounded_series_keeping_the_peak(tmp_path: Path) -> None:
    agent = Agent(AgentConfig(work_dir=str(tmp_path)), _Compute())  # type: ignore[arg-type]
    # Ten finished runs of a VM, each with the samples of a long run (as GetVmMetrics finds them in the history).
    for r in range(10):
        samples = [Sample(r * 10_000 + i, 20.0, 10.0, 100.0) for i in range(2000)]
        if r == 3:
            samples[1234] = Sample(samples[1234].time, 90.0, 95.0, 950.0)
        execution = SimpleNamespace(samples=samples, ended_at=r * 10_000 + 1999.5)
        agent._runs[f"ex-{r}"] = _Run(execution, "alice", "vm-1", None)  # type: ignore[arg-type]
    series = agent.vm_metrics("alice", "vm-1", since=0)
    for s in series:
        assert 0 < len(s.samples) <= 4096          # MAX_VM_METRICS_SAMPLES, as the README says
    memory = next(s for s in series if s.name == "memory_percent")
    assert max(p.value for p in memory.samples) == 95.0
