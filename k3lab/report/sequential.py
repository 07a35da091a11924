"""Anytime-valid, family-wise comparisons of K variants against their baselines, paired by seed.

With a fixed list of seeds, `k3lab.report.stats` gives each
comparison a 95% Student t-interval. That interval is only valid when the number of seeds is
fixed before the data is seen. A sweep with `seeds: {start, max, until: {halfwidth}}` looks at
the paired differences after every new seed pair and decides whether to go on; re-checking a
t-interval after every pair and stopping once it is narrow enough under-covers (the stopping
rule prefers the moments where the sample spread happens to be small; see
tests/test_sequential.py, which measures it). So these comparisons use a *confidence sequence*:
intervals CS_n, one per number of pairs n, with

    P(mu lies in CS_n for every n = 1, 2, ... at once) >= 1 - alpha,

which stays valid at any stopping time, however it depends on the data.

Which confidence sequence, and why
----------------------------------
Lai's (1976) t-mixture confidence sequence for the mean of i.i.d. Gaussian observations with
unknown variance (a Robbins normal mixture on the *standardised* effect; Wang & Ramdas 2023,
"Anytime-valid t-tests and confidence sequences for Gaussian means with unknown variance",
arXiv 2310.03722). For a candidate mean m, with y_i = d_i - m, S = sum y_i, V = sum y_i^2:

    M_n(m) = sqrt(c / (c + n)) * (V / (V - S^2 / (n + c)))^(n / 2)

is the likelihood ratio of the scale-invariant part of the data for a N(0, 1/c) prior on the
standardised effect (m' - m) / sigma, integrated over sigma with the scale-invariant measure
d sigma / sigma. It is a nonnegative martingale with M_1 = 1 when m is the true mean, so by
Ville's inequality P(sup_n M_n(mu) >= 1/alpha) <= alpha, and

    CS_n = {m : M_n(m) < 1/alpha} = mean_n +- sqrt(q (n + c) SS_n / (n (n - q (n + c)))),
    q = 1 - (sqrt((c + n) / c) / alpha)^(-2 / n),   SS_n = sum (d_i - mean_n)^2,

unbounded while n <= q (n + c) (at 2 pairs, for any useful c). Why this one:
- the spread of the paired differences is unknown before the sweep (that is the whole
  problem) and there is no natural bound on a loss difference, which rules out the
  known-variance normal mixture and the bounded-data ones (empirical Bernstein, betting CSs:
  with a loose bound on |d| they are far wider at the 3-16 pairs a sweep has);
- it is exact for Gaussian differences at every n, closed form and vectorised (a simulation
  of 1,000 sweeps takes milliseconds), scale-invariant (no units to choose), symmetric
  around the mean, and tends to the t-interval's shape as n grows;
- paired differences of final losses over seeds are close to Gaussian (sums of many small
  effects); heavy tails would make it, like the t-interval, optimistic.
Its price against a fixed-n t-interval: about 1.6x wider at 10 pairs for alpha = 0.05 / 4
(1.57 vs 0.98 standard deviations of the differences). A two-stage design (Stein 1945:
the first stage estimates the spread, plans the number of seeds, and the final interval uses
the first stage's t quantile) is narrower but cannot stop a comparison early or extend one
that turned out noisier; the confidence sequence can do both.

The mixture precision c is fixed by the plan, never by the data: `mixture_precision(n, alpha)`
picks the c whose interval is narrowest at n = ceil((start + max) / 2) pairs of the seeds
policy, for the per-comparison alpha (tuned at `max` alone, the interval would stay unbounded
up to 5 pairs at alpha = 0.05 / 4, and be 11% wider at 8 pairs for 4% less width at 16).

Family-wise control
-------------------
K comparisons (every variant against the baseline of its group) share the error budget by
Bonferroni: each confidence sequence is run at alpha / K, so all K intervals hold at once, at
every n, with probability >= 1 - alpha, whatever the dependence between them (they share the
baseline's trials). Verdicts come from those intervals: "better" / "worse" when the interval
excludes 0, else "not resolved"; the chance that any comparison with a true difference of 0 is
called better or worse is then <= alpha. (Holm's step-down on anytime-valid p-values would also
be valid and can call more verdicts, but gives no intervals, and the stopping rule needs
interval widths.) Tables say "family-wise 95% confidence sequence (Bonferroni over K)".

Everything here works on plain data: {variant: {seed: value or None}} as in the t-interval
module, and numpy arrays for simulations.
"""

from __future__ import annotations

import functools
import math
import statistics

import attrs
import numpy as np

from k3lab.report.stats import BETTER, NOT_RESOLVED, WORSE, Comparison, SeedValues, paired_seeds, verdict

METHOD = "confidence sequence"  # Lai's t-mixture, Bonferroni over the family
CONFIDENCE = 0.95
PRECISE, MAX_SEEDS, BUDGET, RUNNING, STOPPED = "precise", "max seeds", "budget", "running", "stopped"

__all__ = ["BETTER", "WORSE", "NOT_RESOLVED", "Design", "SequentialComparison", "cs_half_width",
           "mixture_precision", "compare_sequential", "compare_family", "naive_t_half_width"]


def cs_half_width(n, ss, alpha: float, c: float):
    """Half-width of Lai's t-mixture confidence sequence (module docstring) after `n` pairs
    whose squared deviations from their mean sum to `ss`; inf where it is unbounded.
    Vectorised: n and ss may be numpy arrays of one shape (n >= 1)."""
    n = np.asarray(n, dtype=float)
    ss = np.asarray(ss, dtype=float)
    bound = np.sqrt((c + n) / c) / alpha
    q = 1.0 - bound ** (-2.0 / n)
    room = n - q * (n + c)
    with np.errstate(divide="ignore", invalid="ignore"):
        half = np.sqrt(q * (n + c) * np.maximum(ss, 0.0) / (n * np.where(room > 0, room, 1.0)))
    half = np.where(room > 0, half, np.inf)
    return half if half.ndim else float(half)


@functools.lru_cache(maxsize=256)
def mixture_precision(n: int, alpha: float) -> float:
    """The mixture precision c whose confidence sequence is narrowest at `n` pairs (for a unit
    sample variance), on a fine logarithmic grid: a function of the plan alone."""
    grid = np.exp(np.linspace(math.log(1e-3), math.log(1e2), 2001))
    widths = cs_half_width(np.full_like(grid, max(n, 3)), np.full_like(grid, max(n, 3) - 1.0), alpha, grid)
    return float(grid[int(np.argmin(widths))])


def naive_t_half_width(n, ss, alpha: float):
    """The fixed-n Student t half-width at level 1 - alpha (vectorised; needs scipy): what
    re-checking a t-interval after every pair would use. For the tests' comparison only."""
    from scipy import stats as scipy_stats

    n = np.asarray(n, dtype=float)
    df = np.maximum(n - 1, 1)
    half = scipy_stats.t.ppf(1 - alpha / 2, df) * np.sqrt(np.asarray(ss) / df / n)
    return np.where(n >= 2, half, np.inf)


@attrs.frozen
class Design:
    """How the comparisons of one sweep are made: `comparisons` (K) share `confidence`
    (family-wise) by Bonferroni; the policy's `start` and `max_pairs` (max seeds) fix the
    mixture precision; `halfwidth` is the relative precision asked (None: none asked)."""

    comparisons: int
    max_pairs: int
    start: int = 3
    confidence: float = CONFIDENCE
    halfwidth: float | None = None

    @property
    def alpha(self) -> float:
        """The error rate of each comparison: (1 - confidence) / K."""
        return (1 - self.confidence) / max(1, self.comparisons)

    @property
    def precision(self) -> float:
        return mixture_precision(math.ceil((self.start + self.max_pairs) / 2), self.alpha)

    def half_width(self, diffs: list[float]) -> float:
        """The half-width of the confidence sequence after these paired differences (inf: unbounded)."""
        n = len(diffs)
        if n < 2:
            return math.inf
        mean = math.fsum(diffs) / n
        return cs_half_width(n, math.fsum((d - mean) ** 2 for d in diffs), self.alpha, self.precision)

    @property
    def label(self) -> str:
        """What the tables say about the intervals."""
        return (f"family-wise {100 * self.confidence:g}% confidence sequence (Lai's t-mixture, "
                f"Bonferroni over {self.comparisons} comparison{'s' if self.comparisons != 1 else ''}), "
                "valid however many seeds were added after looking")


NEEDED_CAP = 200  # beyond this many pairs the answer is a different design (longer trials, a calmer metric)


def pairs_needed(sd: float, reference: float, design: Design, have: int) -> int | None:
    """About how many pairs the asked relative half-width would take if the paired differences
    kept the spread `sd` seen so far: the smallest n > have (the `have` pairs were not enough)
    whose confidence sequence (its precision planned as for `max: n`) is that narrow; None above
    NEEDED_CAP. A planning figure for the next sweep (the spread is itself uncertain at few
    pairs), never part of a verdict."""
    target = design.halfwidth * abs(reference)
    for n in range(max(have + 1, 2), NEEDED_CAP + 1):
        precision = mixture_precision(math.ceil((design.start + n) / 2), design.alpha)
        if cs_half_width(n, (n - 1) * sd ** 2, design.alpha, precision) <= target:
            return n
    return None


@attrs.frozen
class SequentialComparison(Comparison):
    """A `Comparison` whose interval is the family-wise confidence sequence, with the relative
    half-width and why the comparison stopped gaining seeds."""

    method: str = METHOD
    confidence: float = CONFIDENCE  # family-wise
    family: int = 1  # K
    relative_half_width: float | None = None  # half-width / |baseline mean|
    stopping: str = ""  # precise, max seeds, budget, stopped, running
    pairs_needed: int | None = None  # for the asked half-width at the spread seen (`pairs_needed`)

    def to_json(self) -> dict:
        return super().to_json() | {"method": self.method, "confidence": self.confidence, "family": self.family,
                                    "relative_half_width": self.relative_half_width, "stopping": self.stopping,
                                    "pairs_needed": self.pairs_needed}


def compare_sequential(variant: str, values: SeedValues, baseline: str, baseline_values: SeedValues, mode: str,
                       design: Design, unfinished: str = RUNNING) -> SequentialComparison:
    """`variant` against `baseline`, paired by seed, with the design's confidence sequence.
    `unfinished`: why a comparison that is neither precise nor at max seeds has no more seeds:
    RUNNING (the sweep may still add some), BUDGET (it ended at its budget) or STOPPED (it was
    stopped before, and `--resume` would go on)."""
    seeds = paired_seeds(values, baseline_values)
    every_seed = len(values.keys() | baseline_values.keys())
    common = dict(method=METHOD, confidence=design.confidence, family=design.comparisons)
    if not seeds:
        return SequentialComparison(variant, baseline, 0, every_seed, None, None, None, NOT_RESOLVED, "no pairs",
                                    **common, stopping=unfinished)
    diffs = [values[s] - baseline_values[s] for s in seeds]
    mean = math.fsum(diffs) / len(diffs)
    baseline_mean = math.fsum(baseline_values[s] for s in seeds) / len(seeds)
    half = design.half_width(diffs)
    relative = half / abs(baseline_mean) if baseline_mean and math.isfinite(half) else None
    stopping = stopping_reason(relative, len(seeds), design, unfinished)
    if design.halfwidth is not None and stopping != PRECISE and len(diffs) >= 2:
        common["pairs_needed"] = pairs_needed(statistics.stdev(diffs), baseline_mean, design, len(diffs))
    if not math.isfinite(half):
        return SequentialComparison(variant, baseline, len(seeds), every_seed, mean, None, baseline_mean,
                                    NOT_RESOLVED, f"unbounded at {len(seeds)} pair{'s' if len(seeds) > 1 else ''}",
                                    **common, stopping=stopping)
    outcome = verdict(mean - half, mean + half, mode)
    reason = "interval covers 0" if outcome == NOT_RESOLVED else ""
    return SequentialComparison(variant, baseline, len(seeds), every_seed, mean, half, baseline_mean, outcome,
                                reason, **common, relative_half_width=relative, stopping=stopping)


def stopping_reason(relative: float | None, pairs: int, design: Design, unfinished: str) -> str:
    """precise (as narrow as asked), max seeds, or else `unfinished` (budget, stopped, running)."""
    if design.halfwidth is not None and relative is not None and relative <= design.halfwidth:
        return PRECISE
    if pairs >= design.max_pairs:
        return MAX_SEEDS
    return unfinished


def compare_family(values: dict[str, SeedValues], baselines: dict[str, str], mode: str, design: Design,
                   unfinished: str = BUDGET) -> list[SequentialComparison]:
    """Every variant that has a baseline (`baselines`: variant -> its group's baseline), in the
    order of `baselines`; `design.comparisons` should be len(baselines)."""
    return [compare_sequential(variant, values.get(variant, {}), baseline, values.get(baseline, {}), mode, design,
                               unfinished)
            for variant, baseline in baselines.items()]


def comparison_cells(c: Comparison) -> dict[str, str]:
    """The text of one row of a sequential table (the t-table's cells plus baseline, half-width
    relative to the baseline, stopping reason)."""
    from k3lab.report.stats import comparison_cells as t_cells

    cells = t_cells(c)
    relative = getattr(c, "relative_half_width", None)
    cells["baseline"] = c.baseline
    cells["halfwidth"] = "n/a" if relative is None else f"{100 * relative:.2f}%"
    cells["stopping"] = getattr(c, "stopping", "") or "-"
    cells["needed"] = needed_cell(c)
    return cells


def needed_cell(c: Comparison) -> str:
    """"-" once precise, n/a under two pairs, else ~N or >cap (tables without an asked precision
    leave the column out: `family.design_columns`)."""
    if getattr(c, "stopping", "") == PRECISE or c.pairs < 2:
        return "-" if c.pairs >= 2 else "n/a"
    needed = getattr(c, "pairs_needed", None)
    return f"~{needed}" if needed is not None else f">{NEEDED_CAP}"


def pairs_needed_line(comparisons: list[Comparison], max_seeds: int, parent_run_id: str) -> str | None:
    """A dry run's planning line from an earlier run's comparisons (`SequentialComparison`s built
    with the file's present design): the pairs its asked half-width takes at that run's spreads,
    against the file's `max`. None when no comparison had two pairs."""
    rows = [c for c in comparisons if c.pairs >= 2]
    if not rows:
        return None
    listed = ", ".join(f"{c.variant} precise ({c.pairs})" if c.stopping == PRECISE
                       else f"{c.variant} {needed_cell(c)} (ran {c.pairs})" for c in rows)
    return (f"earlier run in this store ({parent_run_id[:8]}): at the spread of its pairs, the asked half-width "
            f"takes about this many pairs: {listed}; this file allows up to {max_seeds} seeds")


SEQUENTIAL_COLUMNS = ("variant", "baseline", "pairs", "difference", "interval", "relative", "halfwidth", "verdict",
                      "stopping", "needed")


def sequential_headers(metric: str, design: Design) -> dict[str, str]:
    return {"variant": "variant", "baseline": "baseline", "pairs": "pairs", "difference": f"{metric} - baseline",
            "interval": f"family-wise {100 * design.confidence:g}% CS", "relative": "vs baseline",
            "halfwidth": "half-width", "verdict": "verdict", "stopping": "stopped by", "needed": "pairs for asked"}


def sequential_note(design: Design) -> str:
    asked = f"; asked: {100 * design.halfwidth:g}% of the baseline's metric" if design.halfwidth else ""
    needed = ("; pairs for asked: about how many pairs the asked half-width would take at the spread of the "
              "differences so far (a planning figure for the next sweep, not part of the verdict)"
              if design.halfwidth else "")
    return (f"pairs: seeds where both trials finished, of the seeds run; interval: {design.label}; half-width: "
            f"relative to the baseline's mean over the pairs{asked}; not resolved: the interval covers 0 (or is "
            "unbounded at so few pairs); stopped by: precise (as narrow as asked), max seeds, budget, stopped "
            f"(the sweep was stopped before its budget ended; `--resume` adds seeds), running{needed}")
