"""Training throughput of one preset against what the data pipeline can feed.

    python bench/bench_train.py [--preset tiny] [--steps 100] [--batch-size 8] [--seq-len 128] [--write]

Runs `steps` optimizer steps of the preset in-process (no tracking), reports the wall
time, the training tokens/s, and the BatchSampler's tokens/s on the same batch shape,
so the ratio shows whether the step ever waits on data. The CPU target for `tiny`:
100 steps in under a minute on 2 cores.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.report import write_section  # noqa: E402
from k3lab.data import BatchSampler, prepare_dataset  # noqa: E402
from k3lab.registry import load_preset  # noqa: E402
from k3lab.registry.train_spec import TrainSpec  # noqa: E402
from k3lab.runner.train.loop import fit  # noqa: E402
from k3lab.runner.train.trainer import Trainer  # noqa: E402


def sampler_tokens_per_s(tokens, batch_size: int, seq_len: int, device: torch.device, batches: int = 200) -> float:
    sampler = BatchSampler(tokens, batch_size, seq_len, seed=1)
    start = time.perf_counter()
    for _ in range(batches):
        sampler.next_batch(device)
    if device.type == "cuda":
        torch.cuda.synchronize()
    return batches * batch_size * seq_len / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--write", action="store_true")
    args = parser.parse_args()
    spec = TrainSpec(steps=args.steps, batch_size=args.batch_size, seq_len=args.seq_len,
                     warmup_steps=min(10, args.steps), eval_interval=args.steps, eval_batches=2, log_interval=10)
    dataset = prepare_dataset(spec.dataset, spec.tokenizer, progress=False)
    trainer = Trainer(load_preset(args.preset), spec, dataset=dataset)
    start = time.perf_counter()
    result = fit(trainer)
    wall = time.perf_counter() - start
    train_tps = result.step * spec.tokens_per_step / wall
    feed_tps = sampler_tokens_per_s(dataset.train_tokens, args.batch_size, args.seq_len, trainer.device)
    line = (f"{args.preset} ({result.counts['total']:,} parameters), {result.step} steps of "
            f"{args.batch_size} x {args.seq_len} tokens on {trainer.device.type}: {wall:.1f} s wall "
            f"(one evaluation included), {train_tps:,.0f} training tokens/s; the sampler feeds "
            f"{feed_tps:,.0f} tokens/s on the same shape ({feed_tps / train_tps:,.0f}x the consumption); "
            f"final val_loss {result.val_loss:.3f}")
    print(line)
    if args.write:
        write_section(f"Training: {args.preset} preset, {result.step} steps ({trainer.device.type})", line)


if __name__ == "__main__":
    main()
