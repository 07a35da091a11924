"""What killed a trial's process: the dead Ray worker's own log, read by the driver.

When a trial's process dies of a signal (a SIGSEGV in a CUDA-graph launch, an abort after a
CUDA fault), Tune's error says only that the actor's worker died, and its pid. The cause is in
that worker's stderr, which Ray keeps on its node as `<session>/logs/worker-<id>-<job>-<pid>.err`
(moved to `logs/old/` once the process is gone): the signal, the native frames, and the
Python stack that faulthandler prints. Tune's error file holds every failure of the trial, so
only the last one is read. `dead_worker_log` finds that file on the driver's
node and `fault_line` turns it into one line, e.g.

    Segmentation fault in replay (torch/cuda/graphs.py:139), from k3lab/runner/train/graphs.py:54 in __call__

The driver keeps the file's last lines with the trial's run (`k3lab.runner.tune.status`). A worker
on another node of a cluster is not found: the error's own last line is used then.
"""

from __future__ import annotations

import re
from pathlib import Path

LOG_TAIL_LINES = 300
PID = re.compile(r"^\s*pid: (\d+)\s*$", re.MULTILINE)  # ActorDiedError's context block
FATAL = re.compile(r"^Fatal Python error: (.+?)\s*$", re.MULTILINE)
SIGNAL = re.compile(r"\*\*\* (SIG[A-Z]+) received")
FRAME = re.compile(r'^\s+File "(?P<path>[^"]+)", line (?P<line>\d+) in (?P<func>\S+)')
STACK_HEADER = re.compile(r"^(Current thread .*|Stack) \(most recent call first\):$", re.MULTILINE)


def last_failure(error: str) -> str:
    """The last failure in Tune's error file, which holds one section per failure of the trial
    (each under a `Failure # n` header, appended)."""
    return error[error.rfind("Failure # "):] if "Failure # " in error else error


def dead_worker_pid(error: str) -> int | None:
    """The pid of the worker an actor died with, from the text of Tune's last failure (None
    when that failure is not a dead worker's)."""
    error = last_failure(error)
    if "worker process has died" not in error:
        return None
    found = PID.search(error)
    return int(found.group(1)) if found else None


def ray_logs_dir() -> Path | None:
    """This node's Ray log folder, from the running Ray session (None without one)."""
    try:
        from ray._private import worker

        node = worker._global_node
        return Path(node.get_logs_dir_path()) if node is not None else None
    except Exception:  # a Ray without these internals: the error's own line is used
        return None


def worker_log_files(pid: int, logs_dir: Path | None) -> list[Path]:
    """The stderr files of worker `pid` in logs_dir, then in its old/ (where Ray moves the logs
    of processes that ended, perhaps between finding a file and reading it)."""
    if logs_dir is None:
        return []
    return [path for folder in (logs_dir, logs_dir / "old") for path in sorted(folder.glob(f"worker-*-{pid}.err"))]


def short_path(path: str) -> str:
    """A frame's file from its package down: `.../site-packages/torch/cuda/graphs.py` ->
    `torch/cuda/graphs.py`, `/work/main/k3lab/runner/train/graphs.py` -> `k3lab/runner/train/graphs.py`."""
    parts = Path(path).parts
    for i, part in enumerate(parts):
        if part in ("site-packages", "dist-packages") and i + 1 < len(parts):
            return "/".join(parts[i + 1:])
    return "/".join(parts[parts.index("k3lab"):]) if "k3lab" in parts else path


def fault_line(log: str) -> str | None:
    """One line from a dead worker's stderr: the fatal error (or the signal), where Python was
    (the innermost frame) and, if that is not k3lab's, the innermost k3lab frame. None when
    the log holds neither a fatal error nor a signal."""
    fatal, signal = FATAL.search(log), SIGNAL.search(log)
    if fatal is None and signal is None:
        return None
    line = fatal.group(1) if fatal else signal.group(1)
    frames = crashing_stack(log[fatal.end():]) if fatal else []
    if frames:
        first = frames[0]
        line += f" in {first['func']} ({short_path(first['path'])}:{first['line']})"
        ours = next((f for f in frames if "k3lab" in Path(f["path"]).parts), None)
        if ours is not None and ours is not first:
            line += f", from {short_path(ours['path'])}:{ours['line']} in {ours['func']}"
    return line


def crashing_stack(after_fatal: str) -> list[re.Match]:
    """The frames faulthandler printed for the crashing thread, most recent call first: the
    block under "Current thread ..." (several threads) or "Stack ..." (one)."""
    header = STACK_HEADER.search(after_fatal)
    if header is None:
        return []
    frames = []
    for line in after_fatal[header.end():].lstrip("\n").splitlines():
        frame = FRAME.match(line)
        if frame is None:
            break
        frames.append(frame)
    return frames


def dead_worker_log(error: str, logs_dir: Path | None = None) -> tuple[int, str] | None:
    """(pid, the last LOG_TAIL_LINES lines of its stderr) for the worker the error names, when
    its log is on this node; else None."""
    pid = dead_worker_pid(error)
    if pid is None:
        return None
    for path in worker_log_files(pid, logs_dir if logs_dir is not None else ray_logs_dir()):
        try:
            lines = path.read_text(errors="replace").splitlines()
        except OSError:  # moved to old/ as it was read: the next path
            continue
        return pid, "\n".join(lines[-LOG_TAIL_LINES:]) + "\n"
    return None
