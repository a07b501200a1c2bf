"""What a release gives back is free in the CRS's view at once
(cross_resource_scheduler.compensation.Compensator._show_released): a Reserve right after a Release does not wait for the manager's capacity event. In-process CRS and compute IRM
over loopback gRPC; the compute IRM's events held back while the release happens, as on a loaded stream."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from cross_resource_scheduler import service as crs_mod
from cross_resource_scheduler.service import Crs, CrsConfig
from harness.v1 import irm_pb2
from irm_compute import service as comp_mod
from services import server as srv
from tests.conftest import eventually
from tests.integration.test_compute_restart_view import ONE_HOST, whole_host


@pytest.fixture
def cloud(tmp_path) -> Iterator[tuple[Crs, object]]:
    inventory = tmp_path / "hosts.yaml"
    inventory.write_text(ONE_HOST)
    a_run = srv.start("127.0.0.1:0", [crs_mod.component(CrsConfig(
        database=f"sqlite:///{tmp_path}/crs.db", heartbeat_interval_s=0.3, heartbeat_timeout_s=3.0))])
    crs: Crs = a_run.components[0].extra["crs"]
    c_run = srv.start("127.0.0.1:0", [comp_mod.component(comp_mod.ComputeConfig(
        database=f"sqlite:///{tmp_path}/compute.db", state_dir=str(tmp_path), inventory=str(inventory),
        crs_address=f"127.0.0.1:{a_run.port}", heartbeat_interval_s=0.3))])
    irm = c_run.components[0].extra["irm"]

    def synced() -> bool:
        st = crs.registry.get("compute")
        return st is not None and st.up and st.synced.is_set() and "compute/h1" in crs.view.nodes

    eventually(synced, what="the compute IRM's host in the CRS's view")
    yield crs, irm
    c_run.stop(0)
    a_run.stop(0)


def test_a_reserve_right_after_a_release_finds_the_capacity_free(cloud) -> None:
    crs, irm = cloud
    first = crs.Reserve(whole_host("r0"), None)
    node = crs.view.nodes["compute/h1"]
    eventually(lambda: node.used.get("cores") == 4, what="the view to show h1 full")
    held: list = []
    gate = threading.Event()
    publish = irm._publish

    def late_publish(touched):  # type: ignore[no-untyped-def]
        held.append(touched)            # the release's event is on its way, not yet at the CRS
        if gate.is_set():
            publish(touched)

    irm._publish = late_publish
    crs.ReleaseReservation(irm_pb2.ReleaseReservationRequest(tenant="t", reservation_id=first.id), None)
    assert held and node.used.get("cores") == 4       # the view has not heard of the release from the manager
    again = crs.Reserve(whole_host("r1"), None)       # was RESOURCE_EXHAUSTED "capacity is in use"
    assert again.state == irm_pb2.Reservation.STATE_ACTIVE
    # The held events arrive: the view settles on the manager's numbers, no assumption left over.
    gate.set()
    irm._publish = publish
    for touched in held:
        publish(touched)
    eventually(lambda: node.used.get("cores") == 4 and not crs.view._assumptions.get(node.key),
               what="the view to settle on the manager's usage")
    assert node.free("cores") == 0


def test_through_a_crs_below_too(tmp_path) -> None:
    """A CRS above a CRS below the compute IRM: the CRS below passes up, in its release's answer, the generations
    its IRM's release made, and the CRS above frees the host in its view at once (stacking.py)."""
    inventory = tmp_path / "hosts.yaml"
    inventory.write_text(ONE_HOST)
    hb = dict(heartbeat_interval_s=0.3, heartbeat_timeout_s=3.0)
    top_run = srv.start("127.0.0.1:0", [crs_mod.component(CrsConfig(database=f"sqlite:///{tmp_path}/top.db", **hb))])
    top: Crs = top_run.components[0].extra["crs"]
    low_run = srv.start("127.0.0.1:0", [crs_mod.component(CrsConfig(
        database=f"sqlite:///{tmp_path}/low.db", name="low", crs_address=f"127.0.0.1:{top_run.port}", **hb))])
    low: Crs = low_run.components[0].extra["crs"]
    c_run = srv.start("127.0.0.1:0", [comp_mod.component(comp_mod.ComputeConfig(
        database=f"sqlite:///{tmp_path}/compute.db", state_dir=str(tmp_path), inventory=str(inventory),
        crs_address=f"127.0.0.1:{low_run.port}", heartbeat_interval_s=0.3))])
    try:
        eventually(lambda: "low/compute/h1" in top.view.nodes, timeout=30, what="the host seen by the CRS above")
        node = top.view.nodes["low/compute/h1"]
        first = top.Reserve(whole_host("r0"), None)
        eventually(lambda: node.used.get("cores") == 4, what="the CRS above to show h1 full")
        held: list = []
        forward = low.registry.on_change
        low.registry.on_change = lambda manager, ev: held.append((manager, ev))   # events up held back
        top.ReleaseReservation(irm_pb2.ReleaseReservationRequest(tenant="t", reservation_id=first.id), None)
        eventually(lambda: held, what="the release's event at the CRS below, held back")
        assert node.used.get("cores") == 4                # the CRS above has not heard of it from the events
        again = top.Reserve(whole_host("r1"), None)       # was RESOURCE_EXHAUSTED "capacity is in use"
        assert again.state == irm_pb2.Reservation.STATE_ACTIVE
        low.registry.on_change = forward
        for manager, ev in held:
            forward(manager, ev)
        eventually(lambda: node.used.get("cores") == 4 and not top.view._assumptions.get(node.key),
                   what="the CRS above to settle on the manager's usage")
    finally:
        c_run.stop(0)
        low_run.stop(0)
        top_run.stop(0)
