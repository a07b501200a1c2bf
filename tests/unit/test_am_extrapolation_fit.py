"""The extrapolation's curve family is chosen by AICc, not by in-sample R^2 (which always prefers more parameters)."""

from __future__ import annotations

import numpy as np
import pytest

from application_manager.profilers.extrapolated import apply_curve, fit_curve


def test_noisy_linear_data_is_not_fitted_as_a_quadratic():
    # By R^2 the quadratic (a superset of the line) won 189 of these 200 and extrapolated ~26% off.
    rng = np.random.default_rng(0)
    fams: dict[str, int] = {}
    errs = []
    for _ in range(200):
        x = np.sort(rng.uniform(2, 6, 5))
        y = 10 * x * (1 + rng.normal(0, 0.03, 5))
        f = fit_curve(list(x), list(y))
        fams[f["family"]] = fams.get(f["family"], 0) + 1
        errs.append(abs(apply_curve(f, 12.0) / 120.0 - 1))
    assert fams.get("quadratic", 0) == 0
    assert float(np.median(errs)) < 0.05


@pytest.mark.parametrize(("family", "truth"), [
    ("linear", lambda x: 3 + 2 * x),
    ("power", lambda x: 3 * x ** 1.5),
    ("exponential", lambda x: 2 * np.exp(0.5 * x)),
])
def test_a_truly_nonlinear_or_offset_relation_is_still_recognised_through_noise(family, truth):
    rng = np.random.default_rng(1)
    x = np.linspace(1, 8, 7)
    picked = [fit_curve(list(x), list(truth(x) * (1 + rng.normal(0, 0.03, 7))))["family"] for _ in range(100)]
    assert picked.count(family) >= 85, picked


def test_an_exact_quadratic_is_recognised_once_there_are_enough_points_for_it():
    x = np.linspace(1, 8, 6)
    f = fit_curve(list(x), list(5 + 2 * x + 0.5 * x * x))
    assert f["family"] == "quadratic" and apply_curve(f, 6.5) == pytest.approx(5 + 13 + 0.5 * 6.5 ** 2, rel=1e-6)
    # Past the benchmark times fitted it goes on proportionally from the end (test_review16_am_fixes).
    assert apply_curve(f, 20) == pytest.approx((5 + 16 + 32) * 20 / 8, rel=1e-6)
    # Five points are too few for AICc to judge three parameters: the quadratic is not considered.
    assert fit_curve(list(x[:5]), list(5 + 2 * x[:5] + 0.5 * x[:5] ** 2))["family"] != "quadratic"


def test_too_few_points_to_compare_fall_back_to_proportional():
    f = fit_curve([1.0, 2.0, 3.0], [10.5, 19.0, 31.0])
    assert f["family"] == "proportional" and f["points"] == 3
