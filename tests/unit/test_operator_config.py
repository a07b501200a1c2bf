"""Operator mistakes and the operator's environment: one-line errors with the right status, nothing leaking
into `harness demo`, the suite honouring a configured address, no traceback on a closed pipe."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from services import cli, demo, suite
from services.config import ConfigError, load
from services.launcher import Cancelled


class _FakeProc:
    """A spawned service as `suite.start` sees it, serving at once at the address it was given."""

    def __init__(self, service: str, name: str | None, address: str, **kwargs) -> None:  # type: ignore[no-untyped-def]
        self.name, self.service, self.address, self.kwargs = name or service, service, address, kwargs
        self.proc = type("P", (), {"pid": 1, "args": ["fake", service], "returncode": 0, "poll": lambda s: 0})()
        self.stopped = False

    def wait_ready(self, timeout: float = 60.0, cancel: threading.Event | None = None) -> str:
        return self.address

    def stop(self) -> int:
        self.stopped = True
        return 0

    def alive(self) -> bool:
        return not self.stopped


@pytest.fixture(autouse=True)
def no_serving(monkeypatch: pytest.MonkeyPatch) -> None:
    """`harness serve` in these tests must stop at its checks: serving would be a test that never ends."""
    from services import server

    def serve(*args, **kwargs):  # type: ignore[no-untyped-def]
        raise AssertionError("the service started serving: its configuration was accepted")

    monkeypatch.setattr(server, "serve", serve)


@pytest.fixture
def spawned(monkeypatch: pytest.MonkeyPatch) -> list[_FakeProc]:
    out: list[_FakeProc] = []

    def fake(service: str, *, name: str | None = None, address: str = "", **kwargs):  # type: ignore[no-untyped-def]
        out.append(_FakeProc(service, name, address, **kwargs))
        return out[-1]

    monkeypatch.setattr(suite, "spawn", fake)
    return out


# -- 2: the demo does not use the operator's configuration ---------------------------------------------
def test_demo_services_get_no_operator_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                              spawned: list[_FakeProc]) -> None:
    prod = tmp_path / "prod.yaml"
    prod.write_text("crs:\n  database: sqlite:////nonexistent/production.db\n")
    monkeypatch.setenv("HARNESS_CONFIG", str(prod))
    monkeypatch.setenv("HARNESS_CRS_DATABASE", "sqlite:////nonexistent/production.db")
    monkeypatch.setenv("HARNESS_AM_STATE_DIR", "/nonexistent/am")
    monkeypatch.setattr(demo, "run", lambda console, crs, token="": (_ for _ in ()).throw(KeyboardInterrupt()))
    monkeypatch.delenv("HARNESS_TLS_CA_FILE", raising=False)
    assert demo.main(type("A", (), {"keep": False})()) == 130
    assert spawned, "the demo started no service"
    from services import tls

    assert tls.roots() is None            # the demo suite's CA is not left trusted by this process's channels
    for p in spawned:
        env = p.kwargs.get("environ")
        assert env is not None, f"{p.name} inherits the operator's environment"
        assert not [k for k in env if k == "HARNESS_CONFIG" or k.startswith(("HARNESS_CRS_", "HARNESS_AM_"))]
        assert p.kwargs.get("config_file") is None
        assert "nonexistent" not in json.dumps(p.kwargs.get("settings"))
    assert all(p.stopped for p in spawned)


# -- 3: an address the operator set is honoured, and peers wired to it ----------------------------------
def test_up_honours_a_configured_address(tmp_path: Path, spawned: list[_FakeProc]) -> None:
    conf = tmp_path / "c.yaml"
    conf.write_text("crs:\n  address: 127.0.0.1:47001\n")
    procs = suite.start(str(tmp_path / "s"), auto_ports=True, config_file=str(conf), environ={})
    try:
        by = {p.name: p for p in spawned}
        assert by["crs"].address == "127.0.0.1:47001"
        for peer in ("compute", "fpga", "am"):
            assert by[peer].kwargs["settings"]["crs_address"] == "127.0.0.1:47001"
    finally:
        suite.stop(procs)


def test_up_refuses_a_configured_port_0(tmp_path: Path, spawned: list[_FakeProc]) -> None:
    with pytest.raises(ConfigError, match=r"crs.address '127.0.0.1:0'.*fixed port"):
        suite.start(str(tmp_path / "s"), environ={"HARNESS_CRS_ADDRESS": "127.0.0.1:0"})
    assert spawned == []


def test_start_cancelled_stops_what_it_started(tmp_path: Path, spawned: list[_FakeProc]) -> None:
    cancel = threading.Event()
    with pytest.raises(Cancelled):
        suite.start(str(tmp_path / "s"), auto_ports=True, environ={}, cancel=cancel,
                    on_started=lambda p: cancel.set() if p.name == "compute" else None)
    assert [p.name for p in spawned] == ["crs", "compute"]
    assert all(p.stopped for p in spawned)


# -- 4: intervals ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("service,setting,value", [
    ("crs", "heartbeat_interval_s", "-1"), ("crs", "heartbeat_timeout_s", "-1"), ("crs", "heartbeat_interval_s", "0"),
    ("agent", "sample_interval_s", "0"), ("compute", "heartbeat_interval_s", "nan"),
])
def test_serve_refuses_non_positive_intervals(service: str, setting: str, value: str, tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    rc = cli.main(["serve", service, "--set", f"{setting}={value}", "--set", f"state_dir={tmp_path}"]
                  if service == "crs" else ["serve", service, "--set", f"{setting}={value}"])
    err = capsys.readouterr().err
    assert rc == 2
    # nan is not a number of seconds at all: refused as it is read, before the check of the interval.
    assert setting in err and ("a finite number" if value == "nan" else "more than 0") in err
    assert len(err.strip().splitlines()) == 1


def test_membership_clamps_a_bad_interval() -> None:
    from concurrent import futures

    import grpc

    from harness.v1 import registry_pb2, registry_pb2_grpc
    from services.registration import MIN_INTERVAL_S, Membership, sane_interval

    assert Membership("127.0.0.1:1", "m", "127.0.0.1:2", ["vm"], -1).interval >= MIN_INTERVAL_S
    assert sane_interval(float("nan")) == 2.0

    class Crs(registry_pb2_grpc.ManagerRegistryServicer):     # a CRS that asks for heartbeats every -1 s
        beats = threading.Semaphore(0)

        def RegisterManager(self, request, context):  # noqa: N802, ANN001, ANN201
            return registry_pb2.RegisterManagerResponse(heartbeat_interval_s=-1.0)

        def Heartbeat(self, request, context):  # noqa: N802, ANN001, ANN201
            self.beats.release()
            return registry_pb2.HeartbeatResponse(known=True)

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    registry_pb2_grpc.add_ManagerRegistryServicer_to_server(Crs(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    m = Membership(f"127.0.0.1:{port}", "m", "127.0.0.1:2", ["vm"], 2.0)
    try:
        m.start()
        assert m.registered.wait(10)
        assert m.interval == MIN_INTERVAL_S         # the CRS's -1 s, clamped: no busy loop of heartbeats
        assert Crs.beats.acquire(timeout=10)         # and it goes on beating at that pace
    finally:
        m.stop()
        server.stop(0)


@pytest.mark.parametrize("value", ["localhost", "127.0.0.1:99999", "127.0.0.1:50051,nohost"])
def test_peer_addresses_are_checked(value: str) -> None:
    from irm_compute.service import ComputeConfig

    with pytest.raises(ConfigError, match="compute.crs_address"):
        load(ComputeConfig, "compute", environ={"HARNESS_COMPUTE_CRS_ADDRESS": value})


# -- 5: the CRS topology file -----------------------------------------------------------------------------
@pytest.mark.parametrize("text,expected", [
    ("links: [a: b\n", "is not valid YAML: line"),
    ("- {a: r1, b: r2}\n", "expected a mapping with 'links'"),
    ("link:\n  - {a: r1, b: r2}\n", "unknown key(s) ['link']"),
    ("links:\n  - {a: r1, b: r2, latncy_ms: 3}\n", "links[0]: unknown key(s) ['latncy_ms']"),
    ("links:\n  - [r1, r2]\n", "links[0] must be a mapping"),
    ("links: {a: r1}\n", "links must be a list"),
])
def test_crs_topology_file_errors(text: str, expected: str, tmp_path: Path,
                                  capsys: pytest.CaptureFixture[str]) -> None:
    topo = tmp_path / "topo.yaml"
    topo.write_text(text)
    rc = cli.main(["serve", "crs", "--set", f"topology_file={topo}", "--set", f"state_dir={tmp_path}"])
    err = capsys.readouterr().err
    assert rc == 2
    assert expected in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1


# -- 6: `harness up` reads its config as `harness serve` does, and prints the error whole -------------------
def test_up_bad_config_is_one_plain_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    conf = tmp_path / "c.yaml"
    conf.write_text("crs:\n  filters: [traits, capacity\n")
    rc = cli.main(["up", "--config", str(conf), "--state-dir", str(tmp_path / "s")])
    err = capsys.readouterr().err
    assert rc == 2
    assert f"harness up: config file {conf} is not valid YAML: line 3, column 1: expected ',' or ']'" in err
    assert not (tmp_path / "s" / "processes.json").exists()


# -- 7: a closed pipe ---------------------------------------------------------------------------------------
def test_closed_pipe_is_quiet(tmp_path: Path) -> None:
    state = tmp_path / "s"
    state.mkdir()
    (state / "suite.json").write_text(json.dumps({f"svc{i}": "127.0.0.1:1" for i in range(200)}))
    p = subprocess.Popen([sys.executable, "-m", "services.cli", "status", "--json", "--state-dir", str(state)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert p.stdout is not None
    p.stdout.close()                                   # `| head -0`
    _, err = p.communicate(timeout=60)
    assert p.returncode == 141
    assert err == b""


# -- 8: the compute IRM's inventory -----------------------------------------------------------------------
@pytest.mark.parametrize("data,expected", [
    ({"hosts": [{"id": "h", "cores": 1, "memory_gb": 1, "trait": ["ssd"]}]}, "hosts[0]: unknown key(s) ['trait']"),
    ({"hosts": [{"id": "h", "cores": 1, "memory_gb": 1, "traits": "ssd"}]}, "traits must be a list"),
    ({"host": [{"id": "h", "cores": 1, "memory_gb": 1}]}, "unknown key(s) ['host']"),
    ({"generate": [{"count": 2, "cores": 1, "memory_gb": 1, "rack_per_site": 2}]},
     "generate[0]: unknown key(s) ['rack_per_site']"),
])
def test_inventory_rejects_typos(data: dict, expected: str) -> None:
    from irm_compute.inventory import InventoryError, from_dict

    with pytest.raises(InventoryError) as e:
        from_dict(data)
    assert expected in str(e.value)
