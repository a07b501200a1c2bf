"""The bounds the Application Manager puts on what it is asked for and on what it stores: read by the servicer
and by its profiling sessions and executions alike."""

from __future__ import annotations

# The most runs a profiling session may be given (max_runs), and an online exploration's profiler plans for.
MAX_RUNS = 200
# A run's or execution's error as stored: "exit code N: <the program's last output line>", "could not reserve:
# CODE: ...", a cancellation's reason... The head says what kind of failure it is (transient_error, bottleneck
# detection and timeouts read it); the tail holds the end of the last output line. Unbounded, one program
# printing a long last line grows every GetModel (which returns every run) towards the 4 MiB a client receives.
MAX_ERROR_CHARS = 2000
_ERROR_HEAD = 400
# Every Application message carries its manifest and SLO, and ListApplications returns them all in one
# message: unbounded, a few large ones would exceed a client's receive limit (4 MiB by default) for good.
MAX_MANIFEST_BYTES = 256 * 1024
MAX_SLO_BYTES = 64 * 1024
# The longest a run may be given: the agent's stream deadline is the limit plus a margin, and gRPC turns an
# unbounded one (1e300, inf) into an immediate DEADLINE_EXCEEDED -- every run would fail at once.
MAX_RUN_TIMEOUT_S = 7 * 24 * 3600.0


def bounded_error(error: str) -> str:
    """`error` within MAX_ERROR_CHARS: its head (the kind of failure) and its tail (the end of the last output
    line), the middle elided."""
    if len(error) <= MAX_ERROR_CHARS:
        return error
    # The count left out has at most as many digits as the whole length: the marker is never longer than this.
    tail = MAX_ERROR_CHARS - _ERROR_HEAD - len(f" [... {len(error)} characters left out ...] ")
    return f"{error[:_ERROR_HEAD]} [... {len(error) - _ERROR_HEAD - tail} characters left out ...] {error[-tail:]}"
