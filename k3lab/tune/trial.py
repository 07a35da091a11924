"""One trial = one variant and seed: its MLflow run, and the function Ray Tune runs.

The trial's MLflow run id travels inside its checkpoints, so a trial restored by
`Tuner.restore` reopens the same run and logs the steps after the checkpoint
into it: exactly one MLflow run per trial, no repeated steps.
"""

from __future__ import annotations

import gc
import os
import shutil
import socket
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import attrs

from k3lab.model.config import KimiK3Config
from k3lab.train.spec import TrainSpec
from k3lab.train.checkpoint import load_checkpoint
from k3lab.train.metrics import device_name
from k3lab.store.tracking import MLflowTracker, flatten
from k3lab.train.trainer import FINISHED, TrainResult, Trainer, save_trainer, train

RUN_ID_KEY = "mlflow_run_id"


@dataclass(frozen=True)
class TrialSpec:
    """Everything a trial needs, picklable for Ray: which variant, which seed, where to log."""

    variant_id: str
    variant_name: str
    seed: int
    config: dict  # KimiK3Config fields
    train: TrainSpec
    tracking_uri: str | None
    experiment: str
    parent_run_id: str | None = None
    overrides: dict | None = None  # the swept axis values of this variant, e.g. {"attn_res_block_size": 4}
    metric: str = "val_loss"  # the sweep's metric and mode: a diverged trial reports its worst value
    mode: str = "min"

    @property
    def name(self) -> str:
        return f"{self.variant_name}-s{self.seed}"

    def model_config(self) -> KimiK3Config:
        return KimiK3Config(**self.config)


def trial_params(spec: TrialSpec, counts: dict) -> dict:
    """MLflow params of a trial run: the flattened model config, train spec and counts."""
    params = flatten("model", spec.config) | flatten("train", attrs.asdict(spec.train))
    params |= {f"params.{k}": v for k, v in counts.items() if k != "by_component"}
    params |= {f"params.component.{k}": v for k, v in counts["by_component"].items()}
    params |= {f"axis.{k}": v for k, v in (spec.overrides or {}).items()}
    return params | {"seed": spec.seed, "variant_id": spec.variant_id, "variant_name": spec.variant_name}


def node_tags() -> dict[str, str]:
    """Where a trial runs: k3lab.host, k3lab.process (host:pid; trials of a sweep with
    `resources.reuse_actors` share processes) and k3lab.node (the Ray node id) inside a Ray worker."""
    tags = {"k3lab.host": socket.gethostname(), "k3lab.process": f"{socket.gethostname()}:{os.getpid()}"}
    ray = sys.modules.get("ray")  # never imported outside Ray: no Ray node to name
    try:
        if ray is not None and ray.is_initialized():
            tags["k3lab.node"] = ray.get_runtime_context().get_node_id()
    except Exception:  # a tag is not worth failing a trial for
        pass
    return tags


def open_trial_run(spec: TrialSpec, counts: dict, run_id: str | None = None,
                   flush_every: int | None = 50, execution: dict | None = None) -> MLflowTracker:
    """The trial's MLflow run: reopened when `run_id` is known (a resumed trial) or when an
    earlier attempt made one before crashing ahead of its first checkpoint; else created."""
    run_id = run_id or existing_trial_run(spec)
    if run_id is not None:
        tracker = MLflowTracker(spec.tracking_uri, run_id, flush_every)
        tracker.skip_steps_already_logged()
        tracker.client.update_run(run_id, status="RUNNING")
        tracker.set_tags(node_tags() | execution_tags(execution))  # a restored trial may run on another node
        return tracker
    tags = {"k3lab.variant_id": spec.variant_id, "k3lab.variant_name": spec.variant_name,
            "k3lab.seed": str(spec.seed), "k3lab.kind": "trial"} | node_tags() | execution_tags(execution)
    tracker = MLflowTracker.start(spec.tracking_uri, spec.experiment, spec.name, tags=tags,
                                  parent_run_id=spec.parent_run_id, flush_every=flush_every)
    tracker.log_params(trial_params(spec, counts) | {f"run.{k}": v for k, v in (execution or {}).items()})
    tracker.log_metrics({"params_total": counts["total"], "params_active": counts["active"],
                         "params_embedding": counts["embedding"],
                         "flops_per_token": counts["flops_per_token"]}, step=0)
    tracker.flush()  # constants of the run: sent now, whatever happens to the trial later
    return tracker


def execution_tags(execution: dict | None) -> dict[str, str]:
    """How the trial actually runs (resolved KDA path, CUDA graph, compile) as k3lab.* tags."""
    return {f"k3lab.{k}": str(v) for k, v in (execution or {}).items()}


def existing_trial_run(spec: TrialSpec) -> str | None:
    """This trial's run under the sweep's parent run, if an earlier attempt created one."""
    if spec.parent_run_id is None:
        return None
    from mlflow.tracking import MlflowClient

    client = MlflowClient(spec.tracking_uri)
    experiment = client.get_run(spec.parent_run_id).info.experiment_id
    query = (f"tags.mlflow.parentRunId = '{spec.parent_run_id}' and tags.`k3lab.variant_id` = '{spec.variant_id}' "
             f"and tags.`k3lab.seed` = '{spec.seed}'")
    runs = client.search_runs([experiment], query, max_results=1)
    return runs[0].info.run_id if runs else None


def run_trial(spec: TrialSpec, checkpoint=None, on_eval=None, device=None, progress=None,
              flush_with_checkpoints: bool = False, started_at: float | None = None,
              rank: int = 0, world_size: int = 1) -> tuple[TrainResult, str | None]:
    """Train one trial with MLflow tracking (when a tracking URI is set); returns (result, run_id).

    flush_with_checkpoints: metrics reach MLflow only when `on_eval` has saved a checkpoint
    and flushed them, and a crash drops the unsent ones. A trial restored from its last
    checkpoint then logs the steps its run does not have yet: no step is logged twice.
    """
    state = load_checkpoint(checkpoint) if isinstance(checkpoint, (str, Path)) else checkpoint
    trainer = Trainer(spec.model_config(), spec.train, seed=spec.seed, device=device, rank=rank,
                      world_size=world_size)
    tracker = None
    if spec.tracking_uri:
        run_id = (state or {}).get("extra", {}).get(RUN_ID_KEY)
        tracker = open_trial_run(spec, trainer.counts, run_id, None if flush_with_checkpoints else 50,
                                 execution=trainer.execution())
        tracker.set_tags({"k3lab.device": device_name(trainer.device)})
        if started_at is not None:  # the part of startup_s before the first step: imports, data, model
            tracker.log_metrics({"startup_build_s": time.time() - started_at}, trainer.step)
    train_start = time.perf_counter()
    try:
        result = train(trainer.config, spec.train, tracker=tracker, checkpoint=state, trainer=trainer,
                       on_eval=on_eval and (lambda t, m: on_eval(t, m, tracker)), progress=progress,
                       started_at=started_at)
    except SystemExit:  # Tune stopped the trial after taking a report (an ASHA cut, or SIGTERM):
        if tracker is not None:  # metrics went before the report; closing is best effort (Ray may end us first)
            tracker.set_tags({"k3lab.stopped_at_step": str(trainer.step)})
            tracker.finish("KILLED")
        raise
    except BaseException as error:
        if tracker is not None:
            if flush_with_checkpoints:
                tracker.discard_pending()
            tracker.set_tags({"k3lab.error": f"{type(error).__name__}: {error}"[:5000]})
            tracker.finish("FAILED" if not isinstance(error, KeyboardInterrupt) else "KILLED")
        raise
    if tracker is not None:
        train_wall = time.perf_counter() - train_start
        tracker.log_metrics({"final_val_loss": result.val_loss or float("nan"),
                             "final_val_bpb": result.val_bpb or float("nan"), "train_wall_s": train_wall,
                             "avg_tokens_per_s": result.average_tokens_per_s or float("nan"),
                             # time inside the tracker (buffering and sending metrics) over the loop's time
                             "tracking_overhead": tracker.seconds_in_tracking / train_wall}, step=result.step)
        tracker.set_tags(execution_tags({"cuda_graph": trainer.cuda_graph}))  # a failed capture turns it off
        if result.status != FINISHED:
            tracker.set_tags({"k3lab.error": result.error or result.status})
        tracker.finish("FINISHED" if result.status == FINISHED else "FAILED")
    return result, tracker.run_id if tracker else None


def inject_failure(step: int, restored: bool) -> None:
    """Fault injection for crash-recovery tests: with K3LAB_FAIL_AT_STEP=N, a trial that was
    not restored from a checkpoint raises at its first report at or after step N."""
    fail_at = int(os.environ.get("K3LAB_FAIL_AT_STEP", "0"))
    if fail_at and not restored and step >= fail_at:
        raise RuntimeError(f"K3LAB_FAIL_AT_STEP: injected failure at step {step}")


def limit_threads() -> None:
    """One trial's torch threads = the CPUs Ray gave it (K3LAB_TRIAL_CPUS), not the whole node."""
    import torch

    cpus = int(os.environ.get("K3LAB_TRIAL_CPUS", "0"))
    if cpus:
        torch.set_num_threads(cpus)


_ran_a_trial = False  # this process ran a trial before (Ray reused it: `resources.reuse_actors`)


def forget_earlier_trial() -> None:
    """In a process an earlier trial used (`resources.reuse_actors`): drop torch.compile's
    code caches, which would otherwise keep guarding on that trial's model and count
    towards the recompile limit, and restart the peak-memory count this trial reports.
    A fresh process has nothing to forget and skips the work (gc alone takes ~0.2 s)."""
    global _ran_a_trial
    earlier, _ran_a_trial = _ran_a_trial, True
    torch = sys.modules.get("torch")
    if not earlier or torch is None:
        return
    gc.collect()  # the earlier trial's model and CUDA graphs, if a reference cycle still held them
    if "torch._dynamo" in sys.modules:
        torch._dynamo.reset()
    if torch.cuda.is_initialized():
        torch.cuda.reset_peak_memory_stats()


def load_ray_checkpoint(checkpoint) -> dict | None:
    """The trainer state inside a Ray (Tune or Train) checkpoint, or None."""
    if checkpoint is None:
        return None
    with checkpoint.as_directory() as directory:
        return load_checkpoint(directory)


def report_metrics(spec: TrialSpec, trainer, metrics: dict, tracker) -> dict:
    """What a trial reports to Ray at an evaluation: the metrics plus what the driver needs."""
    return metrics | {RUN_ID_KEY: tracker.run_id if tracker else "", "variant": spec.variant_name,
                      "trial_status": "finished" if trainer.step >= spec.train.steps else "running",
                      "seed": spec.seed, "done_steps": trainer.step, "total_steps": spec.train.steps}


def save_with_run_id(trainer, directory, tracker) -> None:
    """A trainer checkpoint that names its MLflow run, so a restored trial continues that run."""
    save_trainer(trainer, directory, extra={RUN_ID_KEY: tracker.run_id if tracker else None})


class LastReportHeld:
    """Every evaluation's report goes to `report(trainer, metrics, tracker)` at once except the
    last one's, which is held, with a checkpoint of the final model (for `k3lab export`), until
    `send`: after run_trial has sent the final metrics and closed the run, since a scheduler may
    end the process at that report (ASHA stops every survivor at max_t)."""

    def __init__(self, spec: TrialSpec, report, keep_checkpoint: bool = True):
        self.spec, self.report, self.keep_checkpoint = spec, report, keep_checkpoint
        self.metrics: dict = {}
        self.directory: str | None = None

    def on_eval(self, trainer, metrics: dict, tracker) -> None:
        if trainer.step < self.spec.train.steps:
            self.report(trainer, metrics, tracker)
            return
        self.metrics = report_metrics(self.spec, trainer, metrics, tracker)
        if self.keep_checkpoint:
            self.directory = tempfile.mkdtemp(prefix="k3lab-final-")
            save_with_run_id(trainer, self.directory, tracker)

    def send(self, report_to_ray, checkpoint_type, result, run_id: str | None, extra: dict | None = None) -> None:
        # no last evaluation: restored from the final checkpoint, nothing left to train; its
        # run already holds the final metrics, and Ray gets a report that ends the trial
        metrics = self.metrics or diverged_report(self.spec, result, run_id)
        checkpoint = checkpoint_type.from_directory(self.directory) if self.directory else None
        try:
            report_to_ray(metrics | (extra or {}), checkpoint=checkpoint)
        finally:
            if self.directory:
                shutil.rmtree(self.directory, ignore_errors=True)


def report_with_checkpoint(report, checkpoint_type, trainer, metrics: dict, tracker) -> None:
    """Save the trainer (with the MLflow run id), send the tracker's metrics, then report to Ray
    with the checkpoint.

    The metrics go first: when a scheduler stops the trial at this report, Ray ends the trial's
    process without waiting for its training thread, so nothing after the report is sure to
    run. A crash between the two makes Ray restore the previous checkpoint; the restored trial
    then skips the steps its run already has (`MLflowTracker.skip_steps_already_logged`)."""
    with tempfile.TemporaryDirectory() as directory:
        save_with_run_id(trainer, directory, tracker)
        if tracker is not None:
            tracker.flush()
        report(metrics, checkpoint=checkpoint_type.from_directory(directory))


def tune_trainable(param: dict, trials: dict[str, TrialSpec]) -> None:
    """The function Ray Tune runs for one trial (param = {"trial": key into `trials`})."""
    started_at = time.time()
    from ray import tune

    spec = trials[param["trial"]]
    limit_threads()
    forget_earlier_trial()
    restored = tune.get_checkpoint()
    state = load_ray_checkpoint(restored)

    def report_to_tune(result, checkpoint):  # a test crash after the metrics are sent: the hardest place
        inject_failure(result["done_steps"], restored=restored is not None)
        tune.report(result, checkpoint=checkpoint)

    def report(trainer, metrics, tracker):
        report_with_checkpoint(report_to_tune, tune.Checkpoint, trainer,
                               report_metrics(spec, trainer, metrics, tracker), tracker)

    last = LastReportHeld(spec, report)
    result, run_id = run_trial(spec, checkpoint=state, on_eval=last.on_eval, flush_with_checkpoints=True,
                               started_at=started_at)
    if result.status != FINISHED:  # diverged: a retry would diverge again, so report and stop
        tune.report(diverged_report(spec, result, run_id))
        return
    last.send(report_to_tune, tune.Checkpoint, result, run_id)  # the run is closed: Ray may end us here


def diverged_report(spec: TrialSpec, result, run_id: str | None) -> dict:
    """The last report of a diverged trial. Tune requires the sweep's metric in every result,
    so it carries the worst value: schedulers rank the trial last instead of failing the sweep."""
    worst = float("inf") if spec.mode == "min" else float("-inf")
    return {spec.metric: worst, "tokens": result.tokens, "trial_status": result.status, "error": result.error,
            RUN_ID_KEY: run_id or "", "variant": spec.variant_name, "seed": spec.seed, "done_steps": result.step,
            "total_steps": spec.train.steps}
