"""Review 19: GetReservation by request id meets a pending reservation as a repeated Reserve does -- ABORTED with
reason RESERVATION_PENDING and a RetryInfo, a leftover (its CRS process gone, or pending past the horizon)
recovered there too -- and NOT_FOUND only when no reservation has the id. The CRS is in-process, its managers
stood in for."""

from __future__ import annotations

import grpc
import pytest
from sqlalchemy import select

from cross_resource_scheduler.models import Compensation, Manager, Reservation
from cross_resource_scheduler.service import Crs, part_request_ids
from harness.v1 import irm_pb2
from services.clock import VirtualClock
from services.errors import RESERVATION_PENDING, RETRY_LATER_S, Aborted, NotFound
from tests.unit.test_crs_reserve import make_crs
from tests.unit.test_crs_review18_owners import dead_owner

START = 1000.0


def _pending(crs: Crs, owner: str, created_at: float) -> None:
    crs.db.transact(lambda s: s.add(Reservation(
        id="crs-p", tenant="t", request_id="r1", state="pending", priority=0, price_per_minute=0.0,
        created_at=created_at, released_at=0.0, allocation=b"", notes=[], owner=owner)))


def _get(crs: Crs, request_id: str = "r1") -> irm_pb2.Reservation:
    return crs.GetReservation(irm_pb2.GetReservationRequest(tenant="t", request_id=request_id), None)


def _compensated(crs: Crs) -> set[str]:
    with crs.db.read() as s:
        return set(s.scalars(select(Compensation.irm_request_id)))


@pytest.fixture
def crs(tmp_path):  # type: ignore[no-untyped-def]
    c = make_crs(tmp_path, VirtualClock(START))
    c.db.transact(lambda s: s.add(Manager(name="m", address="127.0.0.1:1", resource_types=["vm"],
                                          registered_at=0.0)))
    yield c
    c.db.dispose()


def test_a_pending_reservation_of_a_live_process_is_pending_not_absent(crs: Crs) -> None:
    _pending(crs, str(crs.owner), START)
    with pytest.raises(Aborted) as e:
        _get(crs)
    assert e.value.code == grpc.StatusCode.ABORTED
    assert e.value.reason == RESERVATION_PENDING and e.value.retry_after_s is not None
    assert "still being placed" in str(e.value)
    assert _compensated(crs) == set()                   # left to the Reserve placing it
    with pytest.raises(NotFound):
        _get(crs, "r2")


@pytest.mark.parametrize("leftover", ["owner gone", "older than the horizon"])
def test_a_leftover_pending_reservation_is_recovered_by_get_reservation_then_not_found(crs: Crs, leftover: str
                                                                                        ) -> None:
    if leftover == "owner gone":
        _pending(crs, str(dead_owner()), START)
    else:
        _pending(crs, str(crs.owner), START - crs._pending_horizon_s() - 1)
    with pytest.raises(Aborted) as e:
        _get(crs)
    assert (e.value.reason, e.value.retry_after_s) == (RESERVATION_PENDING, RETRY_LATER_S)
    assert "being given back" in str(e.value)
    # What its Reserve may hold at the manager is queued for release, and the row is gone.
    assert _compensated(crs) == set(part_request_ids("crs-p", "m", crs._attempts()))
    with pytest.raises(NotFound):
        _get(crs)
