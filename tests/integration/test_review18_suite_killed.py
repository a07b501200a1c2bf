"""A suite after kill -9, for real: of `harness up` alone (its services serve on, nothing restarts them: `harness
status` fails and says what to do, `harness down` stops them, naming each once), and of the whole suite (its
suite.json is stale: the commands say no suite runs, even with another service now on its old ports)."""

from __future__ import annotations

import json
import os
import signal
import subprocess

from tests.conftest import eventually, start_again
from tests.integration.test_suite_review14 import HARNESS, _alive, _recorded, _up


def _harness(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([*HARNESS, *argv], capture_output=True, text=True, timeout=120)


def _flat(text: str) -> str:
    return " ".join(text.split())


def test_a_suite_whose_harness_up_was_killed_fails_status_and_down_names_each_service_once(tmp_path):
    with _up(tmp_path) as (proc, state, log):
        pids = _recorded(state)
        proc.kill()
        proc.wait()
        assert all(_alive(pid) for pid in pids.values())        # in sessions of their own: still serving

        unsupervised = (f"the suite's `harness up` (pid {proc.pid}) has exited: its services run unsupervised, and "
                        f"nothing restarts one that exits; run `harness down --state-dir {state}`, then `harness up`")
        status = _harness("status", "--state-dir", str(state))
        assert status.returncode == 1, status.stderr
        assert [line.split()[2] for line in status.stdout.splitlines()] == ["SERVING"] * len(pids)
        assert f"harness status: {unsupervised}" in _flat(status.stderr)
        report = json.loads(_harness("status", "--json", "--state-dir", str(state)).stdout)
        assert report["ok"] is False and report["problems"] == [unsupervised]
        assert {s["status"] for s in report["services"]} == {"SERVING"}

        down = _harness("down", "--state-dir", str(state))
        assert down.returncode == 0, down.stderr
        for name, pid in pids.items():
            assert down.stderr.count(f"(pid {pid})") == 1 and f"{name} (pid {pid})" in down.stderr, down.stderr
        assert "serve:" not in down.stderr
        assert not any(_alive(pid) for pid in pids.values())


def test_after_a_kill_of_the_whole_suite_no_suite_runs_even_with_another_service_on_its_ports(tmp_path, suite):
    with _up(tmp_path) as (proc, state, log):
        addresses = json.loads((state / "suite.json").read_text())
        pids = _recorded(state)
        proc.kill()
        for pid in pids.values():
            os.kill(pid, signal.SIGKILL)
        proc.wait()
        eventually(lambda: not any(_alive(pid) for pid in pids.values()), what="the services gone")
        # Another CRS (another suite's, say) now serves where this suite's did.
        start_again(lambda: suite.start("crs", address=addresses["crs"], state_dir=str(tmp_path / "other")),
                    "another CRS on the killed suite's CRS port")

        none = f"no suite runs from {state}: start one with `harness up`"
        discover = _harness("discover", "--state-dir", str(state))
        assert discover.returncode == 1 and none in _flat(discover.stderr), discover.stdout + discover.stderr
        status = _harness("status", "--state-dir", str(state))
        assert status.returncode == 1 and none in _flat(status.stderr), status.stderr
        assert status.stdout == ""
        assert not (state / "suite.json").exists() and not (state / "processes.json").exists()
        assert _harness("down", "--state-dir", str(state)).stderr.strip() == f"no suite runs from {state}"
