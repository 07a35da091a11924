"""A sweep's results as markdown, from its MLflow store and (optionally) a GPU utilisation log.

    k3lab report experiments/attnres_block.yaml --profile gpu --markdown docs/results.md \
        --gpu-log gpu_util.csv

writes the sweep's section of docs/results.md (replaced whole on the next write): the commands that
ran it (recorded on its parent run), date, machine (the trials' k3lab.device tags), tokens per trial,
the sweep's totals (sweep_* metrics of the parent run, "n/a" where not logged; from the trials
when the sweep's driver stopped before it logged them), the per-variant
table, the seed-paired table against the baseline (`k3lab.report.stats`), timing, and the plots,
copied to docs/results/<experiment>/.

The GPU log has one `epoch_seconds,utilization_percent` line per sample, e.g. from
    nvidia-smi --query-gpu=utilization.gpu --format=csv,noheader,nounits -lms 500 |
        while read u; do echo "$(date +%s.%N),$u"; done
GPU-busy time is the sum of utilisation x sample interval; it is reported over the sweep's
wall time and over the part after the first trial's start-up (from the first optimizer
step any trial finished).
"""

from __future__ import annotations

import collections
import math
import shutil
import statistics
from datetime import datetime, timezone
from pathlib import Path

import attrs

from k3lab.errors import UserError
from k3lab.report.efficiency import parts_note, sweep_efficiency, wall_to_the_end
from k3lab.report.records import TrialRecord
from k3lab.report.summary import SweepReport, mean_std
from k3lab.report.tables import (across_lines, curve_table_lines, epochs_line, factorial_lines, multiplier_column,
                                 seed_difference_lines, sequential_table_lines, size_multiplier_lines)
from k3lab.store import runs
from k3lab.store.tracking import BUILD_PARTS

GPU_LOG_LINE = "epoch_seconds,percent"  # a GPU log's sample: see the module docstring


def read_gpu_log(path: str | Path) -> list[tuple[float, float]]:
    """[(epoch seconds, utilisation %)], sorted; blank lines are skipped. Any other line that is
    not a sample, and a log without one, is a one-line error (such lines were skipped, so the log of
    another program gave "n/a%", and 500% counted five times)."""
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        raise UserError(f"--gpu-log {path}: no such file") from None
    except (OSError, UnicodeDecodeError) as error:
        raise UserError(f"--gpu-log {path}: cannot be read as text ({error})") from None
    samples = [gpu_sample(line, path, number) for number, line in enumerate(lines, 1) if line.strip()]
    if not samples:
        raise UserError(f"--gpu-log {path}: no samples in it (expected {GPU_LOG_LINE} lines)")
    return sorted(samples)


def gpu_sample(line: str, path: str | Path, number: int) -> tuple[float, float]:
    """One line of a GPU log as (epoch seconds, utilisation %): two numbers, the second 0 to 100."""
    where = f"--gpu-log {path}, line {number}"
    try:
        t, u = map(float, line.split(","))
    except ValueError:
        raise UserError(f"{where}: expected {GPU_LOG_LINE} (e.g. 1733356800.25,87), got {line.strip()!r}") from None
    if not math.isfinite(t):
        raise UserError(f"{where}: the time {line.split(',')[0].strip()} is not a number of epoch seconds")
    if not 0 <= u <= 100:
        raise UserError(f"{where}: utilisation {u:g} is not a percentage (0 to 100)")
    return t, u


def busy_fraction(samples: list[tuple[float, float]], start: float, end: float) -> float | None:
    """GPU-busy seconds / wall seconds over [start, end], from utilisation samples."""
    inside = [(t, u) for t, u in samples if start <= t <= end]
    if len(inside) < 2 or end <= start:
        return None
    busy = sum(u / 100 * (t1 - t0) for (t0, u), (t1, _) in zip(inside, inside[1:]))
    return busy / (inside[-1][0] - inside[0][0])


def first_step_time(records: list[TrialRecord]) -> float | None:
    """Epoch seconds of the earliest logged optimizer step of any trial."""
    times = [r.first_step_ms / 1000 for r in records if r.first_step_ms]
    return min(times) if times else None


def fmt(value: float | None, spec: str) -> str:
    return "n/a" if value is None or (isinstance(value, float) and math.isnan(value)) else format(value, spec)


@attrs.define
class ParentRecord:
    """The sweep's parent run: when it ran, its params (train.*), metrics (sweep_*) and tags."""

    run_id: str
    start_ms: int | None
    end_ms: int | None
    params: dict
    metrics: dict
    tags: dict
    state: str = ""  # runs.sweep_state: FINISHED, FAILED, KILLED, RUNNING or interrupted


def load_parent(tracking_uri: str, parent_run_id: str) -> ParentRecord:
    run = runs.get_run(tracking_uri, parent_run_id)
    state = runs.sweep_state(run, runs.trial_runs(tracking_uri, parent_run_id))
    return ParentRecord(run.info.run_id, run.info.start_time, run.info.end_time, run.data.params,
                        dict(run.data.metrics), run.data.tags, state)


def copy_plots(files: list[Path], folder: Path, relative_to: Path) -> list[str]:
    """Copy the report's PNG files into `folder`; their paths relative to `relative_to` (for links)."""
    folder.mkdir(parents=True, exist_ok=True)
    links = []
    for path in (Path(f) for f in files):
        if path.suffix == ".png":
            if path.resolve() != (folder / path.name).resolve():  # --out may already be that folder
                shutil.copyfile(path, folder / path.name)
            links.append((folder / path.name).relative_to(relative_to).as_posix())
    return links


def results_markdown(report: SweepReport, parent: ParentRecord, title: str, report_command: str = "",
                     gpu_log: str | Path | None = None, plots: list[str] = (), file_design: bool = False) -> str:
    """A sweep's markdown section, from its `SweepReport` and its parent run: how it was run
    (commands, date, machine, tokens), the per-variant table, the paired table, timing, the plots."""
    records, metric = report.records, report.metric
    applied = report.design if file_design else None
    lines = [f"### {title}", "", *run_lines(parent, records, report_command, applied), "",
             *variant_table_lines(report.rows, metric), "", *comparison_lines(report)]
    if epochs_line(records):
        lines += [f"- {epochs_line(records)}", ""]
    lines += sweep_timing_lines(records, gpu_log)
    if plots:
        lines += ["", *(f"![{Path(link).stem}]({link})" for link in plots)]
    return "\n".join(lines) + "\n"


def comparison_lines(report: SweepReport) -> list[str]:
    """The markdown of the report's comparisons: against the baselines (with the compute multipliers),
    across model sizes and sweeps, the factorial effects, the diverged trials, each seed's difference
    and the difference at every evaluation; each table followed by an empty line."""
    r, metric = report, report.metric
    lines = []
    if r.comparisons:
        extra = multiplier_column(r.multipliers, r.design.interval_name)
        lines += [*sequential_table_lines(r.comparisons, metric, r.design, extra), ""]
    if r.size_multipliers:
        lines += [*size_multiplier_lines(r.size_multipliers, r.compute_sizes, r.design.interval_name), ""]
    if r.across:
        lines += [*across_lines(r.across["rows"], r.across["sweeps"], metric), ""]
    if r.factorial:
        lines += [*factorial_lines(r.factorial, r.factorial_design, metric), ""]
    lines += [f"- Diverged: {line}" for line in r.diverged] + ([""] if r.diverged else [])
    if any(c.pairs > 1 for c in r.comparisons):
        lines += [*seed_difference_lines(r.records, r.pairs, metric, r.last, r.mode, r.rise), ""]
    if len({row["step"] for row in r.curves}) > 1:
        lines += [*curve_table_lines(r.curves, metric, r.design.interval_name), ""]
    return lines


def resume_lines(commands: list[str]) -> list[str]:
    """One line per distinct resume command, with how often it ran (a sweep in parts repeats one)."""
    counts = dict(collections.Counter(commands))
    return [f"- Resumed with{f' ({n} times)' if n > 1 else ''}: `{command}`" for command, n in counts.items()]


def run_lines(parent: ParentRecord, records: list[TrialRecord], report_command: str, applied=None) -> list[str]:
    """Commands, date, machine, tokens per trial and the sweep's totals, as a bullet list; applied:
    the sweep file's present design where `k3lab report --file-design` judged under it."""
    command = parent.tags.get(runs.COMMAND) or "n/a (not recorded)"
    lines = [f"- Command: `{command}`"]
    lines += resume_lines(parent.tags.get(runs.RESUMED_WITH, "").splitlines())
    if report_command:
        lines.append(f"- Report: `{report_command}`")
    lines += design_lines(parent) if applied is None else [
        f"- Comparisons: {applied.rule_text}; {applied.interval_name}; the sweep file's present design, applied by "
        "`k3lab report --file-design` (the store keeps the design it stored)"]
    gpus = parent.metrics.get("sweep_gpus")
    sharing = parent.tags.get(runs.GPU_SHARING)
    lines += [f"- Date: {date_range(parent.start_ms, parent.end_ms, parent.state)}",
              f"- Machine: {machine(records, gpus)}" + (f"; trials sharing a GPU: {sharing}" if sharing else ""),
              f"- Tokens per trial: {tokens_per_trial(parent.params)}", f"- Sweep: {sweep_line(parent, records)}"]
    return lines


def design_lines(parent: ParentRecord) -> list[str]:
    """How the comparisons were decided and where that design came from (`k3lab.store.runs.DESIGN`)."""
    import json

    from k3lab.report.sequential import Design

    try:
        record = json.loads(parent.tags.get(runs.DESIGN) or "null")
        design = Design.from_json(record["design"])
    except (ValueError, TypeError, KeyError):
        return []
    source = ("stored by the sweep as it started" if record.get("stored_by", "sweep") == "sweep" else
              "the sweep file's, applied by `k3lab report` after the run (the run stored none)")
    return [f"- Comparisons: {design.rule_text}; {design.interval_name}; design {source}"]


def sweep_line(parent: ParentRecord, records: list[TrialRecord]) -> str:
    """The sweep's totals as its parent run logged them, over all its parts (a first run and its
    resumes: wall times summed). A sweep stopped before its totals were logged gets them from its
    trials: over the parts' wall time when its parent closed, else up to the last trial's end once
    every trial has ended; else n/a."""
    metrics = parent.metrics
    over = parts_note(metrics.get("sweep_parts", 1))
    if "sweep_tokens" in metrics:
        wall = metrics.get("sweep_parts_wall_s", metrics.get("sweep_wall_s"))
        return sweep_totals(metrics | {"sweep_wall_s": wall}, over)
    figures = [{"tokens": r.value("tokens"), "flops_per_token": r.value("flops_per_token")} for r in records]
    if parent.end_ms and "sweep_parts_wall_s" in metrics:
        totals = sweep_efficiency(figures, metrics["sweep_parts_wall_s"], gpus=0, device_name=None)
        return "stopped before its end; from the tokens its trials trained: " + sweep_totals(totals, over)
    wall_s = wall_to_the_end(parent.start_ms, None, [r.end_ms for r in records])
    if parent.end_ms or wall_s is None:
        return sweep_totals(metrics)
    totals = sweep_efficiency(figures, wall_s, gpus=0, device_name=None)
    return "parent run not closed; from its trials, to the last one's end: " + sweep_totals(totals)


def date_range(start_ms: int | None, end_ms: int | None, state: str = "") -> str:
    def utc(ms: int) -> str:
        return datetime.fromtimestamp(ms / 1000, tz=timezone.utc).strftime("%Y-%m-%d %H:%M UTC")

    if not start_ms:
        return "n/a"
    if state == runs.INTERRUPTED:
        return utc(start_ms) + " (interrupted: its driver stopped before the sweep ended" + (
            f"; closed at the last trial's end, {utc(end_ms)})" if end_ms else ")")
    return utc(start_ms) + (f" to {utc(end_ms)}" if end_ms else " (not finished)")


def machine(records: list[TrialRecord], gpus: float | None = None) -> str:
    """The devices the trials logged (k3lab.device), how many GPUs the sweep had (its parent's
    sweep_gpus, where logged) and on how many hosts."""
    devices = sorted({r.tags[runs.DEVICE] for r in records if r.tags.get(runs.DEVICE)})
    hosts = {r.tags[runs.HOST] for r in records if r.tags.get(runs.HOST)}
    where = f" on {len(hosts)} host{'s' if len(hosts) != 1 else ''}" if hosts else ""
    count = f"{gpus:g} x " if gpus and len(devices) == 1 else ""
    return count + (", ".join(devices) or "n/a (no trial logged its device)") + where


def tokens_per_trial(params: dict) -> str:
    """steps x batch x sequence x accumulation, from the parent run's train.* params."""
    try:
        steps, batch, seq, accum = (int(params[f"train.{k}"]) for k in ("steps", "batch_size", "seq_len", "grad_accum"))
    except (KeyError, ValueError):
        return "n/a"
    accumulation = f" x {accum} accumulation steps" if accum > 1 else ""
    return f"{steps * batch * seq * accum:,} ({steps} steps of {batch} x {seq} tokens{accumulation})"


def sweep_totals(metrics: dict, wall_note: str = "") -> str:
    """The sweep's wall time, tokens, aggregate tokens/s and MFU where the parent run logged them."""
    def value(name: str, spec: str, unit: str = "", scale: float = 1.0) -> str:
        number = metrics.get(name)
        return "n/a" if number is None else format(scale * number, spec) + unit

    return (f"wall time {value('sweep_wall_s', ',.0f', ' s')}{wall_note}, "
            f"tokens in all {value('sweep_tokens', ',.0f')}, "
            f"aggregate tokens/s {value('sweep_tokens_per_s', ',.0f')}, MFU {value('sweep_mfu', '.1f', '%', 100)}")


def variant_table_lines(rows: list[dict], metric: str) -> list[str]:
    lines = [f"| variant | seeds | final {metric} (mean ± std) | total params | active params "
             "| tokens/s (per trial, run average) | tokens trained |", "|---|---|---|---|---|---|---|"]
    for row in rows:
        mean, std = row[f"{metric}_mean"], row[f"{metric}_std"]
        spread = f" ± {fmt(std, '.4f')}" if row["seeds"] > 1 else " (one seed)"
        lines.append(f"| {row['variant']} | {row['seeds']}/{row['trials']} | {fmt(mean, '.4f')}{spread} "
                     f"| {row['params_total']:,} | {row['params_active']:,} | {fmt(row['tokens_per_s'], ',.0f')} "
                     f"| {int(row['tokens']):,} |")
    return lines


def crash_lines(records: list[TrialRecord]) -> list[str]:
    """How often trials crashed and went on from their last checkpoint, and with which errors."""
    crashed = [r for r in records if runs.crash_count(r.tags)]
    if not crashed:
        return []
    total = sum(runs.crash_count(r.tags) for r in crashed)
    errors = collections.Counter(r.tags.get(runs.LAST_CRASH, "?") for r in crashed)
    listed = "; ".join(f"`{error[:160]}` ({n} trial{'s' if n > 1 else ''})" for error, n in errors.most_common(3))
    return [f"- Crashes: {total} in {len(crashed)} of {len(records)} trials, each restarted from its last checkpoint "
            f"(k3lab.crashes); last errors: {listed}."]


BUILD_PART_LABELS = dict(zip(BUILD_PARTS, ("corpus", "model and optimizers", "MLflow run")))


def build_parts_clause(records: list[TrialRecord]) -> str:
    """' (corpus 1.2 s, model and optimizers 6.0 s, MLflow run 3.1 s)': the build's parts, mean
    over the trials that logged them; '' for runs from before they were logged."""
    parts = []
    for key, label in BUILD_PART_LABELS.items():
        values = [r.value(key) for r in records if r.value(key) is not None]
        if values:
            parts.append(f"{label} {statistics.fmean(values):.1f} s")
    return f" ({', '.join(parts)})" if parts else ""


def slot_wait_lines(records: list[TrialRecord]) -> list[str]:
    """How long trials that had started up waited for a training slot (resources.training_slots)."""
    waits = [r.value("slot_wait_s") for r in records if r.value("slot_wait_s") is not None]
    if not waits:
        return []
    return [f"- Waiting for a training slot after start-up (resources.training_slots): mean "
            f"{statistics.fmean(waits):.1f} s, max {max(waits):.1f} s over {len(waits)} trials."]


def sweep_timing_lines(records: list[TrialRecord], gpu_log: str | Path | None) -> list[str]:
    starts = [r.start_ms / 1000 for r in records if r.start_ms]
    ends = [r.end_ms / 1000 for r in records if r.end_ms]
    if not starts or not ends:
        return ["(no finished trials)"]
    start, end = min(starts), max(ends)
    startups = [r.value("startup_s") for r in records if r.value("startup_s") is not None]
    overheads = [r.value("tracking_overhead") for r in records if r.value("tracking_overhead") is not None]
    lines = [f"- Trials: {len(records)}, from the first trial's start to the last trial's end: {end - start:.0f} s."]
    builds = [r.value("startup_build_s") for r in records if r.value("startup_build_s") is not None]
    if startups:
        split = (f" Of it, building the trainer (imports, data, model, MLflow run): mean "
                 f"{statistics.fmean(builds):.1f} s{build_parts_clause(records)}; the rest is the first step "
                 "(compilation, CUDA graph capture).") if builds else ""
        lines.append(f"- Trial start-up (process start to the end of the first optimizer step): mean "
                     f"{statistics.fmean(startups):.1f} s, max {max(startups):.1f} s, "
                     f"{sum(startups):.0f} trial-seconds in all.{split}")
    lines += slot_wait_lines(records)
    lines += crash_lines(records)
    if overheads:
        mean, _ = mean_std(overheads)
        lines.append(f"- Tracking overhead (time in the MLflow tracker / training-loop time): mean {100 * mean:.2f}%, "
                     f"max {100 * max(overheads):.2f}%.")
    if gpu_log is not None:
        samples = read_gpu_log(gpu_log)
        whole = busy_fraction(samples, start, end)
        first = first_step_time(records)
        after = busy_fraction(samples, first, end) if first else None
        lines.append(f"- GPU busy (utilisation x time / wall time, {len(samples)} samples): {fmt(whole and 100 * whole, '.1f')}% "
                     f"of the sweep; {fmt(after and 100 * after, '.1f')}% after the first trial's first step.")
    return lines
