"""The process ledger a SIGKILLed agent leaves its successor (irm_compute.processes.leftovers): what it lists is
found by pid and start time, the rest of a listed session or group by that while it is still the listed one, and
nothing else: not a later process given a listed id, not anything from a ledger of another boot."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import psutil

from irm_compute.processes import _boot_id, _read_stat, _ticks_now, leftovers

PY = sys.executable
SLEEP = [PY, "-c", "import time; time.sleep(60)"]


def _ledger(path: Path, *procs: tuple[int, int, int, int, int], boot_id: str | None = None) -> Path:
    path.write_text(json.dumps({"boot_id": _boot_id() if boot_id is None else boot_id, "processes": procs}))
    return path


def _entry(pid: int, seen: int | None = None) -> tuple[int, int, int, int, int]:
    stat = _read_stat(pid)
    assert stat is not None
    return pid, stat[4], stat[2], stat[3], _ticks_now() if seen is None else seen


def test_the_ledger_finds_its_processes_and_the_rest_of_their_sessions_and_nothing_else(tmp_path: Path) -> None:
    # A command leading its own session, and a child of it the ledger never listed (forked after the last scan).
    leader = subprocess.Popen([PY, "-c", "import subprocess, sys, time; "
                               f"p = subprocess.Popen({SLEEP!r}); print(p.pid, flush=True); time.sleep(60)"],
                              stdout=subprocess.PIPE, start_new_session=True)
    stranger = subprocess.Popen(SLEEP, start_new_session=True)      # another session: never ours
    child = 0
    try:
        child = int(leader.stdout.readline())                         # type: ignore[union-attr]
        found = {p.pid for p in leftovers(_ledger(tmp_path / "a.json", _entry(leader.pid)))}
        assert found == {leader.pid, child}
        # A listed pid now naming another process (another start time) is not that process, and its session is
        # not the listed one when its leader started after the listed member was last seen in it.
        pid, start, pgid, sid, _ = _entry(stranger.pid)
        assert leftovers(_ledger(tmp_path / "b.json", (pid, start - 1, pgid, sid, start - 1))) == []
        # The same entry seen once the stranger had started: its session was the listed one.
        assert {p.pid for p in leftovers(_ledger(tmp_path / "c.json", (pid, start - 1, pgid, sid, start)))} == \
            {stranger.pid}
        # A ledger of another boot (an agent that died with the machine) lists nothing alive now: pids, groups and
        # start times began again, and a boot-time daemon must not be taken for a listed session.
        assert leftovers(_ledger(tmp_path / "d.json", _entry(leader.pid), boot_id="another-boot")) == []
        # No ledger, one that is not JSON, or one of the earlier format: nothing (a first start; a torn write).
        assert leftovers(tmp_path / "none.json") == []
        (tmp_path / "torn.json").write_text('{"boot_id": "x", "proc')
        assert leftovers(tmp_path / "torn.json") == []
        assert leftovers(_ledger(tmp_path / "old.json", _entry(leader.pid)[:4])) == []    # type: ignore[arg-type]
        # Never this process, its group or its session.
        assert leftovers(_ledger(tmp_path / "me.json", _entry(psutil.Process().pid))) == []
    finally:
        if child:
            try:
                psutil.Process(child).kill()
            except psutil.Error:
                pass
        for p in (leader, stranger):
            p.kill()
            p.wait()
