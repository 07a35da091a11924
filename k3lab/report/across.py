"""One sweep file's comparisons across several sweeps of it (stores from other machines, a re-run
after a change): each comparison per sweep, side by side, and pooled.

Per sweep, a comparison is the sweep's own (`paired.comparisons_for`, the design the report uses).
Pooled, the unit is a distinct seed: a seed run in several sweeps trained the same initial model on
the same data order, so its paired differences there are not independent; they are averaged into
one difference for that seed (and the baseline's values likewise), and the pooled comparison is a
one-look t-interval over the distinct seeds with the design's confidence, Bonferroni over its
comparisons (`sequential.fixed_design`).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass


from k3lab.report import stats
from k3lab.report.paired import comparisons_for, values_by_seed
from k3lab.report.records import TrialRecord
from k3lab.report.sequential import Design, compare_sequential, fixed_design
from k3lab.report.stop_rule import BUDGET

POOLED = "pooled"


@dataclass
class Sweep:
    label: str  # how the tables name it: the store's file name
    records: list[TrialRecord]


def pooled_values(sweeps: list[Sweep], variant: str, baseline: str, metric: str, mode: str, last: int,
                  rise: float | None) -> tuple[dict[int, float], dict[int, float]]:
    """(variant, baseline) seed -> value, one per distinct seed: the baseline's values and the paired
    differences averaged over the sweeps where the seed has a pair (the variant's = baseline + difference)."""
    differences: dict[int, list[float]] = {}
    baselines: dict[int, list[float]] = {}
    for sweep in sweeps:
        values = values_by_seed(sweep.records, metric, last, mode, rise)
        mine, theirs = values.get(variant, {}), values.get(baseline, {})
        for seed in stats.paired_seeds(mine, theirs):
            differences.setdefault(seed, []).append(mine[seed] - theirs[seed])
            baselines.setdefault(seed, []).append(theirs[seed])
    reference = {seed: statistics.fmean(v) for seed, v in baselines.items()}
    return {seed: reference[seed] + statistics.fmean(d) for seed, d in differences.items()}, reference


def compare_across(sweeps: list[Sweep], baselines: dict[str, str], metric: str, mode: str,
                   design: Design | None = None, last: int = 1, rise: float | None = None) -> list[dict]:
    """For every comparison of `baselines`: {"variant", "baseline", "by_sweep": [(label, Comparison)],
    "pooled": Comparison over the distinct seeds}."""
    per_sweep = {sweep.label: {c.variant: c for c in comparisons_for(sweep.records, baselines, metric, mode, design,
                                                                     last, BUDGET, rise)}
                 for sweep in sweeps}
    rows = []
    pooled = {variant: pooled_values(sweeps, variant, baseline, metric, mode, last, rise)
              for variant, baseline in baselines.items()}
    seeds = max((len(values) for values, _ in pooled.values()), default=1)
    confidence = design.confidence if design is not None else fixed_design(1, 1).confidence
    margin = design.margin if design is not None else None
    pooled_design = fixed_design(len(baselines), max(seeds, 1), confidence, margin)
    for variant, baseline in baselines.items():
        values, reference = pooled[variant]
        rows.append({"variant": variant, "baseline": baseline,
                     "by_sweep": [(label, comparisons[variant]) for label, comparisons in per_sweep.items()],
                     "pooled": compare_sequential(variant, values, baseline, reference, mode, pooled_design, BUDGET)})
    return rows


def across_json(rows: list[dict]) -> list[dict]:
    return [{"variant": row["variant"], "baseline": row["baseline"],
             "by_sweep": {label: c.to_json() for label, c in row["by_sweep"]}, POOLED: row["pooled"].to_json()}
            for row in rows]
