"""Family-wise decisions for K variants against their baselines, paired by seed.

A sweep with `seeds: {start, max, until: decided}` looks at each comparison's paired differences
after every new seed pair and stops adding seeds once the comparison is decided: **better** or
**worse** (its interval excludes 0) or **equivalent** (its interval lies inside +/- `margin` x
|the baseline's mean|, when `metric: {margin: ...}` is set). Re-checking a plain t-interval after
every pair would under-cover (the rule stops where the sample spread happens to be small), so the
intervals are *repeated confidence intervals* of a group-sequential design:

    at n pairs:  mean_n +- t_{n-1}(1 - a_nom / 2) * sd_n / sqrt(n)

with one nominal level a_nom for every look (Pocock's boundary, in t form), chosen so that

    P(the interval misses the true mean at some look n = start .. max) <= alpha / K

for paired differences of any location and spread whose shape is Gaussian or skewed up to the
design's `skew` (right or left: a variant that now and then trains badly against a steady
baseline). `k3lab.report.calibration` finds a_nom by simulating that null (seeded, so every
machine gets the same figure; the sweep stores it with its design). All K intervals then hold
at every look at once with probability >= 1 - alpha (Bonferroni over the family, whatever the
dependence through shared baselines), so any decision read off them, at any look the rule stops
at, keeps that error rate. Looks happen only at `start` pairs or more (`SeedPlanner` adds a seed
for a failed trial's pair before it looks); a comparison with fewer pairs than `start` is not
resolved. What this gives up: the guarantee is for looks up to `max`; a sweep extended past
`max` needs a new design (a confidence sequence holds forever, and is wider by as much at the
4-16 pairs a sweep has). docs/statistics.md says why this design, and what the simulation
measures.

With `looks` (`seeds: {looks: [6, 7, 8, 10, 12, 16]}`) the design is `k3lab.report.looks` instead: looks
only at those seed counts, alpha spent over them, passed on as comparisons are decided (Holm), a
shape check on the pooled residuals; `compare_family` decides such a family together.

A fixed list of n seeds (`fixed_design`) is a looks design of one look at n: Holm over the K
comparisons at p-value thresholds simulated for the shapes `k3lab.report.looks` covers, and the
heavy tail's for the call the skew makes likely where the shape check flags the table's own pairs
(under 3 seeds: one Student t-interval at alpha / K, as no threshold is simulated there).
`until: {halfwidth: h}` stops a comparison once its interval is at most h x |the baseline's mean|
instead; `until: max` runs every comparison to `max` seeds.

Everything here works on plain data: {variant: {seed: value or None}} and numpy arrays.
"""

from __future__ import annotations

import functools
import math
import statistics

import attrs
import numpy as np

from k3lab.report.calibration import SKEW_COVERED, nominal_level, smallest_p_values
from k3lab.report.looks import CHECK, HIGHER, LOWER, LookDesign, decide
from k3lab.report.looks import EQUIVALENT as LOOKS_EQUIVALENT
from k3lab.report.stats import BETTER, NOT_RESOLVED, WORSE, Comparison, SeedValues, paired_seeds, t_quantile
from k3lab.report.stop_rule import BUDGET, DECIDED, FIXED, HALFWIDTH, MAX, MAX_SEEDS, PRECISE, RUNNING

EQUIVALENT = "equivalent"
CONFIDENCE = 0.95
PLANNING_PATHS = 10_000  # a planning figure needs the level only roughly
PLANNING_HORIZONS = (24, 32, 48, 64, 96, 128, 200)
NEEDED_CAP = PLANNING_HORIZONS[-1]  # beyond this many pairs the answer is another design (longer trials)

__all__ = ["BETTER", "WORSE", "EQUIVALENT", "NOT_RESOLVED", "Design", "SequentialComparison", "nominal_level",
           "smallest_p_values", "compare_sequential", "compare_family", "fixed_design", "pairs_needed"]


# -- the design -----------------------------------------------------------------------------------


def _nested_tuple(value):
    """Level tables as tuples of tuples (a stored design comes back with lists)."""
    return None if value is None else tuple(tuple(row) for row in value)


@attrs.frozen
class Design:
    """How the K comparisons of one sweep are made and when each stops gaining seeds.

    rule: decided (until better, worse or equivalent), halfwidth (until the interval is at most
    `halfwidth` x |the baseline's mean|), max (every comparison to max seeds), fixed (a list of
    seeds: one look). margin: differences within +/- margin x |the baseline's mean| do not matter
    (None: no equivalence verdict). level: the nominal level of each look (None: `nominal_level`).
    skew: the skewness of the paired differences up to which the level holds the error (0: the
    Gaussian calibration of designs stored before skew was covered)."""

    comparisons: int
    max_pairs: int
    start: int = 3
    confidence: float = CONFIDENCE
    halfwidth: float | None = None
    rule: str = attrs.field()
    margin: float | None = None
    level: float | None = None
    skew: float = SKEW_COVERED
    looks: tuple[int, ...] | None = attrs.field(default=None, converter=lambda v: None if v is None else tuple(v))
    levels: tuple | None = attrs.field(default=None, eq=False, converter=_nested_tuple)
    heavy_tail_levels: tuple | None = attrs.field(default=None, eq=False, converter=_nested_tuple)

    @rule.default
    def _rule(self) -> str:
        return HALFWIDTH if self.halfwidth is not None else DECIDED

    @property
    def alpha(self) -> float:
        """The error rate of each comparison: (1 - confidence) / K."""
        return round((1 - self.confidence) / max(1, self.comparisons), 12)  # one cache key per design

    @property
    def look_design(self) -> LookDesign | None:
        """The looks design (`k3lab.report.looks`) this design is, or None: a look at every pair."""
        if self.looks is None:
            return None
        return LookDesign(self.comparisons, self.looks, self.confidence, margin=self.margin,
                          levels=self.levels, heavy_tail_levels=self.heavy_tail_levels)

    @property
    def nominal(self) -> float:
        """The two-sided level of each look's t-interval (a looks design: its last look's, with
        every comparison open, before the shape check flags)."""
        if self.looks is not None:
            return self.looks_level(self.max_pairs)
        if self.level is not None:
            return self.level
        if self.rule == FIXED:
            return self.alpha
        return nominal_level(self.start, self.max_pairs, self.alpha, skew=self.skew)

    def calibrated(self) -> "Design":
        """This design with its nominal level (a looks design: its level tables) computed, as a
        sweep stores it."""
        if self.looks is not None:
            if self.levels is not None and self.heavy_tail_levels is not None:
                return self  # a design stored before the heavy tail's levels is calibrated again
            looks = LookDesign(self.comparisons, self.looks, self.confidence, margin=self.margin).calibrated()
            return attrs.evolve(self, levels=looks.levels, heavy_tail_levels=looks.heavy_tail_levels)
        return attrs.evolve(self, level=self.nominal)

    def looks_level(self, pairs: int) -> float:
        """A looks design's threshold at its last look up to `pairs`, all K open, unflagged (0 before
        its first look; a fixed list: its one look at any pairs from 3): the level of the pointwise
        intervals drawn along the curve."""
        made = [j for j, look in enumerate(self.looks) if look <= pairs or self.rule == FIXED]
        if pairs < self.first_look:
            return 0.0
        return self.calibrated().levels[self.comparisons - 1][made[-1]] if made else 0.0

    @property
    def first_look(self) -> int:
        """The fewest pairs the design looks at: `start` (its level covers looks start .. max), or
        two for one look (a fixed list of seeds, some of whose trials may have failed)."""
        if self.rule == FIXED:
            return 2 if self.looks is None else 3  # one look: a failed trial's seed leaves the others
        if self.looks is not None:
            return self.looks[0]
        return max(2, self.start)

    def half_width(self, diffs: list[float]) -> float:
        """The half-width of the interval after these paired differences (inf under `first_look`
        pairs: a look the level does not cover)."""
        n = len(diffs)
        if n < self.first_look:
            return math.inf
        mean = math.fsum(diffs) / n
        return self.half_width_at(n, math.sqrt(math.fsum((d - mean) ** 2 for d in diffs) / (n - 1)))

    def half_width_at(self, pairs: int, sd: float) -> float:
        """The half-width after `pairs` differences of standard deviation `sd` (inf under `first_look`)."""
        if pairs < self.first_look:
            return math.inf
        level = self.looks_level(pairs) if self.looks is not None else self.nominal
        return t_quantile(1 - level / 2, pairs - 1) * sd / math.sqrt(pairs)

    def verdict(self, mean: float, half: float, reference: float, mode: str) -> str:
        """better / worse (the interval excludes 0), equivalent (inside the margin), not resolved."""
        if not math.isfinite(half):
            return NOT_RESOLVED
        if mean - half > 0 or mean + half < 0:
            return BETTER if (mean + half < 0) == (mode == "min") else WORSE
        if self.margin is not None and abs(mean) + half < self.margin * abs(reference):
            return EQUIVALENT
        return NOT_RESOLVED

    def settled(self, diffs: list[float], reference: float) -> bool:
        """Whether a comparison with these differences needs no more seeds under the rule."""
        half = self.half_width(diffs)
        if self.rule == HALFWIDTH:
            return reference != 0 and half <= self.halfwidth * abs(reference)
        if self.rule == DECIDED:
            return bool(diffs) and self.verdict(math.fsum(diffs) / len(diffs), half, reference, "min") != NOT_RESOLVED
        return False

    @property
    def interval_name(self) -> str:
        """What the plots and tables call the interval drawn."""
        if self.rule == FIXED and self.looks is not None:
            return f"{100 * self.confidence:g}% t-interval at the level its comparison was tested at (one look, Holm)"
        if self.looks is not None:
            return f"{100 * self.confidence:g}% t-interval at the level of its last look (looks {self.looks_text})"
        if self.rule == FIXED:
            return f"family-wise {100 * self.confidence:g}% t-interval (Bonferroni over {self.comparisons})"
        return f"family-wise {100 * self.confidence:g}% repeated t-interval ({self.start}-{self.max_pairs} pairs)"

    @property
    def label(self) -> str:
        """What the tables say about the intervals."""
        s = "s" if self.comparisons != 1 else ""
        if self.rule == FIXED and self.looks is not None:
            return one_look_label(self)
        if self.looks is not None:
            return looks_label(self)
        if self.rule == FIXED:
            return (f"family-wise {100 * self.confidence:g}% Student t-intervals (Bonferroni over {self.comparisons} "
                    f"comparison{s}: each at {100 * self.alpha:.3g}%)")
        return (f"family-wise {100 * self.confidence:g}% repeated t-intervals of a group-sequential design (Pocock's "
                f"boundary: every look from {self.start} to {self.max_pairs} pairs at a nominal "
                f"{100 * self.nominal:.3g}%, Bonferroni over {self.comparisons} comparison{s}{self.skew_text}), "
                "valid at whichever look the rule stopped")

    @property
    def skew_text(self) -> str:
        """What shapes of differences the level holds for, for the label."""
        return f"; calibrated for paired differences skewed up to {self.skew:g}" if self.skew > 0 else (
            "; calibrated for Gaussian differences")

    @property
    def rule_text(self) -> str:
        """The stopping rule in words, for the plan and the report."""
        if self.rule == FIXED:
            return "a fixed list of seeds"
        if self.rule == HALFWIDTH:
            return f"until each interval is at most {100 * self.halfwidth:g}% of the baseline's metric"
        if self.rule == MAX:
            return f"every comparison to {self.max_pairs} seeds"
        if self.margin is None:
            return "until each comparison is decided: better or worse"
        return (f"until each comparison is decided: better, worse or equivalent (within +/-{100 * self.margin:g}% "
                "of the baseline's metric)")

    @property
    def looks_text(self) -> str:
        return ", ".join(map(str, self.looks or ()))

    def to_json(self) -> dict:
        design = self.calibrated() if self.looks is not None else self
        return attrs.asdict(design) | {"level": self.nominal, "alpha": self.alpha}

    @classmethod
    def from_json(cls, data: dict) -> "Design":
        """A stored design; a fixed list stored before its one look was shape-calibrated gets that look."""
        names = {field.name for field in attrs.fields(cls)}
        design = cls(**{"skew": 0.0} | {key: value for key, value in data.items() if key in names})  # no skew: Gaussian
        if design.rule == FIXED and design.looks is None:
            return fixed_design(design.comparisons, design.max_pairs, design.confidence, design.margin)
        return design


def looks_label(design: Design) -> str:
    """What the tables say about a looks design's intervals."""
    return (f"{100 * design.confidence:g}% family-wise decisions of a group-sequential design: looks after "
            f"{design.looks_text} seeds, Hwang-Shih-DeCani spending, Holm's alpha passed on as comparisons are "
            f"decided (Maurer-Bretz), levels for paired differences skewed up to 1 either way; once the pooled "
            f"residuals' skewness (all the sweep's pairs) passes {CHECK:g}, a call in the direction opposite the skew "
            "at one-sided levels for skewness 2 or one run in five far off, at every look; each interval is the "
            "t-interval at the level its comparison was last tested at in the direction of its mean, at its last look")


def one_look_label(design: Design) -> str:
    """What the tables say about a fixed list's intervals (one look, Holm, shape-calibrated)."""
    s = "s" if design.comparisons != 1 else ""
    return (f"{100 * design.confidence:g}% family-wise decisions of one look at {design.looks_text} seeds: Holm over "
            f"{design.comparisons} comparison{s} (the first at {100 * design.nominal:.3g}%), levels for paired "
            f"differences skewed up to 1 either way; once the pooled residuals' skewness passes {CHECK:g}, a call in "
            "the direction opposite the skew at one-sided levels for skewness 2 or one run in five far off; each "
            "interval is the t-interval at the level its comparison was tested at in the direction of its mean")


def fixed_design(comparisons: int, seeds: int, confidence: float = CONFIDENCE, margin: float | None = None) -> Design:
    """The design of a fixed list of `seeds` seeds: a looks design of one look at `seeds` (Holm over
    the comparisons at levels simulated for the covered shapes, `k3lab.report.looks.level_table`);
    under 3 seeds, where no level is simulated, one Student t-interval at alpha / K."""
    if seeds < 3:
        return Design(comparisons=comparisons, max_pairs=seeds, start=seeds, confidence=confidence, rule=FIXED,
                      margin=margin, skew=0.0)
    levels, heavy_tail = one_look_levels(comparisons, seeds, confidence)
    return Design(comparisons=comparisons, max_pairs=seeds, start=seeds, confidence=confidence, rule=FIXED,
                  margin=margin, skew=0.0, looks=(seeds,), levels=levels, heavy_tail_levels=heavy_tail)


@functools.lru_cache(maxsize=64)
def one_look_levels(comparisons: int, seeds: int, confidence: float) -> tuple[tuple, tuple]:
    """(levels, heavy tail's levels)[m - 1][0] of one look at `seeds` pairs with m open
    (`LookDesign.calibrated`; cached: every table of a report asks for the same)."""
    design = LookDesign(comparisons, (seeds,), confidence).calibrated()
    return design.levels, design.heavy_tail_levels


# -- planning ------------------------------------------------------------------------------------


def planning_level(design: Design, n: int) -> float:
    """The nominal level of a design like this one with `max: n`: its own level up to its max, else
    that of the next horizon on a coarse grid (a little wider than exact: planning needs it roughly,
    and each horizon costs a simulation)."""
    if n <= design.max_pairs:
        return design.nominal
    horizon = next(h for h in PLANNING_HORIZONS if h >= n)
    return nominal_level(design.start, horizon, design.alpha, PLANNING_PATHS, skew=design.skew)


def pairs_needed(sd: float, reference: float, design: Design, have: int, mean: float = 0.0) -> int | None:
    """About how many pairs the rule would take if the paired differences kept the mean `mean` and
    spread `sd` seen so far: the smallest n > have (those were not enough) at which a design like
    this one with `max: n` stops (halfwidth: narrow enough; decided: better, worse or
    equivalent); None above NEEDED_CAP. A planning figure for the next sweep, never a verdict."""
    if design.rule not in (HALFWIDTH, DECIDED) or not math.isfinite(sd):
        return None
    if design.looks is not None:  # the first later look whose level (all K open, unflagged) would decide
        levels = design.calibrated().levels[design.comparisons - 1]
        return next((n for n, level in zip(design.looks, levels) if n > have and design.verdict(
            mean, t_quantile(1 - level / 2, n - 1) * sd / math.sqrt(n), reference, "min") != NOT_RESOLVED), None)

    def enough(n: int) -> bool:
        half = t_quantile(1 - planning_level(design, n) / 2, n - 1) * sd / math.sqrt(n)
        if design.rule == HALFWIDTH:
            return half <= design.halfwidth * abs(reference)
        return design.verdict(mean, half, reference, "min") != NOT_RESOLVED

    low, high = max(have + 1, design.first_look), NEEDED_CAP
    if not enough(high):
        return None
    while low < high:  # the half-width shrinks with n, so "enough" holds from some n on
        middle = (low + high) // 2
        low, high = (middle + 1, high) if not enough(middle) else (low, middle)
    return low


# -- comparisons ---------------------------------------------------------------------------------


@attrs.frozen
class SequentialComparison(Comparison):
    """A `Comparison` under a design: its family-wise interval, the half-width relative to the
    baseline, why the comparison stopped gaining seeds and, where not stopped by its rule, about
    how many pairs the rule would take."""

    method: str = ""
    confidence: float = CONFIDENCE  # family-wise
    family: int = 1  # K
    relative_half_width: float | None = None  # half-width / |baseline mean|
    stopping: str = ""  # decided, precise, max seeds, budget, stopped, running
    pairs_needed: int | None = None

    def to_json(self) -> dict:
        return super().to_json() | {"method": self.method, "confidence": self.confidence, "family": self.family,
                                    "relative_half_width": self.relative_half_width, "stopping": self.stopping,
                                    "pairs_needed": self.pairs_needed}


def compare_sequential(variant: str, values: SeedValues, baseline: str, baseline_values: SeedValues, mode: str,
                       design: Design, unfinished: str = RUNNING) -> SequentialComparison:
    """`variant` against `baseline`, paired by seed, with the design's interval. `unfinished`: why
    a comparison its rule did not stop, short of max seeds, has no more seeds: RUNNING (the sweep
    may still add some), BUDGET (it ended at its budget) or STOPPED (`--resume` would go on)."""
    seeds = paired_seeds(values, baseline_values)
    every_seed = len(values.keys() | baseline_values.keys())
    common = dict(method=design.rule, confidence=design.confidence, family=design.comparisons)
    if not seeds:
        return SequentialComparison(variant, baseline, 0, every_seed, None, None, None, NOT_RESOLVED, "no pairs",
                                    **common, stopping=unfinished)
    diffs = [values[s] - baseline_values[s] for s in seeds]
    mean = math.fsum(diffs) / len(diffs)
    baseline_mean = math.fsum(baseline_values[s] for s in seeds) / len(seeds)
    half = design.half_width(diffs)
    relative = half / abs(baseline_mean) if baseline_mean and math.isfinite(half) else None
    stopping = stopping_reason(design, diffs, baseline_mean, unfinished)
    if stopping not in (DECIDED, PRECISE) and len(diffs) >= 2:
        common["pairs_needed"] = pairs_needed(statistics.stdev(diffs), baseline_mean, design, len(diffs), mean)
    if not math.isfinite(half):
        reason = "one pair" if len(seeds) < 2 else f"{len(seeds)} pairs: the design looks from {design.first_look}"
        return SequentialComparison(variant, baseline, len(seeds), every_seed, mean, None, baseline_mean,
                                    NOT_RESOLVED, reason, **common, stopping=stopping)
    outcome = design.verdict(mean, half, baseline_mean, mode)
    reason = "interval covers 0" if outcome == NOT_RESOLVED else ""
    return SequentialComparison(variant, baseline, len(seeds), every_seed, mean, half, baseline_mean, outcome,
                                reason, **common, relative_half_width=relative, stopping=stopping)


def stopping_reason(design: Design, diffs: list[float], reference: float, unfinished: str) -> str:
    """decided / precise (the rule stopped it), max seeds, or else `unfinished`."""
    if design.rule != FIXED and design.settled(diffs, reference):
        return PRECISE if design.rule == HALFWIDTH else DECIDED
    if len(diffs) >= design.max_pairs:
        return MAX_SEEDS
    return unfinished


def compare_family(values: dict[str, SeedValues], baselines: dict[str, str], mode: str, design: Design,
                   unfinished: str = BUDGET) -> list[SequentialComparison]:
    """Every variant that has a baseline (`baselines`: variant -> its group's baseline), in the
    order of `baselines`; `design.comparisons` should be len(baselines)."""
    if design.looks is not None:
        return compare_looks(values, baselines, mode, design.calibrated(), unfinished)
    return [compare_sequential(variant, values.get(variant, {}), baseline, values.get(baseline, {}), mode, design,
                               unfinished)
            for variant, baseline in baselines.items()]


def looks_matrix(values: dict[str, SeedValues], baselines: dict[str, str]) -> tuple[np.ndarray, np.ndarray,
                                                                                      np.ndarray]:
    """(d[1, comparison, seed] with NaN where no pair, seeds run [1, comparison], the baselines'
    means [1, comparison]) over the seeds any trial ran, in order."""
    seeds = sorted({seed for by_seed in values.values() for seed in by_seed})
    d = np.full((1, len(baselines), max(1, len(seeds))), np.nan)
    run, reference = np.zeros((1, len(baselines)), int), np.zeros((1, len(baselines)))
    for i, (variant, baseline) in enumerate(baselines.items()):
        mine, theirs = values.get(variant, {}), values.get(baseline, {})
        run[0, i] = len(mine.keys() & theirs.keys())
        paired = paired_seeds(mine, theirs)
        reference[0, i] = math.fsum(theirs[s] for s in paired) / len(paired) if paired else 0.0
        for j, seed in enumerate(seeds):
            if seed in paired:
                d[0, i, j] = mine[seed] - theirs[seed]
    return d, run, reference


def too_few_text(design: Design, run: int, pairs: int) -> str:
    """Why a comparison has no verdict yet: a list's one look needs more pairs than finished, a
    sequential design has not run its first look's seeds."""
    if design.rule == FIXED:
        return "one pair" if pairs < 2 else f"{pairs} pairs: the one look needs {design.first_look}"
    return f"{run} seeds: the design looks from {design.first_look}"


def before_first_look(variant: str, baseline: str, diffs: np.ndarray, reference: float, run: int, every_seed: int,
                      design: Design, common: dict, unfinished: str) -> SequentialComparison:
    """A comparison of a looks design that has not reached its first look: its mean so far, no
    interval, and the first look that would decide at its spread so far."""
    diffs = diffs[np.isfinite(diffs)]
    mean = float(diffs.mean()) if diffs.size else None
    if diffs.size >= 2:
        common = common | {"pairs_needed": pairs_needed(float(diffs.std(ddof=1)), reference, design, int(diffs.size),
                                                        mean)}
    return SequentialComparison(variant, baseline, int(diffs.size), every_seed, mean, None,
                                reference if diffs.size else None, NOT_RESOLVED,
                                too_few_text(design, run, int(diffs.size)), **common,
                                stopping=unfinished)


def skew_flag_text(found, design: Design) -> str:
    """Why a flagged sweep's calls in one direction were tested at the heavy tail's level."""
    flag, sign = int(found.flagged_at[0]), float(found.skew_sign[0])
    if flag < 0:
        return ""
    heavy = "lower" if sign > 0 else "higher"
    return (f"the pairs' pooled skewness passed {'+' if sign > 0 else '-'}{design.look_design.check:g} at "
            f"{design.looks[flag]} seeds: a {heavy} value than the baseline's is tested at the heavy tail's level "
            "at every look")


def compare_looks(values: dict[str, SeedValues], baselines: dict[str, str], mode: str, design: Design,
                  unfinished: str = BUDGET) -> list[SequentialComparison]:
    """The family under a looks design (`k3lab.report.looks.decide`): each comparison at its last look."""
    d, run, reference = looks_matrix(values, baselines)
    if design.rule == FIXED:  # a list's one look sees whatever pairs each comparison has, 3 or more
        run = np.where(np.isfinite(d).sum(-1) >= design.first_look, design.looks[0], np.isfinite(d).sum(-1))
    found = decide(d, run, design.look_design, reference if design.margin is not None else None)
    rows = []
    for i, (variant, baseline) in enumerate(baselines.items()):
        code, look, pairs = int(found.code[0, i]), int(found.look[0, i]), int(found.pairs[0, i])
        every_seed = len(values.get(variant, {}).keys() | values.get(baseline, {}).keys())
        common = dict(method=design.rule, confidence=design.confidence, family=design.comparisons)
        if look < 0:
            rows.append(before_first_look(variant, baseline, d[0, i], float(reference[0, i]), int(run[0, i]),
                                          every_seed, design, common, unfinished))
            continue
        verdict = {LOWER: BETTER if mode == "min" else WORSE, HIGHER: WORSE if mode == "min" else BETTER,
                   LOOKS_EQUIVALENT: EQUIVALENT}.get(code, NOT_RESOLVED)
        half, base = float(found.half[0, i]), float(reference[0, i])
        shape = skew_flag_text(found, design)
        stopping = DECIDED if verdict != NOT_RESOLVED else (MAX_SEEDS if design.looks[look] >= design.looks[-1]
                                                            else unfinished)
        if verdict == NOT_RESOLVED and pairs >= 2:
            diffs = d[0, i, :design.looks[look]]
            common["pairs_needed"] = pairs_needed(float(np.nanstd(diffs, ddof=1)), float(reference[0, i]), design,
                                                  design.looks[look], float(found.mean[0, i]))
        rows.append(SequentialComparison(
            variant, baseline, pairs, every_seed, float(found.mean[0, i]), half if math.isfinite(half) else None,
            base, verdict, "; ".join(filter(None, ("interval covers 0" if verdict == NOT_RESOLVED else "", shape))),
            **common,
            relative_half_width=half / abs(base) if base and math.isfinite(half) else None, stopping=stopping))
    return rows


# -- presentation --------------------------------------------------------------------------------
