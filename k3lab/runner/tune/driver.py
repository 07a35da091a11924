"""`k3lab sweep`: every valid variant x seed of a sweep as a Ray Tune trial, tracked in MLflow.

What it writes under the storage folder (default ./k3lab_runs) is listed in `k3lab.runner.tune.run`.
The process, GPU and cache plumbing around Tune (lock, MPS, Ray watchdog, kernel cache, preflight)
is `k3lab.runner.runtime`, which the sweep enters once (`k3lab.runner.runtime.session`).
"""

from __future__ import annotations

import contextlib
import os

import attrs

from k3lab.errors import UserError
from k3lab.registry import ResourceSpec, Sweep
from k3lab.report.summary import SweepReport
from k3lab.runner.runtime.memory import fake_gpu, host_packing
from k3lab.runner.runtime.preflight import Preflight, check_prepared, cuda_gpus, run_preflight_overlapped
from k3lab.runner.runtime.session import sweep_log, sweep_runtime, watched_ray, worker_env
from k3lab.runner.runtime.warmup import open_sweep_cache, warm_kernels_on_a_gpu
from k3lab.runner.tune.parent import ParentRun, record_sharing, record_sweep, report_sweep
from k3lab.runner.tune.run import SweepRun, check_parent, check_where, discard_earlier_run
from k3lab.runner.tune.trial import trial_specs
from k3lab.runner.tune.tuner import DDP_DRIVER_CPU, fit, make_tuner


def start_ray(run: SweepRun) -> None:
    """Join the cluster at --address/RAY_ADDRESS, or start a Ray instance of this sweep's own
    (address "local": never another sweep's instance on the same machine)."""
    import ray

    env = {"K3LAB_TRIAL_CPUS": str(max(1, int(run.sweep.resources.cpu))),
           "PYTHONWARNINGS": "ignore::DeprecationWarning"}
    env |= worker_env(run)  # the kernel cache and the MPS daemon's pipes
    if run.sweep.resources.reuse_actors:  # Ray gives a stopped trial 2 s to end before it fails the next one
        env["TUNE_FUNCTION_THREAD_TIMEOUT_S"] = "60"
    os.environ.setdefault("TUNE_WARN_EXCESSIVE_EXPERIMENT_CHECKPOINT_SYNC_THRESHOLD_S", "0")
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
    for key in ("K3LAB_FAKE_GPU", "K3LAB_GATE_DIR", "K3LAB_DATA_DIR", "MLFLOW_TRACKING_URI"):  # the fake GPU: for tests
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


def sweep_preflight(run: SweepRun, progress: bool) -> Preflight:
    """What the sweep's trials need, for `run_preflight`."""
    sweep = run.sweep
    return Preflight(tracking_uri=run.tracking_uri, train=sweep.train, models=sweep_models(sweep),
                     folders={"storage folder": run.storage}, gpus=gpus_per_trial(sweep.resources, cuda_gpus() > 0),
                     gpus_from=f"{sweep.path}: {gpu_field(sweep)}", local=not run.on_cluster, progress=progress,
                     train_from=f"{sweep.path}: ")


def check_dry_run(run: SweepRun) -> None:
    """The checks a sweep makes before it starts anything that need no store, data or Ray: its
    inputs, and on a local instance this machine's GPUs, FLA and memory. A sweep these refuse is
    refused by its dry run too, with the same message."""
    from k3lab.runner.runtime.preflight import check_cpu_memory, check_fla, check_gpus, check_inputs

    plan = sweep_preflight(run, progress=False)
    check_inputs(plan.train, plan.models, plan.train_from)
    if plan.local:
        check_gpus(plan.gpus, plan.gpus_from)
        check_fla(plan.models, plan.gpus)
        check_cpu_memory(plan.models, plan.train, plan.gpus)


def dry_run_line(run: SweepRun) -> str:
    """Where the sweep would log and keep its state, what a trial takes, and how trials would share a GPU."""
    return (f"dry run: would log to {run.tracking_uri} (experiment {run.experiment}), Tune state in {run.tune_dir}, "
            f"resources per trial {run.sweep.resources.tune_resources()}" + slots_clause(run.sweep.resources)
            + sharing_clause(run))


def slots_clause(resources) -> str:
    if resources.training_slots is None:
        return ""
    return (f"; at most {resources.training_slots} trials per GPU train at once, the others start up "
            "and wait (resources.training_slots)")


def sharing_clause(run) -> str:
    """How trials that share a GPU will run on it (`k3lab.runner.runtime.mps`), as the sweep would decide now."""
    from k3lab.runner.runtime.mps import sharing_plan

    if not run.shares_gpus:
        return ""
    mps = run.sweep.resources.mps
    kind, detail = sharing_plan(mps, run.on_cluster)
    if kind == "yours":
        return f"; trials on one GPU run side by side through the MPS daemon at {detail}"
    if kind == "own":
        return "; trials on one GPU run side by side through an MPS daemon of the sweep's own (resources.mps)"
    if kind == "nodes":
        return f"; trials on one GPU share it as their node has it ({detail})"
    if mps:
        return f"; resources.mps: true, but {detail}: the sweep would stop before its first trial"
    return f"; trials on one GPU take turns on it ({detail})"


def sweep_models(sweep: Sweep) -> dict:
    """The models (KimiK3Config) the sweep's trials train, by label for messages ("x.yaml: variant a")."""
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


@attrs.frozen
class SweepEnd:
    """How a sweep that ran to its end ended: its report (`k3lab.report.summary.SweepReport`), the
    errors of its trials that failed, and its parent run."""

    report: SweepReport
    errors: list[str]
    parent_run_id: str


def run_sweep(run: SweepRun, live: bool = True, say=print) -> SweepEnd:
    """Run (or resume) the sweep; returns its report and its trials' errors (`SweepEnd`).

    The sweep's runtime (`sweep_runtime`) takes the experiment's lock first and holds it to the
    end; everything that can be checked is checked then (`check_where`, the preflight); only then
    is the parent MLflow run opened, and whatever happens after, it is closed. A corpus still to be
    tokenized is tokenized while Ray starts."""
    with sweep_runtime(run, lambda: check_where(run), say) as sharing:
        return run_checked_sweep(run, live, say, sharing)


def run_checked_sweep(run: SweepRun, live: bool, say, sharing: str | None) -> SweepEnd:
    """`run_sweep` once the experiment folder has passed its checks and the GPU sharing is set up."""
    plan = sweep_preflight(run, progress=live)
    dataset = run_preflight_overlapped(plan)  # tokenizing while Ray starts
    check_parent(run, say)  # after the preflight, which found the tracking server answering
    open_sweep_cache(run)
    if (run.uses_gpus or fake_gpu()) and not run.on_cluster:  # a variant too large for the GPU: refused here
        run.packing = host_packing(run.sweep, run.kernel_cache, gpus=max(1, cuda_gpus()), max_concurrent=run.max_concurrent)
    if run.packing is not None:
        say(f"GPU memory: {run.packing.line()}")
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
            parent = ParentRun(run)
            try:
                with parent:
                    if not run.resume:
                        record_sweep(run, parent)
                    record_sharing(parent, sharing)
                    errors, hardware = run_trials(run, parent.run_id, live, say, dataset_dir=dataset_dir)
                    report = report_sweep(run, parent, hardware)
                    parent.log_metrics({"trials_failed": len(errors)})
                    parent.status = "FINISHED" if not errors else "FAILED"
            finally:  # finished or stopped: what this GPU did with these trials, for the next plan
                record_throughput(run, parent)
    return SweepEnd(report, errors, parent.run_id)


def record_throughput(run: SweepRun, parent) -> None:
    """A local GPU sweep's aggregate tokens/s over all its parts so far (its trials' tokens over the
    parts' wall time), in the kernel cache's record (`k3lab.runner.runtime.throughput`); best effort."""
    from k3lab.runner.runtime.memory import host_gpu
    from k3lab.runner.runtime.throughput import add_throughput
    from k3lab.store import runs

    gpu = host_gpu()
    if parent.tracker is None or gpu is None or not run.uses_gpus or run.on_cluster:
        return
    with contextlib.suppress(Exception):
        wall_s, _ = parent.parts_wall_s()
        tokens = sum(t.data.metrics.get("tokens") or 0 for t in runs.trial_runs(run.tracking_uri, parent.run_id))
        if tokens and wall_s > 0:
            add_throughput(run.kernel_cache, run.sweep, gpu.name, tokens / wall_s,
                           run.packing.trials if run.packing else None)


@contextlib.contextmanager
def ray_session(run: SweepRun):
    """Ray, started or joined for the sweep (`watched_ray`), and checked to fit one trial before
    any run is opened; shut down on the way out, whatever happens."""
    import ray

    with watched_ray(run, lambda: start_ray(run)):
        check_cluster_fits(run.sweep, ray.cluster_resources())
        yield


def differences_callback(run: SweepRun, parent_run_id: str, specs: dict):
    """The callback that logs each compared trial's difference from its baseline as pairs end."""
    from k3lab.runner.tune.differences import DifferencesCallback

    metric = run.sweep.metric
    return DifferencesCallback(run.tracking_uri, parent_run_id, specs, run.sweep.baselines, metric.name, metric.mode,
                               metric.diverged)


def run_trials(run: SweepRun, parent_run_id: str, live: bool, say=print,
               dataset_dir: str | None = None) -> tuple[list[str], dict]:
    """Every trial through Ray Tune, with the live table, after the kernel warm-up on GPU sweeps.
    Returns the first line of each trial's error, and the GPUs used ({"gpus", "device_name",
    "seconds" of warm-up}). Raises KeyboardInterrupt when Tune stopped on Ctrl-C with trials left."""
    import ray

    from k3lab.runner.tune.status import MLflowStatusCallback, OutOfMemoryRestarts, plain
    from k3lab.runner.tune.sweep_progress import SweepProgress, earlier_trials, progress_mode

    specs = trial_specs(run, parent_run_id, dataset_dir, run.packing)
    ooms = OutOfMemoryRestarts()
    progress = SweepProgress(run.sweep, specs, mode=progress_mode(live), tracking_uri=run.tracking_uri, say=say,
                             ooms=ooms)
    searcher = None
    if run.sweep.adaptive:  # seeds until decided: a Searcher picks the trials (k3lab.runner.tune.seeds)
        from k3lab.runner.tune.seeds import build_searcher

        searcher = build_searcher(run.sweep, run.tracking_uri)
        progress.rows = {key: row for key, row in progress.rows.items() if searcher.starts_with(key)}
    if run.resume:
        progress.show_earlier(earlier_trials(run.tune_dir))
    hardware = {"gpus": ray.cluster_resources().get("GPU", 0) if run.uses_gpus else 0}
    hardware |= warm_kernels_on_a_gpu(run, say=say)
    with progress:
        callbacks = [ooms, progress, MLflowStatusCallback(run.tracking_uri, ooms),
                     differences_callback(run, parent_run_id, specs)]
        results = fit(make_tuner(run, specs, callbacks, searcher))
    if searcher is not None and run.resume:  # Tune ran the searcher it restored from its folder, and saved
        searcher.restore_from_dir(str(run.tune_dir.resolve()))  # its last state there as it returned
    if searcher.unfinished() if searcher is not None else progress.unfinished():  # Tune catches the first
        raise KeyboardInterrupt  # Ctrl-C, saves its state and returns
    return [plain(str(r.error)).splitlines()[0] for r in results if r.error is not None], hardware
