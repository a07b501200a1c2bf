"""Which Application Manager process a running session or execution belongs to, and whether it is still there.

Several AM processes may share one database (replicas behind one address, or a restart while the old
process winds down). Each running row names its owner (`host:pid:tag`, the tag telling apart two processes
that got the same pid on one host, e.g. a container's pid 1 restarted) and the owner marks its rows alive
every `heartbeat_s`. Another process takes a row as interrupted -- fails it and releases what its run
reserved -- only when its owner is gone: on the same host as soon as its pid is (a restart cleans up at
once, as one process per database always did), elsewhere once its mark is `STALE_BEATS` heartbeats old.
"""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Callable
from dataclasses import dataclass

STALE_BEATS = 3     # heartbeats an owner may miss (a slow database, a pause) before its rows are taken as gone
LEGACY = "interrupted: the service restarted"


@dataclass(frozen=True)
class Owner:
    host: str
    pid: int
    tag: str

    def __str__(self) -> str:
        return f"{self.host}:{self.pid}:{self.tag}"

    @classmethod
    def parse(cls, text: str) -> Owner | None:
        host, _, rest = text.rpartition(":")
        host, _, pid = host.rpartition(":")
        if not host or not pid.isdigit():
            return None
        return cls(host, int(pid), rest)


def new_owner() -> Owner:
    return Owner(socket.gethostname(), os.getpid(), uuid.uuid4().hex[:8])


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:       # someone else's process: alive
        return True
    return True


def gone(owner: str | None, heartbeat_at: float | None, *, me: Owner, now: float, stale_after: float,
         alive: Callable[[int], bool] = pid_alive) -> str | None:
    """Why a running row's owner no longer runs it (the message the row ends with), or None if it may."""
    if owner is None:
        return LEGACY                           # written before rows had owners: one AM per database then
    if owner == str(me):
        return None
    o = Owner.parse(owner)
    if o is not None and o.host == me.host:
        if o.pid == me.pid:
            return f"interrupted: the AM process that ran it ({owner}) restarted"
        if not alive(o.pid):
            return f"interrupted: the AM process that ran it ({owner}) is gone"
    if heartbeat_at is None or now - heartbeat_at > stale_after:
        since = "never" if heartbeat_at is None else f"for {now - heartbeat_at:.0f} s"
        return f"interrupted: the AM process that ran it ({owner}) has not marked it alive {since}"
    return None
