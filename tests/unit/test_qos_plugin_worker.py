"""A plug-in scheduling algorithm in a worker process of its own (irm_fpga.qos.plugin_worker): answers within a time
limit, and a plug-in that loops, crashes, exits or raises is a PolicyError, never a stuck or dead caller.

The plug-ins below are loaded by name in the worker (this module is imported there).
"""

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from examples.qos.longest_first import longest_first
from irm_fpga.qos.hydrogen import HJob, LearnedCostModel
from irm_fpga.qos.plugin_worker import PluginRunner
from irm_fpga.qos.plugins import PolicyError
from tests.conftest import eventually

HERE = "tests.unit.test_qos_plugin_worker"
QUEUE = [HJob("short", 0.0, 0.5, 1, 2), HJob("long", 0.1, 4.0, 2, 4), HJob("mid", 0.2, 1.0, 1, 1)]
ROOT = Path(__file__).resolve().parents[2]


def first_on_min(queue, available):
    return [(queue[0].job_id, queue[0].min_devices)] if queue and queue[0].min_devices <= available else []


def loops_on_three(queue, available, window, cost, *, now):
    """Loops for good when 3 devices are free (a bug only some inputs reach)."""
    while available == 3:
        pass
    return first_on_min(queue, available)


def says_so_and_loops(queue, available, window, cost, *, now):
    print("looping", flush=True)       # on the worker's stdout, inherited from the process that started it
    while True:
        pass


def loops_with_two_queued(queue, available, window, cost, *, now):
    """Loops for good while two jobs are queued (the live job manager's test)."""
    while len(queue) >= 2:
        pass
    return first_on_min(queue, available)


def crashes_on_three(queue, available, window, cost, *, now):
    if available == 3:
        os._exit(7)        # as a crash in a C extension would end the process
    return first_on_min(queue, available)


def raises(queue, available, window, cost, *, now):
    raise RuntimeError("boom in the plug-in")


def exits(queue, available, window, cost, *, now):
    sys.exit(2)


def unpicklable(queue, available, window, cost, *, now):
    return lambda: None


@pytest.fixture
def runner():
    made = []

    def make(name: str, timeout_s: float = 5.0) -> PluginRunner:
        made.append(PluginRunner(name, timeout_s=timeout_s))
        return made[-1]

    yield make
    for r in made:
        r.close()


def gone(pid: int) -> bool:
    """The process has ended (a zombie counts: it runs nothing)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except FileNotFoundError:
        return True


def test_a_plug_in_in_its_worker_decides_as_it_does_here_and_keeps_its_process(runner):
    r = runner("examples.qos.longest_first:longest_first")
    cost = LearnedCostModel()
    for n, took in ((1, 4.0), (2, 2.2)):            # a learned model travels to the worker with its fit
        cost.observe(QUEUE[1], n, took)
    got = r(QUEUE, 3, 30, cost, now=0.3)
    assert got == longest_first(QUEUE, 3, 30, cost, now=0.3) == [("long", 2), ("mid", 1)]
    pid = r.pid
    assert pid is not None and pid != os.getpid()
    assert r(QUEUE, 1, 30, cost, now=0.4) == [("mid", 1)] and r.pid == pid


def test_a_plug_in_that_loops_is_answered_within_its_limit_and_its_process_replaced(runner):
    r = runner(f"{HERE}:loops_on_three", timeout_s=0.5)
    r.start()
    looping = r.pid
    t0 = time.monotonic()
    with pytest.raises(PolicyError, match=r"did not answer within 0.5 s .*jobs_plugin_timeout_s"):
        r(QUEUE, 3, 30, now=0.0)
    assert time.monotonic() - t0 < 5.0
    assert gone(looping)                              # killed, not left spinning beside the manager
    # Its replacement starts in the background: a decision meanwhile is refused at once, not held up for a
    # start-up (it would hold the job manager's lock that long on every round).
    if r.pid is None:
        t0 = time.monotonic()
        with pytest.raises(PolicyError, match="starting again after a failure"):
            r(QUEUE, 2, 30, now=0.1)
        assert time.monotonic() - t0 < 0.5
    fresh = eventually(lambda: r.pid, what="the replacement worker")
    assert fresh != looping
    assert r(QUEUE, 2, 30, now=0.2) == [("short", 1)]  # the fresh process answers the next decision
    assert r.pid == fresh


def test_a_plug_in_that_crashes_its_process_is_a_policy_error_and_the_next_call_works(runner):
    r = runner(f"{HERE}:crashes_on_three")
    with pytest.raises(PolicyError, match="worker process ended .exit code 7."):
        r(QUEUE, 3, 30, now=0.0)
    eventually(lambda: r.pid, what="the replacement worker")
    assert r(QUEUE, 2, 30, now=0.1) == [("short", 1)]


@pytest.mark.parametrize(("name", "match"), [
    ("raises", "failed: RuntimeError: boom in the plug-in"),
    ("exits", r"called exit\(2\)"),
    ("unpicklable", "its answer cannot be sent back"),
])
def test_a_plug_in_that_raises_or_exits_is_a_policy_error_in_a_process_that_goes_on(runner, name, match):
    r = runner(f"{HERE}:{name}")
    r.start()
    pid = r.pid
    for _ in range(2):
        with pytest.raises(PolicyError, match=match):
            r(QUEUE, 3, 30, now=0.0)
    assert r.pid == pid


def test_a_plug_in_that_cannot_load_in_its_worker_is_a_policy_error(runner):
    with pytest.raises(PolicyError, match="cannot be loaded in its worker process: .*no.such.module"):
        runner("no.such.module:f").start()


def test_the_worker_of_a_process_that_died_ends_even_while_its_plug_in_loops():
    # A manager killed by SIGKILL closes nothing: its worker, looping in the plug-in, must still end.
    script = textwrap.dedent(f"""
        import os, sys, threading
        from irm_fpga.qos.hydrogen import HJob
        from irm_fpga.qos.plugin_worker import PluginRunner
        r = PluginRunner("{HERE}:says_so_and_loops", timeout_s=600.0)
        r.start()
        print(r.pid, flush=True)
        threading.Thread(target=r, args=([HJob("a", 0.0, 1.0, 1, 1)], 3, 30), kwargs={{"now": 0.0}},
                         daemon=True).start()
        sys.stdin.readline()
        os._exit(9)
    """)
    p = subprocess.Popen([sys.executable, "-c", script], cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         text=True)
    try:
        worker = int(p.stdout.readline())
        assert p.stdout.readline() == "looping\n"      # the worker is in the plug-in's loop
        assert not gone(worker)
        p.stdin.write("go\n")
        p.stdin.flush()
        assert p.wait(timeout=30) == 9
        deadline = time.monotonic() + 15.0
        while not gone(worker) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert gone(worker)
    finally:
        p.kill()
        p.wait()
