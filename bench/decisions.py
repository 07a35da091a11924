"""The decisions rule on simulated sweeps: error rates, coverage and pairs spent, through the policy.

    python bench/decisions.py --sweeps 10000 --write          # the every-pair Pocock design, through SeedPlanner
    python bench/decisions.py --looks --sweeps 6000 --write  # the looks design, vectorised (bench/looks_sweeps.py)

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
from scipy import optimize

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from k3lab.report.calibration import SKEW_COVERED, null_draws  # noqa: E402
from k3lab.report.sequential import BETTER, NOT_RESOLVED, WORSE, Design, compare_family  # noqa: E402
from k3lab.runner.tune.planner import FINISHED, SeedPlanner  # noqa: E402

DOC = Path(__file__).resolve().parent.parent / "docs" / "statistics.md"
SECTION = "Simulated sweeps"
K, START, MAX_PAIRS = 4, 4, 16
BASE_LOSS = 2.0
SEED_SPREAD = 0.02  # the seed-to-seed spread, shared by the trials of one seed (cancels in the pairs)
NAMES = ["base"] + [f"v{i}" for i in range(1, K + 1)]


@attrs.frozen
class Scenario:
    """True differences and the spreads of the paired differences of the K comparisons; the
    baseline's own trial noise (shared by every pair); the noise's shape: `normal`, `lognormal`
    on every arm (centred, sigma 1: the differences stay about symmetric), or one-sided: the
    variants' own noise skewed (`gamma`, `lognormal` or `shock`: Gaussian with an occasional bad
    run), the baseline's Gaussian, so that each paired difference has skewness `skew`."""

    name: str
    truth: tuple[float, ...]
    spreads: tuple[float, ...]
    baseline_spread: float
    shape: str = "normal"
    skew: float = 0.0


EQUAL_NOISE = 0.004  # every trial: its pairs' differences correlate 0.5 through the shared baseline
ONE_SIDED = 0.004 * 3.5  # the variants' own noise: 3.5x the baseline's, as on the H100
NULL, ONE_SIDED_SPREADS = (0.0,) * K, (math.hypot(ONE_SIDED, EQUAL_NOISE),) * K
SCENARIOS = (
    Scenario("all null", NULL, (EQUAL_NOISE * math.sqrt(2),) * K, EQUAL_NOISE),
    Scenario("the H200 spreads", (-0.029, -0.008, 0.011, 0.0), (0.009, 0.003, 0.007, 0.008), 0.002),
    Scenario("all null, lognormal noise on every arm", NULL, (EQUAL_NOISE * math.sqrt(2),) * K, EQUAL_NOISE,
             shape="lognormal"),
    *(Scenario(f"all null, one-sided gamma, skew {skew:g}", NULL, ONE_SIDED_SPREADS, EQUAL_NOISE, "gamma", skew)
      for skew in (0.35, 0.7, 1.0, 1.5)),
    Scenario("all null, one-sided lognormal, skew 1.5", NULL, ONE_SIDED_SPREADS, EQUAL_NOISE, "lognormal", 1.5),
    Scenario("all null, one-sided shock, skew 1.5", NULL, ONE_SIDED_SPREADS, EQUAL_NOISE, "shock", 1.5),
    Scenario("all null, one-sided gamma, skew 3", NULL, ONE_SIDED_SPREADS, EQUAL_NOISE, "gamma", 3.0),
)
COVERED = [s for s in SCENARIOS if s.truth == NULL and s.skew <= SKEW_COVERED]  # asserted: error <= alpha
SHOCK_RATE = 0.1  # the shock shape: a bad run in one trial of ten


def lognormal_sigma(skew: float) -> float:
    """The sigma of a lognormal of this skewness, (e^s2 + 2) sqrt(e^s2 - 1)."""
    return optimize.brentq(lambda s: (math.exp(s * s) + 2) * math.sqrt(math.exp(s * s) - 1) - skew, 1e-6, 3.0)


def shock_size(skew: float) -> float:
    """The shock J (in sd of the Gaussian part) at which N(0, 1) + J Bernoulli(SHOCK_RATE) has this skewness."""
    p = SHOCK_RATE
    return optimize.brentq(lambda j: p * (1 - p) * (1 - 2 * p) * j ** 3 / (1 + p * (1 - p) * j * j) ** 1.5 - skew,
                           1e-9, 100.0)


def standard_noise(rng, shape, kind: str, skew: float = 0.0) -> np.ndarray:
    """Mean 0, sd 1 noise: normal, lognormal (sigma 1, or of skewness `skew`), gamma or shock of skewness `skew`."""
    if kind == "normal":
        return rng.standard_normal(shape)
    if kind == "gamma":
        return null_draws(rng, shape, skew)
    if kind == "lognormal":
        sigma = lognormal_sigma(skew) if skew else 1.0
        x = rng.lognormal(0.0, sigma, shape)
        return (x - math.exp(sigma ** 2 / 2)) / math.sqrt((math.exp(sigma ** 2) - 1) * math.exp(sigma ** 2))
    j, p = shock_size(skew), SHOCK_RATE
    return (rng.standard_normal(shape) + j * (rng.random(shape) < p) - j * p) / math.sqrt(1 + p * (1 - p) * j * j)


def draw(rng, scenario: Scenario, sweeps: int) -> np.ndarray:
    """Trial results [sweep, variant (0: the baseline), seed]."""
    own = np.sqrt(np.asarray(scenario.spreads) ** 2 - scenario.baseline_spread ** 2)
    seed_part = rng.normal(0, SEED_SPREAD, (sweeps, 1, MAX_PAIRS))
    shift = np.concatenate([[0.0], scenario.truth])[None, :, None]
    if not scenario.skew:  # every arm the same shape
        sd = np.concatenate([[scenario.baseline_spread], own])[None, :, None]
        return BASE_LOSS + seed_part + shift + sd * standard_noise(rng, (sweeps, K + 1, MAX_PAIRS), scenario.shape)
    # one-sided: the variants' own noise has the skewness that gives the differences `skew`
    own_skew = scenario.skew * (own ** 2 + scenario.baseline_spread ** 2) ** 1.5 / own ** 3
    base = scenario.baseline_spread * rng.standard_normal((sweeps, 1, MAX_PAIRS))
    variants = np.stack([sd * standard_noise(rng, (sweeps, MAX_PAIRS), scenario.shape, g)
                         for sd, g in zip(own, own_skew)], axis=1)
    return BASE_LOSS + seed_part + shift + np.concatenate([base, variants], axis=1)


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


def designs() -> dict[str, Design]:
    """The design k3lab uses (calibrated for skew up to SKEW_COVERED) and the Gaussian t design."""
    return {f"skew {SKEW_COVERED:g}": Design(K, MAX_PAIRS, START).calibrated(),
            "Gaussian t": Design(K, MAX_PAIRS, START, skew=0.0).calibrated()}


def monte_carlo_se(rate: float, sweeps: int) -> float:
    return math.sqrt(max(rate * (1 - rate), 1 / sweeps) / sweeps)


def table(sweeps: int, seed: int) -> str:
    chosen = designs()
    levels = "; ".join(f"{name}: {100 * d.nominal:.4f}%" for name, d in chosen.items())
    lines = [f"K = {K} comparisons sharing one baseline, start {START}, max {MAX_PAIRS}, until decided, no margin; "
             f"{sweeps:,} sweeps per row and design through `SeedPlanner` and `compare_family`; each design's nominal "
             f"level per look ({levels}; alpha / K = {100 * chosen['Gaussian t'].alpha:.3g}%). One-sided rows: the "
             f"variants' own noise {ONE_SIDED / EQUAL_NOISE:g}x the baseline's and skewed, so that each paired "
             f"difference has the skewness named; error: family-wise error (truth 0) ± its Monte Carlo standard "
             f"error.", "",
             "| scenario | design | true differences / sds | pairs per comparison (mean) | decided | "
             "family-wise error (truth 0) | simultaneous coverage |", "|---|---|---|---|---|---|---|"]
    failures = []
    for number, scenario in enumerate(SCENARIOS):
        for name, design in chosen.items():
            outcome = simulate(scenario, sweeps, seed + number, design)
            error = outcome.family_error
            truths = ", ".join(f"{t:+g} / {s:.4g}" for t, s in zip(scenario.truth, scenario.spreads))
            lines.append(f"| {scenario.name} | {name} | {truths} | "
                         f"{', '.join(f'{p:.2f}' for p in outcome.pairs.mean(0))} | "
                         f"{', '.join(f'{d:.3f}' for d in outcome.decided.mean(0))} | "
                         f"{error:.4f} ± {monte_carlo_se(error, sweeps):.4f} | {outcome.covered.all(1).mean():.4f} |")
            if scenario in COVERED and design is chosen[f"skew {SKEW_COVERED:g}"] and error > 1 - design.confidence:
                failures.append(f"{scenario.name}: family-wise error {error:.4f} > {1 - design.confidence:g}")
    if failures:
        raise SystemExit("the design misses its target: " + "; ".join(failures))
    return "\n".join(lines)


def main() -> None:
    from bench.report import simulation_main

    if "--looks" in sys.argv:  # the looks design (k3lab.report.looks), vectorised: bench/looks_sweeps.py
        command = "python " + " ".join(sys.argv)
        sys.argv.remove("--looks")
        from bench.looks_sweeps import SECTION as LOOKS_SECTION, table as looks_table

        simulation_main(__doc__, looks_table, LOOKS_SECTION, 4_000, DOC, command)
        return
    simulation_main(__doc__, table, SECTION, 10_000, DOC)


if __name__ == "__main__":
    main()
