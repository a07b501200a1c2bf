"""Review 15 of the client library against a real Orchestrator: a client revoked, or whose group is deleted,
through the Orchestrator fails each task it submits afterwards with TaskFailed naming the cause; none is left
pending (the part its server refused is gone, and the Orchestrator's refresh says the client is done for).

An in-process FPGA-server and Orchestrator (SQLite), both over gRPC.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from harness.v1 import fpga_pb2, fpga_pb2_grpc
from irm_fpga import orchestrator as orch_mod
from irm_fpga import server as fpga_server
from irm_fpga.client import TaskFailed, VirtualFpga
from services import client as rpc
from services import server as srv
from services.tls import plain_channel
from tests.conftest import eventually


@pytest.fixture
def orchestrator(orchestrator_and_server) -> Iterator[tuple[str, fpga_pb2_grpc.FpgaOrchestratorStub]]:  # type: ignore[no-untyped-def]
    address, stub, _ = orchestrator_and_server
    yield address, stub


@pytest.fixture
def orchestrator_and_server(tmp_path) -> Iterator[tuple[str, fpga_pb2_grpc.FpgaOrchestratorStub, srv.Running]]:
    """The Orchestrator's address and a stub, and its one FPGA-server (fpga-a), which a test may stop."""
    server = srv.start("127.0.0.1:0", [fpga_server.component(fpga_server.FpgaServerConfig(
        name="fpga-a", devices=2, reconfig_mean_s=0.0, reconfig_std_s=0.0))])
    server_address = f"127.0.0.1:{server.port}"
    orch = srv.start("127.0.0.1:0", [orch_mod.component(orch_mod.OrchestratorConfig(
        address="127.0.0.1:0", servers=[server_address], database=f"sqlite:///{tmp_path}/o.db", crs_address="",
        autoscaler="none", reconcile_interval_s=1.0))])
    address = f"127.0.0.1:{orch.port}"
    channel = plain_channel(address)
    try:
        yield address, fpga_pb2_grpc.FpgaOrchestratorStub(channel), server
    finally:
        channel.close()
        orch.stop(0)
        server.stop(0)
        rpc.drop(server_address)


def group(stub: fpga_pb2_grpc.FpgaOrchestratorStub, request_id: str) -> fpga_pb2.FpgaGroup:
    return stub.CreateGroup(fpga_pb2.CreateGroupRequest(tenant="acme", request_id=request_id, design="sleep",
                                                        size=1), timeout=30)


def failures(f: VirtualFpga, n: int) -> list[str]:
    """What n tasks submitted one after the other fail with (one still pending after 10 s fails the test)."""
    out = []
    for _ in range(n):
        e = f.submit({"duration": 0.001}).exception(10)
        assert isinstance(e, TaskFailed), repr(e)
        out.append(str(e))
    return out


def test_a_client_revoked_through_the_orchestrator_fails_each_later_task_saying_so(orchestrator) -> None:  # type: ignore[no-untyped-def]
    address, stub = orchestrator
    g = group(stub, "g1")
    # No refresh rounds: what the client learns, it learns from the server refusing it.
    f = VirtualFpga.attach(address, "acme", g.id, refresh_s=0)
    try:
        assert f.submit({"duration": 0.001}).result(10).server == "fpga-a"
        stub.RevokeClient(fpga_pb2.ClientRequest(tenant="acme", group_id=g.id, client_id=f.client_id), timeout=30)
        said = failures(f, 3)
        assert all("revoked" in s for s in said), said
        assert f.pending() == 0
    finally:
        f.close()


def test_a_client_whose_group_is_deleted_fails_each_later_task_saying_so(orchestrator) -> None:  # type: ignore[no-untyped-def]
    address, stub = orchestrator
    g = group(stub, "g2")
    f = VirtualFpga.attach(address, "acme", g.id)     # refreshing every second, as by default
    try:
        assert f.submit({"duration": 0.001}).result(10).server == "fpga-a"
        assert stub.DeleteGroup(fpga_pb2.DeleteGroupRequest(tenant="acme", group_id=g.id), timeout=30).deleted
        said = failures(f, 3)
        assert all(f"FPGA group {g.id!r} was deleted" in s for s in said), said
        assert f.pending() == 0
    finally:
        f.close()


def test_without_refresh_rounds_a_server_gone_away_fails_each_later_task_instead_of_leaving_it_waiting(
        orchestrator_and_server) -> None:  # type: ignore[no-untyped-def]
    address, stub, server = orchestrator_and_server
    g = group(stub, "g3")
    f = VirtualFpga.attach(address, "acme", g.id, refresh_s=0)
    try:
        assert f.submit({"duration": 0.001}).result(10).server == "fpga-a"
        # As a restart begins: the stream ends UNAVAILABLE, not a refusal of the client, and the Orchestrator,
        # asked where the group is now, cannot reach the server either.
        server.stop(0)
        eventually(lambda: not f._parts and not f._asking, timeout=30, what="the part gone and the Orchestrator asked")
        said = failures(f, 3)
        assert all(f"no part of FPGA group {g.id!r} is left" in s and "refresh_s=0" in s for s in said), said
        assert all("may not have run" not in s for s in said), said
        assert f.pending() == 0
    finally:
        f.close()
