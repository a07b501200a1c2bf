"""What the sweeps do with the reservations runs may have left at the CRS (`am_releases`), against the CRS's answers:

- a Reserve in doubt still being placed (GetReservation: ABORTED, reason RESERVATION_PENDING) is kept and asked
  about again next sweep, quietly; NOT_FOUND is taken as "nothing held" only once the Reserve can no longer land
  (IN_DOUBT_KEPT_S after it was kept); the Reserve is never repeated to find out (it would place what nobody uses);
- a row the CRS refuses for good (PERMISSION_DENIED...) is asked about later and later, up to once an hour, and
  never dropped; the CRS out of reach still ends the pass, and the row is tried again next sweep;
- StopProfiling of a session whose AM process is gone settles that session only: no other tenant's leftovers.

The Application Manager runs in-process on SQLite on a virtual clock; the CRS is stood in for at the gRPC edge
(tests.unit.test_am_review18_releases).
"""

from __future__ import annotations

import logging

import grpc
import pytest
import sqlalchemy as sa

from application_manager import models as m
from application_manager import service as svc
from harness.v1 import application_manager_pb2 as pb
from harness.v1 import irm_pb2
from services import errors
from services.clock import VirtualClock
from tests.unit.test_am_request_ids import _Ctx
from tests.unit.test_am_review18_releases import (  # noqa: F401 - crs: the stand-in CRS fixture
    ACTIVE,
    RELEASED,
    _Crs,
    _execute,
    _kept,
    _RpcError,
    _submit,
    crs,
)

START = 1000.0


def _pending(request_id: str) -> _RpcError:
    """A CRS's answer to GetReservation by the request id of a Reserve it is still placing."""
    message = f"reservation for request_id {request_id!r} is still being placed; retry shortly"
    return _RpcError(grpc.StatusCode.ABORTED, message,
                     errors.Aborted(message, reason=errors.RESERVATION_PENDING, retry_after_s=1.0))


@pytest.fixture
def clock() -> VirtualClock:
    return VirtualClock(START)


def _am(tmp_path, clock: VirtualClock) -> svc.ApplicationManager:  # noqa: ANN001
    # heartbeat_s at its most: the sweeper thread (on real time) never runs during a test; the sweeps are the test's.
    return svc.ApplicationManager(svc.AppManagerConfig(state_dir=str(tmp_path), crs_address="127.0.0.1:1",
                                                       heartbeat_s=300.0), clock=clock)


def _in_doubt(am: svc.ApplicationManager, crs: _Crs) -> tuple[str, irm_pb2.ReserveRequest]:  # noqa: F811
    """An execution whose Reserve was lost before the CRS saw it: kept in doubt. Its request id and its Reserve."""
    seen: list[irm_pb2.ReserveRequest] = []
    reserve = crs.Reserve

    def keep(req, timeout=None):  # noqa: ANN001, ANN202
        seen.append(req)
        return reserve(req, timeout)
    crs.Reserve = keep  # type: ignore[method-assign]
    crs.drop_reserves = 1
    try:
        ex = _execute(am, _submit(am))
    finally:
        del crs.Reserve
    rid = f"am-{ex.id}"
    assert ex.state == pb.ApplicationExecution.STATE_FAILED and _kept(am) == [rid]
    return rid, seen[-1]


def _count_gets(crs: _Crs) -> list[str]:  # noqa: F811
    asked: list[str] = []
    get = crs.GetReservation

    def counted(req, timeout=None):  # noqa: ANN001, ANN202
        asked.append(req.request_id)
        return get(req, timeout)
    crs.GetReservation = counted  # type: ignore[method-assign]
    return asked


# -- 1. GetReservation's answers -----------------------------------------------------------------------------------
def test_a_reserve_the_crs_is_still_placing_is_asked_about_each_sweep_quietly_then_released(crs, tmp_path, clock,  # noqa: F811
                                                                                           caplog):
    am = _am(tmp_path, clock)
    try:
        rid, req = _in_doubt(am, crs)
        reserves = list(crs.reserves)
        crs.pending[rid] = req           # its request reached the CRS after all: being placed
        get = crs.GetReservation

        def new_crs(r, timeout=None):  # noqa: ANN001, ANN202
            if r.request_id in crs.pending:
                raise _pending(r.request_id)
            return get(r, timeout)
        crs.GetReservation = new_crs  # type: ignore[method-assign]
        asked = _count_gets(crs)
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger=svc.__name__):
            for _ in range(3):
                am._sweep()
                clock.advance(5.0)
            # Longer than any NOT_FOUND is kept for: a placement's answer does not expire.
            clock.advance(svc.IN_DOUBT_KEPT_S)
            am._sweep()
        assert _kept(am) == [rid] and asked == [rid] * 4, "not asked again each sweep"
        assert not [r for r in caplog.records if r.levelno >= logging.WARNING and r.name == svc.__name__], \
            "a Reserve still being placed is no failure to warn about"
        crs.place(rid)
        assert crs.active() == {rid}
        am._sweep()
        assert crs.active() == set() and _kept(am) == []
        assert crs.reserves == reserves, "reserved again to find out"
    finally:
        am.stop()


def test_not_found_is_kept_while_the_reserve_may_still_land_and_released_if_it_does(crs, tmp_path, clock):  # noqa: F811
    am = _am(tmp_path, clock)
    try:
        rid, req = _in_doubt(am, crs)
        reserves = list(crs.reserves)
        am._sweep()                      # not there (yet): its request may still be on its way
        assert _kept(am) == [rid] and rid not in crs.by_request
        crs._new(req)                    # it lands, and is placed
        clock.advance(60.0)
        am._sweep()
        assert crs.by_request[rid].state == RELEASED and _kept(am) == []
        assert crs.reserves == reserves, "reserved again to find out"
    finally:
        am.stop()


def test_not_found_means_nothing_held_once_the_reserve_can_no_longer_land(crs, tmp_path, clock):  # noqa: F811
    am = _am(tmp_path, clock)
    try:
        rid, _ = _in_doubt(am, crs)
        reserves = list(crs.reserves)
        with am.db.read() as s:
            kept_at = s.scalars(sa.select(m.Release.created_at)).one()
        clock.advance_to(kept_at + svc.IN_DOUBT_KEPT_S)
        am._sweep()
        assert _kept(am) == [rid]
        clock.advance(1.0)
        am._sweep()
        assert _kept(am) == [] and rid not in crs.by_request, "forgotten, or placed to be released"
        assert crs.reserves == reserves, "reserved again to find out"
    finally:
        am.stop()


# -- 2. refusals ---------------------------------------------------------------------------------------------------
def _missed_release(am: svc.ApplicationManager, crs: _Crs) -> pb.ApplicationExecution:  # noqa: F811
    crs.miss_releases = 1
    ex = _execute(am, _submit(am))
    assert ex.state == pb.ApplicationExecution.STATE_SUCCEEDED and _kept(am)[-1] == f"am-{ex.id}"
    return ex


def test_a_release_refused_for_good_is_asked_again_later_and_later_up_to_hourly_and_kept(crs, tmp_path, clock,  # noqa: F811
                                                                                        caplog):
    am = _am(tmp_path, clock)
    try:
        ex = _missed_release(am, crs)
        asked: list[float] = []

        def refuse(req, timeout=None):  # noqa: ANN001, ANN202
            asked.append(clock.now() - START)
            raise _RpcError(grpc.StatusCode.PERMISSION_DENIED, "not this tenant's delegate",
                            errors.PermissionDenied("not this tenant's delegate"))
        crs.ReleaseReservation = refuse  # type: ignore[method-assign]
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger=svc.__name__):
            while clock.now() - START <= 6 * 3600:
                am._sweep()
                clock.advance(300.0)
        # 300 s doubled at each refusal, then an hour apart.
        assert asked == [0, 300, 900, 2100, 4500, 8100, 11700, 15300, 18900]
        warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING and r.name == svc.__name__]
        assert len(warnings) == len(asked)
        assert all("ReleaseReservation" in w and "'t'" in w and ex.reservation_id in w for w in warnings), warnings[-1]
        assert crs.active() == {f"am-{ex.id}"} and _kept(am) == [f"am-{ex.id}"], "a row that may hold was dropped"
        del crs.ReleaseReservation       # the CRS accepts again: released at the row's next try
        clock.advance(3600.0)
        am._sweep()
        assert crs.active() == set() and _kept(am) == []
    finally:
        am.stop()


def test_a_reserve_in_doubt_the_crs_refuses_to_look_up_is_backed_off_too(crs, tmp_path, clock):  # noqa: F811
    am = _am(tmp_path, clock)
    try:
        rid, _ = _in_doubt(am, crs)
        asked: list[str] = []

        def refuse(req, timeout=None):  # noqa: ANN001, ANN202
            asked.append(req.request_id)
            raise _RpcError(grpc.StatusCode.PERMISSION_DENIED, "not this tenant's delegate",
                            errors.PermissionDenied("not this tenant's delegate"))
        crs.GetReservation = refuse  # type: ignore[method-assign]
        am._sweep()
        am._sweep()
        assert asked == [rid], "asked again before its back-off passed"
        clock.advance(svc.IN_DOUBT_KEPT_S * 10)
        am._sweep()
        assert asked == [rid, rid] and _kept(am) == [rid], "a refusal is no proof that nothing is held"
    finally:
        am.stop()


def test_the_crs_out_of_reach_still_ends_the_pass_and_its_row_is_tried_next_sweep_past_a_backed_off_one(
        crs, tmp_path, clock):  # noqa: F811
    am = _am(tmp_path, clock)
    try:
        refused, away, behind = (_missed_release(am, crs) for _ in range(3))
        asked: list[str] = []

        def release(req, timeout=None):  # noqa: ANN001, ANN202
            asked.append(req.reservation_id)
            if req.reservation_id == refused.reservation_id:
                raise _RpcError(grpc.StatusCode.FAILED_PRECONDITION, "the reservation's spec changed",
                                errors.FailedPrecondition("the reservation's spec changed", reason="SPEC_CHANGED"))
            raise _RpcError(grpc.StatusCode.UNAVAILABLE, "Stream removed (Socket closed)")
        crs.ReleaseReservation = release  # type: ignore[method-assign]
        am._sweep()
        clock.advance(1.0)
        am._sweep()
        # The refused one waits out its back-off; the one the CRS could not answer is tried each sweep, and ends the
        # pass (the one behind it waits for the CRS to be back).
        assert asked == [refused.reservation_id, away.reservation_id, away.reservation_id], asked
        with am.db.read() as s:
            attempts = dict(s.execute(sa.select(m.Release.reservation_id, m.Release.attempts)).all())
        assert attempts == {refused.reservation_id: 1, away.reservation_id: 0, behind.reservation_id: 0}
    finally:
        am.stop()


# -- 3. StopProfiling of a session whose process is gone -----------------------------------------------------------
def test_stop_profiling_a_gone_session_settles_that_session_only(crs, tmp_path, clock):  # noqa: F811
    am = _am(tmp_path, clock)
    try:
        app = _submit(am)
        sid = "prof-gone00000000"
        # What a crash mid-run leaves: the session running under no live owner, its run's reservation held.
        am.db.transact(lambda s: s.add(m.Session(
            id=sid, application_id=app.id, profiler="uniform", state="running", runs=1, max_runs=5, spent=0.0,
            message="", params={}, started_at=1.0, ended_at=0.0, owner="elsewhere:7:z", heartbeat_at=1.0)))
        crs.by_request[f"am-{sid}-1"] = irm_pb2.Reservation(id="r-session", tenant="t", request_id=f"am-{sid}-1",
                                                             state=ACTIVE)
        # Another tenant's leftover, kept for the sweeps.
        crs.by_request["am-exec-other"] = irm_pb2.Reservation(id="r-other", tenant="u", request_id="am-exec-other",
                                                              state=ACTIVE)
        am.db.transact(lambda s: s.add(m.Release(tenant="u", request_id="am-exec-other", reservation_id="r-other",
                                                 created_at=clock.now())))
        tenants: list[str] = []

        def recorded(call):  # noqa: ANN001, ANN202
            def called(req, timeout=None):  # noqa: ANN001, ANN202
                tenants.append(req.tenant)
                return call(req, timeout)
            return called
        for name in ("GetReservation", "ListReservations", "ReleaseReservation"):
            setattr(crs, name, recorded(getattr(crs, name)))
        answer = am.StopProfiling(pb.StopProfilingRequest(tenant="t", session_id=sid), _Ctx())
        assert answer.state == pb.ProfilingSession.STATE_FAILED
        assert crs.by_request[f"am-{sid}-1"].state == RELEASED, "the session's own reservation left held"
        assert set(tenants) == {"t"}, "StopProfiling called the CRS for another tenant's leftovers"
        assert crs.by_request["am-exec-other"].state == ACTIVE
        am._sweep()                      # the background sweep's work
        assert crs.by_request["am-exec-other"].state == RELEASED
    finally:
        am.stop()
