"""Whose is a running session or execution (`application_manager.owners`), and what another AM process on the
same database does with it: nothing while its owner lives, ends it (releasing what its runs reserved) once the
owner is gone. In-process on SQLite; the processes are told apart by their owner (host:pid:tag)."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from application_manager import models as m
from application_manager import owners
from application_manager import service as svc
from application_manager.owners import Owner, gone
from harness.v1 import application_manager_pb2 as pb
from harness.v1 import irm_pb2
from tests.conftest import eventually
from tests.unit.test_am_stop import _am, _Crs, _Ctx, _Held, _submit

ME = Owner("node-a", 100, "aaaa1111")
NOW = 1_000.0


def _gone(owner: str | None, heartbeat_at: float | None, alive: bool = True) -> str | None:
    return gone(owner, heartbeat_at, me=ME, now=NOW, stale_after=15.0, alive=lambda pid: alive)


def test_an_owner_is_gone_when_its_pid_is_on_this_host_or_when_its_heartbeat_is_stale_elsewhere():
    assert _gone(str(ME), None) is None                                  # mine, whatever its mark
    assert _gone(None, None) == owners.LEGACY                            # before rows had owners
    assert _gone("node-a:200:bbbb", NOW - 1, alive=True) is None         # a live process on this host
    assert "is gone" in _gone("node-a:200:bbbb", NOW - 1, alive=False)   # its pid has exited
    # The same pid on this host with another tag: a predecessor (a container's pid 1, restarted).
    assert "restarted" in _gone("node-a:100:bbbb", NOW, alive=True)
    assert "for 16 s" in _gone("node-a:200:bbbb", NOW - 16, alive=True)  # alive pid, but silent: pid reused
    assert _gone("node-b:200:bbbb", NOW - 15) is None                    # elsewhere: its mark decides
    assert "for 16 s" in _gone("node-b:200:bbbb", NOW - 16)
    assert "never" in _gone("node-b:200:bbbb", None)
    assert Owner.parse(str(ME)) == ME and Owner.parse("garbage") is None


def _as(monkeypatch, owner: Owner) -> None:  # noqa: ANN001
    monkeypatch.setattr(owners, "new_owner", lambda: owner)


def _silence(am: svc.ApplicationManager, sid: str) -> None:
    """As if the session's owner had not marked it alive for a long while."""
    am.db.transact(lambda s: s.execute(sa.update(m.Session).where(m.Session.id == sid).values(heartbeat_at=1.0)))


def _session(am: svc.ApplicationManager, app: pb.Application, sid: str) -> pb.ProfilingSession:
    return next(x for x in am.GetModel(pb.GetModelRequest(tenant="t", application_id=app.id), _Ctx()).sessions
                if x.id == sid)


@pytest.fixture
def stop_later():  # noqa: ANN201
    """Stops the AMs given to it (in that order) when the test ends, whatever it ends with."""
    made: list[svc.ApplicationManager] = []

    def keep(am: svc.ApplicationManager) -> svc.ApplicationManager:
        made.append(am)
        return am
    yield keep
    for am in made:
        am.stop()


def _on_node_b(tmp_path, monkeypatch, crs: _Crs) -> svc.ApplicationManager:  # noqa: ANN001
    """A second AM process on the same database, owned by node-b:2:b, its CRS stood in for by `crs`."""
    monkeypatch.setattr(svc.irm_pb2_grpc, "ResourceManagerStub", lambda ch: crs)
    _as(monkeypatch, Owner("node-b", 2, "b"))
    return svc.ApplicationManager(svc.AppManagerConfig(state_dir=str(tmp_path), crs_address="127.0.0.1:1"))


def _profiling_on_node_a(tmp_path, monkeypatch):  # noqa: ANN001, ANN202
    """An AM process owned by node-a:1:a, profiling an application: its first run under way (held)."""
    held = _Held()
    _as(monkeypatch, Owner("node-a", 1, "a"))
    first = _am(tmp_path, monkeypatch, held)
    app = _submit(first)
    it = first.StartProfiling(pb.StartProfilingRequest(tenant="t", application_id=app.id, profiler="uniform",
                                                       max_runs=3), _Ctx())
    sid = next(it).session.id
    assert held.started.wait(5)
    return first, held, app, it, sid


def test_a_live_owners_session_is_left_running_a_stop_reaches_it_and_a_dead_ones_is_ended(tmp_path, monkeypatch, stop_later):
    first, held, app, it, sid = _profiling_on_node_a(tmp_path, monkeypatch)
    stop_later(first)
    crs = _Crs([irm_pb2.Reservation(id="r-run1", tenant="t", request_id=f"am-{sid}-1",
                                    state=irm_pb2.Reservation.STATE_ACTIVE)])
    second = stop_later(_on_node_b(tmp_path, monkeypatch, crs))

    # The second one's start-up left the first one's session running, and it cannot start another.
    model = second.GetModel(pb.GetModelRequest(tenant="t", application_id=app.id), _Ctx())
    assert [s.state for s in model.sessions] == [pb.ProfilingSession.STATE_RUNNING] and not crs.released
    try:
        next(second.StartProfiling(pb.StartProfilingRequest(tenant="t", application_id=app.id), _Ctx()))
        raise AssertionError("a second session of the application started")
    except svc.FailedPrecondition as e:
        assert sid in str(e) and "node-a:1:a" in str(e)

    # A stop asked through the second one is seen by the first one's heartbeat.
    answer = second.StopProfiling(pb.StopProfilingRequest(tenant="t", session_id=sid), _Ctx())
    assert answer.state == pb.ProfilingSession.STATE_RUNNING and "node-a:1:a" in answer.message
    first._beat()
    list(it)
    assert held.cancelled == [f"am-{sid}-1"]
    assert second.GetModel(pb.GetModelRequest(tenant="t", application_id=app.id), _Ctx()).sessions[0].state \
        == pb.ProfilingSession.STATE_STOPPED

    # A session whose owner (elsewhere) stopped marking it alive is ended by the other one's sweep.
    held2 = _Held()
    monkeypatch.setattr(svc.LocalBackend, "run", lambda self, p, **kw: held2(self, p, **kw))
    it2 = first.StartProfiling(pb.StartProfilingRequest(tenant="t", application_id=app.id, profiler="uniform",
                                                        max_runs=3), _Ctx())
    sid2 = next(it2).session.id
    assert held2.started.wait(5)
    crs.reservations.append(irm_pb2.Reservation(id="r-run2", tenant="t", request_id=f"am-{sid2}-1",
                                                state=irm_pb2.Reservation.STATE_ACTIVE))
    second._sweep()
    assert not crs.released                                   # its mark is fresh: left alone
    _silence(first, sid2)
    second._sweep()
    assert crs.released == ["r-run2"]
    s2 = _session(second, app, sid2)
    assert s2.state == pb.ProfilingSession.STATE_FAILED and "has not marked it alive" in s2.message


def test_the_heartbeat_keeps_a_running_sessions_mark_fresh(tmp_path, monkeypatch):
    held = _Held()
    _am(tmp_path, monkeypatch, held).stop()      # its stand-ins for the CRS and the back-end stay patched
    am = svc.ApplicationManager(svc.AppManagerConfig(state_dir=str(tmp_path), crs_address="127.0.0.1:1",
                                                     heartbeat_s=0.05))
    try:
        app = _submit(am)
        it = am.StartProfiling(pb.StartProfilingRequest(tenant="t", application_id=app.id, profiler="uniform",
                                                        max_runs=3), _Ctx())
        sid = next(it).session.id
        with am.db.read() as s:
            first_mark = s.get(m.Session, sid).heartbeat_at

        def later() -> bool:
            with am.db.read() as s:
                return s.get(m.Session, sid).heartbeat_at > first_mark
        eventually(later, what="the heartbeat to mark the session again")
    finally:
        am.stop()


def test_a_run_whose_rows_another_process_ended_is_cancelled_and_that_ending_stands(tmp_path, monkeypatch, stop_later):
    first, held, app, it, sid = _profiling_on_node_a(tmp_path, monkeypatch)
    stop_later(first)
    crs = _Crs([])
    second = stop_later(_on_node_b(tmp_path, monkeypatch, crs))
    # The first one was silent too long (a pause, a slow database): the second takes its session as gone.
    _silence(first, sid)
    second._sweep()
    first._beat()                  # the owner's next mark finds the row no longer its own: the run stops
    list(it)
    assert held.cancelled == [f"am-{sid}-1"]
    s = _session(second, app, sid)
    assert s.state == pb.ProfilingSession.STATE_FAILED and "has not marked it alive" in s.message


def test_marking_alive_goes_on_while_a_sweep_waits_on_the_crs(tmp_path, monkeypatch):
    import threading

    class StuckCrs(_Crs):
        def __init__(self) -> None:
            super().__init__([])
            self.entered, self.go = threading.Event(), threading.Event()

        def ListReservations(self, req, timeout=None):  # noqa: ANN001, ANN201, N802
            self.entered.set()
            self.go.wait(30)            # a CRS that answers late (the AM's own timeout is 10 s)
            return super().ListReservations(req, timeout)

    held = _Held()
    _am(tmp_path, monkeypatch, held).stop()      # its stand-ins for the CRS and the back-end stay patched
    crs = StuckCrs()
    monkeypatch.setattr(svc.irm_pb2_grpc, "ResourceManagerStub", lambda ch: crs)
    am = svc.ApplicationManager(svc.AppManagerConfig(state_dir=str(tmp_path), crs_address="127.0.0.1:1",
                                                     heartbeat_s=0.05))
    try:
        app = _submit(am)
        it = am.StartProfiling(pb.StartProfilingRequest(tenant="t", application_id=app.id, profiler="uniform",
                                                        max_runs=3), _Ctx())
        sid = next(it).session.id
        # A dead process's execution: the sweep releases what it left, and waits on the CRS.
        am.db.transact(lambda s: s.add(m.Execution(
            id="exec-orphan00000", application_id=app.id, tenant="t", request_id=None, state="running",
            config={}, slo="", predicted_time_s=0.0, predicted_cost=0.0, started_at=1.0,
            owner="elsewhere:7:z", heartbeat_at=1.0)))
        assert crs.entered.wait(10)
        with am.db.read() as s:
            mark = s.get(m.Session, sid).heartbeat_at

        def marked_again() -> bool:
            with am.db.read() as s:
                return s.get(m.Session, sid).heartbeat_at > mark
        eventually(marked_again, timeout=5, what="the session marked alive while the sweep waits")
    finally:
        crs.go.set()
        am.stop()
