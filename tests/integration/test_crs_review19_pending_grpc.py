"""Review 19: a reservation still being placed is told apart from one never placed. GetReservation by request id
answered NOT_FOUND for a pending reservation: the Application Manager, asking whether a Reserve it is in doubt
about was placed, took "still being placed" for "never placed". Now it is ABORTED with reason RESERVATION_PENDING
and a RetryInfo, as a Reserve repeated under the id is. A real CRS process, a stand-in manager holding the Reserve
in flight until the test lets it commit."""

from __future__ import annotations

import grpc
import pytest

from harness.v1 import irm_pb2
from services.errors import RESERVATION_PENDING, error_info, retry_delay_s
from tests.conftest import eventually
from tests.integration.standin_manager import crs_with_a_gated_standin, gadget

REQUEST = irm_pb2.ReserveRequest(tenant="t", request_id="r1", groups=[gadget(units=1)])


def _refused(call, request) -> grpc.RpcError:  # type: ignore[no-untyped-def]
    with pytest.raises(grpc.RpcError) as e:
        call(request, timeout=10)
    return e.value


def test_get_reservation_by_request_id_says_pending_while_it_is_placed_then_answers_it(suite, tmp_path) -> None:
    with crs_with_a_gated_standin(suite, tmp_path) as (stub, gate, slow):
        by_request = irm_pb2.GetReservationRequest(tenant="t", request_id="r1")
        placing = stub.Reserve.future(REQUEST, timeout=30)
        eventually(lambda: "Reserve crs-" in (tmp_path / "slow.standin.log").read_text(),
                   what="the CRS's Reserve waiting at the manager")

        for call, request in ((stub.GetReservation, by_request), (stub.Reserve, REQUEST)):
            e = _refused(call, request)
            assert e.code() == grpc.StatusCode.ABORTED, e.details()
            assert "still being placed" in e.details()
            assert error_info(e) == (RESERVATION_PENDING, {})
            delay = retry_delay_s(e)
            assert delay is not None and 0 < delay <= 5
        # Another tenant's request id, and one never used, are not found.
        assert _refused(stub.GetReservation, irm_pb2.GetReservationRequest(tenant="u", request_id="r1")).code() \
            == grpc.StatusCode.NOT_FOUND
        assert _refused(stub.GetReservation, irm_pb2.GetReservationRequest(tenant="t", request_id="r9")).code() \
            == grpc.StatusCode.NOT_FOUND

        gate.write_text("")
        placed = placing.result(timeout=30)
        assert placed.state == irm_pb2.Reservation.STATE_ACTIVE
        got = stub.GetReservation(by_request, timeout=10)
        assert (got.id, got.state) == (placed.id, irm_pb2.Reservation.STATE_ACTIVE)
        assert [r.id for r in slow.held("t")] == [g.manager_reservation_id for g in got.groups]
