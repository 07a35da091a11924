"""A sweep's results as markdown, from its MLflow store and (optionally) a GPU utilisation log.

    k3lab report experiments/attnres_block.yaml --profile gpu --markdown docs/results.md \
        --gpu-log gpu_util.csv

The GPU log has one `epoch_seconds,utilization_percent` line per sample, e.g. from
    nvidia-smi --query-gpu=utilization.gpu --format=csv,noheader,nounits -lms 500 |
        while read u; do echo "$(date +%s.%N),$u"; done
GPU-busy time is the sum of utilisation x sample interval; it is reported over the sweep's
wall time and over the part after the first trial's start-up (from the first optimizer
step any trial finished).
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path

from k3lab.runner.report import TrialRecord, load_trials, mean_std, summarize


def read_gpu_log(path: str | Path) -> list[tuple[float, float]]:
    """[(epoch seconds, utilisation %)], sorted; unparsable lines are skipped."""
    samples = []
    for line in Path(path).read_text().splitlines():
        try:
            t, u = line.split(",")[:2]
            samples.append((float(t), float(u)))
        except ValueError:
            continue
    return sorted(samples)


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


def results_markdown(tracking_uri: str, parent_run_id: str, title: str, metric: str = "val_loss",
                     gpu_log: str | Path | None = None, baseline: str | None = None, command: str = "") -> str:
    """Per variant: final metric mean +- std over seeds, params, active params, tokens/s, tokens trained;
    then sweep wall time, GPU utilisation, trial start-up and tracking overhead."""
    records = load_trials(tracking_uri, parent_run_id, curves=("train_loss",))
    rows = summarize(records, metric)
    lines = [f"### {title}", ""]
    if command:
        lines += [f"Command: `{command}`", ""]
    base_row = next((r for r in rows if r["variant"] == baseline), None)
    lines += [f"| variant | seeds | final {metric} | vs {baseline or 'baseline'} | total params | active params "
              "| tokens/s (per trial) | tokens trained |", "|---|---|---|---|---|---|---|---|"]
    for row in rows:
        mean, std = row[f"{metric}_mean"], row[f"{metric}_std"]
        delta = "n/a"
        if base_row and row is not base_row and not math.isnan(mean):
            delta = f"{100 * (mean / base_row[f'{metric}_mean'] - 1):+.2f}%"
        spread = f" ± {fmt(std, '.4f')}" if row["seeds"] > 1 else " (one seed)"
        lines.append(f"| {row['variant']} | {row['seeds']}/{row['trials']} | {fmt(mean, '.4f')}{spread} "
                     f"| {delta} | {row['params_total']:,} | {row['params_active']:,} | {fmt(row['tokens_per_s'], ',.0f')} "
                     f"| {int(row['tokens']):,} |")
    lines += ["", *sweep_timing_lines(records, gpu_log)]
    return "\n".join(lines) + "\n"


def sweep_timing_lines(records: list[TrialRecord], gpu_log: str | Path | None) -> list[str]:
    starts = [r.start_ms / 1000 for r in records if r.start_ms]
    ends = [r.end_ms / 1000 for r in records if r.end_ms]
    if not starts or not ends:
        return ["(no finished trials)"]
    start, end = min(starts), max(ends)
    startups = [r.value("startup_s") for r in records if r.value("startup_s") is not None]
    overheads = [r.value("tracking_overhead") for r in records if r.value("tracking_overhead") is not None]
    lines = [f"- Trials: {len(records)}, from the first trial's start to the last trial's end: {end - start:.0f} s."]
    if startups:
        lines.append(f"- Trial start-up (process start to the end of the first optimizer step): mean "
                     f"{statistics.fmean(startups):.1f} s, max {max(startups):.1f} s, "
                     f"{sum(startups):.0f} trial-seconds in all.")
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
