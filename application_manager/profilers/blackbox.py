"""Blackbox profilers (thesis §4.4.1): uniform search (Algorithm 2) and simulated annealing (Algorithm 3)."""

from __future__ import annotations

import math

import numpy as np

from application_manager.profilers.base import Observation, Profiler, Proposal, utility


class Uniform(Profiler):
    """Algorithm 2: stepwise points of the unit cube, k steps per dimension so the grid has
    about `max_runs` points; grid points are visited in a seeded random order (a nested loop
    would spend a small budget on the first dimension only) and snapped to the nearest
    configuration not yet run."""

    name = "uniform"
    description = "stepwise grid over [0,1]^d (thesis §4.4.1, Algorithm 2)"

    def __init__(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
        super().__init__(*args, **kwargs)
        d = max(1, len(self.space.dims))
        k = max(2, math.ceil(self.max_runs ** (1.0 / d)))
        if k ** d <= 50_000:
            idx = np.array(np.meshgrid(*[np.arange(k)] * d, indexing="ij")).reshape(d, -1).T
            idx = idx[self.rng.permutation(len(idx))]
        else:
            idx = self.rng.integers(0, k, size=(max(4 * self.max_runs, 64), d))
        self.grid = (idx + 0.5) / k
        self._next = 0

    def propose(self, observed: list[Observation]) -> Proposal | None:
        seen = self.visited(observed)
        if len(seen) >= len(self.space):
            return None
        while self._next < len(self.grid):
            point = self.grid[self._next]
            self._next += 1
            i = self.space.snap(point, seen)
            if i is not None:
                return Proposal(i, why="grid point")
        i = self.random_unvisited(observed)
        return None if i is None else Proposal(i, why="grid exhausted: random")


class SimulatedAnnealing(Profiler):
    """Algorithm 3 with utility = time x cost. The temperature falls geometrically from 1 to
    0.01 over `max_runs`; neighbour(): sigma = min(sqrt(T), (upper - lower) / (3 rate)),
    r_new = r + N(0, sigma) * rate, snapped to the nearest configuration not yet run."""

    name = "sa"
    description = "simulated annealing on time x cost (thesis §4.4.1, Algorithm 3)"
    rate = 0.5
    t_cool = 0.01

    def __init__(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
        super().__init__(*args, **kwargs)
        self.temperature = 1.0
        self.alpha = self.t_cool ** (1.0 / self.max_runs)
        self.current: Observation | None = None
        self._seen = 0
        self._began = False

    def _absorb(self, observed: list[Observation]) -> None:
        if not self._began:
            # What earlier sessions ran is where this walk starts (their best point), not steps of it: cooled by
            # them, a second session began frozen -- a greedy walk that never takes a worse point.
            self._began = True
            self._seen = len(observed)
            earlier = [o for o in observed if o.input == "production" and not o.transient
                       and math.isfinite(utility(o))]
            if earlier:
                self.current = min(earlier, key=utility)
            return
        for o in observed[self._seen:]:
            self._seen += 1
            if o.input != "production" or o.transient:
                continue    # a refused or lost run is no step of the walk: it says nothing of its configuration
            if self.current is None or not math.isfinite(utility(self.current)):
                if math.isfinite(utility(o)) or self.current is None:
                    self.current = o
            else:
                u, un = utility(self.current), utility(o)
                if un <= u:
                    self.current = o
                elif math.isfinite(un):
                    p = math.exp(-(math.log(un) - math.log(u)) / max(self.temperature, 1e-9))
                    if p > self.rng.random():
                        self.current = o
            self.temperature *= self.alpha

    def neighbour(self, i: int) -> np.ndarray:
        sigma = min(math.sqrt(self.temperature), 1.0 / (3 * self.rate))
        r = self.space.units[i]
        return r + self.rng.normal(0.0, sigma, size=r.shape) * self.rate

    def start(self, observed: list[Observation]) -> Proposal | None:
        i = self.random_unvisited(observed)
        return None if i is None else Proposal(i, why="random start")

    def move(self, observed: list[Observation]) -> np.ndarray:
        assert self.current is not None
        return self.neighbour(self.current.config)

    def propose(self, observed: list[Observation]) -> Proposal | None:
        self._absorb(observed)
        seen = self.visited(observed)
        if len(seen) >= len(self.space):
            return None
        if self.current is None:
            return self.start(observed)
        i = self.space.snap(self.move(observed), seen)
        return None if i is None else Proposal(i, why=f"neighbour at T={self.temperature:.3f}")
