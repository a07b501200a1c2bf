"""Review 18: a pending reservation names the CRS process placing it, and a CRS recovers at once the pending rows
of a process that is provably gone (same machine, its pid exited or now another process's), keeping the pending
horizon for the rows of a live or unknown owner. The owners are real processes (`sleep`); the CRS is in-process,
its managers stood in for."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator

import grpc
import pytest
from sqlalchemy import select

from cross_resource_scheduler import owners
from cross_resource_scheduler.models import Compensation, Manager, Reservation
from cross_resource_scheduler.owners import Owner, gone
from cross_resource_scheduler.service import Crs, part_request_ids
from harness.v1 import irm_pb2
from services.clock import VirtualClock
from services.errors import Aborted
from tests.conftest import eventually
from tests.unit.test_crs_reserve import make_crs
from tests.unit.test_crs_service_parse import _group

START = 1000.0


@pytest.fixture
def live() -> Iterator[subprocess.Popen]:
    p = subprocess.Popen(["sleep", "300"])
    yield p
    p.kill()
    p.wait()


def owner_of(p: subprocess.Popen) -> Owner:
    """`p` as a CRS process would name itself."""
    started = owners.started_of(p.pid)
    assert started                                  # Linux: a start time to tell a reused pid by
    return Owner(owners.this_process().machine, p.pid, started)


def dead_owner() -> Owner:
    p = subprocess.Popen(["sleep", "300"])
    o = owner_of(p)
    p.kill()
    p.wait()
    return o


def test_an_owner_is_gone_only_when_this_machine_shows_its_process_gone(live: subprocess.Popen) -> None:
    me = owners.this_process()
    o = owner_of(live)
    assert gone(str(o), me) is None                                     # running
    assert gone(str(me), me) is None                                    # this process
    assert gone("", me) is None and gone(None, me) is None              # rows from before owners were recorded
    assert gone("garbage", me) is None
    assert gone(str(Owner("elsewhere/boot/1", live.pid, o.started)), me) is None   # its pid means nothing here
    # The pid is another process's now (started at another time): the owner is gone.
    assert "another process's" in gone(str(Owner(me.machine, live.pid, "1")), me)
    # A process with this very pid before this one: a restart (a container's pid 1, say).
    assert "restarted" in gone(str(Owner(me.machine, me.pid, "1")), me)
    live.kill()
    # Killed, not yet reaped (a zombie): gone already; reaped: gone.
    assert "is gone" in eventually(lambda: gone(str(o), me), what="the killed owner taken as gone")
    live.wait()
    assert "is gone" in gone(str(o), me)
    assert Owner.parse(str(o)) == o


def _pending(crs: Crs, res_id: str, owner: str, request_id: str = "r1") -> None:
    crs.db.transact(lambda s: s.add(Reservation(
        id=res_id, tenant="t", request_id=request_id, state="pending", priority=0, price_per_minute=0.0,
        created_at=crs.clock.now(), released_at=0.0, allocation=b"", notes=[], owner=owner)))


def _pending_ids(crs: Crs) -> set[str]:
    with crs.db.read() as s:
        return set(s.scalars(select(Reservation.id).where(Reservation.state == "pending")))


def _compensations(crs: Crs) -> set[str]:
    with crs.db.read() as s:
        return set(s.scalars(select(Compensation.irm_request_id)))


def test_a_starting_crs_recovers_at_once_the_young_pending_rows_of_a_process_that_is_gone(
        tmp_path, live: subprocess.Popen) -> None:
    crs = make_crs(tmp_path, VirtualClock(START))
    # A manager from before the restart: whatever it may hold for the dead process's Reserve is asked for.
    crs.db.transact(lambda s: s.add(Manager(name="m", address="127.0.0.1:1", resource_types=["vm"],
                                            registered_at=0.0)))
    _pending(crs, "crs-dead", str(dead_owner()), "r-dead")
    _pending(crs, "crs-live", str(owner_of(live)), "r-live")        # a CRS still winding down, say
    _pending(crs, "crs-legacy", "", "r-legacy")                      # from before owners were recorded
    try:
        crs.start()
        # None of them is older than the horizon: only the dead process's is recovered, and at once.
        assert _pending_ids(crs) == {"crs-live", "crs-legacy"}
        assert _compensations(crs) == set(part_request_ids("crs-dead", "m", crs._attempts()))
    finally:
        crs.stop()


def test_a_retry_of_a_reserve_whose_crs_process_is_gone_is_told_to_retry_and_then_placed_afresh(
        tmp_path, live: subprocess.Popen) -> None:
    crs = make_crs(tmp_path, VirtualClock(START))
    crs._delegate = lambda tenant, res_id, attempt, pinned, index: (  # type: ignore[method-assign]
        [irm_pb2.AllocatedGroup(name="g", manager="m", manager_reservation_id="irm-1")], [], {})
    request = irm_pb2.ReserveRequest(tenant="t", request_id="r1", groups=[_group(2)])
    try:
        _pending(crs, "crs-dead", str(dead_owner()), "r1")
        with pytest.raises(Aborted) as e:
            crs.Reserve(request, None)
        assert e.value.code == grpc.StatusCode.ABORTED
        assert "is gone" in str(e.value) and "retry" in str(e.value)
        assert _pending_ids(crs) == set()                            # its parts are queued for release instead
        assert crs.Reserve(request, None).state == irm_pb2.Reservation.STATE_ACTIVE
        # A live owner's row is still its: the horizon holds.
        _pending(crs, "crs-live", str(owner_of(live)), "r2")
        with pytest.raises(Aborted, match="still being placed"):
            crs.Reserve(irm_pb2.ReserveRequest(tenant="t", request_id="r2", groups=[_group(2)]), None)
        assert "crs-live" in _pending_ids(crs)
    finally:
        crs.db.dispose()


def test_a_reserve_names_this_process_as_the_owner_of_its_pending_row(tmp_path) -> None:
    crs = make_crs(tmp_path, VirtualClock(START))
    seen: list[str] = []

    def delegate(tenant, res_id, attempt, pinned, index):  # type: ignore[no-untyped-def]
        with crs.db.read() as s:
            seen.append(s.get(Reservation, res_id).owner)
        return [irm_pb2.AllocatedGroup(name="g", manager="m", manager_reservation_id="irm-1")], [], {}

    crs._delegate = delegate  # type: ignore[method-assign]
    try:
        crs.Reserve(irm_pb2.ReserveRequest(tenant="t", request_id="r1", groups=[_group(2)]), None)
        assert seen == [str(owners.this_process())] and str(crs.owner) == seen[0]
    finally:
        crs.db.dispose()


def test_a_process_that_cannot_tell_its_machine_apart_judges_no_owner(monkeypatch):
    # Without its pid namespace two containers with one host name, each CRS pid 1, would look like one machine:
    # the newer would take the other's live rows for a restarted process's.
    from cross_resource_scheduler import owners

    def unreadable(path):  # noqa: ANN001, ANN202
        raise PermissionError(path)
    monkeypatch.setattr(owners.os, "readlink", unreadable)
    me = owners.this_process()
    assert owners.Owner.parse(str(me)) is None
    other = owners.Owner(me.machine, me.pid, "123")
    assert owners.gone(str(other), me, probe=lambda pid: "456") is None
