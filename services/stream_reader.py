"""A gRPC response stream read on a thread of its own, for a command a signal may interrupt.

A KeyboardInterrupt (or a signal handler's exception) raised while the main thread waits inside a stream's
`next()` leaves the call with a receive operation pending: reading it again then fails with "Internal gRPC call
error 8" (measured: 62 of 150 Ctrl-Cs at a client before the stream's first event), so `harness run` could not
learn which execution to stop. Here only the reader thread touches the call; the main thread waits on a condition,
which a signal interrupts cleanly. A message stays buffered until the caller asks for the next one: one the
interruption caught half-handled is still there for `first`. At most MAX_BUFFERED wait, so a slow consumer holds
the stream back as reading it directly would (gRPC's flow control), not the client's memory.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

import grpc

MAX_BUFFERED = 64


class StreamReader:
    """Iterates `call` (a response stream) as it would be iterated directly: its messages, then its RpcError if it
    failed; after an interruption, `first(...)` finds a message from the one being handled on; `cancel()` ends it.

    Reading starts at `start()`, apart from making it: a caller holds the reader before a signal can come in
    between, and starts it (again: once is all it does) when one did."""

    def __init__(self, call: Any) -> None:
        self._call = call
        self._buffered: deque[Any] = deque()
        self._error: grpc.RpcError | None = None
        self._ended = self._cancelled = False
        self._changed = threading.Condition()
        self._claimed = False       # a reader thread took the call: the only one that ever touches it

    def start(self) -> StreamReader:
        """Start reading (again: until a reader has claimed the call, a signal may have cut the last start short,
        and a reader too many leaves at once, never touching the call: gRPC refuses two readers)."""
        with self._changed:
            if self._claimed:
                return self
        threading.Thread(target=self._read, name="stream-reader", daemon=True).start()
        return self

    def _read(self) -> None:
        with self._changed:
            if self._claimed:
                return
            self._claimed = True
        try:
            for message in self._call:
                with self._changed:
                    while len(self._buffered) >= MAX_BUFFERED and not self._cancelled:
                        self._changed.wait()
                    if self._cancelled:
                        return
                    self._buffered.append(message)
                    self._changed.notify_all()
        except grpc.RpcError as e:
            self._error = e
        finally:
            with self._changed:
                self._ended = True
                self._changed.notify_all()

    def __iter__(self) -> Iterator[Any]:
        while True:
            with self._changed:
                while not self._buffered and not self._ended:
                    self._changed.wait()
                if not self._buffered:
                    if self._error is not None:
                        raise self._error
                    return
                message = self._buffered[0]
            yield message
            with self._changed:         # the caller asked for the next one: done with this one
                if self._buffered and self._buffered[0] is message:     # (unless `first` passed it over)
                    self._buffered.popleft()
                    self._changed.notify_all()

    def first(self, wanted: Callable[[Any], bool], wait_s: float) -> Any | None:
        """The first message from the one being handled on that `wanted` accepts, waiting up to `wait_s` seconds
        for more (the others are passed over); None if the stream ends, fails or stays silent that long first."""
        deadline = time.monotonic() + wait_s
        with self._changed:
            while True:
                while self._buffered:
                    message = self._buffered.popleft()
                    self._changed.notify_all()
                    if wanted(message):
                        return message
                left = deadline - time.monotonic()
                if self._ended or left <= 0:
                    return None
                self._changed.wait(left)

    def cancel(self) -> None:
        with self._changed:
            self._cancelled = True
            self._changed.notify_all()
        self._call.cancel()
