"""Drives a profiler: ask for a configuration, run it on a back-end, tell, until a stop rule holds.

Stop rules (thesis §4.2.3): a number of runs, a profiling budget (sum of the runs' costs),
a duration (on an injected clock), or an explicit stop. Pure apart from the callables it
is given, so the same loop runs in the service (real runs, wall clock) and in the bench
(replayed runs).

A run that failed through no fault of its configuration (Observation.transient: the CRS restarting, a manager
down, no room for now) is no run of the budget: the next one waits (`Patience`), longer after each such failure
in a row, and a streak that outlasts the patience ends the session ("transient") rather than burning it. After a
failure that `again` says was the cloud's as a whole, the same proposal is run again: asking the profiler for
another would spend the space (each configuration tried once per session) on the outage.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from application_manager.profilers.base import Observation, Profiler, Proposal
from services.clock import Clock


@dataclass(frozen=True)
class StopRules:
    max_runs: int = 10
    max_cost: float = 0.0  # 0: no budget
    max_duration_s: float = 0.0  # 0: no limit


@dataclass(frozen=True)
class Patience:
    """How transient failures in a row are waited out. After the n-th, the next run waits `first_s` x 2^(n-1), at
    most `max_s`, and never less than the CRS asked for (Observation.retry_after_s). The session ends once the
    streak has lasted `give_up_s` (on the clock; the wait that would pass it is not waited) or reached `max_in_row`
    failures."""
    first_s: float = 0.5
    max_s: float = 30.0
    give_up_s: float = 300.0
    max_in_row: int = 30

    def delay(self, in_row: int, asked: float | None) -> float:
        backoff = min(self.max_s, self.first_s * 2.0 ** min(in_row - 1, 62))
        return max(backoff, asked or 0.0)


def profile(profiler: Profiler, execute: Callable[[Proposal], Observation], rules: StopRules, *,
            clock: Clock | None = None, stopped: Callable[[], bool] = lambda: False,
            on_run: Callable[[Proposal, Observation, list[Observation]], None] | None = None,
            observed: list[Observation] | None = None, patience: Patience = Patience(),
            wait: Callable[[float], object] | None = None,
            again: Callable[[Observation], bool] = lambda o: False) -> tuple[list[Observation], str]:
    """Returns (observations, why it stopped). `observed`: earlier runs the profiler learns from; the stop rules
    count only the runs made here. `wait(s)`: the pause after a transient failure, which must end early once
    `stopped()` holds (an Event's wait); without it, none (replayed runs are never transient). `again(o)`: whether
    the transient failure `o` is run again after the pause rather than the profiler's next proposal."""
    obs = list(observed or [])
    start = clock.now() if clock else 0.0
    spent = 0.0     # this session's runs only, as `runs`: earlier sessions' costs are not this budget's
    runs = 0
    in_row = 0      # transient failures since the last run that measured its configuration
    streak_start = 0.0
    retry: Proposal | None = None
    while True:
        if stopped():
            return obs, "stopped"
        if runs >= rules.max_runs:
            return obs, "iterations"
        if rules.max_cost > 0 and spent >= rules.max_cost:
            return obs, "budget"
        if rules.max_duration_s > 0 and clock is not None and clock.now() - start >= rules.max_duration_s:
            return obs, "duration"
        proposal, retry = retry or profiler.propose(obs), None
        if proposal is None:
            return obs, "exhausted"
        o = execute(proposal)
        obs.append(o)
        spent += o.cost
        if on_run:
            on_run(proposal, o, obs)
        if not o.transient:
            runs += 1
            in_row = 0
            continue
        if stopped():
            continue        # a stopped or cut-short run: no wait before the rule that ends the session
        now = clock.now() if clock else 0.0
        if in_row == 0:
            streak_start = now
        in_row += 1
        pause = patience.delay(in_row, o.retry_after_s)
        if in_row >= patience.max_in_row or (clock is not None and now + pause - streak_start > patience.give_up_s):
            return obs, "transient"
        if rules.max_duration_s > 0 and clock is not None:
            # Woken when the duration runs out, the loop's check ends the session by it.
            pause = min(pause, max(0.0, start + rules.max_duration_s - now))
        if again(o):
            retry = proposal
        if wait is not None and pause > 0:
            wait(pause)
