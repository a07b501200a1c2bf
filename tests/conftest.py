"""Shared fixtures: real service processes, gRPC stubs, a PostgreSQL URL."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from services.launcher import ServiceProcess, spawn
from services.tls import plain_channel


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


class Suite:
    """Processes started by one test; all stopped at the end."""

    def __init__(self, tmp: str) -> None:
        self.tmp = tmp
        self.procs: list[ServiceProcess] = []

    def start(self, service: str, name: str | None = None, address: str = "127.0.0.1:0",
              **settings: Any) -> ServiceProcess:
        import dataclasses

        from services.catalog import SERVICES

        fields = {f.name for f in dataclasses.fields(SERVICES[service].load()[0])}
        if "work_dir" in fields:
            settings.setdefault("work_dir", os.path.join(self.tmp, f"{name or service}-work"))
        if "state_dir" in fields:
            settings.setdefault("state_dir", self.tmp)
        if name and "name" in fields and service in ("compute", "fpga-server"):
            settings.setdefault("name", name)  # the name it registers / reports under
        p = spawn(service, name=name, address=address, settings=settings,
                  log_path=os.path.join(self.tmp, f"{name or service}.log"))
        self.procs.append(p)
        p.wait_ready()
        return p

    def compute_cloud(self, **agent_settings: Any) -> tuple[ServiceProcess, Any]:
        """A CRS, a compute IRM and its agent, started and wired (heartbeats every 0.3 s); returned once the
        compute IRM's hosts are in the CRS: the CRS process and a ResourceManager stub on it."""

        from harness.v1 import irm_pb2, irm_pb2_grpc
        from services.suite import _free_port

        agent_address = f"127.0.0.1:{_free_port()}"
        crs = self.start("crs", heartbeat_interval_s=0.3)
        compute = self.start("compute", crs_address=crs.address, heartbeat_interval_s=0.3,
                             agent_address=agent_address)
        self.start("agent", address=agent_address, compute_address=compute.address, **agent_settings)
        stub = irm_pb2_grpc.ResourceManagerStub(plain_channel(crs.address))
        eventually(lambda: stub.DiscoverResources(irm_pb2.DiscoverResourcesRequest()).resources,
                   what="the compute IRM's hosts in the CRS")
        return crs, stub

    def stop_all(self) -> None:
        for p in reversed(self.procs):
            p.stop()


@pytest.fixture
def suite(tmp_path) -> Iterator[Suite]:
    s = Suite(str(tmp_path))
    yield s
    s.stop_all()


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
