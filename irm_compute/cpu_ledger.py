"""The CPU seconds a run's process tree used, its members coming and going (irm_compute.sandbox samples it).

Each process's CPU counts as its own time plus that of the children it waited for (/proc/<pid>/stat's utime,
stime, cutime and cstime). Summing that over the processes alive now drops a process once it is reaped by
something outside the run -- the agent, a child subreaper, reaps a daemon that double-forked, or a child whose
parent exited without waiting for it -- and a zombie, whose time nobody of the run has collected yet. So the
ledger keeps each process's last reading: one gone since is counted on its own, unless a process of the run that
still lives reaped it (its time is in that one's children times now: counted once), followed up the parents it
had, for a parent reaped in the same interval by its own.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class CpuReading:
    own: float          # its own CPU seconds (utime + stime)
    children: float     # those of the children it waited for (cutime + cstime)
    ppid: int           # its parent when read
    zombie: bool        # exited, not yet reaped: it reaps no one from now on
    start: int = 0      # when it started (clock ticks since boot): a parent is older than its child

    @property
    def seconds(self) -> float:
        return self.own + self.children


class CpuLedger:
    """`update` with the tree's readings at each sample; `total` is the CPU seconds the tree used so far."""

    def __init__(self) -> None:
        self._last: dict[Hashable, tuple[int, CpuReading]] = {}    # process -> (pid, its last reading)
        self._gone = 0.0        # processes reaped outside the run: their last readings

    @property
    def total(self) -> float:
        return self._gone + sum(r.seconds for _, r in self._last.values())

    @property
    def gone(self) -> float:
        """The CPU seconds of the processes reaped outside the run: in no live process's children times."""
        return self._gone

    def update(self, readings: Mapping[Hashable, tuple[int, CpuReading]]) -> float:
        """The tree now: process (a key naming it for its life, e.g. pid and start time) -> (pid, reading).
        Returns `total`.

        A process gone since the last readings was reaped by its parent if that one lives in the tree now, or
        by its parent's parent if the parent is gone too (a shell that waited for its command and exited), and
        so on -- or by the agent, which adopts a process whose parent exits first. Which one is told by the
        reaper's children times: they grew by at least the last readings of what it reaped (a process's time
        only grows), nearest descendants first; what does not fit there was reaped outside."""
        # Per process of the tree now, how much its children times grew since it was last read: what it reaped
        # meanwhile. A zombie too: it may have reaped before it exited, and its reading (counted) holds that.
        room: dict[int, float] = {}
        starts: dict[int, int] = {}
        for key, (pid, r) in readings.items():
            before = self._last.get(key)
            room[pid] = r.children - (before[1].children if before is not None else 0.0)
            starts[pid] = r.start
        gone = [last for key, last in self._last.items() if key not in readings]
        gone_by_pid = {pid: r for pid, r in gone}
        candidates = []
        for pid, reading in gone:
            reaper, depth = _reaper(pid, reading, gone_by_pid, starts)
            if reaper is None:
                self._gone += reading.seconds
            else:
                candidates.append((reaper, depth, pid, reading))
        # Nearest descendants first, and of those the larger first: the reaper's growth also holds processes
        # never read (born and reaped between two readings), so what does not fit is the smaller share.
        for reaper, _, _, reading in sorted(candidates, key=lambda c: (c[0], c[1], -c[3].seconds, c[2])):
            if reading.seconds <= room[reaper] + 1e-9:
                room[reaper] -= reading.seconds
            else:
                self._gone += reading.seconds
        self._last = dict(readings)
        return self.total


def _reaper(pid: int, reading: CpuReading, gone: Mapping[int, CpuReading],
            live: Mapping[int, int]) -> tuple[int | None, int]:
    """The process of the tree now (`live`: pid -> start) that may have reaped a process gone since the last
    readings (its parent, or the nearest ancestor still there, through parents gone too), and how many
    generations up; None if the chain leaves the tree (the agent reaped it). A pid now naming a process younger
    than the one it stood for (pid reuse) is not that parent."""
    seen = {pid}
    parent, depth = reading.ppid, 1
    while parent not in seen:
        if parent in live and live[parent] <= reading.start:
            return parent, depth
        if parent not in gone:
            return None, depth
        seen.add(parent)
        parent, depth = gone[parent].ppid, depth + 1
    return None, depth
