"""The compute multiplier on simulated sweeps: how often its interval covers the truth, and how wide it is.

    python bench/multipliers.py --sweeps 600 --write
    python bench/multipliers.py --sweeps 600 --before REV --write   # the same rows, k3lab as at git REV

Trial losses follow a curve in compute C (in multiples of the baseline's budget): a pure power law
L = 2 C^-alpha, a curved one, L = E + A C^-a + S / C (an irreducible loss E and a
learning-rate schedule term S / C: a short run spends a larger share of its steps in warmup and
decay), or one near its floor, L = 1 + 0.15 C^-0.8, times a seed's effect shared by all trials of that seed and each trial's own noise. The
baseline trains at 1x and at the compute curve's scales (the grid); each of K variants trains at
1x with a little more FLOPs per token and ends where the baseline's curve is at its true
multiplier times its own compute. Each sweep is judged by `compute_multipliers`, as the report
judges a stored one, with the design a sweep passes (the every-pair sequential design, K
comparisons, start 4, max 16, skew 1.5; the report reads from it what its code reads), reading
the curve by straight pieces in log-log or by the monotone cubic the report uses. A comparison
with no interval (its seeds censored beyond the curve) counts as not covered. --write puts the
table into docs/statistics.md; tests/test_compute.py asserts the coverage on the same simulation,
and the script fails (no table written) when the cubic reading on the finer grid covers less
than 0.93 per variant at 16 seeds on the curved curve.
"""

from __future__ import annotations

import math
import random
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from k3lab.report.compute_multipliers import compute_multipliers  # noqa: E402
from k3lab.report.records import TrialRecord  # noqa: E402
from k3lab.report.sequential import Design  # noqa: E402

DOC = Path(__file__).resolve().parent.parent / "docs" / "statistics.md"
SECTION = "Compute multipliers, simulated"
SCALES = (1.25, 1.6, 2.0)
CURVES = {"base": {f"base_x{s:g}": s for s in SCALES}}
GRIDS = {"1.25x-2x": SCALES, "factor 2": (0.5, 2.0), "finer": (0.5, 0.71, 1.41, 2.0)}
TRUTHS = {"v1": 1.25, "v2": 1.0, "v3": 0.9, "v4": 1.5}
STEPS, FLOPS = 1000, 1.0e6
ALPHA, SEED_SPREAD, TRIAL_NOISE, EXTRA_FLOPS = 0.1, 0.01, 0.004, 0.01
CURVES_OF = {"curved": (1.5, 0.6, 0.5, 0.05), "near floor": (1.0, 0.15, 0.8, 0.0)}  # E, A, a, S: E + A C^-a + S / C
CURVED = CURVES_OF["curved"]
TARGET_COVERAGE = 0.93
START, MAX_PAIRS = 4, 16  # the sweep's every-pair design the multipliers are handed


def loss_at(compute: float, curved: "bool | str", alpha: float = ALPHA) -> float:
    """The noiseless loss at `compute` (multiples of the baseline's budget); curved: False (the power
    law), True ("curved") or a name of CURVES_OF."""
    if not curved:
        return 2.0 * compute ** -alpha
    e, a, power, s = CURVES_OF["curved" if curved is True else curved]
    return e + a * compute ** -power + s / compute


def grid_curves(scales: tuple[float, ...]) -> dict[str, dict[str, float]]:
    return {"base": {f"base_x{s:g}": s for s in scales}}


def record(variant: str, seed: int, steps: int, flops: float, loss: float) -> TrialRecord:
    """A finished trial as the report reads it: its steps, FLOPs per token and final loss."""
    return TrialRecord(run_id=f"{variant}-{seed}", variant=variant, seed=seed, status="FINISHED",
                       params={"train.steps": str(steps), "train.batch_size": "1", "train.seq_len": "1000"},
                       final={"flops_per_token": flops, "val_loss": loss}, start_ms=None, end_ms=None,
                       curves={"val_loss": [(steps, loss)]})


def simulated_sweep(rng: random.Random, truths: dict[str, float], seeds: int, alpha: float = ALPHA,
                    sd_seed: float = SEED_SPREAD, sd_trial: float = TRIAL_NOISE,
                    extra_flops: float = EXTRA_FLOPS, scales: tuple[float, ...] = SCALES,
                    curved: "bool | str" = False) -> list[TrialRecord]:
    """One sweep's trials (see the module docstring)."""
    records = []
    for seed in range(seeds):
        shared = rng.gauss(0, sd_seed)
        for scale in (1.0, *scales):
            name = "base" if scale == 1 else f"base_x{scale:g}"
            loss = loss_at(scale, curved, alpha) * math.exp(shared + rng.gauss(0, sd_trial))
            records.append(record(name, seed, round(STEPS * scale), FLOPS, loss))
        for variant, truth in truths.items():
            compute = 1 + extra_flops
            loss = loss_at(truth * compute, curved, alpha) * math.exp(shared + rng.gauss(0, sd_trial))
            records.append(record(variant, seed, STEPS, FLOPS * compute, loss))
    return records


def simulate(seeds: int, sweeps: int, seed: int, sd_trial: float = TRIAL_NOISE, scales: tuple[float, ...] = GRIDS["finer"],
             curved: "bool | str" = False, cubic: bool = True) -> dict:
    """Family-wise coverage, each variant's coverage and median half-width (in x) over `sweeps`;
    the share of seeds censored beyond the curve."""
    rng, design = random.Random(seed), Design(len(TRUTHS), MAX_PAIRS, START)
    covered_all, covered, censored = 0, {v: 0 for v in TRUTHS}, 0
    halves: dict[str, list[float]] = {v: [] for v in TRUTHS}
    for _ in range(sweeps):
        found = compute_multipliers(simulated_sweep(rng, TRUTHS, seeds, sd_trial=sd_trial, scales=scales,
                                                    curved=curved),
                                    {v: "base" for v in TRUTHS}, grid_curves(scales), "val_loss", design,
                                    cubic=cubic)
        hits = {m.variant: m.low is not None and m.low <= TRUTHS[m.variant] <= m.high for m in found}
        covered_all += len(hits) == len(TRUTHS) and all(hits.values())
        for m in found:
            covered[m.variant] += hits[m.variant]
            censored += len(m.censored)
            if m.low is not None:
                halves[m.variant].append((m.high - m.low) / 2)
    return {"family": covered_all / sweeps, "each": {v: c / sweeps for v, c in covered.items()},
            "half": {v: statistics.median(h) if h else math.nan for v, h in halves.items()},
            "censored": censored / (sweeps * seeds * len(TRUTHS))}


ROWS = [  # (curve, grid, reading, seeds, trial noise)
    *((False, "finer", True, seeds, TRIAL_NOISE) for seeds in (4, 6, 10)),
    (False, "finer", True, 6, 0.008),
    (False, "1.25x-2x", True, 6, TRIAL_NOISE),  # no budget under 1x: v2 and v3 sit at or below the curve's end
    *((curved, grid, cubic, 16, TRIAL_NOISE) for curved in (False, True) for grid in ("factor 2", "finer")
      for cubic in (False, True)),
    *(("near floor", grid, True, seeds, noise) for grid in ("factor 2", "finer") for seeds, noise in
      ((6, TRIAL_NOISE), (16, TRIAL_NOISE), (16, 0.001))),
]


def table(sweeps: int, seed: int) -> str:
    truths = ", ".join(f"{v} {t:g}x" for v, t in TRUTHS.items())
    e, a, power, s = CURVED
    lines = [f"K = {len(TRUTHS)} variants against one baseline; curves: power law L = 2 C^-{ALPHA:g}, curved L = "
             f"{e:g} + {a:g} C^-{power:g} + {s:g} / C, near floor L = 1 + 0.15 C^-0.8 (C in multiples of the baseline's budget); grids (the "
             f"baseline's budgets besides 1x): " + "; ".join(f"{name} {', '.join(f'{x:g}x' for x in g)}"
                                                            for name, g in GRIDS.items()) +
             f"; loss x the seed's effect (sd {SEED_SPREAD:g}, shared by its trials) x each trial's noise; variants "
             f"{EXTRA_FLOPS:.0%} more FLOPs per token; true multipliers {truths}; {sweeps:,} sweeps per row; "
             f"intervals: as `compute_multipliers` builds them from the sweep's design (every-pair, start {START}, max "
             f"{MAX_PAIRS}, K {len(TRUTHS)}, 95%); reading: "
             "straight pieces or the monotone cubic (PCHIP) in log-log; censored: the share of seeds beyond the "
             "curve's ends.", "",
             "| curve | grid | reading | seeds | trial noise (sd of log loss) | family-wise coverage | "
             "coverage per variant | median half-width per variant | censored |", "|---|---|---|---|---|---|---|---|---|"]
    failures = []
    for row, (curved, grid, cubic, seeds, noise) in enumerate(ROWS):
        outcome = simulate(seeds, sweeps, seed + row, noise, GRIDS[grid], curved, cubic)
        lines.append(f"| {curved if isinstance(curved, str) else 'curved' if curved else 'power law'} | {grid} | {'cubic' if cubic else 'straight'} | "
                     f"{seeds} | {noise:g} | {outcome['family']:.4f} | "
                     f"{', '.join(f'{c:.3f}' for c in outcome['each'].values())} | "
                     f"{', '.join(f'±{h:.3f}x' for h in outcome['half'].values())} | {outcome['censored']:.4f} |")
        if curved is True and grid == "finer" and cubic and min(outcome["each"].values()) < TARGET_COVERAGE:
            failures.append(f"curved, finer grid, cubic: coverage {min(outcome['each'].values()):.3f}")
    if failures:
        raise SystemExit("below the target coverage " + "; ".join(failures))
    return "\n".join(lines)


def before(revision: str) -> None:
    """Import k3lab as it was at git `revision` (extracted to a temporary folder) instead of this tree's."""
    import subprocess
    import tempfile

    folder = tempfile.mkdtemp(prefix="k3lab-before-")
    root = Path(__file__).resolve().parent.parent
    archive = subprocess.run(["git", "-C", str(root), "archive", revision, "k3lab"], check=True, capture_output=True)
    subprocess.run(["tar", "-x", "-C", folder], input=archive.stdout, check=True)
    for name in [m for m in sys.modules if m == "k3lab" or m.startswith("k3lab.")]:
        del sys.modules[name]
    sys.path.insert(0, folder)
    global compute_multipliers, Design
    from k3lab.report.compute_multipliers import compute_multipliers
    from k3lab.report.sequential import Design


def main() -> None:
    from bench.report import simulation_main

    command, section = "python " + " ".join(sys.argv), SECTION
    if "--before" in sys.argv:
        at = sys.argv.index("--before")
        revision = sys.argv[at + 1]
        del sys.argv[at:at + 2]
        before(revision)
        section = f"{SECTION}: before"
    simulation_main(__doc__, table, section, 600, DOC, command)


if __name__ == "__main__":
    main()
