"""The implementation library: FPGA designs that compute real results.

A design is what a device of the emulated FPGA-server is configured with
(thesis §3.2.3: every device of an FPGA group carries the same design). Each
design here does two things with a task's parameters:

* `prepare(params) -> (inputs, device_seconds)`: validates the parameters
  (a mapping of names to numbers or 1-D arrays; anything wrong raises
  `ParamError`, a `ValueError` naming the design, the parameter and what is
  wrong, with the parameters at fault in `params`) and
  returns the normalised inputs and the **emulated device time** of the task,
  from the design's device-time model (cycles at a clock rate, plus a fixed
  set-up time, see `DeviceTimeModel`). The device time never depends on how
  long numpy takes: it is what the FPGA would take, and the engine makes the
  task occupy its device for exactly that long on the server's clock.
* `compute(inputs) -> result`: computes the result for real, with numpy.

Designs (`DESIGNS`, looked up with `get_design(name)`):

| name | parameters | result | device time |
|---|---|---|---|
| `sleep` | `duration` (s, 0..3600) | `None` | `duration` (synthetic load, thesis §3.4) |
| `black_scholes` | `spot`, `strike`, `rate`, `volatility`, `maturity` (years), optional `put` (bool); scalars or equal-length 1-D arrays | `{"price": array}` of European option prices (seed 000 §IV's benchmark) | 1 option per cycle per pipe, 4 pipes |
| `mc_bond_option` | `r0`, `mean_reversion`, `long_rate`, `volatility`, `option_maturity`, `bond_maturity`, `strike`, optional `put`, `paths`, `steps`, `seed` | `{"price", "std_error", "paths"}`: Monte-Carlo price of a European option on a zero-coupon bond (seed 001 §VI), short rate following Vasicek (an HJM model with exponentially damped volatility) | one path step per cycle per pipe, 4 pipes |
| `fft` | `signal` (1-D real or complex, length a power of two, 2..2^24), optional `inverse` | `{"spectrum": complex array}` (numpy's sign and scaling conventions) | 4 samples per cycle; a 262,144-point FFT takes about 0.33 ms, thesis §3.4.3 (application A) |
| `moving_average` | `signal` (1-D real), `window` (1..len) | `{"average": array}` of the len-window+1 full-window means | 1 sample per cycle |
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy.special import ndtr

MAX_ELEMENTS = 1 << 24          # largest array a task may carry (16 Mi elements)
MAX_SLEEP_S = 3600.0
MAX_PATH_STEPS = 50_000_000     # paths * steps of one Monte-Carlo task


class ParamError(ValueError):
    """A task's parameters are wrong; `params` names the parameters at fault (none: the parameters as a whole)."""

    def __init__(self, message: str, params: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.params = params


@dataclass(frozen=True)
class DeviceTimeModel:
    """Emulated device time: a fixed set-up time plus cycles at a clock rate."""

    clock_hz: float = 200e6
    setup_s: float = 2e-6

    def seconds(self, cycles: float) -> float:
        return self.setup_s + cycles / self.clock_hz


class Design:
    """Base class. Subclasses set `name` and implement `prepare` and `compute`."""

    name: str = ""
    parameters: tuple[str, ...] = ()
    optional: tuple[str, ...] = ()
    model: DeviceTimeModel = DeviceTimeModel()

    def prepare(self, params: Mapping[str, Any]) -> tuple[Any, float]:
        raise NotImplementedError

    def compute(self, inputs: Any) -> Any:
        raise NotImplementedError

    def run(self, params: Mapping[str, Any]) -> tuple[Any, float]:
        """Validate and compute at once: `(result, device_seconds)`."""
        inputs, seconds = self.prepare(params)
        return self.compute(inputs), seconds

    # -- validation helpers ---------------------------------------------------

    def _fail(self, message: str, *params: str) -> ParamError:
        return ParamError(f"{self.name}: {message}", params)

    def _check_keys(self, params: Mapping[str, Any]) -> None:
        if not isinstance(params, Mapping):
            raise self._fail(f"parameters must be a mapping, got {type(params).__name__}")
        known = set(self.parameters) | set(self.optional)
        unknown = sorted(str(k) for k in params if k not in known)
        if unknown:
            raise self._fail(f"unknown parameter(s) {', '.join(map(repr, unknown))}; "
                             f"expected {', '.join(self.parameters + self.optional)}", *unknown)
        missing = [k for k in self.parameters if k not in params]
        if missing:
            raise self._fail(f"missing parameter(s) {', '.join(map(repr, missing))}", *missing)

    def _number(self, params: Mapping[str, Any], key: str, *, low: float | None = None,
                high: float | None = None, strict_low: bool = False, default: float | None = None) -> float:
        if key not in params and default is not None:
            return default
        v = params[key]
        if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)):
            raise self._fail(f"{key!r} must be a number, got {type(v).__name__}", key)
        x = float(v)
        if not math.isfinite(x):
            raise self._fail(f"{key!r} must be finite, got {x}", key)
        if low is not None and (x <= low if strict_low else x < low):
            raise self._fail(f"{key!r} must be {'>' if strict_low else '>='} {low}, got {x}", key)
        if high is not None and x > high:
            raise self._fail(f"{key!r} must be <= {high}, got {x}", key)
        return x

    def _integer(self, params: Mapping[str, Any], key: str, *, low: int, high: int, default: int) -> int:
        v = params.get(key, default)
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
            raise self._fail(f"{key!r} must be an integer, got {type(v).__name__}", key)
        if not low <= int(v) <= high:
            raise self._fail(f"{key!r} must be in [{low}, {high}], got {int(v)}", key)
        return int(v)

    def _flag(self, params: Mapping[str, Any], key: str) -> bool:
        v = params.get(key, False)
        if not isinstance(v, (bool, np.bool_)):
            raise self._fail(f"{key!r} must be a boolean, got {type(v).__name__}", key)
        return bool(v)

    def _vector(self, params: Mapping[str, Any], key: str, *, complex_ok: bool = False,
                min_len: int = 1) -> np.ndarray:
        v = params[key]
        if isinstance(v, (str, bytes)):
            raise self._fail(f"{key!r} must be numbers, got {type(v).__name__}", key)
        try:
            a = np.asarray(v)
        except (TypeError, ValueError) as e:
            raise self._fail(f"{key!r} is not an array of numbers ({e})", key) from None
        if a.ndim == 0:
            a = a.reshape(1)
        if a.ndim != 1:
            raise self._fail(f"{key!r} must be one-dimensional, got shape {a.shape}", key)
        if a.dtype.kind == "c":
            if not complex_ok:
                raise self._fail(f"{key!r} must be real, got complex values", key)
            a = a.astype(np.complex128, copy=False)
        elif a.dtype.kind in "iuf":
            a = a.astype(np.float64, copy=False)
        else:
            raise self._fail(f"{key!r} must hold numbers, got dtype {a.dtype}", key)
        if not min_len <= a.size <= MAX_ELEMENTS:
            raise self._fail(f"{key!r} must have {min_len}..{MAX_ELEMENTS} elements, got {a.size}", key)
        bad = ~np.isfinite(a)
        if bad.any():
            raise self._fail(f"{key!r} must be finite (element {int(np.argmax(bad))} is {a[bad][0]})", key)
        return a


class Sleep(Design):
    """Occupies a device for `duration` seconds: the synthetic tasks of thesis §3.4."""

    name = "sleep"
    parameters = ("duration",)

    def __init__(self, name: str = "sleep") -> None:
        # Simulations give each synthetic application its own sleep design (its own bitstream), so
        # moving a device between their groups costs a reconfiguration as it would on hardware.
        self.name = name

    def prepare(self, params: Mapping[str, Any]) -> tuple[Any, float]:
        # Hot path of the simulations: a task is {"duration": float}.
        if type(params) is dict and len(params) == 1:
            d = params.get("duration")
            if type(d) is float and 0.0 <= d <= MAX_SLEEP_S:
                return None, d
        self._check_keys(params)
        d = self._number(params, "duration", low=0.0, high=MAX_SLEEP_S)
        return None, d

    def compute(self, inputs: Any) -> Any:
        return None


class BlackScholes(Design):
    """European options priced with the Black-Scholes formula (seed 000's benchmark)."""

    name = "black_scholes"
    parameters = ("spot", "strike", "rate", "volatility", "maturity")
    optional = ("put",)
    pipes = 4

    def prepare(self, params: Mapping[str, Any]) -> tuple[Any, float]:
        self._check_keys(params)
        cols = {k: self._vector(params, k) for k in self.parameters}
        sizes = {a.size for a in cols.values()} - {1}
        if len(sizes) > 1:
            lengths = ", ".join(f"{k}={a.size}" for k, a in cols.items() if a.size != 1)
            raise self._fail(f"arrays must have equal lengths (or be scalars), got {lengths}",
                             *(k for k, a in cols.items() if a.size != 1))
        n = sizes.pop() if sizes else 1
        for k in ("spot", "strike", "volatility", "maturity"):
            a = cols[k]
            bad = a <= 0
            if bad.any():
                raise self._fail(f"{k!r} must be > 0 (element {int(np.argmax(bad))} is {a[bad][0]})", k)
        put = self._flag(params, "put")
        arrays = {k: np.broadcast_to(a, (n,)) for k, a in cols.items()}
        # In: five doubles per option; out: one. Pipelined: one option per cycle per pipe.
        return (arrays, put), self.model.seconds(math.ceil(n / self.pipes) + 64)

    def compute(self, inputs: Any) -> Any:
        a, put = inputs
        s, k, r, v, t = a["spot"], a["strike"], a["rate"], a["volatility"], a["maturity"]
        sq = v * np.sqrt(t)
        d1 = (np.log(s / k) + (r + 0.5 * v * v) * t) / sq
        d2 = d1 - sq
        disc = k * np.exp(-r * t)
        if put:
            price = disc * ndtr(-d2) - s * ndtr(-d1)
        else:
            price = s * ndtr(d1) - disc * ndtr(d2)
        return {"price": np.asarray(price, dtype=np.float64)}


class McBondOption(Design):
    """Monte-Carlo price of a European option on a zero-coupon bond (seed 001 §VI).

    The forward curve follows the one-factor HJM model with volatility
    sigma*exp(-a(T-t)), i.e. the Vasicek short rate dr = a(b - r)dt + sigma dW.
    Each path steps the short rate and its time integral exactly (their joint
    Gaussian transition, so there is no discretisation bias), prices the bond
    at the option's expiry with the affine formula, and discounts the payoff
    max(P - K, 0) (or max(K - P, 0) for a put) along the path. The result is
    the sample mean and its standard error.
    """

    name = "mc_bond_option"
    parameters = ("r0", "mean_reversion", "long_rate", "volatility", "option_maturity", "bond_maturity", "strike")
    optional = ("put", "paths", "steps", "seed")
    pipes = 4

    def prepare(self, params: Mapping[str, Any]) -> tuple[Any, float]:
        self._check_keys(params)
        r0 = self._number(params, "r0", low=-1.0, high=1.0)
        a = self._number(params, "mean_reversion", low=0.0, high=100.0, strict_low=True)
        b = self._number(params, "long_rate", low=-1.0, high=1.0)
        sigma = self._number(params, "volatility", low=0.0, high=5.0, strict_low=True)
        t = self._number(params, "option_maturity", low=0.0, high=100.0, strict_low=True)
        s = self._number(params, "bond_maturity", low=0.0, high=200.0, strict_low=True)
        if s <= t:
            raise self._fail(f"'bond_maturity' ({s}) must be after 'option_maturity' ({t})", "bond_maturity")
        k = self._number(params, "strike", low=0.0, strict_low=True)
        put = self._flag(params, "put")
        paths = self._integer(params, "paths", low=2, high=10_000_000, default=100_000)
        steps = self._integer(params, "steps", low=1, high=10_000, default=32)
        if paths * steps > MAX_PATH_STEPS:
            raise self._fail(f"'paths' * 'steps' must be <= {MAX_PATH_STEPS}, got {paths * steps}", "paths", "steps")
        seed = self._integer(params, "seed", low=0, high=2**63 - 1, default=0)
        inputs = (r0, a, b, sigma, t, s, k, put, paths, steps, seed)
        return inputs, self.model.seconds(math.ceil(paths / self.pipes) * steps + 256)

    def compute(self, inputs: Any) -> Any:
        r0, a, b, sigma, t, s, k, put, paths, steps, seed = inputs
        rng = np.random.default_rng(seed)
        dt = t / steps
        e1 = math.exp(-a * dt)
        e2 = math.exp(-2 * a * dt)
        var_r = sigma * sigma * (1 - e2) / (2 * a)
        var_i = sigma * sigma / (a * a) * (dt - 2 * (1 - e1) / a + (1 - e2) / (2 * a))
        cov = sigma * sigma / (2 * a * a) * (1 - e1) ** 2
        sd_r = math.sqrt(var_r)
        # Integral noise = beta * (rate noise) + independent rest.
        beta = cov / var_r
        sd_rest = math.sqrt(max(var_i - beta * cov, 0.0))
        r = np.full(paths, r0)
        integral = np.zeros(paths)
        for _ in range(steps):
            z1 = rng.standard_normal(paths)
            z2 = rng.standard_normal(paths)
            x = sd_r * z1
            integral += b * dt + (r - b) * (1 - e1) / a + beta * x + sd_rest * z2
            r = r * e1 + b * (1 - e1) + x
        tau = s - t
        bb = (1 - math.exp(-a * tau)) / a
        log_a = (bb - tau) * (a * a * b - sigma * sigma / 2) / (a * a) - sigma * sigma * bb * bb / (4 * a)
        bond = np.exp(log_a - bb * r)
        payoff = np.maximum(k - bond, 0.0) if put else np.maximum(bond - k, 0.0)
        values = np.exp(-integral) * payoff
        return {"price": float(values.mean()),
                "std_error": float(values.std(ddof=1) / math.sqrt(paths)),
                "paths": paths}


class Fft(Design):
    """Radix-2 FFT (numpy's conventions: forward unscaled, inverse scaled by 1/n)."""

    name = "fft"
    parameters = ("signal",)
    optional = ("inverse",)
    samples_per_cycle = 4

    def prepare(self, params: Mapping[str, Any]) -> tuple[Any, float]:
        self._check_keys(params)
        x = self._vector(params, "signal", complex_ok=True, min_len=2)
        n = x.size
        if n & (n - 1):
            raise self._fail(f"'signal' length must be a power of two, got {n}", "signal")
        inverse = self._flag(params, "inverse")
        # Streaming pipeline: n / 4 cycles plus one pipeline stage fill per butterfly level.
        cycles = n // self.samples_per_cycle + 32 * int(math.log2(n))
        return (x, inverse), self.model.seconds(cycles)

    def compute(self, inputs: Any) -> Any:
        x, inverse = inputs
        return {"spectrum": np.fft.ifft(x) if inverse else np.fft.fft(x)}


class MovingAverage(Design):
    """Means of every full window of `window` consecutive samples."""

    name = "moving_average"
    parameters = ("signal", "window")

    def prepare(self, params: Mapping[str, Any]) -> tuple[Any, float]:
        self._check_keys(params)
        x = self._vector(params, "signal")
        w = self._integer(params, "window", low=1, high=MAX_ELEMENTS, default=1)
        if w > x.size:
            raise self._fail(f"'window' ({w}) must not exceed the signal length ({x.size})", "window")
        return (x, w), self.model.seconds(x.size + w)

    def compute(self, inputs: Any) -> Any:
        x, w = inputs
        c = np.concatenate(([0.0], np.cumsum(x)))
        return {"average": (c[w:] - c[:-w]) / w}


DESIGNS: dict[str, Design] = {d.name: d for d in (Sleep(), BlackScholes(), McBondOption(), Fft(), MovingAverage())}
MAX_NAME_CHARS = 64     # a design's name, at most (a longer one is no design's, and is not echoed back)


def unknown_design(design: str) -> str | None:
    """Why `design` names no design (what to send instead), or None if it names one. A name too long to be a
    design's is not echoed: an error status that repeats a huge input would exceed gRPC's metadata limit."""
    if len(design) > MAX_NAME_CHARS:
        return f"at most {MAX_NAME_CHARS} characters; available: {sorted(DESIGNS)}"
    if design not in DESIGNS:
        return f"unknown design {design!r}; available: {sorted(DESIGNS)}"
    return None


def get_design(name: str) -> Design:
    try:
        return DESIGNS[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown design {name!r}; known: {', '.join(sorted(DESIGNS))}") from None
