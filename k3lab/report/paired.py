"""A sweep's comparisons with the baselines of their groups, read from its trial records: the value
each trial is judged by, the family-wise table of a sweep with a seeds policy, and the paired
differences at every evaluation (the whole curve) with their plot.

- The verdict value of a trial is its final metric, or with `metric: {last: N}` the mean of its
  last N evaluations (`trial_value`); only trials that FINISHED count, as in the t-table.
- `comparisons_for` pairs every variant with its own baseline (`Sweep.baselines`: one baseline
  for the whole sweep, or one per group with `baseline: {axis: value}`). With a seeds policy
  (`design`) the intervals are the family-wise repeated t-intervals of `k3lab.report.sequential`;
  for a list of seeds, one look: Bonferroni t-intervals over the family.
- `curve_differences` repeats the comparison at every evaluation step the pairs share
  (difference and interval in % of the baseline's metric at that step, against tokens trained),
  so "helps early, less at the end" shows. Its intervals are those of the verdicts (the
  design's intervals), pointwise in the step: they are not simultaneous over
  the steps, so the verdict is the final metric's, not the best step's.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from pathlib import Path

from rich.table import Table
from rich.text import Text

from k3lab.report.sequential import (BUDGET, FIXED, MAX, RUNNING, SEQUENTIAL_COLUMNS, STOPPED, Design,
                                     comparison_cells, compare_family, compare_sequential, fixed_design,
                                     sequential_headers, sequential_note)
from k3lab.report.markdown import table_lines
from k3lab.report import stats
from k3lab.report.figures import pyplot, save_figure
from k3lab.report.records import TrialRecord


def diverged_step(points: list[tuple[int, float]], mode: str = "min", rise: float | None = None) -> int | None:
    """The first step at which a trial's curve (step, value) is not finite or, with `rise`, more
    than that fraction worse than its own best so far; None: it did not diverge."""
    best = None
    for step, value in sorted(points):
        if not stats.usable(value):
            return step
        if best is not None and rise is not None and (value - best) * (1 if mode == "min" else -1) > rise * abs(best):
            return step
        best = value if best is None else (min(best, value) if mode == "min" else max(best, value))
    return None


def trial_value(record: TrialRecord, metric: str, last: int = 1, mode: str = "min",
                rise: float | None = None) -> float | None:
    """The value a trial is compared by (see the module docstring); None when it has none: not
    FINISHED, diverged (`diverged_step`), or fewer than `last` evaluations."""
    if record.status != "FINISHED" or diverged_step(record.curves.get(metric, []), mode, rise) is not None:
        return None
    if last == 1:
        value = record.value(metric)
        return value if stats.usable(value) else None
    values = [v for _, v in sorted(record.curves.get(metric, []))[-last:]]
    if len(values) < last or not all(stats.usable(v) for v in values):
        return None
    return statistics.fmean(values)


def diverged_trials(records: list[TrialRecord], metric: str, mode: str = "min",
                    rise: float | None = None) -> list[tuple[TrialRecord, int]]:
    """Trials that ended FINISHED but diverged, with the step where they did."""
    found = []
    for record in records:
        step = diverged_step(record.curves.get(metric, []), mode, rise)
        if record.status == "FINISHED" and step is not None:
            found.append((record, step))
    return found


def diverged_lines(records: list[TrialRecord], metric: str, mode: str = "min", rise: float | None = None) -> list[str]:
    """One line per diverged trial: which, where, and how far from its best (for the report)."""
    lines = []
    for record, step in diverged_trials(records, metric, mode, rise):
        points = sorted(record.curves.get(metric, []))
        best = min(v for s, v in points if s < step and stats.usable(v)) if step > points[0][0] else None
        at = dict(points)[step]
        lines.append(f"{record.variant} seed {record.seed}: diverged at step {step} ({metric} {at:.4g}"
                     + (f" after a best of {best:.4g}" if best is not None else "") + "); left out of the pairs")
    return lines


def values_by_seed(records: list[TrialRecord], metric: str, last: int = 1, mode: str = "min",
                   rise: float | None = None) -> dict[str, stats.SeedValues]:
    values: dict[str, stats.SeedValues] = {}
    for record in records:
        values.setdefault(record.variant, {})[record.seed] = trial_value(record, metric, last, mode, rise)
    return values


def comparisons_for(records: list[TrialRecord], baselines: dict[str, str], metric: str, mode: str,
                    design: Design | None = None, last: int = 1, unfinished: str = BUDGET,
                    rise: float | None = None) -> list[stats.Comparison]:
    """Every variant of `baselines` (variant -> its baseline) against its baseline, in that order,
    under `design` (None: one look, Bonferroni t-intervals over the family); `unfinished`: see
    `compare_sequential` (`unfinished_reason` gives it for a stored sweep); `rise`: `diverged_step`."""
    values = values_by_seed(records, metric, last, mode, rise)
    if design is None:
        design = fixed_design(len(baselines), max((len(v) for v in values.values()), default=1))
    if design.looks is not None:  # the family decides together: alpha passes on as comparisons are decided
        return compare_family(values, baselines, mode, design, unfinished)
    return [compare_sequential(variant, values.get(variant, {}), baseline, values.get(baseline, {}), mode, design,
                               unfinished)
            for variant, baseline in baselines.items()]


def unfinished_reason(sweep_state: str, ended: bool) -> str:
    """Why a stored sweep's imprecise comparisons (short of max seeds) have no more seeds: running
    while it runs (`k3lab.store.runs.sweep_state` RUNNING), the budget when its driver reached the
    sweep's end (`ended`: the parent logged `trials_failed`, as it does only there), else stopped
    (Ctrl-C, a part of a preemptible run, a driver that died or failed) before its budget ended."""
    if sweep_state == "RUNNING":
        return RUNNING
    return BUDGET if ended else STOPPED


def seed_difference_lines(records: list[TrialRecord], pairs: dict[str, str], metric: str,
                          last: int = 1, mode: str = "min", rise: float | None = None) -> list[str]:
    """Markdown: each comparison's difference (variant - its baseline) at every seed, so that a
    seed far from the others, which widens the interval most, is seen before the verdict is read."""
    values = values_by_seed(records, metric, last, mode, rise)
    seeds = sorted({seed for by_seed in values.values() for seed in by_seed})
    rows = []
    for variant, baseline in pairs.items():
        mine, theirs = values.get(variant, {}), values.get(baseline, {})
        rows.append([variant, baseline, *(f"{mine[s] - theirs[s]:+.4f}" if stats.usable(mine.get(s))
                                          and stats.usable(theirs.get(s)) else "-" for s in seeds)])
    return [f"{metric} - baseline at each seed (paired; -: no pair):", "",
            *table_lines(["variant", "baseline", *(f"s{seed}" for seed in seeds)], rows)]


def design_record(options: dict, stored_by: str = "sweep") -> dict:
    """`report_options` as the JSON the parent run stores (`k3lab.store.runs.write_design`);
    stored_by: "sweep" (as it started) or "report" (`k3lab report`, for a run that stored none)."""
    design = options["design"]
    return options | {"design": design.to_json() if design is not None else None, "stored_by": stored_by}


def options_from_record(record: dict) -> dict:
    """The stored record back as `build_report` options (`design_record`'s inverse)."""
    names = ("metric", "mode", "baselines", "design", "last", "rise", "variant_order", "compute", "compute_sizes")
    options = {name: record[name] for name in names if name in record}
    order = {name: i for i, name in enumerate(options.get("variant_order") or ())}
    if options.get("baselines"):  # the record is stored with sorted keys: back to the file's order
        options["baselines"] = dict(sorted(options["baselines"].items(),
                                           key=lambda item: order.get(item[0], len(order))))
    if options.get("design") is not None:
        options["design"] = Design.from_json(options["design"])
    return options


# -- the whole curve ------------------------------------------------------------------------------


def tokens_per_step(record: TrialRecord) -> int | None:
    try:
        return int(record.params["train.batch_size"]) * int(record.params["train.seq_len"]) * int(
            record.params.get("train.grad_accum", 1))
    except (KeyError, ValueError):
        return None


def curve_differences(records: list[TrialRecord], baselines: dict[str, str], metric: str,
                      design: Design | None = None, mode: str = "min", rise: float | None = None) -> list[dict]:
    """For every compared variant and every evaluation step its pairs share: {variant, baseline, step,
    tokens, pairs, difference, half_width, relative, relative_half_width} (relative: in % of the
    baseline's mean at that step; half_width None where there is no finite interval). Trials that
    diverged (`diverged_step`) are left out, as from the verdicts."""
    design = design or fixed_design(len(baselines), 1)
    finished = [r for r in records if r.status == "FINISHED"
                and diverged_step(r.curves.get(metric, []), mode, rise) is None]
    curves: dict[str, dict[int, dict[int, float]]] = {}  # variant -> seed -> step -> value
    tokens: dict[int, int] = {}
    for record in finished:
        points = {step: value for step, value in record.curves.get(metric, []) if stats.usable(value)}
        curves.setdefault(record.variant, {})[record.seed] = points
        per_step = tokens_per_step(record)
        for step in points:
            tokens.setdefault(step, step * per_step if per_step else step)
    rows = []
    for variant, baseline in baselines.items():
        mine, theirs = curves.get(variant, {}), curves.get(baseline, {})
        steps = sorted({step for seed in mine.keys() & theirs.keys()
                        for step in mine[seed].keys() & theirs[seed].keys()})
        for step in steps:
            seeds = sorted(s for s in mine.keys() & theirs.keys() if step in mine[s] and step in theirs[s])
            diffs = [mine[s][step] - theirs[s][step] for s in seeds]
            reference = statistics.fmean(theirs[s][step] for s in seeds)
            mean = statistics.fmean(diffs)
            half = design.half_width(diffs)
            half = half if math.isfinite(half) else None
            relative_half = 100 * half / abs(reference) if reference and half is not None else None
            rows.append({"variant": variant, "baseline": baseline, "step": step, "tokens": tokens[step],
                         "pairs": len(seeds), "difference": mean, "half_width": half,
                         "relative": 100 * mean / abs(reference) if reference else None,
                         "relative_half_width": relative_half})
    return rows


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


def curve_cells(row: dict) -> str:
    if row["relative"] is None:
        return "n/a"
    half = f" ± {row['relative_half_width']:.2f}" if row["relative_half_width"] is not None else " (no interval)"
    return f"{row['relative']:+.2f}%{half}"


def curve_grid(curves: list[dict]) -> tuple[list[int], dict[str, dict[int, str]]]:
    """(tokens of every evaluation, {variant: {tokens: cell}}) for the tables."""
    columns = sorted({row["tokens"] for row in curves})
    grid: dict[str, dict[int, str]] = {}
    for row in curves:
        grid.setdefault(f"{row['variant']} vs {row['baseline']}", {})[row["tokens"]] = curve_cells(row)
    return columns, grid


def curve_table(curves: list[dict], title: str) -> Table:
    columns, grid = curve_grid(curves)
    table = Table(title=title)
    table.add_column("variant")
    for tokens in columns:
        table.add_column(f"{tokens:,} tok", justify="right")
    for name, cells in grid.items():
        table.add_row(name, *(cells.get(t, "-") for t in columns))
    return table


def curve_table_lines(curves: list[dict], metric: str, interval: str) -> list[str]:
    columns, grid = curve_grid(curves)
    lines = [f"{metric} against the baseline at every evaluation, in % of the baseline's {metric} "
             f"(mean over the pairs ± the half-width of its {interval}, pointwise), by tokens trained:", "",
             *table_lines(["variant", *(f"{t:,}" for t in columns)],
                          [[name, *(cells.get(t, "-") for t in columns)] for name, cells in grid.items()])]
    return lines


# -- the family-wise table ------------------------------------------------------------------------


def design_columns(design: Design) -> tuple[str, ...]:
    """The columns of a design's table: a fixed list of seeds has no stopping or planning columns,
    and a rule that runs to max seeds no planning one."""
    dropped = {"halfwidth", "stopping", "needed"} if design.rule == FIXED else (
        {"needed"} if design.rule == MAX else set())
    return tuple(c for c in SEQUENTIAL_COLUMNS if c not in dropped)


def columns_of(comparisons: list[stats.Comparison], design: Design) -> tuple[str, ...]:
    """The terminal table's columns: the baseline's only where the groups have baselines of their own."""
    one = len({c.baseline for c in comparisons}) <= 1
    return tuple(c for c in design_columns(design) if not (one and c == "baseline"))


@dataclass(frozen=True)
class ExtraColumn:
    """A column of the comparisons table that another module computes (the compute multiplier,
    `k3lab.report.compute_multipliers.multiplier_column`): its header, its cell per variant ("n/a" where it
    has none), and a note saying what it is."""

    header: str
    cells: dict[str, str]
    note: str

    def cell(self, variant: str) -> str:
        return self.cells.get(variant, "n/a")


def sequential_table(comparisons: list[stats.Comparison], metric: str, design: Design, title: str,
                     extra: ExtraColumn | None = None) -> Table:
    """The comparisons as a rich table; `extra`: one more column, its note under the caption."""
    headers = sequential_headers(metric, design)
    if len({c.baseline for c in comparisons}) == 1:
        headers = headers | {"difference": f"{metric} - {comparisons[0].baseline}"}
    caption = sequential_note(design) + (f"\n{extra.note}" if extra else "")
    table = Table(title=title, caption=caption)
    columns = columns_of(comparisons, design)
    for column in columns:
        table.add_column(headers[column], justify="left" if column in ("variant", "baseline", "verdict", "stopping")
                         else "right", no_wrap=column == "verdict",
                         overflow="fold" if column in ("variant", "baseline") else "ellipsis")  # names whole
    if extra:
        table.add_column(extra.header, justify="right")
    for comparison in comparisons:
        cells = comparison_cells(comparison)
        more = [Text(extra.cell(comparison.variant))] if extra else []  # "[below 1x, ...]" is not markup
        table.add_row(*(cells[column] for column in columns), *more)
    return table


def sequential_table_lines(comparisons: list[stats.Comparison], metric: str, design: Design,
                           extra: ExtraColumn | None = None) -> list[str]:
    headers = sequential_headers(metric, design)
    columns = design_columns(design)
    more_header = [extra.header] if extra else []
    rows = []
    for comparison in comparisons:
        cells = comparison_cells(comparison)
        rows.append([*(cells[c] for c in columns), *([extra.cell(comparison.variant)] if extra else [])])
    lines = [f"Against the baselines, paired by seed ({sequential_note(design)}):", "",
             *table_lines([*(headers[c] for c in columns), *more_header], rows)]
    return lines + (["", extra.note] if extra else [])


def epochs_line(records: list[TrialRecord]) -> str | None:
    """How many passes over its corpus' training split each trial made (their data.epochs params)."""
    epochs = [float(r.params["data.epochs"]) for r in records if "data.epochs" in r.params]
    if not epochs:
        return None
    repeat = " (trials repeated data)" if max(epochs) > 1 else ""
    low, high = f"{min(epochs):.2f}", f"{max(epochs):.2f}"
    spread = low if low == high else f"{low}-{high}"
    return f"Data: each trial trained {spread} epochs of its corpus (data.epochs){repeat}"
