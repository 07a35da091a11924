"""The training step of a trial on one GPU: the presets at the gpu profiles' shapes and larger.

    python bench/bench_trial.py --write
    python bench/bench_trial.py --rows small@16x512,small@64x1024:adamw --before .carry/before --write
    python bench/bench_trial.py --before .carry/before --before-rows small@16x512   # before for one row
    python bench/bench_trial.py --rows small@64x1024:compile --top 15        # the top kernels, every kernel by kind
    python bench/bench_trial.py --rows small@64x1024:graph:compile --where eager,copies   # who launches them
    python bench/bench_trial.py --rows small@64x1024:graph:compile:off,small@64x1024:graph:compile:bs4 --write
    python bench/bench_trial.py --rows tiny@2x64:off,tiny@2x64:full --steps 2 --warmup 1   # on CPU too (no graph)

A row is PRESET@BxT[:option...]; options: adamw (AdamW for every parameter instead of
Muon + AdamW), compile (torch.compile'd blocks, as trials with `compile` run), compilemuon (Muon's
per-bucket steps torch.compile'd too, as trials with `compile_muon` run; eager in a --before checkout whose
Muon cannot compile them),
chunkwise (plain-PyTorch KDA instead of FLA's), graph (the whole step replayed as one CUDA graph after two eager steps, as trials do
with `cuda_graph`; in a --before checkout without `GraphedStep`, forward+backward only, as its
trials did), graphfb (forward+backward only in the graph, the optimizers eager), ckpt
(activation checkpointing of every decoder layer), bf16res (`residual_in_fp32: false`: the
residual stream and AttnRes sources in bf16), kdastates (KDA's backward reads the chunk states
its forward kept instead of recomputing them, as trials with `kda_keep_states` run; recomputed in a
--before checkout without it), naiveattnres (the reference AttnRes path, `ops/attn_res/naive.py`,
instead of the fused kernels), and the AttnRes variant as the sweep files' `attn_res_block_size`
axis names it: off (the pre-norm baseline), full (block size 1) or bsN (block size N); without one,
the preset's own. Rows with variants write a second table: each variant's tokens/s against off's
of the same row and code, one table per card. Each row runs in its own process with the
trial's step: bf16 autocast over fp32 weights, the loss without logits, gradient clipping at
1.0, every optimizer, the MoE bias update. `--before DIR` runs every row a second time with
DIR (an older checkout of k3lab, e.g. `git archive <commit> | tar x -C DIR`) first on
PYTHONPATH, so one run shows before and after side by side.

Measured per row (random tokens, after `--warmup` steps, over `--steps` timed steps):
tokens/s from the wall clock; MFU = tokens/s x FLOPs per token (`count_parameters`) /
the GPU's bf16 peak; forward+backward and optimizer (clipping, optimizer steps, MoE bias
update) milliseconds per step from CUDA events (a whole step in one graph has no split: its
GPU time is under forward+backward, the optimizer column says "in graph"); GPU kernels per
step and CUDA launch calls per step from torch.profiler over 2 steps; peak memory
(torch.cuda.max_memory_allocated, weights and optimizer state included); the first step's
seconds (compilation and any autotuning not in the kernel cache). `--where KIND,...` (kinds of
KERNEL_KINDS by their first word: eager, copies, reductions, ...) adds, from one more step run
eagerly under torch.profiler with Python stacks, those kernels' time by the op that launched them
and the function of k3lab that ran it (bench/kernel_sources.py).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_ROWS = "small@16x512,small@64x1024,small@64x1024:adamw,base@16x2048"
OPTIONS = ("adamw", "compile", "compilemuon", "chunkwise", "graph", "graphfb", "ckpt", "bf16res", "kdastates",
           "naiveattnres")
VARIANTS = ("off", "full", "bsN")  # AttnRes: the pre-norm baseline, block size 1, block size N
LAUNCH_CALLS = ("cudaLaunchKernel", "cuLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernelEx", "cudaGraphLaunch")
KERNEL_KINDS = (  # (kind, substrings of a kernel's name): the first kind that matches, in this order
    ("AttnRes (k3lab)", ("attn_res_",)),
    ("short convolution (FLA)", ("causal_conv1d",)),
    ("KDA (FLA)", ("chunk_kda", "chunk_gated_delta", "kda_", "recompute_w_u", "l2norm", "chunk_local_cumsum",
                   "chunk_gla", "layer_norm_gated", "solve_tril")),
    ("MoE grouped GEMMs", ("GroupProblemShape", "grouped")),
    ("attention", ("sdpa", "flash", "fmha")),
    ("copies and memsets", ("memcpy", "Memcpy", "Memset", "copy_kernel", "CatArrayBatchedCopy")),
    ("GEMMs (cuBLAS, CUTLASS)", ("nvjet", "gemm", "Gemm", "cutlass", "splitKreduce", "xmma", "cublas")),
    ("Inductor (torch.compile)", ("triton_",)),
    ("optimizer multi-tensor", ("multi_tensor_apply",)),
    ("reductions", ("reduce_kernel",)),
    ("eager elementwise", ("elementwise_kernel",)),
)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", default=DEFAULT_ROWS, help="comma-separated PRESET@BxT[:option...]")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--before", default=None, help="an older k3lab checkout to measure the same rows with")
    parser.add_argument("--before-label", default="before")
    parser.add_argument("--before-rows", default=None, help="the rows to measure with --before too (default: all)")
    parser.add_argument("--top", type=int, default=0,
                        help="print the N kernels with the most GPU time per row, then every kernel's time by kind")
    parser.add_argument("--where", default="", help="comma-separated kinds of kernels (first words: eager, copies, "
                        "...) to trace to the code that launches them, from one eager step")
    parser.add_argument("--write", action="store_true", help="write the table into docs/benchmarks.md")
    parser.add_argument("--write-variants", action="store_true",
                        help="write only the AttnRes variants' table into docs/benchmarks.md")
    parser.add_argument("--doc", default=str(ROOT / "docs" / "benchmarks.md"), help="the file --write writes into")
    parser.add_argument("--json", default=None, metavar="PATH",
                        help="save every row's measurements (top kernels and kinds too) as JSON, for "
                             "bench/profile_step.py --from")
    parser.add_argument("--from-logs", nargs="+", default=None, metavar="LOG",
                        help="write the table from saved outputs of earlier runs (each log's first line: its "
                             "'# date, machine, commit: command') instead of measuring")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    rows = [parse_row(row, parser.error) for row in args.rows.split(",")]
    if args.warmup < 3 and any(graph_option(row["options"]) for row in rows):
        parser.error(f"--warmup {args.warmup}: a graph or graphfb row captures its step on the third step, "
                     "after two eager ones; with fewer than 3 warm-up steps the capture would be timed")
    traced_kinds(args.where, parser.error)
    return args


def traced_kinds(where: str, error=None) -> set[str]:
    """--where's kinds: 'eager,copies' -> {'eager elementwise', 'copies and memsets'}."""
    kinds = set()
    for word in filter(None, (w.strip().lower() for w in where.split(","))):
        matches = [kind for kind, _ in KERNEL_KINDS if kind.lower().split()[0] == word]
        if not matches:
            (error or sys.exit)(f"--where {word!r}: not a kind of kernel (first words: "
                                f"{', '.join(kind.split()[0].lower() for kind, _ in KERNEL_KINDS)})")
        kinds.update(matches)
    return kinds


def parse_row(row: str, error=None) -> dict:
    """'small@64x1024:adamw' -> {'preset': 'small', 'batch': 64, 'seq': 1024, 'options': ['adamw']}."""
    try:
        head, *options = row.strip().split(":")
        preset, shape = head.split("@")
        batch, seq = (int(n) for n in shape.split("x"))
    except ValueError:
        (error or sys.exit)(f"row {row!r}: expected PRESET@BxT[:option...]")
    unknown = {o for o in options if o not in OPTIONS and attn_res_variant([o]) is None}
    if unknown:
        (error or sys.exit)(f"row {row!r}: unknown options {sorted(unknown)} "
                            f"(choose from {', '.join(OPTIONS + VARIANTS)})")
    if len([o for o in options if attn_res_variant([o])]) > 1:
        (error or sys.exit)(f"row {row!r}: more than one AttnRes variant")
    return {"preset": preset, "batch": batch, "seq": seq, "options": options}


def attn_res_variant(options: list[str]) -> str | None:
    """The row's AttnRes variant option (off, full, bsN), or None."""
    return next((o for o in options if o in ("off", "full") or (o[:2] == "bs" and o[2:].isdigit() and int(o[2:]))),
                None)


def attn_res_overrides(options: list[str]) -> dict:
    """The config fields of the row's AttnRes variant, as the sweep axis `attn_res_block_size` sets them."""
    variant = attn_res_variant(options)
    if variant is None:
        return {}
    if variant == "off":
        return {"use_attn_res": False}
    return {"use_attn_res": True, "attn_res_block_size": 1 if variant == "full" else int(variant[2:])}


# -- one row, in a child process -------------------------------------------------------------

def train_module(name: str):
    """`k3lab.runner.train.<name>`, or `k3lab.train.<name>` in a --before checkout from before the runner/ move
    (decided by the imported k3lab's own folder: an editable install can resolve the other tree's modules)."""
    import importlib

    import k3lab

    moved = (Path(k3lab.__file__).parent / "runner").is_dir()
    return importlib.import_module(f"k3lab.runner.train.{name}" if moved else f"k3lab.train.{name}")


def measure(row: dict, steps: int, warmup: int, top: int, where: str = "") -> dict:
    import torch

    from k3lab.model.counting import count_parameters
    from k3lab.model.model import KimiK3, compile_blocks
    from k3lab.optim.assignment import build_optimizers
    from k3lab.registry.presets import load_preset
    diagnostics = train_module("diagnostics")
    device_name, peak_flops = diagnostics.device_name, diagnostics.peak_flops

    torch.backends.cuda.matmul.allow_tf32 = True
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")  # CPU: the tiny preset, to test the bench
    if device.type == "cpu":
        torch.set_num_threads(1)  # a CPU row tests the bench; one thread beside whatever else runs
    options = row["options"]
    bf16_stream = {"residual_in_fp32": False} if "bf16res" in options else {}  # a --before checkout lacks the field
    config = load_preset(row["preset"]).replace(
        kda_implementation="chunkwise" if "chunkwise" in options or device.type != "cuda" else "fused", max_seq_len=max(row["seq"], 1024),
        **bf16_stream, **attn_res_overrides(options))
    torch.manual_seed(0)
    model = KimiK3(config).to(device).train()
    model.checkpoint_layers = "ckpt" in options
    if "naiveattnres" in options:  # the reference AttnRes path beside fused KDA
        try:
            from k3lab.ops.attn_res.naive import StackedEndpoints
        except ImportError:  # a --before checkout from before the endpoints objects
            model.uses_fused_attn_res = lambda idx: False
        else:
            model.no_endpoints = StackedEndpoints.empty
    if "kdastates" in options:
        try:
            from k3lab.model.kda import keep_kda_states
        except ImportError:  # a --before checkout without it: its trials recomputed the states
            pass
        else:
            keep_kda_states(model, True)
    counts = count_parameters(model, row["seq"])
    if "compile" in options:
        compile_blocks(model)
    graph_kind = graph_option(options)
    capturable = {"capturable": True} if graph_kind == "step" else {}  # a before checkout may lack the argument
    if "adamw" in options:
        optimizers = [torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.1, fused=True, **capturable)]
    else:
        import inspect  # a before checkout may lack `compile` (its Muon was eager in every trial)

        compiled_muon = {"compile": True} if "compilemuon" in options and "compile" in inspect.signature(
            build_optimizers).parameters else {}
        optimizers = build_optimizers(model, lr=3e-3, weight_decay=0.1, **capturable, **compiled_muon)
    idx = torch.randint(0, config.vocab_size, (row["batch"], row["seq"]), device=device)
    targets = torch.roll(idx, -1, dims=1)
    events = []

    def loss_fn(x, y):
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):  # CPU: fp32
            return model(x, y, return_logits=False)[1]

    def forward_backward(x, y):
        loss = loss_fn(x, y)
        loss.backward()
        return loss.detach()

    def update():
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        for optimizer in optimizers:
            optimizer.step()
        model.update_moe_biases()

    def whole_step(x, y):
        loss = forward_backward(x, y)
        update()
        return {"loss": loss}

    graphed = graphed_step(graph_kind, model, optimizers, loss_fn, forward_backward, whole_step)

    def step():
        start, middle, end = (Event(device) for _ in range(3))
        start.record()
        replay = graphed is not None and len(events) >= 2  # captured after two eager steps
        split = not (replay and graph_kind == "step")  # an event between forward+backward and the update
        loss = graphed(idx, targets) if replay else forward_backward(idx, targets)
        if split:
            middle.record()
            update()
            if not replay:
                for optimizer in optimizers:
                    optimizer.zero_grad(set_to_none=True)
        else:
            loss = loss["loss"]
        end.record()
        events.append((start, middle if split else None, end))
        return loss

    synchronize = torch.cuda.synchronize if device.type == "cuda" else lambda: None
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    started = time.perf_counter()
    step()
    synchronize()
    first_step = time.perf_counter() - started
    for _ in range(warmup - 1):
        step()
    synchronize()
    timed_from = len(events)
    started = time.perf_counter()
    for _ in range(steps):
        loss = step()
    synchronize()
    step_s = (time.perf_counter() - started) / steps
    timed = events[timed_from:]
    fwd_bwd = sum(s.elapsed_time(m or e) for s, m, e in timed) / steps
    opt = sum(m.elapsed_time(e) for _, m, e in timed) / steps if all(m for _, m, _ in timed) else None
    kernels, launches, top_kernels, kinds = profile_steps(step, 2, top, device)
    sources = []
    if where:  # after the timed and profiled steps: an eager step of the same model, traced
        kernel_sources = sibling_module("kernel_sources")  # by path: a --before tree comes first on sys.path

        def eager_step():
            forward_backward(idx, targets)
            update()
            for optimizer in optimizers:
                optimizer.zero_grad(set_to_none=True)

        sources = kernel_sources.profile_sources(eager_step, traced_kinds(where), kernel_kind)[:top or 20]
    tokens_per_s = row["batch"] * row["seq"] / step_s
    peak = peak_flops(device)
    return {
        "tokens_per_s": tokens_per_s, "step_ms": 1e3 * step_s, "fwd_bwd_ms": fwd_bwd, "optimizer_ms": opt,
        "mfu": tokens_per_s * counts["flops_per_token"] / peak if peak else None, "device": device_name(device),
        "kernels": kernels, "launches": launches,
        "peak_gib": torch.cuda.max_memory_allocated() / 2**30 if device.type == "cuda" else float("nan"),
        "first_step_s": first_step, "loss": loss.item(), "params": counts["total"], "active": counts["active"],
        "top_kernels": top_kernels, "kernel_kinds": kinds, "sources": sources,
    }


class Event:
    """torch.cuda.Event on a GPU; on CPU the wall clock at `record` (the step has run by then)."""

    def __init__(self, device):
        import torch

        self.cuda = torch.cuda.Event(enable_timing=True) if device.type == "cuda" else None
        self.at = 0.0

    def record(self) -> None:
        if self.cuda is not None:
            self.cuda.record()
        self.at = time.perf_counter()

    def elapsed_time(self, end: Event) -> float:
        """Milliseconds from this event to `end`."""
        return self.cuda.elapsed_time(end.cuda) if self.cuda is not None else 1e3 * (end.at - self.at)


def sibling_module(name: str):
    """bench/<name>.py of this checkout, loaded by its path."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name(f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def graph_option(options: list[str]) -> str | None:
    """What a row captures: "step" (the whole step, as trials do), "forward_backward", or None.
    `graph` in a checkout from before `GraphedStep` captures forward+backward, as its trials did."""
    if "graphfb" in options:
        return "forward_backward"
    if "graph" not in options:
        return None
    graphs = train_module("graphs")

    return "step" if hasattr(graphs, "GraphedStep") else "forward_backward"


def graphed_step(kind: str | None, model, optimizers, loss_fn, forward_backward, whole_step):
    """The row's CUDA graph (captured on its first call), or None."""
    graphs = train_module("graphs")

    if kind is None:
        return None
    if not hasattr(graphs, "GraphedStep"):  # a --before checkout
        return graphs.GraphedForwardBackward(loss_fn, model.parameters())  # it runs the backward itself
    if kind == "forward_backward":
        return graphs.GraphedStep(forward_backward, model.parameters())
    return graphs.GraphedStep(whole_step, model.parameters(), optimizers)


def profile_steps(step, n: int, top: int, device) -> tuple[float, float, list, list]:
    """GPU kernels and CUDA launch calls per step over n profiled steps, the top kernels, and
    every kernel's time summed by kind (`by_kind`). On CPU: no kernels, the top ops by CPU time."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    if device.type != "cuda":
        return cpu_profile(step, n, top)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(n):
            step()
        torch.cuda.synchronize()
    kernels = launches = 0
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            kernels += not event.name.startswith(("Memcpy", "Memset"))
        elif event.name in LAUNCH_CALLS:
            launches += 1
    device_time = [(e.key, e.device_time_total / n / 1e3, e.count / n) for e in prof.key_averages()
                   if e.device_time_total > 0 and e.device_type == torch.autograd.DeviceType.CUDA]
    device_time.sort(key=lambda t: -t[1])
    return kernels / n, launches / n, device_time[:top], by_kind(device_time)


def cpu_profile(step, n: int, top: int) -> tuple[float, float, list, list]:
    """profile_steps on CPU: (0 kernels, 0 launches, the top ops by self CPU time, their kinds)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(n):
            step()
    cpu_time = sorted(((e.key, e.self_cpu_time_total / n / 1e3, e.count / n) for e in prof.key_averages()
                       if e.self_cpu_time_total > 0), key=lambda t: -t[1])
    return 0.0, 0.0, cpu_time[:top], by_kind(cpu_time)


def kernel_kind(name: str) -> str:
    """The KERNEL_KINDS kind of a GPU kernel's name, or "other"."""
    return next((kind for kind, parts in KERNEL_KINDS if any(part in name for part in parts)), "other")


def by_kind(device_time: list[tuple[str, float, float]]) -> list[tuple[str, float, float]]:
    """(kind, ms per step, kernels per step) from (name, ms, count) per kernel, most time first."""
    kinds: dict[str, list[float]] = {}
    for name, ms, count in device_time:
        total = kinds.setdefault(kernel_kind(name), [0.0, 0.0])
        total[0] += ms
        total[1] += count
    return sorted(((kind, ms, count) for kind, (ms, count) in kinds.items()), key=lambda t: -t[1])


# -- the parent: rows in child processes, the table ---------------------------------------

def run_row(row: str, args: argparse.Namespace, code_dir: Path) -> dict:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(code_dir), os.environ.get("PYTHONPATH", "")]))
    command = [sys.executable, __file__, "--child", row, "--steps", str(args.steps), "--warmup", str(args.warmup),
               "--top", str(args.top), "--where", args.where]
    done = subprocess.run(command, env=env, capture_output=True, text=True, cwd=code_dir)
    if done.returncode != 0:
        lines = [line for line in done.stderr.strip().splitlines() if line.strip()]
        return {"error": (lines[-1] if lines else f"exit {done.returncode}")[:160]}
    return json.loads(done.stdout.strip().splitlines()[-1])


def table(results: list[tuple[str, str, dict]]) -> str:
    lines = ["| row | code | tokens/s | MFU | step (ms) | fwd+bwd (ms) | optimizer (ms) | optimizer share "
             "| GPU kernels/step | launch calls/step | peak mem (GiB) | first step (s) |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for row, code, r in results:
        if "error" in r:
            lines.append(f"| {row} | {code} | failed: {r['error']} |" + " |" * 9)
            continue
        mfu = f"{r['mfu']:.1%}" if r["mfu"] is not None else "n/a"
        opt, share = "in graph", "n/a"
        if r["optimizer_ms"] is not None:
            opt, share = f"{r['optimizer_ms']:.1f}", f"{r['optimizer_ms'] / (r['fwd_bwd_ms'] + r['optimizer_ms']):.0%}"
        lines.append(f"| {row} | {code} | {r['tokens_per_s']:,.0f} | {mfu} | {r['step_ms']:.1f} | {r['fwd_bwd_ms']:.1f} "
                     f"| {opt} | {share} | {r['kernels']:,.0f} | {r['launches']:,.0f} "
                     f"| {r['peak_gib']:.1f} | {r['first_step_s']:.1f} |")
    return "\n".join(lines)


def card_of(results: list[tuple[str, str, dict]]) -> str:
    """The device the rows ran on, as the rows name it."""
    return next((r["device"] for _, _, r in results if "device" in r), "no row ran")


def variant_table(results: list[tuple[str, str, dict]]) -> str:
    """Rows with an AttnRes variant, by the row without it (and the code): each variant's
    tokens/s and its share of off's. Empty when no row names a variant."""
    groups: dict[tuple[str, str], dict[str, dict]] = {}
    for row, code, r in results:
        options = parse_row(row)["options"]
        variant = attn_res_variant(options)
        if variant is not None:
            base = row.split(":")[0] + "".join(f":{o}" for o in options if o != variant)
            groups.setdefault((base, code), {})[variant] = r
    lines = ["| row | code | variant | tokens/s | % of off's | step (ms) |", "|---|---|---|---|---|---|"]
    for (base, code), variants in groups.items():
        off = variants.get("off", {}).get("tokens_per_s")
        for variant, r in variants.items():
            if "error" in r:
                lines.append(f"| {base} | {code} | {variant} | failed: {r['error']} | | |")
                continue
            share = f"{r['tokens_per_s'] / off:.1%}" if off else "n/a"
            lines.append(f"| {base} | {code} | {variant} | {r['tokens_per_s']:,.0f} | {share} | {r['step_ms']:.1f} |")
    return "\n".join(lines) if groups else ""


def rows_from_logs(paths: list[str]) -> tuple[list[str], list[str]]:
    """The measured table rows of saved bench_trial outputs, and the first line of each log,
    which names when, where and how it was run. Every row line counts, also those a run
    printed as it went before it was stopped; a row measured twice keeps its last value."""
    origins, rows = [], {}  # (row, code) -> line; a replaced row keeps its place
    for path in paths:
        lines = Path(path).read_text().splitlines() or [path]  # an empty log: named by its path
        origins.append(lines[0].lstrip("# "))
        for line in lines[1:]:
            if is_row_line(line):
                row, code = line.split("|")[1:3]
                rows[row.strip(), code.strip()] = with_run_number(line, len(origins))
    return origins, list(rows.values())


def with_run_number(line: str, number: int) -> str:
    """'| row | after | ...' -> '| row | after [2] | ...': which listed run measured the row."""
    cells = line.split("|")
    cells[2] = f" {cells[2].strip()} [{number}] "
    return "|".join(cells)


def is_row_line(line: str) -> bool:
    """'| small@64x1024:adamw | after | ...': a measured row (not the header or a kernel line)."""
    cells = line.split("|")
    if not line.startswith("| ") or len(cells) < 4:
        return False
    try:
        parse_row(cells[1], error=raise_value_error)
    except ValueError:
        return False
    return True


def raise_value_error(message: str):
    raise ValueError(message)


def write_from_logs(paths: list[str]) -> None:
    origins, rows = rows_from_logs(paths)
    header = table([]).splitlines()
    body = ("Rows from saved outputs of these runs (the logs are in docs/runs/), each row as measured "
            "by the run its [number] names:\n\n"
            + "\n".join(f"{i}. {origin}" for i, origin in enumerate(origins, 1)) + "\n\n"
            + "3 warm-up + 10 timed steps per row, random tokens, bf16 autocast over fp32 weights, fused KDA "
            "(FLA), Muon + AdamW unless `adamw`; `graph`: the step replayed as a CUDA graph (forward+backward only in "
            "code from before GraphedStep (k3lab.runner.train.graphs), and with `graphfb`), `compile`: "
            "torch.compile'd blocks, `compilemuon`: Muon's steps compiled too, `kdastates`: KDA's chunk states kept for the backward, `ckpt`: activation checkpointing, `bf16res`: the residual stream in bf16 "
            "(`residual_in_fp32: false`). Optimizer share = optimizer / (fwd+bwd + optimizer) GPU time. Kernels "
            "and launch calls from torch.profiler (2 steps).\n\n"
            + "\n".join(header + rows))
    print(body)
    sys.path.insert(0, str(ROOT))
    from bench.report import write_section

    write_section("Trial step: presets on one GPU", body, measured_on="see the runs listed below")


def main() -> None:
    args = parse_args()
    if args.from_logs:
        write_from_logs(args.from_logs)
        return
    if args.child:
        print(json.dumps(measure(parse_row(args.child), args.steps, args.warmup, args.top, args.where)))
        return
    import torch

    if torch.cuda.is_available():
        from k3lab.runner.runtime.kernel_cache import open_kernel_cache

        open_kernel_cache()  # k3lab's kernel cache, started from its shipped tunings; the rows' processes inherit it
    before_rows = set((args.before_rows or args.rows).split(",")) if args.before else set()
    results = []
    for row in args.rows.split(","):
        codes = [("after", ROOT)] + ([(args.before_label, Path(args.before).resolve())] if row in before_rows else [])
        for label, code_dir in codes:
            result = run_row(row, args, code_dir)
            results.append((row, label, result))
            if args.json:  # after every row, so a run stopped part-way keeps what it measured
                Path(args.json).write_text(json.dumps({"card": card_of(results), "rows": results}, indent=1))
            print(table(results[-1:]).splitlines()[-1], flush=True)
            for name, ms, count in result.get("top_kernels", []):
                print(f"    {ms:8.2f} ms/step  {count:6.0f}x  {name[:110]}", flush=True)
            if args.top:
                print("    every kernel by kind:", flush=True)
                for kind, ms, count in result.get("kernel_kinds", []):
                    print(f"    {ms:8.2f} ms/step  {count:6.0f}x  {kind}", flush=True)
            if args.where:
                print(f"    launched by (one eager step, --where {args.where}):", flush=True)
                for kind, us, count, op, where in result.get("sources", []):
                    print(f"    {us / 1e3:8.2f} ms/step  {count:6.0f}x  {kind}: {op} at {where}", flush=True)
    card = card_of(results)
    body = (f"{card}: {args.warmup} warm-up + {args.steps} timed steps per row, random "
            "tokens, bf16 autocast over fp32 weights, fused KDA (FLA) unless `chunkwise`, Muon + AdamW unless "
            "`adamw`, the residual stream in fp32 unless `bf16res`. Optimizer share = optimizer / (fwd+bwd + "
            "optimizer) GPU time. Kernels and launch calls from torch.profiler (2 steps).\n\n" + table(results))
    print(body)
    variants = variant_table(results)
    if variants:
        variants = (f"{card}, {args.warmup} warm-up + {args.steps} timed steps per row, all rows in one run: each "
                    "AttnRes variant's tokens/s against off's of the same row and code.\n\n" + variants)
        print(variants)
    if args.write or args.write_variants:
        sys.path.insert(0, str(ROOT))
        from bench.report import write_section

        if args.write:
            write_section("Trial step: presets on one GPU", body, doc=Path(args.doc))
        if variants:
            write_section(f"AttnRes variants against off: {card}", variants, doc=Path(args.doc))


if __name__ == "__main__":
    main()
