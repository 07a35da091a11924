"""A trial's first step on a fresh machine, by what its kernel cache already holds.

    python bench/cold_compile.py --row small@64x1024:compile:bf16res --work /tmp/cold --write
    python bench/cold_compile.py --device cpu --row tiny@2x64 --phases fresh,both --work /tmp/cold   # harness

A fresh GPU machine's first training step compiles three things, each cached in the kernel cache
(`k3lab.runner.runtime.kernel_cache`):
- Triton compiles FLA's kernels (`<cache>/triton`);
- torch.compile builds the blocks (`<cache>/inductor`: FX graphs, AOTAutograd, its own Triton
  kernels);
- FLA autotunes whatever its *.autotune.json files do not name.
k3lab ships only the autotune results (k3lab/tunings/). This measures which of the rest would be
worth shipping. Each phase times the row's first forward+backward in a new process, on a kernel
cache that starts from k3lab's shipped tunings (as on any fresh machine) and holds:

    fresh      nothing more; its run fills WORK/full for the phases below
    triton     Triton's compiled kernels from WORK/full (FLA's and inductor's)
    inductor   torch.compile's caches from WORK/full
    mega       torch.compile's portable artifacts (`torch.compiler.save_cache_artifacts`, saved
               by the fresh phase's process), loaded with `torch.compiler.load_cache_artifacts`
    both       triton and inductor: a warm machine's cache, in a new process

Bytes: the folders the phase copies, as a .tar.gz would ship them (mega: its artifacts, gzipped).
Triton's copied kernels name their files by absolute path; the copies are pointed at themselves,
as `k3lab kernels import` does (pointed into WORK/full, which still holds the files, they would
have the same effect on this machine, not on another).
The CUDA-graph capture and the later steps are not timed: they take as long on a warm machine.
"""

from __future__ import annotations

import argparse
import gzip
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from k3lab.runner.runtime.tunings import relocated_group  # noqa: E402
SECTION = "Cold compile: a trial's first step by what its kernel cache holds"
PHASES = ("fresh", "triton", "inductor", "mega", "both")
COPIED = {"fresh": (), "triton": ("triton",), "inductor": ("inductor",), "mega": (), "both": ("triton", "inductor")}


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--row", default="small@64x1024:compile:bf16res",
                        help="PRESET@BxT[:compile][:bf16res][:chunkwise], as bench_trial.py's rows")
    parser.add_argument("--phases", default=",".join(PHASES), help="comma-separated, fresh first")
    parser.add_argument("--work", required=True, help="a folder for the phases' kernel caches")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--write", action="store_true", help="write the table into docs/benchmarks.md")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    phases = args.phases.split(",")
    if phases[0] != "fresh" or set(phases) - set(PHASES):
        parser.error(f"--phases {args.phases}: fresh first, then any of {', '.join(PHASES[1:])}")
    return args


# -- one phase, in a child process ----------------------------------------------------------

def first_step(row: str, device_name: str, load_mega: Path | None, save_mega: Path | None) -> float:
    """Seconds of the row's first forward+backward in this process, from the model built on the
    device: loading the portable artifacts (mega), compiling and autotuning included."""
    import torch

    from bench.bench_trial import parse_row
    from k3lab.model.model import KimiK3, compile_blocks
    from k3lab.registry.presets import load_preset

    spec = parse_row(row)
    device = torch.device(device_name)
    fused = device.type == "cuda" and "chunkwise" not in spec["options"]
    config = load_preset(spec["preset"]).replace(kda_implementation="fused" if fused else "chunkwise",
                                                 max_seq_len=max(spec["seq"], 1024),
                                                 residual_in_fp32="bf16res" not in spec["options"])
    torch.manual_seed(0)
    model = KimiK3(config).to(device).train()
    started = time.perf_counter()
    if load_mega is not None:
        torch.compiler.load_cache_artifacts(load_mega.read_bytes())
    if "compile" in spec["options"]:
        compile_blocks(model)
    idx = torch.randint(0, config.vocab_size, (spec["batch"], spec["seq"]), device=device)
    with torch.autocast(device.type, dtype=torch.bfloat16):
        _, loss = model(idx, torch.roll(idx, -1, dims=1), return_logits=False)
    loss.backward()
    if device.type == "cuda":
        torch.cuda.synchronize()
    seconds = time.perf_counter() - started
    if save_mega is not None:
        saved = torch.compiler.save_cache_artifacts()
        if saved is not None:
            save_mega.write_bytes(saved[0])
    return seconds


def child(args: argparse.Namespace) -> None:
    from k3lab.runner.runtime.kernel_cache import open_kernel_cache

    phase = args.child
    work = Path(args.work)
    open_kernel_cache(str(work / phase), say=lambda line: None)  # the shipped tunings, as a fresh machine
    mega = work / "mega.bin"
    seconds = first_step(args.row, args.device, load_mega=mega if phase == "mega" else None,
                         save_mega=mega if phase == "fresh" else None)
    print(json.dumps({"first_step_s": seconds}))


# -- the parent: a cache per phase, the table ---------------------------------------------------

def prepare_cache(work: Path, phase: str) -> int:
    """WORK/<phase>: a new kernel cache holding what the phase copies from WORK/full; returns
    the bytes those copies take as a .tar.gz (for mega, its artifacts gzipped)."""
    cache = work / phase
    shutil.rmtree(cache, ignore_errors=True)
    cache.mkdir(parents=True)
    for sub in COPIED[phase]:
        if (work / "full" / sub).is_dir():
            shutil.copytree(work / "full" / sub, cache / sub)
    for group in (cache / "triton").glob("*/__grp__*.json"):  # as `k3lab kernels import` moves them
        group.write_bytes(relocated_group(group.read_bytes(), group.parent))
    if phase == "mega":
        mega = work / "mega.bin"
        return len(gzip.compress(mega.read_bytes())) if mega.is_file() else 0
    return tar_gz_bytes(cache, COPIED[phase])


def tar_gz_bytes(cache: Path, subs: tuple[str, ...]) -> int:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for sub in subs:
            if (cache / sub).is_dir():
                tar.add(cache / sub, arcname=sub)
    return len(buffer.getvalue()) if subs else 0


def run_phase(args: argparse.Namespace, phase: str) -> dict:
    command = [sys.executable, __file__, "--child", phase, "--row", args.row, "--work", args.work,
               "--device", args.device]
    path = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, env=dict(os.environ, PYTHONPATH=path))
    if done.returncode != 0:
        lines = [line for line in done.stderr.strip().splitlines() if line.strip()]
        return {"error": (lines[-1] if lines else f"exit {done.returncode}")[:160]}
    return json.loads(done.stdout.strip().splitlines()[-1])


def table(row: str, results: list[tuple[str, int, dict]]) -> str:
    lines = [f"Row `{row}`: the first forward+backward in a new process, by what the kernel cache holds "
             "besides k3lab's shipped tunings.", "",
             "| phase | the cache also holds | first step (s) | bytes shipped (.tar.gz) |", "|---|---|---|---|"]
    held = {"fresh": "nothing", "triton": "Triton's compiled kernels", "inductor": "torch.compile's caches",
            "mega": "torch.compile's portable artifacts (loaded)",
            "both": "Triton's kernels and torch.compile's caches"}
    for phase, nbytes, r in results:
        seconds = f"failed: {r['error']}" if "error" in r else f"{r['first_step_s']:.1f}"
        lines.append(f"| {phase} | {held[phase]} | {seconds} | {nbytes / 2**20:,.1f} MiB |")
    return "\n".join(lines)


def main() -> None:
    args = parse_args()
    if args.child:
        child(args)
        return
    work = Path(args.work)
    results = []
    for phase in args.phases.split(","):
        nbytes = prepare_cache(work, phase)
        if phase == "mega" and not (work / "mega.bin").is_file():
            result = {"error": "the fresh phase saved no torch.compile artifacts (the row does not compile)"}
        else:
            result = run_phase(args, phase)
        if phase == "fresh":  # what the later phases copy from
            shutil.rmtree(work / "full", ignore_errors=True)
            shutil.copytree(work / "fresh", work / "full")
        results.append((phase, nbytes, result))
        print(f"{phase}: {json.dumps(result)}", flush=True)
    body = table(args.row, results)
    print(body)
    if args.write:
        from bench.report import write_section

        write_section(SECTION, body)


if __name__ == "__main__":
    main()
