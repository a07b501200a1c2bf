"""The process ledger a SIGKILLed agent leaves its successor (irm_compute.processes.leftovers): what it lists is
found by pid and start time, the rest of a listed session or group by that, and nothing else."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import psutil

from irm_compute.processes import _read_stat, _ticks_now, leftovers

PY = sys.executable
SLEEP = [PY, "-c", "import time; time.sleep(60)"]


def _ledger(path: Path, *procs: tuple[int, int, int, int], seen_at: int | None = None) -> Path:
    path.write_text(json.dumps({"seen_at": _ticks_now() if seen_at is None else seen_at, "processes": procs}))
    return path


def _entry(pid: int) -> tuple[int, int, int, int]:
    stat = _read_stat(pid)
    assert stat is not None
    return pid, stat[4], stat[2], stat[3]


def test_the_ledger_finds_its_processes_and_the_rest_of_their_sessions_and_nothing_else(tmp_path: Path) -> None:
    # A command leading its own session, and a child of it the ledger never listed (forked after the last scan).
    leader = subprocess.Popen([PY, "-c", "import subprocess, sys, time; "
                               f"p = subprocess.Popen({SLEEP!r}); print(p.pid, flush=True); time.sleep(60)"],
                              stdout=subprocess.PIPE, start_new_session=True)
    stranger = subprocess.Popen(SLEEP, start_new_session=True)      # another session: never ours
    child = 0
    try:
        child = int(leader.stdout.readline())                         # type: ignore[union-attr]
        entry = _entry(leader.pid)
        found = {p.pid for p in leftovers(_ledger(tmp_path / "a.json", entry))}
        assert found == {leader.pid, child}
        # A listed pid now naming another process (another start time) is not that process, and its session is
        # not the listed one when its leader started after the ledger was written.
        _, start, pgid, sid = _entry(stranger.pid)
        stale = (stranger.pid, start - 1, pgid, sid)
        assert leftovers(_ledger(tmp_path / "b.json", stale, seen_at=start - 1)) == []
        # The same entry written after the stranger started: its session was the listed one.
        assert {p.pid for p in leftovers(_ledger(tmp_path / "c.json", stale, seen_at=start))} == {stranger.pid}
        # No ledger, or one that is not JSON: nothing (an agent's first start; a torn write).
        assert leftovers(tmp_path / "none.json") == []
        (tmp_path / "torn.json").write_text('{"seen_at": 1, "proc')
        assert leftovers(tmp_path / "torn.json") == []
        # Never this process, its group or its session.
        me = psutil.Process()
        assert leftovers(_ledger(tmp_path / "me.json", _entry(me.pid))) == []
    finally:
        if child:
            try:
                psutil.Process(child).kill()
            except psutil.Error:
                pass
        for p in (leader, stranger):
            p.kill()
            p.wait()
