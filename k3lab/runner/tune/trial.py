"""One trial = one variant and seed: its MLflow run, and the function Ray Tune runs.

The trial's MLflow run id travels inside its checkpoints, so a trial restored by
`Tuner.restore` reopens the same run and logs the steps after the checkpoint
into it: exactly one MLflow run per trial, no repeated steps.
"""

from __future__ import annotations

import functools
import gc
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import attrs

from k3lab.data.dataset import MANIFEST, Dataset
from k3lab.model.config import KimiK3Config
from k3lab.registry.fields import is_field
from k3lab.registry.model_variants import inactive_fields
from k3lab.runner.runtime.gpu_gate import MemoryGate, MemoryMeter, TrialMemory, gate_folder, is_out_of_memory
from k3lab.runner.runtime.memory import Packing, variant_keys
from k3lab.runner.runtime.slots import TrainingSlot, slot_folder
from k3lab.store import runs
from k3lab.store.colours import variant_colours
from k3lab.store.inputs import log_corpus
from k3lab.store.labels import run_labels, short_labels, trial_run_name
from k3lab.store.runs import RUN_ID_KEY, execution_tags, node_tags  # noqa: F401  (RUN_ID_KEY: for callers)
from k3lab.store.tracking import BUILD_PARTS, MLflowTracker, flatten
from k3lab.runner.train.checkpoint import CHECKPOINT_FILE, load_checkpoint
from k3lab.runner.train.diagnostics import device_name
from k3lab.registry.train_spec import TrainSpec
from k3lab.runner.train.loop import fit
from k3lab.runner.train.trainer import FINISHED, TrainResult, Trainer
from k3lab.runner.tune.ray_reports import TrialReporter
from k3lab.runner.tune.system import with_system_metrics


@dataclass(frozen=True)
class TrialSpec:
    """Everything a trial needs, picklable for Ray: which variant, which seed, where to log."""

    variant_id: str
    variant_name: str
    seed: int
    config: KimiK3Config
    train: TrainSpec
    tracking_uri: str | None
    experiment: str
    parent_run_id: str | None = None
    overrides: dict | None = None  # the swept axis values of this variant, as the sweep file gives them: {"attn_res_block_size": 4}
    metric: str = "val_loss"  # the sweep's metric and mode: a diverged trial reports its worst value
    mode: str = "min"
    colour: str | None = None  # the variant's, in k3lab's plots and the MLflow UI (k3lab.store.colours)
    training_slots: int | None = None  # at most this many trials on one GPU train at once (k3lab.runner.runtime.slots)
    dataset_dir: str | None = None  # the corpus the sweep's driver prepared (k3lab.data.Dataset's folder)
    memory: TrialMemory | None = None  # a one-GPU trial's part of the GPU memory packing (k3lab.runner.runtime.memory)
    label: str | None = None  # the variant's run label among its siblings (k3lab.store.labels)
    group: str | None = None  # and its group label

    @property
    def name(self) -> str:
        return f"{self.variant_name}-s{self.seed}"

    @property
    def run_name(self) -> str:
        """Its MLflow run's name: `<label>-s<seed>`, what the runs list shows of it in full."""
        return trial_run_name(self.label or self.variant_name, self.seed)


def run_order(trials) -> list:
    """The order a grid's trials start in: seed by seed (every variant's first seed, then every
    variant's second, ...), so that a sweep stopped early (--stop-after, a budget, a preempted
    node) leaves whole seeds, i.e. pairs for every comparison, where variant by variant it would
    leave all of some variants' seeds and none of the others'."""
    return sorted(trials, key=lambda trial: trial.variant.seeds.index(trial.seed))  # stable: variants keep their order


def trial_specs(run, parent_run_id: str, dataset_dir: str | None = None,
                packing: Packing | None = None) -> dict[str, TrialSpec]:
    """One TrialSpec per trial of `run` (a `k3lab.runner.tune.run.SweepRun`), in `run_order`;
    dataset_dir: the corpus the driver prepared, for every trial; packing: the trials at once on
    one GPU of this host's model (None: the sweep file's ceiling, each trial's GPU gives the budget)."""
    colours = variant_colours([v.name for v in run.sweep.valid_variants])
    labels = run_labels([v.name for v in run.sweep.valid_variants])
    groups = short_labels([v.name for v in run.sweep.valid_variants])
    memory = memory_plans(run, packing, owner=f"{parent_run_id}:{os.getpid()}")  # each part packs anew
    return {
        trial.id: TrialSpec(variant_id=trial.variant.id, variant_name=trial.variant.name, seed=trial.seed,
                            config=trial.variant.config, train=run.sweep.train_of(trial.variant),
                            tracking_uri=run.tracking_uri, experiment=run.experiment, parent_run_id=parent_run_id,
                            overrides=dict(trial.variant.overrides),
                            metric=run.sweep.metric.name, mode=run.sweep.metric.mode,
                            colour=colours[trial.variant.name], training_slots=run.sweep.resources.training_slots,
                            dataset_dir=dataset_dir, memory=memory.get(trial.variant.name),
                            label=labels[trial.variant.name], group=groups[trial.variant.name])
        for trial in run_order(run.sweep.trials)
    }


def memory_plans(run, packing: Packing | None, owner: str) -> dict[str, TrialMemory]:
    """Each variant's part of the packing, for one-GPU trials of a GPU sweep (none on CPU and for DDP)."""
    from k3lab.runner.runtime.memory import known_peaks, trials_ceiling

    if not (run.uses_gpus or packing is not None) or run.sweep.resources.strategy is not None:
        return {}
    record = known_peaks(run.kernel_cache)
    trials = packing.trials if packing is not None else trials_ceiling(run.sweep.resources)
    plans = {}
    for name, key in variant_keys(run.sweep).items():
        entry = record.get(key, {}).get(packing.gpu.name) if packing is not None else None
        plans[name] = TrialMemory(key=key, variant=name, trials=trials, owner=owner,
                                  expected_bytes=int(entry["peak_bytes"]) if entry else None,
                                  budget_bytes=packing.gpu.budget_bytes if packing is not None else 0,
                                  cache=str(run.kernel_cache))
    return plans


def trial_params(spec: TrialSpec, counts: dict) -> dict:
    """MLflow params of a trial run: the flattened model config, train spec and counts, and the
    swept values that no `model.*` param holds (`value_params`)."""
    params = runs.model_params(spec.config.to_dict(), inactive_fields(spec.config))
    params |= flatten("train", attrs.asdict(spec.train))
    params |= {f"params.{k}": v for k, v in counts.items() if k != "by_component"}
    params |= {f"params.component.{k}": v for k, v in counts["by_component"].items()}
    swept = spec.overrides or {}
    params |= {key: swept[axis] for axis, key in value_params(swept).items() if key not in params}
    return params | {"seed": spec.seed, "variant_id": spec.variant_id, "variant_name": spec.variant_name}


def value_params(axes) -> dict[str, str]:
    """The param each swept axis's value is logged as, one param per value: a config field's
    `model.<name>`, else (an axis of its own: layer_schedule, ffn, fidelity) `axis.<name>`."""
    return {axis: f"model.{axis}" if is_field(axis) else f"axis.{axis}" for axis in axes}


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
    tags = runs.trial_tags(spec.variant_id, spec.variant_name, spec.seed, spec.colour, list(spec.overrides or ()),
                           spec.label, spec.group)
    tags |= node_tags() | execution_tags(execution)
    tracker = MLflowTracker.start(spec.tracking_uri, spec.experiment, spec.run_name, tags=tags,
                                  parent_run_id=spec.parent_run_id, flush_every=flush_every)
    tracker.log_params(trial_params(spec, counts) | {f"run.{k}": v for k, v in (execution or {}).items()})
    tracker.log_metrics({"params_total": counts["total"], "params_active": counts["active"],
                         "params_embedding": counts["embedding"],
                         "flops_per_token": counts["flops_per_token"]}, step=0)
    tracker.flush()  # constants of the run: sent now, whatever happens to the trial later
    return tracker


def existing_trial_run(spec: TrialSpec) -> str | None:
    """This trial's run under the sweep's parent run, if an earlier attempt created one."""
    if spec.parent_run_id is None:
        return None
    return runs.find_trial_run(spec.tracking_uri, spec.parent_run_id, spec.variant_id, spec.seed)


def run_trial(spec: TrialSpec, checkpoint=None, reporter=None, device=None, progress=None,
              flush_with_checkpoints: bool = False, started_at: float | None = None,
              rank: int = 0, world_size: int = 1, trainer: Trainer | None = None,
              keep: Callable[[Trainer], None] | None = None) -> tuple[TrainResult, str | None]:
    """Train one trial with MLflow tracking (when a tracking URI is set); returns (result, run_id).

    trainer: an earlier trial's Trainer of the same variant and train spec, restarted with this
    trial's seed instead of building one; keep(trainer) is called once the trial has ended
    without an exception, finished or diverged (`KeptTrainer`: the next trial of the process
    may be the variant's next seed).

    reporter: its `on_eval(trainer, metrics)` runs after every evaluation, with `reporter.tracker`
    set to the trial's run (see `k3lab.runner.tune.ray_reports`).
    flush_with_checkpoints: metrics reach MLflow only when the reporter has saved a checkpoint
    and flushed them, and a crash drops the unsent ones. A trial restored from its last
    checkpoint then logs the steps its run does not have yet: no step is logged twice.
    """
    state = load_checkpoint(checkpoint) if isinstance(checkpoint, (str, Path)) else checkpoint
    trainer_started = time.time()
    if trainer is None:
        dataset = prepared_by_driver(spec.dataset_dir)
        opened_s = time.time() - trainer_started
        trainer = Trainer(spec.config, spec.train, seed=spec.seed, device=device, rank=rank,
                          world_size=world_size, dataset=dataset)
        data_s = opened_s + trainer.data_s
    else:  # an earlier trial's, restarted for this one (`KeptTrainer`): its corpus is open already
        data_s = 0.0
        trainer.restart(spec.seed)
    tracker, trainer_s = None, time.time() - trainer_started
    if spec.tracking_uri:
        run_id = (state or {}).get("extra", {}).get(RUN_ID_KEY)
        tracker = open_trial_run(spec, trainer.counts, run_id, None if flush_with_checkpoints else 50,
                                 execution=trainer.execution())
        tracker.set_tags({runs.DEVICE: device_name(trainer.device)})
        tracker.log_params(data_params(trainer))
        log_corpus(tracker.client, tracker.run_id, trainer.dataset.path, trainer.dataset.manifest)
        tracker = with_system_metrics(tracker, trainer.device)
        if started_at is not None:  # the part of startup_s before the first step, and its parts, at the
            tracker.log_metrics(build_parts(started_at, trainer_started, trainer_s, data_s),  # step it starts from
                                state["step"] if state else trainer.step)
    if reporter is not None:
        reporter.tracker = tracker
    slot = TrainingSlot(spec.training_slots, slot_folder(trainer.device)) \
        if spec.training_slots and world_size == 1 else None
    train_start = time.perf_counter()
    try:
        result = fit(trainer, tracker=tracker, checkpoint=state, on_eval=reporter and reporter.on_eval,
                     progress=progress, started_at=started_at, wait_to_train=slot and slot.acquire)
    except SystemExit:  # Tune stopped the trial after taking a report (an ASHA cut, or SIGTERM):
        if tracker is not None:  # metrics went before the report; closing is best effort (Ray may end us first)
            tracker.set_tags(runs.stopped_tags(trainer.step))
            tracker.finish("KILLED")
        raise
    except BaseException as error:
        if tracker is not None:
            if flush_with_checkpoints:
                tracker.discard_pending()
            tracker.set_tags(runs.error_tags(f"{type(error).__name__}: {error}"))
            tracker.finish("FAILED" if not isinstance(error, KeyboardInterrupt) else "KILLED")
        raise
    finally:
        if slot is not None:
            slot.release()
    if tracker is not None:
        train_wall = time.perf_counter() - train_start - result.slot_wait_s  # the loop's time, waiting excluded
        tracker.log_metrics({"final_val_loss": result.val_loss or float("nan"),
                             "final_val_bpb": result.val_bpb or float("nan"), "train_wall_s": train_wall,
                             "avg_tokens_per_s": result.average_tokens_per_s or float("nan"),
                             # time inside the tracker (buffering and sending metrics) over the loop's time
                             "tracking_overhead": tracker.seconds_in_tracking / train_wall}, step=result.step)
        tracker.set_tags(execution_tags({"cuda_graph": trainer.cuda_graph}))  # a failed capture turns it off
        if result.status != FINISHED:
            tracker.set_tags({runs.ERROR: result.error or result.status})
        tracker.finish("FINISHED" if result.status == FINISHED else "FAILED")
    if keep is not None:
        keep(trainer)
    return result, tracker.run_id if tracker else None


def data_params(trainer) -> dict:
    """data.epochs: the passes over its corpus' training split the whole trial makes (above 1: it
    sees tokens again); data.train_tokens: that split's size."""
    train_tokens = len(trainer.dataset.train_tokens)
    tokens = trainer.tokens_per_step * trainer.spec.steps
    return {"data.epochs": float(f"{tokens / train_tokens:.4g}") if train_tokens else "inf",
            "data.train_tokens": train_tokens}


def limit_threads() -> None:
    """One trial's torch threads = the CPUs Ray gave it (K3LAB_TRIAL_CPUS), not the whole node."""
    import torch

    cpus = int(os.environ.get("K3LAB_TRIAL_CPUS", "0"))
    if cpus:
        torch.set_num_threads(cpus)


class KeptTrainer:
    """The Trainer of the last trial this process ran, for its next trial when that is the
    same variant (`resources.reuse_actors`: Ray hands a finished trial's process to the next
    trial, and the seeds policy hands it the variant's next seed where it can,
    `k3lab.runner.tune.seeds`). Restarted with the new seed (`Trainer.restart`), it skips the model
    build, torch.compile and the CUDA-graph capture, most of a GPU trial's start-up (docs/benchmarks.md,
    "Sweep sizing")."""

    def __init__(self):
        self.key: tuple | None = None
        self.trainer: Trainer | None = None

    @staticmethod
    def key_of(spec: TrialSpec) -> tuple:
        """What a kept trainer must share with a trial to serve it: the model, the train spec
        (shapes, optimiser, schedule) and the corpus; only the seed may differ."""
        return spec.config, spec.train, spec.dataset_dir

    def take(self, spec: TrialSpec) -> Trainer | None:
        """The kept trainer when `spec` is a trial it can serve, else None; either way this
        process keeps nothing more (a trainer of another variant is let go, its memory freed
        by `forget_earlier_trial`)."""
        trainer, key = self.trainer, self.key
        self.trainer = self.key = None
        return trainer if trainer is not None and key == self.key_of(spec) else None

    def drop(self) -> None:
        self.trainer = self.key = None

    def keep(self, spec: TrialSpec, trainer: Trainer) -> None:
        self.key, self.trainer = self.key_of(spec), trainer


_kept = KeptTrainer()  # this process's: one per Ray actor
_ran_a_trial = False  # this process ran a trial before (Ray reused it: `resources.reuse_actors`)


def forget_earlier_trial(restarting: bool = False) -> None:
    """In a process an earlier trial used (`resources.reuse_actors`): restart the peak memory this
    trial reports (its compile-cache hits are counted from its own start, in `fit`) and, unless the
    earlier trial's trainer is `restarting` for this one, drop torch.compile's code caches, which would otherwise keep
    guarding on that trial's model and count towards the recompile limit.
    A fresh process has nothing to forget and skips the work (gc alone is not free)."""
    global _ran_a_trial
    earlier, _ran_a_trial = _ran_a_trial, True
    torch = sys.modules.get("torch")
    if not earlier or torch is None:
        return
    if not restarting:
        gc.collect()  # the earlier trial's model and CUDA graphs, if a reference cycle still held them
        if "torch._dynamo" in sys.modules:
            torch._dynamo.reset()
        if torch.cuda.is_initialized():  # its cached blocks go back to the GPU: the packing counts this
            torch.cuda.synchronize()  # trial's own peak, not the earlier trial's reservation
            torch.cuda.empty_cache()
    if torch.cuda.is_initialized():
        torch.cuda.reset_peak_memory_stats()


def load_ray_checkpoint(checkpoint) -> dict | None:
    """The trainer state inside a Ray (Tune or Train) checkpoint, or None (also for an empty
    checkpoint folder: one that --resume put in place of a lost one, `start_lost_trials_again`)."""
    if checkpoint is None:
        return None
    with checkpoint.as_directory() as directory:
        if not (Path(directory) / CHECKPOINT_FILE).exists():
            return None
        return load_checkpoint(directory)


def prepared_by_driver(folder: str | None) -> Dataset | None:
    """The corpus the sweep's driver prepared, opened as it is: every trial trains on the
    driver's data, and none spends its start-up finding the corpus again (for `packages`: the
    fingerprint of every installed file). None where this machine cannot see the folder (a
    cluster worker without the shared data volume): the trial then prepares its own."""
    if folder is None or not (Path(folder) / MANIFEST).is_file():
        return None
    return Dataset.open(folder)


def build_parts(started_at: float, trainer_started: float, trainer_s: float, data_s: float) -> dict[str, float]:
    """startup_build_s (from the trial function's start to its run's parameters logged) and its
    parts: the corpus opened, the rest of the Trainer (model on the device, optimizers, samplers),
    and MLflow (the run opened, tags and parameters logged); the rest is Ray's and the checkpoint's."""
    now = time.time()
    parts = (data_s, trainer_s - data_s, now - trainer_started - trainer_s)
    return {"startup_build_s": now - started_at, **dict(zip(BUILD_PARTS, parts))}


def tune_trainable(param: dict, trials: dict[str, TrialSpec]) -> None:
    """The function Ray Tune runs for one trial (param = {"trial": key into `trials`})."""
    started_at = time.time()
    from ray import tune

    spec = trials[param["trial"]]
    limit_threads()
    trainer = _kept.take(spec)
    forget_earlier_trial(restarting=trainer is not None)
    gate = enter_gate(spec)
    restored = tune.get_checkpoint()
    meter = MemoryMeter(spec.memory, gate, spec.name) if gate is not None else None
    reporter = TrialReporter(spec, tune.report, tune.Checkpoint, restored=restored is not None, meter=meter)
    try:
        result, run_id = run_trial(spec, checkpoint=load_ray_checkpoint(restored), reporter=reporter,
                                   flush_with_checkpoints=True, started_at=started_at, trainer=trainer,
                                   keep=functools.partial(_kept.keep, spec))
    except Exception as error:
        if gate is not None and is_out_of_memory(error):
            out_of_memory(gate, reporter, error)
        raise
    reporter.finish(result, run_id)


_gate: MemoryGate | None = None  # this process's place on its GPU, held from its first trial to its end


def enter_gate(spec: TrialSpec) -> MemoryGate | None:
    """Wait, before this process touches CUDA, until its GPU has the memory for this trial
    (`k3lab.runner.runtime.gpu_gate.MemoryGate`); None for trials outside the packing (CPU, DDP)."""
    global _gate
    if spec.memory is None:
        return None
    if _gate is None:
        _gate = MemoryGate(gate_folder(), spec.memory.limits())
    _gate.acquire(spec.memory.expected_bytes, spec.name)
    return _gate


def out_of_memory(gate: MemoryGate, reporter: TrialReporter, error: BaseException) -> None:
    """A CUDA out-of-memory error: one trial fewer at once on this GPU for the rest of the sweep,
    and the driver told before the error reaches Tune (`k3lab.runner.tune.status`), so that the restart
    it makes from the last checkpoint, in a fresh process, is not counted as a crash. A trial that
    was alone on its GPU does not fit at all: its error is a crash like any other."""
    global _gate
    if gate.lower_after_oom() >= 1:
        reporter.report_out_of_memory(str(error))
    _kept.drop()
    gate.release()
    _gate = None
