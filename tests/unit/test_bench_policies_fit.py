"""bench/policies.py: the arrival spread of Table IV's scenarios is the best fit of FCFSMin's row; stored schedules hold."""

import math

import pytest

from bench.policies import SPREAD_GRID, clairvoyant_late, fit_error, spread_fit, table4_scenarios


def test_fit_error_is_zero_on_the_papers_figures_and_grows_both_ways():
    assert fit_error(0.088, 1.6, 0.088, 1.6) == 0.0
    assert fit_error(0.088 * math.e, 1.6, 0.088, 1.6) == pytest.approx(1.0)
    assert fit_error(0.088, 4.2, 0.088, 1.6) == pytest.approx(math.log(4.7 / 2.1) ** 2)
    assert fit_error(0.0032, 0.0, 0.0032, 0.0) == 0.0          # the paper's N_L of 0 is no division by zero


@pytest.mark.parametrize("index", [0, 1])
def test_each_scenario_uses_the_spread_that_fits_fcfsmin_best(index):
    sc = table4_scenarios()[index]
    fit = spread_fit(sc, range(10))
    assert set(fit["grid"]) == set(SPREAD_GRID) and sc.spread in fit["grid"]
    assert fit["used_is_best"], (fit["best_spread"], fit["grid"])


def test_no_wait_at_all_is_no_fit():
    assert fit_error(0.0, 0.0, 0.0032, 0.0) == math.inf


def test_the_stored_clairvoyant_schedules_start_every_job_on_time():
    # Seeds 3, 4 and 7 of scenario 2: the online modes start some job late; these whole-run schedules do not.
    assert clairvoyant_late(table4_scenarios()[1], range(10)) == {3: 0, 4: 0, 7: 0}
