"""The CRS's background loops (liveness, compensation) outlive a failing step (in-process: the failure is
injected; tests/integration/test_crs_monitor.py has the cross-process cases)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from sqlalchemy.exc import OperationalError

from cross_resource_scheduler import service as crs_service
from cross_resource_scheduler.registry import ManagerState
from cross_resource_scheduler.service import Crs, CrsConfig
from tests.conftest import eventually


@pytest.fixture
def crs(tmp_path) -> Iterator[Crs]:
    c = Crs(CrsConfig(state_dir=str(tmp_path), heartbeat_interval_s=0.1, heartbeat_timeout_s=0.6))
    yield c
    c.stop()


def test_a_database_error_in_a_pass_does_not_end_down_detection_or_compensation(crs: Crs, monkeypatch) -> None:
    crs.registry.managers["m"] = ManagerState("m", "127.0.0.1:9", ["vm"], crs.clock.now())
    crs._remember("m", "t", "crs-x#0@m")
    undone: list[str] = []
    crs.compensator.undo = lambda m, t, rid: undone.append(rid) or "released"  # type: ignore[method-assign]
    # The database drops the connection once under the compensation poll (as psycopg does when PostgreSQL
    # restarts), and the liveness check fails once too.
    failures = {"poll": 1, "liveness": 1}
    real_fetch, real_check = crs.db.fetch, crs.registry.check_liveness

    def fetch(prepared, params):  # type: ignore[no-untyped-def]
        if prepared is crs_service._ANY_COMPENSATION and failures["poll"]:
            failures["poll"] -= 1
            raise OperationalError("SELECT", {}, Exception("server closed the connection unexpectedly"))
        return real_fetch(prepared, params)

    def check_liveness() -> None:
        if failures["liveness"]:
            failures["liveness"] -= 1
            raise RuntimeError("injected")
        real_check()

    monkeypatch.setattr(crs.db, "fetch", fetch)
    monkeypatch.setattr(crs.registry, "check_liveness", check_liveness)
    crs.start()

    # Compensation goes on after the error (m heartbeats meanwhile, so it stays up and is asked).
    eventually(lambda: crs.registry.heartbeat("m") and undone == ["crs-x#0@m"] and crs.pending_compensations() == 0,
               timeout=10, what="the compensation row released after the failed pass")
    assert failures == {"poll": 0, "liveness": 0}
    # Down-detection goes on too: m falls silent and is marked down.
    eventually(lambda: not crs.registry.get("m").up, timeout=10, what="m marked down after it fell silent")
