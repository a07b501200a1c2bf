"""Review 19: a Release records each part for the compensator once, by the part's reservation id at its manager
(it wrote a row per request id the part might have had: 9 per part, inserted and deleted on every Release), and
the compensator -- of this CRS or of one started after it died -- gives such a part back by that id. The CRS is
in-process, its managers stood in for."""

from __future__ import annotations

import grpc
import pytest
from sqlalchemy import select

from cross_resource_scheduler.models import Compensation, Reservation
from cross_resource_scheduler.registry import ManagerState
from cross_resource_scheduler.service import Crs, part_request_ids
from harness.v1 import irm_pb2
from services.clock import VirtualClock
from tests.unit.test_crs_reserve import make_crs

START = 1000.0


class _Down(grpc.RpcError):
    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.UNAVAILABLE


class _Killed(BaseException):
    """The CRS process dying where it is raised."""


class _Manager:
    """A manager's stub: records what it is asked; `fail` (an exception) instead of releasing, while set."""

    def __init__(self) -> None:
        self.released: list[str] = []
        self.asked_by_request: list[str] = []
        self.fail: BaseException | None = None

    def ReleaseReservation(self, request, timeout=None):  # noqa: N802, ANN001, ANN201
        if self.fail is not None:
            raise self.fail
        self.released.append(request.reservation_id)
        return irm_pb2.Reservation(id=request.reservation_id, state=irm_pb2.Reservation.STATE_RELEASED)

    def GetReservation(self, request, timeout=None):  # noqa: N802, ANN001, ANN201
        self.asked_by_request.append(request.request_id)
        raise _Down()


def _follow(crs: Crs, managers: dict[str, _Manager]) -> None:
    for name, stub in managers.items():
        state = crs.registry.managers[name] = ManagerState(name, "127.0.0.1:9", ["vm"], crs.clock.now())
        state.stub = lambda stub=stub: stub  # type: ignore[method-assign]


def _active(crs: Crs, res_id: str, parts: list[tuple[str, str]]) -> None:
    alloc = irm_pb2.Reservation(groups=[irm_pb2.AllocatedGroup(name=f"g{i}", manager=m, manager_reservation_id=irm)
                                        for i, (m, irm) in enumerate(parts)]).SerializeToString()
    crs.db.transact(lambda s: s.add(Reservation(
        id=res_id, tenant="t", request_id=f"req-{res_id}", state="active", priority=0, price_per_minute=0.0,
        created_at=START, released_at=0.0, allocation=alloc, notes=[])))


def _rows(crs: Crs) -> list[tuple[str, str, str]]:
    with crs.db.read() as s:
        return sorted((c.manager, c.irm_reservation_id, c.irm_request_id) for c in s.scalars(select(Compensation)))


def _release(crs: Crs, res_id: str) -> irm_pb2.Reservation:
    return crs.ReleaseReservation(irm_pb2.ReleaseReservationRequest(tenant="t", reservation_id=res_id), None)


@pytest.fixture
def crs(tmp_path):  # type: ignore[no-untyped-def]
    c = make_crs(tmp_path, VirtualClock(START))
    yield c
    c.db.dispose()


def test_a_release_records_each_part_once_and_the_compensator_gives_it_back_by_its_id(crs: Crs) -> None:
    m, n = _Manager(), _Manager()
    _follow(crs, {"m": m, "n": n})
    _active(crs, "crs-ok", [("m", "irm-0")])
    assert _release(crs, "crs-ok").state == irm_pb2.Reservation.STATE_RELEASED
    assert m.released == ["irm-0"] and _rows(crs) == []            # given back: nothing left recorded

    # Neither manager answers: each part stays recorded, once, by its id there.
    m.fail = n.fail = _Down()
    _active(crs, "crs-1", [("m", "irm-1"), ("n", "irm-2"), ("m", "irm-1")])   # two groups share m's part
    assert _release(crs, "crs-1").state == irm_pb2.Reservation.STATE_RELEASED
    assert _rows(crs) == [("m", "irm-1", ""), ("n", "irm-2", "")]

    # They answer again: the compensator releases each part by its id, never looking for it by request id.
    m.fail = n.fail = None
    crs._compensate_pending()
    assert (m.released, n.released) == (["irm-0", "irm-1"], ["irm-2"])
    assert m.asked_by_request == n.asked_by_request == []
    assert _rows(crs) == []


def test_a_part_whose_manager_reservation_id_is_unknown_is_looked_for_by_every_request_id(crs: Crs) -> None:
    m = _Manager()
    m.fail = _Down()
    _follow(crs, {"m": m})
    _active(crs, "crs-1", [("m", ""), ("m", "irm-1")])
    _release(crs, "crs-1")
    assert _rows(crs) == sorted([("m", "irm-1", ""),
                                 *(("m", "", rid) for rid in part_request_ids("crs-1", "m", crs._attempts()))])


def test_a_crs_that_died_mid_release_leaves_the_parts_to_the_next_one_which_gives_them_back(tmp_path) -> None:
    clock = VirtualClock(START)
    first = make_crs(tmp_path, clock)
    m = _Manager()
    m.fail = _Killed()                                              # dies while the manager is asked
    _follow(first, {"m": m})
    _active(first, "crs-1", [("m", "irm-1")])
    with pytest.raises(_Killed):
        _release(first, "crs-1")
    first.db.dispose()

    again = make_crs(tmp_path, clock)
    try:
        m.fail = None
        _follow(again, {"m": m})
        got = again.GetReservation(irm_pb2.GetReservationRequest(tenant="t", reservation_id="crs-1"), None)
        assert got.state == irm_pb2.Reservation.STATE_RELEASED
        assert _rows(again) == [("m", "irm-1", "")]
        again._compensate_pending()
        assert m.released == []                                     # not due while a live Release may still ask
        clock.advance(again.config.irm_timeout_s + 11)
        again._compensate_pending()
        assert m.released == ["irm-1"] and m.asked_by_request == []
        assert _rows(again) == []
    finally:
        again.db.dispose()


@pytest.fixture(params=["sqlite", "postgresql"])
def crs_on(request, tmp_path):  # type: ignore[no-untyped-def]
    url = "" if request.param == "sqlite" else request.getfixturevalue("fresh_pg_url")
    c = make_crs(tmp_path, VirtualClock(START), database=url)
    yield c
    c.db.dispose()


def test_a_part_whose_id_at_its_manager_is_long_is_recorded_whole(crs_on: Crs) -> None:
    # The protocol bounds no manager's reservation id: one of 200 characters made the Release's transaction fail on
    # PostgreSQL (the column was VARCHAR(128)) -- the reservation could never be released.
    m = _Manager()
    _follow(crs_on, {"m": m})
    long_id = "irm-" + "x" * 196
    m.fail = _Down()
    _active(crs_on, "crs-long", [("m", long_id)])
    assert _release(crs_on, "crs-long").state == irm_pb2.Reservation.STATE_RELEASED
    assert _rows(crs_on) == [("m", long_id, "")]
    m.fail = None
    crs_on.clock.advance(3600)
    crs_on._compensate_pending()
    assert m.released == [long_id] and _rows(crs_on) == []
