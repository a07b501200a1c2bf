"""The FPGA overhead bench's process CPU time (bench.fpga_overhead._process_cpu_s) keeps the time of threads that
ended: a thread ending between a block's two readings must not take its CPU time out of the block (its difference
went negative when the reading summed the threads alive at the time)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import pytest

from bench.fpga_overhead import _process_cpu_s
from tests.conftest import eventually

BURN_S = 0.2        # CPU seconds the short-lived thread spends

# Says "ready", then on a line from stdin runs a thread that burns BURN_S of CPU and ends, waits until the
# thread is gone from /proc, prints the thread's CPU time, and waits for stdin to close.
CHILD = f"""
import os, sys, threading, time
burned = []
def burn():
    t0 = time.thread_time()
    while time.thread_time() - t0 < {BURN_S}:
        pass
    burned.append(time.thread_time())
print("ready", flush=True)
sys.stdin.readline()
th = threading.Thread(target=burn)
th.start()
th.join()
while len(os.listdir("/proc/self/task")) > 1:   # the thread's kernel task has ended too
    time.sleep(0.001)
print(burned[0], flush=True)
sys.stdin.read()
"""


def _burn_in_a_thread_that_ends() -> float:
    """Runs a thread that burns BURN_S of CPU and ends; its CPU time, once its kernel task is gone."""
    burned: list[float] = []
    tid: list[int] = []

    def burn() -> None:
        tid.append(threading.get_native_id())
        t0 = time.thread_time()
        while time.thread_time() - t0 < BURN_S:
            pass
        burned.append(time.thread_time())

    th = threading.Thread(target=burn)
    th.start()
    th.join()
    eventually(lambda: str(tid[0]) not in os.listdir("/proc/self/task"), what="the thread's task gone")
    return burned[0]


def test_the_cpu_time_of_a_thread_that_ended_still_counts_in_this_process() -> None:
    before = _process_cpu_s(os.getpid())
    burned = _burn_in_a_thread_that_ends()
    after = _process_cpu_s(os.getpid())
    assert before is not None and after is not None
    assert after - before >= burned >= BURN_S


def test_the_cpu_time_of_a_thread_that_ended_still_counts_in_another_process() -> None:
    child = subprocess.Popen([sys.executable, "-c", CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline() == "ready\n"
        before = _process_cpu_s(child.pid)
        child.stdin.write("go\n")
        child.stdin.flush()
        burned = float(child.stdout.readline())
        after = _process_cpu_s(child.pid)           # the child lives on (reading stdin); its thread has ended
        assert before is not None and after is not None
        assert after - before >= burned >= BURN_S
    finally:
        child.kill()
        child.wait()
    assert _process_cpu_s(child.pid) is None        # a process that is gone has no CPU time to read


def test_without_the_process_clock_proc_stat_counts_it_too_to_a_clock_tick(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_clock(clock_id: int) -> float:
        raise OSError(22, "Invalid argument")       # as where a process's CPU clock cannot be read
    monkeypatch.setattr(time, "clock_gettime", no_clock)
    before = _process_cpu_s(os.getpid())
    burned = _burn_in_a_thread_that_ends()
    after = _process_cpu_s(os.getpid())
    assert before is not None and after is not None
    # utime and stime are each whole clock ticks, rounded down: the difference may lose up to two.
    assert after - before >= burned - 2 / os.sysconf("SC_CLK_TCK")
