"""The sweep's Ray Tune `Tuner`: its trainable (one process or DDP), scheduler and run config,
new or restored from the experiment folder, and its fit."""

from __future__ import annotations

from k3lab.registry import Sweep
from k3lab.runner.runtime.sigterm import sigint_kept
from k3lab.runner.tune.run import SweepRun
from k3lab.runner.tune.trial import TrialSpec, tune_trainable

DDP_DRIVER_CPU = 0.01  # the Tune trial of a DDP variant only waits on its workers


def build_scheduler(sweep: Sweep):
    spec = sweep.scheduler
    if spec.kind == "none":
        return None
    from ray.tune.schedulers import ASHAScheduler

    time_attr = "tokens" if spec.time_attr == "tokens" else "training_iteration"
    return ASHAScheduler(time_attr=time_attr, max_t=spec.max_t, grace_period=spec.grace_period,
                         reduction_factor=spec.reduction_factor)


def build_trainable(run: SweepRun, specs: dict[str, TrialSpec]):
    """One-worker trials run `tune_trainable`; `strategy: ddp` trials a Ray Train TorchTrainer
    with `gpus_per_trial` workers (GPUs with NCCL, or CPU workers with gloo on a cluster
    without GPUs, so the same sweep file can be tried on a laptop)."""
    import ray
    from ray import tune

    resources = run.sweep.resources
    if resources.strategy != "ddp":
        return tune.with_resources(tune.with_parameters(tune_trainable, trials=specs), trial_resources(run))
    from k3lab.runner.tune.distributed import ddp_trainable

    use_gpu = ray.cluster_resources().get("GPU", 0) > 0
    trainable = tune.with_parameters(ddp_trainable, trials=specs, num_workers=resources.gpus_per_trial,
                                     cpus_per_worker=resources.cpu, use_gpu=use_gpu,
                                     storage=str(run.ddp_dir.resolve()))
    return tune.with_resources(trainable, {"cpu": DDP_DRIVER_CPU})  # the workers hold the real resources


def trial_resources(run: SweepRun) -> dict[str, float]:
    """A one-process trial's Ray resources: the sweep file's, with the GPU share the memory packing
    allows where it allows fewer trials at once than the file (`run.packing`)."""
    resources = run.sweep.resources.tune_resources()
    if run.packing is not None and 0 < resources["gpu"] < run.packing.fraction:
        resources["gpu"] = run.packing.fraction
    return resources


def make_tuner(run: SweepRun, specs: dict[str, TrialSpec], callbacks: list, searcher=None):
    """The Tuner: a grid over every trial, or with a seeds policy, its `searcher`
    (`k3lab.runner.tune.seeds.SeedSearcher`) choosing the trials."""
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


def fit(tuner):
    """`tuner.fit()`; Tune's SIGINT handler is for the fit only: a SIGTERM in the report still stops."""
    with sigint_kept():
        return tuner.fit()
