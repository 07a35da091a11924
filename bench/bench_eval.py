"""What one evaluation costs against a training step, eager and replayed from its CUDA graph.

    python bench/bench_eval.py [--preset small] [--batch-size 4] [--seq-len 256] [--eval-batches 8 4] [--steps 6]
    python bench/bench_eval.py --batch-size 64 --seq-len 1024 --compile --bf16-residual --write   # a gpu trial's shape

Times, on this machine's device, the mean optimizer step (after two warm-up steps), the best
of three `Trainer.evaluate()` of each `--eval-batches` (forward only, the trial's eval windows),
eagerly and -- where the training step is a CUDA graph -- replayed from the evaluation's own
graph (`k3lab.train.graphs.GraphedForward`), and one trainer checkpoint (a sweep trial saves one
at every evaluation, with its report to Ray); all in units of training steps. An evaluation
every `k` steps then costs about (evaluation + checkpoint) / k of the training time.

On a CPU this measures the CPU's ratio (no CUDA graph there): the GPU's differs and has to be
measured on one.
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
from k3lab.train.spec import TrainSpec  # noqa: E402
from k3lab.train.trainer import Trainer, save_trainer  # noqa: E402

SECTION = "Evaluation: eager against its CUDA graph"


def synced(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def best_of_three(trainer: Trainer) -> float:
    trainer.evaluate()  # the first builds the eval windows (and captures the eval graph)
    runs = []
    for _ in range(3):
        start = time.perf_counter()
        trainer.evaluate()
        synced(trainer.device)
        runs.append(time.perf_counter() - start)
    return min(runs)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--preset", default="small")
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--eval-batches", type=int, nargs="+", default=[8, 4])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--compile", action="store_true", help="compile the blocks, as the gpu profiles do")
    parser.add_argument("--bf16-residual", action="store_true", help="residual_in_fp32: false, as the gpu profiles")
    parser.add_argument("--write", action="store_true", help="write the table into docs/benchmarks.md")
    args = parser.parse_args()
    config = load_preset(args.preset)
    if args.bf16_residual:
        config = attrs.evolve(config, residual_in_fp32=False)
    spec = TrainSpec(steps=args.steps + 2, batch_size=args.batch_size, seq_len=args.seq_len, warmup_steps=1,
                     eval_batches=max(args.eval_batches), compile=args.compile)
    trainer = Trainer(config, spec)
    device = trainer.device
    times = []
    for step in range(args.steps + 2):
        start = time.perf_counter()
        trainer.train_step()["train_loss"].item()
        synced(device)
        if step >= 2:
            times.append(time.perf_counter() - start)
    step_s = statistics.fmean(times)
    shape = f"{args.preset} on {device}, {args.batch_size} x {args.seq_len} tokens"
    print(f"{shape}: training step {step_s:.3f} s (mean of {len(times)}, best {min(times):.3f} s)", flush=True)
    rows = []
    graph = trainer.eval_graph
    for batches in args.eval_batches:
        trainer.spec = attrs.evolve(spec, eval_batches=batches)
        trainer.eval_graph = None
        eager_s = best_of_three(trainer)
        trainer.eval_graph = graph
        graphed_s = best_of_three(trainer) if graph is not None else None
        rows.append((batches, eager_s, graphed_s))
        graphed = (f"; CUDA graph {graphed_s:.3f} s = {graphed_s / step_s:.2f} training steps"
                   if graphed_s is not None else "")
        print(f"evaluation of {batches} batches: eager {eager_s:.3f} s (best of 3) = {eager_s / step_s:.2f} training "
              f"steps{graphed}", flush=True)
    with tempfile.TemporaryDirectory() as folder:
        start = time.perf_counter()
        save_trainer(trainer, folder)
        save_s = time.perf_counter() - start
    print(f"trainer checkpoint: {save_s:.3f} s = {save_s / step_s:.2f} training steps")
    if args.write:
        from bench.report import write_section

        write_section(SECTION, table(shape, step_s, rows, save_s))


def table(shape: str, step_s: float, rows: list, save_s: float) -> str:
    lines = [f"{shape}: training step {1e3 * step_s:.1f} ms (mean, after two warm-up steps). "
             "Evaluation: best of three `Trainer.evaluate()`; in training steps: its time over the step's.", "",
             "| eval batches | eager (ms) | eager (steps) | CUDA graph (ms) | CUDA graph (steps) | graph vs eager |",
             "|---|---|---|---|---|---|"]
    for batches, eager_s, graphed_s in rows:
        graphed = (f"{1e3 * graphed_s:.1f} | {graphed_s / step_s:.2f} | {graphed_s / eager_s:.2f}x"
                   if graphed_s is not None else "- | - | -")
        lines.append(f"| {batches} | {1e3 * eager_s:.1f} | {eager_s / step_s:.2f} | {graphed} |")
    lines += ["", f"One trainer checkpoint: {1e3 * save_s:.0f} ms = {save_s / step_s:.2f} training steps."]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
