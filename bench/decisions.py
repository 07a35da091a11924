"""The decisions rule on simulated sweeps: error rates, coverage and pairs spent, through the policy.

    python bench/decisions.py --sweeps 10000 --write

K = 4 comparisons share one baseline; every variant starts with 4 seeds and may reach 16; trial
results are drawn from a distribution (no model): loss + the seed's shared part + the true
difference + each trial's own noise. Each sweep runs through the same `SeedPlanner` the Ray Tune
Searcher uses, one trial at a time, and is judged by `compare_family`, as the report judges a
stored sweep. --write puts the table into docs/statistics.md; tests/test_sequential.py runs the
same scenarios and asserts the issue's targets.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import attrs
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from k3lab.report.sequential import BETTER, NOT_RESOLVED, WORSE, Design, compare_family  # noqa: E402
from k3lab.tune.planner import FINISHED, SeedPlanner  # noqa: E402

DOC = Path(__file__).resolve().parent.parent / "docs" / "statistics.md"
SECTION = "Simulated sweeps"
K, START, MAX_PAIRS = 4, 4, 16
BASE_LOSS = 2.0
SEED_SPREAD = 0.02  # the seed-to-seed spread, shared by the trials of one seed (cancels in the pairs)
NAMES = ["base"] + [f"v{i}" for i in range(1, K + 1)]


@attrs.frozen
class Scenario:
    """True differences and the spreads of the paired differences of the K comparisons; the
    baseline's own trial noise (shared by every pair); the noise's shape."""

    name: str
    truth: tuple[float, ...]
    spreads: tuple[float, ...]
    baseline_spread: float
    skewed: bool = False


EQUAL_NOISE = 0.004  # every trial: its pairs' differences correlate 0.5 through the shared baseline
SCENARIOS = (
    Scenario("all null", (0.0,) * K, (EQUAL_NOISE * math.sqrt(2),) * K, EQUAL_NOISE),
    Scenario("the H200 spreads", (-0.029, -0.008, 0.011, 0.0), (0.009, 0.003, 0.007, 0.008), 0.002),
    Scenario("all null, lognormal noise", (0.0,) * K, (EQUAL_NOISE * math.sqrt(2),) * K, EQUAL_NOISE, skewed=True),
)


def standard_noise(rng, shape, skewed: bool) -> np.ndarray:
    """Mean 0, sd 1: normal, or a centred lognormal (sigma 1: a heavy right tail)."""
    if not skewed:
        return rng.standard_normal(shape)
    x = rng.lognormal(0.0, 1.0, shape)
    return (x - math.exp(0.5)) / math.sqrt((math.e - 1) * math.e)


def draw(rng, scenario: Scenario, sweeps: int) -> np.ndarray:
    """Trial results [sweep, variant (0: the baseline), seed]."""
    own = np.sqrt(np.asarray(scenario.spreads) ** 2 - scenario.baseline_spread ** 2)
    sd = np.concatenate([[scenario.baseline_spread], own])[None, :, None]
    seed_part = rng.normal(0, SEED_SPREAD, (sweeps, 1, MAX_PAIRS))
    shift = np.concatenate([[0.0], scenario.truth])[None, :, None]
    return BASE_LOSS + seed_part + shift + sd * standard_noise(rng, (sweeps, K + 1, MAX_PAIRS), scenario.skewed)


def drive(plan: SeedPlanner, value) -> list[tuple[str, int]]:
    """Run a planner one trial at a time; value(variant, seed) is a trial's result."""
    started = []
    while (chosen := plan.next_trial()) not in (None, FINISHED):
        started.append(chosen)
        plan.complete(*chosen, value(*chosen))
    return started


def planner_sweep(results: np.ndarray, design: Design) -> list:
    """One simulated sweep through the real policy: its comparisons, as the report makes them."""
    baselines = {v: "base" for v in NAMES[1:]}
    plan = SeedPlanner(NAMES, baselines, list(range(MAX_PAIRS)), START, design)
    started = drive(plan, lambda v, s: float(results[NAMES.index(v), s]))
    values = {v: {s: float(results[NAMES.index(v), s]) for w, s in started if w == v} for v in NAMES}
    return compare_family(values, baselines, "min", design)


@attrs.frozen
class Outcome:
    """Per sweep and comparison: decided, pairs, interval covers the truth, called better/worse."""

    decided: np.ndarray
    pairs: np.ndarray
    covered: np.ndarray
    called: np.ndarray
    null_called: np.ndarray  # called, of the comparisons whose truth is 0

    @property
    def family_error(self) -> float:
        """The share of sweeps where a comparison whose truth is 0 was called better or worse."""
        return float(self.null_called.any(1).mean()) if self.null_called.size else 0.0


def simulate(scenario: Scenario, sweeps: int, seed: int, design: Design | None = None) -> Outcome:
    design = design or Design(K, MAX_PAIRS, START).calibrated()
    rng = np.random.default_rng(seed)
    rows = [planner_sweep(r, design) for r in draw(rng, scenario, sweeps)]
    truth = np.asarray(scenario.truth)
    called = np.array([[c.verdict in (BETTER, WORSE) for c in row] for row in rows])
    return Outcome(decided=np.array([[c.verdict != NOT_RESOLVED for c in row] for row in rows]),
                   pairs=np.array([[c.pairs for c in row] for row in rows]),
                   covered=np.array([[abs(c.mean_diff - t) <= c.half_width for c, t in zip(row, truth)]
                                     for row in rows]),
                   called=called, null_called=called[:, truth == 0])


def table(sweeps: int, seed: int) -> str:
    design = Design(K, MAX_PAIRS, START).calibrated()
    lines = [f"K = {K} comparisons sharing one baseline, start {START}, max {MAX_PAIRS}, until decided, no margin; "
             f"{sweeps:,} sweeps per row through `SeedPlanner` and `compare_family`; the design's nominal level "
             f"per look {100 * design.nominal:.3f}% (alpha / K = {100 * design.alpha:.3g}%).", "",
             "| scenario | true differences / sds | pairs per comparison (mean) | decided | "
             "family-wise error (truth 0) | simultaneous coverage |", "|---|---|---|---|---|---|"]
    for number, scenario in enumerate(SCENARIOS):
        outcome = simulate(scenario, sweeps, seed + number, design)
        truths = ", ".join(f"{t:+g} / {s:.4g}" for t, s in zip(scenario.truth, scenario.spreads))
        lines.append(f"| {scenario.name} | {truths} | {', '.join(f'{p:.2f}' for p in outcome.pairs.mean(0))} | "
                     f"{', '.join(f'{d:.3f}' for d in outcome.decided.mean(0))} | {outcome.family_error:.4f} | "
                     f"{outcome.covered.all(1).mean():.4f} |")
    return "\n".join(lines)


def main() -> None:
    from bench.report import simulation_main

    simulation_main(__doc__, table, SECTION, 10_000, DOC)


if __name__ == "__main__":
    main()
