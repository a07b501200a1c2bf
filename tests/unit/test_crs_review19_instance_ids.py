"""Review 19: a manager registering again without restarting (after missed heartbeats, a network blip) keeps what
the CRS learned from it about where its resources are; only a restarted one -- a new instance id in its
RegisterManager, or none from a manager older than the field -- is asked again. Each reset cost every tenant's next
read a call at the manager. In-process CRS, the manager stood in for (its calls counted); services.registration's
Membership against a stand-in CRS (the registrations it sends recorded)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent import futures

import grpc
import pytest

from cross_resource_scheduler.registry import ManagerState
from cross_resource_scheduler.service import MAX_INSTANCE_ID, Crs
from harness.v1 import irm_pb2, registry_pb2, registry_pb2_grpc
from services.clock import VirtualClock
from services.errors import InvalidArgument
from services.registration import Membership
from tests.unit.test_crs_reserve import make_crs
from tests.unit.test_crs_review18_addresses import NEW, OLD, Manager, _addresses, _get, _recorded

START = 1000.0
AT = "127.0.0.1:9"


@pytest.fixture
def crs(tmp_path) -> Iterator[Crs]:
    c = make_crs(tmp_path, VirtualClock(START))
    yield c
    c.db.dispose()


@pytest.fixture
def manager(crs: Crs, monkeypatch) -> Manager:
    """Manager `m`, whose VMs are at NEW now; registering it puts the stand-in in the registry (no stream
    followed)."""
    m = Manager()

    def register(name: str, address: str, resource_types: list[str]) -> ManagerState:
        state = crs.registry.managers[name] = ManagerState(name, address, resource_types, crs.clock.now(),
                                                           _stub=m)  # type: ignore[arg-type]
        return state

    monkeypatch.setattr(crs.registry, "register", register)
    return m


def _register(crs: Crs, instance_id: str, address: str = AT) -> None:
    crs.RegisterManager(registry_pb2.RegisterManagerRequest(name="m", address=address, resource_types=["vm"],
                                                            instance_id=instance_id), None)
    crs.clock.advance(1)  # type: ignore[attr-defined]


def _read_once(crs: Crs, manager: Manager) -> str:
    """A reservation from before m registered, read: m is asked where its VM is (once)."""
    res_id = _recorded(crs, 0, START - 100)
    assert _addresses(_get(crs, res_id)) == [NEW] and manager.calls == ["get irm-0"]
    return res_id


def test_a_manager_registering_again_as_the_same_instance_is_not_asked_again(crs: Crs, manager: Manager) -> None:
    _register(crs, "i-1")
    res_id = _read_once(crs, manager)
    _register(crs, "i-1")                              # a heartbeat missed, say: the same process again
    _register(crs, "i-1")
    assert _addresses(_get(crs, res_id)) == [NEW]
    assert manager.calls == ["get irm-0"]              # what it said still stands: no call for it

    # Many of a tenant's reservations: not listed again either.
    for i in range(1, 5):
        _recorded(crs, i, START - 100)
    crs.ListReservations(irm_pb2.ListReservationsRequest(tenant="t"), None)
    assert manager.calls == ["get irm-0", "list t"]
    _register(crs, "i-1")
    listed = crs.ListReservations(irm_pb2.ListReservationsRequest(tenant="t"), None).reservations
    assert all(_addresses(r) == [NEW] for r in listed) and manager.calls == ["get irm-0", "list t"]


def test_a_manager_registering_as_a_new_instance_is_asked_again(crs: Crs, manager: Manager) -> None:
    _register(crs, "i-1")
    res_id = _read_once(crs, manager)
    _register(crs, "i-2")                              # restarted: its VMs may be elsewhere now
    _get(crs, res_id)
    assert manager.calls == ["get irm-0", "get irm-0"]
    _register(crs, "i-2")
    _get(crs, res_id)
    assert manager.calls == ["get irm-0", "get irm-0"]


def test_a_manager_sending_no_instance_id_is_asked_again_after_each_registration(
        crs: Crs, manager: Manager) -> None:
    _register(crs, "")                                 # a manager older than instance_id: as before it
    res_id = _read_once(crs, manager)
    _register(crs, "")
    _get(crs, res_id)
    assert manager.calls == ["get irm-0", "get irm-0"]
    _register(crs, "i-1")                              # upgraded: a new instance
    _get(crs, res_id)
    assert len(manager.calls) == 3
    _register(crs, "")                                 # ... and downgraded again
    _get(crs, res_id)
    assert len(manager.calls) == 4


def test_the_same_instance_id_at_another_address_is_asked_again(crs: Crs, manager: Manager) -> None:
    _register(crs, "i-1")
    res_id = _read_once(crs, manager)
    _register(crs, "i-1", address="127.0.0.1:10")      # not the process it was (or a copy of its id): moved
    _get(crs, res_id)
    assert manager.calls == ["get irm-0", "get irm-0"]


def test_a_manager_that_did_not_answer_and_registers_again_is_asked_at_once(crs: Crs, manager: Manager) -> None:
    _register(crs, "i-1")
    res_id = _recorded(crs, 0, START - 100)
    manager.down = True                                # a network blip: the read cannot ask it
    assert _addresses(_get(crs, res_id)) == [OLD] and manager.calls == ["get irm-0"]
    manager.down = False
    _register(crs, "i-1")                              # ... which cost it a heartbeat: it is back
    got = _get(crs, res_id)
    assert _addresses(got) == [NEW] and list(got.notes) == []
    assert manager.calls == ["get irm-0", "get irm-0"]


def test_an_instance_id_too_long_is_invalid_and_named(crs: Crs, manager: Manager) -> None:
    with pytest.raises(InvalidArgument) as e:
        crs.RegisterManager(registry_pb2.RegisterManagerRequest(
            name="m", address=AT, resource_types=["vm"], instance_id="x" * (MAX_INSTANCE_ID + 1)), None)
    assert [v.field for v in e.value.violations] == ["instance_id"]
    assert f"at most {MAX_INSTANCE_ID} characters" in e.value.message
    assert crs.registry.get("m") is None
    _register(crs, "x" * MAX_INSTANCE_ID)
    assert crs.registry.get("m") is not None


class _Crs(registry_pb2_grpc.ManagerRegistryServicer):
    """A stand-in CRS recording the registrations; it forgets each manager after its first heartbeat (the
    manager registers again, as after a missed heartbeat)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.ids: list[str] = []
        self.twice = threading.Event()

    def RegisterManager(self, request, context):  # noqa: N802, ANN001, ANN201
        with self.lock:
            self.ids.append(request.instance_id)
            if len(self.ids) >= 2:
                self.twice.set()
        return registry_pb2.RegisterManagerResponse(heartbeat_interval_s=0.05)

    def Heartbeat(self, request, context):  # noqa: N802, ANN001, ANN201
        return registry_pb2.HeartbeatResponse(known=False)


@pytest.fixture
def stand_in_crs() -> Iterator[tuple[str, _Crs]]:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    servicer = _Crs()
    registry_pb2_grpc.add_ManagerRegistryServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield f"127.0.0.1:{port}", servicer
    server.stop(None)


def _registrations(crs_address: str, servicer: _Crs) -> list[str]:
    """The instance ids of a new Membership's first two registrations (the second after the CRS forgot it)."""
    m = Membership(crs_address, "m", AT, ["vm"], heartbeat_interval_s=0.05)
    m.start()
    try:
        assert servicer.twice.wait(20), "the manager did not register again once the CRS forgot it"
    finally:
        m.stop()
    with servicer.lock:
        ids, servicer.ids = servicer.ids[:2], []
        servicer.twice.clear()
    return ids


def test_a_membership_registers_again_as_the_same_instance_and_a_new_one_as_another(
        stand_in_crs: tuple[str, _Crs]) -> None:
    address, servicer = stand_in_crs
    first = _registrations(address, servicer)
    assert first[0] and first == [first[0]] * 2        # one id, sent each time it registers
    restarted = _registrations(address, servicer)      # the manager started again (in this process, even)
    assert restarted[0] and restarted == [restarted[0]] * 2 and restarted[0] != first[0]
    assert len(first[0]) <= MAX_INSTANCE_ID
