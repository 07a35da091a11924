"""Write a sweep file's gpu profile cut to its trials' first steps, for scripts/tune_shipped.sh.

    python scripts/first_steps_sweep.py experiments/attnres_block.yaml OUT.yaml

The copy runs seed 0 of every variant for four steps (two eager, the CUDA-graph capture and one
replay) and evaluates once, with no seeds policy or budget: what each trial compiles before it
trains, written into the kernel cache by trial processes (on an H200 they key torch.compile's
graphs otherwise than a plain process does, so the shipped archive needs theirs).
"""

from __future__ import annotations

import sys

import yaml

FIRST_STEPS = {"steps": 4, "warmup_steps": 0, "eval_interval": 4, "eval_batches": 1}


def first_steps(sweep: dict, profile: str = "gpu") -> dict:
    """The sweep with `profile` cut to seed 0 and FIRST_STEPS (YAML merges already resolved)."""
    chosen = sweep["profiles"][profile]
    chosen.pop("budget", None)
    chosen["seeds"] = [0]
    chosen["train"] = {**chosen.get("train", {}), **FIRST_STEPS}
    return sweep


def main() -> None:
    source, out = sys.argv[1:3]
    with open(source) as f:
        sweep = first_steps(yaml.safe_load(f))
    with open(out, "w") as f:
        yaml.safe_dump(sweep, f, sort_keys=False)


if __name__ == "__main__":
    main()
