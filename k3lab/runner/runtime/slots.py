"""Training slots: of the trials sharing one GPU, at most N train at once; the others start up.

Trials time-share the GPU, so four training at once do not train faster than one
(docs/benchmarks.md, "Sweep ceiling").
What concurrency buys is overlap: a trial's start-up (process, imports, data, model,
torch.compile, CUDA-graph capture) is mostly CPU work, which can run while other
trials train. With

    resources: {gpu: 0.25, max_concurrent_trials: 4, training_slots: 2}

Ray Tune still keeps four trials on the GPU, but only two train; a third and a fourth do their
start-up (up to the CUDA-graph capture) and then wait for a slot, so that a finished trial's
slot goes to a trial that is ready to train at once.

A slot is an exclusive POSIX record lock (`fcntl.lockf`) on one of N files in a folder of this
host's temp directory, one folder per GPU (`CUDA_VISIBLE_DEVICES` as Ray sets it for the trial,
and the device index): trials of every sweep on the same GPU share the slots. The kernel drops
the lock when its process ends, so a trial that crashes or is killed frees its slot without
clean-up; and processes the trial forks (compile workers) do not inherit it, as they would a
`flock`. Record locks belong to a process: one process holds at most one slot. $K3LAB_SLOT_DIR
moves the folders (the tests keep theirs apart from the host's).
"""

from __future__ import annotations

import errno
import fcntl
import os
import tempfile
import time
from pathlib import Path

POLL_S = 0.2


ENV_VAR = "K3LAB_SLOT_DIR"  # where the slot folders are (default: the temp directory, per user)


def cuda_key(index: int | None) -> str:
    """A GPU of this host as the process sees it: CUDA_VISIBLE_DEVICES (as Ray sets it) and the index."""
    return f"cuda-{os.environ.get('CUDA_VISIBLE_DEVICES', 'all').replace(',', '_')}-{index or 0}"


def slot_folder(device) -> Path:
    """The folder of the slots of `device` (a torch.device) on this host, for this user."""
    key = cuda_key(device.index) if device.type == "cuda" else device.type
    root = os.environ.get(ENV_VAR) or Path(tempfile.gettempdir()) / f"k3lab-slots-{os.getuid()}"
    return Path(root) / key


class TrainingSlot:
    """One of `slots` training slots of a folder: `acquire` waits for a free one, `release`
    (or the end of the process) frees it."""

    def __init__(self, slots: int, folder: Path, poll_s: float = POLL_S):
        self.slots, self.folder, self.poll_s = slots, Path(folder), poll_s
        self.held: int | None = None  # the file descriptor of the slot held

    def acquire(self) -> float:
        """Wait until one of the slots is free and take it; the seconds waited."""
        started = time.perf_counter()
        self.folder.mkdir(parents=True, exist_ok=True)
        while self.held is None:
            self.held = self._try_each_slot()
            if self.held is None:
                time.sleep(self.poll_s)
        return time.perf_counter() - started

    def _try_each_slot(self) -> int | None:
        for i in range(self.slots):
            fd = os.open(self.folder / f"slot-{i}.lock", os.O_RDWR | os.O_CREAT, 0o600)
            try:
                fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return fd
            except OSError as error:  # EACCES or EAGAIN: another process holds it
                os.close(fd)
                if error.errno not in (errno.EACCES, errno.EAGAIN):
                    raise
        return None

    def release(self) -> None:
        if self.held is not None:
            os.close(self.held)  # closing the descriptor drops its lock
            self.held = None
