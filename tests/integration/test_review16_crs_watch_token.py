"""WatchCapacity streams without a tenant (review 16): the control plane's reserved slots are taken only by a
caller that sends the control token (the CRS does when it follows a manager), so tenants leaving the tenant out
cannot lock the CRS out of a manager; a tenant-less stream without the token is still served, as a tenant's (a
CRS without the manager's token follows it as before). And `harness status` says when the CRS cannot follow a
manager's capacity."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from cross_resource_scheduler.service import Crs, CrsConfig
from harness.v1 import irm_pb2, irm_pb2_grpc
from irm_compute.service import ComputeConfig, ComputeIrm
from services import control
from services.errors import STREAM_CAP, ResourceExhausted
from services.tls import plain_channel
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


def _control_slots_kept_for_the_token(service: Crs | ComputeIrm) -> None:
    """Streams without a tenant that do not send the token are served, as an anonymous tenant's: none of them
    takes one of the control plane's slots, which a caller with the token still finds all free."""
    streams = []
    try:
        for token in ("", "guess"):
            for _ in range(CONTROL_STREAMS // 2):
                s = service.WatchCapacity(irm_pb2.WatchCapacityRequest(), Ctx(token))
                next(s)                                     # served: a CRS without the token still follows
                streams.append(s)
        assert service.watchers._open[control.ANONYMOUS_WATCHER] == CONTROL_STREAMS
        tenant = service.WatchCapacity(irm_pb2.WatchCapacityRequest(tenant="alice"), Ctx())
        next(tenant)                                        # a tenant's stream needs no token
        streams.append(tenant)
        for _ in range(CONTROL_STREAMS):
            s = service.WatchCapacity(irm_pb2.WatchCapacityRequest(), Ctx(TOKEN))
            next(s)
            streams.append(s)
        assert service.watchers._open[""] == CONTROL_STREAMS
    finally:
        for s in streams:
            s.close()


def test_the_compute_irm_takes_a_stream_without_a_tenant_from_the_control_plane_only(tmp_path) -> None:
    (tmp_path / "hosts.yaml").write_text("hosts:\n  - {id: h1, site: s, rack: r, cores: 4, memory_gb: 8}\n")
    irm = ComputeIrm(ComputeConfig(state_dir=str(tmp_path), inventory=str(tmp_path / "hosts.yaml"),
                                   control_token=TOKEN))
    try:
        _control_slots_kept_for_the_token(irm)
    finally:
        irm.watchers.close()
        irm.db.dispose()


def test_the_crs_takes_a_stream_without_a_tenant_from_the_control_plane_only(tmp_path) -> None:
    crs = Crs(CrsConfig(state_dir=str(tmp_path), control_token=TOKEN))
    try:
        _control_slots_kept_for_the_token(crs)
    finally:
        crs.watchers.close()
        crs.db.dispose()


@contextmanager
def _followed(tmp_path, crs_token: str) -> Iterator[tuple]:  # type: ignore[no-untyped-def]
    """A CRS (with `crs_token`) and a compute IRM with TOKEN as processes, once the IRM's hosts reached the CRS's
    view through its watch: the two ResourceManager stubs (CRS, compute IRM)."""
    s = Suite(str(tmp_path))
    try:
        crs = s.start("crs", heartbeat_interval_s=0.3, control_token=crs_token)
        compute = s.start("compute", crs_address=crs.address, heartbeat_interval_s=0.3, control_token=TOKEN)
        with plain_channel(crs.address) as c1, plain_channel(compute.address) as c2:
            at_crs, at_compute = irm_pb2_grpc.ResourceManagerStub(c1), irm_pb2_grpc.ResourceManagerStub(c2)
            hosts = {r.id for r in at_compute.DiscoverResources(irm_pb2.DiscoverResourcesRequest()).resources}
            eventually(lambda: {r.id for r in at_crs.DiscoverResources(
                irm_pb2.DiscoverResourcesRequest()).resources} == hosts, what="the compute IRM's hosts in the CRS")
            yield at_crs, at_compute
    finally:
        s.stop_all()


def test_with_a_control_token_the_crs_follows_the_compute_irm_and_a_caller_without_it_is_a_tenant(
        tmp_path) -> None:
    with _followed(tmp_path, TOKEN) as (at_crs, at_compute):
        for stub in (at_compute, at_crs):
            for request in (irm_pb2.WatchCapacityRequest(), irm_pb2.WatchCapacityRequest(tenant="alice")):
                watch = stub.WatchCapacity(request, timeout=10)
                assert next(watch).kind in (irm_pb2.CapacityEvent.KIND_SNAPSHOT,
                                            irm_pb2.CapacityEvent.KIND_SNAPSHOT_END)
                watch.cancel()


def test_a_crs_without_the_managers_token_still_follows_it(tmp_path) -> None:
    """What the first cut of this change broke: a CRS with no control token (an older CRS, a suite whose CRS has
    none) registered a compute IRM with one but could not follow its capacity, and placed nothing there."""
    with _followed(tmp_path, ""):
        pass                                            # followed: the IRM's hosts reached the CRS's view


def test_the_fpga_orchestrator_takes_a_stream_without_a_tenant_from_the_control_plane_only(tmp_path) -> None:
    from irm_fpga.orchestrator import Orchestrator, OrchestratorConfig

    # No FPGA-server answers at this address: the snapshot is empty, the admission is what is checked.
    orch = Orchestrator(OrchestratorConfig(state_dir=str(tmp_path), servers=["127.0.0.1:1"], control_token=TOKEN,
                                           autoscaler="none", server_timeout_s=0.5))
    try:
        _control_slots_kept_for_the_token(orch)
    finally:
        orch.stop()


def test_harness_status_says_when_the_crs_cannot_follow_a_managers_capacity(tmp_path) -> None:
    """A manager whose WatchCapacity fails is registered and up, but the CRS places nothing there: ListManagers
    says why (`follow_error`) and `harness status` makes it a problem, where before the suite looked healthy."""
    from harness.v1 import registry_pb2, registry_pb2_grpc
    from services import commands
    from tests.integration.standin_manager import Standin

    s = Suite(str(tmp_path))
    standin = None
    try:
        crs = s.start("crs", heartbeat_interval_s=0.3)
        standin = Standin(str(tmp_path), crs.address, "gadgets", watch_error="capacity feed is down")
        with plain_channel(crs.address) as ch:
            registry = registry_pb2_grpc.ManagerRegistryStub(ch)

            def follow_error() -> str:
                ms = [m for m in registry.ListManagers(registry_pb2.ListManagersRequest()).managers
                      if m.name == "gadgets"]
                return ms[0].follow_error if ms else ""

            eventually(lambda: follow_error() == "FAILED_PRECONDITION: capacity feed is down",
                       what="the CRS's failed follow")
        services = [{"name": "crs", "address": crs.address, "status": "SERVING"},
                    {"name": "compute", "address": standin.address, "status": "SERVING"}]
        report = commands.registrations_of(services, {"crs": crs.address}, grace=0.0)
        assert services[1]["crs_registration"] == "registered"
        (problem,) = report["problems"]
        assert f"compute at {standin.address} is registered with the CRS at {crs.address} as 'gadgets' at " \
               f"{standin.address}, but the CRS cannot follow its capacity (FAILED_PRECONDITION: capacity feed is " \
               "down)" in problem
    finally:
        if standin is not None:
            standin.kill()
        s.stop_all()


def test_one_tenant_holds_at_most_two_capacity_watches_and_cannot_lock_the_others_out(tmp_path) -> None:
    # Eight streams of one tenant took every slot of a CRS (a polyglot tenant's review).
    from services.watch import CAPACITY_WATCHES_PER_TENANT

    (tmp_path / "hosts.yaml").write_text("hosts:\n  - {id: h1, site: s, rack: r, cores: 4, memory_gb: 8}\n")
    irm = ComputeIrm(ComputeConfig(state_dir=str(tmp_path), inventory=str(tmp_path / "hosts.yaml")))
    (tmp_path / "crs").mkdir()
    crs = Crs(CrsConfig(state_dir=str(tmp_path / "crs")))
    streams = []
    try:
        for service in (crs, irm):
            for _ in range(CAPACITY_WATCHES_PER_TENANT):
                s = service.WatchCapacity(irm_pb2.WatchCapacityRequest(tenant="greedy"), Ctx())
                next(s)
                streams.append(s)
            one_more = service.WatchCapacity(irm_pb2.WatchCapacityRequest(tenant="greedy"), Ctx())
            with pytest.raises(ResourceExhausted) as e:
                next(one_more)
            assert e.value.reason == STREAM_CAP and "close one of your WatchCapacity streams" in e.value.message
            other = service.WatchCapacity(irm_pb2.WatchCapacityRequest(tenant="other"), Ctx())
            next(other)                                     # another tenant still finds a slot
            streams.append(other)
    finally:
        for s in streams:
            s.close()
        irm.watchers.close()
        irm.db.dispose()
        crs.db.dispose()


def test_callers_naming_no_tenant_hold_at_most_half_the_capacity_watches(tmp_path) -> None:
    # Without a cap of their own, anyone leaving the tenant out (no token needed) took all 8 slots.
    from services.watch import MAX_STREAMS

    (tmp_path / "hosts.yaml").write_text("hosts:\n  - {id: h1, site: s, rack: r, cores: 4, memory_gb: 8}\n")
    irm = ComputeIrm(ComputeConfig(state_dir=str(tmp_path), inventory=str(tmp_path / "hosts.yaml"),
                                   control_token=TOKEN))
    streams = []
    try:
        for _ in range(MAX_STREAMS // 2):
            s = irm.WatchCapacity(irm_pb2.WatchCapacityRequest(), Ctx())
            next(s)
            streams.append(s)
        with pytest.raises(ResourceExhausted) as e:
            next(irm.WatchCapacity(irm_pb2.WatchCapacityRequest(), Ctx()))
        assert e.value.reason == STREAM_CAP and "callers naming no tenant already hold 4" in e.value.message
        for i in range(MAX_STREAMS // 2):                  # the tenants keep the rest
            s = irm.WatchCapacity(irm_pb2.WatchCapacityRequest(tenant=f"t{i}"), Ctx())
            next(s)
            streams.append(s)
    finally:
        for s in streams:
            s.close()
        irm.watchers.close()
        irm.db.dispose()
