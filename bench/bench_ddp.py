"""One trial on one GPU against the same trial as DDP on several GPUs, at the same per-GPU batch.

    python bench/bench_ddp.py --write                       # base preset, 1 GPU vs DDP on 2, DDP settings compared
    python bench/bench_ddp.py --rows 1,2,2:static --preset small --batch 32 --seq 1024
    python bench/bench_ddp.py --rows 1,4,8 --write          # a host of 8 GPUs, the tuned 100 MB buckets

A row is GPUS[:option...]; options change `DDPOptions` (k3lab/runner/train/ddp.py) from its defaults:
legacy (the trainer's settings before this benchmark: find_unused_parameters, no gradient
views, 25 MB buckets), static (static_graph), noview (no gradient views), bucketN (bucket_cap_mb=N).
The kernels of the shape are tuned first, once, into the kernel cache (as a sweep's warm-up
does). Each row runs as its own torchrun job of the trial's `Trainer` (bf16 autocast, Muon + AdamW,
the trial's all-reduces of the loss and the MoE loads, torch.compile'd blocks with
--compile), on the offline default corpus; after `--warmup` steps, `--steps` steps are
timed by the wall clock between barriers.

Reported: tokens/s of all GPUs together, tokens/s per GPU, scaling efficiency (tokens/s /
(GPUs x the 1-GPU row's tokens/s)), MFU per GPU, ms per step, peak memory of each GPU
(torch.cuda.max_memory_allocated).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_ROWS = "1,2:legacy,2:bucket25,2,2:static"
OPTIONS = ("legacy", "static", "noview")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", default=DEFAULT_ROWS, help="comma-separated GPUS[:option...]")
    parser.add_argument("--preset", default="base")
    parser.add_argument("--batch", type=int, default=16, help="sequences per GPU")
    parser.add_argument("--seq", type=int, default=2048)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--compile", action="store_true", help="torch.compile the decoder blocks, as gpu profiles do")
    parser.add_argument("--write", action="store_true", help="write the table into docs/benchmarks.md")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    for row in args.rows.split(","):
        parse_row(row, parser.error)
    return args


def parse_row(row: str, error=sys.exit) -> tuple[int, dict]:
    """'2:static:bucket100' -> (2, {'static_graph': True, 'bucket_cap_mb': 100.0})."""
    head, *options = row.strip().split(":")
    if not head.isdigit() or int(head) < 1:
        error(f"row {row!r}: expected GPUS[:option...] with GPUS a whole number")
    changes: dict = {}
    for option in options:
        if option == "legacy":
            changes |= {"find_unused_parameters": True, "gradient_as_bucket_view": False, "bucket_cap_mb": 25.0}
        elif option == "static":
            changes["static_graph"] = True
        elif option == "noview":
            changes["gradient_as_bucket_view"] = False
        elif option.startswith("bucket") and option[6:].isdigit():
            changes["bucket_cap_mb"] = float(option[6:])
        else:
            error(f"row {row!r}: unknown option {option!r} (choose from {', '.join(OPTIONS)}, bucketN)")
    return int(head), changes


# -- one row: every rank of a torchrun job ----------------------------------------------------

def measure(row: str, args: argparse.Namespace) -> dict | None:
    """Run on every rank; rank 0 returns the row's figures, the others None."""
    import torch
    import torch.distributed as dist

    from k3lab.registry import load_preset
    from k3lab.runner.train.ddp import DDPOptions
    from k3lab.runner.train.diagnostics import peak_flops
    from k3lab.registry.train_spec import TrainSpec
    from k3lab.runner.train.trainer import Trainer

    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    cuda = torch.cuda.is_available()  # CPU (gloo) only to try the benchmark itself on a laptop
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    if world > 1:
        dist.init_process_group("nccl" if cuda else "gloo", device_id=device if cuda else None)
    _, changes = parse_row(row)
    options = DDPOptions(**changes)
    config = load_preset(args.preset).replace(max_seq_len=max(args.seq, 1024))  # KDA: auto (fused on a GPU)
    # no CUDA graph on one GPU either: a DDP step cannot be captured, and the rows differ only in DDP
    spec = TrainSpec(steps=args.warmup + args.steps, batch_size=args.batch, seq_len=args.seq, warmup_steps=1,
                     autocast="bfloat16" if cuda else None, compile=args.compile, cuda_graph=False)
    trainer = Trainer(config, spec, seed=0, device=device, rank=rank, world_size=world, ddp=options)
    for _ in range(args.warmup):
        trainer.train_step()
    if cuda:
        torch.cuda.synchronize()
    if world > 1:
        dist.barrier()
    started = time.perf_counter()
    for _ in range(args.steps):
        values = trainer.train_step()
    loss = values["train_loss"].item()
    if world > 1:
        dist.barrier()
    step_s = (time.perf_counter() - started) / args.steps
    peaks = [torch.cuda.max_memory_allocated(device) / 2**30 if cuda else None]
    tokens_per_s = trainer.tokens_per_step / step_s
    peak = peak_flops(device)
    result = {"gpus": world, "options": options.describe(), "tokens_per_s": tokens_per_s, "step_ms": 1e3 * step_s,
              "mfu": tokens_per_s * trainer.counts["flops_per_token"] / (peak * world) if peak else None,
              "loss": loss, "params": trainer.counts["total"]}
    if world > 1:
        gathered = [None] * world
        dist.all_gather_object(gathered, peaks[0])
        peaks = gathered
        # The trainer sits in reference cycles, so only the garbage collector frees it and the DDP
        # reducer it holds; left to the interpreter's exit, gloo's threads abort the rank (SIGABRT,
        # "terminate called without an active exception"). Free it while the group is still up.
        del trainer, values
        gc.collect()
        dist.barrier()  # no rank closes its connections while another still reads from them
        dist.destroy_process_group()
    return result | {"peak_gib": peaks} if rank == 0 else None


# -- the parent: rows as torchrun jobs, the table -----------------------------------------------

def warm_kernel_cache(args: argparse.Namespace) -> None:
    """FLA autotunes each new shape for minutes: tune this one once, here, into the kernel cache
    ($K3LAB_KERNEL_CACHE or ~/.cache/k3lab/kernels), so the rows' ranks start warm."""
    from k3lab.registry import load_preset
    from k3lab.runner.runtime.kernel_cache import KernelShape, open_kernel_cache, warm_kernels

    cache = open_kernel_cache()  # this process and the torchrun jobs it starts; from the shipped tunings
    config = load_preset(args.preset).replace(max_seq_len=max(args.seq, 1024))
    print(f"kernels: warming {args.preset} at {args.batch} x {args.seq} (cache {cache}) ...", flush=True)
    result = warm_kernels([KernelShape(args.preset, config, args.batch, args.seq, "bfloat16")])
    print(f"kernels: warm in {result['seconds']:.0f} s ({result['new_autotune_results']} new autotune results)",
          flush=True)


def run_row(row: str, args: argparse.Namespace) -> dict:
    gpus, _ = parse_row(row)
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={gpus}", __file__,
               "--child", row, "--preset", args.preset, "--batch", str(args.batch), "--seq", str(args.seq),
               "--steps", str(args.steps), "--warmup", str(args.warmup)] + (["--compile"] if args.compile else [])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    env.setdefault("NCCL_NVLS_ENABLE", "0")  # NVLink multicast off unless asked for: the lent H200 hosts need it off
    done = subprocess.run(command, env=env, capture_output=True, text=True, cwd=ROOT)
    results = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not results:
        print(f"{row}: torchrun's output (it failed):\n{done.stderr[-6000:]}", file=sys.stderr, flush=True)
        return {"error": first_failure(done)[:160]}
    return json.loads(results[-1])


def first_failure(done: subprocess.CompletedProcess) -> str:
    """The rank's own exception where it printed one, else what torchrun's summary says of the
    first rank to fail: the last line of its traceback, or the signal that killed it."""
    exceptions = [line for line in done.stderr.splitlines()
                  if re.match(r"(\[rank\d+\]: )?[\w.]+(Error|Exception): ", line) and "ChildFailedError" not in line]
    if exceptions:
        return exceptions[-1]
    root = done.stderr.partition("Root Cause (first observed failure):")[2].split("=" * 20)[0]
    rank = re.search(r"^\s*rank\s*: (\d+)", root, re.M)
    exitcode = re.search(r"^\s*exitcode\s*: (-?\d+)", root, re.M)
    traceback = [line.strip() for line in root.partition("traceback :")[2].splitlines() if line.strip()]
    if not (rank and exitcode):
        return f"torchrun exit {done.returncode}"
    how = traceback[-1] if traceback and not traceback[-1].startswith("To enable traceback") else "no traceback"
    return f"rank {rank[1]}: exit code {exitcode[1]}: {how}"


def table(results: list[tuple[str, dict]]) -> str:
    one_gpu = next((r["tokens_per_s"] for _, r in results if r.get("gpus") == 1), None)
    lines = ["| row | GPUs | DDP settings | tokens/s (all GPUs) | tokens/s per GPU | scaling efficiency | MFU per GPU "
             "| step (ms) | peak memory per GPU (GiB) |", "|---|---|---|---|---|---|---|---|---|"]
    for row, r in results:
        if "error" in r:
            lines.append(f"| {row} | | failed: {r['error']} |" + " |" * 6)
            continue
        efficiency = f"{r['tokens_per_s'] / (r['gpus'] * one_gpu):.1%}" if one_gpu else "n/a"
        settings = r["options"] if r["gpus"] > 1 else "(no DDP)"
        mfu = f"{r['mfu']:.1%}" if r["mfu"] is not None else "n/a"
        lines.append(f"| {row} | {r['gpus']} | {settings} | {r['tokens_per_s']:,.0f} | "
                     f"{r['tokens_per_s'] / r['gpus']:,.0f} | {efficiency} | {mfu} | {r['step_ms']:.1f} | "
                     f"{' / '.join('n/a' if p is None else f'{p:.1f}' for p in r['peak_gib'])} |")
    return "\n".join(lines)


def main() -> None:
    args = parse_args()
    if args.child:
        from torch.distributed.elastic.multiprocessing.errors import record

        result = record(measure)(args.child, args)  # a rank's traceback reaches torchrun's summary
        if result is not None:
            print(json.dumps(result), flush=True)
        return
    import torch

    sys.path.insert(0, str(ROOT))
    from k3lab.data import prepare_dataset

    wanted = max(parse_row(row)[0] for row in args.rows.split(","))
    if torch.cuda.is_available() and torch.cuda.device_count() < wanted:
        sys.exit(f"bench_ddp.py: --rows asks for {wanted} GPUs, and this machine has {torch.cuda.device_count()}")
    prepare_dataset("stdlib", "byte")  # once, before the ranks read it
    if torch.cuda.is_available():
        warm_kernel_cache(args)
    results = []
    for row in args.rows.split(","):
        started = time.perf_counter()
        print(f"{row}: running ...", flush=True)
        results.append((row, run_row(row, args)))
        print(table(results).splitlines()[-1] + f"  ({time.perf_counter() - started:.0f} s)", flush=True)
    where = f"{torch.cuda.get_device_name()} x {torch.cuda.device_count()}" if torch.cuda.is_available() else "CPU"
    compiled = ", compiled blocks" if args.compile else ""
    body = (f"{where}: the `{args.preset}` preset, {args.batch} x {args.seq} tokens per GPU, {args.warmup} warm-up + "
            f"{args.steps} timed steps per row, the trial's Trainer (bf16 autocast, Muon + AdamW, fused KDA{compiled}, "
            "no CUDA graph in any row); DDP over NCCL. Scaling efficiency = tokens/s / (GPUs x the 1-GPU row's "
            "tokens/s).\n\n" + table(results))
    print(body)
    if args.write:
        from bench.report import write_section  # ROOT is on sys.path (above)

        write_section("DDP: one trial on one and on two GPUs", body)


if __name__ == "__main__":
    main()
