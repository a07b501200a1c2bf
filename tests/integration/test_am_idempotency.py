"""Concurrent retries of SubmitApplication and ExecuteApplication with one request id get one application /
one execution, on SQLite and PostgreSQL, also when two Application Manager processes share the database.

The Application Manager runs in-process (its servicer called from threads, as gRPC's worker threads call it);
the CRS is out of reach (127.0.0.1:1), so the offered resource types, the prices and the back-end's `run`
are stood in for: what is under test is the look-up and insert of the request id, not the run.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor, as_completed
from typing import Any

import numpy as np
import pytest

import examples
from application_manager import service as svc
from application_manager.local import LocalBackend, RunDetail
from application_manager.profilers.base import Observation
from harness.v1 import application_manager_pb2 as pb

THREADS = 8


class _Ctx:
    """A live RPC's context: never cancelled during these tests."""

    def is_active(self) -> bool:
        return True

    def add_callback(self, callback: Callable[[], None]) -> bool:
        return True


@pytest.fixture
def make_am(db_url, monkeypatch) -> Iterator[Callable[[], svc.ApplicationManager]]:
    monkeypatch.setattr(svc.ApplicationManager, "_offered_types", lambda self: {"vm"})
    monkeypatch.setattr(LocalBackend, "prices", lambda self: np.ones(len(self.space)))
    made: list[svc.ApplicationManager] = []

    def make() -> svc.ApplicationManager:
        made.append(svc.ApplicationManager(svc.AppManagerConfig(database=db_url, crs_address="127.0.0.1:1")))
        return made[-1]

    yield make
    for am in made:
        am.stop()


def _submit_request(request_id: str) -> pb.SubmitApplicationRequest:
    return pb.SubmitApplicationRequest(tenant="t", request_id=request_id, manifest_json=examples.manifest("rtm"),
                                       slo_json=examples.slo("rtm", rows=200, steps=20), app_dir="/x")


def _all_in_flight(monkeypatch, name: str) -> None:
    """Hold every request at the service's `name` (a call to the CRS, between the look for the request id and
    the insert) until all THREADS requests are there: each retry arrives while the others are still in
    flight, which is when the look alone finds nothing for any of them."""
    together = threading.Barrier(THREADS)
    real = getattr(svc.ApplicationManager, name)
    calls = itertools.count()

    def held(self, *args):  # type: ignore[no-untyped-def]
        if next(calls) < THREADS:          # the racing requests; later ones pass
            together.wait(timeout=30)
        return real(self, *args)

    monkeypatch.setattr(svc.ApplicationManager, name, held)


def test_concurrent_submit_retries_with_one_request_id_get_one_application(make_am, monkeypatch):
    am = make_am()
    request = _submit_request("submit-once")
    _all_in_flight(monkeypatch, "_offered_types")
    with ThreadPoolExecutor(THREADS) as pool:
        answers = [f.result() for f in [pool.submit(am.SubmitApplication, request, _Ctx()) for _ in range(THREADS)]]
    ids = {a.id for a in answers}
    assert len(ids) == 1
    listed = am.ListApplications(pb.ListApplicationsRequest(tenant="t"), _Ctx()).applications
    assert [a.id for a in listed] == list(ids)
    # The key is the tenant's: another tenant's request with the same key is another application.
    other = am.SubmitApplication(pb.SubmitApplicationRequest(
        tenant="u", request_id="submit-once", manifest_json=examples.manifest("rtm"), app_dir="/x"), _Ctx())
    assert other.id not in ids


def losing_the_race(real: Callable[[str, str], Any], other: Callable[[], Any]) -> tuple[Callable, list, list[int]]:
    """`real` (an AM's look for an earlier request id) that, at its second call (the look under the lock, right
    before the insert), finds nothing and then lets `other` (another AM process) make the row first.

    Returns the stand-in, what `other` answered, and [calls]."""
    answers: list[Any] = []
    calls = [0]

    def look(tenant: str, request_id: str):  # type: ignore[no-untyped-def]
        calls[0] += 1
        found = real(tenant, request_id)
        if calls[0] == 2:
            assert found is None
            answers.append(other())
        return found

    return look, answers, calls


def test_a_submit_raced_by_another_am_process_on_the_same_database_returns_that_ones_application(make_am):
    # B looks for the request id and misses; A (another process: its own lock) inserts it; B inserts: the
    # database's unique (tenant, request_id) refuses B's row, and B must answer with A's application.
    first, second = make_am(), make_am()
    request = _submit_request("two-processes")
    look, answers, calls = losing_the_race(second._prior_application,
                                           lambda: first.SubmitApplication(request, _Ctx()))
    second._prior_application = look  # type: ignore[method-assign]
    app = second.SubmitApplication(request, _Ctx())
    assert calls == [3] and app.id == answers[0].id
    assert [a.id for a in second.ListApplications(pb.ListApplicationsRequest(tenant="t"), _Ctx()).applications] \
        == [app.id]


@pytest.fixture
def held_run(monkeypatch):
    """The back-end's run, held until `release` is set; `runs` counts the runs started."""
    state: dict[str, Any] = {"release": threading.Event(), "runs": 0}
    lock = threading.Lock()

    def run(self, proposal, *, request_id="", timeout_s=0.0, cost_limit=0.0):  # noqa: ANN001, ANN202
        with lock:
            state["runs"] += 1
        assert state["release"].wait(timeout=60), "never released"
        return RunDetail(Observation(proposal.config, True, 2.0, 0.5, proposal.input), "res-1", "done")

    monkeypatch.setattr(LocalBackend, "run", run)
    return state


def test_concurrent_execute_retries_with_one_request_id_get_one_execution(make_am, held_run, monkeypatch):
    am = make_am()
    app = am.SubmitApplication(_submit_request(""), _Ctx())
    request = pb.ExecuteApplicationRequest(tenant="t", application_id=app.id, request_id="exec-once", online=True)
    _all_in_flight(monkeypatch, "_explore")       # nothing profiled: online, each asks the profiler (and CRS)
    with ThreadPoolExecutor(THREADS) as pool:
        done = as_completed([pool.submit(am.ExecuteApplication, request, _Ctx()) for _ in range(THREADS)],
                            timeout=60)
        # Every retry but the one running the application answers while it runs: with what it has so far.
        retries = [next(done).result() for _ in range(THREADS - 1)]
        held_run["release"].set()
        ran = next(done).result()
    assert held_run["runs"] == 1
    assert {e.id for e in retries} == {ran.id}
    assert all(e.state == pb.ApplicationExecution.STATE_RUNNING for e in retries)
    assert ran.state == pb.ApplicationExecution.STATE_SUCCEEDED and ran.measured_time_s == 2.0
    (listed,) = am.ListExecutions(pb.ListExecutionsRequest(tenant="t"), _Ctx()).executions
    assert listed.id == ran.id and listed.state == pb.ApplicationExecution.STATE_SUCCEEDED
    assert am.ExecuteApplication(request, _Ctx()).id == ran.id          # a later retry: the same one
    assert held_run["runs"] == 1


def test_an_execute_raced_by_another_am_process_on_the_same_database_returns_that_ones_execution(
        make_am, held_run):
    first, second = make_am(), make_am()
    app = first.SubmitApplication(_submit_request(""), _Ctx())
    request = pb.ExecuteApplicationRequest(tenant="t", application_id=app.id, request_id="exec-two", online=True)
    held_run["release"].set()
    look, answers, calls = losing_the_race(second._prior_execution,
                                           lambda: first.ExecuteApplication(request, _Ctx()))
    second._prior_execution = look  # type: ignore[method-assign]
    execution = second.ExecuteApplication(request, _Ctx())
    assert calls == [3] and execution.id == answers[0].id
    assert execution.state == pb.ApplicationExecution.STATE_SUCCEEDED
    assert held_run["runs"] == 1
    assert [e.id for e in second.ListExecutions(pb.ListExecutionsRequest(tenant="t"), _Ctx()).executions] \
        == [execution.id]
