"""Extrapolated profiling (thesis §4.4.3, Algorithm 7) with bottleneck detection.

Discovery: directed simulated annealing on the small *benchmarking* input. Extrapolation:
up to 7 of the benchmarked configurations (Pareto-optimal first, then spread over the
runtimes) run on the *production* input. A production run that fails with memory at its
limit names memory as the bottleneck: the same configuration is retried with the next
memory value until it succeeds, and every configuration with less memory is excluded from
then on (a learned constraint `%mem >= value`); a failure with no bottleneck retries with
each parameter at its maximum in turn. Production-run configurations never benchmarked
are benchmarked too, then curve families (linear, proportional, power, exponential,
quadratic) are fitted to (benchmark time -> production time) and the one with the
smallest AICc (thesis §4.4.3 names no criterion; another than proportional only when at least 2 lower) predicts the
production time of every benchmarked configuration, proportionally beyond the benchmark times fitted. The memory
bounds are derived again from every production run observed, earlier sessions' included.

Without a benchmarking input (e.g. a dataset of one input size), or with fewer than 3 runs, it is directed SA on
the production input.
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


# The families, simplest first (number of parameters, then the order a tie is broken in). Thesis §4.4.3
# (limitation 1) restricts extrapolated profiling to applications whose extrapolation function has a known
# general form (linear, quadratic, exponential); these are those forms, with proportional and power added.
FAMILIES = (("proportional", 1), ("linear", 2), ("power", 2), ("exponential", 2), ("quadratic", 3))


def _fit_family(family: str, xa: np.ndarray, ya: np.ndarray) -> list[float] | None:
    """The family's parameters fitted to the points, or None when they cannot determine them."""
    if family == "proportional":
        sxx = float((xa * xa).sum())
        return [float((xa * ya).sum() / sxx)] if sxx > 0 else None
    npar = dict(FAMILIES)[family]
    if len(np.unique(xa)) < npar:
        return None
    if family == "linear":
        b, a = np.polyfit(xa, ya, 1)
        return [float(a), float(b)]
    if family == "quadratic":
        c2, c1, c0 = np.polyfit(xa, ya, 2)
        return [float(c0), float(c1), float(c2)]
    if not ((xa > 0).all() and (ya > 0).all()):
        return None
    if family == "power":
        p, la = np.polyfit(np.log(xa), np.log(ya), 1)
        return [float(math.exp(la)), float(p)]
    q, lb = np.polyfit(xa, np.log(ya), 1)
    return [float(math.exp(lb)), float(q)]


# Parameters counted by AICc besides the curve's own: 1 for the noise variance (the textbook count).
AICC_EXTRA = 1
# How much lower another family's AICc must be than the proportional curve's to be chosen instead (the usual
# threshold of "substantially better" for information criteria).
PROPORTIONAL_MARGIN = 2.0


def _aicc(family: str, xa: np.ndarray, ya: np.ndarray, scale: np.ndarray) -> tuple[float, list[float]] | None:
    """AICc of the family fitted by least squares, residuals divided by `scale`; None if it cannot be fitted."""
    params = _fit_family(family, xa, ya)
    if params is None:
        return None
    pred = np.array([apply_curve({"family": family, "params": params}, float(v)) for v in xa])
    if not np.isfinite(pred).all():
        return None
    n, k = len(xa), dict(FAMILIES)[family] + AICC_EXTRA
    # Floored: on exact data every family that contains the truth fits it to rounding error, and log(0)
    # would let rounding decide; at the floor the penalty alone does, so the simplest wins.
    rss = max(float((((pred - ya) / scale) ** 2).sum()), 1e-20 * n)
    return n * math.log(rss / n) + 2 * k + 2 * k * (k + 1) / (n - k - 1), params


def fit_curve(x: list[float], y: list[float]) -> dict | None:
    """The curve family with the smallest AICc, fitted to the points; {"family", "params", "r2", "points"}.

    AICc (Akaike's criterion corrected for small samples) charges every parameter, so a family with more of
    them wins only when it explains clearly more: on noisy linear data the in-sample R^2 of a quadratic is
    always at least the linear one's, and choosing by R^2 picked the quadratic ~95% of the time, extrapolating
    ~26% off. A family with too few points for AICc (its parameters plus AICC_EXTRA plus 2) is not considered.
    """
    xa, ya = np.asarray(x, float), np.asarray(y, float)
    if len(xa) < 2 or np.ptp(xa) <= 0:
        if len(xa) >= 1 and (xa > 0).all():
            k = float(np.mean(ya / xa))
            return {"family": "proportional", "params": [k], "r2": 0.0, "points": len(xa)}
        return None
    # Relative residuals: timing noise is proportional to the time, so long runs would otherwise outweigh the rest.
    scale = ya if (ya > 0).all() else np.full_like(ya, max(float(np.sqrt((ya ** 2).mean())), 1e-300))
    best: tuple[float, str, list[float]] | None = None
    for fam, npar in FAMILIES:  # simplest first, and a later family must be strictly better
        if len(xa) < npar + AICC_EXTRA + 2:
            continue
        scored = _aicc(fam, xa, ya, scale)
        if scored is None:
            continue
        # Within 2 of each other AICc cannot tell two families apart: on less, noise on proportional data made an
        # exponential or a power curve win, bending where nothing says the timings bend.
        margin = PROPORTIONAL_MARGIN if best is not None and best[1] == "proportional" else 1e-9
        if best is None or scored[0] < best[0] - margin:
            best = (scored[0], fam, scored[1])
    if best is None:
        # Too few points to compare families: production time proportional to benchmark time, the one-parameter
        # curve (as for a single point above), else the line through them.
        fam = "proportional" if (xa > 0).all() else "linear"
        params = _fit_family(fam, xa, ya)
        if params is None:
            return None
        best = (0.0, fam, params)
    _, family, params = best
    pred = np.array([apply_curve({"family": family, "params": params}, float(v)) for v in xa])
    return {"family": family, "params": params, "r2": _r2(ya, pred), "points": len(xa),
            "range": [float(xa.min()), float(xa.max())]}


def apply_curve(fit: dict, x: float) -> float:
    """The curve at benchmark time `x`. Outside the benchmark times it was fitted on (`range`), a curved family
    goes on proportionally from the nearer end: the points say nothing of its bend there, and an exponential or a
    power curve fitted to a narrow range predicted up to 26x the production time at 4x the range's end."""
    lo, hi = fit.get("range") or (-math.inf, math.inf)
    if fit["family"] not in ("proportional", "linear") and not lo <= x <= hi:
        end = lo if x < lo else hi
        if end > 0:
            return _curve(fit, end) * x / end
    return _curve(fit, x)


def _curve(fit: dict, x: float) -> float:
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

    # The fewest runs that extrapolate anything: two configurations benchmarked, one of them run on the production
    # input, so the curve through it predicts the other.
    min_runs = 3

    def __init__(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
        super().__init__(*args, **kwargs)
        self.extrapolate = self.has_benchmark and self.max_runs >= self.min_runs
        if self.has_benchmark and not self.extrapolate:
            # Benchmark runs alone would leave no point of the production model: these runs go to it directly.
            self.note = (f"{self.max_runs} run(s) are too few to extrapolate (at least {self.min_runs}: two on the "
                         "benchmark input, one on the production input); profiled on the production input only")
        self.n_test = min(self.tests, max(1, self.max_runs // 3)) if self.extrapolate else 0
        self.n_bench = self.max_runs - self.n_test
        self.discovery = DirectedAnnealing(self.space, self.rng, prices=self.prices,
                                           max_runs=max(1, self.n_bench))
        self.constraints: list[tuple[str, float]] = []  # (dimension, minimum value)
        self.fit: dict | None = None
        self.observed: list[Observation] = []
        self._plan = self._steps()

    # -- helpers ---------------------------------------------------------
    def _as_production(self, input: str) -> list[Observation]:
        return [Observation(o.config, o.ok, o.time_s, o.cost, PRODUCTION, o.cpu_percent, o.memory_percent, o.error,
                            transient=o.transient)
                for o in self.observed if o.input == input]

    def _constrain(self, dim: str, minimum: float) -> None:
        if (dim, minimum) not in self.constraints:
            self.constraints.append((dim, minimum))

    def _relearn(self) -> None:
        """The memory bounds the production runs observed show, earlier sessions' included: a run that failed with
        memory at its limit and an ok one with more memory, the rest of the configuration the same. Learned only on
        the instance, a later session started with none, never retried what had failed (it had run) and predicted,
        for the frontier, configurations known to fail (thesis §4.4.3: avoid configurations that may trigger the
        same problem)."""
        mem = next((d.name for d in self.space.dims if d.kind == "memory"), None)
        if mem is None:
            return
        prod = [o for o in self.observed if o.input == PRODUCTION and not o.transient]
        ok = [self.space.configs[o.config] for o in prod if o.ok]
        for o in prod:
            if not o.memory_bottleneck or self.space.configs[o.config].get(mem) is None:
                continue
            failed = self.space.configs[o.config]
            more = [c[mem] for c in ok if c.get(mem) is not None and c[mem] > failed[mem]
                    and all(c.get(k) == v for k, v in failed.items() if k != mem)]
            if more:
                self._constrain(mem, min(more))

    def allowed(self, i: int) -> bool:
        cfg = self.space.configs[i]
        return all(cfg.get(d) is None or cfg[d] >= v for d, v in self.constraints)

    def _last(self) -> Observation:
        return self.observed[-1]

    def _measured(self, input: str) -> dict[int, Observation]:
        return {o.config: o for o in self.observed if o.input == input}

    # -- the plan (a coroutine: each yield is one run) -------------------------
    def _steps(self) -> Iterator[Proposal]:
        discovery_input = BENCHMARK if self.extrapolate else PRODUCTION
        for _ in range(self.n_bench):
            p = self.discovery.propose(self._as_production(discovery_input))
            if p is None:
                break
            yield Proposal(p.config, discovery_input, f"discovery: {p.why}")
        if not self.extrapolate:
            return
        bench = {c: o for c, o in self._measured(BENCHMARK).items() if o.ok}
        if not bench:
            self.ended = self._no_benchmark()
            return
        for c in self._select(bench):
            if c in self._measured(PRODUCTION) or not self.allowed(c):
                continue
            yield Proposal(c, PRODUCTION, "extrapolation test on the production input")
            o = self._last()
            if o.ok or o.transient:    # a refused or lost run says nothing of what the configuration lacks
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
                        self._constrain(mem_dims[0], self.space.configs[nxt][mem_dims[0]])
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

    def _no_benchmark(self) -> str:
        runs = [o for o in self.observed if o.input == BENCHMARK]
        if not runs:
            return "no benchmark run succeeded: none was made, so there is nothing to extrapolate from"
        errors: dict[str, int] = {}
        for o in runs:
            errors[o.error or "no error recorded"] = errors.get(o.error or "no error recorded", 0) + 1
        top, n = max(errors.items(), key=lambda kv: kv[1])
        refused = all(o.transient for o in runs)
        return (f"no benchmark run succeeded: {len(runs)} run(s) on the benchmark input, none ok ({n} of them: "
                f"{top[:300]}); nothing to extrapolate from: " + (
                    "profile again when the cloud has room" if refused else
                    "make the application run on its Benchmark input, or profile with another profiler"))

    def _select(self, bench: dict[int, Observation]) -> list[int]:
        """Pareto-optimal benchmark configurations first, then spread over the runtimes."""
        pts = sorted(bench.values(), key=lambda o: (o.time_s, o.cost))
        front, best_cost = [], math.inf
        for o in pts:
            if o.cost < best_cost:
                front.append(o.config)
                best_cost = o.cost
        rest = [o.config for o in pts if o.config not in front]
        if not front:
            return []
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
        self._relearn()
        try:
            return next(self._plan)
        except StopIteration:
            return None

    def predictions(self, observed: list[Observation]) -> list[tuple[int, float, float]]:
        self.observed = observed
        self._relearn()
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
            if self.prices is not None and self.prices[c] == math.inf:
                continue    # the CRS says it never fits (now): a frontier point no execution could reserve
            t = apply_curve(self.fit, o.time_s)
            if not (t > 0 and math.isfinite(t)):
                continue
            if self.prices is not None and math.isfinite(self.prices[c]):
                cost = float(self.prices[c]) * t
            else:
                cost = o.cost * t / o.time_s if o.time_s > 0 else math.nan
            out.append((c, t, cost))
        return out
