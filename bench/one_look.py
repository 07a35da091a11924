"""A fixed list of seeds, one look: family-wise error before (Gaussian t, Bonferroni) and after
(`sequential.fixed_design`: Holm at the shape-calibrated one-look levels, shape check), simulated.

    python bench/one_look.py --sweeps 20000 --write

K = 4 comparisons, every one at a true difference of 0, 16 pairs each; the paired differences are
draws of a shape (`looks.shape_draws`: Gaussian, gamma of skewness 1.5 either sign, the two-mode
shape of skewness 1.2), independent across comparisons, or correlated 0.5 through a shared
baseline (each difference = (the variant's own draw - the baseline's Gaussian draw) / sqrt 2).
Fresh draws (another seed than the levels' calibration). --write puts the table into
docs/statistics.md; its last column says whether the design's error is within 0.05 plus two Monte
Carlo standard errors (the check's misses count: a sweep it does not flag is tested at the base
levels).
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from k3lab.report.looks import HIGHER, LOWER, decide, look_statistics, p_values, shape_draws  # noqa: E402
from k3lab.report.sequential import fixed_design  # noqa: E402

DOC = Path(__file__).resolve().parent.parent / "docs" / "statistics.md"
SECTION = "Simulated lists of seeds: one look"
K, PAIRS, ALPHA = 4, 16, 0.05
SHAPES = (("normal", 0.0, False), ("gamma", 1.5, False), ("gamma", -1.5, False), ("two-mode", 1.2, False),
          ("two-mode", -1.2, False), ("gamma", 1.5, True), ("two-mode", 1.2, True))


def null_differences(rng: np.random.Generator, sweeps: int, kind: str, skew: float, shared: bool) -> np.ndarray:
    """d[sweep, comparison, seed], mean 0: the shape's draws, or correlated 0.5 through a Gaussian baseline."""
    own = shape_draws(rng, (sweeps, K, PAIRS), kind, skew)
    if not shared:
        return own
    return (own - rng.standard_normal((sweeps, 1, PAIRS))) / math.sqrt(2)


def family_errors(d: np.ndarray) -> tuple[float, float, float]:
    """(error of the Gaussian Bonferroni t, error of the fixed list's design, share flagged by its check)."""
    design = fixed_design(K, PAIRS)
    before = (p_values(*look_statistics(d, PAIRS)) <= ALPHA / K).any(1).mean()
    found = decide(d, np.full(d.shape[:2], PAIRS), design.look_design)
    after = np.isin(found.code, (LOWER, HIGHER)).any(1).mean()
    return float(before), float(after), float((found.flagged_at >= 0).mean())


def monte_carlo_se(rate: float, sweeps: int) -> float:
    return math.sqrt(max(rate * (1 - rate), 1 / sweeps) / sweeps)


def table(sweeps: int, seed: int) -> str:
    design = fixed_design(K, PAIRS)
    lines = [f"K = {K} comparisons, all at a true difference of 0, one look at {PAIRS} pairs; {sweeps:,} sweeps per "
             f"row. Before: each comparison a Student t-test at alpha / K = {100 * ALPHA / K:g}% (Bonferroni, the "
             f"Gaussian one-look level). After: `fixed_design({K}, {PAIRS})`, Holm over the {K} at the simulated "
             f"thresholds ({100 * design.levels[K - 1][0]:.3g}% with all {K} open; once the pooled residuals' "
             f"skewness passes the check, {100 * design.heavy_tail_levels[K - 1][0]:.3g}% one-sided for the call "
             "opposite the skew). Error: family-wise error ± its Monte Carlo standard error.", "",
             "| differences | baseline | before: Bonferroni t | after: one look, Holm, shape check | flagged | "
             "after within 0.05 |", "|---|---|---|---|---|---|"]
    for row, (kind, skew, shared) in enumerate(SHAPES):
        before, after, flagged = family_errors(null_differences(np.random.default_rng(seed + row), sweeps, kind,
                                                                skew, shared))
        name = "Gaussian" if kind == "normal" else f"{kind}, skew {skew:+g}"
        lines.append(f"| {name} | {'shared (0.5)' if shared else 'independent'} | "
                     f"{before:.4f} ± {monte_carlo_se(before, sweeps):.4f} | "
                     f"{after:.4f} ± {monte_carlo_se(after, sweeps):.4f} | {flagged:.3f} | "
                     f"{'yes' if after <= ALPHA + 2 * monte_carlo_se(after, sweeps) else 'no'} |")
    return "\n".join(lines)


def main() -> None:
    from bench.report import simulation_main

    simulation_main(__doc__, table, SECTION, 20_000, DOC)


if __name__ == "__main__":
    main()
