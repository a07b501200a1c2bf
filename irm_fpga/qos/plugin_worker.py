"""A plug-in scheduling algorithm run in a process of its own, with a time limit on every call.

The live job manager decides under its lock: a plug-in (`irm_fpga.qos.plugins`) that loops forever
called in the manager's process would hold that lock for good -- no job registered, retired or
dispatched again, and a Python thread cannot be stopped. Run by a `PluginRunner`, such a call is
answered with a `PolicyError` after `timeout_s` and its process is killed (the next call starts a
fresh one); a plug-in that crashes the interpreter or exits is a `PolicyError` too. A plug-in's
exceptions come back as `PolicyError`s naming them, and state it keeps between calls lives as long
as its process.

The simulator calls plug-ins in its own process (a run is one researcher's own code, and a call
over a pipe costs about a millisecond; a 300 s run of seed 001 §VI makes thousands of decisions).
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import signal
import threading
import time
import traceback
from collections.abc import Sequence
from multiprocessing.connection import Connection
from typing import Any

from irm_fpga.qos import hydrogen as hy
from irm_fpga.qos import plugins

log = logging.getLogger(__name__)

START_TIMEOUT_S = 60.0      # a fresh process imports the plug-in (and numpy/scipy through the project's modules)
ORPHAN_CHECK_S = 1.0        # how often the worker checks that the process that started it is still there


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
    except Exception as e:     # noqa: BLE001 - told to the parent, which refuses to start it
        conn.send(("error", f"{type(e).__name__}: {e}"))
        return
    conn.send(("ready", None))
    while True:
        try:
            request = conn.recv()
        except EOFError:            # the manager closed the pipe: it stopped
            return
        if request is None:
            return
        queue, available, window, cost, now = request
        try:
            reply: tuple[str, Any] = ("ok", alg(queue, available, window, cost, now=now))
        except SystemExit as e:
            reply = ("exit", e.code)
        except BaseException as e:     # noqa: BLE001 - any fault of the plug-in is the caller's PolicyError
            reply = ("error", f"{type(e).__name__}: {e}\n{traceback.format_exc(limit=-3)}")
        try:
            conn.send(reply)
        except Exception as e:     # noqa: BLE001 - e.g. an answer that cannot be pickled
            conn.send(("error", f"its answer cannot be sent back ({type(e).__name__}: {e})"))


class PluginRunner:
    """Calls the plug-in `name` like an algorithm, `runner(queue, available, window, cost, now=)`, in a worker
    process, each call answered within `timeout_s` or refused with a `PolicyError`.

    Calls are serialised. `close()` stops the worker; a closed runner starts a new one when called again.
    """

    def __init__(self, name: str, *, timeout_s: float, late_after: float = hy.LATE_AFTER_S,
                 start_timeout_s: float = START_TIMEOUT_S) -> None:
        if not timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0 seconds (got {timeout_s!r})")
        self.name, self.timeout_s, self.late_after, self.start_timeout_s = name, timeout_s, late_after, start_timeout_s
        self._ctx = multiprocessing.get_context("spawn")   # no fork of a process running gRPC's threads
        self._proc: Any = None
        self._conn: Connection | None = None
        self._lock = threading.Lock()
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
        try:
            ready = ours.poll(self.start_timeout_s)
            kind, detail = ours.recv() if ready else ("timeout", f"no answer within {self.start_timeout_s:g} s")
        except (EOFError, OSError):
            kind, detail = "error", f"it ended with exit code {proc.exitcode}"
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

    def _receive(self, timeout: float, doing: str) -> tuple[str, Any]:
        assert self._conn is not None and self._proc is not None
        try:
            if self._conn.poll(timeout):
                return self._conn.recv()
        except (EOFError, OSError):
            self._proc.join(5.0)
            code = self._proc.exitcode
            self._stop(kill=True)
            self._replace_soon()
            raise plugins.PolicyError(f"scheduling algorithm {self.name!r}: its worker process ended "
                                      f"(exit code {code}) while it was asked {doing}; a new one is started for a "
                                      f"later decision") from None
        self._stop(kill=True)
        self._replace_soon()
        raise plugins.PolicyError(f"scheduling algorithm {self.name!r} did not answer within {timeout:g} s when asked "
                                  f"{doing} (jobs_plugin_timeout_s); its worker process was stopped, and a new one "
                                  f"is started for a later decision")

    def __call__(self, queue: Sequence[hy.HJob], available: int, window: int, cost: hy.Cost = hy.linear_cost, *,
                 now: float) -> object:
        with self._lock:
            conn = self._ensure()
            try:
                conn.send((list(queue), available, window, cost, now))
            except (OSError, EOFError):
                self._stop(kill=True)
                self._replace_soon()
                raise plugins.PolicyError(f"scheduling algorithm {self.name!r}: its worker process is gone; a new "
                                          f"one is started for a later decision") from None
            kind, detail = self._receive(self.timeout_s, "for a decision")
        if kind == "ok":
            return detail
        if kind == "exit":
            raise plugins.PolicyError(f"scheduling algorithm {self.name!r} called exit({detail!r})")
        raise plugins.PolicyError(f"scheduling algorithm {self.name!r} failed: {detail}")

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
