"""A model-based profiler of our own: Bayesian optimisation over the price-aware cost model,
warm-started from other workloads' history (in the spirit of CherryPick, Scout and Micky).

* cost = price x time (thesis §4.2.4): the price of every configuration is known before
  running it (the CRS quote), so only the runtime needs a model. log(time) is modelled as
  a prior mean plus a Gaussian process on the residuals (RBF kernel on the configuration
  features: ordinal dimensions at their [0, 1] position, categorical ones one-hot).
* Prior mean, warm: every history workload's log-runtime profile, shifted by its mean
  offset to what this workload measured, weighted by how well it explains those
  measurements (workloads that behave alike are alike everywhere; Micky/Scout observe that
  a few configurations are near-optimal for many workloads). Failure probability comes
  from the same weighted neighbours. It never sees the evaluated workload's own history:
  only what it ran.
* Prior mean, cold: a ridge regression on the features; failure probability from a kernel
  over the runs that failed.
* Prices: a configuration the CRS could not quote (NaN) costs the highest known price; one it
  priced out (+inf: it never fits) is never proposed.
* Acquisition: expected improvement of log cost (two runs in three) or log time (one in
  three, so the frontier has fast points for time bounds), times the probability of not
  failing; never a configuration twice.
"""

from __future__ import annotations

import math

import numpy as np
from scipy.special import ndtr

from application_manager.profilers.base import Observation, Profiler, Proposal

# Above this many configurations the kernel's length scale comes from a sample of pairs, not all of them.
EXACT_PAIRS = 2000
SAMPLED_PAIRS = 200_000


def _median_sq_distance(x: np.ndarray) -> float:
    """The median squared distance between two different configurations (the RBF kernel's length scale)."""
    n = len(x)
    if n <= EXACT_PAIRS:
        d2 = ((x[:, None, :] - x[None, :, :]) ** 2).sum(axis=2)
        pos = d2[d2 > 0]
    else:   # a seeded sample: the same space always gets the same scale
        rng = np.random.default_rng(n)
        i, j = rng.integers(0, n, SAMPLED_PAIRS), rng.integers(0, n, SAMPLED_PAIRS)
        d2 = ((x[i] - x[j]) ** 2).sum(axis=1)
        pos = d2[d2 > 0]
    return float(np.median(pos)) if pos.size else 1.0


def _log_prices(prices: np.ndarray | None, n: int) -> tuple[np.ndarray, np.ndarray]:
    """(log price per configuration, which ones the CRS priced out: +inf, a configuration that never fits).

    NaN (the CRS could not quote it now) is one configuration's gap, not a reason to drop every other quote: it
    gets the highest known price, so the cost search neither chases it as if it were cheap nor rules it out
    (its runtime may still make it worth a run). A price of 0 or less is no quote the CRS gives (a VM's price has
    a base), so it is a gap too. Without any usable quote, log price 0 everywhere: the search goes by time.
    """
    if prices is None:
        return np.zeros(n), np.zeros(n, dtype=bool)
    p = np.asarray(prices, dtype=float)
    priced_out = np.isposinf(p)
    known = np.isfinite(p) & (p > 0)
    if not known.any():
        return np.zeros(n), priced_out
    logp = np.log(np.where(known, p, 1.0))
    logp[~known] = logp[known].max()
    return logp, priced_out


class ModelBased(Profiler):
    name = "bo"
    uses_history = True
    description = "Bayesian optimisation of price x modelled runtime, warm-started from history (ours)"
    noise = 0.02
    time_every = 3

    def __init__(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
        super().__init__(*args, **kwargs)
        n = len(self.space)
        self.logp, self.priced_out = _log_prices(self.prices, n)
        x = self.space.features
        self.x = x
        self.u = self.space.units
        # Distances to the configurations that ran only, a column each as they run: the full n x n matrices
        # took n^2 x features memory (16,000 configurations: 8 GB; the space may hold 200,000).
        self._d2: dict[int, np.ndarray] = {}
        self._ud2: dict[int, np.ndarray] = {}
        self.ell2 = max(_median_sq_distance(x), 1e-6)

    def d2(self, cols: list[int] | np.ndarray) -> np.ndarray:
        """Squared feature distances from every configuration to each of `cols` (n x len(cols))."""
        return self._columns(self._d2, self.x, cols, 1)

    def ud2(self, cols: list[int] | np.ndarray) -> np.ndarray:
        """Squared distances in unit coordinates, per dimension, from every configuration to each of `cols`."""
        return self._columns(self._ud2, self.u, cols, max(1, self.u.shape[1]))

    @staticmethod
    def _columns(cache: dict[int, np.ndarray], pts: np.ndarray, cols, divisor: int) -> np.ndarray:
        for c in cols:
            if int(c) not in cache:
                cache[int(c)] = ((pts - pts[int(c)]) ** 2).sum(axis=1) / divisor
        return np.stack([cache[int(c)] for c in cols], axis=1) if len(cols) else np.zeros((len(pts), 0))

    # -- the model -----------------------------------------------------------
    def prior(self, ok: dict[int, float], failed: set[int]) -> tuple[np.ndarray, np.ndarray]:
        """(prior mean of log time, probability of failure) for every configuration."""
        n = len(self.space)
        if self.history is not None:
            h, f = self.history.log_time, self.history.failed
            obs = np.array(sorted(ok), dtype=int)
            y = np.array([ok[c] for c in obs]) if len(obs) else np.zeros(0)
            weights = np.ones(h.shape[0])
            offsets = np.zeros(h.shape[0])
            for w in range(h.shape[0]):
                row = h[w]
                if np.isnan(row).all():
                    pass    # only failures known (failed runs' times are no runtimes): nothing to shift
                elif len(obs):
                    common = ~np.isnan(row[obs])
                    if common.any():
                        diff = y[common] - row[obs][common]
                        offsets[w] = diff.mean()
                        if common.sum() >= 2:
                            rmse = float(np.sqrt(((diff - diff.mean()) ** 2).mean()))
                            weights[w] = math.exp(-(rmse ** 2) / (2 * 0.25 ** 2))
                    else:
                        offsets[w] = y.mean() - np.nanmean(row)
                        weights[w] = 0.2
                else:
                    offsets[w] = -np.nanmean(row)
                for c in failed:
                    if not np.isnan(f[w, c]):
                        weights[w] *= 0.9 if f[w, c] > 0.5 else 0.3
                for c in ok:
                    if not np.isnan(f[w, c]) and f[w, c] > 0.5:
                        weights[w] *= 0.3
            weights = weights + 1e-12
            shifted = h + offsets[:, None]
            known = ~np.isnan(shifted)
            wsum = (weights[:, None] * known).sum(axis=0)
            mu = np.where(wsum > 0, np.nansum(weights[:, None] * np.nan_to_num(shifted), axis=0) / np.maximum(wsum, 1e-12),
                          np.nan)
            fill = float(np.nanmean(mu)) if np.isfinite(mu).any() else (float(y.mean()) if len(y) else 0.0)
            mu = np.where(np.isnan(mu), fill, mu)
            fknown = ~np.isnan(f)
            fsum = (weights[:, None] * fknown).sum(axis=0)
            pf = np.where(fsum > 0, np.nansum(weights[:, None] * np.nan_to_num(f), axis=0) / np.maximum(fsum, 1e-12),
                          0.1)
        else:
            if len(ok) >= 2:
                obs = np.array(sorted(ok), dtype=int)
                y = np.array([ok[c] for c in obs])
                xo = self.x[obs]
                xm = xo.mean(axis=0)
                a = (xo - xm).T @ (xo - xm) + 1.0 * np.eye(self.x.shape[1])
                beta = np.linalg.solve(a, (xo - xm).T @ (y - y.mean()))
                mu = y.mean() + (self.x - xm) @ beta
            else:
                mu = np.full(n, next(iter(ok.values())) if ok else 0.0)
            pf = np.full(n, 0.05)
            if failed:
                k_f = np.exp(-self.ud2(sorted(failed)) / (2 * 0.12 ** 2)).sum(axis=1)
                k_o = np.exp(-self.ud2(sorted(ok)) / (2 * 0.12 ** 2)).sum(axis=1) if ok else 0.0
                pf = np.clip((k_f + 0.05) / (k_f + k_o + 1.0), 0.0, 0.95)
        for c in failed:
            pf[c] = 1.0
        return mu, np.clip(pf, 0.0, 1.0)

    def posterior(self, ok: dict[int, float], mu: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        n = len(self.space)
        sf2 = 0.3 if self.history is not None else 1.0
        if not ok:
            return mu.copy(), np.full(n, math.sqrt(sf2))
        obs = np.array(sorted(ok), dtype=int)
        r = np.array([ok[c] for c in obs]) - mu[obs]
        if len(r) >= 3:
            sf2 = max(sf2 * 0.5, float(r.var()))
        k_all = sf2 * np.exp(-self.d2(obs) / (2 * self.ell2))
        k_oo = k_all[obs] + self.noise * np.eye(len(obs))
        chol = np.linalg.cholesky(k_oo)
        alpha = np.linalg.solve(chol.T, np.linalg.solve(chol, r))
        mean = mu + k_all @ alpha
        v = np.linalg.solve(chol, k_all.T)
        var = np.maximum(sf2 - (v * v).sum(axis=0), 1e-9)
        return mean, np.sqrt(var)

    def propose(self, observed: list[Observation]) -> Proposal | None:
        prod = [o for o in observed if o.input == "production"]
        seen = {o.config for o in prod}
        if len(seen) >= len(self.space):
            return None
        # A transient run (refused, lost) is no failure of its configuration: out of the model, but seen above.
        ok = {o.config: math.log(max(o.time_s, 1e-6)) for o in prod if o.ok and not o.transient}
        failed = {o.config for o in prod if not o.ok and not o.transient} - set(ok)
        mu, pf = self.prior(ok, failed)
        mean, sd = self.posterior(ok, mu)
        by_time = len(self.measured(prod)) % self.time_every == self.time_every - 1
        f = mean if by_time else mean + self.logp
        done = [ok[c] + (0.0 if by_time else self.logp[c]) for c in ok]
        best = min(done) if done else float(np.min(f))
        z = (best - f) / sd
        ei = sd * (z * ndtr(z) + np.exp(-0.5 * z * z) / math.sqrt(2 * math.pi))
        score = ei * (1.0 - pf)
        if not done:
            score = -(f + 2.0 * pf)  # nothing measured yet: best predicted, failures avoided
        score = score.astype(float)
        score[list(seen)] = -np.inf
        # The CRS said these never fit: a run would only be refused.
        score[self.priced_out] = -np.inf
        i = int(np.argmax(score))
        if not np.isfinite(score[i]):
            unrun = self.priced_out.copy()
            unrun[list(seen)] = False
            left = int(unrun.sum())
            if left:
                which = "the configuration not run never fits" if left == 1 else \
                    f"the {left} configurations not run never fit"
                self.ended = f"{which} in the datacenter (the CRS refused to quote them)"
            return None
        what = "time" if by_time else "cost"
        return Proposal(i, why=f"expected improvement of {what}")
