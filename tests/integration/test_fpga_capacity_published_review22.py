"""The CRS learns of an FPGA-server the Orchestrator maps after it started (an operator's review: in compose the
Orchestrator may start before its server, and the CRS then never had the FPGA capacity), and of devices a server
blacklisted by itself. Processes: CRS, Orchestrator, FPGA-servers."""

from __future__ import annotations

import subprocess
import sys

import pytest

from harness.v1 import common_pb2, fpga_pb2, fpga_pb2_grpc, irm_pb2, irm_pb2_grpc
from services.tls import plain_channel
from tests.conftest import eventually, start_again
from tests.integration.test_fpga_group_consistency import FAST


def _offered(crs: irm_pb2_grpc.ResourceManagerStub) -> dict[str, tuple[int, int]]:
    return {r.id: (int(r.capacity["devices"]), int(r.used["devices"]))
            for r in crs.DiscoverResources(irm_pb2.DiscoverResourcesRequest(resource_type="vfpga"),
                                           timeout=10).resources}


def test_a_server_down_when_the_orchestrator_started_reaches_the_crs_once_it_answers(suite):
    crs = suite.start("crs", heartbeat_interval_s=0.3)
    a = suite.start("fpga-server", name="A", **FAST)
    b = suite.start("fpga-server", name="B", **FAST)
    b_address = b.address
    b.stop()
    suite.start("fpga", servers=f"{a.address},{b_address}", crs_address=crs.address, heartbeat_interval_s=0.3,
                autoscaler="none", reconcile_interval_s=0.2, server_timeout_s=1.0)
    c = irm_pb2_grpc.ResourceManagerStub(plain_channel(crs.address))
    eventually(lambda: _offered(c) == {"A": (4, 0)}, what="FPGA-server A in the CRS")
    start_again(lambda: suite.start("fpga-server", name="B", address=b_address, **FAST), "FPGA-server B")
    # Mapped by a reconcile round, with no group on it: nothing was made there, and still the CRS must hear of it.
    eventually(lambda: _offered(c) == {"A": (4, 0), "B": (4, 0)}, what="FPGA-server B in the CRS")
    res = c.Reserve(irm_pb2.ReserveRequest(tenant="t", request_id="r", groups=[irm_pb2.ResourceGroup(
        name="f", resource_type="vfpga", count=2, attributes={"devices": common_pb2.AttributeRequest(number=4),
                    "design": common_pb2.AttributeRequest(text="sleep")})]),
        timeout=60)
    assert sorted(r.physical_id for r in res.groups[0].resources) == ["A", "B"]


def test_a_device_a_server_blacklists_by_itself_leaves_the_crs_view(suite):
    crs = suite.start("crs", heartbeat_interval_s=0.3)
    server = suite.start("fpga-server", name="A", fault_injection=True, **FAST)
    orch = suite.start("fpga", servers=server.address, crs_address=crs.address, heartbeat_interval_s=0.3,
                       autoscaler="none", reconcile_interval_s=0.2)
    c = irm_pb2_grpc.ResourceManagerStub(plain_channel(crs.address))
    eventually(lambda: _offered(c) == {"A": (4, 0)}, what="FPGA-server A in the CRS")
    s = fpga_pb2_grpc.FpgaServerStub(plain_channel(server.address))
    s.InjectFault(fpga_pb2.InjectFaultRequest(device=0, count=100), timeout=10)
    # The group's creation is published at once; device 0 is blacklisted later, by the server, after its failed
    # reconfigurations: no call of the Orchestrator's changes anything then.
    o = fpga_pb2_grpc.FpgaOrchestratorStub(plain_channel(orch.address))
    g = o.CreateGroup(fpga_pb2.CreateGroupRequest(tenant="t", request_id="g", design="sleep", size=4), timeout=30)
    eventually(lambda: any(d.state == fpga_pb2.DeviceInfo.STATE_BLACKLISTED
                           for d in s.GetServer(fpga_pb2.GetServerRequest(), timeout=10).devices),
               what="device 0 blacklisted")
    eventually(lambda: _offered(c) == {"A": (3, 4)}, what="the CRS to see 3 usable devices, 4 held")
    # The group asks for 4 and holds them, but 3 serve it: `active` says so (it said 4, the size).
    eventually(lambda: o.GetGroup(fpga_pb2.GetGroupRequest(tenant="t", group_id=g.id), timeout=10).active == 3,
               what="the group's active devices to be 3")
    again = o.GetGroup(fpga_pb2.GetGroupRequest(tenant="t", group_id=g.id), timeout=10)
    assert (again.size, dict(again.parts)) == (4, {"A": 4})
    listed = o.ListGroups(fpga_pb2.ListGroupsRequest(tenant="t"), timeout=10).groups
    assert [(x.id, x.active) for x in listed] == [(g.id, 3)]




@pytest.mark.parametrize("price", ["-1", "-0.01"])
def test_a_negative_device_price_is_refused_at_start_up(tmp_path, price):
    argv = [sys.executable, "-m", "services.cli", "serve", "fpga", "--address", "127.0.0.1:0",
            "--set", f"state_dir={tmp_path}", "--set", "servers=127.0.0.1:9", "--set", f"price_per_device_minute={price}"]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert out.returncode == 2 and "Traceback" not in out.stderr and out.stderr.count("\n") == 1, out.stderr
    assert (f"price_per_device_minute {float(price)!r}: expected a finite price per minute >= 0"
            in out.stderr), out.stderr
    assert not list(tmp_path.glob("*.db")), "refused before any database was made"
