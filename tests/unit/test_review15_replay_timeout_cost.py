"""The compute agent's replay back-end keeps the run's timeout as a live run does, and a replayed run's cost is
what was measured, a free run (cost 0) included."""

from __future__ import annotations

import pytest

import examples
from application_manager import local
from application_manager.local import LocalBackend
from application_manager.manifest import parse_manifest
from application_manager.profilers.base import Proposal
from application_manager.replay import Dataset
from application_manager.slo import parse_slo
from application_manager.space import from_manifest
from harness.v1 import agent_pb2, irm_pb2
from irm_compute.replay import ReplayBackend, ReplayedExited
from irm_compute.sandbox import TIMEOUT

DATASET = """workload,runtime_s,cost,status,vcpus
sort,120.0,0.60,ok,4
sort,40.0,0.20,ok,8
sort,90.0,0.30,out of memory,2
"""


@pytest.fixture
def replay(tmp_path) -> ReplayBackend:  # noqa: ANN001
    path = tmp_path / "runs.csv"
    path.write_text(DATASET)
    return ReplayBackend(Dataset.load(path), str(path))


def _run(backend: ReplayBackend, vcpus: int, timeout_s: float):  # type: ignore[no-untyped-def]
    ex = backend.execution("ex-1", ["app"], {"HARNESS_REPLAY_WORKLOAD": "sort", "vcpus": str(vcpus)},
                           timeout_s=timeout_s)
    ex.start()
    return ex, list(ex.events())


def test_a_replayed_run_longer_than_its_timeout_ends_at_the_limit(replay):  # noqa: ANN001
    ex, events = _run(replay, 4, 60.0)
    exited = events[-1]
    assert (exited.exit_code, exited.wall_time_s, exited.reason) == (-9, 60.0, TIMEOUT)
    assert exited.replayed_cost == pytest.approx(0.30)      # half the measured run, billed as it was
    assert ex.wait(0) is exited and b"timeout" in b"".join(e.data for e in events if hasattr(e, "data"))
    # A failure later than the limit never happened: the live run was killed first.
    _, events = _run(replay, 2, 60.0)
    assert (events[-1].exit_code, events[-1].wall_time_s, events[-1].reason) == (-9, 60.0, TIMEOUT)


def test_a_replayed_run_within_its_timeout_or_without_one_is_as_measured(replay):  # noqa: ANN001
    for vcpus, timeout_s in ((8, 60.0), (8, 40.0), (4, 0.0)):
        _, events = _run(replay, vcpus, timeout_s)
        exited = events[-1]
        assert exited.exit_code == 0 and exited.reason == ""
        assert exited.wall_time_s == (40.0 if vcpus == 8 else 120.0)
    _, events = _run(replay, 2, 0.0)
    assert (events[-1].exit_code, events[-1].reason) == (1, "out of memory")


def test_a_replayed_end_says_it_is_replayed(replay):  # noqa: ANN001
    _, events = _run(replay, 8, 0.0)
    assert isinstance(events[-1], ReplayedExited)


class _Crs:
    def Reserve(self, req, timeout=None):  # noqa: ANN001, ANN201, N802
        return irm_pb2.Reservation(id="r1", price_per_minute=6.0, groups=[irm_pb2.AllocatedGroup(
            name=g.name, resources=[irm_pb2.AllocatedResource(id="vm1", address="127.0.0.1:1")]) for g in req.groups])

    def ReleaseReservation(self, req, timeout=None):  # noqa: ANN001, ANN201, N802
        return None


def _agent(exited: agent_pb2.ExecutionExited):  # type: ignore[no-untyped-def]
    class Agent:
        def __init__(self, channel) -> None:  # noqa: ANN001
            pass

        def Execute(self, req, timeout=None):  # noqa: ANN001, ANN201, N802
            yield agent_pb2.ExecuteEvent(started=agent_pb2.ExecutionStarted(execution_id="e1"))
            yield agent_pb2.ExecuteEvent(exited=exited)

    return Agent


@pytest.mark.parametrize(("exited", "cost"), [
    (agent_pb2.ExecutionExited(wall_time_s=30.0, replayed=True, replayed_cost=0.0), 0.0),   # measured free
    (agent_pb2.ExecutionExited(wall_time_s=30.0, replayed=True, replayed_cost=0.4), 0.4),
    (agent_pb2.ExecutionExited(wall_time_s=30.0, replayed_cost=0.4), 0.4),    # an agent from before `replayed`
    (agent_pb2.ExecutionExited(wall_time_s=30.0), 3.0),                       # live: 6 per minute for 30 s
])
def test_a_replayed_run_costs_what_was_measured_even_nothing(monkeypatch, exited, cost):  # noqa: ANN001
    monkeypatch.setattr(local.irm_pb2_grpc, "ResourceManagerStub", lambda ch: _Crs())
    monkeypatch.setattr(local.agent_pb2_grpc, "ExecutionAgentStub", _agent(exited))
    m = parse_manifest(examples.manifest("rtm"))
    slo = parse_slo(examples.slo("rtm", rows=400, steps=20), m)
    b = LocalBackend("127.0.0.1:1", "t", m, from_manifest(m, slo.parameters, {"vm"}), slo.parameters, "/a", "py", 30)
    o = b.run(Proposal(0)).observation
    assert o.ok and o.time_s == 30.0
    assert o.cost == pytest.approx(cost, rel=0.01)       # a live run's start-up time is billed too


def test_a_replayed_run_ends_where_its_cost_reaches_the_cost_limit(replay):  # noqa: ANN001
    # 0.60 measured over 120 s: 0.15 is reached 30 s in; the earlier of the two limits ends it.
    for timeout_s, at, reason, cost in ((0.0, 30.0, "cost limit", 0.15), (100.0, 30.0, "cost limit", 0.15),
                                        (20.0, 20.0, TIMEOUT, 0.10)):
        ex = replay.execution("ex-1", ["app"], {"HARNESS_REPLAY_WORKLOAD": "sort", "vcpus": "4"},
                              timeout_s=timeout_s, cost_limit=0.15)
        ex.start()
        events = list(ex.events())
        exited = events[-1]
        assert (exited.exit_code, exited.wall_time_s, exited.reason) == (-9, pytest.approx(at), reason)
        assert exited.replayed_cost == pytest.approx(cost)
        assert reason.encode() in b"".join(e.data for e in events if hasattr(e, "data"))
    # A run that costs less than the limit is as measured; a free one too.
    ex = replay.execution("ex-1", ["app"], {"HARNESS_REPLAY_WORKLOAD": "sort", "vcpus": "8"}, cost_limit=0.25)
    ex.start()
    assert (ex.wait(0).reason, ex.wait(0).replayed_cost, ex.wait(0).wall_time_s) == ("", 0.20, 40.0)
