"""What a run may leave reserved at the CRS is released once the CRS answers, whatever restarts come between: a
release the CRS missed as the run ended (it was down or slow), and a Reserve whose answer was lost (the CRS may have
placed it). Only ended runs' reservations are released, never one a run in progress holds.

The Application Manager runs in-process on SQLite with the real LocalBackend.run; the CRS and the agent are stood
in for at the gRPC edge, the CRS answering as cross_resource_scheduler.service does (Reserve idempotent on its
request id, ABORTED while it is still being placed; GetReservation by request id not finding a pending one).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

import grpc
import numpy as np
import pytest

import examples
from application_manager import local
from application_manager import models as m
from application_manager import service as svc
from application_manager.local import LocalBackend
from harness.v1 import agent_pb2, irm_pb2
from harness.v1 import application_manager_pb2 as pb
from services import errors
from tests.conftest import eventually
from tests.unit.test_am_request_ids import _Ctx

ACTIVE, RELEASED = irm_pb2.Reservation.STATE_ACTIVE, irm_pb2.Reservation.STATE_RELEASED


class _RpcError(grpc.RpcError):
    """A failed call as a stub raises it; `error` (a HarnessError): the CRS's own answer, with its ErrorInfo."""

    def __init__(self, code: grpc.StatusCode, details: str, error: errors.HarnessError | None = None) -> None:
        super().__init__(details)
        self._code, self._details, self._error = code, details, error

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details

    def rich_status(self):  # noqa: ANN201 - what services.errors reads a peer's details from
        return errors.to_status(self._error) if self._error is not None else None


def _socket_closed() -> _RpcError:
    return _RpcError(grpc.StatusCode.UNAVAILABLE, "Stream removed (Socket closed)")


class _Crs:
    """Reservations by request id. `down`: every call fails as a CRS that went away mid-call does; `miss_releases`:
    so many releases do. `lose_answers`: so many Reserves are placed, then their answer is lost; `drop_reserves`: so
    many are lost before the CRS sees them; `pending`: request ids whose Reserve is still being placed (found by no
    GetReservation, ABORTED on a retry) until `place` is called."""

    def __init__(self) -> None:
        self.by_request: dict[str, irm_pb2.Reservation] = {}
        self.pending: dict[str, irm_pb2.ReserveRequest] = {}
        self.down = False
        self.miss_releases = 0
        self.lose_answers = 0
        self.drop_reserves = 0
        self.released: list[str] = []
        self.reserves: list[str] = []

    def active(self) -> set[str]:
        return {r.request_id for r in self.by_request.values() if r.state == ACTIVE}

    def _check(self) -> None:
        if self.down:
            raise _socket_closed()

    def place(self, request_id: str) -> None:
        self._new(self.pending.pop(request_id))

    def _new(self, req: irm_pb2.ReserveRequest) -> irm_pb2.Reservation:
        r = irm_pb2.Reservation(id=f"crs-{len(self.by_request) + 1}", tenant=req.tenant, request_id=req.request_id,
                                state=ACTIVE, price_per_minute=6.0, groups=[irm_pb2.AllocatedGroup(
                                    name=g.name, resources=[irm_pb2.AllocatedResource(id="vm1",
                                                                                     address="127.0.0.1:1")])
                                    for g in req.groups])
        self.by_request[req.request_id] = r
        return r

    def Reserve(self, req, timeout=None):  # noqa: ANN001, ANN201, N802
        self._check()
        self.reserves.append(req.request_id)
        if self.drop_reserves:
            self.drop_reserves -= 1
            raise _socket_closed()
        if req.request_id in self.pending:
            raise _RpcError(grpc.StatusCode.ABORTED, "still being placed; retry shortly")
        r = self.by_request.get(req.request_id) or self._new(req)
        if self.lose_answers:
            self.lose_answers -= 1
            raise _socket_closed()
        return r

    def GetReservation(self, req, timeout=None):  # noqa: ANN001, ANN201, N802
        self._check()
        if req.request_id not in self.by_request:
            raise _RpcError(grpc.StatusCode.NOT_FOUND, f"no reservation has request id {req.request_id!r}")
        return self.by_request[req.request_id]

    def ListReservations(self, req, timeout=None):  # noqa: ANN001, ANN201, N802
        self._check()
        return irm_pb2.ListReservationsResponse(reservations=[r for r in self.by_request.values()
                                                              if r.state == ACTIVE and r.tenant == req.tenant])

    def ReleaseReservation(self, req, timeout=None):  # noqa: ANN001, ANN201, N802
        self._check()
        if self.miss_releases:
            self.miss_releases -= 1
            raise _socket_closed()
        (r,) = [r for r in self.by_request.values() if r.id == req.reservation_id]
        r.state = RELEASED
        self.released.append(r.id)
        return r


class _Agent:
    """Runs each command to exit 0 at once, or, while `hold` is set, until `go` is."""

    hold = False
    go = threading.Event()
    running = threading.Event()

    def __init__(self, channel) -> None:  # noqa: ANN001
        pass

    def Execute(self, req, timeout=None) -> Iterator[agent_pb2.ExecuteEvent]:  # noqa: ANN001, N802
        yield agent_pb2.ExecuteEvent(started=agent_pb2.ExecutionStarted(execution_id="e1"))
        if _Agent.hold:
            _Agent.running.set()
            assert _Agent.go.wait(30), "never let go"
        yield agent_pb2.ExecuteEvent(exited=agent_pb2.ExecutionExited(exit_code=0, wall_time_s=1.0))


@pytest.fixture
def crs(monkeypatch) -> _Crs:
    c = _Crs()
    # The AM's stub and every run's: the same module attribute.
    monkeypatch.setattr(local.irm_pb2_grpc, "ResourceManagerStub", lambda channel: c)
    monkeypatch.setattr(local.agent_pb2_grpc, "ExecutionAgentStub", _Agent)
    monkeypatch.setattr(_Agent, "hold", False)
    monkeypatch.setattr(_Agent, "go", threading.Event())
    monkeypatch.setattr(_Agent, "running", threading.Event())
    monkeypatch.setattr(svc.ApplicationManager, "_offered_types", lambda self: {"vm"})
    monkeypatch.setattr(LocalBackend, "prices", lambda self: np.ones(len(self.space)))
    return c


def _am(tmp_path) -> svc.ApplicationManager:  # noqa: ANN001
    return svc.ApplicationManager(svc.AppManagerConfig(state_dir=str(tmp_path), crs_address="127.0.0.1:1"))


def _submit(am: svc.ApplicationManager) -> pb.Application:
    return am.SubmitApplication(pb.SubmitApplicationRequest(
        tenant="t", manifest_json=examples.manifest("rtm"), slo_json=examples.slo("rtm", rows=200, steps=20),
        app_dir="/x"), _Ctx())


def _execute(am: svc.ApplicationManager, app: pb.Application) -> pb.ApplicationExecution:
    return am.ExecuteApplication(pb.ExecuteApplicationRequest(tenant="t", application_id=app.id, online=True), _Ctx())


def _kept(am: svc.ApplicationManager) -> list[str]:
    with am.db.read() as s:
        return [r.request_id for r in s.query(m.Release).all()]


def test_a_release_the_crs_missed_is_done_once_it_is_back_even_after_a_restart(crs, tmp_path):
    am = _am(tmp_path)
    try:
        app = _submit(am)
        crs.miss_releases = 1            # away as the run ends
        ex = _execute(am, app)
        assert ex.state == pb.ApplicationExecution.STATE_SUCCEEDED, ex.error
        rid = f"am-{ex.id}"
        assert crs.active() == {rid} and _kept(am) == [rid]
        crs.down = True
        am._sweep()                      # the CRS still away: kept for the next sweep
        assert crs.active() == {rid} and _kept(am) == [rid]
    finally:
        am.stop()
    crs.down = False
    again = _am(tmp_path)                # its start-up sweep
    try:
        assert crs.active() == set() and crs.released == [ex.reservation_id]
        assert _kept(again) == []
    finally:
        again.stop()


def test_a_sessions_missed_release_is_done_without_touching_the_run_in_progress(crs, tmp_path, monkeypatch):
    crs.miss_releases = 1                # the first run's
    am = _am(tmp_path)
    try:
        app = _submit(am)
        # The first run's release is missed; the second run is held running.
        original = LocalBackend.run

        def run(self, proposal, **kw):  # noqa: ANN001, ANN202
            _Agent.hold = kw["request_id"].endswith("-2")
            return original(self, proposal, **kw)
        monkeypatch.setattr(LocalBackend, "run", run)
        it = am.StartProfiling(pb.StartProfilingRequest(tenant="t", application_id=app.id, profiler="uniform",
                                                        max_runs=2), _Ctx())
        sid = next(it).session.id
        assert _Agent.running.wait(10)
        first, second = f"am-{sid}-1", f"am-{sid}-2"
        assert crs.active() == {first, second} and _kept(am) == [first]
        am._sweep()
        assert crs.active() == {second}, "the sweep released the run in progress, or not the one that ended"
        assert _kept(am) == []
        _Agent.go.set()
        events = list(it)
        assert events[-1].session.state == pb.ProfilingSession.STATE_DONE
        assert crs.active() == set()
    finally:
        _Agent.go.set()
        am.stop()


def test_a_reserve_whose_answer_was_lost_is_released_once_the_crs_answers(crs, tmp_path):
    am = _am(tmp_path)
    try:
        app = _submit(am)
        crs.lose_answers = 1             # placed, and the answer lost with the connection
        ex = _execute(am, app)
        assert ex.state == pb.ApplicationExecution.STATE_FAILED and "could not reserve: UNAVAILABLE" in ex.error
        rid = f"am-{ex.id}"
        assert crs.active() == {rid} and _kept(am) == [rid]
        crs.down = True
        am._sweep()
        assert crs.active() == {rid} and _kept(am) == [rid]
    finally:
        am.stop()
    crs.down = False
    again = _am(tmp_path)                # a restart in between loses nothing
    try:
        assert crs.active() == set() and _kept(again) == []
        assert crs.reserves == [rid], "released by what the CRS holds, not by reserving again"
    finally:
        again.stop()


def test_a_reserve_in_doubt_still_being_placed_or_never_placed_leaves_nothing(crs, tmp_path):
    # This stand-in answers NOT_FOUND for a Reserve still being placed, as a CRS from before RESERVATION_PENDING did.
    from services.clock import VirtualClock

    clock = VirtualClock(1000.0)
    am = svc.ApplicationManager(svc.AppManagerConfig(state_dir=str(tmp_path), crs_address="127.0.0.1:1"),
                                clock=clock)
    try:
        app = _submit(am)
        crs.drop_reserves = 2            # two Reserves lost before the CRS placed them
        first, second = _execute(am, app), _execute(am, app)
        assert {first.state, second.state} == {pb.ApplicationExecution.STATE_FAILED}
        assert crs.active() == set() and _kept(am) == [f"am-{first.id}", f"am-{second.id}"]
        # The first one's Reserve is still being placed at the CRS (its request got there after all).
        req = irm_pb2.ReserveRequest(tenant="t", request_id=f"am-{first.id}",
                                     groups=[irm_pb2.ResourceGroup(name="master", resource_type="vm", count=1)])
        crs.pending[req.request_id] = req
        reserves = list(crs.reserves)
        am._sweep()
        # Neither is found: both kept while their Reserves may still land, and neither is reserved again to find out.
        assert crs.active() == set() and _kept(am) == [f"am-{first.id}", f"am-{second.id}"]
        crs.place(req.request_id)
        assert crs.active() == {f"am-{first.id}"}
        am._sweep()
        # The first is released once placed ...
        assert crs.active() == set() and _kept(am) == [f"am-{second.id}"]
        clock.advance(svc.IN_DOUBT_KEPT_S + 1)
        am._sweep()
        # ... and the second, never placed, is forgotten once its Reserve can no longer land.
        assert _kept(am) == [] and f"am-{second.id}" not in crs.by_request
        assert crs.reserves == reserves
    finally:
        am.stop()


@pytest.mark.parametrize("refusal", [
    # The CRS's own answer, saying why: its claim on the request id dropped, nothing held.
    _RpcError(grpc.StatusCode.UNAVAILABLE, "the manager of 'vm' (compute) is down",
              errors.Unavailable("the manager of 'vm' (compute) is down", reason=errors.MANAGER_DOWN,
                                 retry_after_s=5.0)),
    # Never sent: the channel could not connect.
    _RpcError(grpc.StatusCode.UNAVAILABLE, "failed to connect to all addresses; last error: UNKNOWN: "
              "ipv4:127.0.0.1:1: Failed to connect to remote host: Connection refused"),
], ids=["the-crs-refused-saying-why", "never-sent"])
def test_a_reserve_refused_for_sure_keeps_nothing_to_release(crs, tmp_path, monkeypatch, refusal):
    def refuse(req, timeout=None):  # noqa: ANN001, ANN202
        raise refusal
    monkeypatch.setattr(crs, "Reserve", refuse)
    am = _am(tmp_path)
    try:
        ex = _execute(am, _submit(am))
        assert ex.state == pb.ApplicationExecution.STATE_FAILED and _kept(am) == []
    finally:
        am.stop()


def test_the_sweeper_releases_a_missed_release_by_itself(crs, tmp_path):
    crs.miss_releases = 1
    am = svc.ApplicationManager(svc.AppManagerConfig(state_dir=str(tmp_path), crs_address="127.0.0.1:1",
                                                     heartbeat_s=0.05))
    try:
        _execute(am, _submit(am))
        eventually(lambda: not crs.active() and not _kept(am), timeout=10, what="the sweeper to release it")
    finally:
        am.stop()


def test_a_release_the_crs_refuses_does_not_hold_up_the_others(crs, tmp_path, monkeypatch):
    am = _am(tmp_path)
    try:
        app = _submit(am)
        crs.miss_releases = 2
        first, second = _execute(am, app), _execute(am, app)
        assert crs.active() == {f"am-{first.id}", f"am-{second.id}"}
        release = crs.ReleaseReservation

        def refuse_first(req, timeout=None):  # noqa: ANN001, ANN202
            if req.reservation_id == first.reservation_id:
                raise _RpcError(grpc.StatusCode.PERMISSION_DENIED, "not this tenant's delegate")
            return release(req, timeout)
        monkeypatch.setattr(crs, "ReleaseReservation", refuse_first)
        am._sweep()
        assert crs.active() == {f"am-{first.id}"} and _kept(am) == [f"am-{first.id}"]
    finally:
        am.stop()


def test_a_reserve_in_doubt_refused_with_a_reason_is_kept_while_the_crs_may_still_place_it(crs, tmp_path,
                                                                                             monkeypatch):
    # The CRS checks a request before it looks at its id: a refusal saying why (a manager down now) does not prove
    # that the first Reserve under that id is not still being placed; only its age does.
    from services.clock import VirtualClock

    clock = VirtualClock(1000.0)
    am = svc.ApplicationManager(svc.AppManagerConfig(state_dir=str(tmp_path), crs_address="127.0.0.1:1"),
                                clock=clock)
    try:
        app = _submit(am)
        crs.drop_reserves = 1
        first = _execute(am, app)
        assert _kept(am) == [f"am-{first.id}"]

        def refuse(req, timeout=None):  # noqa: ANN001, ANN202
            raise _RpcError(grpc.StatusCode.UNAVAILABLE, "the manager of 'vm' (compute) is down",
                            errors.Unavailable("the manager of 'vm' (compute) is down", reason=errors.MANAGER_DOWN))
        monkeypatch.setattr(crs, "Reserve", refuse)
        am._sweep()
        assert _kept(am) == [f"am-{first.id}"]
        clock.advance(svc.IN_DOUBT_KEPT_S + 1)
        am._sweep()
        assert _kept(am) == []
    finally:
        am.stop()
