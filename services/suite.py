"""The whole Harness suite on one machine: which services, in what order, wired how.

`harness up` and `harness demo` start it; each service is its own OS process
on loopback, exactly as compose.yaml runs them in containers. A later
service adds itself to `plan()`.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import secrets
import signal
import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from services import config as cfg
from services import pidlock, tenants, tls
from services.catalog import SERVICES, config_sections
from services.launcher import LISTEN_FAILED, Cancelled, LaunchError, ServiceProcess, spawn

log = logging.getLogger(__name__)

__all__ = ["Cancelled"]

# The services that take tenants' calls, and the variable naming the tenants file the suite gives them all.
TENANT_SERVICES = ("crs", "compute", "agent", "fpga", "am")
TENANTS_FILE_ENV = "HARNESS_TENANTS_FILE"
# In STATE_DIR/tls while the suite started from there serves TLS: the CLI then trusts its CA by itself.
TLS_IN_USE = "in-use"
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


def _hold(port: int) -> socket.socket | None:
    """A socket bound to `port` on loopback as gRPC binds (SO_REUSEADDR, so a port whose last connections linger
    in TIME_WAIT after a stop counts as free: else every quick restart moved every service's port, and the
    addresses the databases remember went dead), or None if a service could not listen there. Port 0: any free
    one. While it is open, the system gives that port to no other socket asking for any port."""
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        s.bind(("127.0.0.1", port))
    except OSError:
        s.close()
        return None
    return s


def _is_free(port: int) -> bool:
    """Whether a service could listen on `port` (`_hold`)."""
    s = _hold(port)
    if s is None:
        return False
    s.close()
    return True


def _auto_ports(state_dir: str) -> dict[str, int]:
    """Free ports, one per service, the same as the last start's where still free: the databases in `state_dir`
    remember addresses (a VM's agent, an FPGA group's Orchestrator) that must still answer after a restart. Each
    port is held until all are chosen: ports asked for one at a time (bound and let go) could come back twice,
    and two services of the suite were then planned on one port, again at every retry."""
    try:
        before = {k: int(v) for k, v in json.loads(ports_file(state_dir).read_text()).items()}
    except (OSError, ValueError, AttributeError):
        before = {}
    ports: dict[str, int] = {}
    held: list[socket.socket] = []
    try:
        for k in DEFAULT_PORTS:
            s = _hold(before[k]) if k in before and before[k] not in ports.values() else None
            if s is not None:
                ports[k] = before[k]
            else:
                ports[k] = _free_port()
                # Held while the others are chosen (the system hands out no port twice meanwhile).
                s = _hold(ports[k])
            if s is not None:
                held.append(s)
    finally:
        for s in held:
            s.close()
    ports_file(state_dir).parent.mkdir(parents=True, exist_ok=True)
    ports_file(state_dir).write_text(json.dumps(ports, indent=2))
    return ports


def plan(state_dir: str, auto_ports: bool = False, host: str = "127.0.0.1",
         fixed: Mapping[str, str] | None = None) -> list[Planned]:
    """The suite's services and their wiring; `fixed`: addresses the operator set (service -> HOST:PORT), which
    those services bind and their peers are wired to."""
    ports = _auto_ports(state_dir) if auto_ports else dict(DEFAULT_PORTS)
    addr = {k: f"{host}:{p}" for k, p in ports.items()}
    addr.update(fixed or {})
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


def _file_settings(config_file: str | None, environ: Mapping[str, str] | None = None) -> dict[str, set[str]]:
    """The settings the operator chose, per section: those a config file sets (its sections named by
    service or by section; `$HARNESS_CONFIG` when no file is given, as each service reads it) and
    those `HARNESS_<SECTION>_<FIELD>` variables set. ConfigError if the file cannot be read, as
    `harness serve --config` says it."""
    environ = dict(os.environ) if environ is None else environ
    what = "config file"
    if not config_file and environ.get("HARNESS_CONFIG"):
        config_file, what = environ["HARNESS_CONFIG"], "HARNESS_CONFIG file"
    sections = config_sections()
    out: dict[str, set[str]] = {}
    if config_file:
        data = cfg.read_yaml(config_file, what) or {}
        if not isinstance(data, dict):
            raise cfg.ConfigError(f"{config_file}: expected a mapping of sections")
        for name, part in data.items():
            if name in sections and isinstance(part, dict):
                out.setdefault(sections[name], set()).update(part)
    for section in set(sections.values()):
        prefix = f"HARNESS_{section.upper()}_"
        out_of_env = {k[len(prefix):].lower() for k in environ if k.startswith(prefix)}
        if out_of_env:
            out.setdefault(section, set()).update(out_of_env)
    return out


def _chosen_addresses(config_file: str | None, environ: Mapping[str, str],
                      chosen: dict[str, set[str]]) -> dict[str, str]:
    """Service -> the address the operator set for it (config file or environment), checked: the suite binds
    it and wires the service's peers to it, instead of its own port."""
    out = {}
    for name, entry in SERVICES.items():
        if "address" not in chosen.get(entry.section, set()):
            continue
        conf = cfg.load(entry.load()[0], entry.section, config_file=config_file, environ=environ,
                        sections=config_sections())
        address = cfg.check_address(conf.address)
        if address.rpartition(":")[2].lstrip("0") == "":
            raise cfg.ConfigError(f"{entry.section}.address {address!r}: under `harness up` give a fixed port "
                                  "(the suite wires the other services to it), or leave the address out")
        out[name] = address
    return out


def state_file(state_dir: str) -> Path:
    return Path(state_dir).expanduser() / "suite.json"


def control_token_file(state_dir: str) -> Path:
    """The control token of the suite `harness up` runs from `state_dir` (a new one at each start)."""
    return Path(state_dir).expanduser() / "control-token"


def control_token(state_dir: str) -> str:
    """The control token of the suite running from `state_dir`, "" if there is none to read."""
    try:
        return control_token_file(state_dir).read_text().strip()
    except OSError:
        return ""


def _write_secret(path: Path, text: str) -> None:
    path.unlink(missing_ok=True)        # a file left by another user or mode is not reused
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)


def processes_file(state_dir: str) -> Path:
    """The suite's service processes (name -> pid and command line), written as each one starts: what
    `harness down` stops when `harness up` is gone."""
    return Path(state_dir).expanduser() / "processes.json"


def _recorded(state_dir: str) -> dict[str, dict]:
    try:
        data = json.loads(processes_file(state_dir).read_text())
    except (OSError, ValueError):
        return {}
    return {k: v for k, v in data.items() if isinstance(v, dict)} if isinstance(data, dict) else {}


def _cmdline(pid: int) -> list[str] | None:
    """The command line of process `pid`, None if there is none (gone, or not ours to read)."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None
    return raw.decode(errors="replace").split("\0")[:-1] or None


def _live_services(state_dir: str) -> dict[str, int]:
    """Recorded services still running, by name: their pid still runs the command line it was started with."""
    out = {}
    for name, rec in _recorded(state_dir).items():
        pid, argv = rec.get("pid"), rec.get("argv")
        if isinstance(pid, int) and argv and _cmdline(pid) == argv:
            out[name] = pid
    return out


def _pid_alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie, dead but not yet reaped, does not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] != "Z"
    except (OSError, IndexError):
        return True


class SuiteRunning(RuntimeError):
    """Another suite runs from the state directory."""


class Suite(list):
    """The started services, in start order, holding the state directory's lock (see `_lock`); `spawns`: how
    each was started (`spawn`'s arguments), to start it again the same way (`restart`)."""

    lock_fd: int | None = None
    state_dir: str | None = None
    spawns: dict[str, dict]

    def __init__(self, *args) -> None:  # type: ignore[no-untyped-def]
        super().__init__(*args)
        self.spawns = {}


# How long `harness up` tries for a state directory's lock before it takes it as another suite's: a command looking
# up the suite's addresses holds it for an instant when no suite runs (`_stopped`).
LOCK_WAIT_S = 0.5


def _lock(state_dir: str) -> int:
    """An exclusive lock on `state_dir`, or SuiteRunning. Two suites on one state directory would share its
    databases and logs, and the second, on other free ports (`--auto-ports`), would take over `suite.json`.
    The services inherit the lock, so it holds while any of them lives, even if `harness up` was killed."""
    deadline = time.monotonic() + LOCK_WAIT_S
    while True:
        try:
            return pidlock.take(Path(state_dir) / ".lock")
        except pidlock.Held as e:
            if time.monotonic() >= deadline:
                raise SuiteRunning(_held_message(state_dir, e.owner)) from None
        time.sleep(0.02)


def _stopped(state_dir: str) -> bool:
    """Whether no suite runs from `state_dir`: nothing holds its lock (`harness up` and every service it started
    hold it, `_lock`), as after a reboot or a kill -9 of them all. Its suite.json and processes.json are then
    stale (another suite may serve at those addresses by now) and are removed, as `harness down` does, under the
    lock: a `harness up` starting meanwhile waits for it (`LOCK_WAIT_S`) rather than lose the files it writes.
    The lock is tried without writing this process's pid in it: it names the suite's `harness up` (`unsupervised`,
    `down`)."""
    state_dir = str(Path(state_dir).expanduser())
    lock = Path(state_dir) / ".lock"
    try:
        # For writing where allowed: on NFS flock is a byte-range lock, which takes a file open for writing.
        fd = os.open(lock, os.O_RDWR)
    except PermissionError:
        fd = -1
    except FileNotFoundError:
        # No suite ever started there -- or one of a Harness from before the lock, which may still run.
        return _unlocked_suite_answering(state_dir) is None
    except OSError:
        return False                # not ours to look at: its suite.json is taken as it is
    try:
        fd = fd if fd >= 0 else os.open(lock, os.O_RDONLY)
    except FileNotFoundError:
        return True
    except OSError:
        return False
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return False            # held (BlockingIOError), or a lock this file system cannot take: unknown
        for path in (state_file(state_dir), processes_file(state_dir)):
            with contextlib.suppress(OSError):          # not ours to remove: still no suite runs
                path.unlink(missing_ok=True)
        return True
    finally:
        os.close(fd)


def _unlocked_suite_answering(state_dir: str) -> str | None:
    """An address of suite.json that takes connections while `state_dir` has no lock file: a suite a Harness from
    before the state-directory lock started there still runs (an operator upgrading without stopping it). None if
    there is no suite.json or nothing answers at its addresses."""
    try:
        addresses = json.loads(state_file(state_dir).read_text())
    except (OSError, ValueError):
        return None
    for address in addresses.values() if isinstance(addresses, dict) else ():
        host, _, port = str(address).rpartition(":")
        try:
            with socket.create_connection((host.strip("[]") or "127.0.0.1", int(port)), timeout=0.5):
                return str(address)
        except (OSError, ValueError):
            continue
    return None


def _lock_owner(state_dir: str) -> str:
    """The pid the lock of `state_dir` names: the `harness up` that took it last ("" if none)."""
    try:
        return (Path(state_dir) / ".lock").read_text().strip()
    except OSError:
        return ""


def _supervisor(state_dir: str) -> int | None:
    """The pid of the `harness up` (or `harness demo`) that started the suite of `state_dir`, if it still runs
    (None: gone, its pid now another program's, or no suite)."""
    owner = _lock_owner(str(Path(state_dir).expanduser()))
    argv = _cmdline(int(owner)) if owner.isdigit() else None
    if argv and any(a in ("up", "demo") for a in argv[1:]) and \
            any(a.endswith(("harness", "services.cli")) for a in argv):
        return int(owner)
    return None


def _holds(pid: int, lock: Path) -> bool:
    """Whether process `pid` has `lock` open (one not ours to look at: whether it runs)."""
    target = str(lock.resolve())
    try:
        return any(os.readlink(fd) == target for fd in Path(f"/proc/{pid}/fd").iterdir())
    except PermissionError:
        return _pid_alive(pid)
    except OSError:                   # gone (or its fd closed while we looked)
        return False


def unsupervised(state_dir: str) -> str | None:
    """What to do about the suite of `state_dir` when its services serve on without the process that started them
    (its `harness up`, killed: kill -9, the OOM killer), which alone restarts one that exits; None while that process
    holds the suite's lock (a program calling `start` itself included), and when no suite is up there (`addresses`
    says that)."""
    state_dir = str(Path(state_dir).expanduser())
    if not state_file(state_dir).exists() or _stopped(state_dir):
        return None
    owner = _lock_owner(state_dir)
    if owner.isdigit() and _holds(int(owner), Path(state_dir) / ".lock"):
        return None
    return (f"the suite's `harness up` (pid {owner or '?'}) has exited: its services run unsupervised, and nothing "
            f"restarts one that exits; run `harness down --state-dir {state_dir}`, then `harness up`")


def _held_message(state_dir: str, owner: str) -> str:
    down = f"`harness down --state-dir {state_dir}`"
    if owner.isdigit() and not _pid_alive(int(owner)):
        live = _live_services(state_dir)
        services = ", ".join(f"{name} pid {pid}" for name, pid in live.items()) or "none recorded"
        return (f"a suite's services still run from {state_dir} (started by pid {owner}, which has exited; "
                f"services: {services}); stop them with {down}, or give another --state-dir")
    return (f"a suite is already running from {state_dir} (started by pid {owner}); stop it first (Ctrl-C where "
            f"it runs, or {down}), or give another --state-dir")


def start(state_dir: str, auto_ports: bool = False, config_file: str | None = None,
          on_started=None, cancel: threading.Event | None = None,  # type: ignore[no-untyped-def]
          environ: Mapping[str, str] | None = None, tls: bool = False) -> Suite:
    """Start the suite from `state_dir`, in order, each service once the one before it serves.

    `cancel`: set (e.g. from a signal handler) to stop the start-up: what was started is stopped and
    Cancelled raised. `environ`: the environment the services get and whose HARNESS_CONFIG and
    HARNESS_<SECTION>_* the suite honours (default: this process's); its HARNESS_TENANTS_FILE is the tenants
    file (services.tenants) of every service that takes tenants' calls. `tls`: every service serves TLS with a
    certificate of the suite's own CA (STATE_DIR/tls, kept across starts), and trusts it (services.tls).
    ConfigError for a bad config, before anything starts; SuiteRunning if a suite runs from `state_dir`.
    """
    state_dir = str(Path(state_dir).expanduser())
    environ = dict(os.environ if environ is None else environ)
    chosen = _file_settings(config_file, environ)
    fixed = _chosen_addresses(config_file, environ, chosen)
    tenants_file = environ.get(TENANTS_FILE_ENV, "")
    if tenants_file:
        tenants_file = str(Path(tenants_file).expanduser().absolute())
        tenants.read(tenants_file)                  # a file no service could use: say so before starting any
    Path(state_dir).mkdir(parents=True, exist_ok=True)
    if not (Path(state_dir) / ".lock").exists() and (old := _unlocked_suite_answering(state_dir)):
        # Its services share these databases and would be migrated under it: two suites on one state directory.
        raise SuiteRunning(_unlocked_message(state_dir, old))
    procs = Suite()
    procs.lock_fd = _lock(state_dir)
    procs.state_dir = state_dir
    # The FPGA-server takes control calls from this suite's Orchestrator only, the agent and the compute IRM
    # from each other only, the CRS registrations from its IRMs only (services.control); in the environment,
    # not on a command line others can read.
    token = secrets.token_hex(16)
    # For the operator's control verbs on this machine (`harness managers deregister`), readable by its user only;
    # only while it is the CRS's (a config file's control_token for the CRS is the operator's to give).
    control_token_file(state_dir).unlink(missing_ok=True)
    if "control_token" not in chosen.get(SERVICES["crs"].section, set()):
        _write_secret(control_token_file(state_dir), token)
    # The CRS and the AM act for tenants with this one (services.tenants); the others hold only its digest.
    delegation = tenants.new_token()
    try:
        for attempt in range(1, PORT_ATTEMPTS + 1):
            planned = plan(state_dir, auto_ports, fixed=fixed)
            tls_files = _tls(state_dir, planned) if tls else None
            if not tls_files:                           # the CLI must not speak TLS to this suite's plaintext
                (Path(state_dir) / "tls" / TLS_IN_USE).unlink(missing_ok=True)
            taken = None
            for p in planned:
                if cancel is not None and cancel.is_set():
                    raise Cancelled(p.name)
                # The suite's wiring is a default: what the config file sets (e.g. remote CRSes) stands.
                section = SERVICES[p.service].section
                settings = {k: v for k, v in p.settings.items() if k not in chosen.get(section, set())}
                env = {}
                if p.service in ("crs", "fpga-server", "fpga", "compute", "agent") \
                        and "control_token" not in chosen.get(section, set()):
                    env[f"HARNESS_{section.upper()}_CONTROL_TOKEN"] = token
                if tls_files:
                    env.update({f"HARNESS_{section.upper()}_TLS_{k.upper()}_FILE": v for k, v in tls_files.items()
                                if f"tls_{k}_file" not in chosen.get(section, set())})
                if tenants_file and p.service in TENANT_SERVICES:
                    env.update(_tenant_settings(p.service, tenants_file, delegation, chosen.get(section, set())))
                how = dict(service=p.service, name=p.name, address=p.address, settings=settings,
                           config_file=config_file, env=env,
                           log_path=str(Path(state_dir) / "logs" / f"{p.name}.log"),
                           pass_fds=(procs.lock_fd,), environ=environ)
                proc = spawn(**how)
                procs.append(proc)
                procs.spawns[p.name] = how
                _record(procs)
                try:
                    proc.wait_ready(cancel=cancel)
                except LaunchError as e:
                    # A port the suite chose free, taken by another process before the service listened on it.
                    if not (auto_ports and p.name not in fixed and LISTEN_FAILED in str(e)
                            and attempt < PORT_ATTEMPTS):
                        raise
                    taken = p
                    break
                if on_started:
                    on_started(proc)
            if taken is None:
                break
            # The services started are wired to this plan: all start again on a new one (`_auto_ports` keeps
            # the ports still free and picks others for the rest).
            log.warning(f"{taken.name} could not listen on {taken.address}: another process took the port; "
                        f"starting the suite again on other ports (attempt {attempt + 1} of {PORT_ATTEMPTS})")
            for started in reversed(procs):
                started.stop()
            procs.clear()
            procs.spawns.clear()
            _record(procs)
    except BaseException:
        stop(procs)
        raise
    _write_addresses(procs)
    return procs


# `harness up --auto-ports`: how many plans of free ports it tries when one of their ports is taken meanwhile.
PORT_ATTEMPTS = 3


def tls_ca(state_dir: str) -> str | None:
    """The CA of the suite running from `state_dir` if it runs with TLS (`harness up --tls`), for its clients: the
    marker is written when a suite starts there with TLS and removed when one starts without; a stopped suite
    leaves it, but not its addresses (state_file, removed when `harness up` ends), which this needs too."""
    directory = Path(state_dir).expanduser() / "tls"
    running = state_file(str(Path(state_dir).expanduser())).exists() and not _stopped(state_dir)
    return str(directory / tls.CA_FILE) if running and (directory / TLS_IN_USE).exists() else None


def _tls(state_dir: str, planned: list[Planned]) -> dict[str, str]:
    """STATE_DIR/tls: the suite's CA (made once) and a certificate for every host its services answer at."""
    directory = Path(state_dir) / "tls"
    hosts = ["127.0.0.1", "localhost", "::1"]
    hosts += [p.address.rsplit(":", 1)[0] for p in planned if p.address.rsplit(":", 1)[0] not in ("0.0.0.0", "[::]")]
    files = tls.generate(str(directory), hosts)
    (directory / TLS_IN_USE).write_text("this suite serves TLS with ca.pem's certificates (harness up --tls)\n")
    return files


def _tenant_settings(service: str, tenants_file: str, delegation: str, chosen: set[str]) -> dict[str, str]:
    """The variables giving `service` the suite's tenants file and its part of the delegation secret: the token to
    the services acting for tenants, its digest to those checking it (the CRS both). What the operator's config
    sets stands."""
    section = SERVICES[service].section.upper()
    wanted = {"tenants_file": tenants_file}
    if service in ("crs", "am"):
        wanted["delegation_token"] = delegation
    if service != "am":
        wanted["delegation_sha256"] = tenants.digest(delegation)
    return {f"HARNESS_{section}_{k.upper()}": v for k, v in wanted.items() if k not in chosen}


def _record(procs: Suite) -> None:
    """processes.json: each service's pid and command line, as they are now (`harness down` reads it)."""
    if procs.state_dir:
        _write(processes_file(procs.state_dir), {p.name: {"pid": p.proc.pid, "argv": list(p.proc.args)}
                                                 for p in procs})


def _write_addresses(procs: Suite) -> None:
    if procs.state_dir:
        _write(state_file(procs.state_dir), {p.name: p.address for p in procs})


def _write(path: Path, data: dict) -> None:
    """`data` as JSON in `path`, whole or not at all: `harness down` and the commands read it any time."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data, indent=2))
    tmp.replace(path)


def restart(procs: Suite, name: str, cancel: threading.Event | None = None) -> ServiceProcess:
    """Start the service `name` of `procs` again exactly as `start` did (the same command line, address and
    environment, the suite's control token with it), in its place in `procs` and processes.json, and wait for
    it to serve: its process, LaunchError if it exits first (or takes a minute), Cancelled as soon as `cancel`
    is set (left running in `procs`: `stop` stops it with the rest)."""
    i = next(i for i, p in enumerate(procs) if p.name == name)
    proc = spawn(**procs.spawns[name])
    procs[i] = proc
    _record(procs)                    # before the wait: `harness down` finds it if `harness up` dies meanwhile
    proc.wait_ready(cancel=cancel)
    _write_addresses(procs)
    return proc


@dataclass
class RestartPolicy:
    """How `harness up` restarts a service that exits (`supervise`): after `first_s`, doubling with each
    crash up to `max_s`, back to `first_s` once the service has served `stable_s`; it gives up after
    `crashes` crashes within `window_s`. `HARNESS_UP_BACKOFF=FIRST,MAX` and `HARNESS_UP_GIVE_UP=CRASHES/SECONDS`
    (seconds) change them."""

    first_s: float = 1.0
    max_s: float = 30.0
    stable_s: float = 60.0
    crashes: int = 5
    window_s: float = 60.0

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> RestartPolicy:
        """The policy `environ` sets; ConfigError for a value that is not one."""
        policy = cls()
        text = environ.get("HARNESS_UP_BACKOFF", "").strip()
        if text:
            try:
                first, _, most = text.partition(",")
                policy.first_s, policy.max_s = float(first), float(most or first)
            except ValueError:
                policy.first_s = -1.0
            if not (0 < policy.first_s <= policy.max_s < float("inf")):
                raise cfg.ConfigError(f"HARNESS_UP_BACKOFF={text!r}: expected FIRST,MAX seconds, "
                                      f"0 < FIRST <= MAX (default {cls.first_s:g},{cls.max_s:g})")
        text = environ.get("HARNESS_UP_GIVE_UP", "").strip()
        if text:
            try:
                count, _, window = text.partition("/")
                policy.crashes, policy.window_s = int(count), float(window)
            except ValueError:
                policy.crashes = 0
            if not (policy.crashes >= 1 and 0 < policy.window_s < float("inf")):
                raise cfg.ConfigError(f"HARNESS_UP_GIVE_UP={text!r}: expected CRASHES/SECONDS, CRASHES >= 1 and "
                                      f"SECONDS > 0 (default {cls.crashes}/{cls.window_s:g})")
        return policy


class GaveUp(RuntimeError):
    """A service crashed too often (`RestartPolicy`): `supervise` restarts it no more."""

    def __init__(self, proc: ServiceProcess, crashes: int, window_s: float) -> None:
        super().__init__(f"{proc.name} crashed {crashes} times within {window_s:g} s "
                         f"(last: {exit_text(proc.proc.returncode)})")
        self.proc = proc


def exit_text(code: int | None) -> str:
    """A process's exit status as `harness up` reports it: "1", "-9, SIGKILL"."""
    if code is not None and code < 0:
        try:
            return f"{code}, {signal.Signals(-code).name}"
        except ValueError:
            pass
    return str(code)


def supervise(procs: Suite, cancel: threading.Event, policy: RestartPolicy | None = None,
              say: Callable[[str], None] = print, clock: Callable[[], float] = time.monotonic) -> None:
    """Watch the services of `procs` until `cancel` is set: one that exits (a crash, the OOM killer, a kill)
    is started again as it was (`restart`) after its back-off, each service on its own; returns once `cancel`
    is set (also in a back-off wait or while a service starts again: the caller then stops them all); GaveUp
    when one crashed too often. `say`: one line per event."""
    policy = policy or RestartPolicy()
    crashes: dict[str, deque[float]] = {p.name: deque() for p in procs}
    delay = {p.name: policy.first_s for p in procs}
    serving_since: dict[str, float | None] = {p.name: clock() for p in procs}
    due: dict[str, float] = {}             # service -> when to start it again

    def crashed(proc: ServiceProcess, what: str) -> None:
        now = clock()
        since = serving_since[proc.name]
        if since is not None and now - since >= policy.stable_s:
            delay[proc.name] = policy.first_s          # it served a good while: this is a fresh start
        serving_since[proc.name] = None
        times = crashes[proc.name]
        times.append(now)
        while times and now - times[0] > policy.window_s:
            times.popleft()
        if len(times) >= policy.crashes:
            raise GaveUp(proc, len(times), policy.window_s)
        wait = delay[proc.name]
        delay[proc.name] = min(wait * 2, policy.max_s)
        due[proc.name] = now + wait
        say(f"{what}; restarting in {wait:g} s")

    while not cancel.is_set():
        for proc in list(procs):
            if proc.name not in due and not proc.alive():
                crashed(proc, f"{proc.name} exited ({exit_text(proc.proc.returncode)})")
        now = clock()
        for name in sorted((n for n, t in due.items() if t <= now), key=due.__getitem__):
            if cancel.is_set():
                return
            del due[name]
            try:
                proc = restart(procs, name, cancel)
            except Cancelled:
                return
            except LaunchError:
                proc = next(p for p in procs if p.name == name)
                crashed(proc, f"{name} did not start again ({exit_text(proc.proc.returncode)}; its log: "
                              f"{procs.spawns[name].get('log_path')})")
                continue
            serving_since[name] = clock()
            say(f"{name} restarted (pid {proc.proc.pid}, {proc.address})")
        wait = min([0.5, *(t - clock() for t in due.values())])
        cancel.wait(max(0.0, wait))


_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def kill_agent_leftovers(state_dir: str) -> int:
    """Kill what the suite's agent ran that outlived it (an agent killed and not started again: `harness up` gave up
    on it, or was itself killed), as the agent's next start on its work dir would; how many. Its services stopped,
    a suite leaves no tenant's program running."""
    from irm_compute.agent import kill_leftovers

    work = Path(state_dir).expanduser() / "agent"
    if not work.is_dir():
        return 0
    killed = kill_leftovers(work)
    if killed:
        log.warning("killed what tenants' programs left running when their agent died",
                    extra={"work_dir": str(work), "killed": killed})
    return killed


def stop(procs: list[ServiceProcess]) -> None:
    """Stop the services, last started first, and free the state directory. Not interrupted by a signal
    (a second Ctrl-C, a supervisor's SIGTERM): they are ignored meanwhile, as abandoning the stop would
    leave services running, the state directory locked."""
    before = {}
    if threading.current_thread() is threading.main_thread():
        before = {sig: signal.signal(sig, signal.SIG_IGN) for sig in _STOP_SIGNALS}
    try:
        for p in reversed(procs):
            p.stop()
        state_dir = getattr(procs, "state_dir", None)
        if state_dir and all(not p.alive() for p in procs):
            processes_file(state_dir).unlink(missing_ok=True)
            control_token_file(state_dir).unlink(missing_ok=True)     # no suite's token once none runs
            kill_agent_leftovers(state_dir)
        fd = getattr(procs, "lock_fd", None)
        if fd is not None:
            procs.lock_fd = None      # type: ignore[attr-defined]
            os.close(fd)              # the services are gone: the state directory is free again
    finally:
        for sig, handler in before.items():
            if handler is not None:
                signal.signal(sig, handler)


def _lock_holding_services(lock: Path) -> dict[str, int]:
    """`harness serve` processes that hold `lock` open (they inherit it from `harness up`): "serve:<pid>" -> pid."""
    out: dict[str, int] = {}
    target = str(lock.resolve())
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if not any(os.readlink(fd) == target for fd in (entry / "fd").iterdir()):
                continue
        except OSError:               # gone, or not ours to look at
            continue
        argv = _cmdline(int(entry.name)) or []
        if "serve" in argv and any(a.endswith(("harness", "services.cli")) for a in argv):
            out[f"serve:{entry.name}"] = int(entry.name)
    return out


def down(state_dir: str, timeout: float = 20.0) -> str:
    """Stop the suite running from `state_dir`: its `harness up` if that still runs (SIGTERM: it stops its
    services), else the services recorded in processes.json that still run their recorded command line;
    then the state directory is free. What was done, or SuiteRunning if the lock stays held."""
    state_dir = str(Path(state_dir).expanduser())
    lock = Path(state_dir) / ".lock"
    if not lock.exists():
        return _down_unlocked(state_dir, timeout)

    def free() -> bool:
        try:
            fd = pidlock.take(lock)
        except pidlock.Held:
            return False
        os.close(fd)
        return True

    def wait(check, seconds: float) -> bool:  # type: ignore[no-untyped-def]
        deadline = time.monotonic() + seconds
        while not check():
            if time.monotonic() > deadline:
                return False
            time.sleep(0.1)
        return True

    def tidy(done: str) -> str:
        state_file(state_dir).unlink(missing_ok=True)
        processes_file(state_dir).unlink(missing_ok=True)
        control_token_file(state_dir).unlink(missing_ok=True)
        if killed := kill_agent_leftovers(state_dir):
            done += f"; killed {killed} process(es) tenants' programs had left running (their agent had died)"
        return done

    if free():
        return tidy(f"no suite runs from {state_dir}")
    owner = _lock_owner(state_dir)
    up = _supervisor(state_dir)
    if up is not None:
        os.kill(up, signal.SIGTERM)           # `harness up` stops its services itself
        if wait(free, timeout + 15):
            return tidy(f"stopped the suite of pid {owner} ({state_dir})")

    def services() -> dict[str, int]:
        # Recorded ones, and services holding the lock that a killed `harness up` spawned but did not record yet
        # (each process once: a recorded one holds the lock too).
        recorded = _live_services(state_dir)
        unrecorded = {k: pid for k, pid in _lock_holding_services(lock).items() if pid not in recorded.values()}
        return {**recorded, **unrecorded}

    live = services()
    for pid in live.values():
        os.kill(pid, signal.SIGTERM)
    if not wait(lambda: not services(), timeout):
        for pid in services().values():
            os.kill(pid, signal.SIGKILL)
        wait(lambda: not services(), 5)
    if not wait(free, 5):
        raise SuiteRunning(f"{lock} is still held (pid {owner} started the suite), by no service recorded in "
                           f"{processes_file(state_dir)}: stop that process yourself")
    names = ", ".join(f"{n} (pid {pid})" for n, pid in live.items()) or "none running"
    return tidy(f"stopped the services of {state_dir}: {names}")


def _down_unlocked(state_dir: str, timeout: float) -> str:
    """`down` of a state directory without a lock file: nothing, or a suite of a Harness from before the lock
    (`_unlocked_suite_answering`), stopped through the processes it recorded that still run their command line."""
    old = _unlocked_suite_answering(state_dir)
    if old is None:
        return f"no suite runs from {state_dir}"
    live = _live_services(state_dir)
    for pid in live.values():
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while (_live_services(state_dir) or _unlocked_suite_answering(state_dir)) and time.monotonic() < deadline:
        time.sleep(0.1)
    if (still := _unlocked_suite_answering(state_dir)) is not None:
        raise SuiteRunning(_unlocked_message(state_dir, still))
    state_file(state_dir).unlink(missing_ok=True)
    processes_file(state_dir).unlink(missing_ok=True)
    control_token_file(state_dir).unlink(missing_ok=True)
    names = ", ".join(f"{n} (pid {pid})" for n, pid in live.items()) or "none running"
    return f"stopped the services of {state_dir} (a suite of an earlier Harness): {names}"


def _unlocked_message(state_dir: str, address: str) -> str:
    return (f"a suite started by an earlier Harness (one without a state-directory lock) still answers at {address}, "
            f"from {state_dir}: stop it (Ctrl-C where it runs, or `harness down --state-dir {state_dir}`, which "
            f"stops the processes it recorded); if what answers there is not that suite (its suite.json is left "
            f"from before a reboot), remove {state_file(state_dir)}")


class NoSuite(SystemExit):
    """No suite runs from the state directory (no suite.json, or nothing holds its lock): a command that needs the
    suite's addresses says so and ends with status 1 (a SystemExit: also where it is not caught)."""

    def __init__(self, state_dir: str, hint: str = "") -> None:
        self.state_dir = state_dir
        self.message = f"no suite runs from {state_dir}: start one with `harness up`"
        if _live_services(str(Path(state_dir).expanduser())):
            self.message = (f"the suite of {state_dir} is not up: it is still starting, or its `harness up` ended "
                            f"before all its services served (stop them with `harness down --state-dir "
                            f"{state_dir}`, then `harness up`)")
        self.hint = hint or ("or give the --state-dir it runs from, or the service's address: --crs, --fpga or "
                             "--am HOST:PORT")
        super().__init__(f"harness: {self.message} ({self.hint})")


def addresses(state_dir: str, hint: str = "") -> dict[str, str]:
    """The addresses of the services of the suite running from `state_dir` (its suite.json), NoSuite if
    none does (also when a suite.json is left but nothing holds the lock: `_stopped`); `hint`: what else the
    caller can do, for its message."""
    if _stopped(state_dir):
        raise NoSuite(state_dir, hint)
    try:
        data = json.loads(state_file(state_dir).read_text())
    except FileNotFoundError:
        raise NoSuite(state_dir, hint) from None
    except (OSError, ValueError) as e:
        raise SystemExit(f"harness: cannot read {state_file(state_dir)}: {e}") from None
    if not isinstance(data, dict):
        raise SystemExit(f"harness: {state_file(state_dir)}: expected service -> address")
    return data
