"""Blackbox+whitebox profilers (thesis §4.4.2): utilisation-driven (Algorithm 5) and directed
simulated annealing (Algorithm 6), both steered by the whitebox model of Algorithm 4
(application_manager.profilers.base.whitebox: over 90% -> increase, under 60% -> decrease)."""

from __future__ import annotations

from collections import deque

import numpy as np

from application_manager.profilers.base import Observation, Profiler, Proposal, whitebox_hints
from application_manager.profilers.blackbox import SimulatedAnnealing


class UtilisationDriven(Profiler):
    """Algorithm 5: start at a random configuration; after each run enqueue the neighbours the
    whitebox model asks for (next value of an over-utilised resource, previous value of an
    under-utilised one). Stops when the queue is empty, as the thesis notes (no hint, no move)."""

    name = "utilisation"
    description = "utilisation-driven refinement (thesis §4.4.2, Algorithm 5)"

    def __init__(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
        super().__init__(*args, **kwargs)
        self.queue: deque[int] = deque()
        self._seen = 0
        self._began: int | None = None     # how many runs were observed before this session's first

    def propose(self, observed: list[Observation]) -> Proposal | None:
        if self._began is None:
            self._began = len(observed)
        seen = self.visited(observed)
        for o in observed[self._seen:]:
            self._seen += 1
            for dim, direction in sorted(whitebox_hints(self.space, o).items()):
                j = self.space.step(o.config, dim, direction, seen | set(self.queue))
                if j is not None:
                    self.queue.append(j)
        if not self.measured(observed):
            # Nothing measured yet (or only runs the CRS refused or lost): start again somewhere else.
            i = self.random_unvisited(observed)
            return None if i is None else Proposal(i, why="random start")
        while self.queue:
            i = self.queue.popleft()
            if i not in seen:
                return Proposal(i, why="whitebox hint")
        if len(observed) == self._began:
            # Earlier sessions' runs left no hint: this session starts where Algorithm 5 does (line 1), at random,
            # instead of ending with no run.
            i = self.random_unvisited(observed)
            return None if i is None else Proposal(i, why="random start")
        if observed[-1].transient:
            # The walk's last step was refused or lost, not measured: no hint is not "no bottleneck left".
            i = self.random_unvisited(observed)
            return None if i is None else Proposal(i, why="the last run was not measured: random restart")
        return None


class DirectedAnnealing(SimulatedAnnealing):
    """Algorithm 6: simulated annealing whose neighbour() follows the whitebox hints with
    probability `p_directed`: an over-utilised resource moves up by |N(0, 1 - r_i)|, an
    under-utilised one down by |N(0, r_i)|; without hints it falls back to neighbour()."""

    name = "directed-sa"
    description = "simulated annealing steered by utilisation (thesis §4.4.2, Algorithm 6)"
    p_directed = 0.7

    def move(self, observed: list[Observation]) -> np.ndarray:
        assert self.current is not None
        if self.rng.random() < self.p_directed:
            hints = whitebox_hints(self.space, self.current)
            if hints:
                r = self.space.units[self.current.config].copy()
                for j, d in enumerate(self.space.dims):
                    h = hints.get(d.name, 0)
                    if h > 0:
                        r[j] += abs(self.rng.normal(0.0, max(1e-3, 1.0 - r[j])))
                    elif h < 0:
                        r[j] -= abs(self.rng.normal(0.0, max(1e-3, r[j])))
                return r
        return self.neighbour(self.current.config)
