"""The Orchestrator keeps the FPGA-servers holding what its database says.

Real FPGA-servers and the Orchestrator serve on loopback gRPC in this process. A server that restarts comes
back empty (its state is in memory, like an appliance's); a delete that cannot reach a server leaves its part
there. `reconcile_once` (every `reconcile_interval_s`, and before every placement) mends both.
"""

from __future__ import annotations

import grpc
import pytest

from harness.v1 import fpga_pb2, fpga_pb2_grpc
from irm_fpga import orchestrator as orch_mod
from irm_fpga import server as fserver
from services import server as srv
from services.tls import plain_channel
from tests.conftest import start_again


class Cloud:
    def __init__(self, tmp_path) -> None:  # noqa: ANN001
        self.port = 0                         # any: the first start picks it
        self.server = self._server()
        self.port = self.server.port          # kept across restarts: the Orchestrator's database names it
        comp = orch_mod.component(orch_mod.OrchestratorConfig(
            address="127.0.0.1:0", database=f"sqlite:///{tmp_path}/orch.db", servers=[f"127.0.0.1:{self.port}"],
            autoscaler="none", reconcile_interval_s=0, server_timeout_s=2.0))
        self.orch_run = srv.start("127.0.0.1:0", [comp])
        self.orch = comp.extra["orchestrator"]
        self.stub = fpga_pb2_grpc.FpgaOrchestratorStub(plain_channel(f"127.0.0.1:{self.orch_run.port}"))
        self.data = fpga_pb2_grpc.FpgaServerStub(plain_channel(f"127.0.0.1:{self.port}"))

    def _server(self):  # noqa: ANN202
        comp = fserver.component(fserver.FpgaServerConfig(name="fpga-0", devices=4, reconfig_mean_s=0.01,
                                                          reconfig_std_s=0.0))
        return srv.start(f"127.0.0.1:{self.port}", [comp])

    def restart_server(self) -> None:
        self.server.stop(0.5)
        self.server = start_again(self._server, "the FPGA-server")

    def create(self, rid: str, size: int) -> fpga_pb2.FpgaGroup:
        return self.stub.CreateGroup(fpga_pb2.CreateGroupRequest(tenant="alice", request_id=rid, design="sleep",
                                                                 size=size), timeout=20)

    def held(self) -> dict[str, int]:
        return {p.group_id: p.target for p in self.data.GetServer(fpga_pb2.GetServerRequest(), timeout=5).groups}

    def run_one(self, att: fpga_pb2.AttachClientResponse, group_id: str) -> fpga_pb2.ResultBatch:
        return self.data.RunBatch(fpga_pb2.TaskBatch(client_id=att.client_id, token=att.token, group_id=group_id,
                                                     tasks=[fpga_pb2.Task(id=1, params={
                                                         "duration": fpga_pb2.Value(number=0.001)})]), timeout=10)

    def close(self) -> None:
        self.orch_run.stop(0.5)
        self.server.stop(0.5)


@pytest.fixture
def cloud(tmp_path):
    c = Cloud(tmp_path)
    yield c
    c.close()


def test_a_restarted_server_gets_its_groups_back_and_its_devices_are_not_sold_twice(cloud):
    g = cloud.create("g1", 3)
    att = cloud.stub.AttachClient(fpga_pb2.AttachClientRequest(tenant="alice", group_id=g.id), timeout=10)
    cloud.restart_server()
    assert cloud.held() == {}                              # the appliance came back empty
    # Before any reconciliation the database's 3 devices still count: 4 more do not fit.
    with pytest.raises(grpc.RpcError) as e:
        cloud.create("g2", 4)
    assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert cloud.held() == {g.id: 3}                       # that placement reconciled first
    assert cloud.orch.reconcile_once() == {"made": 0, "dropped": 0}
    out = cloud.run_one(att, g.id)                         # its client is served again, with its token
    assert len(out.results) == 1 and out.results[0].error == ""


def test_a_delete_that_could_not_reach_its_server_is_finished_later(cloud):
    g = cloud.create("g", 2)
    att = cloud.stub.AttachClient(fpga_pb2.AttachClientRequest(tenant="alice", group_id=g.id), timeout=10)
    h = cloud.orch.servers["fpga-0"]
    real, h.address = h.address, "127.0.0.1:9"             # a partition: nothing answers there
    cloud.stub.DeleteGroup(fpga_pb2.DeleteGroupRequest(tenant="alice", group_id=g.id), timeout=30)
    h.address = real
    assert cloud.held() == {g.id: 2}                       # still held, its client still served
    assert cloud.orch.reconcile_once() == {"made": 0, "dropped": 1}
    assert cloud.held() == {}
    with pytest.raises(grpc.RpcError) as e:
        cloud.run_one(att, g.id)
    assert e.value.code() in (grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.NOT_FOUND)
    assert cloud.create("g4", 4).size == 4                 # every device is for sale again


def _named_server(name: str, port: int = 0):  # noqa: ANN202
    comp = fserver.component(fserver.FpgaServerConfig(name=name, devices=4, reconfig_mean_s=0.01, reconfig_std_s=0.0))
    return srv.start(f"127.0.0.1:{port}", [comp])


@pytest.fixture
def two(tmp_path):
    servers = {f"fpga-{i}": _named_server(f"fpga-{i}") for i in range(2)}
    ports = [s.port for s in servers.values()]
    comp = orch_mod.component(orch_mod.OrchestratorConfig(
        address="127.0.0.1:0", database=f"sqlite:///{tmp_path}/orch.db",
        servers=[f"127.0.0.1:{p}" for p in ports], autoscaler="none", reconcile_interval_s=0, server_timeout_s=2.0))
    orch_run = srv.start("127.0.0.1:0", [comp])
    stub = fpga_pb2_grpc.FpgaOrchestratorStub(plain_channel(f"127.0.0.1:{orch_run.port}"))
    yield {"servers": servers, "ports": dict(zip(servers, ports, strict=True)), "orch": comp.extra["orchestrator"],
           "stub": stub}
    orch_run.stop(0.5)
    for s in servers.values():
        s.stop(0.5)


def test_a_group_grows_again_onto_a_restarted_server_where_its_part_had_no_device(two):
    cloud = two
    stub = cloud["stub"]
    g = stub.CreateGroup(fpga_pb2.CreateGroupRequest(tenant="alice", request_id="g", design="sleep", size=5),
                         timeout=20)
    assert sorted(g.parts.values()) == [1, 4]
    g = stub.ResizeGroup(fpga_pb2.ResizeGroupRequest(tenant="alice", group_id=g.id, size=1), timeout=20)
    parts = cloud["orch"]._group(g.id).parts
    (empty,) = [s for s, n in parts.items() if n == 0]        # a part kept with no device (by the database)
    cloud["servers"][empty].stop(0.5)                          # that server restarts (comes back empty)
    cloud["servers"][empty] = start_again(lambda: _named_server(empty, cloud["ports"][empty]), empty)
    cloud["orch"].reconcile_once()                             # "a restarted server gets its groups' parts back"
    # Growing prefers the servers the group has parts on: the emptied one (4 free) first.
    grown = stub.ResizeGroup(fpga_pb2.ResizeGroupRequest(tenant="alice", group_id=g.id, size=3), timeout=20)
    assert sum(grown.parts.values()) == 3
