"""Which CRS process a pending reservation is being placed by, and whether that process is provably gone.

A starting CRS may overlap the old process still winding down, and several CRS processes may share one
database: a pending row is another process's Reserve in progress until that process is shown to be gone.
Each pending row names its owner: the machine (host name, boot id and pid namespace: where a pid means one
process), the pid, and the process's start time (which tells a pid reused by another process apart). An owner on
this machine whose pid has exited, or now belongs to a process started at another time, is gone: its rows are
recovered at once. Any other owner (another machine, a row from before owners were recorded, a start time that
cannot be read) may still be placing its rows: they wait out the pending horizon.

The idea is the Application Manager's (application_manager/owners.py), less its heartbeats: a pending row lives
for seconds, and the horizon already covers owners that cannot be checked. Copied rather than imported: the CRS
does not depend on the AM.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from dataclasses import dataclass

_SEP = "|"


@dataclass(frozen=True)
class Owner:
    machine: str
    pid: int
    started: str = ""       # the process's start time (clock ticks after boot); "" where it cannot be read

    def __str__(self) -> str:
        return f"{self.machine}{_SEP}{self.pid}{_SEP}{self.started}"

    @classmethod
    def parse(cls, text: str | None) -> Owner | None:
        parts = (text or "").split(_SEP)
        if len(parts) != 3 or not parts[0] or not parts[1].isdigit() or int(parts[1]) <= 0:
            return None
        return cls(parts[0], int(parts[1]), parts[2])

    def describe(self) -> str:
        return f"pid {self.pid} on {self.machine.split('/', 1)[0]}"


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return ""


def _machine() -> str:
    """Where a pid names one process: the host, its boot (pids restart after a reboot), the pid namespace (two
    containers sharing a host name, `network_mode: host`, do not share pids)."""
    try:
        ns = os.readlink("/proc/self/ns/pid").strip("pid:[]")
    except OSError:
        ns = ""
    boot = _read("/proc/sys/kernel/random/boot_id")
    if not ns or not boot:
        # Without both, two processes with one pid on two machines or containers would look alike: "" makes the
        # owner one that cannot be checked (its rows wait out the pending horizon).
        return ""
    return "/".join((socket.gethostname()[:128], boot, ns))


def started_of(pid: int) -> str | None:
    """When process `pid` started ("" if it runs but that cannot be read), or None if there is no such process
    (or only its zombie)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        pass                            # someone else's process: it exists
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return ""                       # no /proc (not Linux), or it exited just now: taken as running
    # After the command's name (which may hold spaces and parentheses): state, ..., starttime (the 20th).
    fields = stat.rpartition(b")")[2].split()
    if fields[:1] in ([b"Z"], [b"X"]):
        return None                     # killed, not yet reaped: it places nothing any more
    return fields[19].decode() if len(fields) > 19 else ""


def this_process() -> Owner:
    pid = os.getpid()
    return Owner(_machine(), pid, started_of(pid) or "")


def gone(owner: str | None, me: Owner, probe: Callable[[int], str | None] = started_of) -> str | None:
    """Why the process that owns a pending row is certainly not placing it any more, or None if it may be."""
    o = Owner.parse(owner)
    if o is None or o.machine != me.machine or o == me:
        return None                     # unknown, elsewhere (its pid means nothing here), or this process
    if o.pid == me.pid:
        return f"the CRS process that placed it ({o.describe()}) was restarted"
    now = probe(o.pid)
    if now is None:
        return f"the CRS process that placed it ({o.describe()}) is gone"
    if o.started and now and now != o.started:
        return f"the CRS process that placed it ({o.describe()}) is gone (its pid is another process's now)"
    return None
