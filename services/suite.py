"""The whole Harness suite on one machine: which services, in what order, wired how.

`harness up` and `harness demo` start it; each service is its own OS process
on loopback, exactly as compose.yaml runs them in containers. A later
service adds itself to `plan()`.
"""

from __future__ import annotations

import json
import os
import secrets
import socket
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from services import pidlock
from services.catalog import SERVICES, config_sections
from services.launcher import ServiceProcess, spawn

DEFAULT_PORTS = {"crs": 50051, "compute": 50061, "agent": 50071, "fpga-server": 50081, "fpga": 50091, "am": 50101}


@dataclass
class Planned:
    name: str
    service: str
    address: str
    settings: dict[str, object] = field(default_factory=dict)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ports_file(state_dir: str) -> Path:
    return Path(state_dir).expanduser() / "ports.json"


def _is_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def _auto_ports(state_dir: str) -> dict[str, int]:
    """Free ports, the same as the last start's where still free: the databases in `state_dir` remember
    addresses (a VM's agent, an FPGA group's Orchestrator) that must still answer after a restart."""
    try:
        before = {k: int(v) for k, v in json.loads(ports_file(state_dir).read_text()).items()}
    except (OSError, ValueError, AttributeError):
        before = {}
    ports = {k: before[k] if k in before and _is_free(before[k]) else _free_port() for k in DEFAULT_PORTS}
    ports_file(state_dir).parent.mkdir(parents=True, exist_ok=True)
    ports_file(state_dir).write_text(json.dumps(ports, indent=2))
    return ports


def plan(state_dir: str, auto_ports: bool = False, host: str = "127.0.0.1") -> list[Planned]:
    ports = _auto_ports(state_dir) if auto_ports else dict(DEFAULT_PORTS)
    addr = {k: f"{host}:{p}" for k, p in ports.items()}
    return [
        Planned("crs", "crs", addr["crs"], {"state_dir": state_dir}),
        Planned("compute", "compute", addr["compute"], {
            "state_dir": state_dir, "crs_address": addr["crs"], "agent_address": addr["agent"]}),
        Planned("agent", "agent", addr["agent"], {
            "compute_address": addr["compute"], "work_dir": str(Path(state_dir) / "agent")}),
        Planned("fpga-server", "fpga-server", addr["fpga-server"], {"name": "fpga-0"}),
        Planned("fpga", "fpga", addr["fpga"], {
            "state_dir": state_dir, "servers": addr["fpga-server"], "crs_address": addr["crs"]}),
        Planned("am", "am", addr["am"], {"state_dir": state_dir, "crs_address": addr["crs"]}),
    ]


def _file_settings(config_file: str | None, environ: dict[str, str] | None = None) -> dict[str, set[str]]:
    """The settings the operator chose, per section: those a config file sets (its sections named by
    service or by section; `$HARNESS_CONFIG` when no file is given, as each service reads it) and
    those `HARNESS_<SECTION>_<FIELD>` variables set."""
    environ = dict(os.environ) if environ is None else environ
    config_file = config_file or environ.get("HARNESS_CONFIG")
    sections = config_sections()
    out: dict[str, set[str]] = {}
    if config_file:
        data = yaml.safe_load(Path(config_file).read_text()) or {}
        for name, part in (data.items() if isinstance(data, dict) else []):
            if name in sections and isinstance(part, dict):
                out.setdefault(sections[name], set()).update(part)
    for section in set(sections.values()):
        prefix = f"HARNESS_{section.upper()}_"
        out_of_env = {k[len(prefix):].lower() for k in environ if k.startswith(prefix)}
        if out_of_env:
            out.setdefault(section, set()).update(out_of_env)
    return out


def state_file(state_dir: str) -> Path:
    return Path(state_dir).expanduser() / "suite.json"


class SuiteRunning(RuntimeError):
    """Another suite runs from the state directory."""


class Suite(list):
    """The started services, in start order, holding the state directory's lock (see `_lock`)."""

    lock_fd: int | None = None


def _lock(state_dir: str) -> int:
    """An exclusive lock on `state_dir`, or SuiteRunning. Two suites on one state directory would share its
    databases and logs, and the second, on other free ports (`--auto-ports`), would take over `suite.json`.
    The services inherit the lock, so it holds while any of them lives, even if `harness up` was killed."""
    try:
        return pidlock.take(Path(state_dir) / ".lock")
    except pidlock.Held as e:
        raise SuiteRunning(f"a suite is already running from {state_dir} (started by pid {e.owner}); stop it "
                           f"first (Ctrl-C where it runs), or give another --state-dir") from None


def start(state_dir: str, auto_ports: bool = False, config_file: str | None = None,
          on_started=None) -> Suite:  # type: ignore[no-untyped-def]
    state_dir = str(Path(state_dir).expanduser())
    Path(state_dir).mkdir(parents=True, exist_ok=True)
    procs = Suite()
    procs.lock_fd = _lock(state_dir)
    chosen = _file_settings(config_file)
    # The FPGA-server takes control calls from this suite's Orchestrator only, the agent and the compute IRM
    # from each other only (services.control); in the environment, not on a command line others can read.
    token = secrets.token_hex(16)
    try:
        for p in plan(state_dir, auto_ports):
            # The suite's wiring is a default: what the config file sets (e.g. remote CRSes) stands.
            section = SERVICES[p.service].section
            settings = {k: v for k, v in p.settings.items() if k not in chosen.get(section, set())}
            env = {}
            if p.service in ("fpga-server", "fpga", "compute", "agent") \
                    and "control_token" not in chosen.get(section, set()):
                env[f"HARNESS_{section.upper()}_CONTROL_TOKEN"] = token
            proc = spawn(p.service, name=p.name, address=p.address, settings=settings, config_file=config_file,
                         env=env, log_path=str(Path(state_dir) / "logs" / f"{p.name}.log"),
                         pass_fds=(procs.lock_fd,))
            procs.append(proc)
            proc.wait_ready()
            if on_started:
                on_started(proc)
    except BaseException:
        stop(procs)
        raise
    state_file(state_dir).write_text(json.dumps({p.name: p.address for p in procs}, indent=2))
    return procs


def stop(procs: list[ServiceProcess]) -> None:
    for p in reversed(procs):
        p.stop()
    fd = getattr(procs, "lock_fd", None)
    if fd is not None:
        procs.lock_fd = None      # type: ignore[attr-defined]
        os.close(fd)              # the services are gone: the state directory is free again


def addresses(state_dir: str) -> dict[str, str]:
    f = state_file(state_dir)
    if not f.exists():
        return {}
    return json.loads(f.read_text())
