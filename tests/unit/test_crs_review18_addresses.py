"""Review 18: a tenant reading a reservation gets its resources' addresses as their manager gives them now. A
manager that restarted (registered again, or the CRS restarted) may have moved them -- an execution agent on
another port -- and the CRS had recorded them at Reserve. Each manager is asked once per registration: one call
for one reservation, one List for many; a manager that does not answer leaves them as last known, with a note.
In-process CRS; the manager is stood in for."""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import pytest

from cross_resource_scheduler import service as crs_service
from cross_resource_scheduler.models import Reservation
from cross_resource_scheduler.registry import ManagerState
from cross_resource_scheduler.service import Crs
from harness.v1 import irm_pb2
from services.clock import VirtualClock
from tests.unit.test_crs_reserve import make_crs

START = 1000.0
OLD, NEW = "127.0.0.1:1111", "127.0.0.1:2222"


class _Down(grpc.RpcError):
    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.UNAVAILABLE


class Manager:
    """Manager `m`, whose parts' VMs are at NEW now (a restart moved its agent)."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.down = False

    def _part(self, part: str) -> irm_pb2.Reservation:
        return irm_pb2.Reservation(id=part, tenant="t", state=irm_pb2.Reservation.STATE_ACTIVE, groups=[
            irm_pb2.AllocatedGroup(name="g", manager="m", manager_reservation_id=part, resources=[
                irm_pb2.AllocatedResource(id=f"vm-{part}", physical_id="h0", address=NEW)])])

    def GetReservation(self, request, timeout=None):  # noqa: N802, ANN001, ANN201
        self.calls.append(f"get {request.reservation_id}")
        if self.down:
            raise _Down()
        return self._part(request.reservation_id)

    def ListReservations(self, request, timeout=None):  # noqa: N802, ANN001, ANN201
        self.calls.append(f"list {request.tenant}")
        if self.down:
            raise _Down()
        return irm_pb2.ListReservationsResponse(reservations=[self._part(f"irm-{i}") for i in range(5)])


@pytest.fixture
def clock() -> VirtualClock:
    return VirtualClock(START)


@pytest.fixture
def crs(tmp_path, clock: VirtualClock) -> Iterator[Crs]:
    c = make_crs(tmp_path, clock)
    yield c
    c.db.dispose()


@pytest.fixture
def manager(crs: Crs, clock: VirtualClock) -> Manager:
    m = Manager()
    crs.registry.managers["m"] = ManagerState("m", "127.0.0.1:9", ["vm"], clock.now(), _stub=m)  # type: ignore[arg-type]
    return m


def _recorded(crs: Crs, i: int, created_at: float) -> str:
    """An active reservation whose part irm-<i> at m was recorded with its VM at OLD."""
    alloc = irm_pb2.Reservation(groups=[irm_pb2.AllocatedGroup(
        name="g", resource_type="vm", manager="m", manager_reservation_id=f"irm-{i}", resources=[
            irm_pb2.AllocatedResource(id=f"vm-irm-{i}", physical_id="h0", address=OLD)])]).SerializeToString()
    crs.db.transact(lambda s: s.add(Reservation(
        id=f"crs-{i}", tenant="t", request_id=f"r{i}", state="active", priority=0, price_per_minute=0.0,
        created_at=created_at, released_at=0.0, allocation=alloc, notes=[])))
    return f"crs-{i}"


def _get(crs: Crs, res_id: str) -> irm_pb2.Reservation:
    return crs.GetReservation(irm_pb2.GetReservationRequest(tenant="t", reservation_id=res_id), None)


def _addresses(res: irm_pb2.Reservation) -> list[str]:
    return [x.address for g in res.groups for x in g.resources]


def test_a_reservation_from_before_the_restart_shows_where_its_manager_says_its_vms_are_now(
        crs: Crs, manager: Manager) -> None:
    res_id = _recorded(crs, 0, START - 100)
    got = _get(crs, res_id)
    assert _addresses(got) == [NEW] and list(got.notes) == []
    assert manager.calls == ["get irm-0"]
    # Asked once: the next reads cost the manager nothing, and the new address is what the CRS has recorded.
    assert _addresses(_get(crs, res_id)) == [NEW] and manager.calls == ["get irm-0"]
    assert _addresses(crs._to_proto(crs._get("t", res_id))) == [NEW]
    # Registered again (restarted, perhaps moved again): asked again.
    crs._moved("m")
    crs.clock.advance(1)
    _get(crs, res_id)
    assert manager.calls == ["get irm-0", "get irm-0"]


def test_a_list_of_many_asks_the_manager_once_not_once_per_reservation(crs: Crs, manager: Manager) -> None:
    ids = [_recorded(crs, i, START - 100) for i in range(5)]
    listed = crs.ListReservations(irm_pb2.ListReservationsRequest(tenant="t"), None).reservations
    assert sorted(r.id for r in listed) == ids and all(_addresses(r) == [NEW] for r in listed)
    assert manager.calls == ["list t"]
    _get(crs, ids[3])
    crs.ListReservations(irm_pb2.ListReservationsRequest(tenant="t"), None)
    assert manager.calls == ["list t"]


def test_a_reservation_made_since_its_manager_registered_is_not_asked_about(
        crs: Crs, manager: Manager, clock: VirtualClock) -> None:
    crs._moved("m")
    clock.advance(1)
    res_id = _recorded(crs, 0, clock.now())         # answered by the manager as it is now
    assert _addresses(_get(crs, res_id)) == [OLD] and manager.calls == []


def test_a_manager_that_does_not_answer_leaves_the_addresses_as_last_known_with_a_note(
        crs: Crs, manager: Manager, clock: VirtualClock) -> None:
    res_id = _recorded(crs, 0, START - 100)
    manager.down = True
    got = _get(crs, res_id)
    assert _addresses(got) == [OLD]
    [note] = got.notes
    assert "m: the addresses of its resources are as last known (m did not answer (UNAVAILABLE))" in note
    assert "read the reservation again once m is up" in note
    # Not asked again at once: a burst of reads does not wait on it each time.
    assert len(_get(crs, res_id).notes) == 1 and manager.calls == ["get irm-0"]
    clock.advance(crs_service.ADDRESS_RETRY_S + 1)
    manager.down = False
    got = _get(crs, res_id)
    assert _addresses(got) == [NEW] and list(got.notes) == [] and len(manager.calls) == 2


def test_a_manager_marked_down_is_not_called_and_the_read_says_why(crs: Crs, manager: Manager) -> None:
    res_id = _recorded(crs, 0, START - 100)
    crs.registry.managers["m"].up = False
    got = _get(crs, res_id)
    assert _addresses(got) == [OLD] and "(the manager is down)" in got.notes[0]
    assert manager.calls == []


class _Deadline:
    """A call's context with `left` seconds to its deadline."""

    def __init__(self, left: float) -> None:
        self.left = left

    def time_remaining(self) -> float:
        return self.left


class _Late(grpc.RpcError):
    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.DEADLINE_EXCEEDED


def test_a_read_waits_for_another_reads_call_to_the_manager_no_longer_than_its_own_deadline(
        crs: Crs, manager: Manager) -> None:
    import threading

    res_id = _recorded(crs, 0, START - 100)
    w = crs._where("m")
    assert w.lock.acquire()                         # another read's call to a slow manager, in flight
    try:
        got: list[irm_pb2.Reservation] = []
        reader = threading.Thread(target=lambda: got.append(crs.GetReservation(
            irm_pb2.GetReservationRequest(tenant="t", reservation_id=res_id), _Deadline(1.0))))
        reader.start()
        reader.join(10)
        assert not reader.is_alive(), "the read waited on the other one's call beyond its own deadline"
    finally:
        w.lock.release()
    [res] = got
    assert _addresses(res) == [OLD] and "m is slow to answer" in res.notes[0]
    assert manager.calls == []


def test_a_call_cut_short_by_one_readers_near_deadline_does_not_silence_the_manager_for_the_others(
        crs: Crs, manager: Manager) -> None:
    res_id = _recorded(crs, 0, START - 100)

    def late(request, timeout=None):  # noqa: ANN001, ANN202
        manager.calls.append(f"get {request.reservation_id} within {timeout:.2f}")
        raise _Late()
    manager.GetReservation = late  # type: ignore[method-assign]
    hurried = crs.GetReservation(irm_pb2.GetReservationRequest(tenant="t", reservation_id=res_id), _Deadline(0.8))
    assert _addresses(hurried) == [OLD] and "DEADLINE_EXCEEDED" in hurried.notes[0]
    del manager.GetReservation                      # answers again
    assert _addresses(_get(crs, res_id)) == [NEW]   # asked at once, not left silent for ADDRESS_RETRY_S
