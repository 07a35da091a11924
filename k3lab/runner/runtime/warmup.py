"""A GPU sweep's kernel cache, made ready before its trials start: every kernel shape it will use
warmed once (`k3lab.runner.runtime.kernel_cache`), in the driver when the record says the cache is warm for
this host's GPU, else in one Ray task that holds a whole GPU.

`run` is a `k3lab.runner.tune.run.SweepRun` (or anything with the same fields).
"""

from __future__ import annotations

import time
from pathlib import Path

from k3lab.runner.runtime.kernel_cache import (all_recorded, host_gpu_name, kernel_shapes, shipped_line, use_kernel_cache,
                                   warm_kernels)
from k3lab.runner.runtime.tunings import start_from_shipped


def open_sweep_cache(run) -> None:
    """A GPU sweep's kernel cache: created, writable, and this process points at it."""
    if run.uses_gpus:
        use_kernel_cache(run.kernel_cache)


def warm_kernels_on_a_gpu(run, say=print) -> dict:
    """Before any trial: one forward+backward per distinct kernel shape, in one Ray task that
    holds a whole GPU (on a cluster, a GPU worker; the cache should then be on the shared
    volume). Returns the warm-up's result plus the GPU's name; {} when there is no GPU."""
    import ray

    if not run.uses_gpus or ray.cluster_resources().get("GPU", 0) < 1:
        return {}
    shapes = kernel_shapes(run.sweep)
    known = warm_on_this_host(run, shapes, say)
    if known:
        return known
    say(f"kernels: warming {shapes_phrase(shapes)} on one GPU "
        f"(cache {run.kernel_cache}; those it has recorded are skipped) before the trials start ...")
    try:
        result = ray.get(ray.remote(num_gpus=1, num_cpus=1)(_warm_task).remote(shapes, run.kernel_cache))
    except Exception as error:  # the trials can still tune for themselves: not worth failing the sweep
        say(f"kernels: warm-up failed ({str(error).strip().splitlines()[-1][:200]}); trials tune their own kernels")
        return {}
    if result.get("shipped"):
        say(shipped_line(result["shipped"]))
    recorded = result["shapes"] - result["warmed"]
    already = f", {recorded} already warm from an earlier warm-up" if recorded else ""
    say(f"kernels: warm in {result['seconds']:.1f} s ({result['new_autotune_results']} new autotune results{already})")
    return result


def warm_on_this_host(run, shapes: list, say=print) -> dict:
    """On one host: the shipped tunings imported and the record read in the driver, so that a
    cache that is warm for every shape costs no GPU task (a process start and its imports before
    the trials). The warm-up's result, or {} to run the task."""
    device = None if run.on_cluster else host_gpu_name()
    if device is None:
        return {}
    started = time.perf_counter()
    shipped = start_from_shipped(run.kernel_cache, device)
    if shipped:
        say(shipped_line(shipped))
    if not all_recorded(shapes, run.kernel_cache, device):
        return {}
    seconds = time.perf_counter() - started
    say(f"kernels: warm in {seconds:.1f} s ({shapes_phrase(shapes)} already "
        f"warm for {device} in {run.kernel_cache}: no warm-up task)")
    return {"shapes": len(shapes), "warmed": 0, "seconds": seconds, "new_autotune_results": 0,
            "device_name": device, "shipped": shipped}


def shapes_phrase(shapes: list) -> str:
    return f"{len(shapes)} kernel shape{'s' if len(shapes) != 1 else ''}"


def _warm_task(shapes, cache: Path) -> dict:
    return warm_kernels(shapes, cache=cache, skip_recorded=True)
