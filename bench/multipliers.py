"""The compute multiplier on simulated sweeps: how often its interval covers the truth, and how wide it is.

    python bench/multipliers.py --sweeps 2000 --write

Trial losses follow a power law in compute, L = 2 C^-alpha (C in multiples of the baseline's
budget), times a seed's effect shared by all trials of that seed and each trial's own noise. The
baseline trains at 1x and at the compute curve's scales; each of K variants trains at 1x with a
little more FLOPs per token and ends where the baseline's law is at its true multiplier times its
own compute. Each sweep is judged by `compute_multipliers`, as the report judges a stored one,
with the fixed-seed design (Bonferroni t over the K comparisons). --write puts the table into
docs/statistics.md; tests/test_compute.py asserts the coverage on the same simulation.
"""

from __future__ import annotations

import math
import random
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from k3lab.report.compute import compute_multipliers  # noqa: E402
from k3lab.report.records import TrialRecord  # noqa: E402
from k3lab.report.sequential import fixed_design  # noqa: E402

DOC = Path(__file__).resolve().parent.parent / "docs" / "statistics.md"
SECTION = "Compute multipliers, simulated"
SCALES = (1.25, 1.6, 2.0)
CURVES = {"base": {f"base_x{s:g}": s for s in SCALES}}
TRUTHS = {"v1": 1.25, "v2": 1.0, "v3": 0.9, "v4": 1.5}
STEPS, FLOPS = 1000, 1.0e6
ALPHA, SEED_SPREAD, TRIAL_NOISE, EXTRA_FLOPS = 0.1, 0.01, 0.004, 0.01


def record(variant: str, seed: int, steps: int, flops: float, loss: float) -> TrialRecord:
    """A finished trial as the report reads it: its steps, FLOPs per token and final loss."""
    return TrialRecord(run_id=f"{variant}-{seed}", variant=variant, seed=seed, status="FINISHED",
                       params={"train.steps": str(steps), "train.batch_size": "1", "train.seq_len": "1000"},
                       final={"flops_per_token": flops, "val_loss": loss}, start_ms=None, end_ms=None,
                       curves={"val_loss": [(steps, loss)]})


def simulated_sweep(rng: random.Random, truths: dict[str, float], seeds: int, alpha: float = ALPHA,
                    sd_seed: float = SEED_SPREAD, sd_trial: float = TRIAL_NOISE,
                    extra_flops: float = EXTRA_FLOPS) -> list[TrialRecord]:
    """One sweep's trials (see the module docstring)."""
    records = []
    for seed in range(seeds):
        shared = rng.gauss(0, sd_seed)
        for scale in (1.0, *SCALES):
            name = "base" if scale == 1 else f"base_x{scale:g}"
            loss = 2.0 * scale ** -alpha * math.exp(shared + rng.gauss(0, sd_trial))
            records.append(record(name, seed, round(STEPS * scale), FLOPS, loss))
        for variant, truth in truths.items():
            compute = 1 + extra_flops
            loss = 2.0 * (truth * compute) ** -alpha * math.exp(shared + rng.gauss(0, sd_trial))
            records.append(record(variant, seed, STEPS, FLOPS * compute, loss))
    return records


def simulate(seeds: int, sweeps: int, seed: int, sd_trial: float = TRIAL_NOISE) -> dict:
    """Family-wise coverage, each variant's coverage and median half-width (in x) over `sweeps`."""
    rng, design = random.Random(seed), fixed_design(len(TRUTHS), seeds)
    covered_all, covered = 0, {v: 0 for v in TRUTHS}
    halves: dict[str, list[float]] = {v: [] for v in TRUTHS}
    for _ in range(sweeps):
        found = compute_multipliers(simulated_sweep(rng, TRUTHS, seeds, sd_trial=sd_trial),
                                    {v: "base" for v in TRUTHS}, CURVES, "val_loss", design)
        hits = {m.variant: m.low <= TRUTHS[m.variant] <= m.high for m in found}
        covered_all += len(hits) == len(TRUTHS) and all(hits.values())
        for m in found:
            covered[m.variant] += hits[m.variant]
            halves[m.variant].append((m.high - m.low) / 2)
    return {"family": covered_all / sweeps, "each": {v: c / sweeps for v, c in covered.items()},
            "half": {v: statistics.median(h) for v, h in halves.items()}}


def table(sweeps: int, seed: int) -> str:
    truths = ", ".join(f"{v} {t:g}x" for v, t in TRUTHS.items())
    lines = [f"K = {len(TRUTHS)} variants against one baseline whose compute curve is 1x, "
             f"{', '.join(f'{s:g}x' for s in SCALES)}; loss = 2 C^-{ALPHA:g} x the seed's effect (sd {SEED_SPREAD:g}, "
             f"shared by its trials) x each trial's noise; variants {EXTRA_FLOPS:.0%} more FLOPs per token; true "
             f"multipliers {truths}; {sweeps:,} sweeps per row; intervals: family-wise 95% Bonferroni t over "
             f"{len(TRUTHS)} (each at {5 / len(TRUTHS):g}%).", "",
             "| seeds | trial noise (sd of log loss) | family-wise coverage | coverage per variant | "
             "median half-width per variant |", "|---|---|---|---|---|"]
    for row, (seeds, noise) in enumerate(((4, TRIAL_NOISE), (6, TRIAL_NOISE), (10, TRIAL_NOISE), (6, 0.008))):
        outcome = simulate(seeds, sweeps, seed + row, noise)
        lines.append(f"| {seeds} | {noise:g} | {outcome['family']:.4f} | "
                     f"{', '.join(f'{c:.3f}' for c in outcome['each'].values())} | "
                     f"{', '.join(f'±{h:.3f}x' for h in outcome['half'].values())} |")
    return "\n".join(lines)


def main() -> None:
    from bench.report import simulation_main

    simulation_main(__doc__, table, SECTION, 2000, DOC)


if __name__ == "__main__":
    main()
