"""What each axis of a multi-axis sweep does, and whether two axes interact: a factorial summary,
paired by seed, with family-wise intervals.

The variants that set every axis (`TrialRecord.axes`) form the grid (cells: one level per axis;
variants outside it, such as an all-dense extra, are left out); it needs two or more axes and
every cell. Per seed s and cell c, y[c, s] is the trial's verdict value (`family.trial_value`).
Against each axis's reference level (the baselines' level, else its first in the file):

    main effect of A at level a       mean over the other axes' cells of  y[a, .] - y[a0, .]
    interaction of A x B at (a, b)    mean over the other axes' cells of  y[a, b] - y[a0, b] - y[a, b0] + y[a0, b0]

Each is a contrast of one seed's cells, so the seeds give paired values d_s. The K effects of the
summary are their own family (beside the comparisons'), decided as a fixed list of seeds is: one
look at the seeds run, Holm over the K effects at the p-value thresholds `k3lab.report.looks`
simulates for the shapes it covers (where the shape check flags the effects' pairs, the call the
skew makes likely at the heavy tail's level), at the sweep's confidence; each interval is the
t-interval at the level its effect was tested at in the direction of its mean
(`sequential.fixed_design`).
A seed counts for an effect when every cell the effect reads has a value there. In % of the
reference cell's mean (every axis at its reference level).
"""

from __future__ import annotations

import itertools
import math
import statistics

import attrs
import numpy as np

from k3lab.report import stats
from k3lab.report.paired import values_by_seed
from k3lab.report.records import TrialRecord
from k3lab.report.looks import decide
from k3lab.report.sequential import CONFIDENCE, Design, fixed_design

Cell = tuple[str, ...]


@attrs.frozen
class Grid:
    axes: tuple[str, ...]
    levels: dict[str, tuple[str, ...]]  # axis -> its levels, the reference first
    cells: dict[Cell, str]  # one level per axis (in `axes` order) -> the variant

    def reference(self, axis: str) -> str:
        return self.levels[axis][0]


@attrs.frozen
class Effect:
    kind: str  # "main" or "interaction"
    axes: tuple[str, ...]
    levels: tuple[str, ...]
    references: tuple[str, ...]
    pairs: int  # seeds with every cell the effect reads
    difference: float | None  # mean of the seeds' contrasts
    half_width: float | None  # family-wise, None under two seeds
    relative: float | None  # % of the reference cell's mean
    relative_half_width: float | None

    @property
    def label(self) -> str:
        return " x ".join(f"{axis}={level} (vs {reference})"
                          for axis, level, reference in zip(self.axes, self.levels, self.references))

    @property
    def verdict(self) -> str:
        if self.half_width is None or self.difference is None:
            return "not resolved"
        return "not resolved" if abs(self.difference) <= self.half_width else "nonzero"

    def to_json(self) -> dict:
        return attrs.asdict(self) | {"label": self.label, "verdict": self.verdict}


def factorial_grid(records: list[TrialRecord], variant_order: list[str], references: dict[str, str] | None = None
                   ) -> Grid | None:
    """The sweep's full grid of axes (None: under two axes, or a cell without a variant)."""
    axes_of = {r.variant: r.axes for r in records}
    order = [v for v in variant_order if v in axes_of] + sorted(set(axes_of) - set(variant_order))
    names = set().union(*axes_of.values()) if axes_of else set()
    inside = [v for v in order if set(axes_of[v]) == names]
    if len(names) < 2 or not inside:
        return None
    changes = {a: sum(axes_of[x][a] != axes_of[y][a] for x, y in zip(inside, inside[1:])) for a in names}
    axes = tuple(sorted(names, key=lambda a: (changes[a], a)))  # the slowest-changing axis first, as in the file
    levels = {}
    for axis in axes:
        seen = list(dict.fromkeys(axes_of[v][axis] for v in inside))
        reference = (references or {}).get(axis)
        levels[axis] = tuple([reference] + [x for x in seen if x != reference]) if reference in seen else tuple(seen)
    cells = {tuple(axes_of[v][a] for a in axes): v for v in inside}
    if len(cells) != math.prod(len(levels[a]) for a in axes):
        return None
    return Grid(axes, levels, cells)


def baseline_levels(records: list[TrialRecord], baselines: dict[str, str]) -> dict[str, str]:
    """Each axis's level shared by every baseline variant (where they agree on it)."""
    axes_of = {r.variant: r.axes for r in records}
    out: dict[str, str] = {}
    for axis in {a for b in set(baselines.values()) for a in axes_of.get(b, {})}:
        found = {axes_of[b].get(axis) for b in set(baselines.values()) if b in axes_of}
        if len(found) == 1 and None not in found:
            out[axis] = found.pop()
    return out


def contrasts(grid: Grid) -> list[tuple[tuple[str, ...], tuple[str, ...], dict[Cell, float]]]:
    """(axes, levels, cell weights) of every main effect and two-way interaction."""
    out = []
    for size in (1, 2):
        for axes in itertools.combinations(grid.axes, size):
            others = [a for a in grid.axes if a not in axes]
            rest = list(itertools.product(*(grid.levels[a] for a in others)))
            for levels in itertools.product(*(grid.levels[a][1:] for a in axes)):
                weights: dict[Cell, float] = {}
                for corner in itertools.product((0, 1), repeat=size):  # 1: the level, 0: the reference
                    sign = (-1) ** (size - sum(corner))
                    chosen = {a: (lv if c else grid.reference(a)) for a, lv, c in zip(axes, levels, corner)}
                    for combo in rest:
                        chosen |= dict(zip(others, combo))
                        cell = tuple(chosen[a] for a in grid.axes)
                        weights[cell] = weights.get(cell, 0.0) + sign / len(rest)
                out.append((axes, levels, weights))
    return out


def factorial_effects(records: list[TrialRecord], metric: str, variant_order: list[str],
                      baselines: dict[str, str] | None = None, design: Design | None = None, mode: str = "min",
                      last: int = 1, rise: float | None = None) -> tuple[list[Effect], Design | None]:
    """The grid's main effects and two-way interactions, and the design of their intervals ([] and
    None where the sweep has no full grid of two or more axes): one look at the seeds run, Holm over
    the effects (`sequential.fixed_design`, at the sweep design's confidence)."""
    grid = factorial_grid(records, variant_order, baseline_levels(records, baselines or {}))
    if grid is None:
        return [], None
    values = values_by_seed(records, metric, last, mode, rise)
    by_cell = {cell: values.get(variant, {}) for cell, variant in grid.cells.items()}
    wanted = contrasts(grid)
    seeds = max((len(v) for v in by_cell.values()), default=1)
    effect_design = fixed_design(len(wanted), seeds, design.confidence if design is not None else CONFIDENCE)
    reference_cell = tuple(grid.reference(a) for a in grid.axes)
    reference_values = [v for v in by_cell[reference_cell].values() if stats.usable(v)]
    reference = statistics.fmean(reference_values) if reference_values else None
    contrasts_by_seed = [seed_contrasts(weights, by_cell) for _, _, weights in wanted]
    halves = effect_half_widths(contrasts_by_seed, effect_design)
    effects = [effect(axes, levels, tuple(grid.reference(a) for a in axes), diffs, half, reference)
               for (axes, levels, _), diffs, half in zip(wanted, contrasts_by_seed, halves)]
    return effects, effect_design


def seed_contrasts(weights: dict[Cell, float], by_cell: dict) -> dict[int, float]:
    """seed -> the effect's contrast there, over the seeds with every cell it reads."""
    used = [cell for cell, w in weights.items() if w]
    seeds = sorted(set.intersection(*(set(s for s, v in by_cell[c].items() if stats.usable(v)) for c in used)))
    return {s: math.fsum(w * by_cell[c][s] for c, w in weights.items() if w) for s in seeds}


def effect_half_widths(diffs: list[dict[int, float]], design: Design) -> list[float]:
    """Per effect, the half-width at the level Holm tested it at (inf: too few seeds), so that an
    interval excludes 0 exactly where the family's one look calls the effect nonzero."""
    if design.looks is None:  # under 3 seeds: no simulated level, a t-interval at alpha / K
        return [design.half_width(list(d.values())) if d else math.inf for d in diffs]
    seeds = sorted(set().union(*diffs))
    d = np.array([[[by_seed.get(s, np.nan) for s in seeds] for by_seed in diffs]])
    pairs = np.isfinite(d).sum(-1)
    found = decide(d, np.where(pairs >= design.first_look, design.looks[0], 0), design.look_design)
    return [float(h) for h in found.half[0]]


def effect(axes, levels, references, diffs: dict[int, float], half: float, reference: float | None) -> Effect:
    mean = statistics.fmean(diffs.values()) if diffs else None
    half = half if math.isfinite(half) else None
    scale = 100 / abs(reference) if reference else None
    return Effect("main" if len(axes) == 1 else "interaction", tuple(axes), tuple(levels), tuple(references),
                  len(diffs), mean, half, mean * scale if scale and mean is not None else None,
                  half * scale if scale and half is not None else None)


