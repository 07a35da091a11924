"""The runtime a sweep enters: what its processes need around Ray Tune, in the order they need it.

    with sweep_runtime(run, checks, say) as sharing:  # lock, leftovers ended, checks, GPU sharing
        with sweep_log(run):                          # Ray's and MLflow's notices in the log file
            with watched_ray(run, start):             # Ray with a watchdog, shut down on the way out
                ...

`run` is a `k3lab.runner.tune.run.SweepRun` (or anything with the same fields).
"""

from __future__ import annotations

import contextlib
import os

from k3lab.errors import UserError
from k3lab.runner.runtime.kernel_cache import cache_env
from k3lab.runner.runtime.lock import sweep_lock
from k3lab.runner.runtime.logs import library_logs
from k3lab.runner.runtime.cleanup import missing_from, remove_made
from k3lab.runner.runtime.mps import ENV_KEYS as MPS_ENV
from k3lab.runner.runtime.mps import gpu_sharing
from k3lab.runner.runtime.reaper import Watchdog, end_leftovers
from k3lab.runner.runtime.sigterm import keep_sigterm_handler
from k3lab.store.tracking import sqlite_path


@contextlib.contextmanager
def sweep_runtime(run, checks, say=print):
    """The experiment's lock, taken first and held to the end (one sweep of an experiment at a
    time, from before its checks); what an earlier run's killed driver left of its Ray instance
    ended; `checks()`; then how trials share a GPU, set up before anything initialises CUDA (it
    connects to MPS then). Yields the GPU sharing ("mps", or why not; None where none is shared)."""
    with sweep_lock(run.lock_file):
        end_leftovers(run.ray_record, say=say)
        checks()
        with share_gpus(run, say) as sharing:
            yield sharing


def share_gpus(run, say=print):
    """How trials that share a GPU run on it (`k3lab.runner.runtime.mps`): an MPS daemon of the sweep's own, or in turns."""
    return gpu_sharing(run.sweep.resources.mps, run.shares_gpus, run.on_cluster,
                       log_dir=run.storage / f"{run.experiment}.mps", where=str(run.sweep.path), say=say)


def worker_env(run) -> dict[str, str]:
    """What the runtime passes to every Ray worker: the kernel cache (GPU sweeps) and the MPS daemon's pipes."""
    env = cache_env(run.kernel_cache) if run.uses_gpus else {}  # one kernel cache for the driver, warm-up, trials
    return env | {key: os.environ[key] for key in MPS_ENV if key in os.environ}


@contextlib.contextmanager
def sweep_log(run):
    """Ray's and MLflow's notices in the sweep's log file (`library_logs`), from before Ray starts
    (its start-up notices go there). A sweep refused once Ray is up (one trial larger than the
    cluster), or stopped (--stop-after, Ctrl-C, SIGTERM) before its state file is written, removes
    the file, the folders made for it, and an SQLite store file it made that is still empty: it
    left the log of a sweep that never ran, and a 0-byte store."""
    made = [] if run.verbose else missing_from(run.log_file)
    store = sqlite_path(run.tracking_uri)
    made_store = missing_from(store) if store is not None else []
    try:
        with contextlib.nullcontext() if run.verbose else library_logs(run.log_file, ray=True):
            yield
    except (UserError, KeyboardInterrupt):
        if not run.state_file.exists():  # written once the parent run is open
            remove_made(made)
            if made_store and made_store[0].is_file() and made_store[0].stat().st_size == 0:
                remove_made(made_store)  # an empty file: no other sweep's runs in it
        raise


@contextlib.contextmanager
def watched_ray(run, start):
    """Ray, started by `start()` (ray.init installs its own SIGTERM handler: the sweep's is kept),
    with a watchdog that ends a Ray instance of the sweep's own with this process
    (`k3lab.runner.runtime.reaper`); shut down on the way out, whatever happens."""
    import ray

    watchdog = None
    try:
        if not run.on_cluster:
            watchdog = Watchdog.start(run.ray_record, run.log_file)
        with keep_sigterm_handler():
            start()
        if watchdog is not None:
            watchdog.session(ray_session_dir())
        yield
    finally:
        ray.shutdown()
        if watchdog is not None:
            watchdog.close()


def ray_session_dir() -> str | None:
    """The session folder of the Ray instance this process started (/tmp/ray/session_...), if known."""
    try:
        from ray._private import worker

        return worker._global_node.get_session_dir_path()
    except Exception:  # a private API: only for the watchdog's record and messages
        return None
