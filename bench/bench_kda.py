"""chunk_kda_reference against the token-by-token recurrence on CPU, fp32, forward only.

    python bench/bench_kda.py [--lengths 256 1024 4096] [--write]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.report import write_section  # noqa: E402
from k3lab.ops.kda.naive import chunk_kda_reference, recurrent_kda  # noqa: E402


def inputs(T, B=1, H=4, d=64):
    q = torch.randn(B, T, H, d)
    k = F.normalize(torch.randn(B, T, H, d), dim=-1)
    v = torch.randn(B, T, H, d)
    g = F.logsigmoid(torch.randn(B, T, H, d))
    return q, k, v, g, torch.rand(B, T, H)


def best_of(fn, repeats):
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


@torch.no_grad()
def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--lengths", type=int, nargs="+", default=[256, 1024, 4096])
    parser.add_argument("--chunk-size", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--write", action="store_true", help="write the table into docs/benchmarks.md")
    args = parser.parse_args()
    rows = ["| T | recurrence (ms) | chunkwise (ms) | speed-up | max abs diff |", "|---|---|---|---|---|"]
    for T in args.lengths:
        x = inputs(T)
        o_rec, _ = recurrent_kda(*x)
        o_chunk, _ = chunk_kda_reference(*x, chunk_size=args.chunk_size)
        t_rec = best_of(lambda: recurrent_kda(*x), args.repeats)
        t_chunk = best_of(lambda: chunk_kda_reference(*x, chunk_size=args.chunk_size), args.repeats)
        diff = (o_rec - o_chunk).abs().max().item()
        rows.append(f"| {T} | {t_rec * 1e3:.1f} | {t_chunk * 1e3:.1f} | {t_rec / t_chunk:.1f}x | {diff:.1e} |")
        print(rows[-1], flush=True)
    body = (f"B=1, H=4, dk=dv=64, chunk size {args.chunk_size}, fp32, forward only, best of {args.repeats}. "
            "Target: chunkwise at least 10x faster than the recurrence at T=1024.\n\n" + "\n".join(rows))
    if args.write:
        write_section("KDA: chunkwise reference vs token-by-token recurrence (CPU)", body)


if __name__ == "__main__":
    main()
