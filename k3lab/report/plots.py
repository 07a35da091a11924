"""The report's plots: each titled with the sweep, the baseline drawn where variants are compared,
one colour per variant (`k3lab.store.colours`, the trials' colour in the MLflow UI too), and a
trial that stopped before the sweep's last step (by the scheduler, failed) marked with a cross at
its own last point; curves of differences take their y axis from the later half of training.

    loss_curves.png         train_loss (log scale, smoothed); train_loss minus the baseline over
                            the second half of training and the metric minus the baseline at each
                            evaluation with its interval, paired by seed (differences that overlaid
                            curves hide)
    <metric>_by_variant.png the final metric per variant, mean ± std over seeds, the baseline's as a line
    <metric>_vs_params.png  the final metric against active parameters (variants of equal size side
                            by side, labelled), the baseline's as a line
    <metric>_vs_baseline.png each variant's paired difference from the baseline with its 95% interval

    <metric>_curve_vs_baseline.png the difference at every evaluation in % of the baseline
                            (`k3lab.report.paired.curve_differences`), with its intervals
    compute_multiplier.png  the baselines' compute curves and where each variant's metric meets them
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path
from typing import Sequence

import numpy as np

from k3lab.report.compute_multipliers import Multiplier, curve_points, trial_compute
from k3lab.report.paired import trial_value
from k3lab.report.records import TrialRecord

STOPPED = ("KILLED", "FAILED")  # a trial's MLflow status when it did not train to the end
BASELINE_STYLE = {"color": "black", "linestyle": "--", "linewidth": 1.0}


def pyplot():
    """matplotlib.pyplot on the file-only Agg backend (sweeps run without a display)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(plt, fig, path: Path) -> Path:
    """Save and close; labels, titles and legends outside the axes stay inside the file."""
    if fig.get_layout_engine() is None:  # a figure made with layout="constrained" keeps its own
        fig.tight_layout()
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)
    return path


def figure(plt, width: float, height: float, columns: int = 1):
    fig, axes = plt.subplots(1, columns, figsize=(width, height), layout="constrained")
    return fig, axes


def smooth(points: list[tuple[int, float]], window: int) -> tuple[np.ndarray, np.ndarray]:
    """A centred moving average of a curve (steps, values); the ends use the points they have."""
    if not points:
        return np.array([]), np.array([])
    steps, values = (np.asarray(v, dtype=float) for v in zip(*points))
    if window <= 1 or len(values) < 3:
        return steps, values
    kernel = np.ones(window)
    sums = np.convolve(values, kernel, mode="same")
    counts = np.convolve(np.ones_like(values), kernel, mode="same")
    return steps, sums / counts


def smoothing_window(records) -> int:
    longest = max((len(r.curves.get("train_loss", [])) for r in records), default=0)
    return max(1, longest // 25)


def plain_log_ticks(ax) -> None:
    """A log-scale y axis labelled 0.8, 1, 2 instead of 8x10^-1, 10^0, 2x10^0."""
    from matplotlib.ticker import FuncFormatter

    label = FuncFormatter(lambda value, _position: f"{value:g}")
    ax.yaxis.set_major_formatter(label)
    ax.yaxis.set_minor_formatter(label)
    ax.tick_params(axis="y", which="minor", labelsize=7)


def last_step(record) -> float:
    return max((step for step, _ in record.curves.get("train_loss", [])), default=0)


def stopped_early(record, end: float) -> bool:
    """The trial did not finish and stopped before the sweep's last step `end`."""
    return record.status in STOPPED and last_step(record) < end


def mark_stopped(ax, record, steps, values, colour, end: float) -> None:
    """A cross at the last point of a trial that stopped early (`stopped_early`)."""
    if stopped_early(record, end) and len(steps):
        ax.plot(steps[-1], values[-1], marker="X", markersize=9, color=colour, markeredgecolor="black",
                linestyle="none", zorder=5)


def limit_to_late(ax, curves: list, from_step: float) -> None:
    """y limits holding 0 and every curve's (steps, values) from `from_step` on, with a margin:
    the later part of training sets the axis, not the first evaluation's gap."""
    late = [v for steps, values in curves for s, v in zip(steps, values) if s >= from_step and math.isfinite(v)]
    if late:
        low, high = min(0.0, *late), max(0.0, *late)
        margin = 0.08 * ((high - low) or 1.0)
        ax.set_ylim(low - margin, high + margin)


def stopped_handle():
    from matplotlib.lines import Line2D

    return Line2D([], [], marker="X", markersize=9, color="grey", markeredgecolor="black", linestyle="none")


def paired_curve(records, variant: str, baseline: str, name: str, window: int, from_step: float = 0):
    """The mean over seeds of (variant - baseline) for the curve `name`, at the steps both have."""
    base = {r.seed: dict(zip(*smooth(r.curves.get(name, []), window))) for r in records if r.variant == baseline}
    diffs: dict[float, list[float]] = {}
    for record in (r for r in records if r.variant == variant and r.seed in base):
        for step, value in zip(*smooth(record.curves.get(name, []), window)):
            if step >= from_step and step in base[record.seed]:
                diffs.setdefault(step, []).append(value - base[record.seed][step])
    steps = sorted(diffs)
    return np.array(steps), np.array([sum(diffs[s]) / len(diffs[s]) for s in steps])


def draw_difference_rows(ax, rows: list[dict], colour: str) -> list[tuple]:
    """A variant's rows of `k3lab.report.paired.curve_differences` (mean paired difference at each
    evaluation, its interval as error bars); returns the drawn (steps, values) of both bounds."""
    steps = [r["step"] for r in rows]
    means = [r["difference"] for r in rows]
    halves = [r["half_width"] or 0.0 for r in rows]
    ax.errorbar(steps, means, yerr=halves, color=colour, marker="o", markersize=4, capsize=2, elinewidth=0.9)
    return [(steps, [m - h for m, h in zip(means, halves)]), (steps, [m + h for m, h in zip(means, halves)])]


def plot_loss_curves(records, path: Path, metric: str, colours: dict[str, str], baseline: str | None = None,
                     title: str = "", curves: list[dict] | None = None) -> Path:
    """Three panels: train_loss of every trial (log scale, smoothed), then, against the baseline
    paired by seed, train_loss over the second half and `metric` at each evaluation (without a
    baseline: those two as they are, the second half of training zoomed). `curves`: the report's
    `curve_differences`, drawn in the metric's panel with their intervals."""
    plt = pyplot()
    fig, (whole, late, val) = figure(plt, 17, 5.4, columns=3)
    window = smoothing_window(records)
    last = max((p[0] for r in records for p in r.curves.get("train_loss", [])[-1:]), default=0)
    variants = list(dict.fromkeys(r.variant for r in records))
    draw_every_trial(whole, records, colours, window, last)
    compared = baseline is not None and baseline in variants
    for ax, name, start in ((late, "train_loss", last / 2), (val, metric, 0)):
        smoothing = window if name == "train_loss" else 1
        if compared:
            rows = [r for r in curves or [] if r["variant"] != baseline] if name == metric else []
            drawn = draw_against_baseline(ax, records, variants, baseline, name, smoothing, start, colours, rows)
            limit_to_late(ax, drawn, last / 2)
            ax.axhline(0.0, **BASELINE_STYLE)
            ax.set_ylabel(f"{name} − baseline")
        else:
            draw_each_trial(ax, records, name, smoothing, start, colours, last)
            ax.set_ylabel(name)
        ax.ticklabel_format(axis="y", useOffset=False)
    paired = f"minus the baseline {baseline} (dashed), paired by seed"
    late.set_title(f"train_loss over the second half of training\n{paired if compared else ''}", fontsize=10)
    bars = ", with its interval" if compared and curves else ""
    val.set_title(f"{metric} at each evaluation\n{paired + bars if compared else ''}", fontsize=10)
    for ax in (whole, late, val):
        ax.set_xlabel("optimizer step")
        ax.grid(alpha=0.3)
    trials_legend(fig, whole, records, last)
    fig.suptitle(f"{title}: loss curves by variant" if title else "loss curves by variant")
    return save_figure(plt, fig, path)


def draw_every_trial(ax, records, colours: dict[str, str], window: int, last: float) -> None:
    """The first panel: every trial's train_loss (log scale, smoothed over `window` steps), one legend
    entry per variant, a cross where a trial stopped before the sweep's `last` step."""
    labelled = set()
    for record in records:
        steps, values = smooth(record.curves.get("train_loss", []), window)
        if not len(steps):
            continue
        colour = colours[record.variant]
        label = record.variant if record.variant not in labelled else None
        labelled.add(record.variant)
        ax.plot(steps, values, color=colour, alpha=0.85, linewidth=1.2, label=label)
        mark_stopped(ax, record, steps, values, colour, last)
    ax.set_yscale("log")
    plain_log_ticks(ax)
    smoothed = f", smoothed over {window} steps" if window > 1 else ""
    ax.set_title(f"train_loss, every trial\n(log scale{smoothed})", fontsize=10)
    ax.set_ylabel("train_loss")


def draw_against_baseline(ax, records, variants: list[str], baseline: str, name: str, window: int, start: float,
                          colours: dict[str, str], rows: list[dict]) -> list[tuple]:
    """Each variant's curve `name` minus the baseline's, paired by seed, from step `start` on: the
    report's `rows` (with their intervals) where it has them for the variant, else the mean paired
    difference; returns the drawn (steps, values), for the axis limits."""
    drawn = []
    for variant in (v for v in variants if v != baseline):
        colour = colours[variant]
        mine = [r for r in rows if r["variant"] == variant]
        if mine:
            drawn += draw_difference_rows(ax, mine, colour)
            continue
        steps, values = paired_curve(records, variant, baseline, name, window, start)
        ax.plot(steps, values, color=colour, marker="o" if name != "train_loss" else None, markersize=4)
        drawn.append((steps, values))
    return drawn


def draw_each_trial(ax, records, name: str, window: int, start: float, colours: dict[str, str], last: float) -> None:
    """Without a baseline: every trial's curve `name` as it is, from step `start` on, variant by variant."""
    variants = list(dict.fromkeys(r.variant for r in records))
    for record in (r for variant in variants for r in records if r.variant == variant):
        steps, values = smooth(record.curves.get(name, []), window)
        keep = steps >= start
        colour = colours[record.variant]
        ax.plot(steps[keep], values[keep], color=colour, alpha=0.85, marker="o" if name != "train_loss" else None,
                markersize=4)
        mark_stopped(ax, record, steps[keep], values[keep], colour, last)


def trials_legend(fig, ax, records, last: float) -> None:
    """The figure's legend: the variants of `ax`, and the cross of a trial that stopped early."""
    handles, labels = ax.get_legend_handles_labels()
    if any(stopped_early(r, last) for r in records):
        handles, labels = [*handles, stopped_handle()], [*labels, "stopped early or failed"]
    if labels:  # none before any trial logged a step
        fig.legend(handles, labels, loc="outside lower center", ncol=min(len(labels), 6), fontsize=9, frameon=False)


def baseline_line(ax, rows: list[dict], metric: str, baseline: str | None) -> str:
    """The baseline's mean as a dashed line across the axes; returns the words for the title."""
    row = next((r for r in rows if r["variant"] == baseline), None)
    if row is None or math.isnan(row[f"{metric}_mean"]):
        return ""
    ax.axhline(row[f"{metric}_mean"], **BASELINE_STYLE)
    return f"; dashed: the baseline {baseline}"


def unfinished_note(rows: list[dict], shown: str = "×") -> str:
    missing = [r["variant"] for r in rows if r["seeds"] == 0]
    return f"\nno finished trial ({shown}): {', '.join(missing)}" if missing else ""


def plot_metric_by_variant(rows: list[dict], path: Path, metric: str, colours: dict[str, str],
                           baseline: str | None = None, title: str = "") -> Path:
    """Final metric per variant (mean ± std over finished seeds), in the rows' order; a variant
    with no finished trial is a cross on the axis; fewer finished seeds than run are said."""
    plt = pyplot()
    fig, ax = figure(plt, max(6.5, 0.8 * len(rows) + 3), 5.0)
    finite = [r[f"{metric}_mean"] for r in rows if not math.isnan(r[f"{metric}_mean"])]
    low = min(finite) if finite else 0.0
    for x, row in enumerate(rows):
        mean, std, colour = row[f"{metric}_mean"], row[f"{metric}_std"], colours[row["variant"]]
        if math.isnan(mean):
            ax.plot(x, low, marker="X", markersize=10, color=colour, markeredgecolor="black", linestyle="none",
                    label=row["variant"], clip_on=False)
            continue
        ax.errorbar(x, mean, yerr=std, fmt="o", capsize=4, color=colour, label=row["variant"])
        if row["seeds"] < row["trials"]:
            ax.annotate(f"{row['seeds']}/{row['trials']} seeds", (x, mean), xytext=(6, -10),
                        textcoords="offset points", fontsize=7)
    reference = baseline_line(ax, rows, metric, baseline)
    ax.set_xticks(range(len(rows)), [r["variant"] for r in rows], rotation=30, ha="right", fontsize=8)
    ax.set_xlim(-0.6, len(rows) - 0.4)
    ax.set_ylabel(f"final {metric}")
    ax.ticklabel_format(axis="y", useOffset=False)
    ax.grid(alpha=0.3)
    seeds = max((r["trials"] for r in rows), default=0)
    ax.set_title(f"final {metric} by variant, mean ± std over {seeds} seed{'s' if seeds != 1 else ''}"
                 f"{reference}{unfinished_note(rows)}", fontsize=10)
    fig.suptitle(title or f"final {metric}")
    return save_figure(plt, fig, path)


def spread(values: Sequence[float], gap: float) -> list[float]:
    """`values` moved apart as little as needed so that neighbours are at least `gap` apart (order kept)."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    placed = [float(values[i]) for i in order]
    for i in range(1, len(placed)):
        placed[i] = max(placed[i], placed[i - 1] + gap)
    shift = (sum(placed) - sum(values[i] for i in order)) / max(1, len(placed))  # keep them centred
    out = [0.0] * len(values)
    for rank, i in enumerate(order):
        out[i] = placed[rank] - shift
    return out


def parameter_count(value: float, span: float = 0.0) -> str:
    """25.3M, 1.2B: with as many decimals as ticks `span` apart need to read apart."""
    for scale, unit in ((1e9, "B"), (1e6, "M"), (1e3, "K"), (1.0, "")):
        if abs(value) >= scale or scale == 1.0:
            tick = span / 6 / scale if span else 1.0
            decimals = max(0, min(6, math.ceil(-math.log10(tick)))) if tick < 1 else 0
            return f"{value / scale:.{decimals}f}{unit}"
    return f"{value:.0f}"


def plot_metric_vs_params(rows: list[dict], path: Path, metric: str, colours: dict[str, str],
                          baseline: str | None = None, title: str = "") -> Path:
    """Final metric (mean ± std over seeds) against active parameters, one point per variant;
    variants of (nearly) equal size are set side by side and every point is labelled."""
    from matplotlib.ticker import FuncFormatter

    plt = pyplot()
    fig, ax = figure(plt, 8.5, 5.2)
    shown = [r for r in rows if not math.isnan(r[f"{metric}_mean"])]
    xs = [float(r["params_active"]) for r in shown]
    span = (max(xs) - min(xs)) if xs else 0.0
    step = 0.03 * (span or max(xs, default=1.0))
    groups: dict[int, list[int]] = {}  # variants within 0.5% of each other's size share a slot
    for i, x in enumerate(xs):
        key = next((k for k in groups if abs(xs[groups[k][0]] - x) <= 0.005 * max(x, 1.0)), len(groups))
        groups.setdefault(key, []).append(i)
    placed = list(xs)
    for members in groups.values():
        for rank, i in enumerate(members):
            placed[i] = xs[i] + (rank - (len(members) - 1) / 2) * step
    means = [r[f"{metric}_mean"] for r in shown]
    height = (max(means) - min(means)) if means else 0.0
    labels_y = spread(means, 0.06 * (height or abs(means[0]) * 0.01 or 1.0)) if means else []
    for row, x, y, label_y in zip(shown, placed, means, labels_y):
        colour = colours[row["variant"]]
        ax.errorbar(x, y, yerr=row[f"{metric}_std"], fmt="o", capsize=3, color=colour, label=row["variant"])
        ax.annotate(row["variant"], (x, y), xytext=(x + 0.35 * step, label_y), textcoords="data", fontsize=7,
                    va="center", arrowprops={"arrowstyle": "-", "color": colour, "linewidth": 0.6})
    reference = baseline_line(ax, rows, metric, baseline)
    ax.xaxis.set_major_formatter(FuncFormatter(lambda value, _position: parameter_count(value, span)))
    ax.ticklabel_format(axis="y", useOffset=False)
    if xs:
        ax.set_xlim(min(placed) - 2 * step, max(placed) + 6 * step)
    ax.set_xlabel("active parameters per token" + (" (variants of equal size side by side)" if
                                                   any(len(m) > 1 for m in groups.values()) else ""))
    ax.set_ylabel(f"final {metric}")
    ax.grid(alpha=0.3)
    ax.set_title(f"final {metric} (mean ± std over seeds) against active parameters{reference}"
                 f"{unfinished_note(rows, 'not drawn')}", fontsize=10)
    fig.suptitle(title or f"final {metric}")
    return save_figure(plt, fig, path)


def plot_paired_differences(comparisons, path: Path, metric: str, mode: str, colours: dict[str, str] | None = None,
                            title: str = "", interval: str = "family-wise 95% interval") -> Path:
    """Each variant's mean paired difference from the baseline with its `interval`, one row per
    variant (labels side by side never overlap); a hollow marker without a bar where one pair gives
    no interval, a cross on 0 where there is no pair (no trial finished with the baseline's seed)."""
    plt = pyplot()
    fig, ax = figure(plt, 9.0, max(3.0, 0.45 * len(comparisons) + 1.8))
    rows = list(range(len(comparisons)))[::-1]  # the first variant on top
    for y, c in zip(rows, comparisons):
        colour = (colours or {}).get(c.variant, "C0")
        if c.mean_diff is None:
            ax.plot([0.0], [y], marker="X", markersize=10, color=colour, markeredgecolor="black", linestyle="none")
            continue
        error = None if c.half_width is None else [[c.half_width], [c.half_width]]
        ax.errorbar([c.mean_diff], [y], xerr=error, fmt="o", capsize=4, color=colour,
                    markerfacecolor=colour if c.half_width is not None else "none")
    ax.axvline(0.0, **BASELINE_STYLE)
    labels = [f"{c.variant} − {c.baseline}: {c.verdict} ({c.pairs}/{c.seeds} pairs)" for c in comparisons]
    ax.set_yticks(rows, labels, fontsize=8)
    ax.set_ylim(-0.6, len(comparisons) - 0.4)
    baseline = baseline_words(comparisons)
    ax.set_xlabel(f"{metric} − {baseline} ({'lower' if mode == 'min' else 'higher'} is better)")
    ax.ticklabel_format(axis="x", useOffset=False)
    ax.set_title(f"final {metric} minus {baseline} (dashed: 0), paired by seed, with its {interval}"
                 "\nhollow: one pair, no interval; ×: no pair", fontsize=10)
    ax.grid(alpha=0.3)
    fig.suptitle(title or f"final {metric} against {baseline}")
    return save_figure(plt, fig, path)


def baseline_words(comparisons) -> str:
    """What the differences are from: "the baseline NAME's" where every row has that one, else "each
    row's own baseline" (each row's label names it)."""
    names = list(dict.fromkeys(c.baseline for c in comparisons))
    return f"the baseline {names[0]}'s" if len(names) == 1 else "each row's own baseline (named in its label)"


def token_count(value: float, _position=None) -> str:
    """Tokens as 0, 500K, 12M, 1.5B (an axis without matplotlib's 1e7 offset)."""
    for scale, unit in ((1e9, "B"), (1e6, "M"), (1e3, "K")):
        if abs(value) >= scale:
            return f"{value / scale:.3g}{unit}"
    return f"{value:.0f}"


def late_limits(curves: list[dict], share: float = 0.5) -> tuple[float, float] | None:
    """y limits holding 0 and every interval over the last `share` of the tokens trained (the part
    of training the verdict is about), with a margin; None without such rows."""
    end = max((r["tokens"] for r in curves), default=0)
    ends = [(r["relative"] - (r["relative_half_width"] or 0.0), r["relative"] + (r["relative_half_width"] or 0.0))
            for r in curves if r["relative"] is not None and r["tokens"] >= (1 - share) * end]
    if not ends:
        return None
    low, high = min(0.0, *(lo for lo, _ in ends)), max(0.0, *(hi for _, hi in ends))
    margin = 0.08 * ((high - low) or 1.0)
    return low - margin, high + margin


def plot_curve_differences(curves: list[dict], path: Path, metric: str, mode: str, colours: dict,
                           interval: str, title: str = "") -> Path:
    """Difference from the baseline in % of its metric against tokens trained, one line per variant
    with its interval as error bars (variants set slightly apart), y limits from the later half of
    training (earlier points may leave the axes), titled with the sweep."""
    from matplotlib.ticker import FuncFormatter

    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 4.4), layout="constrained")
    variants = list(dict.fromkeys(row["variant"] for row in curves))
    span = (max(r["tokens"] for r in curves) - min(r["tokens"] for r in curves)) if curves else 0
    for i, variant in enumerate(variants):
        rows = [r for r in curves if r["variant"] == variant and r["relative"] is not None]
        if not rows:
            continue
        shift = 0.008 * span * (i - (len(variants) - 1) / 2)
        x = [r["tokens"] + shift for r in rows]
        error = [r["relative_half_width"] if r["relative_half_width"] is not None else 0.0 for r in rows]
        ax.errorbar(x, [r["relative"] for r in rows], yerr=error, color=colours.get(variant, "C0"), marker="o",
                    markersize=4, capsize=2, linewidth=1.4, elinewidth=0.9, label=f"{variant} vs {rows[0]['baseline']}")
    ax.axhline(0.0, color="black", linewidth=0.8)
    limits = late_limits(curves)
    if limits is not None:
        ax.set_ylim(*limits)
    ax.xaxis.set_major_formatter(FuncFormatter(token_count))
    ax.set_xlabel("tokens trained")
    ax.set_ylabel(f"{metric} − baseline, % ({'lower' if mode == 'min' else 'higher'} is better)")
    ax.set_title(f"{metric} against the baseline, paired by seed\n{interval}, pointwise", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="best")
    fig.suptitle(title or f"{metric} against the baseline", fontsize=11)
    return save_figure(plt, fig, path)


def plot_compute_curve(records: list[TrialRecord], multipliers: list[Multiplier], curves: dict[str, dict[str, float]],
                       path: Path, metric: str, colours: dict[str, str], last: int = 1, mode: str = "min",
                       rise: float | None = None, title: str = "") -> Path:
    """The baseline's loss against compute (its seeds' points and the line through their means), each
    variant as a point at its own compute (mean over its seeds), its legend entry its multiplier
    (variants of one compute share an x, so the labels go to the legend)."""
    from matplotlib.ticker import FuncFormatter


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



def plot_report(report, out_dir: Path, colours: dict[str, str], compute: dict | None, title: str) -> list[Path]:
    """Every plot of a `k3lab.report.summary.SweepReport` in `out_dir`; the comparisons' only where
    the report compares, the curve's only with more than the last evaluation."""
    r, metric = report, report.metric
    one = r.baseline or (next(iter(r.pairs.values())) if len(set(r.pairs.values())) == 1 else None)
    files = [plot_loss_curves(r.records, out_dir / "loss_curves.png", metric, colours, one, title, r.curves),
             plot_metric_by_variant(r.rows, out_dir / f"{metric}_by_variant.png", metric, colours, r.baseline, title),
             plot_metric_vs_params(r.rows, out_dir / f"{metric}_vs_params.png", metric, colours, r.baseline, title)]
    if r.comparisons:
        files.append(plot_paired_differences(r.comparisons, out_dir / f"{metric}_vs_baseline.png", metric, r.mode,
                                             colours, title, r.design.interval_name))
    if len({row["step"] for row in r.curves}) > 1:  # the whole curve, when there is more than the end
        files.append(plot_curve_differences(r.curves, out_dir / f"{metric}_curve_vs_baseline.png", metric, r.mode,
                                            colours, r.design.interval_name, title))
    if r.multipliers:
        files.append(plot_compute_curve(r.records, r.multipliers, compute, out_dir / "compute_multiplier.png", metric,
                                        colours, r.last, r.mode, r.rise, title))
    return files
