"""An exclusive lock on a file that names its holder's pid: one process per directory (a suite's state, an
agent's work dir). Held while the descriptor is open; the kernel drops it when the holder dies."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path


class Held(OSError):
    """Another process holds the lock; `owner` is the pid it wrote ("?" if none)."""

    def __init__(self, path: Path, owner: str) -> None:
        super().__init__(f"{path} is locked by pid {owner}")
        self.owner = owner


def take(path: Path) -> int:
    """The lock on `path` (created if need be) as an open descriptor with this process's pid in it, or Held.

    The descriptor is not inherited by programs this process runs (Python's default): a child left behind
    never holds the lock; pass it explicitly (pass_fds) to children that should.
    """
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        owner = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
        os.close(fd)
        raise Held(path, owner) from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd
