"""A CRS starting on the database of one still winding down (a restart that overlaps the old process): the
new one does not take the old one's Reserves in progress for a crash's leftovers, and should a pending row be
taken anyway, the old one does not answer ACTIVE for a reservation no one knows. In-process CRSs and a compute
IRM over loopback gRPC."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import grpc
import pytest

from cross_resource_scheduler import service as crs_mod
from cross_resource_scheduler.models import Reservation
from cross_resource_scheduler.service import Crs, CrsConfig
from harness.v1 import common_pb2, irm_pb2
from irm_compute import service as comp_mod
from services import server as srv
from services.errors import HarnessError
from tests.conftest import eventually

REQUEST = irm_pb2.ReserveRequest(tenant="alice", request_id="req-1", groups=[irm_pb2.ResourceGroup(
    name="web", resource_type="vm", count=1, attributes={"cores": common_pb2.AttributeRequest(number=1),
                                                         "memory_gb": common_pb2.AttributeRequest(number=1)})])


@pytest.fixture
def old(tmp_path) -> Iterator[tuple[Crs, object, str]]:
    url = f"sqlite:///{tmp_path}/crs.db"
    a_run = srv.start("127.0.0.1:0", [crs_mod.component(CrsConfig(database=url, heartbeat_interval_s=0.3,
                                                                  heartbeat_timeout_s=3.0))])
    crs: Crs = a_run.components[0].extra["crs"]
    c_run = srv.start("127.0.0.1:0", [comp_mod.component(comp_mod.ComputeConfig(
        database=f"sqlite:///{tmp_path}/compute.db", state_dir=str(tmp_path), crs_address=f"127.0.0.1:{a_run.port}",
        heartbeat_interval_s=0.3))])
    irm = c_run.components[0].extra["irm"]

    def synced() -> bool:
        st = crs.registry.get("compute")
        return st is not None and st.up and st.synced.is_set() and bool(st.specs)

    eventually(synced, what="the compute IRM registered and its capacity in the CRS's view")
    yield crs, irm, url
    c_run.stop(0)
    a_run.stop(0)


def reserve_paused_after_delegating(crs: Crs) -> tuple[threading.Thread, dict, threading.Event]:
    """The old CRS's Reserve, stopped once the compute IRM has committed its VM (before the CRS records it)."""
    reached, go = threading.Event(), threading.Event()
    delegate = crs._delegate

    def paused(*a, **kw):  # type: ignore[no-untyped-def]
        out = delegate(*a, **kw)
        reached.set()
        assert go.wait(30)
        return out

    crs._delegate = paused                                  # type: ignore[method-assign]
    box: dict = {}

    def call() -> None:
        try:
            box["reply"] = crs.Reserve(REQUEST, None)
        except HarnessError as e:
            box["error"] = e

    t = threading.Thread(target=call)
    t.start()
    assert reached.wait(30)
    return t, box, go


def test_a_starting_crs_leaves_a_reserve_still_in_progress_alone(old) -> None:
    crs, irm, url = old
    t, box, go = reserve_paused_after_delegating(crs)
    new = Crs(CrsConfig(database=url, heartbeat_interval_s=0.3, heartbeat_timeout_s=3.0))
    try:
        new.start()                                         # its recovery of rows left pending runs first
        go.set()
        t.join(30)
        reply = box["reply"]
        assert reply.state == irm_pb2.Reservation.STATE_ACTIVE
        # Both processes know it, and the VM stays the tenant's.
        got = new.GetReservation(irm_pb2.GetReservationRequest(tenant="alice", reservation_id=reply.id), None)
        assert got.state == irm_pb2.Reservation.STATE_ACTIVE
        assert irm.store.get("alice", reply.groups[0].manager_reservation_id).state == "active"
        assert new.pending_compensations() == 0
    finally:
        go.set()
        new.stop()


def test_a_reserve_whose_pending_row_was_taken_back_is_aborted_and_its_parts_go_back(old) -> None:
    crs, irm, url = old
    t, box, go = reserve_paused_after_delegating(crs)
    new = Crs(CrsConfig(database=url))
    try:
        new._recover()                                      # as if it had waited long enough (a stalled old one)
        go.set()
        t.join(30)
        assert "reply" not in box, box                      # not ACTIVE for an id the database does not have
        error = box["error"]
        assert error.code == grpc.StatusCode.ABORTED and "taken back while it was being placed" in str(error)
        vms, _ = irm.store.list("alice", include_released=True, page_size=100, page_token="")
        assert len(vms) == 1                               # the IRM did commit one VM for it
        eventually(lambda: irm.store.get("alice", vms[0].id).state != "active", what="that VM released")
    finally:
        go.set()
        new.db.dispose()


def test_a_reserve_activated_after_the_recovery_read_it_keeps_its_row_and_its_parts(old) -> None:
    crs, irm, url = old
    t, box, go = reserve_paused_after_delegating(crs)
    new = Crs(CrsConfig(database=url))
    transact = new.db.transact

    def old_activates_first(fn, *a, **kw):  # type: ignore[no-untyped-def]
        go.set()                       # the old process's Reserve activates between the read and the drop
        t.join(30)
        return transact(fn, *a, **kw)

    new.db.transact = old_activates_first                      # type: ignore[method-assign]
    try:
        new._recover()
        reply = box["reply"]
        assert reply.state == irm_pb2.Reservation.STATE_ACTIVE
        got = new.GetReservation(irm_pb2.GetReservationRequest(tenant="alice", reservation_id=reply.id), None)
        assert got.state == irm_pb2.Reservation.STATE_ACTIVE    # its row stands ...
        assert new.pending_compensations() == 0                 # ... and nothing of it is queued for release
        assert irm.store.get("alice", reply.groups[0].manager_reservation_id).state == "active"
    finally:
        go.set()
        new.db.dispose()


def test_a_retry_finds_a_row_left_pending_past_the_horizon_recovered_and_then_places_afresh(old) -> None:
    crs, irm, url = old
    # A row a Reserve left pending when even its clean-up failed (a database that failed), long ago.
    crs.db.transact(lambda s: s.add(Reservation(id="crs-stuck", tenant="alice", request_id="req-1", state="pending",
                                                priority=0, price_per_minute=0.0, created_at=crs.clock.now() - 3600,
                                                released_at=0.0, allocation=b"", notes=[])))
    with pytest.raises(HarnessError) as e:
        crs.Reserve(REQUEST, None)
    assert e.value.code == grpc.StatusCode.ABORTED and "left pending by a Reserve that failed" in str(e.value)
    assert crs.pending_compensations() > 0                       # whatever it may hold goes back
    assert crs.Reserve(REQUEST, None).state == irm_pb2.Reservation.STATE_ACTIVE


def test_a_young_pending_row_is_still_being_placed(old) -> None:
    crs, irm, url = old
    crs.db.transact(lambda s: s.add(Reservation(id="crs-young", tenant="alice", request_id="req-1", state="pending",
                                                priority=0, price_per_minute=0.0, created_at=crs.clock.now(),
                                                released_at=0.0, allocation=b"", notes=[])))
    with pytest.raises(HarnessError) as e:
        crs.Reserve(REQUEST, None)
    assert e.value.code == grpc.StatusCode.ABORTED and "still being placed" in str(e.value)
    assert crs.pending_compensations() == 0
