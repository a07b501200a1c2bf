"""Review 18: a CRS killed (-9) while a Release waits on a manager. The manager gives the part back after the
CRS died; the restarted CRS shows the reservation released (it showed it ACTIVE for good, its part gone: the
row was marked only after every manager answered), and nothing is left held. Real CRS processes, a stand-in
manager that releases a few seconds after it is asked."""

from __future__ import annotations

import sqlite3

from harness.v1 import irm_pb2, irm_pb2_grpc
from services.tls import plain_channel
from tests.conftest import eventually, start_again
from tests.integration.standin_manager import gadget
from tests.integration.test_crs_monitor import managers
from tests.integration.test_crs_review18_restart import _crs_and_standin, _killed_during, _settings


def _compensations(db: sqlite3.Connection) -> int:
    return db.execute("SELECT count(*) FROM crs_compensations").fetchone()[0]


def test_a_crs_killed_during_a_release_shows_it_released_after_a_restart(suite, tmp_path) -> None:
    settings = _settings(tmp_path)
    crs, slow, stub = _crs_and_standin(suite, tmp_path, settings, release_delay=2.0)
    try:
        res = stub.Reserve(irm_pb2.ReserveRequest(tenant="t", request_id="r1", groups=[gadget(units=1)]), timeout=30)
        assert [r.state for r in slow.held("t")] == [irm_pb2.Reservation.STATE_ACTIVE]
        _killed_during(crs, tmp_path, lambda: stub.ReleaseReservation(irm_pb2.ReleaseReservationRequest(
            tenant="t", reservation_id=res.id), timeout=30), "ReleaseReservation")
        eventually(lambda: slow.held("t") == [], what="the manager giving the part back after the CRS died")

        # The same address (`_crs_and_standin` set it): the manager heartbeats on.
        again = start_again(lambda: suite.start("crs", name="crs-again", **settings), "the CRS")
        eventually(lambda: managers(again.address)["slow"].up, what="the manager up in the restarted CRS")
        stub = irm_pb2_grpc.ResourceManagerStub(plain_channel(again.address))
        got = stub.GetReservation(irm_pb2.GetReservationRequest(tenant="t", reservation_id=res.id), timeout=10)
        assert got.state == irm_pb2.Reservation.STATE_RELEASED
        active = stub.ListReservations(irm_pb2.ListReservationsRequest(tenant="t"), timeout=10).reservations
        assert [r.id for r in active] == []
        # What it recorded for the compensator is settled with the manager, which holds nothing.
        db = sqlite3.connect(tmp_path / "crs.db")
        try:
            eventually(lambda: _compensations(db) == 0, timeout=60, what="the release's compensation rows settled")
        finally:
            db.close()
        assert slow.held("t") == []
    finally:
        slow.kill()
