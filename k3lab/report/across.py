"""One sweep file's comparisons across several sweeps of it (stores from other machines, a re-run
after a change): each comparison per sweep, side by side, and pooled.

Per sweep, a comparison is the sweep's own (`paired.comparisons_for`, the design the report uses).
Pooled, the unit is a distinct seed: a seed run in several sweeps trained the same initial model on
the same data order, so its paired differences there are not independent; they are averaged into
one difference for that seed (and the baseline's values likewise). Seeds added sequentially are not
a fixed sample, so the pooled family is decided at the sweeps' design's level (`pooled_design`): a
looks design's threshold at its look at or below the count of distinct seeds (one look over all of
them, Holm over the comparisons, shape check on the pooled pairs); the every-pair design's repeated
interval where the count is within its max; a fixed list's one shape-calibrated look. Where none
applies the row's note says why.
"""

from __future__ import annotations

import statistics

import attrs


from k3lab.report import stats
from k3lab.report.paired import comparisons_for, values_by_seed
from k3lab.report.records import TrialRecord
from k3lab.report.sequential import CONFIDENCE, Design, compare_family, fixed_design
from k3lab.report.stop_rule import BUDGET, FIXED

POOLED = "pooled"


@attrs.define
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
    chosen, how = pooled_design(design, len(baselines), max(seeds, 1))
    own = {variant: f"{variant} <- {baseline}" for variant, baseline in baselines.items()}  # each pair's own baseline
    values = {name: by_seed for variant in baselines for name, by_seed in zip((variant, own[variant]), pooled[variant])}
    family = [attrs.evolve(c, baseline=baselines[c.variant])
              for c in compare_family(values, own, mode, chosen, BUDGET)]
    for (variant, baseline), found in zip(baselines.items(), family):
        rows.append({"variant": variant, "baseline": baseline, "pooled_design": how,
                     "by_sweep": [(label, comparisons[variant]) for label, comparisons in per_sweep.items()],
                     "pooled": found})
    return rows


def pooled_design(design: Design | None, comparisons: int, seeds: int) -> tuple[Design, str]:
    """The design the pooled family of `comparisons` over `seeds` distinct seeds is decided under,
    and the note's words for it."""
    confidence = design.confidence if design is not None else CONFIDENCE
    margin = design.margin if design is not None else None
    one_look = fixed_design(comparisons, seeds, confidence, margin)
    if design is None or design.rule == FIXED:
        return one_look, "one look at the distinct seeds at a list of seeds' levels (each sweep ran a fixed list)"
    if design.looks is None:
        if seeds <= design.max_pairs:
            return design, f"the sweeps' repeated interval at the distinct seeds (it holds at every look to {design.max_pairs})"
        return one_look, (f"one look at a list of seeds' levels: {seeds} distinct seeds is past the design's max "
                          f"({design.max_pairs}), where its repeated intervals do not reach; seeds added "
                          "sequentially there are not covered")
    made = [j for j, look in enumerate(design.looks) if look <= seeds]
    if not made or design.comparisons != comparisons or seeds < 3:
        why = (f"{seeds} distinct seeds: the design looks from {design.looks[0]}" if not made else
               f"the design has {design.comparisons} comparisons, the pooled family {comparisons}")
        return design, f"not decided ({why})"
    calibrated, j = design.calibrated(), made[-1]

    def column(table: tuple) -> tuple:
        return tuple((row[j],) for row in table)

    past = (f"; past its last look the design covers no more looks, so this is its last level"
            if seeds > design.looks[-1] else "")
    return (attrs.evolve(one_look, levels=column(calibrated.levels),
                         heavy_tail_levels=column(calibrated.heavy_tail_levels)),
            f"one look at the {seeds} distinct seeds at the design's level of its look at {design.looks[j]} seeds "
            f"(Holm over the family, shape check on the pooled pairs){past}")
def across_json(rows: list[dict]) -> list[dict]:
    return [{"variant": row["variant"], "baseline": row["baseline"],
             "by_sweep": {label: c.to_json() for label, c in row["by_sweep"]}, POOLED: row["pooled"].to_json()}
            for row in rows]
