"""Sweep reports read back from the MLflow store: the summary table and the plots.

Everything here reads what the trials logged (params, metric histories, run times),
so the same report can be rebuilt later from the store alone (`k3lab report`).
Variants appear in the sweep file's order (the baseline first), each in one colour
in every plot (`k3lab.report.plots`) and in the MLflow UI.
"""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path
from typing import Iterable, Sequence

from rich.table import Table

from k3lab.report import plots, stats
from k3lab.report.records import TrialRecord
from k3lab.store import runs
from k3lab.store.colours import variant_colours as palette


def load_trials(tracking_uri: str, parent_run_id: str, curves=("train_loss", "val_loss"),
                seed: int | None = None) -> list[TrialRecord]:
    """Every trial run nested under the sweep's parent run (or only those of `seed`), with the named
    metric histories."""
    client = runs.client(tracking_uri)
    records = []
    for run in runs.trial_runs(tracking_uri, parent_run_id):
        if seed is not None and runs.seed_of(run) != seed:
            continue
        raw = {name: client.get_metric_history(run.info.run_id, name) for name in {"train_loss", *curves}}
        histories = {name: sorted((m.step, m.value) for m in raw[name]) for name in curves}
        first_step = min(raw["train_loss"], key=lambda m: m.step, default=None)
        records.append(TrialRecord(
            run_id=run.info.run_id, variant=runs.variant_of(run), seed=runs.seed_of(run), status=run.info.status, params=run.data.params,
            final=dict(run.data.metrics), start_ms=run.info.start_time, end_ms=run.info.end_time,
            curves=histories, first_step_ms=first_step.timestamp if first_step else None, tags=run.data.tags,
        ))
    return sorted(records, key=lambda r: (r.variant, r.seed))


def mean_std(values: list[float]) -> tuple[float, float]:
    values = [v for v in values if v is not None and math.isfinite(v)]
    if not values:
        return float("nan"), float("nan")
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else 0.0


def run_average_tokens_per_s(record: TrialRecord) -> float | None:
    """A trial's tokens/s over its whole run (`avg_tokens_per_s`); runs logged before that
    metric existed give their last window's `tokens_per_s`."""
    average = record.value("avg_tokens_per_s")
    return average if average is not None else record.value("tokens_per_s")


def summarize(records: list[TrialRecord], metric: str = "val_loss") -> list[dict]:
    """One row per variant: metric mean/std over finished seeds, params, active params, tokens/s."""
    rows = []
    for variant in sorted({r.variant for r in records}):
        group = [r for r in records if r.variant == variant]
        finished = [r for r in group if r.status == "FINISHED"]
        mean, std = mean_std([r.value(metric) for r in finished])
        tps, _ = mean_std([run_average_tokens_per_s(r) for r in finished])
        first = group[0].params
        rows.append({
            "variant": variant, "seeds": len(finished), "trials": len(group),
            "statuses": sorted({r.status for r in group}), f"{metric}_mean": mean, f"{metric}_std": std,
            "params_total": int(first.get("params.total", 0)), "params_active": int(first.get("params.active", 0)),
            "tokens_per_s": tps, "tokens": max((r.value("tokens") or 0) for r in group),
            "axes": group[0].axes,
        })
    return rows


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


def print_summary(console, experiment: str, summary: dict) -> None:
    """`build_report`'s summary on a rich console: the per-variant table, the paired comparisons
    against the baselines, then the sweep's hardware use and the report files written."""
    metric = summary["metric"]
    console.print(summary_table(summary["rows"], metric, title=f"{experiment}: final {metric}"))
    if summary.get("comparisons"):
        from k3lab.report.compute_multipliers import multiplier_column
        from k3lab.report.paired import sequential_table

        extra = multiplier_column(summary.get("multipliers", []), summary["design"].interval_name)
        console.print(sequential_table(summary["comparisons"], metric, summary["design"],
                                       title=f"{experiment}: {metric} against the baselines, paired by seed",
                                       extra=extra))
    if summary.get("across"):
        from k3lab.report.across import across_table

        console.print(across_table(summary["across"]["rows"], summary["across"]["sweeps"], metric,
                                   title=f"{experiment}: {metric} against the baselines, per sweep and pooled"))
    if summary.get("factorial"):
        from k3lab.report.factorial import factorial_table

        console.print(factorial_table(summary["factorial"], summary["factorial_design"], metric,
                                      title=f"{experiment}: main effects and interactions of the axes"))
    for line in summary.get("diverged", []):
        console.print(f"diverged: {line}", markup=False, highlight=False)
    if summary.get("size_multipliers"):
        from k3lab.report.compute_multipliers import size_multiplier_table

        console.print(size_multiplier_table(summary["size_multipliers"], summary["compute_sizes"],
                                            summary["design"].interval_name))
    if len({row["step"] for row in summary.get("curves", [])}) > 1:
        from k3lab.report.paired import curve_table

        console.print(curve_table(summary["curves"], f"{experiment}: {metric} - baseline at every evaluation, "
                                                     "% of the baseline's"))
    if summary.get("efficiency"):
        from k3lab.report.efficiency import efficiency_line

        console.print(efficiency_line(summary["efficiency"]), soft_wrap=True)  # one line, whatever the width
    for path in summary["files"]:
        console.print(f"wrote {path}")


def file_order(names: Iterable[str], variant_order: Sequence[str]) -> list[str]:
    """`names` in the sweep file's order; names the file does not list (any more) come last, sorted."""
    position = {name: i for i, name in enumerate(variant_order)}
    return sorted(set(names), key=lambda name: (position.get(name, len(position)), name))


def variant_colours(variants: Sequence[str], variant_order: Sequence[str] = ()) -> dict[str, str]:
    """One colour per variant, the same in every plot and in the MLflow UI (the trials'
    `mlflow.runColor`): by the variant's place in the sweep file (`variant_order`), then the others."""
    return palette(file_order({*variant_order, *variants}, variant_order))


def build_report(tracking_uri: str, parent_run_id: str, metric: str = "val_loss", mode: str = "min",
                 out_dir: Path | None = None, baseline: str | None = None,
                 variant_order: Sequence[str] = (), baselines: dict[str, str] | None = None, design=None,
                 last: int = 1, unfinished: str | None = None, rise: float | None = None,
                 record: bool = True, compute: dict[str, dict[str, float]] | None = None,
                 compute_sizes: dict | None = None) -> dict:
    """Summary rows, the comparisons with the baselines, and plot and JSON files in out_dir; returns
    {"rows", "records", "files", "metric", "baseline", "comparisons", "design", "curves", "pairs"
    (variant -> the baseline it is compared with), "last", "diverged" (one line per diverged trial),
    "multipliers" (`k3lab.report.compute_multipliers.Multiplier`s, with compute curves), "size_multipliers"
    (across model sizes), "compute_sizes", "factorial" (`k3lab.report.factorial.Effect`s of a multi-axis
    grid), "factorial_design" (their intervals' design) and "variant_order"}.

    variant_order: the variant names as the sweep file lists them; rows, legends and colours follow it.
    baselines (variant -> its group's baseline; default: every variant against `baseline`), design
    (`k3lab.report.sequential.Design`; default: one look, Bonferroni t over the family), last
    (verdicts on the mean of the last N evaluations), rise (the divergence rule): see
    `k3lab.report.paired`; compute: the baselines' compute curves (baseline -> {its stretched copy:
    multiple}) and compute_sizes (families over a size axis, `k3lab.registry.compute_curves.size_families`),
    for the compute multipliers (`k3lab.report.compute_multipliers`); unfinished: why a comparison its rule did
    not stop has no more seeds (default: read from the store); record: write the verdicts into the store for the MLflow UI
    (`k3lab.report.ui_verdicts`)."""
    from k3lab.report import paired

    records = load_trials(tracking_uri, parent_run_id, curves=("train_loss", metric))
    order = file_order((r.variant for r in records), variant_order)
    records.sort(key=lambda r: (order.index(r.variant), r.seed))
    rows = sorted(summarize(records, metric), key=lambda row: order.index(row["variant"]))
    pairs = baselines or ({v: baseline for v in order if v != baseline} if baseline else {})
    if pairs and design is None:
        design = paired.fixed_design(len(pairs), max((row["trials"] for row in rows), default=1))
    comparisons = []
    if pairs:
        unfinished = unfinished or stored_unfinished_reason(tracking_uri, parent_run_id)
        comparisons = paired.comparisons_for(records, pairs, metric, mode, design, last, unfinished, rise)
    multipliers = []
    if pairs and compute:
        from k3lab.report.compute_multipliers import compute_multipliers

        multipliers = compute_multipliers(records, pairs, compute, metric, design, last, mode, rise)
    size_multipliers = []
    if pairs and compute_sizes:
        from k3lab.report.compute_multipliers import size_multipliers as across_sizes

        size_multipliers = across_sizes(records, compute_sizes, metric, design, last, mode, rise)
    add_paired_columns(rows, comparisons, pairs, multipliers)
    curves = paired.curve_differences(records, pairs, metric, design, mode, rise) if pairs else []
    from k3lab.report.factorial import factorial_effects

    effects, effect_design = factorial_effects(records, metric, order, pairs, design, mode, last, rise)
    files = []
    if out_dir is not None and records:
        out_dir.mkdir(parents=True, exist_ok=True)
        colours = variant_colours(order, variant_order)
        title = experiment_title(tracking_uri, parent_run_id)
        one = baseline or (next(iter(pairs.values())) if len(set(pairs.values())) == 1 else None)
        files.append(plots.plot_loss_curves(records, out_dir / "loss_curves.png", metric, colours, one, title,
                                            curves))
        files.append(plots.plot_metric_by_variant(rows, out_dir / f"{metric}_by_variant.png", metric, colours,
                                                  baseline, title))
        files.append(plots.plot_metric_vs_params(rows, out_dir / f"{metric}_vs_params.png", metric, colours,
                                                 baseline, title))
        if comparisons:
            files.append(plots.plot_paired_differences(comparisons, out_dir / f"{metric}_vs_baseline.png", metric,
                                                       mode, colours, title, design.interval_name))
        if len({row["step"] for row in curves}) > 1:  # the whole curve, when there is more than the end
            files.append(paired.plot_curve_differences(curves, out_dir / f"{metric}_curve_vs_baseline.png", metric,
                                                       mode, colours, design.interval_name, title))
        if multipliers:
            from k3lab.report.compute_multipliers import plot_compute_curve

            files.append(plot_compute_curve(records, multipliers, compute, out_dir / "compute_multiplier.png", metric,
                                            colours, last, mode, rise, title))
        summary_path = out_dir / "summary.json"
        document = {"design": design.to_json() if design else None, "variants": rows}
        if effects:
            document["factorial"] = {"design": effect_design.to_json(), "effects": [e.to_json() for e in effects]}
        if size_multipliers:
            document["compute_across_sizes"] = [m.to_json() for m in size_multipliers]
        summary_path.write_text(json.dumps(document, indent=2, default=str))
        files.append(summary_path)
    summary = {"rows": rows, "records": records, "files": files, "metric": metric, "baseline": baseline,
               "comparisons": comparisons, "design": design, "curves": curves, "pairs": pairs, "last": last,
               "mode": mode, "rise": rise, "diverged": paired.diverged_lines(records, metric, mode, rise),
               "multipliers": multipliers, "size_multipliers": size_multipliers, "compute_sizes": compute_sizes,
               "factorial": effects, "factorial_design": effect_design, "variant_order": list(variant_order)}
    if record and records:
        record_in_store(tracking_uri, parent_run_id, summary)
    return summary


def record_in_store(tracking_uri: str, parent_run_id: str, summary: dict) -> None:
    """`k3lab.report.ui_verdicts.record_verdicts`; a store that cannot be written still gets its report."""
    from mlflow.exceptions import MlflowException

    from k3lab.report.ui_verdicts import record_verdicts

    try:
        record_verdicts(tracking_uri, parent_run_id, summary)
    except (MlflowException, OSError) as error:
        print(f"the verdicts were not written into the store: {error}")


def stored_options(tracking_uri: str, parent_run_id: str) -> dict | None:
    """`build_report`'s options as the sweep stored them with its parent run (metric, baselines,
    design, ...: `k3lab.report.paired.design_record`); None for a store from before they were."""
    from k3lab.report import paired

    record = runs.read_design(tracking_uri, runs.client(tracking_uri).get_run(parent_run_id))
    return paired.options_from_record(record) if record is not None else None


def stored_unfinished_reason(tracking_uri: str, parent_run_id: str) -> str:
    """`paired.unfinished_reason` for a sweep in the store."""
    from k3lab.report import paired

    parent = runs.client(tracking_uri).get_run(parent_run_id)
    state = runs.sweep_state(parent, runs.trial_runs(tracking_uri, parent_run_id))
    return paired.unfinished_reason(state, ended="trials_failed" in parent.data.metrics)


def experiment_title(tracking_uri: str, parent_run_id: str) -> str:
    """The plots' title: the sweep's experiment (e.g. attnres_block-gpu)."""
    client = runs.client(tracking_uri)
    return client.get_experiment(client.get_run(parent_run_id).info.experiment_id).name


def add_paired_columns(rows: list[dict], comparisons: list[stats.Comparison], pairs: dict[str, str],
                       multipliers: Sequence = ()) -> None:
    """Each row gets "baseline" (the variant it is compared against, None for a baseline), "paired"
    (its comparison) and, with a compute curve, "compute_multiplier", so summary.json carries them too."""
    by_variant = {c.variant: c.to_json() for c in comparisons}
    multiplier = {m.variant: m.to_json() for m in multipliers}
    for row in rows:
        row["baseline"] = pairs.get(row["variant"])
        row["paired"] = by_variant.get(row["variant"])
        if row["variant"] in multiplier:
            row["compute_multiplier"] = multiplier[row["variant"]]
