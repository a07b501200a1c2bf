"""Start Harness services as separate OS processes on loopback.

Used by `harness up` (the whole suite, in the foreground) and by the
integration tests (each service bound to port 0). A process is ready when it
logs its "serving" line with the bound address: no polling, no sleeps.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

# What a service prints when its address is taken (services.server): `harness up --auto-ports` then picks
# another port.
LISTEN_FAILED = "could not listen on"


class LaunchError(RuntimeError):
    pass


class Cancelled(Exception):
    """A start-up was told to stop (`wait_ready`'s `cancel` set): a flag, not a signal's exception."""


@dataclass
class ServiceProcess:
    name: str
    service: str
    proc: subprocess.Popen
    address: str = ""
    log_tail: deque = field(default_factory=lambda: deque(maxlen=400))
    _ready: threading.Event = field(default_factory=threading.Event)
    _pumped: threading.Event = field(default_factory=threading.Event)    # its stderr ended (it is exiting)
    _log_file: object | None = None

    @property
    def port(self) -> int:
        return int(self.address.rsplit(":", 1)[1])

    def _pump(self) -> None:
        assert self.proc.stderr is not None
        try:
            for raw in self.proc.stderr:
                line = raw.decode(errors="replace").rstrip("\n")
                self.log_tail.append(line)
                if self._log_file is not None:
                    self._log_file.write(line + "\n")  # type: ignore[attr-defined]
                    self._log_file.flush()  # type: ignore[attr-defined]
                if not self._ready.is_set() and '"msg": "serving"' in line:
                    try:
                        self.address = json.loads(line)["address"]
                    except (ValueError, KeyError):
                        continue
                    self._ready.set()
        finally:
            self._pumped.set()
            self._ready.set()  # exited: wake the waiter, who sees no address
            # The process's stderr is done (it exited): so is its log file, which only this thread writes.
            if self._log_file is not None:
                self._log_file.close()  # type: ignore[attr-defined]

    def wait_ready(self, timeout: float = 60.0, cancel: threading.Event | None = None) -> str:
        """The bound address once serving, LaunchError if it exits or `timeout` passes first, Cancelled as soon
        as `cancel` (if given) is set -- the process is left running: the caller stops what it started."""
        deadline = time.monotonic() + timeout
        while cancel is not None and not self._ready.is_set():
            if cancel.is_set():
                raise Cancelled(self.name)
            if time.monotonic() >= deadline:
                break
            self._ready.wait(min(0.05, max(0.0, deadline - time.monotonic())))
        if not self._ready.wait(max(0.0, deadline - time.monotonic())) or not self.address:
            # Before stop(): its own exit (its stderr closed: reaped in a moment), or None if still running (hung).
            exited = self.proc.poll()
            if exited is None and self._pumped.is_set():
                try:
                    exited = self.proc.wait(5.0)
                except subprocess.TimeoutExpired:
                    pass                        # closed its stderr and lives on: hung, as far as we can tell
            self.stop()
            tail = "\n".join(list(self.log_tail)[-30:])
            if exited is None:
                # Not serving after `timeout` s, alive: stuck starting (a plug-in its configuration names that hangs
                # while imported, a database that never answers...). Its exit code would be our own SIGTERM's.
                raise LaunchError(f"{self.name} did not serve within {timeout:g} s and was stopped: it hung while "
                                  f"starting (a plug-in that does not finish importing, say)"
                                  + (f"; its last lines:\n{tail}" if tail else "; it logged nothing"))
            raise LaunchError(f"{self.name} did not start (exit code {exited}):\n{tail}")
        return self.address

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self, timeout: float = 15.0) -> int | None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode

    def kill(self) -> None:
        """SIGKILL: a crash, no graceful shutdown."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def logs(self) -> str:
        return "\n".join(self.log_tail)


def spawn(service: str, *, name: str | None = None, address: str = "127.0.0.1:0",
          settings: dict[str, object] | None = None, config_file: str | None = None,
          env: dict[str, str] | None = None, log_path: str | None = None,
          pass_fds: tuple[int, ...] = (), environ: dict[str, str] | None = None) -> ServiceProcess:
    """Start `harness serve SERVICE` as a child process (not yet waited for), in `environ` (default: this
    process's environment) with `env` added."""
    argv = [sys.executable, "-m", "services.cli", "serve", service, "--address", address]
    if config_file:
        argv += ["--config", config_file, "--shared-config"]     # a suite's file: a service may have no section
    for key, value in (settings or {}).items():
        if isinstance(value, list | tuple):
            value = ",".join(str(v) for v in value)
        elif isinstance(value, dict):
            value = ",".join(f"{k}={v}" for k, v in value.items())
        argv += ["--set", f"{key}={value}"]
    child_env = dict(os.environ if environ is None else environ)
    child_env.update(env or {})
    child_env.setdefault("PYTHONUNBUFFERED", "1")
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            env=child_env, start_new_session=True, pass_fds=pass_fds)
    sp = ServiceProcess(name or service, service, proc)
    if log_path:
        Path(log_path).parent.mkdir(parents=True, exist_ok=True)
        sp._log_file = open(log_path, "a")  # noqa: SIM115 - closed with the process
    threading.Thread(target=sp._pump, name=f"log-{sp.name}", daemon=True).start()
    return sp
