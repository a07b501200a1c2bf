"""Two runs recorded at once both reach the application's Pareto frontier (SQLite and PostgreSQL)."""

from __future__ import annotations

import threading

import numpy as np

import examples
from application_manager import models as m
from application_manager import service as svc
from application_manager.local import LocalBackend
from application_manager.manifest import parse_manifest
from application_manager.space import from_manifest
from harness.v1 import application_manager_pb2 as pb


class _Ctx:
    def is_active(self) -> bool:
        return True

    def time_remaining(self) -> None:
        return None


def _run(app_id: str, config: dict, time_s: float, cost: float) -> m.Run:
    return m.Run(application_id=app_id, session_id="s", ordinal=0, config=config, input="production", ok=True,
                 time_s=time_s, cost=cost, created_at=0.0)


def test_two_runs_recorded_at_once_are_both_on_the_frontier(db_url, tmp_path, monkeypatch):
    monkeypatch.setattr(svc.ApplicationManager, "_offered_types", lambda self: {"vm"})
    monkeypatch.setattr(LocalBackend, "prices", lambda self: np.ones(len(self.space)))
    am = svc.ApplicationManager(svc.AppManagerConfig(state_dir=str(tmp_path), database=db_url,
                                                     crs_address="127.0.0.1:1"))
    try:
        app = am.SubmitApplication(pb.SubmitApplicationRequest(
            tenant="t", manifest_json=examples.manifest("rtm"), slo_json=examples.slo("rtm"), app_dir="/x"), _Ctx())
        loaded = am._load("t", app.id)
        configs = from_manifest(parse_manifest(examples.manifest("rtm")), {}, {"vm"}).configs
        # Two Pareto-optimal points: fast and dear, slow and cheap.
        fast, cheap = _run(app.id, configs[0], 1.0, 100.0), _run(app.id, configs[1], 10.0, 1.0)
        first_holds, second_read = threading.Event(), threading.Event()
        real_points = am._points

        def points(s, *a):  # type: ignore[no-untyped-def]
            out = real_points(s, *a)
            if threading.current_thread().name == "second":
                second_read.set()
            return out
        monkeypatch.setattr(am, "_points", points)

        def record(run: m.Run, hold: bool) -> None:
            def fn(s) -> None:  # type: ignore[no-untyped-def]
                s.add(run)
                s.flush()
                am._refresh_in(s, loaded)
                if hold:        # not committed yet while the other records its run
                    first_holds.set()
                    second_read.wait(1.0)   # it cannot read the runs while this holds the model (else it has)
            am.db.transact(fn)

        first = threading.Thread(target=record, args=(fast, True), name="first")
        first.start()
        assert first_holds.wait(10)
        second = threading.Thread(target=record, args=(cheap, False), name="second")
        second.start()
        first.join(20)
        second.join(20)
        with am.db.read() as s:
            frontier = s.get(m.Model, app.id).frontier
        assert sorted((p["time_s"], p["cost"]) for p in frontier) == [(1.0, 100.0), (10.0, 1.0)]
    finally:
        am.stop()
