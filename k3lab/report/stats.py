"""Seed-paired comparisons of sweep variants against a baseline variant.

Trials of the same seed see the same data order and the same initial draw, so the
seed-to-seed spread (as large as the effects k3lab compares: docs/results.md, "Pairing") cancels
in the per-seed difference. For each variant:

    d_s      = metric(variant, seed s) - metric(baseline, seed s)   for every seed s
               where both trials finished with a finite metric (a "pair")
    mean     = mean of d_s over the n pairs
    interval = mean +- t(0.975, n - 1) * sd(d) / sqrt(n)            (95%, Student t)

Verdict: the interval lies wholly on the metric's better side of zero (below it for
mode `min`, above it for `max`) -> "better"; wholly on the other side -> "worse";
otherwise "not resolved" (at this budget: more seeds or more steps may resolve it).
One pair gives a difference but no interval, so never a verdict.

The t quantile is computed here, exactly, for whole degrees of freedom (there are
n - 1 of them): the Student t distribution function has a closed form for those
(Abramowitz & Stegun 26.7.3 and 26.7.4), inverted by bisection. scipy is not a k3lab
dependency (the bundle for air-gapped GPU machines ships mlflow-skinny without it);
the tests check this against scipy where scipy is installed.

Everything here works on plain data: {variant: {seed: value or None}}, where None
marks a trial that failed, diverged or was stopped early.
"""

from __future__ import annotations

import functools
import math
import statistics

import attrs
import numpy as np

BETTER, WORSE, NOT_RESOLVED = "better", "worse", "not resolved"
CONFIDENCE = 0.95

SeedValues = dict[int, float | None]  # seed -> final metric; None: the trial has no usable value


@attrs.frozen
class Comparison:
    """One variant against the baseline, paired by seed."""

    variant: str
    baseline: str
    pairs: int  # seeds where both trials have a usable value
    seeds: int  # seeds with a trial of either (pairs + excluded)
    mean_diff: float | None  # variant - baseline, mean over the pairs; None without pairs
    half_width: float | None  # of the 95% interval; None with fewer than two pairs
    baseline_mean: float | None  # the baseline's mean over the paired seeds
    verdict: str  # BETTER, WORSE or NOT_RESOLVED
    reason: str = ""  # why not resolved: "no pairs", "one pair", "interval covers 0"

    @property
    def low(self) -> float | None:
        return None if self.half_width is None else self.mean_diff - self.half_width

    @property
    def high(self) -> float | None:
        return None if self.half_width is None else self.mean_diff + self.half_width

    @property
    def relative(self) -> float | None:
        """The mean difference as a fraction of the baseline's mean over the same seeds."""
        if self.mean_diff is None or not self.baseline_mean:
            return None
        return self.mean_diff / abs(self.baseline_mean)

    def to_json(self) -> dict:
        return attrs.asdict(self) | {"low": self.low, "high": self.high, "relative": self.relative}


# -- Student t --------------------------------------------------------------------------


def t_two_sided_probability(t, df: int):
    """P(|T| <= t) for Student's T with `df` (a whole number >= 1) degrees of freedom: a float for
    a float t >= 0, elementwise for a numpy array (the calibration simulates with it).

    A&S 26.7.3 (odd df) and 26.7.4 (even df), with theta = atan(|t| / sqrt(df)):
        odd:  2/pi * (theta + sin(theta) * sum_{k=0}^{(df-3)/2} c_k cos(theta)^(2k+1)),
              c_0 = 1, c_k = c_{k-1} * 2k / (2k+1)           (df = 1: 2 theta / pi)
        even: sin(theta) * sum_{k=0}^{df/2-1} e_k cos(theta)^(2k),
              e_0 = 1, e_k = e_{k-1} * (2k-1) / (2k)
    """
    if df < 1 or df != int(df):
        raise ValueError(f"degrees of freedom must be a whole number >= 1, got {df}")
    theta = np.arctan(np.abs(t) / math.sqrt(df))
    sin, cos = np.sin(theta), np.cos(theta)
    if df % 2 == 0:
        term = total = np.ones_like(theta)
        for k in range(1, df // 2):
            term = term * (2 * k - 1) / (2 * k) * cos * cos
            total = total + term
        probability = sin * total
    else:
        term = total = cos if df > 1 else np.zeros_like(theta)
        for k in range(1, (df - 1) // 2):
            term = term * (2 * k) / (2 * k + 1) * cos * cos
            total = total + term
        probability = 2 / math.pi * (theta + sin * total)
    return float(probability) if np.ndim(probability) == 0 else probability


@functools.lru_cache(maxsize=4096)  # a sweep's designs ask the same few quantiles again and again
def t_quantile(p: float, df: int) -> float:
    """The p-quantile (0.5 < p < 1) of Student's t with `df` degrees of freedom, e.g.
    t_quantile(0.975, 2) = 4.3027; bisection on the two-sided probability to 1e-12."""
    if not 0.5 < p < 1:
        raise ValueError(f"p must lie in (0.5, 1), got {p}")
    target = 2 * p - 1  # P(|T| <= q) = 2p - 1
    low, high = 0.0, 1.0
    while t_two_sided_probability(high, df) < target:
        low, high = high, 2 * high
    while high - low > 1e-12 * high:
        middle = (low + high) / 2
        low, high = (middle, high) if t_two_sided_probability(middle, df) < target else (low, middle)
    return (low + high) / 2


def t_interval(values: list[float], confidence: float = CONFIDENCE) -> tuple[float, float | None]:
    """(mean, half-width of the two-sided t-interval); half-width None for a single value."""
    if not values:
        raise ValueError("t_interval needs at least one value")
    mean = statistics.fmean(values)
    if len(values) < 2:
        return mean, None
    spread = statistics.stdev(values) / math.sqrt(len(values))
    return mean, t_quantile((1 + confidence) / 2, len(values) - 1) * spread


# -- pairing and verdicts ---------------------------------------------------------------


def usable(value: float | None) -> bool:
    return value is not None and math.isfinite(value)


def paired_seeds(variant: SeedValues, baseline: SeedValues) -> list[int]:
    """Seeds where both the variant and the baseline have a usable value, in order."""
    return sorted(s for s in variant.keys() & baseline.keys() if usable(variant[s]) and usable(baseline[s]))


def verdict(low: float | None, high: float | None, mode: str) -> str:
    """BETTER / WORSE when the interval [low, high] of (variant - baseline) excludes zero."""
    if low is None or high is None or low <= 0 <= high:
        return NOT_RESOLVED
    lower_is_better = mode == "min"
    return BETTER if (high < 0) == lower_is_better else WORSE


def compare(variant: str, values: SeedValues, baseline: str, baseline_values: SeedValues, mode: str) -> Comparison:
    """`variant` against `baseline`, paired by seed (see the module docstring)."""
    seeds = paired_seeds(values, baseline_values)
    every_seed = len(values.keys() | baseline_values.keys())
    if not seeds:
        return Comparison(variant, baseline, 0, every_seed, None, None, None, NOT_RESOLVED, "no pairs")
    diffs = [values[s] - baseline_values[s] for s in seeds]
    mean, half = t_interval(diffs)
    baseline_mean = statistics.fmean(baseline_values[s] for s in seeds)
    if half is None:
        return Comparison(variant, baseline, 1, every_seed, mean, None, baseline_mean, NOT_RESOLVED, "one pair")
    outcome = verdict(mean - half, mean + half, mode)
    reason = "interval covers 0" if outcome == NOT_RESOLVED else ""
    return Comparison(variant, baseline, len(seeds), every_seed, mean, half, baseline_mean, outcome, reason)


# -- presentation (shared by the terminal table and the markdown) -----------------------
