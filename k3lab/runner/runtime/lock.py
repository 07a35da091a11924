"""One sweep at a time per experiment and storage folder: `<storage>/<experiment>.lock`.

Two sweeps of one file started seconds apart both passed the checks on the experiment folder
(the Ray record and the state file are written seconds after the start) and ran into one Tune
folder, with two parent runs. The lock is an exclusive `flock`, taken before anything is
checked against the folder or written to it and held until the sweep ends; the kernel releases
it when the process dies, even by SIGKILL, so a crashed sweep leaves no stale lock. The file
holds the driver's PID, for the message the next sweep gets.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path

from k3lab.errors import UserError
from k3lab.runner.runtime.cleanup import missing_from, remove_made


def lock_file(storage: Path, experiment: str) -> Path:
    return storage / f"{experiment}.lock"


@contextlib.contextmanager
def sweep_lock(path: Path):
    """Hold the lock at `path` for the block; a UserError if another process holds it. The file
    (and the folders made for it, if left empty) is removed on the way out."""
    from k3lab.runner.runtime.preflight import check_writable

    check_writable("storage folder", path.parent)  # its one-line errors, before anything is made
    made = missing_from(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = _acquire(path)
    try:
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        yield
    finally:
        path.unlink(missing_ok=True)  # before the lock goes: a waiting sweep then finds the new file's
        os.close(fd)
        remove_made(made[1:])  # the folders only: the file is gone


def _acquire(path: Path) -> int:
    """An open descriptor of `path` holding its exclusive lock. A file another sweep removed while
    this one waited for it is left for the new one at `path` (else both would hold "the" lock)."""
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _holder(fd)
            os.close(fd)
            raise UserError(f"{path}: a sweep of this experiment is running (driver PID {holder}): "
                            "wait for it to end, or stop it, before starting another") from None
        except OSError as error:
            os.close(fd)
            raise UserError(f"{path}: cannot be locked ({error.strerror or error})") from None
        if _same_file(fd, path):
            return fd
        os.close(fd)


def _holder(fd: int) -> str:
    """The PID the holder wrote, or "?" where it has not yet."""
    text = os.pread(fd, 32, 0).decode(errors="replace").strip()
    return text if text.isdigit() else "?"


def _same_file(fd: int, path: Path) -> bool:
    """`fd` is still the file at `path` (not one unlinked since it was opened)."""
    try:
        return os.fstat(fd).st_ino == os.stat(path).st_ino
    except FileNotFoundError:
        return False
