"""A circuit breaker per FPGA-server, on the channel of the Orchestrator's handle for it.

A server that refuses connections fails every call at once; one that hangs (a stopped process, a host behind a
partition) makes every call wait its whole deadline, and the Orchestrator and the job manager call each server in
turn, many times per operation: one hung server would cost tens of seconds per operation for as long as it hangs.

So after a call to a server failed *slowly* -- DEADLINE_EXCEEDED, or UNAVAILABLE after at least SLOW_FAILURE_S
(a connection that hung, not one that was refused) -- further calls to it fail at once, with an RpcError of code
UNAVAILABLE saying that the server did not answer and when it is tried again (`ServerNotAnswering`), for a
back-off period. Then ONE call goes through (half-open: the others keep failing at once meanwhile); a read-only
call (GetServer, GetMeasurements) tried so gets a deadline of at most `probe_timeout_s`. Any answer (a reply, or
an error the server sent, or a connection refused at once) closes the breaker; a probe that fails slowly opens it
again for twice as long, up to `max_backoff_s`.

A failure that cost nothing (a refused connection) never opens it: such a server is no slower to ask than before,
and is used again as soon as it answers. The breaker sits on every call made through the handle's `stub()`, so
every caller (the Orchestrator's placements and rounds, the job manager's observations) has it.
"""

from __future__ import annotations

import logging
import threading
import time
import types
from collections.abc import Callable
from typing import Any

import grpc

log = logging.getLogger(__name__)

SLOW_FAILURE_S = 1.0        # an UNAVAILABLE that took this long was a hang (a refused connection fails at once)
PROBE_TIMEOUT_S = 2.0       # the deadline of a read-only call that tries a server again (if the caller's is longer)
# Calls without side effects: the one that tries a server again may get a shorter deadline than its caller's.
READ_ONLY = frozenset({"/harness.v1.FpgaServer/GetServer", "/harness.v1.FpgaServer/GetMeasurements"})


class ServerNotAnswering(grpc.RpcError, grpc.Call, grpc.Future):
    """A call the breaker failed without making it: UNAVAILABLE, as a finished RPC (a Call and a done Future) so a
    caller handles it as any failed call (`code()`, `details()`; `result()` raises it)."""

    def __init__(self, details: str) -> None:
        super().__init__(details)
        self._details = details

    # grpc.Call / grpc.RpcError
    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.UNAVAILABLE

    def details(self) -> str:
        return self._details

    def initial_metadata(self) -> tuple:
        return ()

    def trailing_metadata(self) -> tuple:
        return ()

    def debug_error_string(self) -> str:
        return self._details

    def is_active(self) -> bool:
        return False

    def time_remaining(self) -> float | None:
        return None

    def add_callback(self, callback: Callable[[], None]) -> bool:
        return False

    # grpc.Future: done, failed
    def cancel(self) -> bool:
        return False

    def cancelled(self) -> bool:
        return False

    def running(self) -> bool:
        return False

    def done(self) -> bool:
        return True

    def result(self, timeout: float | None = None) -> Any:
        raise self

    def exception(self, timeout: float | None = None) -> BaseException:
        return self

    def traceback(self, timeout: float | None = None) -> types.TracebackType | None:
        try:
            raise self
        except grpc.RpcError as e:
            return e.__traceback__

    def add_done_callback(self, fn: Callable[[grpc.Future], None]) -> None:
        fn(self)

    def __str__(self) -> str:
        return f"<ServerNotAnswering: StatusCode.UNAVAILABLE: {self._details}>"

    __repr__ = __str__


class ServerBreaker(grpc.UnaryUnaryClientInterceptor):
    """The breaker of one server (thread-safe); an interceptor for the channels of its handle's stubs."""

    def __init__(self, server: str, address: str, backoff_s: float, max_backoff_s: float,
                 probe_timeout_s: float = PROBE_TIMEOUT_S, slow_failure_s: float = SLOW_FAILURE_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.server, self.address = server, address
        self.backoff_s, self.max_backoff_s = backoff_s, max(backoff_s, max_backoff_s)
        self.probe_timeout_s, self.slow_failure_s = probe_timeout_s, slow_failure_s
        self._clock = clock
        self._lock = threading.Lock()
        self._failures = 0              # slow failures in a row (0: closed)
        self._opened_at = 0.0           # when it last opened
        self._retry_at = 0.0            # open until then; then one call tries the server
        self._probe_until = 0.0         # a probe is out until then (0: none); after it, another may go
        self._why = ""                  # the failure that opened it, for the fast failures' details

    # -- state ---------------------------------------------------------------
    @property
    def is_open(self) -> bool:
        """It fails calls at once (or lets a probe through): the server's last call failed slowly."""
        with self._lock:
            return self._failures > 0

    def retry_in(self) -> float:
        """Seconds until a call may try the server again (0: now, or closed)."""
        with self._lock:
            return max(0.0, self._retry_at - self._clock()) if self._failures else 0.0

    def _admit(self) -> bool | ServerNotAnswering:
        """Whether this call is the one that tries the server again, or the error it fails with at once."""
        with self._lock:
            if not self._failures:
                return False
            now = self._clock()
            if now >= self._retry_at and now >= self._probe_until:
                self._probe_until = now + self.probe_timeout_s + 1.0    # set to the probe's deadline once known
                return True
            wait = max(self._retry_at, self._probe_until) - now
            return ServerNotAnswering(
                f"FPGA-server {self.server!r} at {self.address} did not answer ({self._why}); it is not called "
                f"again until {wait:.1f} s from now (one call tries it then; {self._backoff():g} s between tries "
                f"while it does not answer)" if now < self._retry_at else
                f"FPGA-server {self.server!r} at {self.address} did not answer ({self._why}); a call is trying "
                f"it now, the others fail at once until that one is answered (within {wait:.1f} s)")

    def _backoff(self) -> float:
        return min(self.max_backoff_s, self.backoff_s * 2 ** max(0, self._failures - 1))

    def _record(self, code: grpc.StatusCode | None, elapsed: float, started: float, probe: bool) -> None:
        slow = code == grpc.StatusCode.DEADLINE_EXCEEDED or (
            code == grpc.StatusCode.UNAVAILABLE and elapsed >= self.slow_failure_s)
        unknown = code is None or code == grpc.StatusCode.CANCELLED     # the caller's doing, not the server's
        opened = closed = False
        with self._lock:
            if probe:
                self._probe_until = 0.0
            if unknown:
                return
            if slow:
                # A call that was out before the breaker opened adds nothing: one hang, one back-off.
                if probe or (not self._failures and started >= self._opened_at):
                    self._failures += 1
                    self._opened_at = self._clock()
                    self._retry_at = self._opened_at + self._backoff()
                    self._why = f"{code.name} after {elapsed:.1f} s"
                    opened = True
            elif self._failures:        # it answered (or refused at once): nothing to wait for
                self._failures = 0
                self._retry_at = 0.0
                closed = True
            backoff = self._backoff()
        if opened:
            log.warning("FPGA-server does not answer: calls to it fail at once for a while, then one tries it",
                        extra={"server": self.server, "address": self.address, "code": code.name,  # type: ignore
                               "backoff_s": backoff})
        elif closed:
            log.warning("FPGA-server answers again", extra={"server": self.server, "address": self.address})

    # -- the interceptor -----------------------------------------------------
    def intercept_unary_unary(self, continuation, client_call_details, request):  # type: ignore[no-untyped-def]
        probe = self._admit()
        if isinstance(probe, ServerNotAnswering):
            return probe                    # a finished, failed call: `result()` raises it
        details = client_call_details
        started = self._clock()
        if probe:
            method = details.method.decode() if isinstance(details.method, bytes) else details.method
            if method in READ_ONLY:
                timeout = self.probe_timeout_s if details.timeout is None else min(details.timeout,
                                                                                    self.probe_timeout_s)
                details = details._replace(timeout=timeout)
            with self._lock:                # others fail at once while it is out (its deadline: then one may go)
                self._probe_until = started + (details.timeout or self.probe_timeout_s) + 1.0
        try:
            outcome = continuation(details, request)
        except BaseException:
            if probe:
                self._record(None, 0.0, started, probe)
            raise

        def done(f: Any) -> None:
            try:
                code = f.code()
            except Exception:  # noqa: BLE001 - an outcome without a status: nothing learned
                code = None
            if not isinstance(f, grpc.RpcError) and code != grpc.StatusCode.OK:
                code = None                 # an exception on this side (grpc's INTERNAL): not the server's answer
            self._record(code, self._clock() - started, started, probe)

        outcome.add_done_callback(done)
        return outcome


def intercept(channel: grpc.Channel, breaker: ServerBreaker | None) -> grpc.Channel:
    """`channel` with `breaker` on every unary call (as it is without one)."""
    return grpc.intercept_channel(channel, breaker) if breaker is not None else channel
