"""The nominal level of a group-sequential design's looks, found by simulating its null.

At n pairs the design's interval is mean_n +- t_{n-1}(1 - a_nom / 2) * sd_n / sqrt(n) (Pocock's
boundary in t form, `k3lab.report.sequential`). a_nom is chosen so that a comparison whose true
mean difference is 0 is rejected at some look start .. max with probability alpha / K.

For Gaussian differences the looks' t-statistics are pivotal. Real paired differences are not
always Gaussian: a variant that now and then trains badly against a steady baseline gives
right-skewed differences, and then the t-statistic's lower tail is heavier (small samples that
miss the rare bad run have a low mean *and* a small spread), so the Gaussian a_nom calls such a
null "better" far more often than alpha / K. The t-statistic is still free of the differences'
location and scale, so its null law depends only on their *shape*; the calibration simulates the
least favourable shape of those it covers: a standardised gamma of skewness `skew` (up to the
design's `skew`, the gamma's level falls as its skewness grows, and at the same skewness it lies
below the lognormal's and a Gaussian-with-occasional-shock mixture's; docs/statistics.md gives
the measured levels). The two-sided p-value is symmetric under a sign flip, so left skew is
covered as well. skew 0: Gaussian differences, the classical design.

The level is the alpha / K quantile of each path's smallest two-sided p-value over the looks,
taken three Monte Carlo standard errors to the safe side, from seeded paths (every machine gets
the same figure; the sweep stores it with its design).
"""

from __future__ import annotations

import functools
import math

import numpy as np

from k3lab.report.stats import t_two_sided_probability

CALIBRATION_PATHS = 1_000_000
CALIBRATION_SEED = 20261205  # the null simulation's seed: a design's level is the same everywhere
SAFETY_SE = 3  # Monte Carlo standard errors the level is set to the safe side
SKEW_COVERED = 1.5  # the skewness of the paired differences a design covers by default
CHUNK = 100_000


def smallest_p_values(z: np.ndarray, looks: range) -> np.ndarray:
    """Per path (rows of mean-0 draws z[path, pair]), the smallest two-sided t-test p-value of the
    mean = 0 over the looks (numbers of pairs)."""
    total, squares = np.cumsum(z, 1), np.cumsum(z * z, 1)
    smallest = np.ones(z.shape[0])
    for look in looks:
        mean = total[:, look - 1] / look
        spread = np.sqrt(np.maximum(squares[:, look - 1] - look * mean ** 2, 1e-300) / (look - 1) / look)
        p = 1.0 - t_two_sided_probability(mean / spread, look - 1)
        smallest = np.minimum(smallest, p)
    return smallest


def null_draws(rng: np.random.Generator, shape: tuple[int, int], skew: float) -> np.ndarray:
    """Mean 0, sd 1 draws of the given skewness: Gaussian (skew 0) or a standardised gamma of
    shape k = (2 / skew)^2 (a gamma's skewness is 2 / sqrt(k))."""
    if skew <= 0:
        return rng.standard_normal(shape)
    k = (2.0 / skew) ** 2
    return (rng.gamma(k, 1.0, shape) - k) / math.sqrt(k)


def safe_quantile(alpha: float, paths: int) -> float:
    """The share of paths whose smallest p-value the level sits at: alpha less SAFETY_SE Monte
    Carlo standard errors of a rate alpha estimated from `paths` paths."""
    return alpha * (1 - SAFETY_SE / math.sqrt(alpha * paths))


@functools.lru_cache(maxsize=128)
def nominal_level(start: int, max_pairs: int, alpha: float, paths: int = CALIBRATION_PATHS,
                  skew: float = 0.0) -> float:
    """The nominal two-sided level of every look (start .. max_pairs pairs) at which the chance of
    rejecting a true mean at some look is at most `alpha`, for differences of skewness up to
    `skew` (see the module docstring). One look of Gaussian differences: alpha."""
    first = max(2, start)
    if max_pairs <= first and skew <= 0:
        return alpha
    rng, looks = np.random.default_rng(CALIBRATION_SEED), range(first, max(first, max_pairs) + 1)
    width = max(first, max_pairs)
    smallest = np.concatenate([smallest_p_values(null_draws(rng, (min(CHUNK, paths - done), width), skew), looks)
                               for done in range(0, paths, CHUNK)])
    return float(np.quantile(smallest, safe_quantile(alpha, paths), method="inverted_cdf"))
