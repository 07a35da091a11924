"""The plan of a sweep: the lines `k3lab variants`, `k3lab sweep --dry-run` and `k3lab sweep`
all print first, so a preview and the run it previews read the same.

    attnres_block (cpu profile): 5 variants x 1 seeds = 5 trials, 100 steps of 1,024 tokens
    note: train.warmup_steps: the default 20 is clipped to steps=10
"""

from __future__ import annotations

from k3lab.registry.sweep import Sweep


def profile_label(sweep: Sweep) -> str:
    """'cpu profile', or 'top-level settings' when no profile applies."""
    return f"{sweep.profile} profile" if sweep.profile else "top-level settings"


def plan_header(sweep: Sweep) -> str:
    """One line: the sweep, its profile, variants x seeds = trials, and the length of a trial."""
    return (f"{sweep.name} ({profile_label(sweep)}): {len(sweep.valid_variants)} variants x {len(sweep.seeds)} "
            f"seeds = {len(sweep.trials)} trials, {sweep.train.steps} steps of {sweep.train.tokens_per_step:,} tokens")


def plan_lines(sweep: Sweep) -> list[str]:
    """The header, then a note for every default adapted to the file's settings."""
    return [plan_header(sweep)] + [f"note: {note}" for note in sweep.notes]
