"""What a trial's system-metric sampling costs: the time of one sample against the sampling interval.

    python bench/system_metrics.py [--samples 200] [--write]

Times `SystemSampler.sample()` over the monitors a trial on this machine's device uses
(`k3lab.runner.runtime.sysmetrics.trial_monitors`: the machine's CPU and memory, the process's, and on a
CUDA device the GPU's busy share, memory, power and the process's GPU memory), and the share of
one CPU core that sampling every `K3LAB_SYSTEM_METRICS_S` seconds (default 10) takes. The sampler
runs on its own thread; the training loop only takes the mean of the samples when it logs.
With --write, the table goes to docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.report import write_section  # noqa: E402
from k3lab.runner.runtime.sysmetrics import SystemSampler, interval_s, trial_monitors  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--samples", type=int, default=200)
    parser.add_argument("--write", action="store_true", help="write the table into docs/benchmarks.md")
    args = parser.parse_args()
    device = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
    if device.type == "cuda":
        torch.ones(1, device=device)  # the process's CUDA context, as a trial's
    monitors = trial_monitors(device)
    sampler = SystemSampler(monitors, interval_s())
    sampler.sample()  # first reads (imports, NVML handles) out of the timing
    times = []
    for _ in range(args.samples):
        start = time.perf_counter()
        sampler.sample()
        times.append(time.perf_counter() - start)
    names = sorted(sampler.take())
    median, worst = statistics.median(times), max(times)
    every = interval_s() or 10.0
    table = "\n".join([
        "| device | metrics per sample | one sample (median) | slowest of the samples | share of one core at one sample per "
        f"{every:g} s |",
        "|---|---:|---:|---:|---:|",
        f"| {device.type} | {len(names)} | {1e3 * median:.3f} ms | {1e3 * worst:.3f} ms | {100 * median / every:.4f}% |",
    ])
    metrics = ", ".join(n.removeprefix("system/") for n in names)
    body = f"{args.samples} samples of `SystemSampler.sample()`; metrics: {metrics}.\n\n{table}"
    print(body)
    if args.write:
        write_section("System metrics: the cost of a trial's sampling", body,
                      command=f"python bench/system_metrics.py --samples {args.samples} --write")


if __name__ == "__main__":
    main()
