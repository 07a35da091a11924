"""What one evaluation costs against a training step, for choosing `eval_interval`.

    python bench/bench_eval.py [--preset small] [--batch-size 4] [--seq-len 256] [--eval-batches 8 4] [--steps 6]

Times, on this machine's device, the mean optimizer step (after two warm-up steps), the best
of three `Trainer.evaluate()` of each `--eval-batches` (forward only, the trial's eval windows) and one
trainer checkpoint (a sweep trial saves one at every evaluation, with its report to Ray), and
prints them in units of training steps. An evaluation every `k` steps then costs about
(evaluation + checkpoint) / k of the training time.

On a CPU this measures the CPU's ratio: the GPU's differs (there the optimizer step and the
CUDA-graph replay weigh differently against an eager forward) and has to be measured on one.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import attrs
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from k3lab.registry import load_preset  # noqa: E402
from k3lab.registry.train_spec import TrainSpec  # noqa: E402
from k3lab.runner.train.trainer import Trainer, save_trainer  # noqa: E402


def synced(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--preset", default="small")
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--eval-batches", type=int, nargs="+", default=[8, 4])
    parser.add_argument("--steps", type=int, default=6)
    args = parser.parse_args()
    spec = TrainSpec(steps=args.steps + 2, batch_size=args.batch_size, seq_len=args.seq_len, warmup_steps=1,
                     eval_batches=max(args.eval_batches))
    trainer = Trainer(load_preset(args.preset), spec)
    device = trainer.device
    times = []
    for step in range(args.steps + 2):
        start = time.perf_counter()
        trainer.train_step()["train_loss"].item()
        synced(device)
        if step >= 2:
            times.append(time.perf_counter() - start)
    step_s = statistics.fmean(times)
    print(f"{args.preset} on {device}, {args.batch_size} x {args.seq_len} tokens: training step {step_s:.3f} s "
          f"(mean of {len(times)}, best {min(times):.3f} s)", flush=True)
    for batches in args.eval_batches:
        trainer.spec = attrs.evolve(spec, eval_batches=batches)
        trainer.evaluate()  # the first builds the eval windows
        runs = []
        for _ in range(3):
            start = time.perf_counter()
            trainer.evaluate()
            synced(device)
            runs.append(time.perf_counter() - start)
        eval_s = min(runs)
        print(f"evaluation of {batches} batches: {eval_s:.3f} s (best of 3) = {eval_s / step_s:.2f} training "
              f"steps (best step {min(times):.3f} s: {eval_s / min(times):.2f})", flush=True)
    with tempfile.TemporaryDirectory() as folder:
        start = time.perf_counter()
        save_trainer(trainer, folder)
        save_s = time.perf_counter() - start
    print(f"trainer checkpoint: {save_s:.3f} s = {save_s / step_s:.2f} training steps")


if __name__ == "__main__":
    main()
