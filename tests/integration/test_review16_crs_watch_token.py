"""WatchCapacity streams without a tenant are the control plane's (review 16): with a control token, the compute
IRM and the CRS take one only from a caller that sends the token, so tenants leaving the tenant out cannot take the
control-plane slots and lock the CRS out of a manager; the CRS sends its token when it follows a manager."""

from __future__ import annotations

import grpc
import pytest

from cross_resource_scheduler.service import Crs, CrsConfig
from harness.v1 import irm_pb2, irm_pb2_grpc
from irm_compute.service import ComputeConfig, ComputeIrm
from services import control
from services.errors import InvalidArgument, field_violations
from services.watch import CONTROL_STREAMS
from tests.conftest import Suite, eventually

TOKEN = "s3cret"


class Ctx:
    def __init__(self, token: str = "") -> None:
        self.metadata = ((control.METADATA_KEY, token),) if token else ()

    def invocation_metadata(self):  # type: ignore[no-untyped-def]
        return self.metadata

    def is_active(self) -> bool:
        return True


def _refused_without_a_tenant(service: Crs | ComputeIrm) -> None:
    streams = []
    try:
        for token in ("", "guess"):
            for _ in range(CONTROL_STREAMS):
                with pytest.raises(InvalidArgument) as e:
                    next(service.WatchCapacity(irm_pb2.WatchCapacityRequest(), Ctx(token)))
                assert [v.field for v in e.value.violations] == ["tenant"]
                assert "give your tenant" in e.value.message
        tenant = service.WatchCapacity(irm_pb2.WatchCapacityRequest(tenant="alice"), Ctx())
        next(tenant)                                        # a tenant's stream needs no token
        streams.append(tenant)
        # None of the refused ones took a control-plane slot: the control plane still has them all.
        for _ in range(CONTROL_STREAMS):
            s = service.WatchCapacity(irm_pb2.WatchCapacityRequest(), Ctx(TOKEN))
            next(s)
            streams.append(s)
    finally:
        for s in streams:
            s.close()


def test_the_compute_irm_takes_a_stream_without_a_tenant_from_the_control_plane_only(tmp_path) -> None:
    (tmp_path / "hosts.yaml").write_text("hosts:\n  - {id: h1, site: s, rack: r, cores: 4, memory_gb: 8}\n")
    irm = ComputeIrm(ComputeConfig(state_dir=str(tmp_path), inventory=str(tmp_path / "hosts.yaml"),
                                   control_token=TOKEN))
    try:
        _refused_without_a_tenant(irm)
    finally:
        irm.watchers.close()
        irm.db.dispose()


def test_the_crs_takes_a_stream_without_a_tenant_from_the_control_plane_only(tmp_path) -> None:
    crs = Crs(CrsConfig(state_dir=str(tmp_path), control_token=TOKEN))
    try:
        _refused_without_a_tenant(crs)
    finally:
        crs.watchers.close()
        crs.db.dispose()


def test_with_a_control_token_the_crs_follows_the_compute_irm_and_a_caller_without_it_needs_a_tenant(
        tmp_path) -> None:
    s = Suite(str(tmp_path))
    try:
        crs = s.start("crs", heartbeat_interval_s=0.3, control_token=TOKEN)
        compute = s.start("compute", crs_address=crs.address, heartbeat_interval_s=0.3, control_token=TOKEN)
        with grpc.insecure_channel(crs.address) as c1, grpc.insecure_channel(compute.address) as c2:
            at_crs, at_compute = irm_pb2_grpc.ResourceManagerStub(c1), irm_pb2_grpc.ResourceManagerStub(c2)
            hosts = {r.id for r in at_compute.DiscoverResources(irm_pb2.DiscoverResourcesRequest()).resources}
            # Followed: the compute IRM's hosts reach the CRS's view through its watch.
            eventually(lambda: {r.id for r in at_crs.DiscoverResources(
                irm_pb2.DiscoverResourcesRequest()).resources} == hosts, what="the compute IRM's hosts in the CRS")
            for stub in (at_compute, at_crs):
                with pytest.raises(grpc.RpcError) as e:
                    next(stub.WatchCapacity(irm_pb2.WatchCapacityRequest(), timeout=10))
                assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
                assert [f for f, _ in field_violations(e.value)] == ["tenant"]
                watch = stub.WatchCapacity(irm_pb2.WatchCapacityRequest(tenant="alice"), timeout=10)
                assert next(watch).kind in (irm_pb2.CapacityEvent.KIND_SNAPSHOT,
                                            irm_pb2.CapacityEvent.KIND_SNAPSHOT_END)
                watch.cancel()
    finally:
        s.stop_all()


def test_the_fpga_orchestrator_takes_a_stream_without_a_tenant_from_the_control_plane_only(tmp_path) -> None:
    from irm_fpga.orchestrator import Orchestrator, OrchestratorConfig

    # No FPGA-server answers at this address: the snapshot is empty, the admission is what is checked.
    orch = Orchestrator(OrchestratorConfig(state_dir=str(tmp_path), servers=["127.0.0.1:1"], control_token=TOKEN,
                                           autoscaler="none", server_timeout_s=0.5))
    try:
        _refused_without_a_tenant(orch)
    finally:
        orch.stop()


def test_harness_status_says_when_the_crs_cannot_follow_a_managers_capacity(tmp_path) -> None:
    """A CRS without the token of a manager that has one registers it (RegisterManager is the CRS's to check)
    but cannot follow its capacity: ListManagers says why (`follow_error`) and `harness status` makes it a
    problem naming the token, where before the suite looked healthy with an empty view."""
    from harness.v1 import registry_pb2, registry_pb2_grpc
    from services import commands

    s = Suite(str(tmp_path))
    try:
        crs = s.start("crs", heartbeat_interval_s=0.3)                       # no token
        compute = s.start("compute", crs_address=crs.address, heartbeat_interval_s=0.3, control_token=TOKEN)
        with grpc.insecure_channel(crs.address) as ch:
            registry = registry_pb2_grpc.ManagerRegistryStub(ch)

            def follow_error() -> str:
                ms = [m for m in registry.ListManagers(registry_pb2.ListManagersRequest()).managers
                      if m.name == "compute"]
                return ms[0].follow_error if ms else ""

            eventually(lambda: follow_error().startswith("INVALID_ARGUMENT"), what="the CRS's failed follow")
        services = [{"name": "crs", "address": crs.address, "status": "SERVING"},
                    {"name": "compute", "address": compute.address, "status": "SERVING"}]
        report = commands.registrations_of(services, {"crs": crs.address}, grace=0.0)
        assert services[1]["crs_registration"] == "registered"
        (problem,) = report["problems"]
        assert "the CRS cannot follow its capacity (INVALID_ARGUMENT" in problem
        assert "control_token is not the one the manager takes" in problem
    finally:
        s.stop_all()
