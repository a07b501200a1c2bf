"""The FPGA implementation library (irm_fpga.designs): results are numerically right, inputs are
validated with precise messages, device times follow each design's model."""

from __future__ import annotations

import math

import numpy as np
import pytest

from irm_fpga.designs import DESIGNS, get_design


def _norm_cdf(x: float) -> float:
    return 0.5 * math.erfc(-x / math.sqrt(2.0))


def _bs_reference(s: float, k: float, r: float, v: float, t: float, put: bool) -> float:
    d1 = (math.log(s / k) + (r + v * v / 2) * t) / (v * math.sqrt(t))
    d2 = d1 - v * math.sqrt(t)
    if put:
        return k * math.exp(-r * t) * _norm_cdf(-d2) - s * _norm_cdf(-d1)
    return s * _norm_cdf(d1) - k * math.exp(-r * t) * _norm_cdf(d2)


def test_registry_and_unknown_design() -> None:
    assert set(DESIGNS) == {"sleep", "black_scholes", "mc_bond_option", "fft", "moving_average"}
    with pytest.raises(ValueError, match="unknown design 'nope'"):
        get_design("nope")


def test_sleep_device_time_is_the_duration() -> None:
    d = get_design("sleep")
    assert d.run({"duration": 0.25}) == (None, 0.25)
    assert d.prepare({"duration": 2})[1] == 2.0
    for bad, msg in (({"duration": -1.0}, ">= 0"), ({"duration": "x"}, "must be a number"),
                     ({}, "missing parameter"), ({"duration": 1.0, "speed": 2}, "unknown parameter"),
                     ({"duration": float("nan")}, "finite"), ({"duration": 1e9}, "<= 3600")):
        with pytest.raises(ValueError, match=msg):
            d.prepare(bad)


def test_black_scholes_against_closed_form() -> None:
    rng = np.random.default_rng(7)
    n = 200
    s = rng.uniform(50, 150, n)
    k = rng.uniform(50, 150, n)
    r = rng.uniform(-0.01, 0.08, n)
    v = rng.uniform(0.05, 0.8, n)
    t = rng.uniform(0.05, 5.0, n)
    d = get_design("black_scholes")
    for put in (False, True):
        out, dev_s = d.run({"spot": s, "strike": k, "rate": r, "volatility": v, "maturity": t, "put": put})
        want = [_bs_reference(*row, put) for row in zip(s, k, r, v, t, strict=True)]
        np.testing.assert_allclose(out["price"], want, rtol=1e-9, atol=1e-9)
    # put-call parity on the design's own outputs
    call = d.run({"spot": s, "strike": k, "rate": r, "volatility": v, "maturity": t})[0]["price"]
    put = d.run({"spot": s, "strike": k, "rate": r, "volatility": v, "maturity": t, "put": True})[0]["price"]
    np.testing.assert_allclose(call - put, s - k * np.exp(-r * t), atol=1e-9)
    # device time: one option per cycle per pipe at 200 MHz, plus fixed costs; grows with n
    small = d.prepare({"spot": 100.0, "strike": 100.0, "rate": 0.01, "volatility": 0.2, "maturity": 1.0})[1]
    big = d.prepare({"spot": np.full(400_000, 100.0), "strike": 100.0, "rate": 0.01, "volatility": 0.2,
                     "maturity": 1.0})[1]
    assert big - small == pytest.approx((100_000 - 1) / 200e6)


def test_black_scholes_scalar_broadcast_and_validation() -> None:
    d = get_design("black_scholes")
    out = d.run({"spot": [90.0, 100.0, 110.0], "strike": 100.0, "rate": 0.05, "volatility": 0.2,
                 "maturity": 1.0})[0]["price"]
    assert out.shape == (3,)
    assert out[1] == pytest.approx(_bs_reference(100, 100, 0.05, 0.2, 1.0, False), rel=1e-12)
    base = {"spot": [1.0, 2.0], "strike": 1.0, "rate": 0.0, "volatility": 0.2, "maturity": 1.0}
    for change, msg in (({"volatility": [0.2, -0.1]}, r"'volatility' must be > 0 \(element 1 is -0.1\)"),
                        ({"strike": [1.0, 2.0, 3.0]}, "equal lengths .*got spot=2, strike=3"),
                        ({"spot": [[1.0]]}, "one-dimensional"),
                        ({"rate": float("inf")}, "'rate' must be finite"),
                        ({"spot": ["a"]}, "must hold numbers"),
                        ({"put": "yes"}, "'put' must be a boolean")):
        with pytest.raises(ValueError, match=msg):
            d.prepare({**base, **change})
    with pytest.raises(ValueError, match="missing parameter.*'maturity'"):
        d.prepare({k: v for k, v in base.items() if k != "maturity"})


def _vasicek_bond(r: float, a: float, b: float, sigma: float, tau: float) -> float:
    bb = (1 - math.exp(-a * tau)) / a
    log_a = (bb - tau) * (a * a * b - sigma * sigma / 2) / (a * a) - sigma * sigma * bb * bb / (4 * a)
    return math.exp(log_a - bb * r)


def _jamshidian(r0: float, a: float, b: float, sigma: float, t: float, s: float, k: float, put: bool) -> float:
    p_t = _vasicek_bond(r0, a, b, sigma, t)
    p_s = _vasicek_bond(r0, a, b, sigma, s)
    sp = sigma * math.sqrt((1 - math.exp(-2 * a * t)) / (2 * a)) * (1 - math.exp(-a * (s - t))) / a
    h = math.log(p_s / (k * p_t)) / sp + sp / 2
    if put:
        return k * p_t * _norm_cdf(-h + sp) - p_s * _norm_cdf(-h)
    return p_s * _norm_cdf(h) - k * p_t * _norm_cdf(h - sp)


@pytest.mark.parametrize("put", [False, True])
def test_mc_bond_option_within_confidence_bounds(put: bool) -> None:
    params = {"r0": 0.03, "mean_reversion": 0.5, "long_rate": 0.05, "volatility": 0.02,
              "option_maturity": 1.0, "bond_maturity": 3.0, "strike": 0.9, "put": put,
              "paths": 100_000, "steps": 4, "seed": 11}
    out, dev_s = get_design("mc_bond_option").run(params)
    exact = _jamshidian(0.03, 0.5, 0.05, 0.02, 1.0, 3.0, 0.9, put)
    assert out["std_error"] > 0 and out["paths"] == 100_000
    assert abs(out["price"] - exact) <= 4 * out["std_error"], (out, exact)
    # same seed, same answer; device time = paths/4 * steps cycles (+256) at 200 MHz + 2 us
    assert get_design("mc_bond_option").run(params)[0]["price"] == out["price"]
    assert dev_s == pytest.approx(2e-6 + (25_000 * 4 + 256) / 200e6)


def test_mc_bond_option_validation() -> None:
    d = get_design("mc_bond_option")
    base = {"r0": 0.03, "mean_reversion": 0.5, "long_rate": 0.05, "volatility": 0.02,
            "option_maturity": 2.0, "bond_maturity": 3.0, "strike": 0.9}
    with pytest.raises(ValueError, match=r"'bond_maturity' \(1.0\) must be after 'option_maturity' \(2.0\)"):
        d.prepare({**base, "bond_maturity": 1.0})
    with pytest.raises(ValueError, match="'paths' must be an integer"):
        d.prepare({**base, "paths": 10.5})
    with pytest.raises(ValueError, match="'paths' \\* 'steps' must be <="):
        d.prepare({**base, "paths": 10_000_000, "steps": 100})
    with pytest.raises(ValueError, match="'mean_reversion' must be > 0.0"):
        d.prepare({**base, "mean_reversion": 0.0})


def test_fft_matches_numpy_and_models_application_a() -> None:
    rng = np.random.default_rng(3)
    x = rng.standard_normal(1024) + 1j * rng.standard_normal(1024)
    d = get_design("fft")
    np.testing.assert_allclose(d.run({"signal": x})[0]["spectrum"], np.fft.fft(x), rtol=1e-12, atol=1e-9)
    np.testing.assert_allclose(d.run({"signal": x, "inverse": True})[0]["spectrum"], np.fft.ifft(x), atol=1e-12)
    real = rng.standard_normal(64)
    np.testing.assert_allclose(d.run({"signal": real.tolist()})[0]["spectrum"], np.fft.fft(real), atol=1e-12)
    # thesis §3.4.3: an FFT over 262,144 doubles is a 0.33 ms task
    assert d.prepare({"signal": np.zeros(262_144)})[1] == pytest.approx(0.33e-3, rel=0.02)
    with pytest.raises(ValueError, match="power of two, got 1000"):
        d.prepare({"signal": np.zeros(1000)})
    with pytest.raises(ValueError, match="2..16777216 elements, got 1"):
        d.prepare({"signal": [1.0]})


def test_moving_average_by_hand() -> None:
    d = get_design("moving_average")
    out, dev_s = d.run({"signal": [1.0, 2.0, 3.0, 4.0, 10.0], "window": 2})
    np.testing.assert_allclose(out["average"], [1.5, 2.5, 3.5, 7.0])
    np.testing.assert_allclose(d.run({"signal": [1.0, 2.0, 3.0, 4.0, 10.0], "window": 5})[0]["average"], [4.0])
    np.testing.assert_allclose(d.run({"signal": [3.0, -1.0], "window": 1})[0]["average"], [3.0, -1.0])
    assert dev_s == pytest.approx(2e-6 + 7 / 200e6)
    with pytest.raises(ValueError, match=r"'window' \(6\) must not exceed the signal length \(5\)"):
        d.prepare({"signal": [1.0] * 5, "window": 6})
    with pytest.raises(ValueError, match="'window' must be in"):
        d.prepare({"signal": [1.0] * 5, "window": 0})
    with pytest.raises(ValueError, match="must be real"):
        d.prepare({"signal": [1j, 2.0], "window": 1})
