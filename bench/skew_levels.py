"""The level a 4-16 design needs per look, by the shape and skewness of the paired differences.

    python bench/skew_levels.py --write

For each shape (gamma, lognormal, Gaussian with an occasional shock: `bench/decisions.py`) and
skewness, null paths of 16 standardised draws; the level is the alpha / K quantile of each path's
smallest two-sided t p-value over the looks 4..16 (alpha / K = 1.25%), as
`k3lab.report.calibration.nominal_level` finds it for the gamma; beside it, the error the Gaussian
design's level gives under that shape. The smallest level over the shapes is the one the
calibration must use to cover a skewness; --write puts the table into docs/statistics.md.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.decisions import SHOCK_RATE, standard_noise  # noqa: E402
from k3lab.report.calibration import nominal_level, smallest_p_values  # noqa: E402

DOC = Path(__file__).resolve().parent.parent / "docs" / "statistics.md"
SECTION = "Levels by the shape of the differences"
START, MAX_PAIRS, ALPHA = 4, 16, 0.0125
SHAPES, SKEWS = ("gamma", "lognormal", "shock"), (0.5, 1.0, 1.5, 3.0)
SHOCK_LIMIT = (1 - 2 * SHOCK_RATE) / (SHOCK_RATE * (1 - SHOCK_RATE)) ** 0.5  # the shock shape's largest skewness


def table(paths: int, seed: int) -> str:
    gaussian = nominal_level(START, MAX_PAIRS, ALPHA)
    lines = [f"Looks {START}-{MAX_PAIRS}, alpha / K = {100 * ALPHA:g}%, {paths:,} null paths per cell; the Gaussian "
             f"design's level {100 * gaussian:.4f}%. Cells: the level that holds the error at alpha / K under that "
             "shape / the error the Gaussian level gives under it.", "",
             "| skewness | " + " | ".join(SHAPES) + " |", "|---|" + "---|" * len(SHAPES)]
    rng = np.random.default_rng(seed)
    for skew in SKEWS:
        cells = []
        for shape in SHAPES:
            if shape == "shock" and skew >= SHOCK_LIMIT:
                cells.append(f"- (at most {SHOCK_LIMIT:.2f})")
                continue
            smallest = smallest_p_values(standard_noise(rng, (paths, MAX_PAIRS), shape, skew),
                                         range(START, MAX_PAIRS + 1))
            level = float(np.quantile(smallest, ALPHA, method="inverted_cdf"))
            cells.append(f"{100 * level:.3g}% / {100 * (smallest <= gaussian).mean():.2f}%")
        lines.append(f"| {skew:g} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    from bench.report import simulation_main

    simulation_main(__doc__, table, SECTION, 400_000, DOC)


if __name__ == "__main__":
    main()
