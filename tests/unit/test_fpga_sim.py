"""Simulations of thesis chapter 3 (irm_fpga.sim) on the real engine and policies: small, fast
sanity checks of the Fig. 3.5 and §3.4.3 reproductions."""

from __future__ import annotations

import numpy as np
import pytest

from irm_fpga.sim import SimClock, autoscaling_run, elasticity_cell, make_trace


def test_sim_clock_only_moves_forward() -> None:
    c = SimClock(5.0)
    c.sleep(1.5)
    c.advance_to(7.0)
    assert c.now() == 7.0
    with pytest.raises(ValueError):
        c.advance_to(6.0)


def test_elasticity_cells_behave_like_queues() -> None:
    # 1500 tasks/s of 1 ms on 2 devices: M/D/2 at 75 % load, mean wait about 0.65 ms (the thesis reads
    # about 0.64 ms for this cell); on 8 devices almost no wait; on 1 device the stream is 1.5x too fast
    two = elasticity_cell(1500, 2, duration=20.0, seed=3)
    eight = elasticity_cell(1500, 8, duration=20.0, seed=3)
    one = elasticity_cell(1500, 1, duration=10.0, seed=3)
    assert 0.45 < two.queue_mean_ms < 0.85
    assert two.latency_mean_ms == pytest.approx(two.queue_mean_ms + 1.0)
    assert eight.queue_mean_ms < 0.01 and eight.latency_std_ms < 0.05
    assert one.completed_in_window == pytest.approx(1 / 1.5, abs=0.02)
    assert one.latency_mean_ms > 1000 and one.latency_std_ms > 500
    assert two.tasks == eight.tasks                      # same seed, same stream


def test_traces_are_seeded_and_shaped_as_documented() -> None:
    high, low = make_trace("high", 7), make_trace("low", 7)
    assert high.offered_load() == pytest.approx({"A": 384.0, "B": 768.0, "C": 384.0})
    assert low.offered_load() == pytest.approx({"A": 192.0, "B": 384.0, "C": 192.0})
    again = make_trace("high", 7)
    assert all(np.array_equal(again.arrivals[a], high.arrivals[a]) for a in "ABC")
    assert not np.array_equal(make_trace("high", 8).arrivals["A"], high.arrivals["A"])

    def level(trace, app: str, t: float) -> float:
        return next(lv for s, e, lv in trace.segments[app] if s <= t < e)

    assert level(high, "A", 280) > 4 and level(high, "B", 280) == 0     # A peaks while B is idle
    assert level(high, "A", 170) + level(high, "B", 170) > 8            # A and B exceed the server
    for app, share in (("A", 2), ("B", 4), ("C", 2)):                  # low: all within static shares
        assert max(lv for _, _, lv in low.segments[app]) < share
    with pytest.raises(ValueError):
        make_trace("medium")


def test_autoscaling_sanity_on_the_real_engine_and_policies() -> None:
    high = make_trace("high", 7)
    static = autoscaling_run(high, "static", task_scale=30)
    improved = autoscaling_run(high, "improved", task_scale=30)
    assert static.reconfigurations == 0 and improved.reconfigurations > 0
    assert static.batches == improved.batches == sum(v.size for v in high.arrivals.values())
    # a static A carries its peak's backlog past the trace; resizing finishes (nearly) on time
    assert static.span_s > 330 and improved.span_s < 320
    assert improved.utilisation > static.utilisation + 0.05
    assert improved.mean_batch_latency_s < 0.5 * static.mean_batch_latency_s
    # light load: the improved policy leaves the static split alone
    low = make_trace("low", 7)
    low_static = autoscaling_run(low, "static", task_scale=30)
    low_improved = autoscaling_run(low, "improved", task_scale=30)
    assert low_improved.reconfigurations == 0
    assert low_improved.mean_batch_latency_s == pytest.approx(low_static.mean_batch_latency_s, rel=0.1)
    assert low_static.utilisation == pytest.approx(0.32, abs=0.02)
