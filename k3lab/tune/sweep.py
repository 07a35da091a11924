"""`k3lab sweep`: every valid variant x seed of a sweep as a Ray Tune trial, tracked in MLflow.

What it writes under the storage folder (default ./k3lab_runs) is listed in `k3lab.tune.run`.

GPU kernels are tuned once per machine in the kernel cache (`k3lab.tune.kernels`), and a
GPU sweep warms every kernel shape it will use on one GPU before its trials start.
"""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path

from k3lab.errors import UserError
from k3lab.model.config import KimiK3Config
from k3lab.registry import ResourceSpec, Sweep
from k3lab.report.efficiency import crashes, figures_of, sweep_efficiency, time_shares
from k3lab.report.sequential import BUDGET
from k3lab.store.colours import variant_colours
from k3lab.store.runs import GPU_SHARING, trial_runs
from k3lab.store.state import check_parent_run
from k3lab.store.tracking import sqlite_path
from k3lab.tune.kernels import (all_recorded, cache_env, host_gpu_name, kernel_shapes, shipped_line,
                                use_kernel_cache, warm_kernels)
from k3lab.tune.lock import sweep_lock
from k3lab.tune.made import missing_from, remove_made
from k3lab.tune.logs import library_logs
from k3lab.tune.mps import ENV_KEYS as MPS_ENV
from k3lab.tune.mps import gpu_sharing
from k3lab.tune.parent import ParentRun, record_sweep
from k3lab.tune.preflight import Preflight, check_prepared, cuda_gpus, run_preflight_overlapped
from k3lab.tune.reaper import Watchdog, end_leftovers
from k3lab.tune.run import SweepRun, check_experiment_dir, discard_earlier_run, start_lost_trials_again
from k3lab.tune.sigterm import keep_sigterm_handler, sigint_kept
from k3lab.tune.trial import TrialSpec, tune_trainable
from k3lab.tune.tunings import start_from_shipped


def run_order(trials) -> list:
    """The order a grid's trials start in: seed by seed (every variant's first seed, then every
    variant's second, ...), so that a sweep stopped early (--stop-after, a budget, a preempted
    node) leaves whole seeds, i.e. pairs for every comparison, where variant by variant it would
    leave all of some variants' seeds and none of the others'."""
    return sorted(trials, key=lambda trial: trial.variant.seeds.index(trial.seed))  # stable: variants keep their order


def trial_specs(run: SweepRun, parent_run_id: str, dataset_dir: str | None = None) -> dict[str, TrialSpec]:
    """One TrialSpec per trial, in `run_order`; dataset_dir: the corpus the driver prepared, for
    every trial."""
    colours = variant_colours([v.name for v in run.sweep.valid_variants])
    return {
        trial.id: TrialSpec(variant_id=trial.variant.id, variant_name=trial.variant.name, seed=trial.seed,
                            config=trial.variant.config.to_dict(), train=run.sweep.train,
                            tracking_uri=run.tracking_uri, experiment=run.experiment, parent_run_id=parent_run_id,
                            overrides={k: str(v) for k, v in trial.variant.overrides.items()},
                            metric=run.sweep.metric.name, mode=run.sweep.metric.mode,
                            colour=colours[trial.variant.name], training_slots=run.sweep.resources.training_slots,
                            dataset_dir=dataset_dir)
        for trial in run_order(run.sweep.trials)
    }


def start_ray(run: SweepRun) -> None:
    """Join the cluster at --address/RAY_ADDRESS, or start a Ray instance of this sweep's own
    (address "local": never another sweep's instance on the same machine)."""
    import ray

    env = {"K3LAB_TRIAL_CPUS": str(max(1, int(run.sweep.resources.cpu))),
           "PYTHONWARNINGS": "ignore::DeprecationWarning"}
    if run.uses_gpus:  # one kernel cache for the driver, the warm-up and every trial
        env |= cache_env(run.kernel_cache)
    if run.sweep.resources.reuse_actors:  # Ray gives a stopped trial 2 s to end before it fails the next one
        env["TUNE_FUNCTION_THREAD_TIMEOUT_S"] = "60"
    os.environ.setdefault("TUNE_WARN_EXCESSIVE_EXPERIMENT_CHECKPOINT_SYNC_THRESHOLD_S", "0")
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
    for key in ("K3LAB_FAIL_AT_STEP",):  # fault injection for crash-recovery tests
        if key in os.environ:
            env[key] = os.environ[key]
    for key in ("K3LAB_DATA_DIR", "MLFLOW_TRACKING_URI", *MPS_ENV):
        if key in os.environ:
            env[key] = os.environ[key]
    kwargs = dict(runtime_env={"env_vars": env}, log_to_driver=False, configure_logging=False)
    if run.on_cluster:
        ray.init(address=run.address or os.environ["RAY_ADDRESS"], **kwargs)
    else:  # a DDP trial's waiting driver gets a logical CPU of its own, so the workers can have them all
        extra = 1 if run.sweep.resources.strategy == "ddp" else 0
        ray.init(address="local", include_dashboard=False, num_cpus=(os.cpu_count() or 1) + extra, **kwargs)


def trial_demand(resources: ResourceSpec, cluster_gpus: float) -> dict[str, float]:
    """The CPUs and GPUs one trial holds at once: a DDP trial's workers each take `cpu`."""
    cpus = resources.gpus_per_trial * resources.cpu + DDP_DRIVER_CPU if resources.strategy == "ddp" else resources.cpu
    return {"CPU": cpus, "GPU": gpus_per_trial(resources, has_gpus=cluster_gpus > 0)}


def check_cluster_fits(sweep: Sweep, cluster: dict[str, float]) -> None:
    """One trial must fit the cluster Ray sees; Ray would otherwise keep it pending for ever."""
    demand = trial_demand(sweep.resources, cluster.get("GPU", 0))
    for kind, field in (("GPU", gpu_field(sweep)), ("CPU", "resources.cpu")):
        have = cluster.get(kind, 0)
        if demand[kind] > have + 1e-9:
            raise UserError(f"{sweep.path}: {field}: one trial needs {demand[kind]:g} {kind}s and the Ray cluster "
                            f"has {have:g} in all; ask for fewer or add workers")


def warm_kernels_on_a_gpu(run: SweepRun, say=print) -> dict:
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


def warm_on_this_host(run: SweepRun, shapes: list, say=print) -> dict:
    """On one host: the shipped tunings imported and the record read in the driver, so that a
    cache that is warm for every shape costs no GPU task (its process start and imports were
    7-8 s before each sweep's trials on an H200). The warm-up's result, or {} to run the task."""
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


def build_scheduler(sweep: Sweep):
    spec = sweep.scheduler
    if spec.kind == "none":
        return None
    from ray.tune.schedulers import ASHAScheduler

    time_attr = "tokens" if spec.time_attr == "tokens" else "training_iteration"
    return ASHAScheduler(time_attr=time_attr, max_t=spec.max_t, grace_period=spec.grace_period,
                         reduction_factor=spec.reduction_factor)


DDP_DRIVER_CPU = 0.01  # the Tune trial of a DDP variant only waits on its workers


def build_trainable(run: SweepRun, specs: dict[str, TrialSpec]):
    """One-worker trials run `tune_trainable`; `strategy: ddp` trials a Ray Train TorchTrainer
    with `gpus_per_trial` workers (GPUs with NCCL, or CPU workers with gloo on a cluster
    without GPUs, so the same sweep file can be tried on a laptop)."""
    import ray
    from ray import tune

    resources = run.sweep.resources
    if resources.strategy != "ddp":
        return tune.with_resources(tune.with_parameters(tune_trainable, trials=specs), resources.tune_resources())
    from k3lab.tune.distributed import ddp_trainable

    use_gpu = ray.cluster_resources().get("GPU", 0) > 0
    trainable = tune.with_parameters(ddp_trainable, trials=specs, num_workers=resources.gpus_per_trial,
                                     cpus_per_worker=resources.cpu, use_gpu=use_gpu,
                                     storage=str(run.ddp_dir.resolve()))
    return tune.with_resources(trainable, {"cpu": DDP_DRIVER_CPU})  # the workers hold the real resources


def make_tuner(run: SweepRun, specs: dict[str, TrialSpec], callbacks: list, searcher=None):
    """The Tuner: a grid over every trial, or with a seeds policy, its `searcher`
    (`k3lab.tune.seeds.SeedSearcher`) choosing the trials."""
    from ray import tune

    sweep = run.sweep
    trainable = build_trainable(run, specs)
    run_config = tune.RunConfig(
        name=run.experiment, storage_path=str(run.storage.resolve()), callbacks=callbacks, verbose=0,
        failure_config=tune.FailureConfig(max_failures=run.max_failures),
        checkpoint_config=tune.CheckpointConfig(num_to_keep=1),
    )
    if run.resume:
        return restore_tuner(run, trainable, run_config)
    tune_config = tune.TuneConfig(metric=sweep.metric.name, mode=sweep.metric.mode,
                                  scheduler=build_scheduler(sweep),
                                  max_concurrent_trials=run.max_concurrent or sweep.resources.max_concurrent_trials,
                                  reuse_actors=sweep.resources.reuse_actors,
                                  search_alg=searcher, num_samples=1 if searcher is None else len(specs))
    space = {"trial": tune.grid_search(list(specs))} if searcher is None else {}
    return tune.Tuner(trainable, param_space=space, tune_config=tune_config, run_config=run_config)


def restore_tuner(run: SweepRun, trainable, run_config):
    """`Tuner.restore` of the sweep's experiment folder, with this run's callbacks and failure config.

    Ray restores the run config that the first run pickled into the folder, callbacks included
    (ray-project/ray#38894): their tracking URI is the first run's (on another machine's path after
    a move) and their live table is not the one on screen. Ray has no public way to replace them
    (ray-project/ray#41364), hence the private `_local_tuner`.
    """
    from ray import tune

    tuner = tune.Tuner.restore(str(run.tune_dir.resolve()), trainable, resume_unfinished=True, resume_errored=True)
    restored = tuner._local_tuner.get_run_config()
    restored.callbacks = run_config.callbacks
    restored.failure_config = run_config.failure_config
    return tuner


def sweep_preflight(run: SweepRun, progress: bool) -> Preflight:
    """What the sweep's trials need, for `run_preflight`."""
    sweep = run.sweep
    return Preflight(tracking_uri=run.tracking_uri, train=sweep.train, models=sweep_models(sweep),
                     folders={"storage folder": run.storage}, gpus=gpus_per_trial(sweep.resources, cuda_gpus() > 0),
                     gpus_from=f"{sweep.path}: {gpu_field(sweep)}", local=not run.on_cluster, progress=progress,
                     train_from=f"{sweep.path}: ")


def sweep_models(sweep: Sweep) -> dict[str, KimiK3Config]:
    """The models the sweep's trials train, by label for messages ("x.yaml: variant a")."""
    return {f"{sweep.path}: variant {v.name}": v.config for v in sweep.valid_variants}


def gpus_per_trial(resources: ResourceSpec, has_gpus: bool) -> float:
    """The GPUs one trial takes: DDP trials run gloo CPU workers where there are no GPUs."""
    if resources.strategy != "ddp":
        return resources.gpu
    return resources.gpus_per_trial if has_gpus else 0


def gpu_field(sweep: Sweep) -> str:
    """Where the sweep asks for GPUs, e.g. 'profile gpu: resources.gpu=0.2'."""
    resources = sweep.resources
    field = (f"resources.gpus_per_trial={resources.gpus_per_trial}" if resources.strategy == "ddp"
             else f"resources.gpu={resources.gpu:g}")
    return (f"profile {sweep.profile}: " if sweep.profile else "") + field


def run_sweep(run: SweepRun, live: bool = True, say=print) -> dict:
    """Run (or resume) the sweep; returns the report summary (see `k3lab.report.summary`).

    The experiment's lock (`k3lab.tune.lock`) is taken first and held to the end. Everything
    that can be checked is checked then (`check_experiment_dir`, the preflight);
    only then is the parent MLflow run opened, and whatever happens after, it is closed.
    Before that, what an earlier run's killed driver left of its Ray instance is ended. A
    corpus still to be tokenized is tokenized while Ray starts."""
    with sweep_lock(run.lock_file):  # one sweep of an experiment at a time, from before its checks
        end_leftovers(run.ray_record, say=say)
        check_experiment_dir(run)
        if run.on_cluster:
            check_ray_address(run.address or os.environ["RAY_ADDRESS"], "--address" if run.address else "RAY_ADDRESS")
        with share_gpus(run, say) as sharing:  # before anything initialises CUDA: it connects to MPS then
            return run_checked_sweep(run, live, say, sharing)


RAY_ADDRESS_TIMEOUT_S = 3.0


def check_ray_address(address: str, named_by: str) -> None:
    """A Ray head answers at HOST:PORT (or ray://HOST:PORT) within RAY_ADDRESS_TIMEOUT_S; ray.init
    would raise a traceback for a malformed address and retry an unanswered one for minutes.
    `auto` (a cluster of this machine, found by Ray) is left to Ray."""
    import socket

    if address == "auto":
        return
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not host or not port.isdigit():
        raise UserError(f"{named_by} {address}: expected HOST:PORT (the Ray head's port, 6379 by default), "
                        "ray://HOST:10001 or auto")
    try:
        socket.create_connection((host, int(port)), timeout=RAY_ADDRESS_TIMEOUT_S).close()
    except OSError as error:
        raise UserError(f"{named_by} {address}: no Ray head answers there ({error.strerror or error})") from None


def share_gpus(run: SweepRun, say=print):
    """How trials that share a GPU run on it (`k3lab.tune.mps`): an MPS daemon of the sweep's own, or in turns."""
    return gpu_sharing(run.sweep.resources.mps, run.shares_gpus, run.on_cluster,
                       log_dir=run.storage / f"{run.experiment}.mps", where=str(run.sweep.path), say=say)


def run_checked_sweep(run: SweepRun, live: bool, say, sharing: str | None) -> dict:
    """`run_sweep` once the experiment folder has passed its checks and the GPU sharing is set up."""
    plan = sweep_preflight(run, progress=live)
    dataset = run_preflight_overlapped(plan)  # tokenizing while Ray starts
    if run.resume:  # after the preflight, which found the tracking server answering
        check_parent_run(run.state_file, run.tracking_uri, run.hint("sweep", overwrite=True))
        start_lost_trials_again(run, say=say)
    if run.uses_gpus:
        use_kernel_cache(run.kernel_cache)  # created, writable, and this process points at it
    if run.overwrite:
        discard_earlier_run(run)
    with sweep_log(run):
        say(f"MLflow {run.tracking_uri} (experiment {run.experiment}); Tune state in {run.tune_dir}")
        if not run.verbose:  # named here, once the checks have passed and the file exists
            say(f"Ray and MLflow notices: {run.log_file}")
        with ray_session(run):
            prepared = dataset.result()
            check_prepared(plan, prepared)  # a corpus tokenized on the thread: before any trial
            dataset_dir = str(prepared.path.resolve())
            with ParentRun(run) as parent:
                if not run.resume:
                    record_sweep(run, parent)
                if sharing is not None:
                    parent.tracker.set_tags({GPU_SHARING: sharing})
                errors, hardware = run_trials(run, parent.run_id, live, say, dataset_dir=dataset_dir)
                summary = report_sweep(run, parent, hardware)
                parent.log_metrics({"trials_failed": len(errors)})
                parent.status = "FINISHED" if not errors else "FAILED"
    summary["errors"] = errors
    summary["parent_run_id"] = parent.run_id
    return summary


@contextlib.contextmanager
def sweep_log(run: SweepRun):
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
        if not run.state_file.exists():  # written once the parent run is open (`record_sweep`)
            remove_made(made)
            if made_store and made_store[0].is_file() and made_store[0].stat().st_size == 0:
                remove_made(made_store)  # an empty file: no other sweep's runs in it
        raise


def report_sweep(run: SweepRun, parent: ParentRun, hardware: dict) -> dict:
    """The sweep's report (`k3lab.report.summary`), its files logged to the parent run, and the
    sweep's efficiency (tokens/s, MFU, warm-up and start-up) logged and added to it."""
    from k3lab.report.summary import build_report
    from k3lab.tune.seeds import report_options

    sweep = run.sweep
    summary = build_report(run.tracking_uri, parent.run_id, sweep.metric.name, sweep.metric.mode,
                           out_dir=run.storage / f"{run.experiment}_report", baseline=sweep.baseline,
                           variant_order=[v.name for v in sweep.valid_variants], **report_options(sweep),
                           unfinished=BUDGET)  # the trials ran to the sweep's end
    for path in summary["files"]:
        parent.log_artifact(path, "report")
    wall_s, parts = parent.parts_wall_s()  # a resumed sweep: over every part, summed
    trials = trial_runs(run.tracking_uri, parent.run_id)
    summary["efficiency"] = sweep_efficiency(figures_of(trials), wall_s, hardware["gpus"], hardware.get("device_name"),
                                             hardware.get("seconds", 0.0)) | {"sweep_parts": parts}
    summary["efficiency"] |= time_shares(run.tracking_uri, trials, wall_s) | crashes(trials)
    logged_by_end = {"sweep_wall_s", "sweep_parts"} | ({"kernel_warmup_s"} if run.resume else set())
    parent.log_metrics({k: v for k, v in summary["efficiency"].items() if k not in logged_by_end})
    return summary


@contextlib.contextmanager
def ray_session(run: SweepRun):
    """Ray, started or joined for the sweep, and checked to fit one trial before any run is
    opened; shut down on the way out, whatever happens."""
    import ray

    watchdog = None
    try:
        if not run.on_cluster:  # a Ray instance of the sweep's own: it ends with this process (k3lab.tune.reaper)
            watchdog = Watchdog.start(run.ray_record, run.log_file)
        with keep_sigterm_handler():  # ray.init installs its own
            start_ray(run)
        if watchdog is not None:
            watchdog.session(ray_session_dir())
        check_cluster_fits(run.sweep, ray.cluster_resources())
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


def run_trials(run: SweepRun, parent_run_id: str, live: bool, say=print,
               dataset_dir: str | None = None) -> tuple[list[str], dict]:
    """Every trial through Ray Tune, with the live table, after the kernel warm-up on GPU sweeps.
    Returns the first line of each trial's error, and the GPUs used ({"gpus", "device_name",
    "seconds" of warm-up}). Raises KeyboardInterrupt when Tune stopped on Ctrl-C with trials left."""
    import ray

    from k3lab.tune.progress import SweepProgress, earlier_trials, progress_mode
    from k3lab.tune.status import MLflowStatusCallback, plain

    specs = trial_specs(run, parent_run_id, dataset_dir)
    progress = SweepProgress(run.sweep, specs, mode=progress_mode(live), tracking_uri=run.tracking_uri, say=say)
    searcher = None
    if run.sweep.adaptive:  # seeds until resolved: a Searcher picks the trials (k3lab.tune.seeds)
        from k3lab.tune.seeds import build_searcher

        searcher = build_searcher(run.sweep, run.tracking_uri)
        progress.rows = {key: row for key, row in progress.rows.items() if searcher.starts_with(key)}
    if run.resume:
        progress.show_earlier(earlier_trials(run.tune_dir))
    hardware = {"gpus": ray.cluster_resources().get("GPU", 0) if run.uses_gpus else 0}
    hardware |= warm_kernels_on_a_gpu(run, say=say)
    with progress:
        callbacks = [progress, MLflowStatusCallback(run.tracking_uri)]
        tuner = (make_tuner(run, specs, callbacks) if searcher is None else make_tuner(run, specs, callbacks, searcher))
        if searcher is not None and run.resume:  # the searcher Tune restores (its state: from the folder)
            searcher = tuner._local_tuner._tune_config.search_alg
        with sigint_kept():  # Tune's handler is for the fit only: a SIGTERM in the report still stops
            results = tuner.fit()
    if searcher.unfinished() if searcher is not None else progress.unfinished():  # Tune catches the first
        raise KeyboardInterrupt  # Ctrl-C, saves its state and returns
    return [plain(str(r.error)).splitlines()[0] for r in results if r.error is not None], hardware
