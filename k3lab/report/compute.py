"""What a variant is worth in compute: its compute multiplier, as the AttnRes paper states its result.

A sweep with `compute: {scales: [1.25, 1.6, 2.0]}` trains each baseline at those multiples of its
token budget too (its compute curve). For every seed s, the baseline's losses L against training
compute C (FLOPs per token as k3lab counts them for MFU, times tokens trained) are joined point to point by power
laws, i.e. straight lines in log L against log C (`curve_compute`), and a variant's multiplier at
seed s is the compute at which that curve reaches the variant's loss, over the variant's own
compute (what the count adds for a variant counts against it):

    m_s = C_b,s(L_v,s) / C_v,s

The curve goes through the baseline's own trials, so a variant that ends where the baseline does
is worth 1x whatever the curve's shape between its points; one power law over all the points
would miss the baseline's own 1x point where the curve bends (at small budgets it does) and give
a variant equal to the baseline some other multiplier. A seed whose curve does not fall from
point to point gives none.

m > 1: the variant reaches with its compute a loss the baseline needs m times that compute for.
Each seed's fit uses that seed's trials alone, so the seeds' log m_s are independent like the
verdicts' paired differences; the estimate is their geometric mean, with the design's family-wise
interval (`k3lab.report.sequential.Design.half_width`) on the log scale. A value the curve does not
reach (above its largest compute or below its smallest) is reported as "beyond 2x" or "below 1x"
(the curve's ends, in multiples of the baseline's budget), not extrapolated silently.

Across model sizes (`compute: {sizes: AXIS, at: FLOPS}`), as the paper fits its five sizes: per
seed, each family of variants (one value of the other axes) gets its own power law over its
sizes; the compared family's fitted loss at `at` FLOPs, and the compute at which the baseline
family's fit reaches it, give m_s = C_b(L_v(at)) / at (`size_multipliers`).
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path

import attrs
import numpy as np
from scipy import stats as scipy_stats

from k3lab.report.family import ExtraColumn, tokens_per_step, trial_value
from k3lab.report.records import TrialRecord
from k3lab.report.sequential import Design

FLOPS_PER_TOKEN = "flops_per_token"  # a trial run's metric (k3lab.model.counting, the MFU's count)


def trial_compute(record: TrialRecord) -> float | None:
    """FLOPs the trial trained with: its FLOPs per token times the tokens of its steps."""
    per_token, per_step = record.value(FLOPS_PER_TOKEN), tokens_per_step(record)
    try:
        steps = int(record.params["train.steps"])
    except (KeyError, ValueError):
        return None
    return per_token * per_step * steps if per_token and per_step else None


def curve_compute(points: list[tuple[float, float]], loss: float) -> float | None:
    """The compute at which the curve through (compute, loss) points, a power law between each two
    neighbours, reaches `loss` (beyond its ends: its end pieces extended); None under two points
    or where the loss does not fall from point to point."""
    points = sorted(points)
    x = [math.log(c) for c, _ in points]
    y = [math.log(v) for _, v in points]
    if len(points) < 2 or any(later >= earlier for earlier, later in zip(y, y[1:])):
        return None
    target = math.log(loss)
    piece = next((i for i in range(len(y) - 1) if y[i + 1] <= target), len(y) - 2)  # y falls with i
    slope = (x[piece + 1] - x[piece]) / (y[piece + 1] - y[piece])
    return math.exp(x[piece] + (target - y[piece]) * slope)


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


@attrs.frozen
class Multiplier:
    """One variant's compute multiplier against its baseline's curve. estimate/low/high: the
    geometric mean over the seeds and its interval (None: under two seeds); lowest/highest: the
    multipliers at the curve's smallest and largest compute (outside them the curve is not
    known); outside: what a value below or above them is shown as (e.g. "below 1x", "beyond 2x");
    basis: what the baseline's compute is read from, for the report's note."""

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

    @property
    def pairs(self) -> int:
        return len(self.seeds)

    def shown(self, value: float | None) -> str:
        """1.18x, or "beyond 2x" / "below 1x" outside the curve, or "n/a"."""
        if value is None:
            return "n/a"
        if value > self.highest * (1 + 1e-9):
            return self.outside[1]
        if value < self.lowest * (1 - 1e-9):
            return self.outside[0]
        return f"{value:.2f}x"

    @property
    def cell(self) -> str:
        """'1.18x [1.05x, 1.32x]' (the interval where there is one)."""
        if self.low is None or self.high is None:
            return self.shown(self.estimate)
        return f"{self.shown(self.estimate)} [{self.shown(self.low)}, {self.shown(self.high)}]"

    def to_json(self) -> dict:
        return {"variant": self.variant, "baseline": self.baseline, "pairs": self.pairs, "estimate": self.estimate,
                "low": self.low, "high": self.high, "shown": self.cell, "basis": self.basis,
                "in_curve": [self.lowest, self.highest], "seeds": {str(s): m for s, m in self.seeds.items()},
                "skipped_seeds": list(self.skipped)}


def curve_points(records: list[TrialRecord], names: list[str], metric: str, last: int, mode: str,
                 rise: float | None) -> dict[int, list[tuple[float, float]]]:
    """seed -> (compute, value) of every trial of the curve (`names`: the baseline and its stretched copies)."""
    points: dict[int, list[tuple[float, float]]] = {}
    for record in records:
        if record.variant in names:
            value, compute = trial_value(record, metric, last, mode, rise), trial_compute(record)
            if value is not None and value > 0 and compute:
                points.setdefault(record.seed, []).append((compute, value))
    return points


def multiplier_of(variant: str, baseline: str, records: list[TrialRecord], curve: dict[str, float], metric: str,
                  design: Design, last: int = 1, mode: str = "min", rise: float | None = None) -> Multiplier | None:
    """`variant`'s multiplier against the compute curve of `baseline` (curve: stretched copy ->
    its multiple of the budget); None where no seed has both a curve and the variant's value."""
    points = curve_points(records, [baseline, *curve], metric, last, mode, rise)
    seeds, skipped, spans = {}, [], []
    for record in records:
        if record.variant != variant or record.seed not in points:
            continue
        value, compute = trial_value(record, metric, last, mode, rise), trial_compute(record)
        if value is None or value <= 0 or not compute:
            continue
        reached = curve_compute(points[record.seed], value)
        if reached is None:
            skipped.append(record.seed)
            continue
        seeds[record.seed] = reached / compute
        computes = [c for c, _ in points[record.seed]]
        spans.append((min(computes) / compute, max(computes) / compute))
    ends = (min(1.0, *curve.values()), max(1.0, *curve.values()))
    return summarised(variant, baseline, seeds, design, spans, (f"below {ends[0]:g}x", f"beyond {ends[1]:g}x"),
                      f"its curve over {ends[0]:g}x-{ends[1]:g}x its budget, a power law between neighbouring points, "
                      "per seed", skipped)


def summarised(variant: str, baseline: str, seeds: dict[int, float], design: Design,
               spans: list[tuple[float, float]], outside: tuple[str, str], basis: str,
               skipped: list[int]) -> Multiplier | None:
    """The seeds' multipliers as a `Multiplier`: geometric mean and the design's interval on the logs."""
    if not seeds:
        return None
    logs = [math.log(m) for m in seeds.values()]
    centre = statistics.fmean(logs)
    half = design.half_width(logs)
    low, high = (math.exp(centre - half), math.exp(centre + half)) if math.isfinite(half) else (None, None)
    return Multiplier(variant=variant, baseline=baseline, seeds=dict(sorted(seeds.items())),
                      estimate=math.exp(centre), low=low, high=high,
                      lowest=statistics.geometric_mean(lo for lo, _ in spans),
                      highest=statistics.geometric_mean(hi for _, hi in spans), outside=outside, basis=basis,
                      skipped=tuple(skipped))


def compute_multipliers(records: list[TrialRecord], pairs: dict[str, str], curves: dict[str, dict[str, float]],
                        metric: str, design: Design, last: int = 1, mode: str = "min",
                        rise: float | None = None) -> list[Multiplier]:
    """The multiplier of every compared variant (pairs: variant -> its baseline) whose baseline has a
    compute curve (curves: baseline -> {stretched copy: multiple}), in the order of `pairs`."""
    found = (multiplier_of(v, b, records, curves[b], metric, design, last, mode, rise)
             for v, b in pairs.items() if b in curves)
    return [m for m in found if m is not None]


def multiplier_column(multipliers: list[Multiplier], interval: str) -> ExtraColumn | None:
    """The comparisons table's compute multiplier column (None without multipliers)."""
    if not multipliers:
        return None
    return ExtraColumn("compute multiplier", {m.variant: m.cell for m in multipliers},
                       multiplier_note(multipliers, interval))


def multiplier_note(multipliers: list[Multiplier], interval: str) -> str:
    """What the column says, in one sentence for the report."""
    return (f"Compute multiplier: the baseline's compute ({multipliers[0].basis}) that reaches the variant's loss, "
            f"over the variant's own compute (FLOPs per token x tokens); geometric mean over the seeds with the "
            f"{interval}; >1: the variant is worth more compute than it costs.")


def size_multipliers(records: list[TrialRecord], sizes: dict, metric: str, design: Design, last: int = 1,
                     mode: str = "min", rise: float | None = None) -> list[Multiplier]:
    """Across model sizes (`k3lab.registry.compute.size_families`), as the AttnRes paper: per seed,
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


def size_multiplier_title(sizes: dict, interval: str) -> str:
    return (f"Compute multiplier across {sizes['axis']} at {sizes['at']:.3g} FLOPs (each family's loss against compute "
            f"fitted over its sizes, per seed; the {interval})")


def size_multiplier_lines(multipliers: list[Multiplier], sizes: dict, interval: str) -> list[str]:
    """Markdown: the multipliers across sizes, one row per compared family."""
    lines = [size_multiplier_title(sizes, interval) + ":", "",
             "| family | baseline | seeds | compute multiplier |", "|---|---|---|---|"]
    lines += [f"| {m.variant} | {m.baseline} | {m.pairs} | {m.cell} |" for m in multipliers]
    return lines


def size_multiplier_table(multipliers: list[Multiplier], sizes: dict, interval: str):
    """The same as a rich table, for the terminal."""
    from rich.table import Table
    from rich.text import Text

    table = Table(title=size_multiplier_title(sizes, interval))
    for column in ("family", "baseline", "seeds", "compute multiplier"):
        table.add_column(column, justify="right" if column in ("seeds", "compute multiplier") else "left")
    for m in multipliers:
        table.add_row(m.variant, m.baseline, str(m.pairs), Text(m.cell))
    return table


def plot_compute_curve(records: list[TrialRecord], multipliers: list[Multiplier], curves: dict[str, dict[str, float]],
                       path: Path, metric: str, colours: dict[str, str], last: int = 1, mode: str = "min",
                       rise: float | None = None, title: str = "") -> Path:
    """The baseline's loss against compute (its seeds' points and the line through their means), each
    variant as a point at its own compute (mean over its seeds), its legend entry its multiplier
    (variants of one compute share an x, so the labels go to the legend)."""
    from matplotlib.ticker import FuncFormatter

    from k3lab.report.figures import pyplot, save_figure
    from k3lab.report.plots import plain_log_ticks

    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 4.4), layout="constrained")
    for baseline, curve in curves.items():
        points = curve_points(records, [baseline, *curve], metric, last, mode, rise)
        flat = [p for seed_points in points.values() for p in seed_points]
        if not flat:
            continue
        ax.scatter([c for c, _ in flat], [v for _, v in flat], s=10, color="black", alpha=0.3)
        by_compute: dict[float, list[float]] = {}
        for c, v in flat:
            by_compute.setdefault(c, []).append(v)
        xs = sorted(by_compute)
        ax.plot(xs, [statistics.geometric_mean(by_compute[c]) for c in xs], color="black", linewidth=1.2,
                label=f"{baseline} at {len(xs)} budgets (geometric mean of the seeds)")
    for multiplier in multipliers:
        mine = [(trial_compute(r), trial_value(r, metric, last, mode, rise)) for r in records
                if r.variant == multiplier.variant]
        mine = [(c, v) for c, v in mine if c and v is not None]
        if not mine:
            continue
        x, y = statistics.fmean(c for c, _ in mine), statistics.fmean(v for _, v in mine)
        colour = colours.get(multiplier.variant, "C0")
        ax.scatter([x], [y], s=40, color=colour, zorder=3, label=f"{multiplier.variant}: {multiplier.cell}")
    ax.set_xscale("log")
    ax.set_yscale("log")
    plain_log_ticks(ax)
    ax.xaxis.set_major_formatter(FuncFormatter(lambda value, _position: f"{value:.2g}"))
    ax.xaxis.set_minor_formatter(FuncFormatter(lambda value, _position: f"{value:.2g}"))
    ax.tick_params(axis="x", which="minor", labelsize=7)
    ax.set_xlabel("training compute, FLOPs (FLOPs per token × tokens)")
    ax.set_ylabel(metric)
    ax.set_title("compute multiplier: the baseline's compute that reaches each variant's loss", fontsize=10)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7, loc="best")
    fig.suptitle(title or f"{metric} against compute", fontsize=11)
    return save_figure(plt, fig, path)
