"""Review 18: a CRS killed (-9) in the middle of a Reserve and started again. The dead process's pending
reservation is recovered at once -- a retry of the request is placed afresh, and what the dead process's Reserve
committed goes back -- not held for the pending horizon (~90 s here) as "still being placed". While the process
placing it lives, another CRS on the database leaves it alone. Real CRS processes, a stand-in manager that
commits a few seconds after it is asked."""

from __future__ import annotations

import threading
from collections.abc import Callable

import grpc
import pytest

from cross_resource_scheduler.service import Crs, CrsConfig
from harness.v1 import irm_pb2, irm_pb2_grpc
from services.errors import Aborted
from services.tls import plain_channel
from tests.conftest import eventually, start_again
from tests.integration.standin_manager import Standin, gadget
from tests.integration.test_crs_monitor import managers

REQUEST = irm_pb2.ReserveRequest(tenant="t", request_id="r1", groups=[gadget(units=1)])


def _settings(tmp_path) -> dict:
    # irm_timeout_s over the manager's delay: the CRS is waiting on it when it is killed. The address: port 0 until
    # the CRS started there (`_crs_and_standin`), then the one it got.
    return {"address": "127.0.0.1:0", "database": f"sqlite:///{tmp_path / 'crs.db'}",
            "heartbeat_interval_s": 0.3, "heartbeat_timeout_s": 1.5, "irm_timeout_s": 5.0}


def _crs_and_standin(suite, tmp_path, settings: dict, **knobs: object):  # noqa: ANN001, ANN202
    """A CRS process (with `settings`, whose address is then the one it got: a CRS started again with them is at
    the same address, where the manager heartbeats on), a stand-in manager "slow" (with `knobs`) registered with
    it, and a stub on the CRS, once the manager's host is in the CRS."""
    crs = suite.start("crs", **settings)
    settings["address"] = crs.address
    slow = Standin(tmp_path, crs.address, "slow", type="gadget", hb=0.3, **knobs)
    stub = irm_pb2_grpc.ResourceManagerStub(plain_channel(crs.address))
    eventually(lambda: len(stub.DiscoverResources(irm_pb2.DiscoverResourcesRequest()).resources) == 1,
               what="the manager's host in the CRS")
    return crs, slow, stub


def _killed_during(crs, tmp_path, call: Callable[[], object], logged: str) -> None:  # noqa: ANN001
    """`call` to the CRS process `crs` in a thread, the process killed -9 once the stand-in manager logged `logged`
    (the CRS waiting on it): the client sees it die."""
    lost: dict = {}

    def run() -> None:
        try:
            call()
        except grpc.RpcError as e:
            lost["code"] = e.code()

    t = threading.Thread(target=run)
    t.start()
    eventually(lambda: logged in (tmp_path / "slow.standin.log").read_text(), what=f"the CRS's {logged!r}")
    crs.kill()
    t.join(30)
    assert lost["code"] == grpc.StatusCode.UNAVAILABLE


def _killed_mid_reserve(suite, tmp_path, settings: dict, delay: float) -> Standin:
    """A CRS process killed -9 while its Reserve of REQUEST waits on the manager (which commits it later)."""
    crs, slow, stub = _crs_and_standin(suite, tmp_path, settings, reserve_delay=delay)
    _killed_during(crs, tmp_path, lambda: stub.Reserve(REQUEST, timeout=30), "Reserve crs-")
    return slow


def test_a_crs_restarted_after_a_kill_places_a_retry_at_once_and_gives_the_dead_ones_part_back(
        suite, tmp_path) -> None:
    settings = _settings(tmp_path)
    slow = _killed_mid_reserve(suite, tmp_path, settings, delay=2.0)
    try:
        # The same address: the manager heartbeats on.
        again = start_again(lambda: suite.start("crs", name="crs-again", **settings), "the CRS")
        eventually(lambda: managers(again.address)["slow"].up and managers(again.address)["slow"].resources == 1,
                   what="the manager up in the restarted CRS")
        stub = irm_pb2_grpc.ResourceManagerStub(plain_channel(again.address))
        # Not "still being placed" for the pending horizon: the process placing it is gone.
        reply = stub.Reserve(REQUEST, timeout=30)
        assert reply.state == irm_pb2.Reservation.STATE_ACTIVE
        [part] = {g.manager_reservation_id for g in reply.groups}
        # The dead process's Reserve committed at the manager after it died: that part goes back, the retry's stays.
        eventually(lambda: [r.id for r in slow.held("t")] == [part], timeout=40,
                   what="only the retry's part held at the manager")
        listed = stub.ListReservations(irm_pb2.ListReservationsRequest(tenant="t")).reservations
        assert [r.id for r in listed] == [reply.id]
    finally:
        slow.kill()


def test_another_crs_leaves_a_live_processes_reserve_alone_and_recovers_it_once_that_process_is_killed(
        suite, tmp_path) -> None:
    # The manager holds the first CRS's Reserve until the gate opens (after the kill), and the CRS waits that long:
    # its Reserve is in flight for whatever the steps before the kill take on a loaded machine.
    settings = {**_settings(tmp_path), "irm_timeout_s": 60.0}
    gate = tmp_path / "commit"
    crs, slow, stub = _crs_and_standin(suite, tmp_path, settings, reserve_gate=str(gate))
    other = Crs(CrsConfig(database=settings["database"], irm_timeout_s=5.0))   # this test's process
    future = stub.Reserve.future(REQUEST, timeout=30)
    try:
        eventually(lambda: "Reserve crs-" in (tmp_path / "slow.standin.log").read_text(),
                   what="the CRS delegating the reservation")
        other.start()                               # the row is young, and its owner lives: left alone
        eventually(lambda: other.registry.get("slow").specs, what="the manager described to the other CRS")

        def retry() -> None:
            # The manager heartbeats the first CRS only: as if it heartbeat this one too (else it is down here,
            # and the retry refused before it meets the pending row).
            assert other.registry.heartbeat("slow")
            other.Reserve(REQUEST, None)

        with pytest.raises(Aborted, match="still being placed"):
            retry()
        crs.kill()
        gate.touch()                                # the manager commits now, after the process died
        with pytest.raises(Aborted, match="is gone") as e:
            retry()
        assert "retry" in str(e.value)
        assert other.pending_compensations() > 0    # what the killed process's Reserve committed goes back
        with pytest.raises(grpc.RpcError) as lost:
            future.result()
        assert lost.value.code() == grpc.StatusCode.UNAVAILABLE
    finally:
        other.stop()
        slow.kill()
