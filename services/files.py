"""Files other processes read at any time, written whole or not at all."""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path


def write_atomic(path: str | os.PathLike[str], data: bytes, mode: int = 0o644,
                 owner: tuple[int, int] | None = None) -> None:
    """`data` in `path`, replaced atomically (a reader never sees half of it), with `mode` and, when it can,
    `owner` (uid, gid). The temporary is a fresh file of our own (mkstemp: O_EXCL), so no planted file or symlink
    is written through."""
    target = Path(path)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
    try:
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), mode)
            if owner is not None and owner != (os.geteuid(), os.getegid()):
                with contextlib.suppress(PermissionError):
                    os.fchown(f.fileno(), *owner)
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
