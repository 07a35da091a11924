"""What a variant is worth in compute: its compute multiplier, as the AttnRes paper states its result.

A sweep with `compute: {scales: [1.25, 1.6, 2.0]}` trains each baseline at those multiples of its
token budget too (its compute curve). For every seed s, the baseline's losses L against training
compute C (FLOPs per token as k3lab counts them, AttnRes's mixing included, times tokens trained)
form a curve (`k3lab.report.curves`: a monotone cubic in log-log through the points), and a
variant's multiplier at seed s is the compute at which that curve reaches the variant's loss,
over the variant's own compute (what the count adds for a variant counts against it):

    m_s = C_b,s(L_v,s) / C_v,s

The curve goes through the baseline's own trials, so a variant that ends where the baseline does
is worth 1x whatever the curve's shape between its points. A seed whose curve does not fall from
point to point gives none. A seed whose baseline points do not bracket the variant's loss is
censored: it enters no mean, and the cell says how many seeds are "beyond 2x" or "below 0.5x"
(the curve's ends, in multiples of the baseline's budget); the interval is clipped to the
curve's ends, where it says "beyond" or "below" too.

m > 1: the variant reaches with its compute a loss the baseline needs m times that compute for.
Each seed's curve uses that seed's trials alone, so the seeds' log m_s are independent like the
verdicts' paired differences; the estimate is their geometric mean. Its interval, on the log scale,
is read once, not at the sweep's looks: a t-interval at one look's shape-calibrated level with the
design's K multipliers (`sequential.fixed_design`), widened by the curve's interpolation error,
taken as a share of how far the cubic and the straight-piece readings lie apart (its mean over the
seeds: a bias, which more seeds do not average away; `multiplier_half_width`).

The same reading with GPU-seconds for cost (each trial's tokens over its measured tokens/s: its
training time on its GPU) gives the time multiplier: the baseline's seconds to reach the
variant's loss over the variant's own, what the change is worth in wall time where its kernels
cost more (or less) than its FLOPs say. Compare it only within one store (one GPU type).

Across model sizes (`compute: {sizes: AXIS, at: FLOPS}`), as the paper fits its five sizes: per
seed, each family of variants (one value of the other axes) gets its own power law over its
sizes; the compared family's fitted loss at `at` FLOPs, and the compute at which the baseline
family's fit reaches it, give m_s = C_b(L_v(at)) / at (`size_multipliers`).
"""

from __future__ import annotations

import math
import statistics

from typing import Callable

import attrs

from k3lab.report.curves import ABOVE, BELOW, compute_at, curve_reach, power_law
from k3lab.report.paired import tokens_per_step, trial_value
from k3lab.report.records import TrialRecord
from k3lab.report.sequential import Design, fixed_design

BEND_SHARE = 0.5  # of |cubic - straight reading|, counted as the cubic's own interpolation error
FLOPS_PER_TOKEN = "flops_per_token"  # a trial run's metric (k3lab.model.counting, the MFU's count)


def trial_compute(record: TrialRecord) -> float | None:
    """FLOPs the trial trained with: its FLOPs per token times the tokens of its steps."""
    per_token, per_step = record.value(FLOPS_PER_TOKEN), tokens_per_step(record)
    try:
        steps = int(record.params["train.steps"])
    except (KeyError, ValueError):
        return None
    return per_token * per_step * steps if per_token and per_step else None


def trial_seconds(record: TrialRecord) -> float | None:
    """Seconds the trial trained: its tokens over its measured tokens per second (run average)."""
    tokens, rate = record.value("tokens"), record.value("avg_tokens_per_s")
    return tokens / rate if tokens and rate else None


@attrs.frozen
class Multiplier:
    """One variant's multiplier against its baseline's curve. estimate/low/high: the geometric mean
    over the seeds inside the curve and its interval, clipped to the curve's ends (None: under two
    such seeds); lowest/highest: the multipliers at the curve's smallest and largest cost (outside
    them the curve is not known); outside: what a value below or above them is shown as (e.g.
    "below 1x", "beyond 2x"); basis: what the baseline's cost is read from, for the report's note;
    censored: seed -> "below" / "above" for seeds whose curve does not bracket the variant's loss;
    time: the same reading in GPU-seconds (`trial_seconds`), where the trials measured them."""

    variant: str
    baseline: str
    seeds: dict[int, float]
    estimate: float | None
    low: float | None
    high: float | None
    lowest: float
    highest: float
    outside: tuple[str, str]
    basis: str
    skipped: tuple[int, ...] = ()  # seeds whose curve did not fall with compute
    censored: dict[int, str] = attrs.Factory(dict)
    time: "Multiplier | None" = None

    @property
    def pairs(self) -> int:
        return len(self.seeds)

    def shown(self, value: float | None) -> str:
        """1.18x, or "beyond 2x" / "below 1x" at or outside the curve's ends, or "n/a"."""
        if value is None:
            return "n/a"
        if value >= self.highest * (1 - 1e-9) and value > self.lowest:
            return self.outside[1]
        if value <= self.lowest * (1 + 1e-9) and value < self.highest:
            return self.outside[0]
        return f"{value:.2f}x"

    @property
    def censored_text(self) -> str:
        """'; 2 of 9 seeds beyond 2x' (none: '')."""
        counts = [(sum(1 for side in self.censored.values() if side == which), label)
                  for which, label in ((ABOVE, self.outside[1]), (BELOW, self.outside[0]))]
        every = self.pairs + len(self.censored)
        return "".join(f"; {n} of {every} seeds {label}" for n, label in counts if n)

    @property
    def cell(self) -> str:
        """'1.18x [1.05x, 1.32x]' (the interval where there is one), then the censored seeds."""
        if self.estimate is None:
            main = "n/a"
        elif self.low is None or self.high is None:
            main = self.shown(self.estimate)
        else:
            main = f"{self.shown(self.estimate)} [{self.shown(self.low)}, {self.shown(self.high)}]"
        return main + self.censored_text

    @property
    def cells(self) -> str:
        """The table's cell: FLOPs, and time where measured."""
        return self.cell if self.time is None else f"FLOPs {self.cell}; time {self.time.cell}"

    def to_json(self) -> dict:
        found = {"variant": self.variant, "baseline": self.baseline, "pairs": self.pairs, "estimate": self.estimate,
                 "low": self.low, "high": self.high, "shown": self.cell, "basis": self.basis,
                 "in_curve": [self.lowest, self.highest], "seeds": {str(s): m for s, m in self.seeds.items()},
                 "skipped_seeds": list(self.skipped), "censored_seeds": {str(s): c for s, c in self.censored.items()}}
        return found | ({"time": self.time.to_json()} if self.time is not None else {})


Cost = Callable[[TrialRecord], "float | None"]


def curve_points(records: list[TrialRecord], names: list[str], metric: str, last: int, mode: str,
                 rise: float | None, cost: Cost = trial_compute) -> dict[int, list[tuple[float, float]]]:
    """seed -> (cost, value) of every trial of the curve (`names`: the baseline and its stretched copies)."""
    points: dict[int, list[tuple[float, float]]] = {}
    for record in records:
        if record.variant in names:
            value, spent = trial_value(record, metric, last, mode, rise), cost(record)
            if value is not None and value > 0 and spent:
                points.setdefault(record.seed, []).append((spent, value))
    return points


def multiplier_of(variant: str, baseline: str, records: list[TrialRecord], curve: dict[str, float], metric: str,
                  design: Design, last: int = 1, mode: str = "min", rise: float | None = None,
                  cost: Cost = trial_compute, cubic: bool = True) -> Multiplier | None:
    """`variant`'s multiplier against the `cost` curve of `baseline` (curve: stretched copy -> its
    multiple of the budget), with its time multiplier where cost is compute and the trials
    measured their speed; None where no seed has both a curve and the variant's value."""
    points = curve_points(records, [baseline, *curve], metric, last, mode, rise, cost)
    seeds, skipped, censored, spans, bend = {}, [], {}, [], {}
    for record in records:
        if record.variant != variant or record.seed not in points:
            continue
        value, spent = trial_value(record, metric, last, mode, rise), cost(record)
        if value is None or value <= 0 or not spent:
            continue
        reached, outside = curve_reach(points[record.seed], value, cubic)
        costs = [c for c, _ in points[record.seed]]
        if outside is not None:
            censored[record.seed] = outside
        elif reached is None:
            skipped.append(record.seed)
            continue
        else:
            seeds[record.seed] = reached / spent
            straight, _ = curve_reach(points[record.seed], value, False)
            bend[record.seed] = abs(math.log(reached / straight)) if cubic and straight else 0.0
        spans.append((min(costs) / spent, max(costs) / spent))
    ends = (min(1.0, *curve.values()), max(1.0, *curve.values()))
    outside = ((f"below {ends[0]:g}x", f"beyond {ends[1]:g}x") if cost is trial_compute  # the budgets' multiples
               else ("below the curve", "beyond the curve"))  # in seconds the ends differ by each trial's speed
    found = summarised(variant, baseline, seeds, design, spans, outside,
                       f"its curve over {ends[0]:g}x-{ends[1]:g}x its budget, "
                       f"{'a monotone cubic' if cubic else 'straight pieces'} in log-log through the points, per seed",
                       skipped, censored, bend)
    if found is None or cost is not trial_compute:
        return found
    return attrs.evolve(found, time=multiplier_of(variant, baseline, records, curve, metric, design, last, mode,
                                                  rise, trial_seconds, cubic))


def multiplier_half_width(logs: list[float], design: Design, bend: dict[int, float] | None = None) -> float:
    """The half-width on the log scale of the seeds' log multipliers: a one-look t-interval at the
    level of a fixed list of that many seeds with all of the design's K open (`fixed_design`: the
    shape-calibrated alpha / K; an estimate, not a sequential test: the multipliers are read once),
    plus BEND_SHARE x the mean over the seeds of |cubic - straight reading| in log (`bend`): the
    cubic's interpolation error, a bias more seeds do not shrink (bench/multipliers.py measures the
    coverage this gives on near-floor and curved curves)."""
    level = fixed_design(design.comparisons, len(logs), design.confidence)
    return level.half_width(logs) + BEND_SHARE * (statistics.fmean(bend.values()) if bend else 0.0)


def summarised(variant: str, baseline: str, seeds: dict[int, float], design: Design,
               spans: list[tuple[float, float]], outside: tuple[str, str], basis: str,
               skipped: list[int], censored: dict[int, str] | None = None,
               bend: dict[int, float] | None = None) -> Multiplier | None:
    """The seeds' multipliers as a `Multiplier`: geometric mean and its interval on the logs
    (`multiplier_half_width`), clipped to the curve's ends; censored seeds are counted, never averaged."""
    if not seeds and not censored:
        return None
    lowest = statistics.geometric_mean(lo for lo, _ in spans) if spans else 1.0
    highest = statistics.geometric_mean(hi for _, hi in spans) if spans else 1.0
    estimate = low = high = None
    if seeds:
        logs = [math.log(m) for m in seeds.values()]
        centre, half = statistics.fmean(logs), multiplier_half_width(logs, design, bend)
        estimate = math.exp(centre)
        if math.isfinite(half):
            low, high = max(lowest, math.exp(centre - half)), min(highest, math.exp(centre + half))
    return Multiplier(variant=variant, baseline=baseline, seeds=dict(sorted(seeds.items())), estimate=estimate,
                      low=low, high=high, lowest=lowest, highest=highest, outside=outside, basis=basis,
                      skipped=tuple(skipped), censored=dict(sorted((censored or {}).items())))


def compute_multipliers(records: list[TrialRecord], pairs: dict[str, str], curves: dict[str, dict[str, float]],
                        metric: str, design: Design, last: int = 1, mode: str = "min",
                        rise: float | None = None, cubic: bool = True) -> list[Multiplier]:
    """The multiplier of every compared variant (pairs: variant -> its baseline) whose baseline has a
    compute curve (curves: baseline -> {stretched copy: multiple}), in the order of `pairs`; cubic:
    the curve's reading (`k3lab.report.curves.curve_reach`)."""
    found = (multiplier_of(v, b, records, curves[b], metric, design, last, mode, rise, cubic=cubic)
             for v, b in pairs.items() if b in curves)
    return [m for m in found if m is not None]


def size_multipliers(records: list[TrialRecord], sizes: dict, metric: str, design: Design, last: int = 1,
                     mode: str = "min", rise: float | None = None) -> list[Multiplier]:
    """Across model sizes (`k3lab.registry.compute_curves.size_families`), as the AttnRes paper: per seed,
    each family's loss fitted against compute over its sizes; the compared family's fitted loss at
    `sizes["at"]` FLOPs; the baseline family's compute that reaches it, over `at`."""
    found = []
    for family, baseline in sizes["baselines"].items():
        mine = curve_points(records, sizes["families"][family], metric, last, mode, rise)
        theirs = curve_points(records, sizes["families"][baseline], metric, last, mode, rise)
        at, seeds, skipped, spans = sizes["at"], {}, [], []
        for seed in sorted(mine.keys() & theirs.keys()):
            fit_mine, fit_theirs = power_law(mine[seed]), power_law(theirs[seed])
            if fit_mine is None or fit_theirs is None:
                skipped.append(seed)
                continue
            loss = math.exp(fit_mine[0] - fit_mine[1] * math.log(at))
            seeds[seed] = compute_at(fit_theirs, loss) / at
            computes = [c for c, _ in theirs[seed]]
            spans.append((min(computes) / at, max(computes) / at))
        multiplier = summarised(family, baseline, seeds, design, spans, ("below the smallest size",
                                                                         "beyond the largest size"),
                                f"its family's power-law fit over the {sizes['axis']} sizes, per seed, read at "
                                f"{at:.3g} FLOPs", skipped)
        if multiplier is not None:
            found.append(multiplier)
    return found
