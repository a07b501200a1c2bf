"""Drives a profiler: ask for a configuration, run it on a back-end, tell, until a stop rule holds.

Stop rules (thesis §4.2.3): a number of runs, a profiling budget (sum of the runs' costs),
a duration (on an injected clock), or an explicit stop. Pure apart from the callables it
is given, so the same loop runs in the service (real runs, wall clock) and in the bench
(replayed runs).
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


def profile(profiler: Profiler, execute: Callable[[Proposal], Observation], rules: StopRules, *,
            clock: Clock | None = None, stopped: Callable[[], bool] = lambda: False,
            on_run: Callable[[Proposal, Observation, list[Observation]], None] | None = None,
            observed: list[Observation] | None = None) -> tuple[list[Observation], str]:
    """Returns (observations, why it stopped). `observed`: earlier runs the profiler learns from; the stop rules
    count only the runs made here."""
    obs = list(observed or [])
    start = clock.now() if clock else 0.0
    spent = 0.0     # this session's runs only, as `runs`: earlier sessions' costs are not this budget's
    runs = 0
    while True:
        if stopped():
            return obs, "stopped"
        if runs >= rules.max_runs:
            return obs, "iterations"
        if rules.max_cost > 0 and spent >= rules.max_cost:
            return obs, "budget"
        if rules.max_duration_s > 0 and clock is not None and clock.now() - start >= rules.max_duration_s:
            return obs, "duration"
        proposal = profiler.propose(obs)
        if proposal is None:
            return obs, "exhausted"
        o = execute(proposal)
        obs.append(o)
        runs += 1
        spent += o.cost
        if on_run:
            on_run(proposal, o, obs)
