"""Review 19: a Reserve whose caller went away is not committed. A reservation placed after the caller's deadline
passed (a slow manager, or placements queued behind a slow plug-in) was activated with no one knowing its id --
`harness reserve` makes a random one -- held and charged for good. A real CRS process, a stand-in manager holding
the Reserve in flight until the caller has given up."""

from __future__ import annotations

import grpc

from harness.v1 import irm_pb2
from tests.conftest import eventually
from tests.integration.standin_manager import crs_with_a_gated_standin, gadget


def test_a_reserve_whose_caller_gave_up_gives_its_parts_back(suite, tmp_path) -> None:
    with crs_with_a_gated_standin(suite, tmp_path) as (stub, gate, slow):
        request = irm_pb2.ReserveRequest(tenant="t", request_id="gone", groups=[gadget(units=1)])
        call = stub.Reserve.future(request, timeout=5.0)
        eventually(lambda: "Reserve crs-" in (tmp_path / "slow.standin.log").read_text(),
                   what="the CRS's Reserve waiting at the manager")
        assert call.exception(timeout=30).code() == grpc.StatusCode.DEADLINE_EXCEEDED

        gate.write_text("")             # the manager commits now, after the caller left
        eventually(lambda: "COMMITTED" in (tmp_path / "slow.standin.log").read_text(), what="the manager's commit")
        # Given back, and no reservation under the request id: a retry places afresh.
        eventually(lambda: slow.held("t") == [], what="the part given back at the manager")

        def status() -> grpc.StatusCode:
            try:
                stub.GetReservation(irm_pb2.GetReservationRequest(tenant="t", request_id="gone"), timeout=10)
            except grpc.RpcError as e:
                return e.code()
            return grpc.StatusCode.OK

        # Pending (ABORTED) until the Reserve has dropped its row, just after the manager's release answers.
        eventually(lambda: status() != grpc.StatusCode.ABORTED, what="the Reserve's end")
        assert status() == grpc.StatusCode.NOT_FOUND
        assert list(stub.ListReservations(irm_pb2.ListReservationsRequest(tenant="t"), timeout=10).reservations) == []

        again = stub.Reserve(request, timeout=30)
        assert again.state == irm_pb2.Reservation.STATE_ACTIVE
        assert [r.id for r in slow.held("t")] == [g.manager_reservation_id for g in again.groups]
