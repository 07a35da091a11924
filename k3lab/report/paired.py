"""A sweep's comparisons with the baselines of their groups, read from its trial records: the value
each trial is judged by, the family-wise table of a sweep with a seeds policy, and the paired
differences at every evaluation (the whole curve); their tables are `k3lab.report.tables`'s, their
plots `k3lab.report.plots`'s.

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
from k3lab.report.sequential import Design, compare_family, compare_sequential, fixed_design
from k3lab.report.stop_rule import BUDGET, RUNNING, STOPPED
from k3lab.report import stats
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


# -- the family-wise table ------------------------------------------------------------------------
