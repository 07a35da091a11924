"""Loss against cost (training FLOPs or GPU-seconds) curves of one seed: where such a curve reaches
a loss, and power laws across model sizes, for the multipliers of `k3lab.report.compute_multipliers`.

A seed's curve is its baseline's trials at several budgets, (cost, loss) points. Between them
the curve is read by a monotone cubic (PCHIP) in log cost against log loss: it passes through
every point (a variant that ends where the baseline does is worth exactly 1x) and, with three
or more points, follows the curve's bend, where straight pieces in log-log (power laws between
neighbours) are biased by it (an irreducible loss bends loss-compute curves at small budgets).
A loss the points do not bracket is not extrapolated: it is reported as beyond the curve's end.
"""

from __future__ import annotations

import math

import numpy as np
from scipy import interpolate
from scipy import stats as scipy_stats

ABOVE, BELOW = "above", "below"  # a loss the curve does not reach: lower than at its largest cost, or higher


def curve_reach(points: list[tuple[float, float]], loss: float, cubic: bool = True) -> tuple[float | None, str | None]:
    """(the cost at which the curve through (cost, loss) points reaches `loss`, None), or (None,
    ABOVE) where reaching it would take more than the largest cost, (None, BELOW) less than the
    smallest; (None, None) under two points or where the loss does not fall from point to point.
    cubic False: straight pieces in log-log (a power law between neighbours), for comparison."""
    points = sorted(points)
    x = np.log([c for c, _ in points])
    y = np.log([v for _, v in points])
    if len(points) < 2 or np.any(np.diff(y) >= 0):
        return None, None
    target = math.log(loss)
    if target < y[-1] - 1e-12:
        return None, ABOVE
    if target > y[0] + 1e-12:
        return None, BELOW
    if not cubic:
        return float(math.exp(np.interp(target, y[::-1], x[::-1]))), None
    cost_of = interpolate.PchipInterpolator(y[::-1], x[::-1])  # log cost as a function of log loss, rising
    return float(math.exp(min(x[-1], max(x[0], float(cost_of(target)))))), None


def power_law(points: list[tuple[float, float]]) -> tuple[float, float] | None:
    """(a, alpha) of log L = a - alpha log C fitted to (compute, loss) points; None under two
    points of different compute, or where the loss does not fall with compute (alpha <= 0)."""
    if len({c for c, _ in points}) < 2:
        return None
    fit = scipy_stats.linregress(np.log([c for c, _ in points]), np.log([loss for _, loss in points]))
    return (float(fit.intercept), -float(fit.slope)) if fit.slope < 0 else None


def compute_at(fit: tuple[float, float], loss: float) -> float:
    """The compute at which the fitted curve reaches `loss`."""
    a, alpha = fit
    return math.exp((a - math.log(loss)) / alpha)
