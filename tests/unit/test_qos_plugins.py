"""Scheduling algorithms plugged in by name (irm_fpga.qos.plugins): loading, checking, simulating.

The example plug-in `examples.qos.longest_first:longest_first` starts the longest jobs of the window first,
each on its minimum. Live use (the FPGA IRM's job manager) is in tests/integration/test_fpga_jobs_hydrogen.py.
"""

from importlib.metadata import EntryPoint

import pytest

from examples.qos.longest_first import longest_first
from irm_fpga.qos import dispatch, plugins
from irm_fpga.qos.hydrogen import HJob, linear_cost
from irm_fpga.qos.plugins import PolicyError, UnknownPolicy, check_allocation, single_algorithm
from irm_fpga.qos.registry import get_policy, is_scheduling
from irm_fpga.qos.sim import JobType, Scenario, run_hydrogen

EXAMPLE = "examples.qos.longest_first:longest_first"
QUEUE = [HJob("short", 0.0, 0.5, 1, 2), HJob("long", 0.1, 4.0, 2, 4), HJob("mid", 0.2, 1.0, 1, 1)]


not_a_function = 42     # a plug-in name that resolves to something that is not callable


def wrong_arity(queue):
    return []


def greedy(queue, available, window, cost, *, now=0.0):
    """A buggy plug-in: every queued job on its max, whatever is free."""
    return [(j.job_id, j.max_devices) for j in queue]


def test_a_plug_in_decides_like_a_built_in():
    assert single_algorithm(EXAMPLE) is longest_first and get_policy(EXAMPLE) is longest_first
    assert is_scheduling(EXAMPLE) and not is_scheduling("no_such_thing")
    s = dispatch.scheduler_for(EXAMPLE)
    # 3 free: long (4 s) on its min 2, then mid (1 s) on 1; short waits.
    d = dispatch.decide(s, QUEUE, now=0.3, pool=3, pool_max=3)
    assert d.allocation == [("long", 2), ("mid", 1)] and d.pool == 3
    # sjtf on the same queue starts the short ones first.
    assert dispatch.decide(dispatch.scheduler_for("sjtf"), QUEUE, now=0.3, pool=3, pool_max=3).allocation == \
        [("short", 1), ("mid", 1)]


def test_a_plug_in_runs_in_the_simulator():
    sc = Scenario("two", (JobType("short", 0.5, 1, 2, 0.7), JobType("long", 4.0 / 3.0, 1, 4, 0.3)),
                  rate=4.4, duration=30.0, strategy="completion time", spread=0.4)
    trace = []
    m = run_hydrogen(sc, EXAMPLE, 0, trace=trace)
    assert m.N_C > 100 and len(trace) >= m.N_C
    assert all(n == job.min_devices for job, _, n, _ in trace)
    # Its choices differ from sjtf's on the same arrivals (long jobs overtake short ones).
    sjtf_trace = []
    run_hydrogen(sc, "sjtf", 0, trace=sjtf_trace)
    assert [j.job_id for j, *_ in trace] != [j.job_id for j, *_ in sjtf_trace]


def test_an_entry_point_names_a_plug_in(monkeypatch):
    ep = EntryPoint("longest_first", EXAMPLE, plugins.ENTRY_POINT_GROUP)
    monkeypatch.setattr(plugins, "_entry_points", lambda: [ep])
    single_algorithm.cache_clear()
    try:
        assert is_scheduling("longest_first") and single_algorithm("longest_first") is longest_first
        assert dispatch.decide(dispatch.scheduler_for("longest_first"), QUEUE, now=0.3, pool=3,
                               pool_max=3).allocation == [("long", 2), ("mid", 1)]
    finally:
        single_algorithm.cache_clear()


def test_an_entry_point_named_as_a_built_in_is_said_never_used(monkeypatch, caplog):
    # Review 25: the built-in ran and nothing said so (a researcher's plug-in silently not compared).
    ep = EntryPoint("fcfs_min", EXAMPLE, plugins.ENTRY_POINT_GROUP)
    monkeypatch.setattr(plugins, "_entry_points", lambda: [ep])
    single_algorithm.cache_clear()
    try:
        assert single_algorithm("fcfs_min") is plugins.BUILT_IN["fcfs_min"]
        assert f"entry point 'fcfs_min' of group 'harness.qos_algorithms' ({EXAMPLE}) is never used: the built-in " \
               "algorithm of that name runs; register the plug-in under another name" in caplog.text
    finally:
        single_algorithm.cache_clear()


@pytest.mark.parametrize(("name", "error", "match"), [
    ("no_such_algorithm", UnknownPolicy, "unknown scheduling algorithm 'no_such_algorithm'.*package.module:function"),
    ("no.such.module:f", UnknownPolicy, "cannot load 'f' from module 'no.such.module'"),
    ("tests.unit.test_qos_plugins:missing", UnknownPolicy, "cannot load 'missing'"),
    ("tests.unit.test_qos_plugins:not_a_function", PolicyError, "is a int, not a function"),
    ("tests.unit.test_qos_plugins:wrong_arity", PolicyError, r"must accept \(queue, available, window, cost, \*, now\)"),
])
def test_a_bad_name_fails_when_the_scheduler_is_made_and_says_why(name, error, match):
    with pytest.raises(error, match=match):
        dispatch.Scheduler(name)
    with pytest.raises(KeyError if error is UnknownPolicy else ValueError):
        get_policy(name)


def test_a_plug_ins_answer_is_checked_before_it_is_acted_on():
    s = dispatch.scheduler_for("tests.unit.test_qos_plugins:greedy")
    with pytest.raises(PolicyError, match="on 7 devices; 3 are free"):
        dispatch.decide(s, QUEUE, now=0.3, pool=3, pool_max=3)
    name = "p"
    cases = [([("ghost", 1)], "started 'ghost', which is not among the first 3"),
             ([("mid", 1), ("mid", 1)], "started 'mid' twice"),
             ([("long", 1)], "gave 'long' 1 devices; it allows 2..4"),
             ([("long", 5)], "gave 'long' 5 devices"),
             ([("short", 1), ("long", 3)], "on 4 devices; 3 are free"),
             (None, "returned None; expected a list of"),
             ([("mid",)], "expected a list of")]
    for allocation, match in cases:
        with pytest.raises(PolicyError, match=match):
            check_allocation(name, allocation, QUEUE, 3, 3)
    with pytest.raises(PolicyError, match="not among the first 1"):
        check_allocation(name, [("long", 2)], QUEUE, 1, 4)          # outside the window
    assert check_allocation(name, (("long", 2), ("mid", 1)), QUEUE, 3, 3) == [("long", 2), ("mid", 1)]
    assert check_allocation(name, [], QUEUE, 3, 0) == []


def pops(queue, available, window, cost, *, now=0.0):
    """FCFS at the minimum written as a consumer: pops what it starts from the list it is given."""
    out = []
    while queue and available >= queue[0].min_devices:
        job = queue.pop(0)
        out.append((job.job_id, job.min_devices))
        available -= job.min_devices
    return out


def sorts_in_place(queue, available, window, cost, *, now=0.0):
    """Longest first, by sorting the list it is given: its window is then another one."""
    queue.sort(key=lambda j: -j.default_time)
    return [(j.job_id, j.min_devices) for j in queue[:window]][:1]


def adds_its_own(queue, available, window, cost, *, now=0.0):
    queue.append(HJob("ghost", 0.0, 1.0))
    return [("ghost", 1)]


def exits(queue, available, window, cost, *, now=0.0):
    raise SystemExit(3)


def test_a_plug_in_that_changes_the_queue_it_is_given_is_checked_against_the_queue_as_it_was():
    def decide(name: str, window: int = 3) -> list:
        s = dispatch.scheduler_for(f"tests.unit.test_qos_plugins:{name}", window=window)
        queue = list(QUEUE)
        try:
            return dispatch.decide(s, queue, now=0.3, pool=3, pool_max=4).allocation
        finally:
            assert queue == QUEUE                     # the caller's queue is never changed
    assert decide("pops") == [("short", 1), ("long", 2)]
    with pytest.raises(PolicyError, match="'long', which is not among the first 1"):
        decide("sorts_in_place", window=1)           # 'long' is second in arrival order: outside the window
    with pytest.raises(PolicyError, match="'ghost', which is not among"):
        decide("adds_its_own")
    with pytest.raises(PolicyError, match=r"called exit\(3\)"):
        decide("exits")


def test_built_ins_are_not_shadowed():
    assert single_algorithm("sjtf") is get_policy("sjtf")
    assert longest_first(QUEUE, 0, 3, linear_cost) == []


def test_an_unknown_job_policy_at_start_up_says_every_way_to_name_one() -> None:
    from irm_fpga.jobs_config import JobsConfig, checked_scheduler

    with pytest.raises(ValueError) as e:
        checked_scheduler(JobsConfig(policy="nope"))
    said = str(e.value)
    assert "unknown policy 'nope'" in said and "'package.module:function'" in said
    assert "entry point of group 'harness.qos_algorithms'" in said
