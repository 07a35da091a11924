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

A fixed list of seeds is one look: each comparison gets a Bonferroni t-interval at alpha / K.
`until: {halfwidth: h}` stops a comparison once its interval is at most h x |the baseline's mean|
instead; `until: max` runs every comparison to `max` seeds.

Everything here works on plain data: {variant: {seed: value or None}} and numpy arrays.
"""

from __future__ import annotations

import math
import statistics

import attrs

from k3lab.report.calibration import SKEW_COVERED, nominal_level, smallest_p_values
from k3lab.report.stats import BETTER, NOT_RESOLVED, WORSE, Comparison, SeedValues, paired_seeds, t_quantile

EQUIVALENT = "equivalent"
CONFIDENCE = 0.95
DECIDED, HALFWIDTH, MAX, FIXED = "decided", "halfwidth", "max", "fixed"  # the rules
RULES = (DECIDED, HALFWIDTH, MAX)  # what `until:` may say
PRECISE, MAX_SEEDS, BUDGET, RUNNING, STOPPED = "precise", "max seeds", "budget", "running", "stopped"
PLANNING_PATHS = 10_000  # a planning figure needs the level only roughly
PLANNING_HORIZONS = (24, 32, 48, 64, 96, 128, 200)
NEEDED_CAP = PLANNING_HORIZONS[-1]  # beyond this many pairs the answer is another design (longer trials)

__all__ = ["BETTER", "WORSE", "EQUIVALENT", "NOT_RESOLVED", "Design", "SequentialComparison", "nominal_level",
           "smallest_p_values", "compare_sequential", "compare_family", "fixed_design", "pairs_needed"]


# -- the design -----------------------------------------------------------------------------------


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

    @rule.default
    def _rule(self) -> str:
        return HALFWIDTH if self.halfwidth is not None else DECIDED

    @property
    def alpha(self) -> float:
        """The error rate of each comparison: (1 - confidence) / K."""
        return round((1 - self.confidence) / max(1, self.comparisons), 12)  # one cache key per design

    @property
    def nominal(self) -> float:
        """The two-sided level of each look's t-interval."""
        if self.level is not None:
            return self.level
        if self.rule == FIXED:
            return self.alpha
        return nominal_level(self.start, self.max_pairs, self.alpha, skew=self.skew)

    def calibrated(self) -> "Design":
        """This design with its nominal level computed, as a sweep stores it."""
        return attrs.evolve(self, level=self.nominal)

    @property
    def first_look(self) -> int:
        """The fewest pairs the design looks at: `start` (its level covers looks start .. max), or
        two for one look (a fixed list of seeds, some of whose trials may have failed)."""
        return 2 if self.rule == FIXED else max(2, self.start)

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
        return t_quantile(1 - self.nominal / 2, pairs - 1) * sd / math.sqrt(pairs)

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
        if self.rule == FIXED:
            return f"family-wise {100 * self.confidence:g}% t-interval (Bonferroni over {self.comparisons})"
        return f"family-wise {100 * self.confidence:g}% repeated t-interval ({self.start}-{self.max_pairs} pairs)"

    @property
    def label(self) -> str:
        """What the tables say about the intervals."""
        s = "s" if self.comparisons != 1 else ""
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

    def to_json(self) -> dict:
        return attrs.asdict(self) | {"level": self.nominal, "alpha": self.alpha}

    @classmethod
    def from_json(cls, data: dict) -> "Design":
        names = {field.name for field in attrs.fields(cls)}
        return cls(**{"skew": 0.0} | {key: value for key, value in data.items() if key in names})  # no skew: Gaussian


def fixed_design(comparisons: int, seeds: int, confidence: float = CONFIDENCE, margin: float | None = None) -> Design:
    """The design of a fixed list of seeds: one look, Bonferroni t-intervals."""
    return Design(comparisons=comparisons, max_pairs=seeds, start=seeds, confidence=confidence, rule=FIXED,
                  margin=margin, skew=0.0)


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
    return [compare_sequential(variant, values.get(variant, {}), baseline, values.get(baseline, {}), mode, design,
                               unfinished)
            for variant, baseline in baselines.items()]


# -- presentation --------------------------------------------------------------------------------


def comparison_cells(c: Comparison) -> dict[str, str]:
    """The text of one row of a design's table (the t-table's cells plus baseline, half-width
    relative to the baseline, stopping reason, pairs the rule would take)."""
    from k3lab.report.stats import comparison_cells as t_cells

    cells = t_cells(c)
    relative = getattr(c, "relative_half_width", None)
    cells["baseline"] = c.baseline
    cells["halfwidth"] = "n/a" if relative is None else f"{100 * relative:.2f}%"
    cells["stopping"] = getattr(c, "stopping", "") or "-"
    cells["needed"] = needed_cell(c)
    return cells


def needed_cell(c: Comparison) -> str:
    """"-" once its rule stopped it, n/a under two pairs, else ~N or >cap."""
    if getattr(c, "stopping", "") in (PRECISE, DECIDED) or c.pairs < 2:
        return "-" if c.pairs >= 2 else "n/a"
    needed = getattr(c, "pairs_needed", None)
    return f"~{needed}" if needed is not None else f">{NEEDED_CAP}"


def pairs_needed_line(comparisons: list[Comparison], max_seeds: int, parent_run_id: str) -> str | None:
    """A dry run's planning line from an earlier run's comparisons (built with the file's present
    design): the pairs its rule takes at that run's spreads, against the file's `max`. None when no
    comparison had two pairs."""
    rows = [c for c in comparisons if c.pairs >= 2]
    if not rows:
        return None
    listed = ", ".join(f"{c.variant} {c.stopping} ({c.pairs})" if c.stopping in (PRECISE, DECIDED)
                       else f"{c.variant} {needed_cell(c)} (ran {c.pairs})" for c in rows)
    return (f"earlier run in this store ({parent_run_id[:8]}): at the spread of its pairs (one per distinct seed), "
            f"the rule takes about this many pairs: {listed}; this file allows up to {max_seeds} seeds")


SEQUENTIAL_COLUMNS = ("variant", "baseline", "pairs", "difference", "interval", "relative", "halfwidth", "verdict",
                      "stopping", "needed")


def sequential_headers(metric: str, design: Design) -> dict[str, str]:
    return {"variant": "variant", "baseline": "baseline", "pairs": "pairs", "difference": f"{metric} - baseline",
            "interval": f"family-wise {100 * design.confidence:g}% interval", "relative": "vs baseline",
            "halfwidth": "half-width", "verdict": "verdict", "stopping": "stopped by",
            "needed": "pairs for asked" if design.rule == HALFWIDTH else "pairs to decide"}


def sequential_note(design: Design) -> str:
    asked = f"; asked: {100 * design.halfwidth:g}% of the baseline's metric" if design.halfwidth else ""
    margin = (f"; equivalent: the interval lies within +/-{100 * design.margin:g}% of the baseline's metric"
              if design.margin is not None else "")
    needed = ("; pairs for asked / to decide: about how many pairs the rule would take at the mean and spread of "
              "the differences so far (a planning figure for the next sweep, not part of the verdict)"
              if design.rule in (HALFWIDTH, DECIDED) else "")
    stopped = ("" if design.rule == FIXED else "; stopped by: decided, precise, max seeds, budget, stopped (the sweep "
               "was stopped before its budget ended; `--resume` adds seeds), running")
    return (f"rule: {design.rule_text}; pairs: seeds where both trials finished, of the seeds run; interval: "
            f"{design.label}; half-width: relative to the baseline's mean over the pairs{asked}{margin}; not "
            f"resolved: the interval covers 0 (or there are fewer pairs than the design's first look, "
            f"{design.first_look}){stopped}{needed}")
