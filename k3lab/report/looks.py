"""A group-sequential design over a few looks, with alpha passed on and a shape check.

K comparisons (variant - baseline, paired by seed) are looked at only after `looks[j]` seeds
(e.g. 6, 7, 8, 10, 12, 16), not after every pair: a look at 4 pairs has 3 degrees of freedom and
cannot decide at the effects GPU sweeps show, yet it costs the others alpha; the looks are
close where most decisions fall (6 to 8 seeds), so a comparison just short at one look is
decided a seed later instead of two.

- **Spending.** Each comparison's test at level a spends a * f(n_j / n_max) by look j, with
  the Hwang-Shih-DeCani function f(t) = (1 - e^(-g t)) / (1 - e^(-g)) (g = 0: f(t) = t).
  The nominal two-sided p-value threshold of each look is found by simulating the t-tests'
  null paths (`spent_levels`): the share of paths first crossing at look j is what f spends
  there.
- **Alpha passed on** (Holm's procedure as a graph, Maurer & Bretz 2013, valid for
  group-sequential tests of each hypothesis): with m comparisons still open, each is tested
  at alpha / m; when one is decided better or worse, the others are tested again at the same
  look at alpha / (m - 1), and so on. An "equivalent" decision stops the comparison but keeps
  its alpha (its null of no difference was not rejected).
- **Shape.** The t-statistic's null law depends on the differences' shape. The base levels
  hold for shapes up to `COVERED`. The check pools the standardised residuals of every
  comparison (each comparison's differences less their mean, over their sd, up to its last
  look) and flags the sweep where their skewness exceeds `check`, with the skewness's sign. A
  skewed shape makes one tail of the t-statistic heavy, the one opposite its skew (a
  right-skewed sample mostly lacks its far right values: its mean sits low and its sd small):
  in a flagged sweep a call in that direction is tested at one-sided levels simulated for the
  `CONSERVATIVE` shapes' heavy tails (gamma of skew 2 and the two-mode shape: one run in five
  far off), a call the other way at half the base level.
- **The flag holds at every look.** A comparison whose first pairs hold none of a two-mode
  shape's far-off runs shows a tight, shifted sample that no test on its own pairs can tell from
  a real effect; the far-off runs show in the other comparisons, often only at later looks. So
  the check is made on every pair the sweep has, and once it flags, the heavy tail's level
  applies from the first look on: a call made earlier that does not pass it is reopened and its
  comparison runs on (`decide` repeats until the flag and the decisions agree;
  `SeedPlanner` reopens the comparison). The check's misses count in the simulated error
  (bench/looks_sweeps.py, docs/statistics.md). Where every comparison is decided at the
  first look, the check has only those pairs.

Arrays: differences d[sweep, comparison, seed] (NaN: no pair at that seed).
"""

from __future__ import annotations

import functools
import math

import attrs
import numpy as np
from scipy import stats

from k3lab.report.stats import t_quantile

LOOKS = (6, 7, 8, 10, 12, 16)
SPENDING = 2.0  # Hwang-Shih-DeCani g: front-loaded (O'Brien-Fleming-like is g = -4, Pocock-like g = 1)
BASE_SHAPE = ("gamma", 1.0)  # skewness either sign up to 1: the levels used while the check passes
COVERED = (BASE_SHAPE,)  # the shapes the base levels hold for
CONSERVATIVE = (("gamma", 2.0), ("two-mode", 1.2))  # after a flag: the heavy tails of these shapes
CHECK = 0.6  # |skewness| of the pooled standardised residuals above which the sweep is flagged
TWO_MODE_RATE = 0.2  # the two-mode shape: one run in five in a second mode
LEVEL_PATHS = 400_000
LEVEL_SEED = 20261207
LOWER, HIGHER, EQUIVALENT, OPEN = -1, 1, 2, 0  # decision codes (LOWER: the variant's metric is lower)


def spending(t: float, gamma: float) -> float:
    """Hwang-Shih-DeCani: the share of alpha spent by information fraction t."""
    return t if gamma == 0 else (1 - math.exp(-gamma * t)) / (1 - math.exp(-gamma))


def shape_draws(rng: np.random.Generator, size, kind: str, skew: float) -> np.ndarray:
    """Mean 0, sd 1 draws: `normal`, `gamma` of skewness `skew`, or `two-mode` (a share
    TWO_MODE_RATE of draws in a second Gaussian mode; skew sets how far apart, up to 1.5)."""
    if kind == "normal" or skew == 0:
        return rng.standard_normal(size)
    sign = math.copysign(1.0, skew)
    if kind == "gamma":
        k = (2.0 / abs(skew)) ** 2
        return sign * (rng.gamma(k, 1.0, size) - k) / math.sqrt(k)
    if kind == "two-mode":
        p = TWO_MODE_RATE
        within = math.sqrt((p * (1 - p) * (1 - 2 * p) / abs(skew)) ** (2 / 3) - p * (1 - p))
        x = (rng.random(size) < p) + within * rng.standard_normal(size)
        return sign * (x - p) / math.sqrt(within ** 2 + p * (1 - p))
    raise ValueError(f"unknown shape {kind!r}")


def look_statistics(d: np.ndarray, look: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(pairs, mean, sd) over the first `look` seeds of d[..., seed], NaN seeds left out."""
    x = d[..., :look]
    n = np.isfinite(x).sum(-1)
    mean = np.nansum(x, -1) / np.maximum(n, 1)
    squares = np.nansum((x - mean[..., None]) ** 2, -1)
    return n, mean, np.sqrt(squares / np.maximum(n - 1, 1))


def lower_p_values(n: np.ndarray, mean: np.ndarray, sd: np.ndarray) -> np.ndarray:
    """One-sided t-test p-values of mean < 0 (0.5 where fewer than 3 pairs); 1 - p: of mean > 0."""
    p = np.full(mean.shape, 0.5)
    for df in np.unique(n[n >= 3]) - 1:
        at = n == df + 1
        t = mean[at] / np.maximum(sd[at], 1e-300) * math.sqrt(df + 1)
        p[at] = stats.t.cdf(t, int(df))
    return p


def p_values(n: np.ndarray, mean: np.ndarray, sd: np.ndarray) -> np.ndarray:
    """Two-sided t-test p-values of mean = 0 (1 where fewer than 3 pairs): twice the smaller tail."""
    lower = lower_p_values(n, mean, sd)
    return np.where(n >= 3, 2 * np.minimum(lower, 1 - lower), 1.0)


@functools.lru_cache(maxsize=16)
def null_p_values(looks: tuple[int, ...], kind: str, skew: float, paths: int = LEVEL_PATHS) -> np.ndarray:
    """p[path, look] of null paths of this shape, both signs (half the paths each)."""
    z = shape_draws(np.random.default_rng(LEVEL_SEED), (paths // 2, looks[-1]), kind, skew)
    z = np.concatenate([z, -z])
    return np.stack([p_values(*look_statistics(z, look)) for look in looks], -1)


@functools.lru_cache(maxsize=16)
def heavy_tail_p_values(looks: tuple[int, ...], kind: str, skew: float, paths: int = LEVEL_PATHS) -> np.ndarray:
    """p[path, look]: one-sided p-values of the tail a right skew makes heavy (mean < 0), on null
    paths of this shape with its skew made positive."""
    z = shape_draws(np.random.default_rng(LEVEL_SEED), (paths, looks[-1]), kind, abs(skew))
    return np.stack([lower_p_values(*look_statistics(z, look)) for look in looks], -1)


def spent_levels(p: np.ndarray, looks: tuple[int, ...], alpha: float, gamma: float) -> tuple[float, ...]:
    """Per look, the p-value threshold at which the paths p[path, look] first cross at look j
    with probability alpha * (f(t_j) - f(t_{j-1})), f the spending function."""
    crossed, levels = np.zeros(len(p), bool), []
    for j, look in enumerate(looks):
        wanted = math.floor(alpha * spending(look / looks[-1], gamma) * len(p)) - int(crossed.sum())
        free = np.sort(p[~crossed, j])
        level = float(free[wanted - 1]) if wanted >= 1 else 0.0
        crossed |= p[:, j] <= level
        levels.append(level)
    return tuple(levels)


def smallest_levels(tables: list) -> tuple[tuple[float, ...], ...]:
    """levels[m][j]: the smallest of the tables' thresholds (tables[shape][m][j]): the strictest shape's."""
    return tuple(tuple(min(column) for column in zip(*rows)) for rows in zip(*tables))


def level_table(looks: tuple[int, ...], comparisons: int, alpha: float, gamma: float,
                shapes: tuple[tuple[str, float], ...], paths: int = LEVEL_PATHS) -> tuple[tuple[float, ...], ...]:
    """levels[m - 1][j]: the threshold at look j with m comparisons open (alpha / m each), the
    smallest over the shapes."""
    tables = [[spent_levels(null_p_values(looks, kind, skew, paths), looks, alpha / m, gamma)
               for m in range(1, comparisons + 1)] for kind, skew in shapes]
    return smallest_levels(tables)


def heavy_tail_table(looks: tuple[int, ...], comparisons: int, alpha: float, gamma: float,
                     shapes: tuple[tuple[str, float], ...], paths: int = LEVEL_PATHS) -> tuple[tuple[float, ...], ...]:
    """levels[m - 1][j]: the one-sided threshold of the heavy tail at look j with m open (alpha / 2m:
    the two tails of alpha / m each get half), the smallest over the shapes."""
    tables = [[spent_levels(heavy_tail_p_values(looks, kind, skew, paths), looks, alpha / (2 * m), gamma)
               for m in range(1, comparisons + 1)] for kind, skew in shapes]
    return smallest_levels(tables)


def pooled_skewness(d: np.ndarray, look: int) -> np.ndarray:
    """Per sweep, the skewness of the standardised residuals of d[sweep, comparison, seed] over
    the first `look` seeds, pooled over the comparisons with 3 pairs or more."""
    n, mean, sd = look_statistics(d, look)
    r = (d[..., :look] - mean[..., None]) / np.where(sd > 0, sd, np.inf)[..., None]
    r = np.where((n >= 3)[..., None] & np.isfinite(r), r, np.nan).reshape(len(d), -1)
    count = np.isfinite(r).sum(1)
    r = np.where(count[:, None] >= 6, r, 0.0)  # too few residuals: no evidence of a shape (skewness 0)
    centred = r - np.nanmean(r, 1, keepdims=True)
    second, third = np.nanmean(centred ** 2, 1), np.nanmean(centred ** 3, 1)
    return np.divide(third, second ** 1.5, out=np.zeros_like(third), where=second > 0)


@attrs.frozen
class LookDesign:
    """The looks, spending, shape check and levels of one sweep's K comparisons.

    levels[m - 1][j]: the two-sided p-value threshold at look j with m comparisons open;
    heavy_tail_levels[m - 1][j]: the one-sided threshold, after the shape check flags the sweep,
    of a call in the direction the skew makes likely (`calibrated` fills both; a sweep stores them
    with its design). margin: |difference| under margin x |the baseline's
    mean| does not matter (None: no equivalence decision)."""

    comparisons: int
    looks: tuple[int, ...] = attrs.field(default=LOOKS, converter=tuple)
    confidence: float = 0.95
    spending: float = SPENDING
    margin: float | None = None
    check: float = CHECK
    levels: tuple | None = attrs.field(default=None, eq=False)
    heavy_tail_levels: tuple | None = attrs.field(default=None, eq=False)

    @looks.validator
    def _looks(self, _attribute, looks) -> None:
        if not looks or looks[0] < 3 or list(looks) != sorted(set(looks)):
            raise ValueError(f"looks must rise from 3 pairs or more, got {list(looks)}")

    @property
    def alpha(self) -> float:
        return 1 - self.confidence

    def calibrated(self, paths: int = LEVEL_PATHS) -> "LookDesign":
        """This design with both level tables simulated (seeded: the same everywhere)."""
        table = functools.partial(level_table, self.looks, self.comparisons, self.alpha, self.spending, paths=paths)
        return attrs.evolve(self, levels=table(COVERED), heavy_tail_levels=heavy_tail_table(
            self.looks, self.comparisons, self.alpha, self.spending, CONSERVATIVE, paths))

    def skew_flag(self, d: np.ndarray, look: int) -> np.ndarray:
        """Per sweep of d[sweep, comparison, seed]: the sign of its pooled skewness where its first
        `look` seeds show more skew than the base levels cover, else 0."""
        skewness = pooled_skewness(d, look)
        return np.where(np.abs(skewness) > self.check, np.sign(skewness), 0.0)

    def tail_levels(self, look: int, open_count: np.ndarray, skew_sign: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Per sweep, the one-sided thresholds (lower call, higher call) at look index `look` with
        `open_count` open: half the base level, or the heavy tail's level for the call in the
        direction opposite a flagged skew."""
        index = np.clip(open_count, 1, self.comparisons) - 1
        half = np.asarray(self.levels)[:, look][index] / 2
        heavy = np.minimum(np.asarray(self.heavy_tail_levels)[:, look][index], half)
        return np.where(skew_sign > 0, heavy, half), np.where(skew_sign < 0, heavy, half)


@attrs.frozen
class Decisions:
    """What `decide` found, per sweep and comparison: code (LOWER, HIGHER, EQUIVALENT, OPEN),
    look (index into looks of the decision, or of the last look made; -1: none), level (twice the
    one-sided threshold of a call in the direction of the mean: the two-sided level of the
    interval shown), pairs, mean and half-width there; per sweep, the look index whose pairs
    first showed the flag (-1: never) and the sign of the skewness seen (0: none); a flag
    applies at every look."""

    code: np.ndarray
    look: np.ndarray
    level: np.ndarray
    pairs: np.ndarray
    mean: np.ndarray
    half: np.ndarray
    flagged_at: np.ndarray
    skew_sign: np.ndarray


def decide(d: np.ndarray, seeds_run: np.ndarray, design: LookDesign, reference: np.ndarray | None = None) -> Decisions:
    """Run the design on d[sweep, comparison, seed] (NaN: no pair), where comparison k of sweep
    s ran seeds_run[s, k] seeds; reference[s, k]: the baseline's mean (for the margin). A flag
    the check raises at any look holds from the first look on: the looks are made again with it
    until no new flag comes (each comparison's pairs after its decision left out of the check)."""
    held, held_at = np.zeros(d.shape[0]), np.full(d.shape[0], -1)
    for _ in design.looks:
        found = _run_looks(d, seeds_run, design, reference, held, held_at)
        if np.array_equal(found.skew_sign, held):
            return found
        held, held_at = found.skew_sign, found.flagged_at
    return found


def _run_looks(d: np.ndarray, seeds_run: np.ndarray, design: LookDesign, reference: np.ndarray | None,
               held: np.ndarray, held_at: np.ndarray) -> Decisions:
    """The looks in order, with the flag `held` (per sweep: a skew sign, 0: none; raised at look
    `held_at`) applied from the first."""
    shape = d.shape[:2]
    out = {name: np.zeros(shape, dtype) for name, dtype in
           (("code", int), ("level", float), ("pairs", int), ("mean", float), ("half", float))}
    out["look"], out["half"][:] = np.full(shape, -1), np.inf
    flagged_at, skew_sign = np.where(held != 0, held_at, -1), held.astype(float)
    seed = np.arange(d.shape[-1])
    for j, look in enumerate(design.looks):
        reached = (out["code"] == OPEN) & (seeds_run >= look)
        if not reached.any():
            break
        last = np.where(out["code"] == OPEN, look, np.asarray(design.looks)[np.maximum(out["look"], 0)])
        sign = design.skew_flag(np.where(seed < last[..., None], d, np.nan), look)
        newly = (flagged_at < 0) & (sign != 0)  # once flagged, it stays
        flagged_at[newly], skew_sign[newly] = j, sign[newly]
        n, mean, sd = look_statistics(d, look)
        _holm_at_look(design, j, reached, lower_p_values(n, mean, sd), mean, skew_sign, out)
        _record(out, reached, j, n, mean, sd)
        if design.margin is not None and reference is not None:
            half = out["half"]
            equivalent = reached & (out["code"] == OPEN) & (np.abs(mean) + half < design.margin * np.abs(reference))
            out["code"][equivalent] = EQUIVALENT
    return Decisions(**out, flagged_at=flagged_at, skew_sign=skew_sign)


def _holm_at_look(design: LookDesign, j: int, reached: np.ndarray, p_lower: np.ndarray, mean: np.ndarray,
                  skew_sign: np.ndarray, out: dict) -> None:
    """Holm at one look: test the open comparisons at alpha / (open count), each tail at its own
    one-sided threshold; repeat while one falls."""
    while True:
        lower, higher = design.tail_levels(j, (out["code"] == OPEN).sum(1), skew_sign)
        lower, higher = np.broadcast_to(lower[:, None], reached.shape), np.broadcast_to(higher[:, None], reached.shape)
        still = reached & (out["code"] == OPEN)
        out["level"][still] = 2 * np.where(mean < 0, lower, higher)[still]
        falls_lower, falls_higher = still & (p_lower <= lower), still & (1 - p_lower <= higher)
        if not (falls_lower | falls_higher).any():
            return
        out["code"][falls_lower], out["code"][falls_higher] = LOWER, HIGHER


def _record(out: dict, reached: np.ndarray, j: int, n: np.ndarray, mean: np.ndarray, sd: np.ndarray) -> None:
    """Keep the look's pairs, mean and half-width (at the level tested) of the comparisons looked at."""
    out["look"][reached], out["pairs"][reached], out["mean"][reached] = j, n[reached], mean[reached]
    for df in np.unique(n[reached & (n >= 3)]) - 1:
        at = reached & (n == df + 1)
        quantiles = np.array([t_quantile(1 - lv / 2, int(df)) if lv > 0 else math.inf for lv in out["level"][at]])
        out["half"][at] = quantiles * sd[at] / math.sqrt(df + 1)
