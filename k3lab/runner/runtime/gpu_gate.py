"""The gate that holds a trial off its GPU until its memory is there, and what a trial measures.

`MemoryGate`: a slot per process (a record lock, as `k3lab.runner.runtime.slots`), the bytes each holder
uses beside it, and the GPU's limits (the trials at once and the byte budget) in `limits.json`,
which the sweep's first trial on the GPU writes from the packing (`k3lab.runner.runtime.memory`) and an
out-of-memory error lowers (`lower_after_oom`) for the rest of that sweep part. A trial whose
variant is not yet measured on this GPU model enters alone, or once every holder has measured
itself, counted as large as the largest. `MemoryMeter` adds each trial's measured footprint to the
record after its evaluations.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import tempfile
import time
from pathlib import Path

import attrs

from k3lab.runner.runtime.memory import NON_TORCH_BYTES, add_measurement, host_gpu, locked
from k3lab.runner.runtime.slots import cuda_key
from k3lab.runner.runtime.sysmetrics import nvml_handles
from k3lab.runner.runtime.tunings import write_json

ENV_VAR = "K3LAB_GATE_DIR"  # where the gate folders are (default: the temp directory, per user)
POLL_S = 0.5


# -- what a trial uses -----------------------------------------------------------------------

def measure_footprint(device) -> int:
    """This process's GPU memory at its peak: the allocator's peak reservation plus what lies
    outside the allocator (NVML's count for this process where it has one, else NON_TORCH_BYTES)."""
    import torch

    reserved_peak = torch.cuda.max_memory_reserved(device)
    outside = process_gpu_bytes(device)
    non_torch = outside - torch.cuda.memory_reserved(device) if outside else NON_TORCH_BYTES
    return int(reserved_peak + max(non_torch, 0))


def process_gpu_bytes(device) -> int | None:
    """NVML's GPU memory of this process on `device` (None where NVML or the process is not listed:
    no nvidia-ml-py, or MPS clients not shown)."""
    for handle in nvml_handles(device):  # none without pynvml or NVML
        try:
            import pynvml

            for process in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
                if process.pid == os.getpid() and process.usedGpuMemory:
                    return int(process.usedGpuMemory)
        except Exception:  # a query NVML refuses: the allowance stands in
            return None
    return None


def is_out_of_memory(error: BaseException) -> bool:
    """A CUDA out-of-memory error, as torch raises it (also inside a CUDA-graph capture or a compiled kernel)."""
    import torch

    return isinstance(error, torch.OutOfMemoryError) or (
        isinstance(error, RuntimeError) and "out of memory" in str(error).lower() and "cuda" in str(error).lower())


# -- the gate --------------------------------------------------------------------------------

def gate_folder(device_index: int | None = None) -> Path:
    """The gate of the GPU this process sees (CUDA_VISIBLE_DEVICES as Ray sets it for the trial)."""
    key = cuda_key(device_index)
    root = os.environ.get(ENV_VAR) or Path(tempfile.gettempdir()) / f"k3lab-gpu-{os.getuid()}"
    return Path(root) / key


@attrs.frozen
class Limits:
    """What one GPU takes at once: trials, and bytes of their peaks together. `owner`: the sweep
    (its parent run) that set them, so a later sweep starts from its own packing."""

    trials: int
    budget_bytes: int
    owner: str = ""


def read_limits(folder: Path) -> Limits | None:
    try:
        raw = json.loads((folder / "limits.json").read_text())
        return Limits(int(raw["trials"]), int(raw["budget_bytes"]), str(raw.get("owner", "")))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def write_limits(folder: Path, limits: Limits) -> None:
    write_json(folder / "limits.json", attrs.asdict(limits))


def set_limits(folder: Path, limits: Limits) -> None:
    """The sweep's packing for this GPU, unless this sweep set them already (and an out-of-memory
    error may have lowered them since)."""
    with locked(folder / "gate.lock"):
        current = read_limits(folder)
        if current is None or current.owner != limits.owner:
            write_limits(folder, limits)


class MemoryGate:
    """A slot among the trials on one GPU, taken before the process touches CUDA and held until it
    ends: each holder's bytes (its variant's recorded peak, or its own measurement, None while
    unknown) sit beside its slot; a newcomer enters when the GPU's `Limits` allow one more."""

    def __init__(self, folder: Path, limits: Limits, poll_s: float = POLL_S):
        self.folder, self.poll_s = Path(folder), poll_s
        set_limits(self.folder, limits)
        self.slot: int | None = None
        self.fd: int | None = None

    def acquire(self, expected_bytes: int | None, name: str = "") -> float:
        """Wait until the GPU takes this trial (`admits`), then hold a slot; the seconds waited.
        A process that holds one already (a reused Ray actor) keeps it."""
        started = time.perf_counter()
        if self.fd is not None:
            self.update(expected_bytes, name)
        while self.fd is None:
            with locked(self.folder / "gate.lock"):
                limits = read_limits(self.folder)
                holders, free = self._holders(limits)
                if admits(limits, list(holders.values()), expected_bytes) and free:
                    self._take(free[0], expected_bytes, name)
            if self.fd is None:
                time.sleep(self.poll_s)
        return time.perf_counter() - started

    def _holders(self, limits: Limits | None) -> tuple[dict[int, int | None], list[int]]:
        """({slot: bytes} of the slots other processes hold, [free slots]), over the slot files there
        are (at least the `limits`' trials), plus one. This process's own slot is skipped: closing
        any descriptor of a file drops the process's record lock on it."""
        held, free = {}, []
        for slot in range(max(limits.trials if limits else 1, len(list(self.folder.glob("slot-*.lock")))) + 1):
            if slot == self.slot:
                continue
            fd = os.open(self.folder / f"slot-{slot}.lock", os.O_RDWR | os.O_CREAT, 0o600)
            try:
                fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                free.append(slot)
            except OSError as error:
                if error.errno not in (errno.EACCES, errno.EAGAIN):
                    raise
                held[slot] = read_bytes(self.folder / f"slot-{slot}.json")
            finally:
                os.close(fd)  # drops the probe's lock
        return held, free

    def _take(self, slot: int, expected_bytes: int | None, name: str) -> None:
        fd = os.open(self.folder / f"slot-{slot}.lock", os.O_RDWR | os.O_CREAT, 0o600)
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        self.slot, self.fd = slot, fd
        self.update(expected_bytes, name)

    def update(self, used_bytes: int | None, name: str = "") -> None:
        """The bytes this holder uses (its measurement), for the next newcomer's admission."""
        if self.slot is not None:
            write_json(self.folder / f"slot-{self.slot}.json", {"bytes": used_bytes, "trial": name})

    def lower_after_oom(self) -> int:
        """An out-of-memory error on this GPU: one trial fewer at once than now hold it (this one
        included), for the rest of the sweep; the new number. 0 when this trial was alone on it."""
        with locked(self.folder / "gate.lock"):
            limits = read_limits(self.folder)
            holders = len(self._holders(limits)[0]) + (1 if self.fd is not None else 0)
            lowered = max(holders - 1, 0)
            if limits is not None and lowered >= 1:
                write_limits(self.folder, attrs.evolve(limits, trials=min(limits.trials, lowered)))
            return lowered

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = self.slot = None


def read_bytes(path: Path) -> int | None:
    try:
        value = json.loads(path.read_text()).get("bytes")
        return int(value) if value is not None else None
    except (OSError, ValueError, AttributeError, TypeError):
        return None


def admits(limits: Limits | None, holders: list[int | None], expected_bytes: int | None) -> bool:
    """Whether a GPU whose holders use `holders` bytes (None: not measured yet) takes one more trial
    expected to use `expected_bytes` (None: not measured on this GPU model: it is taken alone, or
    as large as the largest holder)."""
    if not holders:
        return True
    if limits is None:
        return False
    if len(holders) >= limits.trials or any(used is None for used in holders):
        return False
    expected = expected_bytes if expected_bytes is not None else max(holders)
    return sum(holders) + expected <= limits.budget_bytes


# -- a trial's part --------------------------------------------------------------------------

@attrs.frozen
class TrialMemory:
    """What a trial needs of the packing: its variant's key in the record and its recorded peak on
    this GPU model (None: not measured), the GPU's limits as the sweep planned them (budget 0:
    the trial's GPU decides), and the kernel cache that holds the record."""

    key: str
    variant: str
    expected_bytes: int | None
    trials: int
    budget_bytes: int
    owner: str
    cache: str

    def limits(self) -> Limits:
        budget = self.budget_bytes
        if not budget:
            gpu = host_gpu()
            budget = gpu.budget_bytes if gpu is not None else 1 << 62  # no nvidia-smi: the count alone
        return Limits(self.trials, budget, self.owner)


class MemoryMeter:
    """After each evaluation: the trial's footprint (`measure_footprint`), for its holder's bytes
    in the gate and for the record, when it has grown."""

    def __init__(self, plan: TrialMemory, gate: MemoryGate, name: str):
        self.plan, self.gate, self.name = plan, gate, name
        self.measured = 0

    def after_eval(self, device) -> None:
        if device.type != "cuda":
            return
        import torch

        used = measure_footprint(device)
        if used <= self.measured:
            return
        self.measured = used
        self.gate.update(used, self.name)
        total = torch.cuda.get_device_properties(device).total_memory
        add_measurement(Path(self.plan.cache), self.plan.key, self.plan.variant, torch.cuda.get_device_name(device),
                        used, total)


# -- this process's place on its GPU ---------------------------------------------------------

_gate: MemoryGate | None = None  # held from the process's first trial in the packing to its end


def enter_gate(plan: TrialMemory | None, name: str) -> MemoryGate | None:
    """Wait, before this process touches CUDA, until its GPU has the memory for the trial `name`
    planned as `plan`; None for trials outside the packing (CPU, DDP: no plan)."""
    global _gate
    if plan is None:
        return None
    if _gate is None:
        _gate = MemoryGate(gate_folder(), plan.limits())
    _gate.acquire(plan.expected_bytes, name)
    return _gate


def leave_gate(gate: MemoryGate) -> None:
    """Give this process's place on its GPU back (after an out-of-memory error: Tune restarts the
    trial in a fresh process, which enters anew)."""
    global _gate
    gate.release()
    _gate = None
