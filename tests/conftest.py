"""Shared fixtures: real service processes, gRPC stubs, a PostgreSQL URL."""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Callable, Collection, Iterator, Mapping
from typing import Any, TypeVar

import grpc
import pytest

from services.launcher import LISTEN_FAILED, LaunchError, ServiceProcess, spawn
from services.suite import _free_port
from services.tls import plain_channel

T = TypeVar("T")


def eventually(check: Callable[[], Any], timeout: float = 20.0, interval: float = 0.05, what: str = "") -> Any:
    """Poll `check` until it returns a truthy value (an observable condition, not a fixed sleep)."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what or check}; last value {last!r}")


class PeerError(grpc.RpcError):
    """A peer's failed call as a gRPC client sees it: its code and details, no trailing metadata."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(details)
        self._code, self._details = code, details

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details

    def trailing_metadata(self) -> tuple:
        return ()


@pytest.fixture(autouse=True)
def _service_log_handlers_removed() -> Iterator[None]:
    """A test that runs `harness serve` in-process leaves its JSON handler on the root logger, writing to the
    stderr of that test (captured, then closed): a later log record (matplotlib's first import announces its font
    cache) would print "--- Logging error ---" into another test's stderr. Only plain StreamHandlers the test added
    go: pytest's own capture handlers are subclasses and come and go by themselves. The levels and the time
    converter services.logs.setup sets are put back."""
    root = logging.getLogger()
    before, level, converter = set(root.handlers), root.level, logging.Formatter.converter
    alembic = logging.getLogger("alembic").level
    yield
    for h in [h for h in root.handlers if type(h) is logging.StreamHandler and h not in before]:
        root.removeHandler(h)
    # What services.logs.setup sets besides: later tests' caplog must not depend on the order they run in.
    root.setLevel(level)
    logging.Formatter.converter = converter
    logging.getLogger("alembic").setLevel(alembic)


# What a service says when the port it was told to listen on is taken: `harness serve` in its log (LaunchError),
# services.server.start as an OSError.
PORT_TAKEN = LISTEN_FAILED


def port_taken(error: BaseException) -> bool:
    return isinstance(error, OSError | LaunchError) and PORT_TAKEN in str(error)


def until_ports_hold(start: Callable[[], T], what: str, attempts: int = 5) -> T:
    """`start()` of something that picks free ports itself and then has services listen there (`harness up
    --auto-ports`, `harness demo`, `services.suite.start(auto_ports=True)`, `on_a_free_port`): a port may be taken
    by another process between the pick and the listen (services bind without SO_REUSEPORT), and then `start`
    (which stops whatever it started, and raises the OSError or LaunchError saying PORT_TAKEN) is tried again,
    picking again. Any other failure, or a port taken `attempts` times in a row, fails the test."""
    taken: BaseException | None = None
    for _ in range(attempts):
        try:
            return start()
        except (OSError, LaunchError) as e:
            if not port_taken(e):
                raise
            taken = e
    raise AssertionError(f"{what}: a port chosen for it was taken before it could listen there, {attempts} times "
                         "in a row") from taken


def on_a_free_port(start: Callable[[int], T], what: str, attempts: int = 5, avoid: Collection[int] = ()) -> T:
    """`start(port)` with a port free when chosen, for a service whose peers must know its port before it starts
    (two services each configured with the other's address: one of them cannot be started on port 0 first).
    Something else may take the port before the service binds it (services bind without SO_REUSEPORT): then
    `start` (which stops whatever it started for that port) is tried again on another. Any other failure, or the
    port taken `attempts` times in a row, fails the test. `avoid`: ports not to choose even when free (the port a
    test's service had before, that it must now be elsewhere than)."""

    def choose() -> int:
        while True:
            port = _free_port()
            if port not in avoid:
                return port

    return until_ports_hold(lambda: start(choose()), what, attempts)


def hold_port(port: int = 0) -> socket.socket:
    """A socket bound to `port` on loopback (0: one the system picks; `getsockname()[1]` says which), not
    listening. While it is open no other process can listen there (it takes neither SO_REUSEADDR nor
    SO_REUSEPORT, and services bind without SO_REUSEPORT), and a connection there is refused, as at a port nobody
    uses: an address where nothing answers that stays so. Close it (it is a context manager) to let a service
    listen there -- then another process may take the port first: `until_ports_hold`. OSError if `port` is taken."""
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", port))
    except OSError:
        s.close()
        raise
    return s


def start_again(start: Callable[[], T], what: str, timeout: float = 20.0) -> T:
    """`start()` of a service again on the port it had (a restart its peers must find at the same address): tried
    again while that port is taken by another process since the service let it go (an ephemeral port of a
    connection, another test's probe: those go), a clear failure if it stays taken for `timeout` s."""
    started: list[T] = []

    def attempt() -> bool:
        try:
            started.append(start())
        except (OSError, LaunchError) as e:
            if not port_taken(e):
                raise
            return False
        return True

    eventually(attempt, timeout=timeout, interval=0.2, what=f"{what} to start again on its port (taken by another "
                                                            "process since it stopped)")
    return started[0]


class Suite:
    """Processes started by one test; all stopped at the end."""

    def __init__(self, tmp: str) -> None:
        self.tmp = tmp
        self.procs: list[ServiceProcess] = []

    def start(self, service: str, name: str | None = None, address: str = "127.0.0.1:0",
              env: Mapping[str, str] | None = None, **settings: Any) -> ServiceProcess:
        import dataclasses

        from services.catalog import SERVICES

        fields = {f.name for f in dataclasses.fields(SERVICES[service].load()[0])}
        if "work_dir" in fields:
            settings.setdefault("work_dir", os.path.join(self.tmp, f"{name or service}-work"))
        if "state_dir" in fields:
            settings.setdefault("state_dir", self.tmp)
        if name and "name" in fields and service in ("compute", "fpga-server", "crs"):
            settings.setdefault("name", name)  # the name it registers / reports under (a CRS: with one above)
        p = spawn(service, name=name, address=address, settings=settings, env=dict(env or {}),
                  log_path=os.path.join(self.tmp, f"{name or service}.log"))
        self.procs.append(p)
        p.wait_ready()
        return p

    def compute_cloud(self, **agent_settings: Any) -> tuple[ServiceProcess, Any]:
        """A CRS, a compute IRM and its agent, started and wired (heartbeats every 0.3 s); returned once the
        compute IRM's hosts are in the CRS: the CRS process and a ResourceManager stub on it."""

        from harness.v1 import irm_pb2, irm_pb2_grpc

        crs = self.start("crs", heartbeat_interval_s=0.3)

        def agent_then_compute(compute_port: int) -> None:
            # Each is configured with the other's address: the agent first, on port 0, then the compute IRM on
            # the port the agent was given for it.
            compute_address = f"127.0.0.1:{compute_port}"
            agent = self.start("agent", compute_address=compute_address, **agent_settings)
            try:
                compute = self.start("compute", address=compute_address, crs_address=crs.address,
                                     heartbeat_interval_s=0.3, agent_address=agent.address)
            except LaunchError:
                agent.stop()
                del self.procs[self.procs.index(agent):]     # the compute IRM that did not start too
                raise
            # In the order the processes were wired before: CRS, compute IRM, agent (stopped the other way round).
            self.procs[-2:] = [compute, agent]

        on_a_free_port(agent_then_compute, "the compute IRM")
        stub = irm_pb2_grpc.ResourceManagerStub(plain_channel(crs.address))
        eventually(lambda: stub.DiscoverResources(irm_pb2.DiscoverResourcesRequest()).resources,
                   what="the compute IRM's hosts in the CRS")
        return crs, stub

    def compute_and_agent(self, compute: Mapping[str, Any] | None = None, agent: Mapping[str, Any] | None = None,
                          avoid: Collection[int] = ()) -> tuple[ServiceProcess, ServiceProcess]:
        """A compute IRM and its agent, each configured with the other's address: the compute IRM on port 0, told
        the agent's address on a port free when chosen (not one of `avoid`), then the agent there -- both again,
        on another port, if that one was taken meanwhile (`on_a_free_port`). `compute`, `agent`: their further
        `start` arguments (name, settings). Returned: their processes."""

        def compute_then_agent(agent_port: int) -> tuple[ServiceProcess, ServiceProcess]:
            agent_address = f"127.0.0.1:{agent_port}"
            mark = len(self.procs)
            c = self.start("compute", agent_address=agent_address, **(compute or {}))
            try:
                a = self.start("agent", address=agent_address, compute_address=c.address, **(agent or {}))
            except LaunchError:
                c.stop()
                del self.procs[mark:]                        # the compute IRM and the agent that did not start
                raise
            return c, a

        return on_a_free_port(compute_then_agent, "the agent", avoid=avoid)

    def stop_all(self) -> None:
        for p in reversed(self.procs):
            p.stop()


@pytest.fixture
def suite(tmp_path) -> Iterator[Suite]:
    s = Suite(str(tmp_path))
    yield s
    s.stop_all()


@pytest.fixture
def unused_address() -> Iterator[Callable[[], str]]:
    """Makes addresses on loopback where nothing answers (a connection is refused) for the whole test: their ports
    held (`hold_port`), so that no other process can start listening there meanwhile."""
    held: list[socket.socket] = []

    def make() -> str:
        held.append(hold_port())
        return f"127.0.0.1:{held[-1].getsockname()[1]}"

    yield make
    for s in held:
        s.close()


@pytest.fixture(scope="session")
def postgres_url() -> str:
    url = os.environ.get("HARNESS_TEST_PG_URL")
    if not url:
        pytest.fail("HARNESS_TEST_PG_URL is not set: run the tests through scripts/test (it starts PostgreSQL)")
    return url


@pytest.fixture
def fresh_pg_url(postgres_url: str) -> Iterator[str]:
    """A PostgreSQL database of its own for one test, dropped afterwards."""
    from services.db import scratch_database

    with scratch_database(postgres_url, "harness_t") as url:
        yield url
