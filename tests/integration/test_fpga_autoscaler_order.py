"""One autoscaler decision that moves a device between two groups of one FPGA-server is applied shrink first.

Real FPGA-servers and the Orchestrator serve on loopback gRPC in this process; the policy is the static one,
told the sizes to reach (the decision under test is the Orchestrator's order of applying them).
"""

from __future__ import annotations

import pytest

from irm_fpga import autoscaler
from irm_fpga import orchestrator as orch_mod
from irm_fpga import server as fserver
from services import server as srv


@pytest.fixture
def make(tmp_path):
    running = []

    def start(servers: int):  # noqa: ANN202
        addrs = []
        for i in range(servers):
            comp = fserver.component(fserver.FpgaServerConfig(name=f"fpga-{i}", devices=4, reconfig_mean_s=0.01,
                                                              reconfig_std_s=0.0))
            r = srv.start("127.0.0.1:0", [comp])
            running.append(r)
            addrs.append(f"127.0.0.1:{r.port}")
        comp = orch_mod.component(orch_mod.OrchestratorConfig(
            address="127.0.0.1:0", database=f"sqlite:///{tmp_path}/orch.db", servers=addrs, autoscaler="static",
            autoscaler_interval_s=3600))
        running.append(srv.start("127.0.0.1:0", [comp]))
        return comp.extra["orchestrator"]

    yield start
    for r in reversed(running):
        r.stop(0.5)


@pytest.mark.parametrize("servers", [1, 2])
def test_a_device_moves_from_one_group_to_another_on_its_server(make, servers):
    orch = make(servers)
    x = orch.create_group("alice", "x", "sleep", 2, min_size=1, max_size=3, elastic=True, pinned=["fpga-0"])
    y = orch.create_group("alice", "y", "fft", 2, min_size=1, max_size=3, elastic=True, pinned=["fpga-0"])
    for name in orch.servers:
        orch.rounds.scalers[name] = autoscaler.Autoscaler(autoscaler.StaticPolicy(
            sizes={x.id: 3, y.id: 1} if name == "fpga-0" else {}))
    orch.autoscale_once()            # the policy's first look
    orch.autoscale_once()            # its decision: x 3, y 1 on fpga-0
    gx, gy = orch._group(x.id), orch._group(y.id)
    # Grown first, x was refused (one server) or spread onto fpga-1 (two), and then pinned there for good.
    assert (gx.size, gy.size) == (3, 1)
    assert {k: v for k, v in gx.parts.items() if v} == {"fpga-0": 3}
