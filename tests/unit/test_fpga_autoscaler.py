"""Autoscaling policies (irm_fpga.autoscaler) against hand-computed cases: the NNLS runtime
estimate of eq. 3.4, proportional shares (Algorithm 1) within min/max, idle groups shrinking,
and the improved policy's cost-aware hysteresis."""

from __future__ import annotations

import pytest

from irm_fpga.autoscaler import (
    DEPARTED,
    Autoscaler,
    GroupWindow,
    ImprovedPolicy,
    Interval,
    ThesisPolicy,
    apportion,
    estimate_task_times,
    interval_between,
    make_policy,
)
from irm_fpga.engine import Engine, EngineConfig, Task
from services.clock import VirtualClock


def gw(gid: str, size: int, executed: dict[str, int], busy: float, waiting: dict[str, int], *,
       lo: int = 1, hi: int = 8) -> GroupWindow:
    return GroupWindow(gid, size, size, lo, hi, executed, busy, waiting)


def iv(end: float, *groups: GroupWindow, length: float = 10.0, usable: int = 8) -> Interval:
    return Interval(end - length, end, usable, {g.group_id: g for g in groups})


# -- NNLS (eq. 3.4) ---------------------------------------------------------------------------------

def test_nnls_recovers_runtimes_from_interval_counts() -> None:
    rows = [({"a": 10, "b": 0}, 1.0), ({"a": 0, "b": 5}, 1.0), ({"a": 10, "b": 5}, 2.0)]
    assert estimate_task_times(rows) == pytest.approx({"a": 0.1, "b": 0.2})


def test_nnls_keeps_runtimes_non_negative() -> None:
    # least squares alone gives a = -0.5, b = 1.5; with t >= 0: a = 0, b = argmin (b-1)^2 + (b-0.5)^2 = 0.75
    t = estimate_task_times([({"a": 1, "b": 1}, 1.0), ({"a": 2, "b": 1}, 0.5)])
    assert t == pytest.approx({"a": 0.0, "b": 0.75}, abs=1e-12)


def test_nnls_without_executions_knows_nothing() -> None:
    assert estimate_task_times([({"a": 0}, 0.0)]) == {}
    assert estimate_task_times([]) == {}


# -- proportional shares ------------------------------------------------------------------------------

def test_apportion_proportional_with_bounds_and_largest_remainder() -> None:
    lo = {"A": 1, "B": 1, "C": 1}
    hi = {"A": 8, "B": 8, "C": 8}
    assert apportion({"A": 3.0, "B": 1.0, "C": 0.0}, 8, lo, hi) == {"A": 5, "B": 2, "C": 1}
    assert apportion({"A": 3.0, "B": 1.0, "C": 0.0}, 8, lo, {**hi, "A": 4}) == {"A": 4, "B": 3, "C": 1}
    assert apportion({"A": 1.0, "B": 0.0, "C": 1.0}, 8, lo, hi) == {"A": 4, "B": 1, "C": 3}   # tie: by name
    assert apportion({"A": 1.0, "B": 1.0}, 8, {"A": 1, "B": 1}, {"A": 2, "B": 3}) == {"A": 2, "B": 3}
    with pytest.raises(ValueError, match="minimum sizes"):
        apportion({"A": 1.0, "B": 1.0}, 3, {"A": 2, "B": 2}, {"A": 4, "B": 4})


# -- thesis policy (Algorithm 1) ------------------------------------------------------------------------

def thesis_history() -> list[Interval]:
    # A: 2 devices x 10 s for 20,000 tasks -> 1 ms per task; 3,000 waiting -> R = 3 s
    # B: 4 devices x 10 s for 40,000 tasks -> 1 ms; 1,000 waiting -> R = 1 s
    # C: 100 tasks, nothing waiting -> idle, shrinks to its minimum
    return [iv(10.0, gw("A", 2, {"a": 20_000}, 20.0, {"a": 3000}),
               gw("B", 4, {"b": 40_000}, 40.0, {"b": 1000}),
               gw("C", 2, {"c": 100}, 20.0, {"c": 0}))]


def test_thesis_shares_devices_in_proportion_to_pending_work() -> None:
    # idle C keeps 1; 7 devices for R_A : R_B = 3 : 1 -> 5.25 / 1.75 -> 5 / 2 by largest remainder
    assert ThesisPolicy().decide(thesis_history()) == {"A": 5, "B": 2, "C": 1}


def test_thesis_respects_max_and_min() -> None:
    h = thesis_history()
    h[0] = iv(10.0, gw("A", 2, {"a": 20_000}, 20.0, {"a": 3000}, hi=4),
              gw("B", 4, {"b": 40_000}, 40.0, {"b": 1000}),
              gw("C", 2, {"c": 100}, 20.0, {"c": 0}, lo=2))
    assert ThesisPolicy().decide(h) == {"A": 4, "B": 2, "C": 2}


def test_thesis_leaves_static_groups_and_unknown_runtimes_alone() -> None:
    h = [iv(10.0, gw("A", 2, {"a": 20_000}, 20.0, {"a": 3000}),
            gw("S", 3, {"s": 10}, 1.0, {"s": 50}, lo=3, hi=3),          # static: min == max
            gw("N", 1, {}, 0.0, {"new": 40}))]                          # waiting, never executed
    assert ThesisPolicy().decide(h) == {"A": 4, "S": 3, "N": 1}


def test_thesis_estimates_with_interval_or_busy_time() -> None:
    # A worked 5 of its 20 device-seconds: eq. 3.4 as written assumes 20 (4 ms per task), busy time says 1 ms
    h = [iv(10.0, gw("A", 2, {"a": 5000}, 5.0, {"a": 4000}), gw("B", 6, {"b": 60_000}, 60.0, {"b": 4000}))]
    assert ThesisPolicy(rhs="interval").decide(h) == {"A": 6, "B": 2}     # R = 16 : 4
    assert ThesisPolicy(rhs="busy").decide(h) == {"A": 4, "B": 4}         # R = 4 : 4


def test_idle_server_shrinks_every_group_to_its_minimum() -> None:
    h = [iv(10.0, gw("A", 2, {"a": 10}, 0.01, {}), gw("B", 6, {"b": 10}, 0.01, {"b": 0}, lo=2))]
    assert ThesisPolicy().decide(h) == {"A": 1, "B": 2}


# -- improved policy -----------------------------------------------------------------------------------

def light_history() -> list[Interval]:
    # every group well within its size; C idle
    return [iv(10.0 * (i + 1), gw("A", 2, {"a": 5000}, 5.0, {"a": 200}),
               gw("B", 4, {"b": 12_000}, 12.0, {"b": 300}),
               gw("C", 2, {}, 0.0, {})) for i in range(3)]


def test_improved_does_not_reconfigure_under_light_load() -> None:
    h = light_history()
    assert ImprovedPolicy().decide(h) == {"A": 2, "B": 4, "C": 2}
    assert ThesisPolicy(rhs="busy").decide(h) != {"A": 2, "B": 4, "C": 2}     # the thesis over-reacts


def test_improved_feeds_an_overloaded_group_from_idle_ones() -> None:
    h = [iv(10.0, gw("A", 2, {"a": 20_000}, 20.0, {"a": 0}), gw("B", 4, {}, 0.0, {}), gw("C", 2, {}, 0.0, {})),
         # A saturated again and 20 device-seconds behind: load (20 + 20) / 10 = 4, need 4 + 20/5 = 8
         iv(20.0, gw("A", 2, {"a": 20_000}, 20.0, {"a": 20_000}), gw("B", 4, {}, 0.0, {}), gw("C", 2, {}, 0.0, {}))]
    d = ImprovedPolicy().demands(h)["A"]
    assert d is not None and (d.load, d.backlog_s, d.need) == pytest.approx((4.0, 20.0, 8.0))
    assert ImprovedPolicy().decide(h) == {"A": 6, "B": 1, "C": 1}


def test_improved_ignores_a_shortfall_that_does_not_pay_the_reconfiguration() -> None:
    # A's need is 2.3 on 2 devices: 0.3 devices x 10 s = 3 device-seconds < 3.78 s of reconfiguration
    h = [iv(10.0, gw("A", 2, {"a": 20_000}, 20.0, {"a": 1500}), gw("B", 4, {}, 0.0, {}), gw("C", 2, {}, 0.0, {}))]
    assert ImprovedPolicy().demands(h)["A"].need == pytest.approx(2.3)
    assert ImprovedPolicy().decide(h) == {"A": 2, "B": 4, "C": 2}
    assert ImprovedPolicy(reconfig_s=2.0).decide(h) == {"A": 3, "B": 3, "C": 2}


def test_improved_keeps_devices_of_a_recently_busy_group() -> None:
    busy_b = gw("B", 4, {"b": 30_000}, 30.0, {"b": 0})
    idle_b = gw("B", 4, {"b": 0}, 0.0, {"b": 0})
    a = gw("A", 2, {"a": 20_000}, 20.0, {"a": 8000})     # load 2, backlog 8: need 2 + 8/5 = 3.6
    recent = [iv(10.0, a, busy_b, usable=6), iv(20.0, a, busy_b, usable=6), iv(30.0, a, idle_b, usable=6)]
    # B went quiet one interval ago: over its last 3 intervals it still averages 2 devices' load. A
    # (pressure 3.6 / 2 = 1.8) gets one device (B keeps 2 / 3 x 1.25 = 0.83), not a second (2 / 2 x 1.25 > 1.2)
    assert ImprovedPolicy().decide(recent) == {"A": 3, "B": 3}
    # without that memory, B is simply idle and A gets what it needs
    assert ImprovedPolicy(memory=1).decide(recent) == {"A": 4, "B": 2}


def test_improved_in_contention_moves_only_to_a_clearly_more_loaded_group() -> None:
    a8 = gw("A", 3, {"a": 30_000}, 30.0, {"a": 25_000})     # load 3 + 25/5 -> need 8, pressure 2.67
    b5 = gw("B", 4, {"b": 40_000}, 40.0, {"b": 5000})       # load 4 + 5/5 -> need 5
    c1 = gw("C", 1, {"c": 100}, 10.0, {"c": 0})
    # B at 3 devices: 5/3 x 1.25 = 2.08 < 2.67: move; then A at 2.0 < 5/2 x 1.25: stop
    assert ImprovedPolicy().decide([iv(10.0, a8, b5, c1)]) == {"A": 4, "B": 3, "C": 1}
    a6 = gw("A", 3, {"a": 30_000}, 30.0, {"a": 15_000})     # need 6, pressure 2.0 < 2.08: no move
    assert ImprovedPolicy().decide([iv(10.0, a6, b5, c1)]) == {"A": 3, "B": 4, "C": 1}


# -- registry and wrapper ------------------------------------------------------------------------------

def test_policies_are_chosen_by_name() -> None:
    assert make_policy("thesis").name == "thesis"
    assert make_policy("improved", margin=0.5).margin == 0.5
    assert make_policy("static", sizes={"A": 2}).decide(thesis_history()) == {"A": 2, "B": 4, "C": 2}
    with pytest.raises(ValueError, match="unknown autoscaling policy 'greedy'"):
        Autoscaler("greedy")
    with pytest.raises(ValueError, match="policy 'thesis'"):
        make_policy("thesis", colour="red")
    with pytest.raises(ValueError, match="rhs"):
        make_policy("thesis", rhs="vibes")


def test_interval_between_snapshots_of_a_live_engine() -> None:
    clock = VirtualClock()
    e = Engine(clock, EngineConfig(reconfig_mean_s=1.0, reconfig_std_s=0.0))
    e.create_group("A", "sleep", 2)
    e.create_group("B", "fft", 2)
    clock.advance_to(2.0)
    e.advance()
    e.attach_client("A", "a1")
    e.attach_client("A", "a2")
    m0 = e.measurements()
    e.submit("a1", [Task(i, {"duration": 0.01}) for i in range(300)])
    e.submit("a2", [Task(i, {"duration": 0.05}) for i in range(100)])
    clock.advance_to(4.0)
    e.advance()
    e.detach_client("a2")        # leaves once its work is done
    clock.advance_to(12.0)
    e.advance()
    m1 = e.measurements()
    i1 = interval_between(m0, m1)
    g = i1.groups["A"]
    assert i1.length == pytest.approx(10.0) and g.busy_s == pytest.approx(300 * 0.01 + 100 * 0.05)
    assert g.executed["a1"] == 300 and g.executed[DEPARTED] == 100
    # the wrapper: first snapshot is a baseline, then decisions name only groups that change
    scaler = Autoscaler("thesis")
    assert scaler.step(m0) == {}
    d = scaler.step(m1)
    assert d == {"A": 1, "B": 1}          # nothing waits: both shrink to their minimum
    e.apply_sizes(d)
    assert [gi.target for gi in e.groups()] == [1, 1]


def test_a_group_made_again_between_snapshots_counts_everything_since_as_new() -> None:
    clock = VirtualClock()
    e = Engine(clock, EngineConfig(reconfig_mean_s=1.0, reconfig_std_s=0.0))

    def make_and_run(tasks: int, until: float) -> None:
        e.create_group("A", "sleep", 1)
        clock.advance_to(until - 1.0)          # reconfigured
        e.advance()
        e.attach_client("A", "a")
        e.submit("a", [Task(i, {"duration": 0.01}) for i in range(tasks)])
        clock.advance_to(until)
        e.advance()

    make_and_run(50, 3.0)
    m0 = e.measurements()
    e.delete_group("A")            # as a restarted server's part the Orchestrator makes again
    make_and_run(10, 6.0)
    g = interval_between(m0, e.measurements()).groups["A"]
    assert g.executed == {"a": 10} and g.busy_s == pytest.approx(0.1)    # not 10 - 50 tasks, 0.1 - 0.5 s
