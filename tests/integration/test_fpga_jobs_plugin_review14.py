"""Review 14: a plug-in algorithm that keeps failing live is asked ever more rarely, and queued jobs say why they wait.

Before, the job manager asked a broken plug-in again on every control round and every registration (a full
traceback each time; a hanging one's worker killed and started again every second), and a tenant saw only
STATE_QUEUED. Now a failed decision backs the manager off (`irm_fpga.jobs_hydrogen.HydrogenDispatch._decision_failed`: again at once after a
first failure, then after min(period, 1 s), doubling, up to 30 s), logs the traceback once per distinct error and one
line after, and sets `Job.waiting_reason` on queued jobs until a decision succeeds (then they are told what it saw).

The manager runs over the fake Orchestrator on a VirtualClock with a control period of 1 s, stepped by hand (a round
is `control_once` at the next second). The plug-ins are loaded by name in the manager's worker process.
"""

from __future__ import annotations

import logging

import pytest

from harness.v1 import fpga_jobs_pb2 as jp
from irm_fpga import jobs
from irm_fpga.jobs import QUEUED, JobManager
from services.clock import VirtualClock
from tests.conftest import eventually
from tests.integration.fake_orchestrator import DEVICES, deadline, watched_manager

HERE = "tests.integration.test_fpga_jobs_plugin_review14"
START = 1000.0
FIXED_AT = 1040.0           # the clock time from which `broken_for_a_while` decides
ERROR = "boom: review 14's plug-in is broken for now"
KIND = "the scheduling algorithm failed or its answer was refused"


def first_on_min(queue, available):
    return [(queue[0].job_id, queue[0].min_devices)] if queue and queue[0].min_devices <= available else []


def broken_for_a_while(queue, available, window, cost, *, now):
    """Raises until the manager's clock reaches FIXED_AT, then starts the head of the queue on its minimum."""
    if now < FIXED_AT:
        raise RuntimeError(ERROR)
    return first_on_min(queue, available)


def hangs(queue, available, window, cost, *, now):
    while True:
        pass


class Counting:
    """The manager's PluginRunner, recording the clock time of every call (a decision asked of the plug-in)."""

    def __init__(self, runner, clock: VirtualClock) -> None:
        self.runner, self.clock, self.calls = runner, clock, []

    def __call__(self, *args, **kw):
        self.calls.append(self.clock.now())
        return self.runner(*args, **kw)

    def close(self) -> None:
        self.runner.close()


@pytest.fixture
def live(db_url):
    """(manager, clock, counting runner, published Job messages) for a plug-in policy, period 1 s."""
    made = []

    def make(policy: str, **config):
        m, published = watched_manager(db_url, policy, START, **config)
        made.append(m)
        counting = m._plugin = Counting(m._plugin, m.clock)
        return m, m.clock, counting, published

    yield make
    for m in made:
        m.stop()
        m.orch.db.dispose()


def register(m: JobManager, request_id: str, **kw):
    return m.register(jp.RegisterJobRequest(tenant="alice", request_id=request_id, design="sleep",
                                            min_devices=DEVICES, **deadline(60.0, 30), **kw))


def reason(m: JobManager, job_id: str) -> str:
    return m.GetJob(jp.GetJobRequest(tenant="alice", job_id=job_id), None).waiting_reason


def backoff_schedule(first: float, until: float, fixed_at: float = float("inf")) -> list[float]:
    """The decisions a plug-in failing until `fixed_at` is asked for, one round a second from `first` to `until`,
    as `_decision_failed` documents: again at once after one failure, then 1, 2, 4, ... s, at most RETRY_MAX_S."""
    times, t, k = [], first, 0
    while t <= until:
        times.append(t)
        if t >= fixed_at:
            break
        k += 1
        t += 1.0 if k == 1 else min(jobs.RETRY_MAX_S, min(1.0, jobs.RETRY_FIRST_S) * 2 ** (k - 2))
    return times


def test_a_failing_plug_in_is_asked_ever_more_rarely_and_queued_jobs_say_why_until_it_decides(live, caplog):
    caplog.set_level(logging.INFO, logger="irm_fpga.jobs")
    m, clock, plugin, published = live(f"{HERE}:broken_for_a_while")
    a = register(m, "a")                                   # its decision fails
    assert m._job("alice", a.id).state == QUEUED and plugin.calls == [START]
    assert KIND in reason(m, a.id) and "1 failed decision(s) in a row" in reason(m, a.id)
    assert ERROR not in reason(m, a.id)        # its text may quote other tenants' jobs: the log has it
    assert [j.waiting_reason for j in published if j.id == a.id][-1] == reason(m, a.id)    # streamed
    b = None
    for t in range(int(START) + 1, int(START) + 71):       # 70 control rounds
        clock.advance_to(float(t))
        if t == 1005:
            b = register(m, "b")                           # an event while backing off: not asked sooner
            assert plugin.calls[-1] < t and KIND in reason(m, b.id)
        m.control_once()
    # Asked at 1000, 1001, 1002, 1004, 1008, 1016, 1032 (failing) and 1062 (it decides from 1040 on), then once
    # more at 1063 (the round after a dispatch sees the queue changed; as with any policy): 9 times in 71 s, not
    # 42 (every round and registration until it decides).
    assert plugin.calls == [*backoff_schedule(START, START + 70, FIXED_AT), 1063.0] == \
        [1000.0, 1001.0, 1002.0, 1004.0, 1008.0, 1016.0, 1032.0, 1062.0, 1063.0]
    assert m._job("alice", a.id).state == "active" and m._job("alice", b.id).state == QUEUED   # no device for b
    # The failure's reason is cleared by the decision that succeeded; b is told what that decision saw instead.
    assert reason(m, a.id) == "" and KIND not in reason(m, b.id)
    assert reason(m, b.id).startswith("waiting for devices: at the last scheduling decision (1063.000)")
    assert f"{DEVICES} of the pool's {DEVICES} device(s) were held by 1 running job(s), 0 free" in reason(m, b.id)
    assert reason(m, b.id).endswith(f"this job needs at least {DEVICES} device(s)")
    assert KIND not in [j.waiting_reason for j in published if j.id == b.id][-1]
    # The traceback once; a line for each failure after it.
    failures = [r for r in caplog.records if r.name == "irm_fpga.jobs" and "scheduling decision failed" in r.message]
    assert len(failures) == 7
    assert [r.exc_info is not None for r in failures] == [True] + [False] * 6
    assert all(ERROR in r.getMessage() for r in failures[1:])
    # A success ends the backoff: the next event decides at once.
    clock.advance(0.5)
    register(m, "c")
    assert plugin.calls[-1] == clock.now()


@pytest.mark.timeout(120)
def test_a_hanging_plug_ins_worker_is_stopped_ever_more_rarely(live):
    m, clock, plugin, _ = live(f"{HERE}:hangs", plugin_timeout_s=0.2)
    a = register(m, "a")
    assert KIND in reason(m, a.id)
    for _ in range(20):
        clock.advance(1.0)
        m.control_once()
    # Each call is a time-out (or a refusal while its worker starts again): 6 in 21 rounds, not 21.
    assert plugin.calls == backoff_schedule(START, START + 20) == [1000.0, 1001.0, 1002.0, 1004.0, 1008.0, 1016.0]
    assert m._job("alice", a.id).state == QUEUED and "6 failed decision(s) in a row" in reason(m, a.id)
    # Stopped once its replacement worker is up (not while one starts in the background).
    eventually(lambda: plugin.runner.pid, what="the plug-in's replacement worker")
