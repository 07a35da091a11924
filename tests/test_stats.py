"""Seed-paired comparisons against a baseline (k3lab.report.stats), on hand-computed cases."""

import math

import pytest

from k3lab.report.stats import (
    BETTER, NOT_RESOLVED, WORSE, compare, t_interval, t_quantile,
    t_two_sided_probability, verdict,
)
from k3lab.report.tables import t_cells as comparison_cells

# two-sided 95% t quantiles from printed tables (df: t_{0.975, df})
T_TABLE = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 9: 2.262, 10: 2.228, 29: 2.045, 30: 2.042, 120: 1.980}


@pytest.mark.parametrize("df, expected", sorted(T_TABLE.items()))
def test_t_quantile_matches_printed_tables(df, expected):
    assert t_quantile(0.975, df) == pytest.approx(expected, abs=5e-4)


def test_t_quantile_tends_to_the_normal_quantile():
    assert t_quantile(0.975, 100_000) == pytest.approx(1.959964, abs=1e-4)


def test_t_quantile_matches_scipy_where_installed():
    scipy_stats = pytest.importorskip("scipy.stats")
    for df in (1, 2, 3, 6, 7, 17, 64, 501):
        for p in (0.6, 0.9, 0.975, 0.995):
            assert t_quantile(p, df) == pytest.approx(scipy_stats.t.ppf(p, df), rel=1e-9)


def test_t_probability_of_known_points():
    assert t_two_sided_probability(1.0, 1) == pytest.approx(0.5)  # Cauchy: P(|T| <= 1) = 1/2
    assert t_two_sided_probability(0.0, 5) == 0.0
    # df 2 has the closed form t / sqrt(2 + t^2)
    assert t_two_sided_probability(3.0, 2) == pytest.approx(3 / math.sqrt(11))
    with pytest.raises(ValueError):
        t_two_sided_probability(1.0, 0)


def test_interval_of_three_differences_by_hand():
    # diffs 1, 2, 3: mean 2, sd 1, t_{0.975,2} = 4.303, half-width 4.303 / sqrt(3) = 2.484
    mean, half = t_interval([1.0, 2.0, 3.0])
    assert mean == 2.0 and half == pytest.approx(4.3027 / math.sqrt(3), abs=1e-4)
    assert half == pytest.approx(2.484, abs=1e-3)


def test_one_value_has_no_interval():
    assert t_interval([0.5]) == (0.5, None)


@pytest.mark.parametrize("low, high, mode, expected", [
    (-0.3, -0.1, "min", BETTER), (0.1, 0.3, "min", WORSE),
    (-0.3, -0.1, "max", WORSE), (0.1, 0.3, "max", BETTER),
    (-0.1, 0.1, "min", NOT_RESOLVED), (0.0, 0.2, "min", NOT_RESOLVED), (None, None, "min", NOT_RESOLVED),
])
def test_verdict_follows_the_metric_mode(low, high, mode, expected):
    assert verdict(low, high, mode) == expected


def test_paired_difference_cancels_the_seed_spread():
    baseline = {0: 2.00, 1: 2.10, 2: 2.20}  # seed spread 0.1, much larger than the effect
    variant = {0: 1.98, 1: 2.08, 2: 2.18}  # 0.02 better on every seed
    c = compare("v", variant, "base", baseline, "min")
    assert (c.pairs, c.seeds, c.verdict, c.reason) == (3, 3, BETTER, "")
    assert c.mean_diff == pytest.approx(-0.02) and c.half_width == pytest.approx(0.0, abs=1e-12)
    assert c.relative == pytest.approx(-0.02 / 2.10)


def test_hand_computed_comparison_covering_zero_is_not_resolved():
    c = compare("v", {0: 3.0, 1: 4.0, 2: 5.0}, "base", {0: 2.0, 1: 2.0, 2: 2.0}, "min")
    assert c.mean_diff == 2.0 and c.low == pytest.approx(2 - 2.484, abs=1e-3)
    assert c.high == pytest.approx(2 + 2.484, abs=1e-3)
    assert (c.verdict, c.reason) == (NOT_RESOLVED, "interval covers 0")


def test_hand_computed_comparison_resolved_worse():
    # diffs 1.0, 1.1, 1.2: mean 1.1, sd 0.1, half-width 4.303 * 0.1 / sqrt(3) = 0.2484
    c = compare("v", {0: 3.0, 1: 3.1, 2: 3.2}, "base", {0: 2.0, 1: 2.0, 2: 2.0}, "min")
    assert c.half_width == pytest.approx(0.2484, abs=1e-4) and c.verdict == WORSE


def test_one_seed_gives_a_difference_but_no_interval():
    c = compare("v", {0: 1.9}, "base", {0: 2.0}, "min")
    assert c.mean_diff == pytest.approx(-0.1) and c.half_width is None and c.low is None
    assert (c.pairs, c.verdict, c.reason) == (1, NOT_RESOLVED, "one pair")
    cells = comparison_cells(c)
    assert cells["interval"] == "n/a" and cells["verdict"] == "not resolved (one pair)"


def test_missing_pairs_are_left_out_and_counted():
    baseline = {0: 2.0, 1: 2.0, 2: 2.0}
    variant = {0: 1.9, 1: 1.8, 3: 1.0}  # seed 2 has no variant trial, seed 3 no baseline trial
    c = compare("v", variant, "base", baseline, "min")
    assert (c.pairs, c.seeds) == (2, 4)
    assert c.mean_diff == pytest.approx(-0.15)  # from seeds 0 and 1 only
    assert comparison_cells(c)["pairs"] == "2/4"


def test_failed_and_diverged_trials_are_left_out_of_the_pairs():
    baseline = {0: 2.0, 1: 2.0, 2: 2.0, 3: 2.0}
    variant = {0: 1.9, 1: None, 2: math.nan, 3: 1.7}  # seed 1 failed, seed 2 diverged
    c = compare("v", variant, "base", baseline, "min")
    assert (c.pairs, c.seeds) == (2, 4) and c.mean_diff == pytest.approx(-0.2)
    failed_baseline = compare("v", {0: 1.9}, "base", {0: None}, "min")
    assert (failed_baseline.pairs, failed_baseline.mean_diff, failed_baseline.reason) == (0, None, "no pairs")
    assert comparison_cells(failed_baseline)["difference"] == "n/a"


def test_cells_show_signed_differences_and_the_interval():
    c = compare("v", {0: 3.0, 1: 3.1, 2: 3.2}, "base", {0: 2.0, 1: 2.0, 2: 2.0}, "min")
    assert comparison_cells(c) == {"variant": "v", "pairs": "3/3", "difference": "+1.1000",
                                   "interval": "[+0.8516, +1.3484]", "relative": "+55.00%", "verdict": "worse"}
