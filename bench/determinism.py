"""Does a trial's GPU step repeat itself, and which gradients do not?

    python bench/determinism.py experiments/attnres_block.yaml --profile gpu --variants 0,1 [--deterministic]

For each variant (an index into the profile's variants): a Trainer of seed 0 with the profile's
train spec (compiled blocks and CUDA graph where it runs them) on the `stdlib` corpus, then
1. `--steps` training steps three times, restarted with seed 0 in between (`Trainer.restart`):
   the second and third runs are graph replays from the same state, compared step by step;
2. from one state and one batch, an eager forward and backward twice: which parameters'
   gradients differ, grouped by name (layer numbers left out), with the largest relative
   difference;
3. the same forward and backward under `torch.use_deterministic_algorithms(True, warn_only=True)`:
   the operations torch warns have no deterministic algorithm by default.
`--deterministic` runs it all with `train.deterministic: true`. The run time of each run is the
wall time of its steps, synchronised at the end.
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from pathlib import Path

import attrs
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("file", help="sweep file")
    parser.add_argument("--profile", default="gpu")
    parser.add_argument("--variants", default="0", help="indices into the profile's variants, e.g. 0,1")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--deterministic", action="store_true", help="train.deterministic: true")
    parser.add_argument("--device", default=None, help="default: cuda where there is one")
    return parser.parse_args()


def repeated_runs(trainer, steps: int) -> tuple[list[list[float]], list[float]]:
    """Three runs of `steps` steps from seed 0's start; their losses and wall times."""
    runs, times = [], []
    for run in range(3):
        if run:
            trainer.restart(0)
        started = time.perf_counter()
        runs.append(torch.stack([trainer.train_step()["train_loss"] for _ in range(steps)]).tolist())
        times.append(time.perf_counter() - started)
    return runs, times


def gradients(trainer, x, y) -> dict[str, torch.Tensor]:
    trainer.model.zero_grad(set_to_none=True)
    trainer.micro_batch_loss(x, y).backward()
    return {n: p.grad.detach().clone() for n, p in trainer.model.named_parameters() if p.grad is not None}


def differing_gradients(first: dict, second: dict) -> dict[str, tuple[int, float]]:
    """name without layer numbers -> (tensors that differ, largest difference / largest value)."""
    groups: dict[str, tuple[int, float]] = {}
    for name, grad in first.items():
        if torch.equal(grad, second[name]):
            continue
        relative = (grad - second[name]).abs().max().item() / (grad.abs().max().item() or 1.0)
        key = ".".join(part for part in name.split(".") if not part.isdigit())
        count, worst = groups.get(key, (0, 0.0))
        groups[key] = (count + 1, max(worst, relative))
    return groups


def flagged_operations(trainer, x, y, deterministic: bool) -> list[str]:
    """The first line of each warning torch gives for an operation without a deterministic default."""
    torch.use_deterministic_algorithms(True, warn_only=True)  # a warning for each, not an error at the first
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        gradients(trainer, x, y)
    torch.use_deterministic_algorithms(deterministic)  # as the trainer had it
    return sorted({str(w.message).splitlines()[0][:160] for w in caught if "determinis" in str(w.message)})


def main() -> None:
    args = parse_args()
    from k3lab.registry.sweep_cli import load_sweep_for
    from k3lab.runner.train.trainer import Trainer
    from k3lab.runner.runtime.kernel_cache import open_kernel_cache

    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type == "cuda":
        open_kernel_cache(say=print)
    sweep = load_sweep_for(args.file, args.profile)
    for index in (int(i) for i in args.variants.split(",")):
        variant = sweep.valid_variants[index]
        spec = attrs.evolve(sweep.train, steps=max(sweep.train.steps, args.steps + 1), dataset="stdlib",
                            deterministic=args.deterministic)
        trainer = Trainer(variant.config, spec, seed=0, device=device)
        runs, times = repeated_runs(trainer, args.steps)
        same = [a == b for a, b in zip(runs[1], runs[2])]
        first = same.index(False) + 1 if False in same else None
        print(f"{variant.name}: runs of {args.steps} steps in {', '.join(f'{t:.1f}' for t in times)} s; "
              f"the 2nd and 3rd equal at {sum(same)}/{args.steps} steps, first differing step {first}; "
              f"last losses {runs[1][-1]:.6f} and {runs[2][-1]:.6f}", flush=True)
        trainer.restart(0)
        x, y = trainer.sampler.next_batch(trainer.device)
        first_grads, second_grads = gradients(trainer, x, y), gradients(trainer, x, y)
        groups = differing_gradients(first_grads, second_grads)
        print(f"{variant.name}: {sum(n for n, _ in groups.values())} of {len(first_grads)} gradients differ "
              "between two backwards of one state and batch", flush=True)
        for key, (count, worst) in sorted(groups.items()):
            print(f"   {key}: {count} tensors, largest relative difference {worst:.2e}")
        flagged = flagged_operations(trainer, x, y, args.deterministic)
        print(f"{variant.name}: operations torch flags as nondeterministic: {len(flagged)}", flush=True)
        for line in flagged:
            print("   " + line)
        del trainer
        if device.type == "cuda":
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
