"""Sweep reports read back from the MLflow store: the per-variant rows, the comparisons, the files.

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
from typing import Sequence

import attrs

from k3lab.report import paired, plots, stats
from k3lab.report.compute_multipliers import Multiplier
from k3lab.report.factorial import Effect
from k3lab.report.options import ReportOptions, from_record
from k3lab.report.records import TrialRecord
from k3lab.report.sequential import Design
from k3lab.report.stats import Comparison
from k3lab.store import runs
from k3lab.store.colours import colours_in_file_order, file_order


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


@attrs.frozen
class SweepReport:
    """A sweep's report, read back from its store (`build_report`): the per-variant rows and the
    trial records they summarise, the comparisons with the baselines under their design, the
    differences at every evaluation, the diverged trials, the compute multipliers, the factorial
    effects, and the files written. `across` (the comparisons pooled with other stores' sweeps,
    `k3lab report --also`) and `efficiency` (the sweep's hardware use, at its end) are added by
    those who compute them (`attrs.evolve`)."""

    metric: str
    mode: str
    records: list[TrialRecord]
    rows: list[dict]  # `summarize`'s, with each variant's baseline and comparison (`add_paired_columns`)
    baseline: str | None = None
    pairs: dict[str, str] = attrs.Factory(dict)  # variant -> the baseline it is compared with
    design: Design | None = None
    last: int = 1  # verdicts on the mean of the last N evaluations
    rise: float | None = None  # the divergence rule
    comparisons: list[Comparison] = attrs.Factory(list)
    curves: list[dict] = attrs.Factory(list)  # `k3lab.report.paired.curve_differences`
    diverged: list[str] = attrs.Factory(list)  # one line per diverged trial
    multipliers: list[Multiplier] = attrs.Factory(list)  # with compute curves
    size_multipliers: list[Multiplier] = attrs.Factory(list)  # across model sizes, over `compute_sizes`
    compute_sizes: dict | None = None
    factorial: list[Effect] = attrs.Factory(list)  # the effects of a multi-axis grid
    factorial_design: Design | None = None  # their intervals' design
    variant_order: list[str] = attrs.Factory(list)  # the sweep file's order: colours and labels follow it
    files: list[Path] = attrs.Factory(list)
    across: dict | None = None
    efficiency: dict | None = None

    def to_json(self) -> dict:
        """summary.json: the design, the variants' rows, the factorial effects and the multipliers across sizes."""
        document = {"design": self.design.to_json() if self.design else None, "variants": self.rows}
        if self.factorial:
            document["factorial"] = {"design": self.factorial_design.to_json(),
                                     "effects": [e.to_json() for e in self.factorial]}
        if self.size_multipliers:
            document["compute_across_sizes"] = [m.to_json() for m in self.size_multipliers]
        return document


def build_report(tracking_uri: str, parent_run_id: str, options: ReportOptions | None = None,
                 out_dir: Path | None = None, unfinished: str | None = None, record: bool = True) -> SweepReport:
    """The sweep's `SweepReport` as `options` ask (default: val_loss, no comparisons), its plots and
    summary.json written in out_dir (when given), its verdicts written into the store for the MLflow
    UI (`record`, `k3lab.report.ui_verdicts`). unfinished: why a comparison its rule did not stop
    has no more seeds (default: read from the store)."""
    options = options or ReportOptions()
    records = load_trials(tracking_uri, parent_run_id, curves=("train_loss", options.metric))
    order = file_order((r.variant for r in records), options.variant_order)
    records.sort(key=lambda r: (order.index(r.variant), r.seed))
    rows = sorted(summarize(records, options.metric), key=lambda row: order.index(row["variant"]))
    pairs, design = options.pairs(order), options.design
    if pairs and design is None:
        design = paired.fixed_design(len(pairs), max((row["trials"] for row in rows), default=1))
    if pairs:
        unfinished = unfinished or stored_unfinished_reason(tracking_uri, parent_run_id)
    o = options
    report = SweepReport(o.metric, o.mode, records, rows, o.baseline, pairs, design, o.last, o.rise,
                         diverged=paired.diverged_lines(records, o.metric, o.mode, o.rise),
                         compute_sizes=o.compute_sizes, variant_order=list(o.variant_order))
    report = attrs.evolve(report, **compared(report, order, unfinished, options.compute))
    add_paired_columns(rows, report.comparisons, pairs, report.multipliers)
    if out_dir is not None and records:
        colours = colours_in_file_order(order, options.variant_order)
        report = attrs.evolve(report, files=write_report_files(report, out_dir, colours, options.compute,
                                                               experiment_title(tracking_uri, parent_run_id)))
    if record and records:
        record_in_store(tracking_uri, parent_run_id, report)
    return report


def compared(report: SweepReport, order: list[str], unfinished: str | None, compute: dict | None) -> dict:
    """The report's comparisons with its baselines (none without baselines), at the end and at every
    evaluation, its compute multipliers (with compute curves, and across model sizes) and its factorial
    effects: `SweepReport` fields by name."""
    from k3lab.report.compute_multipliers import compute_multipliers, size_multipliers
    from k3lab.report.factorial import factorial_effects

    r = report
    fields = {}
    if r.pairs:
        fields["comparisons"] = paired.comparisons_for(r.records, r.pairs, r.metric, r.mode, r.design, r.last,
                                                       unfinished, r.rise)
        fields["curves"] = paired.curve_differences(r.records, r.pairs, r.metric, r.design, r.mode, r.rise)
    if r.pairs and compute:
        fields["multipliers"] = compute_multipliers(r.records, r.pairs, compute, r.metric, r.design, r.last,
                                                    r.mode, r.rise)
    if r.pairs and r.compute_sizes:
        fields["size_multipliers"] = size_multipliers(r.records, r.compute_sizes, r.metric, r.design, r.last,
                                                      r.mode, r.rise)
    fields["factorial"], fields["factorial_design"] = factorial_effects(r.records, r.metric, order, r.pairs,
                                                                        r.design, r.mode, r.last, r.rise)
    return fields


def write_report_files(report: SweepReport, out_dir: Path, colours: dict[str, str], compute: dict | None,
                       title: str) -> list[Path]:
    """The report's plots (`k3lab.report.plots.plot_report`) and summary.json in `out_dir`."""
    out_dir.mkdir(parents=True, exist_ok=True)
    files = plots.plot_report(report, out_dir, colours, compute, title)
    summary_path = out_dir / "summary.json"
    summary_path.write_text(json.dumps(report.to_json(), indent=2, default=str))
    return [*files, summary_path]


def record_in_store(tracking_uri: str, parent_run_id: str, report: SweepReport) -> None:
    """`k3lab.report.ui_verdicts.record_verdicts`; a store that cannot be written still gets its report."""
    from mlflow.exceptions import MlflowException

    from k3lab.report.ui_verdicts import record_verdicts

    try:
        record_verdicts(tracking_uri, parent_run_id, report)
    except (MlflowException, OSError) as error:
        print(f"the verdicts were not written into the store: {error}")


def stored_options(tracking_uri: str, parent_run_id: str) -> ReportOptions | None:
    """`build_report`'s options as the sweep stored them with its parent run (`ReportOptions.to_record`);
    None for a store from before they were."""
    record = runs.read_design(tracking_uri, runs.client(tracking_uri).get_run(parent_run_id))
    return from_record(record) if record is not None else None


def stored_unfinished_reason(tracking_uri: str, parent_run_id: str) -> str:
    """`paired.unfinished_reason` for a sweep in the store."""
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
