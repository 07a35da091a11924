"""Whole sweeps under the looks design (`k3lab.report.looks`), vectorised: thousands a second.

Each scenario draws paired differences d[sweep, comparison, seed] = truth + sd * noise, where
noise = sqrt(1 - rho) * own + sqrt(rho) * shared (shared: one draw per seed, the baseline's
part every comparison has in common), both of the scenario's shape scaled to sd 1; failed
trials (each trial with probability `failed`; a failed baseline trial takes that seed's pair
from every comparison) leave NaN. `decide` runs the looks, Holm's reallocation and the shape
check exactly as a sweep does; a comparison decided at a look runs no more seeds, the baseline
runs as many as its longest comparison, and trials = the variants' seeds + the baseline's.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import attrs
import numpy as np
from scipy import optimize

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from k3lab.report.looks import (EQUIVALENT, HIGHER, LOOKS, LOWER, LookDesign, decide,  # noqa: E402
                                shape_draws)

SECTION = "Simulated sweeps: looks, alpha passed on, shape check"
LOSS = 1.14  # the baseline's loss on the GPU sweeps (the margin is relative to it)
MARGIN = 0.005
GPU_TRUTH = (-0.030, -0.025, 0.011, -0.009)
GPU_SPREADS = (0.012, 0.012, 0.006, 0.004)


@attrs.frozen
class Scenario:
    name: str
    truth: tuple[float, ...]
    spreads: tuple[float, ...]
    shape: str = "normal"
    skew: float = 0.0
    rho: float = 0.0  # correlation of the comparisons through the shared baseline
    failed: float = 0.0  # share of trials that fail
    looks: tuple[int, ...] = LOOKS
    margin: float | None = None

    @property
    def null(self) -> np.ndarray:
        return np.asarray(self.truth) == 0


def null(k: int = 4, sd: float = 0.01) -> tuple[tuple[float, ...], tuple[float, ...]]:
    return (0.0,) * k, (sd,) * k


SCENARIOS = (
    Scenario("Gaussian", *null()),
    Scenario("Student t(3)", *null(), "t3"),
    *(Scenario(f"{shape} skew {skew:+g}", *null(), shape, skew)
      for shape in ("gamma", "lognormal") for skew in (0.75, -0.75, 1.5, -1.5)),
    Scenario("two-mode (one run in five), skew +1.2", *null(), "two-mode", 1.2),
    Scenario("two-mode (one run in five), skew -1.2", *null(), "two-mode", -1.2),
    Scenario("15% failed trials", *null(), failed=0.15),
    Scenario("15% failed trials, gamma skew +1.5", *null(), "gamma", 1.5, failed=0.15),
    Scenario("K = 2", *null(2)),
    Scenario("K = 8, looks 3, 6, 9, 12", *null(8), looks=(3, 6, 9, 12)),
    Scenario("one comparison 3x the others' spread", (0.0,) * 4, (0.03, 0.01, 0.01, 0.01)),
    Scenario("shared baseline, rho 0.8", *null(), rho=0.8),
    Scenario("shared baseline, rho 0.5, gamma skew +1.5 (differences' skew 0.9)", *null(), "gamma", 1.5, rho=0.5),
    Scenario("three decided, one null (alpha passed on)", (-0.03, -0.03, -0.03, 0.0), (0.01,) * 4),
    Scenario("three decided, one null, gamma skew +1.5", (-0.03, -0.03, -0.03, 0.0), (0.01,) * 4, "gamma", 1.5),
    Scenario("three decided, one null, two-mode +1.2", (-0.03, -0.03, -0.03, 0.0), (0.01,) * 4, "two-mode", 1.2),
    Scenario("GPU effects and spreads", GPU_TRUTH, GPU_SPREADS, margin=MARGIN),
    Scenario("GPU effects, sd 0.008", GPU_TRUTH, (0.008,) * 4, margin=MARGIN),
    Scenario("GPU effects, sd 0.012", GPU_TRUTH, (0.012,) * 4, margin=MARGIN),
    Scenario("GPU effects and spreads, 15% failed", GPU_TRUTH, GPU_SPREADS, margin=MARGIN, failed=0.15),
    Scenario("equivalence: truth 0, sd 0.004", (0.0,) * 4, (0.004,) * 4, margin=MARGIN),
)


def lognormal_sigma(skew: float) -> float:
    return optimize.brentq(lambda s: (math.exp(s * s) + 2) * math.sqrt(math.exp(s * s) - 1) - abs(skew), 1e-6, 3.0)


def noise(rng: np.random.Generator, size, shape: str, skew: float) -> np.ndarray:
    """Mean 0, sd 1 noise of the scenario's shape (t(3) scaled to sd 1; lognormal of skewness `skew`)."""
    if shape == "t3":
        return rng.standard_t(3, size) / math.sqrt(3)
    if shape == "lognormal":
        sigma = lognormal_sigma(skew)
        x = rng.lognormal(0.0, sigma, size)
        standard = (x - math.exp(sigma ** 2 / 2)) / math.sqrt((math.exp(sigma ** 2) - 1) * math.exp(sigma ** 2))
        return math.copysign(1.0, skew) * standard
    return shape_draws(rng, size, shape, skew)


def differences(rng: np.random.Generator, scenario: Scenario, sweeps: int) -> np.ndarray:
    """d[sweep, comparison, seed], NaN where a trial of the pair failed."""
    k, seeds = len(scenario.truth), scenario.looks[-1]
    own = noise(rng, (sweeps, k, seeds), scenario.shape, scenario.skew)
    shared = noise(rng, (sweeps, 1, seeds), scenario.shape, scenario.skew)
    z = math.sqrt(1 - scenario.rho) * own + math.sqrt(scenario.rho) * shared
    d = np.asarray(scenario.truth)[None, :, None] + np.asarray(scenario.spreads)[None, :, None] * z
    if scenario.failed:
        lost = (rng.random((sweeps, k, seeds)) < scenario.failed) | (rng.random((sweeps, 1, seeds)) < scenario.failed)
        d[lost] = np.nan
    return d


@attrs.frozen
class Outcome:
    error: float  # share of sweeps with a comparison of truth 0 called lower or higher
    first_look: float  # the same, called at the first look
    wrong_sign: float  # share of sweeps with a comparison of truth != 0 called the wrong way
    decided: np.ndarray  # per comparison, share of sweeps decided
    all_decided: float
    trials: float  # mean trials per sweep
    seeds: np.ndarray  # per comparison, mean seeds run
    flagged: float  # share of sweeps the shape check flagged


def simulate(scenario: Scenario, sweeps: int, seed: int) -> Outcome:
    k = len(scenario.truth)
    design = LookDesign(k, scenario.looks, margin=scenario.margin).calibrated()
    d = differences(np.random.default_rng(seed), scenario, sweeps)
    result = decide(d, np.full((sweeps, k), scenario.looks[-1]), design, np.full((sweeps, k), LOSS))
    called = np.isin(result.code, (LOWER, HIGHER))
    truth = np.asarray(scenario.truth)
    wrong = called & (np.sign(truth)[None, :] != 0) & (np.where(result.code == LOWER, -1, 1) != np.sign(truth))
    seeds = np.asarray(scenario.looks)[result.look]
    decided = called | (result.code == EQUIVALENT)
    early = (called & (result.look == 0))[:, scenario.null]
    return Outcome(error=float(called[:, scenario.null].any(1).mean()), first_look=float(early.any(1).mean()),
                   wrong_sign=float(wrong.any(1).mean()),
                   decided=decided.mean(0), all_decided=float(decided.all(1).mean()),
                   trials=float((seeds.sum(1) + seeds.max(1)).mean()), seeds=seeds.mean(0),
                   flagged=float((result.flagged_at >= 0).mean()))


def monte_carlo_se(rate: float, sweeps: int) -> float:
    return math.sqrt(max(rate * (1 - rate), 1 / sweeps) / sweeps)


def row(scenario: Scenario, outcome: Outcome, sweeps: int) -> str:
    truths = ", ".join(f"{t:+g}/{s:g}" for t, s in zip(scenario.truth, scenario.spreads))
    error = (f"{outcome.error:.4f} ± {monte_carlo_se(outcome.error, sweeps):.4f} | {outcome.first_look:.4f}"
             if scenario.null.any() else "- | -")
    return (f"| {scenario.name} | {truths} | {', '.join(map(str, scenario.looks))} | {error} | "
            f"{outcome.wrong_sign:.4f} | {', '.join(f'{x:.3f}' for x in outcome.decided)} | {outcome.all_decided:.3f} | "
            f"{', '.join(f'{x:.1f}' for x in outcome.seeds)} | {outcome.trials:.1f} | {outcome.flagged:.3f} |")


def table(sweeps: int, seed: int) -> str:
    design = LookDesign(4)
    lines = [f"{sweeps:,} sweeps per row. Design: looks after {', '.join(map(str, design.looks))} seeds (K = 8: 3, 6, "
             f"9, 12), Hwang-Shih-DeCani spending g = {design.spending:g}, Holm's alpha passed on, family-wise alpha "
             f"{1 - design.confidence:.2f}; base levels for shapes up to gamma skew 1 either sign; once the pooled "
             f"residual skewness (each comparison's pairs up to its last look) exceeds {design.check:g}, a call in the "
             "direction opposite the skew, at every look, at one-sided levels for the heavier of the tails of gamma "
             "skew 2 and the two-mode shape (a call made before the flag that does not pass them is reopened). "
             "error: share of "
             "sweeps where a comparison of truth 0 was called better or worse ± its Monte Carlo standard error; wrong "
             f"sign: a real difference called the other way; margin (GPU rows): {100 * MARGIN:g}% of a loss of "
             f"{LOSS:g}; trials: the variants' seeds + the baseline's, per sweep.", "",
             "| scenario | truth/sd per comparison | looks | family-wise error | of it, at the first look | wrong sign | "
             "decided | all decided | seeds per comparison | trials per sweep | flagged |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for number, scenario in enumerate(SCENARIOS):
        lines.append(row(scenario, simulate(scenario, sweeps, seed + number), sweeps))
    return "\n".join(lines)


if __name__ == "__main__":
    from bench.report import simulation_main

    simulation_main(__doc__, table, SECTION, 4_000, Path(__file__).resolve().parents[1] / "docs" / "statistics.md")
