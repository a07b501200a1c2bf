"""`harness up` under signals: a second Ctrl-C while it stops, or SIGKILL, leaves no service behind for good.

`harness up` runs as a real process (`--auto-ports`, its state under tmp_path); the services it starts are
found through the pids it records and by their command lines, which name the state directory.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from services import pidlock, suite
from tests.conftest import eventually

HARNESS = [sys.executable, "-m", "services.cli"]


def _alive(pid: int) -> bool:
    return suite._pid_alive(pid)


def _ours(state_dir: Path) -> list[int]:
    """Live processes whose command line names `state_dir` (the suite's services, `harness up` itself)."""
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            argv = suite._cmdline(int(entry.name))
            if argv and any(str(state_dir) in a for a in argv) and _alive(int(entry.name)):
                out.append(int(entry.name))
    return out


def _lock_free(state_dir: Path) -> bool:
    try:
        fd = pidlock.take(state_dir / ".lock")
    except pidlock.Held:
        return False
    os.close(fd)
    return True


def _recorded(state_dir: Path) -> dict[str, int]:
    try:
        return {k: v["pid"] for k, v in json.loads((state_dir / "processes.json").read_text()).items()}
    except (OSError, ValueError):
        return {}


@pytest.fixture
def up(tmp_path: Path):  # type: ignore[no-untyped-def]
    """Start `harness up` on a state directory under tmp_path; yields (process, state_dir, stderr file)."""
    state_dir = tmp_path / "state"
    started: list[subprocess.Popen] = []
    log = tmp_path / "up.log"

    def start() -> subprocess.Popen:
        with open(log, "ab") as err:
            p = subprocess.Popen([*HARNESS, "up", "--auto-ports", "--state-dir", str(state_dir)],
                                 stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err)
        started.append(p)
        return p

    yield start, state_dir, log
    for p in started:
        if p.poll() is None:
            p.kill()
            p.wait()
    for pid in _ours(state_dir):                       # whatever a failing test left
        os.kill(pid, signal.SIGKILL)


def _wait_started(log: Path, state_dir: Path, count: int) -> dict[str, int]:
    """Once `count` services have started (their 'started' lines): name -> pid."""
    eventually(lambda: log.read_text().count("started ") >= count, timeout=60, what=f"{count} services started")
    return eventually(lambda: len(_recorded(state_dir)) >= count and _recorded(state_dir),
                      what="the recorded pids")


@pytest.mark.parametrize("when", ["starting", "up"])
def test_second_signal_while_stopping_leaves_nothing_running(up, when: str) -> None:  # type: ignore[no-untyped-def]
    start, state_dir, log = up
    p = start()
    if when == "starting":
        pids = _wait_started(log, state_dir, 3)         # crs, compute, agent: stopped last-first
    else:
        # The whole suite runs, and `harness up` waits in its supervision loop.
        eventually(lambda: "Harness is up" in log.read_text(), timeout=90, what="Harness is up")
        pids = _recorded(state_dir)
        assert len(pids) == 6 and all(_alive(pid) for pid in pids.values())
    p.send_signal(signal.SIGINT)
    # Stopping has begun once the last started service is gone; the others are still to stop.
    eventually(lambda: not all(_alive(pid) for pid in pids.values()), what="the first service stopped")
    p.send_signal(signal.SIGINT)
    p.send_signal(signal.SIGTERM)
    status = p.wait(timeout=40)
    assert [name for name, pid in pids.items() if _alive(pid)] == []
    assert _ours(state_dir) == []
    assert _lock_free(state_dir)
    assert status == (130 if when == "starting" else 0)    # once up, Ctrl-C is the way to stop it: no error
    assert "Traceback" not in log.read_text()


def test_down_stops_the_services_of_a_killed_up(up) -> None:  # type: ignore[no-untyped-def]
    start, state_dir, log = up
    p = start()
    pids = _wait_started(log, state_dir, 2)
    p.kill()
    p.wait()
    assert all(_alive(pid) for pid in pids.values())    # in sessions of their own: SIGKILL does not reach them

    again = subprocess.run([*HARNESS, "up", "--auto-ports", "--state-dir", str(state_dir)],
                           capture_output=True, text=True, timeout=30)
    assert again.returncode == 1
    assert f"harness down --state-dir {state_dir}" in again.stderr
    assert f"crs pid {pids['crs']}" in again.stderr       # the services that still run, not just a dead pid

    down = subprocess.run([*HARNESS, "down", "--state-dir", str(state_dir)], capture_output=True, text=True,
                          timeout=60)
    assert down.returncode == 0, down.stderr
    assert [name for name, pid in pids.items() if _alive(pid)] == []
    assert _lock_free(state_dir)
    assert "no suite runs" in subprocess.run([*HARNESS, "down", "--state-dir", str(state_dir)],
                                             capture_output=True, text=True, timeout=30).stderr
