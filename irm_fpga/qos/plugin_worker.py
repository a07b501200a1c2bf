"""A plug-in scheduling algorithm run in a process of its own, with a time limit on every call.

The live job manager decides under its lock: a plug-in (`irm_fpga.qos.plugins`) that loops forever
called in the manager's process would hold that lock for good -- no job registered, retired or
dispatched again, and a Python thread cannot be stopped. Run by a `PluginRunner`, such a call is
answered with a `PolicyError` after `timeout_s` and its process is killed (the next call starts a
fresh one); a plug-in that crashes the interpreter or exits is a `PolicyError` too. A plug-in's
exceptions come back as `PolicyError`s naming them, and state it keeps between calls lives as long
as its process.

Nothing from the worker is unpickled in the manager: unpickling runs code (an answer whose
`__reduce__` sleeps or calls `os._exit` would stall or end the manager), and a plug-in has the
worker process to itself (it may write anything to the pipe). The worker turns the plug-in's answer
into plain data there (`plugins.allocation_pairs`: (str job id, int devices) pairs; an answer that is
none is reported as the plug-in's error; a list or tuple with more items than could fit in the reply's limit
is refused as too long before they are checked) and sends it as JSON; the manager reads it within the call's
time limit, byte by byte as it arrives, refuses it once it is longer than an honest answer for the
window's jobs can be (`reply_limit`), and decodes it with `json.loads` only. Its texts (errors,
tracebacks, the repr of a bad answer or of an exit code) are plain strings cut to
`plugins.MAX_TEXT_CHARS`. What the manager sends -- the queue, the free devices, the window, its cost
model, the time -- is its own data, pickled for the worker.

Each request carries a sequence number and its reply names it: a frame the plug-in wrote on the pipe by
itself ahead of the worker's reply to an earlier call would otherwise be read as the answer to the next
one, and every answer after it would be one call late. A reply to an earlier request is dropped; one to a
request not yet made is refused.

The simulator calls plug-ins in its own process by default (a run is one researcher's own code);
`harness bench policies` runs them through a PluginRunner, so a plug-in that hangs is stopped there
too (a call over the pipe costs ~0.1 ms; a 300 s run of seed 001 §VI makes thousands of decisions).
"""

from __future__ import annotations

import json
import logging
import multiprocessing
import os
import select
import signal
import struct
import threading
import time
import traceback
from collections.abc import Sequence
from multiprocessing.connection import Connection
from multiprocessing.reduction import ForkingPickler
from typing import Any

from irm_fpga.qos import hydrogen as hy
from irm_fpga.qos import plugins

log = logging.getLogger(__name__)

START_TIMEOUT_S = 60.0      # a fresh process imports the plug-in (and numpy/scipy through the project's modules)
ORPHAN_CHECK_S = 1.0        # how often the worker checks that the process that started it is still there

# A message on the pipe is multiprocessing.connection's frame (what `Connection.send_bytes` writes and
# `recv_bytes` reads): its length as a big-endian signed 32-bit integer, then its bytes. The manager reads
# and writes frames itself on its end of the pipe (non-blocking), so that a call's time limit covers all of
# it: `Connection.poll` says only that a first byte is there, and `recv_bytes` then waits, without a limit,
# for as many bytes as the worker's header announced.
_HEADER = struct.Struct("!i")
# Bytes an honest reply may take beyond its job ids: a JSON string escapes a character in at most 12 bytes
# (a surrogate pair), a pair's brackets, commas and device count take 32 at most, the envelope 256.
_ESCAPED = 12
_PAIR = 32
_ENVELOPE = 256
TEXT_REPLY_LIMIT = _ESCAPED * plugins.MAX_TEXT_CHARS + _ENVELOPE   # a reply carrying one text (an error)


def reply_limit(queue: Sequence[hy.HJob], window: int) -> int:
    """The most bytes the worker's reply to a decision on `queue` and `window` may take: its answer for the
    first `window` jobs, each at most once (an honest one; more is refused), or an error's text."""
    answer = sum(_ESCAPED * len(str(j.job_id)) + _PAIR for j in queue[:max(0, window)]) + _ENVELOPE
    return max(answer, TEXT_REPLY_LIMIT)


def _least_reply(pairs: int, seq: int) -> int:
    """The fewest bytes a reply carrying `pairs` (job id, devices) pairs can take: each at least `["",0]` and a
    comma (what the envelope holds besides is counted once)."""
    return len(_encode(["ok", []], seq)) + max(0, 7 * pairs - 1)


def _encode(reply: list, seq: int = 0) -> bytes:
    """[seq, kind, ...]: the request's sequence number first (0: the worker's start-up)."""
    return json.dumps([seq, *reply], separators=(",", ":")).encode()


def _text_of(e: BaseException) -> str:
    """'Type: message' and the last frames of the traceback, clipped; never raises (a plug-in's exception)."""
    try:
        text = f"{type(e).__name__}: {e}\n{traceback.format_exc(limit=-3)}"
    except Exception:     # noqa: BLE001 - its __str__ may fail too
        text = f"{type(e).__name__} (its message cannot be shown)"
    return plugins.clip(text)


def _reply(alg: Any, seq: int, queue: list, available: int, window: int, cost: hy.Cost, now: float) -> bytes:
    """The worker's reply to request `seq`: JSON of plain data, the plug-in's faults included."""
    try:
        answer = alg(queue, available, window, cost, now=now)
        limit = reply_limit(queue, window)
        # A list or tuple (exactly: its length is no code of the plug-in's) too long for the limit even at the
        # fewest bytes per pair is refused as it is: validating and encoding every item would only tell the same
        # (a million items take seconds, and the call's time limit runs meanwhile).
        if type(answer) in (list, tuple) and _least_reply(len(answer), seq) > limit:
            return _encode(["too-long", len(answer), _least_reply(len(answer), seq)], seq)
        try:
            pairs = plugins.allocation_pairs(answer)
        except plugins.NotPairs as e:       # what is wrong with it, as the simulator says it
            return _encode(["not-pairs", f"{plugins.describe(answer)} ({plugins.clip(str(e))})"], seq)
        except (TypeError, ValueError):     # the answer's own code failed (its iteration, __index__)
            return _encode(["not-pairs", plugins.describe(answer)], seq)
        data = _encode(["ok", [[job_id, n] for job_id, n in pairs]], seq)
        if len(data) > limit:
            return _encode(["too-long", len(pairs), len(data)], seq)
        return data
    except SystemExit as e:
        return _encode(["exit", plugins.describe(e.code)], seq)
    except BaseException as e:     # noqa: BLE001 - any fault of the plug-in is the caller's PolicyError
        return _encode(["error", _text_of(e)], seq)


def _watch_parent(parent: int) -> None:
    """Ends the worker once its parent is gone, even while the plug-in loops (the pipe's end is not seen then)."""
    while os.getppid() == parent:
        time.sleep(ORPHAN_CHECK_S)
    os._exit(0)


def _serve(conn: Connection, name: str, late_after: float, parent: int) -> None:
    """The worker process: load the algorithm, then answer (queue, available, window, cost, now) requests."""
    # Its manager stops it (the pipe, a kill, or the watchdog); a Ctrl-C in the manager's terminal is not for it.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    threading.Thread(target=_watch_parent, args=(parent,), daemon=True).start()
    try:
        alg = hy.with_late_after(plugins.single_algorithm(name), late_after)
    except BaseException as e:     # noqa: BLE001 - told to the parent, which refuses to start it
        try:
            text = plugins.clip(f"{type(e).__name__}: {e}")
        except Exception:     # noqa: BLE001 - an exception of the plug-in's module: its __str__ may fail
            text = type(e).__name__
        conn.send_bytes(_encode(["error", text]))
        return
    conn.send_bytes(_encode(["ready"]))
    while True:
        try:
            request = conn.recv()       # the manager's own data (the queue, its cost model)
        except EOFError:            # the manager closed the pipe: it stopped
            return
        if request is None:
            return
        seq, queue, available, window, cost, now = request
        conn.send_bytes(_reply(alg, seq, queue, available, window, cost, now))


class _TooLong(Exception):
    def __init__(self, size: int) -> None:
        super().__init__(size)
        self.size = size


class _Timeout(Exception):
    pass


def _wait(fd: int, event: int, deadline: float) -> None:
    """Wait until `fd` is ready for `event` (select.POLLIN / POLLOUT), at most until `deadline`."""
    p = select.poll()
    p.register(fd, event)
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise _Timeout
        if p.poll(left * 1000.0):
            return


def _read_exact(fd: int, n: int, deadline: float) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        _wait(fd, select.POLLIN, deadline)
        try:
            chunk = os.read(fd, n - len(buf))
        except BlockingIOError:
            continue
        if not chunk:
            raise EOFError
        buf += chunk
    return bytes(buf)


def _read_frame(fd: int, limit: int, deadline: float) -> bytes:
    """One frame's bytes, all of them by `deadline` (_Timeout) and at most `limit` of them (_TooLong)."""
    size, = _HEADER.unpack(_read_exact(fd, _HEADER.size, deadline))
    if not 0 <= size <= limit:     # -1 would announce a length of more than 2 GiB
        raise _TooLong(size)
    return _read_exact(fd, size, deadline)


def _write_frame(fd: int, data: bytes, deadline: float) -> None:
    view = memoryview(_HEADER.pack(len(data)) + data)
    while view:
        _wait(fd, select.POLLOUT, deadline)
        try:
            view = view[os.write(fd, view):]
        except BlockingIOError:
            continue


class _BadReply(Exception):
    pass


def _size(n: int) -> str:
    return f"{n} bytes" if n >= 0 else "more than 2 GiB"


def _decode(data: bytes, kinds: tuple[str, ...]) -> tuple[int, list]:
    """A reply's sequence number and JSON, one of `kinds`: a list [seq, kind, ...] of plain values (the worker
    is not trusted to have made it)."""
    try:
        framed = json.loads(data)
    except (ValueError, RecursionError) as e:     # not UTF-8 / JSON, nested too deeply, a number too long
        raise _BadReply(f"not JSON: {type(e).__name__}") from None
    if not (isinstance(framed, list) and len(framed) >= 2 and type(framed[0]) is int and isinstance(framed[1], str)):
        raise _BadReply("not a list [sequence number, kind, ...]")
    return framed[0], _checked(framed[1:], kinds)


def _checked(reply: list, kinds: tuple[str, ...]) -> list:
    kind, rest = reply[0], reply[1:]
    if kind not in kinds:
        raise _BadReply(f"a reply of kind {plugins.describe(kind[:40])} where {' or '.join(kinds)} was expected")
    if kind == "ready" and not rest:
        return reply
    if kind in ("error", "not-pairs", "exit") and len(rest) == 1 and isinstance(rest[0], str):
        return [kind, plugins.clip(rest[0])]
    if kind == "too-long" and len(rest) == 2 and all(type(x) is int for x in rest):
        return reply
    if kind == "ok" and len(rest) == 1 and isinstance(rest[0], list) and all(
            isinstance(p, list) and len(p) == 2 and isinstance(p[0], str) and type(p[1]) is int for p in rest[0]):
        return ["ok", [(job_id, n) for job_id, n in rest[0]]]
    raise _BadReply(f"a {kind} reply of the wrong shape")


class PluginRunner:
    """Calls the plug-in `name` like an algorithm, `runner(queue, available, window, cost, now=)`, in a worker
    process, each call answered within `timeout_s` or refused with a `PolicyError`.

    Calls are serialised. `close()` stops the worker; a closed runner starts a new one when called again.
    """

    def __init__(self, name: str, *, timeout_s: float, late_after: float = hy.LATE_AFTER_S,
                 start_timeout_s: float = START_TIMEOUT_S, timeout_setting: str = "jobs_plugin_timeout_s",
                 after_failure: str = "a new one is started for a later decision") -> None:
        if not timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0 seconds (got {timeout_s!r})")
        self.name, self.timeout_s, self.late_after, self.start_timeout_s = name, timeout_s, late_after, start_timeout_s
        # What errors name: the setting that is `timeout_s` where the runner is used, and what follows a failure
        # there (the FPGA IRM's job manager decides again; a benchmark's run ends).
        self.timeout_setting, self.after_failure = timeout_setting, after_failure
        self._ctx = multiprocessing.get_context("spawn")   # no fork of a process running gRPC's threads
        self._proc: Any = None
        self._conn: Connection | None = None
        self._lock = threading.Lock()
        self._seq = 0               # the last request's sequence number (replies name theirs)
        self._started = False       # a first worker was started (later ones start in the background)
        self._replacing = False     # a background start is under way
        self._closed = False

    @property
    def pid(self) -> int | None:
        """The worker's process id (None: none running)."""
        return self._proc.pid if self._proc is not None and self._proc.is_alive() else None

    def start(self) -> None:
        """Start the worker now (else at the first call) and wait until it has loaded the plug-in."""
        with self._lock:
            self._ensure()

    def _spawn(self) -> tuple[Any, Connection]:
        """A new worker process, once it has loaded the plug-in (PolicyError if it cannot); holds no lock."""
        ours, theirs = self._ctx.Pipe()
        proc = self._ctx.Process(target=_serve, args=(theirs, self.name, self.late_after, os.getpid()),
                                 name=f"plugin:{self.name}", daemon=True)
        try:
            proc.start()
        except BaseException:
            ours.close()
            theirs.close()
            raise
        theirs.close()
        os.set_blocking(ours.fileno(), False)       # read and written with deadlines (_read_frame, _write_frame)
        try:
            seq, reply = _decode(_read_frame(ours.fileno(), TEXT_REPLY_LIMIT, time.monotonic() + self.start_timeout_s),
                                 ("ready", "error"))
            kind, detail = reply[0], reply[-1]
            if seq != 0:
                raise _BadReply(f"a reply to request {seq} before any was made")
        except _Timeout:
            kind, detail = "timeout", f"no answer within {self.start_timeout_s:g} s"
        except (EOFError, OSError):
            proc.join(5.0)      # its pipe closed: it is ending; its exit code says how (None until it is reaped)
            kind, detail = "error", f"it ended with exit code {proc.exitcode}"
        except _TooLong as e:
            kind, detail = "error", f"it announced a reply of {_size(e.size)}, more than {TEXT_REPLY_LIMIT}"
        except _BadReply as e:
            kind, detail = "error", f"it sent what is not a reply ({e})"
        if kind != "ready":
            ours.close()
            proc.kill()
            proc.join(5.0)
            raise plugins.PolicyError(f"scheduling algorithm {self.name!r} cannot be loaded in its worker process: "
                                      f"{detail}")
        return proc, ours

    def _ensure(self) -> Connection:
        """The live worker's pipe (under `_lock`). The first worker is started here and waited for; a worker
        that failed is replaced in the background (`_replace`): a decision meanwhile is refused at once, not
        kept waiting a start-up's second or more under the job manager's lock."""
        if self._conn is not None and self._proc is not None and self._proc.is_alive():
            return self._conn
        self._stop(kill=True)
        if self._started:
            self._replace_soon()
            raise plugins.PolicyError(f"scheduling algorithm {self.name!r}: its worker process is starting again "
                                      f"after a failure; the queue waits for a later decision")
        self._started = True
        self._proc, self._conn = self._spawn()
        return self._conn

    def _replace_soon(self) -> None:
        """Start a replacement worker in the background, unless one is already starting (under `_lock`)."""
        if not self._replacing and not self._closed:
            self._replacing = True
            threading.Thread(target=self._replace, name=f"plugin-start:{self.name}", daemon=True).start()

    def _replace(self) -> None:
        try:
            proc, conn = self._spawn()
        except Exception:   # noqa: BLE001 - logged; the next decision tries again
            log.exception("could not start a plug-in's worker process", extra={"plugin": self.name})
            with self._lock:
                self._replacing = False
            return
        with self._lock:
            self._replacing = False
            if self._closed or (self._proc is not None and self._proc.is_alive()):
                conn.close()
                proc.kill()
                proc.join(5.0)
                return
            self._proc, self._conn = proc, conn

    def _failed(self, message: str) -> plugins.PolicyError:
        """Stop the worker (under `_lock`), start another in the background, and say so."""
        self._stop(kill=True)
        self._replace_soon()
        return plugins.PolicyError(message)

    def _timed_out(self, doing: str) -> plugins.PolicyError:
        return self._failed(f"scheduling algorithm {self.name!r} did not answer within {self.timeout_s:g} s when "
                            f"asked {doing} ({self.timeout_setting}); its worker process was stopped, and "
                            f"{self.after_failure}")

    def _receive(self, deadline: float, limit: int, doing: str) -> list:
        """The worker's reply to request `_seq`, all of it by `deadline` and at most `limit` bytes, as plain
        data (under `_lock`); replies to earlier requests on the pipe before it are dropped."""
        assert self._conn is not None and self._proc is not None
        try:
            while True:
                seq, reply = _decode(_read_frame(self._conn.fileno(), limit, deadline),
                                     ("ok", "not-pairs", "too-long", "exit", "error"))
                if seq == self._seq:
                    return reply
                if seq > self._seq:
                    raise _BadReply(f"a reply to request {seq}, not yet made (the last was {self._seq})")
                log.warning("dropped a plug-in's reply to an earlier request", extra={
                    "plugin": self.name, "reply_to": seq, "request": self._seq})
        except (EOFError, OSError):
            self._proc.join(min(5.0, max(0.1, deadline - time.monotonic())))
            code = self._proc.exitcode
            raise self._failed(f"scheduling algorithm {self.name!r}: its worker process ended (exit code {code}) "
                               f"while it was asked {doing}; {self.after_failure}") from None
        except _Timeout:
            raise self._timed_out(doing) from None
        except _TooLong as e:
            raise self._failed(f"scheduling algorithm {self.name!r} announced an answer of {_size(e.size)} when "
                               f"asked {doing}, more than an answer for the window's jobs takes ({limit} bytes); "
                               f"its worker process was stopped, and {self.after_failure}") from None
        except _BadReply as e:
            raise self._failed(f"scheduling algorithm {self.name!r} sent what is not an answer when asked "
                               f"{doing} ({e}); its worker process was stopped, and {self.after_failure}") from None

    def __call__(self, queue: Sequence[hy.HJob], available: int, window: int, cost: hy.Cost = hy.linear_cost, *,
                 now: float) -> hy.Allocation:
        queue = list(queue)
        limit = reply_limit(queue, window)
        with self._lock:
            conn = self._ensure()
            self._seq += 1
            request = bytes(ForkingPickler.dumps((self._seq, queue, available, window, cost, now)))   # our own data
            deadline = time.monotonic() + self.timeout_s    # for the request and the whole reply
            try:
                _write_frame(conn.fileno(), request, deadline)
            except (OSError, EOFError):
                raise self._failed(f"scheduling algorithm {self.name!r}: its worker process is gone; "
                                   f"{self.after_failure}") from None
            except _Timeout:
                raise self._timed_out("for a decision") from None
            reply = self._receive(deadline, limit, "for a decision")
        kind = reply[0]
        if kind == "ok":
            return reply[1]
        if kind == "exit":
            raise plugins.PolicyError(f"scheduling algorithm {self.name!r} called exit({reply[1]})")
        if kind == "not-pairs":
            raise plugins.PolicyError(f"scheduling algorithm {self.name!r} failed: its answer cannot be sent back: "
                                      f"it returned {reply[1]}; expected a list of (job id, devices)")
        if kind == "too-long":
            raise plugins.PolicyError(f"scheduling algorithm {self.name!r} returned {reply[1]} items, at least "
                                      f"{reply[2]} bytes to send back as (job id, devices) pairs; an answer for "
                                      f"the first {window} queued jobs takes at most {limit}")
        raise plugins.PolicyError(f"scheduling algorithm {self.name!r} failed: {reply[1]}")

    def _stop(self, kill: bool = False) -> None:
        """End the worker: asked to (it finishes the call it is in, if any, for up to a second), or killed."""
        conn, proc = self._conn, self._proc
        self._conn = self._proc = None
        if conn is not None:
            if not kill:
                try:
                    conn.send(None)
                except (OSError, EOFError, ValueError):
                    pass
            conn.close()
        if proc is not None:
            if not kill:
                proc.join(1.0)
            if proc.is_alive():
                proc.kill()
            proc.join(5.0)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._stop()
