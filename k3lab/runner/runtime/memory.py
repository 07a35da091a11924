"""GPU memory packing: how many trials fit on one GPU at once, from each variant's measured peak.

A trial's peak GPU memory is set by its model and the train spec's shapes (batch, sequence,
autocast, compiled blocks, CUDA graphs, kept KDA states): the same on every run of one GPU
model. Trials measure it (`measure_footprint`: the allocator's peak reservation plus the memory
outside it, the CUDA context and loaded kernels) and add it to the memory record, per GPU model:

    <kernel cache>/triton/k3lab-memory.json   {variant key: {GPU name: {"peak_bytes", "gpu_bytes", ...}}}
    k3lab/tunings/gpu-memory.json             the same, shipped: measured on the GPUs k3lab was tuned on

From it, `plan_packing` gives the trials at once per GPU so that their peaks sum to at most
(1 - HEADROOM) of the card; the sweep file's `resources.gpu` (0.25: four at once) is the ceiling,
never a promise. A variant that does not fit alone is refused before anything starts.

`k3lab.runner.runtime.gpu_gate` holds each trial off its GPU until that memory is there.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import math
import os
import subprocess
from datetime import datetime, timezone
from pathlib import Path

import attrs

from k3lab.registry.model_variants import short_hash
from k3lab.runner.runtime.tunings import read_json, write_json

HEADROOM = 0.10  # of the card's memory kept free: allocator fragmentation, an evaluation's extra tensors
NON_TORCH_BYTES = 1 << 30  # outside PyTorch's allocator (CUDA context, kernel images) where NVML cannot say
RECORD_NAME = "k3lab-memory.json"
SHIPPED_RECORD = Path(__file__).resolve().parents[2] / "tunings" / "gpu-memory.json"
FAKE_GPU_VAR = "K3LAB_FAKE_GPU"  # for tests: "NAME=GIB", a GPU model this host says it has (no CUDA is touched)
GIB = 1 << 30

# the train spec's fields that change a trial's memory (the rest: schedule, steps, intervals)
MEMORY_FIELDS = ("batch_size", "seq_len", "grad_accum", "compile", "compile_muon", "cuda_graph",
                 "activation_checkpointing", "kda_keep_states", "dtype", "autocast")


def variant_key(config, train) -> str:
    """What decides a trial's peak memory: its model config and the train spec's MEMORY_FIELDS."""
    fields = {name: getattr(train, name) for name in MEMORY_FIELDS}
    return short_hash([config.to_dict(), fields])


def variant_keys(sweep) -> dict[str, str]:
    """{variant name: `variant_key`} of the sweep's valid variants, in the file's order."""
    return {v.name: variant_key(v.config, sweep.train_of(v)) for v in sweep.valid_variants}


# -- the record ------------------------------------------------------------------------------

def record_path(cache: Path) -> Path:
    return Path(cache) / "triton" / RECORD_NAME


def read_record(path: Path) -> dict:
    """{variant key: {GPU name: entry}}; empty when missing or unreadable (a record only saves a measurement)."""
    return read_json(Path(path))


def known_peaks(cache: Path | None) -> dict:
    """The shipped record, overlaid with this machine's (measured here, so newer)."""
    record = read_record(SHIPPED_RECORD)
    if cache is not None:
        for key, by_gpu in read_record(record_path(cache)).items():
            record.setdefault(key, {}).update(by_gpu)
    return record


def add_measurement(cache: Path, key: str, variant: str, gpu: str, peak_bytes: int, gpu_bytes: int) -> None:
    """Add (or raise) a variant's peak on `gpu` in the cache's record, under a lock: trials on one
    host write it at once. A record that cannot be written costs a later measurement only."""
    path = record_path(cache)
    with contextlib.suppress(OSError), locked(path.with_name(f".{RECORD_NAME}.lock")):
        record = read_record(path)
        entry = record.setdefault(key, {}).get(gpu, {})
        if entry.get("peak_bytes", 0) >= peak_bytes:
            return
        record[key][gpu] = {"variant": variant, "peak_bytes": int(peak_bytes), "gpu_bytes": int(gpu_bytes),
                            "measured_at": datetime.now(timezone.utc).isoformat(timespec="seconds")}
        write_json(path, record)


def ship_measurements(cache: Path, shipped: Path = SHIPPED_RECORD) -> int:
    """Merge the cache's record into k3lab's shipped one (scripts/tune_shipped.sh, on the GPU it
    measured): the larger peak of each variant and GPU model stands. Returns the entries merged."""
    record, merged = read_record(shipped), 0
    for key, by_gpu in read_record(record_path(cache)).items():
        for gpu, entry in by_gpu.items():
            if entry["peak_bytes"] > record.get(key, {}).get(gpu, {}).get("peak_bytes", 0):
                record.setdefault(key, {})[gpu] = entry
                merged += 1
    shipped.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
    return merged


@contextlib.contextmanager
def locked(path: Path):
    """An exclusive lock on `path` (created) for the block."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


# -- the packing -----------------------------------------------------------------------------

@attrs.frozen
class GPUModel:
    """A kind of GPU: its name (as nvidia-smi and torch give it) and its memory."""

    name: str
    total_bytes: int

    @property
    def budget_bytes(self) -> int:
        return int(self.total_bytes * (1 - HEADROOM))


@attrs.frozen
class Packing:
    """Trials at once on one GPU of a model, and why."""

    gpu: GPUModel
    trials: int  # at once, on one GPU
    ceiling: int  # what the sweep file allows (resources.gpu, max_concurrent_trials)
    peak_bytes: int | None  # the largest measured peak of the sweep's variants; None: not measured on this GPU
    unmeasured: tuple[str, ...] = ()  # variants with no measurement on this GPU model

    @property
    def fraction(self) -> float:
        """Ray's share of a GPU per trial."""
        return 1.0 / self.trials

    def line(self) -> str:
        """e.g. 'NVIDIA H100 80GB HBM3 (79 GiB): 3 trials at once, ~24 GiB each'."""
        head = f"{self.gpu.name} ({self.gpu.total_bytes / GIB:.0f} GiB)"
        if self.peak_bytes is None:
            return (f"{head}: up to {self.ceiling} trials at once (resources.gpu); each variant's first trial runs "
                    "alone until it has measured its memory")
        each = f"{self.trials} trial{'s' if self.trials != 1 else ''} at once, ~{self.peak_bytes / GIB:.0f} GiB each"
        capped = " (the sweep file's ceiling)" if self.trials == self.ceiling and self.trials > 1 else ""
        rest = f"; not measured: {', '.join(self.unmeasured)} (run alone first)" if self.unmeasured else ""
        return f"{head}: {each}{capped}, {HEADROOM:.0%} of the card kept free{rest}"


class DoesNotFit(Exception):
    """A variant's measured peak is above one GPU's budget: not even one trial fits."""

    def __init__(self, variant: str, peak_bytes: int, gpu: GPUModel):
        super().__init__(f"variant {variant} needs ~{peak_bytes / GIB:.1f} GiB of GPU memory at its batch and "
                         f"sequence length, over the {gpu.budget_bytes / GIB:.1f} GiB a trial may use on "
                         f"{gpu.name} ({gpu.total_bytes / GIB:.0f} GiB, {HEADROOM:.0%} kept free): lower "
                         "train.batch_size or train.seq_len, or set train.activation_checkpointing")
        self.variant = variant


def trials_ceiling(resources, gpus: int = 1, max_concurrent: int | None = None) -> int:
    """Trials per GPU the sweep allows: 1/resources.gpu, and its trials at once (--max-concurrent, else
    resources.max_concurrent_trials) spread over the GPUs. A sweep with no GPU share (a fake GPU's test
    on CPU) takes its trials at once alone."""
    at_once = max_concurrent or resources.max_concurrent_trials
    if resources.gpu == 0:
        return max(1, at_once or 1)
    most = max(1, math.floor(1 / resources.gpu + 1e-9)) if resources.gpu < 1 else 1
    if at_once:
        most = min(most, max(1, math.ceil(at_once / max(1, gpus))))
    return most


def plan_packing(variants: dict[str, str], gpu: GPUModel, ceiling: int, record: dict) -> Packing:
    """variants: {name: variant_key}. Raises DoesNotFit when one measured variant cannot run alone."""
    peaks, unmeasured = {}, []
    for name, key in variants.items():
        entry = record.get(key, {}).get(gpu.name)
        if entry is None:
            unmeasured.append(name)
        else:
            peaks[name] = int(entry["peak_bytes"])
    for name, peak in peaks.items():
        if peak > gpu.budget_bytes:
            raise DoesNotFit(name, peak, gpu)
    if not peaks:
        return Packing(gpu, ceiling, ceiling, None, tuple(unmeasured))
    largest = max(peaks.values())
    return Packing(gpu, max(1, min(ceiling, gpu.budget_bytes // largest)), ceiling, largest, tuple(unmeasured))


def recorded_gpus(variants: dict[str, str], record: dict) -> list[GPUModel]:
    """The GPU models the record measured any of `variants` on (for plans made without a GPU)."""
    gpus = {}
    for key in variants.values():
        for name, entry in record.get(key, {}).items():
            gpus[name] = GPUModel(name, int(entry["gpu_bytes"]))
    return sorted(gpus.values(), key=lambda gpu: gpu.name)


def fake_gpu() -> GPUModel | None:
    """The GPU model $K3LAB_FAKE_GPU names ("NAME=GIB"), for tests of the packing on machines without one."""
    name, _, gib = os.environ.get(FAKE_GPU_VAR, "").rpartition("=")
    return GPUModel(name, int(float(gib) * GIB)) if name and gib else None


def host_gpu() -> GPUModel | None:
    """This host's GPU model from nvidia-smi, without CUDA in this process (a sweep's driver must not
    hold a context on a GPU its trials share); None without nvidia-smi or with GPUs of several kinds."""
    if fake_gpu() is not None:
        return fake_gpu()
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    rows = {tuple(part.strip() for part in line.split(",")) for line in out.stdout.splitlines() if line.strip()}
    if out.returncode != 0 or len(rows) != 1:
        return None
    name, mib = rows.pop()
    return GPUModel(name, int(float(mib)) << 20) if mib.replace(".", "").isdigit() else None


def sweep_packing(sweep, gpu: GPUModel, cache: Path | None, gpus: int = 1, max_concurrent: int | None = None) -> Packing:
    """The packing of `sweep`'s trials on one GPU of `gpu`'s model, from the record."""
    return plan_packing(variant_keys(sweep), gpu, trials_ceiling(sweep.resources, gpus, max_concurrent),
                        known_peaks(cache))


def host_packing(sweep, cache: Path | None, gpus: int = 1, max_concurrent: int | None = None) -> Packing | None:
    """The packing of a one-GPU-trial sweep on this host's GPU model (None where there is no such
    GPU, or the trials take whole GPUs); a variant that does not fit alone is a one-line error."""
    from k3lab.errors import UserError

    gpu = host_gpu()
    if gpu is None or sweep.resources.strategy is not None or sweep.resources.gpu > 1:
        return None
    try:
        return sweep_packing(sweep, gpu, cache, gpus, max_concurrent)
    except DoesNotFit as error:
        raise UserError(f"{sweep.path}: {error}") from None


def packing_lines(sweep, cache: Path | None) -> list[str]:
    """For a plan printed anywhere (`k3lab variants`, `--dry-run`): the packing of a GPU sweep on
    every GPU model the record has measured its variants on, and on this host's GPU."""
    if sweep.resources.strategy is not None or not 0 < sweep.resources.gpu <= 1:
        return []
    variants = variant_keys(sweep)
    record = known_peaks(cache)
    gpus = {gpu.name: gpu for gpu in recorded_gpus(variants, record)}
    here = host_gpu()
    if here is not None:
        gpus.setdefault(here.name, here)
    lines = []
    for gpu in gpus.values():
        try:
            lines.append(f"GPU memory: {plan_packing(variants, gpu, trials_ceiling(sweep.resources), record).line()}")
        except DoesNotFit as error:
            lines.append(f"GPU memory: {gpu.name}: does not fit: {error}")
    return lines
