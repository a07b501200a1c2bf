"""A researcher's filters and weighers in a real CRS process (`harness serve crs`, plug-ins from
tests/crs_plugin_examples.py on PYTHONPATH): they change placement, a bad one stops start-up with one line,
one failing while placing fails that request alone (INTERNAL naming it). And `harness bench crs` runs its
services on its own settings, not the caller's HARNESS_* variables, and records its pipeline."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from harness.v1 import common_pb2, irm_pb2, irm_pb2_grpc
from services.launcher import LaunchError, ServiceProcess, spawn
from services.tls import plain_channel
from tests.conftest import eventually

ROOT = Path(__file__).resolve().parents[2]
EX = "tests.crs_plugin_examples"
DEFAULT_FILTERS = ["traits", "properties", "capacity", "affinity", "distance"]
# The pack weigher alone picks a (the fullest once a 4-core instance lands), then b, then c.
ABC = """
hosts:
  - {id: a, site: s, rack: r1, cores: 4, memory_gb: 32}
  - {id: b, site: s, rack: r1, cores: 8, memory_gb: 32}
  - {id: c, site: s, rack: r1, cores: 16, memory_gb: 32}
"""


class Procs:
    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.started: list[ServiceProcess] = []

    def spawn(self, service: str, name: str, pythonpath: tuple[str, ...] = (), **settings: object) -> ServiceProcess:
        """`harness serve SERVICE`, the repository's root (and `pythonpath`) on its PYTHONPATH, as a plug-in's
        package would be; not waited for."""
        path = [*pythonpath, str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]
        settings.setdefault("state_dir", str(self.tmp / name))  # each its own database
        if service == "compute":
            settings.setdefault("name", name)  # the manager name: node keys are compute/<host>
        p = spawn(service, name=name, settings=settings, env={"PYTHONPATH": os.pathsep.join(path)},
                  log_path=str(self.tmp / f"{name}.log"))
        self.started.append(p)
        return p

    def start(self, service: str, name: str, **settings: object) -> ServiceProcess:
        p = self.spawn(service, name, **settings)
        p.wait_ready()
        return p


@pytest.fixture
def procs(tmp_path) -> Iterator[Procs]:
    p = Procs(tmp_path)
    yield p
    for proc in reversed(p.started):
        proc.stop()


def vm(name: str = "g", count: int = 1, cores: float = 4) -> irm_pb2.ResourceGroup:
    return irm_pb2.ResourceGroup(name=name, resource_type="vm", count=count, attributes={
        "cores": common_pb2.AttributeRequest(number=cores), "memory_gb": common_pb2.AttributeRequest(number=1)})


def stub_of(crs: ServiceProcess) -> irm_pb2_grpc.ResourceManagerStub:
    return irm_pb2_grpc.ResourceManagerStub(plain_channel(crs.address))


def idle(stub: irm_pb2_grpc.ResourceManagerStub) -> bool:
    hosts = stub.DiscoverResources(irm_pb2.DiscoverResourcesRequest()).resources
    return len(hosts) == 3 and all(h.used["cores"] == 0 for h in hosts)


def cloud(procs: Procs, tmp_path: Path, **crss: dict) -> dict[str, irm_pb2_grpc.ResourceManagerStub]:
    """One CRS per entry (name -> its settings) and one compute IRM with hosts a, b, c registered with all."""
    started = {name: procs.start("crs", name, heartbeat_interval_s=0.3, **s) for name, s in crss.items()}
    (tmp_path / "abc.yaml").write_text(ABC)
    procs.start("compute", "compute", inventory=str(tmp_path / "abc.yaml"), heartbeat_interval_s=0.3,
                crs_address=",".join(c.address for c in started.values()))
    stubs = {name: stub_of(crs) for name, crs in started.items()}
    for name, stub in stubs.items():
        eventually(lambda stub=stub: idle(stub), what=f"hosts a, b, c in CRS {name}")
    return stubs


def reserve_one(stubs: dict[str, irm_pb2_grpc.ResourceManagerStub], crs: str, rid: str) -> str:
    """The host CRS `crs` places one 4-core instance on (given back at once, until every CRS sees it free)."""
    stub = stubs[crs]
    r = stub.Reserve(irm_pb2.ReserveRequest(tenant="t", request_id=rid, groups=[vm()]), timeout=30)
    stub.ReleaseReservation(irm_pb2.ReleaseReservationRequest(tenant="t", reservation_id=r.id), timeout=30)
    for name, other in stubs.items():
        eventually(lambda other=other: idle(other), what=f"the hosts free again in CRS {name}")
    (host,) = [x.physical_id for g in r.groups for x in g.resources]
    return host


def test_a_plugin_filter_removes_a_host_and_a_plugin_weigher_changes_the_pick(procs, tmp_path) -> None:
    stubs = cloud(procs, tmp_path,
                  plain={},
                  filtered={"filters": [*DEFAULT_FILTERS, f"{EX}:AvoidHostA"]},
                  weighed={"weighers": {"pack": 1.0, f"{EX}:PreferHostC": 10.0}})
    assert reserve_one(stubs, "plain", "p1") == "a"
    assert reserve_one(stubs, "filtered", "f1") == "b"
    assert reserve_one(stubs, "weighed", "w1") == "c"
    # A refusal says what the plug-in removed, by its name; without it the three hosts would hold the three.
    with pytest.raises(grpc.RpcError) as caught:
        stubs["filtered"].Reserve(irm_pb2.ReserveRequest(
            tenant="t", request_id="f2", groups=[vm(count=3, cores=1)],
            constraints=[irm_pb2.GroupConstraint(expression="different_host(g, g)")]), timeout=30)
    assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "avoid_a removed 1" in caught.value.details()


def test_a_plugin_failing_while_placing_is_internal_naming_it_and_the_crs_keeps_serving(procs, tmp_path) -> None:
    stubs = cloud(procs, tmp_path, crs={"filters": [*DEFAULT_FILTERS, f"{EX}:Moody"],
                                        "weighers": {"pack": 1.0, f"{EX}:Wonky": 1.0}})
    stub = stubs["crs"]

    def refusal(group: str, rid: str) -> str:
        with pytest.raises(grpc.RpcError) as caught:
            stub.Reserve(irm_pb2.ReserveRequest(tenant="t", request_id=rid, groups=[vm(group)]), timeout=30)
        assert caught.value.code() == grpc.StatusCode.INTERNAL, caught.value.details()
        return caught.value.details()

    said = refusal("boom", "r-boom")
    assert said.startswith(f"the CRS's filter plug-in 'moody' ({EX}:Moody) raised RuntimeError: the moody filter "
                           "broke (while checking compute/"), said
    # The same request again: refused the same way (its claim was dropped, not left "still being placed").
    assert refusal("boom", "r-boom").split(" (while")[0] == said.split(" (while")[0]
    assert "raised SystemExit: 3 (while checking" in refusal("exit", "r-exit")
    # No Exception: gRPC's worker let the request hang to its deadline, logging nothing.
    assert "raised OwnBase: not an Exception (while checking" in refusal("base", "r-base")
    huge = refusal("huge", "r-huge")
    assert "raised ValueError: xxxx" in huge and len(huge) < 600
    assert f"weigher plug-in 'wonky' ({EX}:Wonky) scored nan for compute/" in refusal("nan", "r-nan")
    with pytest.raises(grpc.RpcError) as caught:
        stub.QuotePrice(irm_pb2.QuotePriceRequest(tenant="t", groups=[vm("boom")]), timeout=30)
    assert caught.value.code() == grpc.StatusCode.INTERNAL and "'moody'" in caught.value.details()
    # Still serving, nothing held for the failed requests, and what they placed left nothing assumed: the
    # pack weigher's first choice, the 4-core host, is free for the next request.
    ok = stub.Reserve(irm_pb2.ReserveRequest(tenant="t", request_id="r-ok", groups=[vm("ok")]), timeout=30)
    assert [x.physical_id for g in ok.groups for x in g.resources] == ["a"]
    held = stub.ListReservations(irm_pb2.ListReservationsRequest(tenant="t")).reservations
    assert [r.request_id for r in held] == ["r-ok"]
    assert procs.started[0].alive()
    log = (tmp_path / "crs.log").read_text()  # the operator's: the traceback
    assert "placement plug-in failed" in log and "RuntimeError: the moody filter broke" in log


@pytest.mark.parametrize(("module", "filters", "said"), [
    (None, f"capacity,{EX}:NotAFilter",
     f"harness serve crs: cannot start: crs configuration: filter '{EX}:NotAFilter': <class '{EX}.NotAFilter'> "
     "is not a subclass of cross_resource_scheduler.plugins.Filter"),
    ("import sys\nsys.exit(7)\n", "capacity,crs_exiting_plugin:F",
     "harness serve crs: cannot start: crs configuration: filter 'crs_exiting_plugin:F': loading "
     "crs_exiting_plugin:F raised SystemExit: 7; fix it, or drop it from the CRS's `filters` setting"),
])
def test_serve_crs_refuses_a_bad_plugin_at_start_up_in_one_line(procs, tmp_path, module, filters, said) -> None:
    if module:
        (tmp_path / "crs_exiting_plugin.py").write_text(module)
    crs = procs.spawn("crs", "crs", pythonpath=(str(tmp_path),), filters=filters)
    with pytest.raises(LaunchError):
        crs.wait_ready()  # returns once the process's stderr is read to its end
    assert crs.proc.returncode == 2
    lines = [line for line in crs.logs().splitlines() if line.strip()]
    assert lines == [said]


def test_bench_crs_ignores_harness_variables_and_records_its_pipeline(monkeypatch, capsys, tmp_path) -> None:
    import bench.crs

    # Either would stop the bench's CRS from starting, were the services to take the caller's environment.
    # PYTHONPATH is no setting: it reaches them (the plug-in below is found through it).
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]))
    monkeypatch.setenv("HARNESS_CRS_FILTERS", "capacity,no_such_filter")
    monkeypatch.setenv("HARNESS_CONFIG", str(tmp_path / "missing.yaml"))
    spawned: list[tuple[str, dict, dict | None]] = []

    def recording_spawn(service: str, **kw):
        spawned.append((service, dict(kw.get("settings") or {}), kw.get("environ")))
        return spawn(service, **kw)

    monkeypatch.setattr(bench.crs, "spawn", recording_spawn)
    filters, weighers = ["capacity", "affinity", "distance", f"{EX}:AvoidHostA"], {"spread": 1.5}
    rc = bench.crs.main(["--quick", "--json", "--hosts", "4", "--clients", "2", "--reservations", "2",
                         "--filters", ",".join(filters), "--weighers", "spread=1.5"])
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    assert out["pipeline"] == {"filters": filters, "weighers": weighers}
    assert out["errors"] == 0 and out["reservations"] > 0
    assert [s for s, _, _ in spawned] == ["crs", "compute"]
    crs_settings = spawned[0][1]
    assert (crs_settings["filters"], crs_settings["weighers"]) == (filters, weighers)
    for service, _, environ in spawned:
        assert environ is not None and not [k for k in environ if k.startswith("HARNESS_")], service
