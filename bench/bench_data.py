"""Tokens per second the BatchSampler feeds from the memory-mapped stdlib shards.

    python bench/bench_data.py [--batch-size 16] [--seq-len 1024] [--steps 2000] [--device cpu] [--write]

Prepares the stdlib corpus first (cached after the first run; the cold time is
printed when it had to tokenize). With --device cuda it includes the pinned,
non-blocking copy to the GPU and a synchronize per step.
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


def measure(sampler: BatchSampler, steps: int, device: str) -> float:
    """Seconds per batch, best of three runs of `steps` batches."""
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        for _ in range(steps):
            x, y = sampler.next_batch(device)
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        best = min(best, (time.perf_counter() - start) / steps)
    return best


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--seq-len", type=int, default=1024)
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--cache-dir", default=None)
    parser.add_argument("--write", action="store_true", help="write the result into docs/benchmarks.md")
    args = parser.parse_args()
    start = time.perf_counter()
    ds = prepare_dataset("stdlib", cache_dir=args.cache_dir, progress=False)
    if not ds.cached:
        total = sum(split["tokens"] for split in ds.manifest["splits"].values())
        print(f"prepared stdlib in {time.perf_counter() - start:.2f} s ({total:,} tokens)")
    sampler = BatchSampler(ds.train_tokens, args.batch_size, args.seq_len, seed=0)
    seconds = measure(sampler, args.steps, args.device)
    tokens = args.batch_size * args.seq_len
    line = (f"sampler: {tokens / seconds / 1e6:.1f} M tokens/s ({seconds * 1e6:.0f} us per batch of "
            f"{args.batch_size} x {args.seq_len}, device {args.device}, {len(ds.train_tokens):,} train tokens "
            f"of Python {ds.manifest['python']} stdlib)")
    print(line)
    if args.write:
        write_section(f"Data: BatchSampler throughput ({args.device})", f"Best of 3 runs of {args.steps} batches. {line}")


if __name__ == "__main__":
    main()
