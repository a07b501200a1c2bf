"""What every profiler shares: observations, proposals, the whitebox model, the interface.

A profiler is a pure, seeded strategy (ARCHITECTURE "Policies are pure"): given the search
space, a numpy Generator, optional prices (the CRS quote per second of each configuration,
known before running anything) and optional history (other workloads' measurements), it
proposes the next configuration to run from the observations so far. It never runs,
sleeps or reads a clock; application_manager.runner drives it and enforces the stop
conditions (iterations, budget, duration).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from application_manager.space import Space

PRODUCTION = "production"
BENCHMARK = "benchmark"
# Whitebox thresholds (thesis §4.4.2; the HARNESS original used under 60% / over 90%).
UNDER = 60.0
OVER = 90.0


@dataclass(frozen=True)
class Observation:
    config: int  # index into the space
    ok: bool
    time_s: float
    cost: float
    input: str = PRODUCTION
    cpu_percent: float | None = None  # mean over the run, % of the VM's cores
    memory_percent: float | None = None  # peak, % of the VM's memory
    error: str = ""
    # Not the configuration's doing (the CRS had no room, the run was lost, the caller's timeout or cancellation):
    # kept for audit, but no evidence about the configuration -- never a point of the model, and not "seen" by a
    # later session, which may try it again.
    transient: bool = False
    # How long the CRS asked to wait before trying again (its RetryInfo), when it refused for now.
    retry_after_s: float | None = None
    # Evidence for its own session only (cut by that session's own, shorter, run_timeout_s): stored as transient,
    # so a later session may run the configuration again.
    session_only: bool = False

    @property
    def measured(self) -> bool:
        """Whether the run says something about its configuration (ok, or failed through its own doing)."""
        return not self.transient

    @property
    def memory_bottleneck(self) -> bool:
        """Bottleneck detection (thesis §4.4.3): the run died with memory at its limit."""
        if self.ok or self.transient:
            return False
        return "memory" in self.error.lower() or (self.memory_percent or 0.0) >= OVER


@dataclass(frozen=True)
class Proposal:
    config: int
    input: str = PRODUCTION
    why: str = ""


@dataclass
class History:
    """Other workloads' measurements, aligned to this space: rows are workloads, columns configurations.

    `log_time[w, c]` is NaN where workload w never ran configuration c; `failed[w, c]` is 1.0
    for a failed run, 0.0 for an ok run, NaN where unknown.
    """

    log_time: np.ndarray
    failed: np.ndarray
    names: list[str] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        return self.log_time.shape[0] == 0


def whitebox_hints(space: Space, obs: Observation) -> dict[str, int]:
    """Algorithm 4: +1 (increase) / -1 (decrease) per dimension, from the run's utilisation."""
    hints: dict[str, int] = {}
    if obs.transient:
        return hints    # a refused or lost run measured no utilisation
    for d in space.dims:
        if d.kind == "memory":
            if obs.memory_bottleneck:
                hints[d.name] = +1
            elif obs.memory_percent is not None and obs.ok and obs.memory_percent < UNDER:
                hints[d.name] = -1
        elif d.kind == "cpu" and obs.cpu_percent is not None and obs.ok:
            if obs.cpu_percent > OVER:
                hints[d.name] = +1
            elif obs.cpu_percent < UNDER:
                hints[d.name] = -1
    return hints


def utility(o: Observation) -> float:
    """Simulated annealing's utility, time x cost (thesis §4.4.1); a failed run is worst."""
    return o.time_s * o.cost if o.ok and o.time_s > 0 and o.cost > 0 else float("inf")


class Profiler:
    """The interface. Subclasses set `name` and implement `propose`."""

    name = "base"
    uses_history = False
    description = ""

    def __init__(self, space: Space, rng: np.random.Generator, *, prices: np.ndarray | None = None,
                 history: History | None = None, max_runs: int = 20, has_benchmark: bool = False) -> None:
        self.space = space
        self.rng = rng
        self.prices = prices
        self.history = history if (history is not None and not history.empty and self.uses_history) else None
        self.max_runs = max(1, max_runs)
        self.has_benchmark = has_benchmark
        # Why `propose` returned None when it is not that every configuration was tried (e.g. extrapolated
        # profiling with no benchmark run to extrapolate from): the session's message says it. Empty otherwise.
        self.ended = ""
        # Said at the end of the session however it ends (e.g. a budget too small for the profiler's method).
        self.note = ""

    def propose(self, observed: list[Observation]) -> Proposal | None:
        raise NotImplementedError

    def predictions(self, observed: list[Observation]) -> list[tuple[int, float, float]]:
        """(config, time, cost) predicted for the production input on configurations not measured
        on it; empty unless the profiler models them (extrapolated profiling)."""
        return []

    def visited(self, observed: list[Observation], input: str = PRODUCTION) -> set[int]:
        """Configurations run on `input`. A transient observation counts too: it is in `observed` only for the
        session that made it (the service leaves earlier sessions' out), so the session does not retry at once
        what the CRS just refused, while a later one may."""
        return {o.config for o in observed if o.input == input}

    @staticmethod
    def measured(observed: list[Observation]) -> list[Observation]:
        """The observations that are evidence about their configuration (transient ones left out)."""
        return [o for o in observed if not o.transient]

    def random_unvisited(self, observed: list[Observation], input: str = PRODUCTION) -> int | None:
        seen = self.visited(observed, input)
        free = [i for i in range(len(self.space)) if i not in seen]
        return int(self.rng.choice(free)) if free else None
