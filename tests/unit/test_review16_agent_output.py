"""Output nobody has read yet is bounded by bytes, not by the number of writes that made it, and is dropped when
its consumer leaves (a cancelled Execute stream): a finished run stays in the history for long."""

from __future__ import annotations

import sys
from pathlib import Path

from irm_compute.sandbox import CpuAllocator, Exited, LocalExecution, Output

PY = sys.executable

# 200 KB in 2-byte writes, pausing now and then so the agent reads them as they come, a few bytes at a time.
TINY_WRITES = """
import os, time
for i in range(100_000):
    os.write(1, b"x\\n")
    if i % 2000 == 0:
        time.sleep(0.001)
"""


def run_unread(tmp_path: Path, code: str) -> LocalExecution:
    """Run `python -c code` to its end with nobody reading its events."""
    ex = LocalExecution("ex", CpuAllocator().slot("vm", 1, 1024), [PY, "-c", code], working_dir=str(tmp_path),
                        sample_interval_s=0.5, timeout_s=60)
    ex.start()
    x = ex.wait(60)
    assert x is not None and x.exit_code == 0, x
    return ex


def test_unread_output_merges_into_a_few_events(tmp_path: Path) -> None:
    ex = run_unread(tmp_path, TINY_WRITES)
    events = list(ex.events())
    outputs = [e for e in events if isinstance(e, Output)]
    assert b"".join(e.data for e in outputs) == b"x\n" * 100_000       # all of it, in order
    # 200 KB in events of at most 64 KB, not one event per write (tens of thousands of objects).
    assert len(outputs) <= 8, len(outputs)
    assert isinstance(events[-1], Exited)


def test_a_consumer_that_leaves_leaves_nothing_queued(tmp_path: Path) -> None:
    ex = run_unread(tmp_path, "import sys; sys.stdout.buffer.write(b'x' * (1 << 20))")
    ex.detach()
    # What waited for it (1 MB) is gone: nothing more comes out, and nothing is held for the run's life.
    assert list(ex.events()) == []
