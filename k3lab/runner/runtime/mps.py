"""Trials that share a GPU run their kernels side by side through NVIDIA MPS, not in turns.

Without MPS each trial's process has a CUDA context of its own and the GPU time-slices between
them: four trials training together can get fewer tokens/s than one of them alone. Under an MPS
control daemon CUDA connects each process, as it initialises, to one server that issues every
client's work in one context, so kernels of different trials run at once (the measurements:
docs/journal/sweep-ceiling.md, "the trials' processes through MPS").

A sweep whose trials share a GPU (`resources.gpu` below 1) on a Ray instance of its own starts a
control daemon of its own before anything initialises CUDA: `nvidia-cuda-mps-control -f`, a
child of the driver that gets SIGTERM when the driver dies, its pipe folder a short temporary
one (the control socket's path must fit 107 bytes), its log folder next to the sweep's log. The
driver's environment points at it, so Ray and every trial inherit it; it is told to quit when
the sweep ends. `resources.mps`: unset, on where it can be (else the trials time-slice, and the
sweep says why in one line); true, on or the sweep stops before it starts; false, off. A daemon
the user started and exported CUDA_MPS_PIPE_DIRECTORY for is used instead of one of k3lab's. On a
Ray cluster the sweep starts no daemon: its trials inherit their node's (the entrypoint of
k3lab's image starts one where K3LAB_MPS=1, as docker-compose.yml's workers set it), and the
sweep says "each node's own" (`resources.mps: true` there is refused: the driver cannot check;
`false` does not reach a node's daemon).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from k3lab.errors import UserError

CONTROL = "nvidia-cuda-mps-control"
ENV_KEYS = ("CUDA_MPS_PIPE_DIRECTORY", "CUDA_MPS_LOG_DIRECTORY")
START_S = 10.0  # for the daemon's control socket to appear
QUIT_S = 10.0  # for the daemon to end once told to quit
TIME_SLICING = "time-slicing"
NODES = "each node's own"
ON_A_CLUSTER = ("on a Ray cluster the sweep starts no daemon: trials use their node's, where it runs one "
                "(docker-compose.yml's workers start one), else take turns")


def users_daemon() -> str | None:
    """The pipe folder of an MPS daemon the user started and pointed this shell at, if any."""
    return os.environ.get("CUDA_MPS_PIPE_DIRECTORY") or None


def sharing_off_because(mps: bool | None, on_cluster: bool) -> str | None:
    """Why trials that share a GPU will not run through a daemon of the sweep's own, or None."""
    if mps is False:
        return "resources.mps: false"
    if on_cluster:
        return ON_A_CLUSTER
    if shutil.which(CONTROL) is None:
        return f"{CONTROL} is not on PATH (it comes with the NVIDIA driver)"
    return None


def sharing_plan(mps: bool | None, on_cluster: bool) -> tuple[str, str | None]:
    """How trials that share a GPU will run on it, for the sweep and its dry run alike:
    ("yours", pipe folder) through a daemon the user exported (unless mps: false), ("own", None)
    through one of the sweep's, ("nodes", why) as their nodes of a Ray cluster have it, or
    ("turns", why) taking turns."""
    pipe = users_daemon()
    if pipe and mps is not False:
        return "yours", pipe
    if on_cluster and mps is None:
        return "nodes", ON_A_CLUSTER
    why_not = sharing_off_because(mps, on_cluster)
    return ("own", None) if why_not is None else ("turns", why_not)


@contextlib.contextmanager
def gpu_sharing(mps: bool | None, shares_gpu: bool, on_cluster: bool, log_dir: Path, where: str, say=print):
    """While the sweep runs: what `sharing_plan` says, a daemon of the sweep's own started here.
    Yields how the trials share a GPU ("mps", "mps: PIPE" for the user's daemon, "each node's
    own: WHY" on a Ray cluster, or "time-slicing: WHY"; None where no GPU is shared). With
    `resources.mps: true` (named by `where`), a daemon that cannot run is a UserError."""
    if not shares_gpu:
        yield None
        return
    kind, detail = sharing_plan(mps, on_cluster)
    if kind == "yours":
        say(f"GPU sharing: MPS (the daemon at CUDA_MPS_PIPE_DIRECTORY={detail})")
        yield f"mps: {detail}"
        return
    if kind == "nodes":
        with environment(dict.fromkeys(ENV_KEYS)):  # the driver's daemon is not the trials': theirs is the node's
            say(f"GPU sharing: {NODES} ({detail})")
            yield f"{NODES}: {detail}"
        return
    if kind == "turns":
        with environment(dict.fromkeys(ENV_KEYS)):  # mps: false with the user's daemon exported: not that one either
            yield taking_turns(detail, mps, where, say)
        return
    pipe = Path(tempfile.mkdtemp(prefix="k3lab-mps-"))
    env = {"CUDA_MPS_PIPE_DIRECTORY": str(pipe), "CUDA_MPS_LOG_DIRECTORY": str(log_dir)}
    process = None
    try:
        process, why_not = start_daemon(env, log_dir)
        if why_not is not None:
            yield taking_turns(why_not, mps, where, say)
            return
        say(f"GPU sharing: MPS (a control daemon of the sweep's own; its log: {log_dir})")
        with environment(env):
            yield "mps"
    finally:
        if process is not None:
            stop_daemon(process, env)
        shutil.rmtree(pipe, ignore_errors=True)


def taking_turns(why_not: str, mps: bool | None, where: str, say) -> str:
    """The trials take turns on their GPU, and the sweep says why; a UserError where MPS is required."""
    if mps is True:
        raise UserError(f"{where}: resources.mps: true, but {why_not}")
    say(f"GPU sharing: {TIME_SLICING} ({why_not})")
    return f"{TIME_SLICING}: {why_not}"


def start_daemon(env: dict[str, str], log_dir: Path) -> tuple[subprocess.Popen | None, str | None]:
    """`nvidia-cuda-mps-control -f` as a child that dies with this process; (it, None) once its
    control socket exists, else (None, why)."""
    try:
        log_dir.mkdir(parents=True, exist_ok=True)
        with open(log_dir / "daemon.out", "ab") as out:
            process = subprocess.Popen([CONTROL, "-f"], env=os.environ | env, stdin=subprocess.DEVNULL, stdout=out,
                                       stderr=subprocess.STDOUT, preexec_fn=die_with_parent)
    except OSError as error:  # a storage folder it cannot write: the preflight says so in its own words
        return None, f"`{CONTROL} -f` did not start ({error.strerror}: {error.filename or CONTROL})"
    control = Path(env["CUDA_MPS_PIPE_DIRECTORY"]) / "control"
    deadline = time.monotonic() + START_S
    while not control.exists():
        if process.poll() is not None or time.monotonic() > deadline:
            end(process)
            return None, f"`{CONTROL} -f` did not start (exit {process.returncode}; its log: {log_dir})"
        time.sleep(0.05)
    return process, None


def stop_daemon(process: subprocess.Popen, env: dict[str, str]) -> None:
    """Tell the daemon to quit (it ends its server first); end it by signal if it has not within
    QUIT_S in all. A server with a client left (a process the trials started that outlives them)
    does not quit, and `quit` then waits for it."""
    deadline = time.monotonic() + QUIT_S
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        subprocess.run([CONTROL], input=b"quit\n", env=os.environ | env, timeout=QUIT_S,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        process.wait(timeout=max(0.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        end(process)


def end(process: subprocess.Popen) -> None:
    process.terminate()
    try:
        process.wait(timeout=QUIT_S)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def die_with_parent() -> None:
    """In the child before exec: SIGTERM when the process that started it dies (Linux's
    PR_SET_PDEATHSIG), so a driver killed with `kill -9` leaves no daemon behind."""
    if sys.platform.startswith("linux"):
        PR_SET_PDEATHSIG = 1
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


@contextlib.contextmanager
def environment(values: dict[str, str | None]):
    """os.environ with `values` set (None: unset), as it was afterwards."""
    before = {key: os.environ.get(key) for key in values}
    set_environment(values)
    try:
        yield
    finally:
        set_environment(before)


def set_environment(values: dict[str, str | None]) -> None:
    for key, value in values.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
