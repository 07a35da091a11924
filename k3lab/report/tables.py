"""The report's tables, for the terminal (rich) and for markdown: the per-variant summary, the comparisons
with the baselines (the family-wise table, the curve at every evaluation, each seed's difference), the
factorial effects, the comparisons across sweeps and the compute multipliers. The numbers are the
statistics modules' (`k3lab.report.stats`, `sequential`, `paired`, `factorial`, `across`,
`compute_multipliers`); this module only lays them out.
"""

from __future__ import annotations

import math

import attrs
from rich.table import Table
from rich.text import Text

from k3lab.report import stats
from k3lab.report.across import POOLED, Sweep
from k3lab.report.compute_multipliers import Multiplier
from k3lab.report.factorial import Effect
from k3lab.report.markdown import table_lines
from k3lab.report.paired import values_by_seed
from k3lab.report.records import TrialRecord
from k3lab.report.sequential import NEEDED_CAP, Design
from k3lab.report.stop_rule import DECIDED, FIXED, HALFWIDTH, MAX, PRECISE
from k3lab.report.stats import Comparison


def t_cells(c: Comparison) -> dict[str, str]:
    """The text of one row of a paired table: pairs, mean difference, interval, relative, verdict."""
    def number(x: float | None) -> str:
        return "n/a" if x is None else f"{x:+.4f}"

    interval = f"[{number(c.low)}, {number(c.high)}]" if c.half_width is not None else "n/a"
    relative = "n/a" if c.relative is None else f"{100 * c.relative:+.2f}%"
    outcome = c.verdict + (f" ({c.reason})" if c.reason else "")
    return {"variant": c.variant, "pairs": f"{c.pairs}/{c.seeds}", "difference": number(c.mean_diff),
            "interval": interval, "relative": relative, "verdict": outcome}


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


def comparison_cells(c: Comparison) -> dict[str, str]:
    """The text of one row of a design's table (the t-table's cells plus baseline, half-width
    relative to the baseline, stopping reason, pairs the rule would take)."""
    cells = t_cells(c)
    relative = getattr(c, "relative_half_width", None)
    cells["baseline"] = c.baseline
    cells["halfwidth"] = "n/a" if relative is None else f"{100 * relative:.2f}%"
    cells["stopping"] = getattr(c, "stopping", "") or "-"
    cells["needed"] = needed_cell(c)
    return cells


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


@attrs.frozen
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


def epochs_line(records: list[TrialRecord]) -> str | None:
    """How many passes over its corpus' training split each trial made (their data.epochs params)."""
    epochs = [float(r.params["data.epochs"]) for r in records if "data.epochs" in r.params]
    if not epochs:
        return None
    repeat = " (trials repeated data)" if max(epochs) > 1 else ""
    low, high = f"{min(epochs):.2f}", f"{max(epochs):.2f}"
    spread = low if low == high else f"{low}-{high}"
    return f"Data: each trial trained {spread} epochs of its corpus (data.epochs){repeat}"


EFFECT_HEADERS = ("effect", "levels", "seeds", "difference", "interval", "vs reference", "verdict")


def effect_cells(e: Effect) -> list[str]:
    def pct(value, spread):
        return "-" if value is None else f"{value:+.2f}%" + ("" if spread is None else f" ± {spread:.2f}%")

    difference = "-" if e.difference is None else f"{e.difference:+.4f}"
    interval = "-" if e.half_width is None else f"± {e.half_width:.4f}"
    return [e.kind, e.label, str(e.pairs), difference, interval, pct(e.relative, e.relative_half_width), e.verdict]


def factorial_note(design: Design, metric: str) -> str:
    return (f"{metric}: each axis's main effect and each two-way interaction against the reference levels, "
            f"paired by seed; {design.label}")


def factorial_table(effects: list[Effect], design: Design, metric: str, title: str) -> Table:
    table = Table(title=title, caption=factorial_note(design, metric))
    for header in EFFECT_HEADERS:
        table.add_column(header, justify="right" if header in ("seeds", "difference", "interval") else "left")
    for e in effects:
        table.add_row(*effect_cells(e))
    return table


def factorial_lines(effects: list[Effect], design: Design, metric: str) -> list[str]:
    """Markdown for results.md."""
    return [f"Main effects and interactions ({factorial_note(design, metric)}):", "",
            *table_lines(list(EFFECT_HEADERS), [effect_cells(e) for e in effects])]


ACROSS_HEADERS = ("variant", "baseline", "sweep", "pairs", "difference", "vs baseline", "verdict")


def across_cells(label: str, c: stats.Comparison) -> list[str]:
    relative = c.relative
    half = None if c.half_width is None or not c.baseline_mean else c.half_width / abs(c.baseline_mean)
    difference = "-" if c.mean_diff is None else f"{c.mean_diff:+.4f}"
    percent = "-" if relative is None else (f"{100 * relative:+.2f}%"
                                            + ("" if half is None else f" ± {100 * half:.2f}%"))
    return [label, str(c.pairs), difference, percent, c.verdict]


def across_note(sweeps: list[Sweep], rows: list[dict]) -> str:
    how = rows[0]["pooled_design"] if rows else "no comparisons"
    return (f"each sweep under its design; {POOLED}: one pair per distinct seed (its differences in the "
            f"{len(sweeps)} sweeps averaged), {how}")


def across_table(rows: list[dict], sweeps: list[Sweep], metric: str, title: str) -> Table:
    table = Table(title=title, caption=across_note(sweeps, rows))
    for header in ACROSS_HEADERS:
        table.add_column(header, justify="right" if header in ("pairs", "difference") else "left")
    for row in rows:
        for label, comparison in [*row["by_sweep"], (POOLED, row["pooled"])]:
            table.add_row(row["variant"], row["baseline"], *across_cells(label, comparison),
                          end_section=label == POOLED)
    return table


def across_lines(rows: list[dict], sweeps: list[Sweep], metric: str) -> list[str]:
    cells_of = [[row["variant"], row["baseline"], *across_cells(label, comparison)]
                for row in rows for label, comparison in [*row["by_sweep"], (POOLED, row["pooled"])]]
    return [f"{metric} against the baselines in {len(sweeps)} sweeps ({across_note(sweeps, rows)}):", "",
            *table_lines(list(ACROSS_HEADERS), cells_of)]


def multiplier_column(multipliers: list[Multiplier], interval: str) -> ExtraColumn | None:
    """The comparisons table's compute multiplier column (None without multipliers)."""
    if not multipliers:
        return None
    return ExtraColumn("compute multiplier", {m.variant: m.cells for m in multipliers},
                       multiplier_note(multipliers, interval))


def multiplier_note(multipliers: list[Multiplier], interval: str) -> str:
    """What the column says, in one sentence for the report."""
    return (f"Compute multiplier: the baseline's compute ({multipliers[0].basis}) that reaches the variant's loss, "
            f"over the variant's own compute (FLOPs per token x tokens); geometric mean over the seeds with the "
            f"{interval}, clipped to the curve's ends; seeds whose curve does not reach the variant's loss are "
            f"counted as beyond or below its ends, not averaged; time: the same with GPU-seconds (tokens over the "
            f"trials' measured tokens/s) for compute; >1: the variant is worth more than it costs.")


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


RUN_AVERAGE_TPS = "tokens/s (run average)"  # tokens trained / time training (the live table: the last window)


def summary_table(rows: list[dict], metric: str = "val_loss", title: str = "sweep summary") -> Table:
    table = Table(title=title)
    for column in ("variant", "seeds", metric, "params", "active", RUN_AVERAGE_TPS, "status"):
        table.add_column(column, justify="left" if column in ("variant", "status") else "right")
    for row in rows:
        mean, std = row[f"{metric}_mean"], row[f"{metric}_std"]
        table.add_row(row["variant"], f"{row['seeds']}/{row['trials']}",
                      "-" if math.isnan(mean) else f"{mean:.4f}" + (f" ± {std:.4f}" if row["seeds"] > 1 else ""),
                      f"{row['params_total']:,}", f"{row['params_active']:,}",
                      "-" if math.isnan(row["tokens_per_s"]) else f"{row['tokens_per_s']:,.0f}",
                      ",".join(row["statuses"]))
    return table


LOG_COLUMNS = 200  # a summary table's width where no terminal limits it


def wide_console(**options):
    """A console for summary tables, at least 120 columns on a terminal and `LOG_COLUMNS` in a log or
    pipe, so tables keep whole names and numbers there; it never wraps a line of text (a printed
    command must stay one line to copy, also in a file)."""
    import shutil
    import sys

    from rich.console import Console

    columns = shutil.get_terminal_size().columns if sys.stdout.isatty() else LOG_COLUMNS
    return Console(width=max(120, columns), soft_wrap=True, **options)


def print_summary(console, experiment: str, report) -> None:
    """A `k3lab.report.summary.SweepReport` on a rich console: the per-variant table, the paired
    comparisons against the baselines, then the sweep's hardware use and the report files written."""
    r, metric = report, report.metric
    console.print(summary_table(r.rows, metric, title=f"{experiment}: final {metric}"))
    if r.comparisons:
        console.print(sequential_table(r.comparisons, metric, r.design,
                                       title=f"{experiment}: {metric} against the baselines, paired by seed",
                                       extra=multiplier_column(r.multipliers, r.design.interval_name)))
    if r.across:
        console.print(across_table(r.across["rows"], r.across["sweeps"], metric,
                                   title=f"{experiment}: {metric} against the baselines, per sweep and pooled"))
    if r.factorial:
        console.print(factorial_table(r.factorial, r.factorial_design, metric,
                                      title=f"{experiment}: main effects and interactions of the axes"))
    for line in r.diverged:
        console.print(f"diverged: {line}", markup=False, highlight=False)
    if r.size_multipliers:
        console.print(size_multiplier_table(r.size_multipliers, r.compute_sizes, r.design.interval_name))
    if len({row["step"] for row in r.curves}) > 1:
        console.print(curve_table(r.curves, f"{experiment}: {metric} - baseline at every evaluation, "
                                            "% of the baseline's"))
    if r.efficiency:
        from k3lab.report.efficiency import efficiency_line

        console.print(efficiency_line(r.efficiency), soft_wrap=True)  # one line, whatever the width
    for path in r.files:
        console.print(f"wrote {path}")
