"""The kernel cache: GPU kernels tuned and compiled once per machine, shared by every sweep.

FLA's Triton kernels autotune each new shape on first use (minutes for a `small` trial),
and torch.compile builds each block's kernels. Both results are files; kept in one folder
per machine, the next trial, sweep or benchmark starts warm.

    <cache>/triton     TRITON_CACHE_DIR: compiled Triton kernels and FLA's *.autotune.json
    <cache>/inductor   TORCHINDUCTOR_CACHE_DIR: torch.compile's graph and kernel caches

The folder is the first of: `--kernel-cache DIR`, the sweep file's `kernel_cache:`,
$K3LAB_KERNEL_CACHE, `$XDG_CACHE_HOME/k3lab/kernels` (default ~/.cache/k3lab/kernels).
On a cluster, point it at the shared volume (docker-compose sets K3LAB_KERNEL_CACHE).

Before a GPU sweep's trials start, `warm_kernels` runs one forward+backward for every
distinct (model, batch, sequence length) of the sweep, in one process on one GPU: the
tuning happens once, on a quiet GPU, instead of in every concurrent trial at once.

    <cache>/triton/k3lab-warm.json  the shapes warmed so far, keyed by a fingerprint of the
                       shape, the GPU, the torch, Triton and FLA versions and what k3lab's model code does
                       (`toolchain_fingerprint`)

A sweep skips the shapes the record names (a second sweep of the same file starts its
trials without a warm-up); `k3lab kernels warm` always runs them all. The record lives
inside Triton's folder, so clearing that folder clears it too. When the record names every
shape, a sweep on one host knows it without a GPU process (`all_recorded`, with the GPU's name
from nvidia-smi), and starts its trials at once.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import subprocess
import time
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Callable

import attrs

from k3lab.errors import UserError
from k3lab.model.config import KimiK3Config
from k3lab.registry.model_variants import short_hash
from k3lab.runner.runtime.model_code import PACKAGE, add_model_code
from k3lab.runner.runtime.tunings import read_json, start_from_shipped, write_json

ENV_VAR = "K3LAB_KERNEL_CACHE"


def default_kernel_cache() -> Path:
    if os.environ.get(ENV_VAR):
        return Path(os.environ[ENV_VAR])
    cache_home = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(cache_home) / "k3lab" / "kernels"


def resolve_kernel_cache(flag: str | None = None, sweep_value: str | None = None) -> Path:
    """The kernel cache folder (see the module docstring for the order), absolute; a file there is
    a one-line error (read as a cache, it looked empty)."""
    cache = Path(flag or sweep_value or default_kernel_cache()).expanduser().resolve()
    if cache.exists() and not cache.is_dir():
        raise UserError(f"kernel cache {cache}: is a file, not a folder")
    return cache


def cache_env(cache: Path) -> dict[str, str]:
    """Environment variables that point Triton, FLA and torch.compile at `cache`."""
    return {"TRITON_CACHE_DIR": str(cache / "triton"), "TORCHINDUCTOR_CACHE_DIR": str(cache / "inductor"),
            "FLA_CACHE_RESULTS": "1"}


def use_kernel_cache(cache: Path) -> dict[str, str]:
    """Create `cache` and point this process (and processes it starts) at it; before Triton
    is imported. A folder that cannot be written is a one-line error."""
    try:
        for sub in ("triton", "inductor"):
            (cache / sub).mkdir(parents=True, exist_ok=True)
        probe = cache / ".write-test"
        probe.write_text("")
        probe.unlink()
    except OSError as error:
        raise UserError(f"kernel cache {cache}: not writable ({error.strerror or error})") from None
    env = cache_env(cache)
    os.environ.update(env)
    return env


def open_kernel_cache(flag: str | None = None, say: Callable[[str], None] = print) -> Path:
    """For a GPU process outside a sweep (`k3lab train`, bench/, the GPU tests): point this
    process at the machine's kernel cache and, on a GPU, start it from the shipped tunings,
    so that no run tunes a shape that an earlier run or k3lab's own measurement tuned.
    Call it before FLA is imported."""
    cache = resolve_kernel_cache(flag)
    use_kernel_cache(cache)
    import torch

    if torch.cuda.is_available():
        shipped = start_from_shipped(cache, gpu_name())
        if shipped:
            say(shipped_line(shipped))
    return cache


def shipped_line(shipped: dict) -> str:
    compiled = f", {shipped['compiled']} compiled kernel files" if shipped.get("compiled") else ""
    return (f"kernels: started from k3lab's tunings for {shipped['gpu']} ({shipped['archive']}: "
            f"{shipped['added']} autotune results{compiled}, {shipped['warm_shapes']} warmed shapes)")


# -- what a sweep will run ------------------------------------------------------------------------

@attrs.frozen
class KernelShape:
    """One distinct thing to compile and tune: a model config on a (batch, seq_len) input."""

    name: str  # the first variant with this shape, for progress lines
    config: KimiK3Config
    batch_size: int
    seq_len: int
    autocast: str | None
    compile: bool = False  # blocks torch.compile'd, as the trials' `train.compile`


def kernel_shapes(sweep) -> list[KernelShape]:
    """The distinct kernel shapes of a sweep's valid variants (seeds share them)."""
    shapes: dict[tuple, KernelShape] = {}
    train = sweep.train
    for variant in sweep.valid_variants:  # a KimiK3Config is frozen, so it can be a key
        key = (variant.config, train.batch_size, train.seq_len, train.autocast, bool(train.compile))
        shapes.setdefault(key, KernelShape(variant.name, *key))
    return list(shapes.values())


def warm_kernels(shapes: list[KernelShape], progress: Callable[[int, int, str, float], None] | None = None,
                 cache: Path | None = None, skip_recorded: bool = False) -> dict:
    """One forward+backward per shape on this process's GPU, as a trial would run it (fused
    KDA where `auto` resolves to it, bf16 autocast unless the shape says otherwise).

    With `cache`, it first starts from k3lab's shipped tunings for this GPU (once per cache), and
    the shapes warmed are added to its record; with `skip_recorded` too, the shapes it already
    names are skipped. progress(done, total, name, seconds) after each shape
    warmed. Returns {"shapes", "warmed", "seconds", "new_autotune_results", "device_name"}
    (new *.autotune.json files in Triton's cache; the GPU's name), and "shipped": what
    `start_from_shipped` imported, or None."""
    require_cuda()
    started = time.perf_counter()
    device, toolchain = gpu_name(), toolchain_fingerprint()
    shipped = start_from_shipped(cache, device) if cache is not None else None
    before = autotune_results()
    record = read_warm_record(cache) if cache is not None and skip_recorded else {}
    fingerprints = {shape: shape_fingerprint(shape, device, toolchain) for shape in shapes}
    todo = [shape for shape in shapes if fingerprints[shape] not in record]
    for i, shape in enumerate(todo):
        shape_started = time.perf_counter()
        run_forward_backward(shape)
        if progress is not None:
            progress(i + 1, len(todo), shape.name, time.perf_counter() - shape_started)
    if cache is not None and todo:
        now = datetime.now(timezone.utc).isoformat(timespec="seconds")
        add_to_warm_record(cache, {fingerprints[shape]: {"shape": shape.name, "device": device, "warmed_at": now}
                                   for shape in todo})
    return {"shapes": len(shapes), "warmed": len(todo), "seconds": time.perf_counter() - started,
            "new_autotune_results": len(autotune_results() - before), "device_name": device, "shipped": shipped}


def run_forward_backward(shape: KernelShape) -> None:
    """One training forward+backward of the shape's model on the GPU: tunes FLA's kernels and
    compiles them, and with `compile` torch.compile's blocks too. A plain process (`k3lab train`,
    bench/) then finds those graphs in the cache; a sweep's trial process keys the same graphs
    otherwise and compiles them again (cause not found; docs/journal/sweep-ceiling.md), which is why scripts/tune_shipped.sh also ships what trials write."""
    import torch

    from k3lab.model.model import KimiK3, compile_blocks

    config = shape.config.resolve_kda(cuda=True)
    model = KimiK3(config).cuda().train()
    if shape.compile:
        torch._dynamo.reset()  # a fresh compiler state, as a trial's process has
        compile_blocks(model)
    idx = torch.randint(0, config.vocab_size, (shape.batch_size, shape.seq_len), device="cuda")
    dtype = getattr(torch, shape.autocast or "bfloat16")
    with torch.autocast("cuda", dtype=dtype):
        _, loss = model(idx, torch.roll(idx, -1, dims=1), return_logits=False)
    loss.backward()
    torch.cuda.synchronize()
    del model, loss
    torch.cuda.empty_cache()


def gpu_name() -> str:
    import torch

    return torch.cuda.get_device_name()


def host_gpu_name() -> str | None:
    """This host's GPU name from nvidia-smi (NVML), without CUDA in this process: a sweep's
    driver must not hold a context on a GPU its trials share. None without nvidia-smi or when
    the host has GPUs of more than one kind (which one a task gets is then not known)."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    names = {line.strip() for line in out.stdout.splitlines() if line.strip()}
    return names.pop() if out.returncode == 0 and len(names) == 1 else None


# -- the record of warmed shapes ------------------------------------------------------------------

WARM_RECORD = Path("triton") / "k3lab-warm.json"
MODEL_CODE = PACKAGE  # the folder the model code files are found under (`model_code.MODEL_CODE_FILES`)


def shape_fingerprint(shape: KernelShape, device: str, toolchain: str) -> str:
    """What decides which kernels a shape tunes and compiles: its model, input, autocast, whether
    its blocks are compiled, the GPU, and the toolchain (`toolchain_fingerprint`). An eager
    shape's fingerprint is the one it had before shapes were compiled."""
    key = [shape.config.to_dict(), shape.batch_size, shape.seq_len, shape.autocast, device, toolchain]
    return short_hash(key + (["compiled blocks"] if shape.compile else []))


def toolchain_fingerprint() -> str:
    """The versions of the libraries that tune and compile, and what the code that calls them
    does: k3lab/model/*.py, k3lab/ops/**/*.py, k3lab/optim/*.py and k3lab/compiling.py
    (`model_code.MODEL_CODE_FILES`; a change there may call other kernels or shapes, an edit of
    its comments or docstrings does not: `model_code.code_text`)."""
    versions = {name: package_version(name) for name in ("torch", "triton", "fla-core", "flash-linear-attention")}
    digest = hashlib.sha256(json.dumps(versions, sort_keys=True).encode())
    add_model_code(digest, MODEL_CODE)
    return digest.hexdigest()[:16]


def package_version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def read_warm_record(cache: Path) -> dict:
    """{fingerprint: {"shape", "device", "warmed_at"}}; empty when there is none (or it is unreadable)."""
    return read_json(cache / WARM_RECORD)


def all_recorded(shapes: list[KernelShape], cache: Path, device: str) -> bool:
    """Whether the cache's record names every shape for this GPU and toolchain: a warm-up
    would then skip them all."""
    record, toolchain = read_warm_record(cache), toolchain_fingerprint()
    return all(shape_fingerprint(shape, device, toolchain) in record for shape in shapes)


def add_to_warm_record(cache: Path, entries: dict) -> None:
    """Merge entries into the record. A record that cannot be written only costs a later
    warm-up, so the warm-up's result stands."""
    with contextlib.suppress(OSError):
        write_json(cache / WARM_RECORD, read_warm_record(cache) | entries)


def require_cuda() -> None:
    import torch

    if not torch.cuda.is_available():
        raise UserError("k3lab kernels warm: no CUDA GPU here: there is nothing to tune")


def autotune_results() -> set[Path]:
    """The *.autotune.json files (FLA's tuned configs) in this process's Triton cache."""
    root = os.environ.get("TRITON_CACHE_DIR")
    return set(Path(root).rglob("*.autotune.json")) if root and Path(root).is_dir() else set()


def cache_info(cache: Path) -> dict:
    """What the cache holds: autotune results per kernel, compiled kernels, size on disk."""
    files = [p for p in cache.rglob("*") if p.is_file()] if cache.is_dir() else []
    tuned: dict[str, int] = {}
    for path in files:
        if path.name.endswith(".autotune.json"):
            kernel = path.name.removesuffix(".autotune.json")
            tuned[kernel] = tuned.get(kernel, 0) + 1
    return {"path": str(cache), "exists": cache.is_dir(), "files": len(files),
            "bytes": sum(p.stat().st_size for p in files), "autotuned": dict(sorted(tuned.items())),
            "compiled_triton_kernels": sum(p.suffix == ".cubin" for p in files),
            "warm_shapes": len(read_warm_record(cache))}
