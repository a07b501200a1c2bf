"""Review 25: tenants' programs outlived a suite whose agent had died and was not started again (`harness up` gave
up on it after 5 crashes, or was itself killed and `harness down` stopped the rest): only a later agent on the same
work dir killed them. Now stopping a suite, and `harness down`, kill them as that agent would."""

from __future__ import annotations

import os
import subprocess
import sys

import psutil

from irm_compute.agent import mark_prefix
from irm_compute.sandbox import EXECUTION_MARK
from services import suite


def _orphan(work) -> subprocess.Popen:  # type: ignore[no-untyped-def]
    """A program of an execution of an agent on `work` (its mark in its environment), as one left running."""
    env = {**os.environ, EXECUTION_MARK: mark_prefix(str(work)) + "e1"}
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], env=env)


def test_harness_down_kills_what_the_dead_agents_executions_left_running(tmp_path) -> None:
    state = tmp_path / "state"
    (state / "agent").mkdir(parents=True)
    (state / ".lock").touch()                       # a suite ran here; nothing holds its lock now
    left = _orphan(state / "agent")
    other = _orphan(tmp_path / "another-agent")     # another agent's: not this suite's to kill
    try:
        done = suite.down(str(state))
        assert left.wait(10) is not None and psutil.pid_exists(other.pid) and other.poll() is None
        assert done.endswith("; killed 1 process(es) tenants' programs had left running (their agent had died)"), done
        assert suite.kill_agent_leftovers(str(state)) == 0
    finally:
        for p in (left, other):
            p.kill()
            p.wait(10)


def test_a_suite_stopping_after_giving_up_on_its_agent_kills_what_it_left(tmp_path) -> None:
    state = tmp_path / "state"
    (state / "agent").mkdir(parents=True)
    procs = suite.Suite()                           # its services all stopped already (the agent crashed)
    procs.state_dir = str(state)
    left = _orphan(state / "agent")
    try:
        suite.stop(procs)
        assert left.wait(10) is not None
    finally:
        left.kill()
        left.wait(10)
