"""Extrapolated profiling (thesis §4.4.3, Algorithm 7) with bottleneck detection.

Discovery: directed simulated annealing on the small *benchmarking* input. Extrapolation:
up to 7 of the benchmarked configurations (Pareto-optimal first, then spread over the
runtimes) run on the *production* input. A production run that fails with memory at its
limit names memory as the bottleneck: the same configuration is retried with the next
memory value until it succeeds, and every configuration with less memory is excluded from
then on (a learned constraint `%mem >= value`); a failure with no bottleneck retries with
each parameter at its maximum in turn. Production-run configurations never benchmarked
are benchmarked too, then curve families (linear, proportional, power, exponential,
quadratic) are fitted to (benchmark time -> production time) and the best by R^2 predicts
the production time of every benchmarked configuration.

Without a benchmarking input (e.g. a dataset of one input size) it is directed SA.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import numpy as np

from application_manager.profilers.base import BENCHMARK, PRODUCTION, Observation, Profiler, Proposal
from application_manager.profilers.whitebox import DirectedAnnealing


def _r2(y: np.ndarray, pred: np.ndarray) -> float:
    ss = float(((y - y.mean()) ** 2).sum())
    res = float(((y - pred) ** 2).sum())
    return 1.0 - res / ss if ss > 0 else (1.0 if res < 1e-12 else 0.0)


def fit_curve(x: list[float], y: list[float]) -> dict | None:
    """Best of the curve families by R^2 on y; {"family", "params", "r2", "points"}."""
    xa, ya = np.asarray(x, float), np.asarray(y, float)
    if len(xa) < 2 or np.ptp(xa) <= 0:
        if len(xa) >= 1 and (xa > 0).all():
            k = float(np.mean(ya / xa))
            return {"family": "proportional", "params": [k], "r2": 0.0, "points": len(xa)}
        return None
    fits: list[dict] = []
    b, a = np.polyfit(xa, ya, 1)
    fits.append({"family": "linear", "params": [float(a), float(b)], "pred": a + b * xa})
    k = float((xa * ya).sum() / (xa * xa).sum())
    fits.append({"family": "proportional", "params": [k], "pred": k * xa})
    if (xa > 0).all() and (ya > 0).all():
        p, la = np.polyfit(np.log(xa), np.log(ya), 1)
        fits.append({"family": "power", "params": [float(math.exp(la)), float(p)],
                     "pred": math.exp(la) * xa ** p})
        q, lb = np.polyfit(xa, np.log(ya), 1)
        fits.append({"family": "exponential", "params": [float(math.exp(lb)), float(q)],
                     "pred": math.exp(lb) * np.exp(q * xa)})
    if len(xa) >= 4:
        c2, c1, c0 = np.polyfit(xa, ya, 2)
        fits.append({"family": "quadratic", "params": [float(c0), float(c1), float(c2)],
                     "pred": c0 + c1 * xa + c2 * xa ** 2})
    for f in fits:
        f["r2"] = _r2(ya, f.pop("pred"))
        f["points"] = len(xa)
    # Prefer fewer parameters on ties: order above is by complexity except proportional.
    return max(fits, key=lambda f: f["r2"] - 1e-6 * len(f["params"]))


def apply_curve(fit: dict, x: float) -> float:
    p = fit["params"]
    fam = fit["family"]
    if fam == "linear":
        return p[0] + p[1] * x
    if fam == "proportional":
        return p[0] * x
    if fam == "power":
        return p[0] * x ** p[1]
    if fam == "exponential":
        return p[0] * math.exp(min(700.0, p[1] * x))
    return p[0] + p[1] * x + p[2] * x * x


class Extrapolated(Profiler):
    name = "extrapolated"
    description = "benchmark-input discovery, production runs, curve fit and bottleneck detection " \
                  "(thesis §4.4.3, Algorithm 7)"
    tests = 7

    def __init__(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
        super().__init__(*args, **kwargs)
        self.n_test = min(self.tests, max(2, self.max_runs // 3)) if self.has_benchmark else 0
        self.n_bench = self.max_runs - self.n_test if self.has_benchmark else self.max_runs
        self.discovery = DirectedAnnealing(self.space, self.rng, prices=self.prices,
                                           max_runs=max(1, self.n_bench))
        self.constraints: list[tuple[str, float]] = []  # (dimension, minimum value)
        self.fit: dict | None = None
        self.observed: list[Observation] = []
        self._plan = self._steps()

    # -- helpers ---------------------------------------------------------
    def _as_production(self, input: str) -> list[Observation]:
        return [Observation(o.config, o.ok, o.time_s, o.cost, PRODUCTION, o.cpu_percent, o.memory_percent, o.error)
                for o in self.observed if o.input == input]

    def allowed(self, i: int) -> bool:
        cfg = self.space.configs[i]
        return all(cfg.get(d) is None or cfg[d] >= v for d, v in self.constraints)

    def _last(self) -> Observation:
        return self.observed[-1]

    def _measured(self, input: str) -> dict[int, Observation]:
        return {o.config: o for o in self.observed if o.input == input}

    # -- the plan (a coroutine: each yield is one run) -------------------------
    def _steps(self) -> Iterator[Proposal]:
        discovery_input = BENCHMARK if self.has_benchmark else PRODUCTION
        for _ in range(self.n_bench):
            p = self.discovery.propose(self._as_production(discovery_input))
            if p is None:
                break
            yield Proposal(p.config, discovery_input, f"discovery: {p.why}")
        if not self.has_benchmark:
            return
        bench = {c: o for c, o in self._measured(BENCHMARK).items() if o.ok}
        for c in self._select(bench):
            if c in self._measured(PRODUCTION) or not self.allowed(c):
                continue
            yield Proposal(c, PRODUCTION, "extrapolation test on the production input")
            o = self._last()
            if o.ok:
                continue
            if o.memory_bottleneck:
                mem_dims = [d.name for d in self.space.dims if d.kind == "memory"]
                cur = c
                while mem_dims:
                    # Up the memory ladder one step at a time; a step already run on the production
                    # input (an earlier extrapolation test) answers without another run.
                    nxt = self.space.step(cur, mem_dims[0], +1)
                    if nxt is None:
                        break
                    seen = self._measured(PRODUCTION).get(nxt)
                    if seen is None:
                        yield Proposal(nxt, PRODUCTION, f"bottleneck: memory; retry with {mem_dims[0]}="
                                                        f"{self.space.configs[nxt][mem_dims[0]]}")
                        seen = self._last()
                    cur = nxt
                    if seen.ok:
                        self.constraints.append((mem_dims[0], self.space.configs[nxt][mem_dims[0]]))
                        break
            else:
                for d in self.space.dims:
                    if d.categorical or self.space.configs[c].get(d.name) is None:
                        continue
                    top = max(x for x in d.values if x is not None)
                    if self.space.configs[c][d.name] == top:
                        continue
                    target = self.space.units[c].copy()
                    target[self.space.dims.index(d)] = d.position(top)
                    nxt = self.space.snap(target, self._measured(PRODUCTION))
                    if nxt is None:
                        continue
                    yield Proposal(nxt, PRODUCTION, f"no bottleneck seen: retry with {d.name} at its maximum")
                    if self._last().ok:
                        self.constraints.append((d.name, self.space.configs[c][d.name] + 1e-9))
                        break
        bench_now = self._measured(BENCHMARK)
        for c, o in self._measured(PRODUCTION).items():
            if o.ok and c not in bench_now:
                yield Proposal(c, BENCHMARK, "benchmark a production-run configuration for the fit")

    def _select(self, bench: dict[int, Observation]) -> list[int]:
        """Pareto-optimal benchmark configurations first, then spread over the runtimes."""
        pts = sorted(bench.values(), key=lambda o: (o.time_s, o.cost))
        front, best_cost = [], math.inf
        for o in pts:
            if o.cost < best_cost:
                front.append(o.config)
                best_cost = o.cost
        rest = [o.config for o in pts if o.config not in front]
        # The two ends of the frontier first (the cheapest and the fastest: what budget-bound and
        # time-bound SLOs pick), then its middle; timing noise then cannot push the cheapest out.
        ends = list(dict.fromkeys([front[-1], front[0]]))
        front = ends + [c for c in front if c not in ends]
        picks = front[: self.n_test]
        if len(picks) < self.n_test and rest:
            idx = np.linspace(0, len(rest) - 1, num=min(len(rest), self.n_test - len(picks)))
            picks += [rest[int(round(i))] for i in idx]
        return list(dict.fromkeys(picks))

    def propose(self, observed: list[Observation]) -> Proposal | None:
        self.observed = observed
        try:
            return next(self._plan)
        except StopIteration:
            return None

    def predictions(self, observed: list[Observation]) -> list[tuple[int, float, float]]:
        self.observed = observed
        bench = {c: o for c, o in self._measured(BENCHMARK).items() if o.ok}
        prod = {c: o for c, o in self._measured(PRODUCTION).items() if o.ok}
        pairs = [(bench[c].time_s, prod[c].time_s) for c in prod if c in bench]
        self.fit = fit_curve([a for a, _ in pairs], [b for _, b in pairs])
        if self.fit is None:
            return []
        self.fit["constraints"] = [f"{d} >= {v:g}" for d, v in self.constraints]
        out = []
        for c, o in bench.items():
            if c in self._measured(PRODUCTION) or not self.allowed(c):
                continue
            t = apply_curve(self.fit, o.time_s)
            if not (t > 0 and math.isfinite(t)):
                continue
            if self.prices is not None and math.isfinite(self.prices[c]):
                cost = float(self.prices[c]) * t
            else:
                cost = o.cost * t / o.time_s if o.time_s > 0 else math.nan
            out.append((c, t, cost))
        return out
