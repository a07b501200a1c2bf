"""The CRS against managers that hang or are slow (stand-in manager processes, tests/integration/standin_manager.py):
down-detection, its worker threads and what it gives back must not depend on every manager answering promptly."""

from __future__ import annotations

import threading
import time
from collections import Counter

import grpc
import pytest

from harness.v1 import irm_pb2, irm_pb2_grpc, registry_pb2, registry_pb2_grpc
from services.tls import plain_channel
from tests.conftest import eventually, start_again
from tests.integration.standin_manager import Standin, gadget


def managers(crs_address: str) -> dict[str, registry_pb2.ManagerInfo]:
    with plain_channel(crs_address) as ch:
        stub = registry_pb2_grpc.ManagerRegistryStub(ch)
        return {m.name: m for m in stub.ListManagers(registry_pb2.ListManagersRequest()).managers}


def test_a_manager_that_hangs_does_not_delay_down_detection_of_another(suite, tmp_path) -> None:
    # A call to the hanging manager takes irm_timeout_s, several times the heartbeat timeout: a down-detection that
    # waited for it would be seconds late.
    hb_interval, hb_timeout, irm_timeout = 0.3, 1.5, 10.0
    crs = suite.start("crs", heartbeat_interval_s=hb_interval, heartbeat_timeout_s=hb_timeout,
                      irm_timeout_s=irm_timeout)
    # Refuses the Release's own call at once, then hangs on the compensator's retry.
    hang = Standin(tmp_path, crs.address, "hang", type="gadget", release_unavailable=True, release_delay=60,
                   release_delay_from=1)
    other = Standin(tmp_path, crs.address, "other", type="widget")
    try:
        stub = irm_pb2_grpc.ResourceManagerStub(plain_channel(crs.address))
        eventually(lambda: len(stub.DiscoverResources(irm_pb2.DiscoverResourcesRequest()).resources) == 2)
        res = stub.Reserve(irm_pb2.ReserveRequest(tenant="t", request_id="r1", groups=[gadget()]), timeout=30)
        # The release cannot reach "hang" (UNAVAILABLE): its part is left to the compensator, whose
        # ReleaseReservation there hangs until the call's deadline (irm_timeout_s).
        stub.ReleaseReservation(irm_pb2.ReleaseReservationRequest(tenant="t", reservation_id=res.id), timeout=30)
        eventually(lambda: (tmp_path / "hang.standin.log").read_text().count("ReleaseReservation") == 2,
                   what="the compensator waiting on the hanging manager")
        other.kill()
        t0 = time.monotonic()
        eventually(lambda: not managers(crs.address)["other"].up, timeout=30, what="other marked down")
        took = time.monotonic() - t0
        # Down after its heartbeat timeout plus one check (every heartbeat_interval / 2), not after the
        # compensator's call to the hanging manager (irm_timeout_s): a few heartbeat intervals and 2 s of slack
        # for a loaded machine allowed, still far short of that call.
        assert took < hb_timeout + 3 * hb_interval + 2.0, f"down-detection took {took:.1f}s"
        assert managers(crs.address)["hang"].up  # it heartbeats: up, however slow its answers
    finally:
        hang.kill()
        other.kill()


def test_a_slow_manager_does_not_take_the_threads_of_the_others(suite, tmp_path) -> None:
    crs = suite.start("crs", heartbeat_interval_s=0.5, heartbeat_timeout_s=3.0, irm_timeout_s=5.0,
                      max_delegations_per_manager=4)
    # Commits each reserve after 6 s, past the CRS's 5 s deadline.
    slow = Standin(tmp_path, crs.address, "slow", type="gadget", reserve_delay=6, units=1000, hb=0.5)
    fast = Standin(tmp_path, crs.address, "fast", type="widget", hb=0.5)
    try:
        stub = irm_pb2_grpc.ResourceManagerStub(plain_channel(crs.address))
        eventually(lambda: len(stub.DiscoverResources(irm_pb2.DiscoverResourcesRequest()).resources) == 2)
        outcomes: Counter[str] = Counter()
        refusals: list[str] = []

        def one(i: int) -> None:
            try:
                stub.Reserve(irm_pb2.ReserveRequest(tenant="t", request_id=f"slow-{i}", groups=[gadget()]),
                             timeout=60)
                outcomes["ok"] += 1
            except grpc.RpcError as e:
                outcomes[e.code().name] += 1
                if e.code() == grpc.StatusCode.UNAVAILABLE and "is slow" in e.details():
                    refusals.append(e.details())

        storm = [threading.Thread(target=one, args=(i,)) for i in range(40)]
        for t in storm:
            t.start()
        # The slow manager holds its 4 delegations; the other 36 were refused after a short wait for a turn.
        eventually(lambda: len(refusals) == 36, timeout=10, what="the storm's surplus refused")
        t0 = time.monotonic()
        r = stub.Reserve(irm_pb2.ReserveRequest(tenant="t", request_id="fast-1", groups=[gadget(rtype="widget")]),
                         timeout=60)
        took = time.monotonic() - t0
        # Answered while the slow manager's 4 delegations still wait (they end at irm_timeout_s): it did not need
        # one of their threads.
        ended_meanwhile = sum(outcomes.values())
        for t in storm:
            t.join(30)
        assert r.state == irm_pb2.Reservation.STATE_ACTIVE
        assert ended_meanwhile == 36 and took < 5.0, f"fast reserve took {took:.1f}s, {ended_meanwhile} ended"
        assert "'slow' is slow" in refusals[0] and "retry" in refusals[0]
        assert outcomes == {"UNAVAILABLE": 40}, outcomes  # 36 refused, 4 timed out
        assert all(m.up for m in managers(crs.address).values())
        assert "manager down" not in (tmp_path / "crs.log").read_text()
        # The 4 parts the slow manager committed after the CRS gave up are given back (by the compensator,
        # not the request threads).
        eventually(lambda: (tmp_path / "slow.standin.log").read_text().count("COMMITTED") == 4, timeout=15)
        eventually(lambda: slow.held("t") == [], timeout=30, what="the late parts given back")
    finally:
        slow.kill()
        fast.kill()


def test_a_burst_beyond_the_delegation_slots_at_a_healthy_manager_waits_its_turn(suite, tmp_path) -> None:
    crs = suite.start("crs", heartbeat_interval_s=0.5, heartbeat_timeout_s=3.0, max_delegations_per_manager=2,
                      delegation_wait_s=10.0)
    busy = Standin(tmp_path, crs.address, "busy", type="gadget", reserve_delay=0.3, units=1000, hb=0.5)
    try:
        stub = irm_pb2_grpc.ResourceManagerStub(plain_channel(crs.address))
        eventually(lambda: len(stub.DiscoverResources(irm_pb2.DiscoverResourcesRequest()).resources) == 1)
        outcomes: Counter[str] = Counter()

        def one(i: int) -> None:
            try:
                stub.Reserve(irm_pb2.ReserveRequest(tenant="t", request_id=f"b-{i}", groups=[gadget()]), timeout=60)
                outcomes["ok"] += 1
            except grpc.RpcError as e:
                outcomes[f"{e.code().name}: {e.details()[:80]}"] += 1

        burst = [threading.Thread(target=one, args=(i,)) for i in range(6)]
        for t in burst:
            t.start()
        for t in burst:
            t.join(60)
        # Three times the slots at once, each call 0.3 s: queued for their turn, none refused as "slow".
        assert outcomes == {"ok": 6}, outcomes
    finally:
        busy.kill()


def test_an_in_doubt_part_committed_long_after_the_deadline_is_given_back(suite, tmp_path) -> None:
    crs = suite.start("crs", heartbeat_interval_s=0.3, heartbeat_timeout_s=1.5, irm_timeout_s=1.0)
    # Commits 5 s after the request: past the CRS's 1 s deadline and its 3 s "settled" time.
    slow = Standin(tmp_path, crs.address, "slow", type="gadget", reserve_delay=5)
    try:
        stub = irm_pb2_grpc.ResourceManagerStub(plain_channel(crs.address))
        eventually(lambda: len(stub.DiscoverResources(irm_pb2.DiscoverResourcesRequest()).resources) == 1)
        with pytest.raises(grpc.RpcError) as e:
            stub.Reserve(irm_pb2.ReserveRequest(tenant="t", request_id="r1", groups=[gadget(units=40)]), timeout=30)
        assert e.value.code() == grpc.StatusCode.UNAVAILABLE
        eventually(lambda: "COMMITTED" in (tmp_path / "slow.standin.log").read_text(), timeout=15,
                   what="the manager committing late")
        eventually(lambda: slow.held("t") == [], timeout=30, what="the late part given back")
        assert stub.ListReservations(irm_pb2.ListReservationsRequest(tenant="t", include_released=True)
                                     ).reservations == []
    finally:
        slow.kill()


def test_an_in_doubt_part_is_still_given_back_when_the_crs_restarts_before_the_late_commit(suite, tmp_path) -> None:
    # Which parts are in doubt was known only in memory: a CRS restarted between the failed Reserve and the
    # manager's late commit took the part as settled after 3 x irm_timeout_s (3 s) and left it held for good.
    settings = {"database": f"sqlite:///{tmp_path / 'crs.db'}", "heartbeat_interval_s": 0.3,
                "heartbeat_timeout_s": 1.5, "irm_timeout_s": 1.0}
    crs = suite.start("crs", **settings)
    slow = Standin(tmp_path, crs.address, "slow", type="gadget", reserve_delay=8)     # commits 8 s after
    try:
        stub = irm_pb2_grpc.ResourceManagerStub(plain_channel(crs.address))
        eventually(lambda: len(stub.DiscoverResources(irm_pb2.DiscoverResourcesRequest()).resources) == 1)
        with pytest.raises(grpc.RpcError) as e:
            stub.Reserve(irm_pb2.ReserveRequest(tenant="t", request_id="r1", groups=[gadget(units=40)]), timeout=30)
        assert e.value.code() == grpc.StatusCode.UNAVAILABLE
        crs.kill()                                    # a crash: nothing of its memory survives
        # At the same address: the manager (and the stub) know the CRS there.
        start_again(lambda: suite.start("crs", name="crs-again", address=crs.address, **settings), "the CRS")
        eventually(lambda: "COMMITTED" in (tmp_path / "slow.standin.log").read_text(), timeout=20,
                   what="the manager committing late")
        eventually(lambda: slow.held("t") == [], timeout=40, what="the late part given back by the new CRS")
    finally:
        slow.kill()
