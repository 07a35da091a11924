"""One trial = one variant and seed: its run (open the MLflow run, fit, close it), and the
function Ray Tune runs. The MLflow run is `k3lab.store.trial_run`'s, the GPU's memory gate
`k3lab.runner.runtime.gpu_gate`'s.
"""

from __future__ import annotations

import functools
import gc
import os
import sys
import time
from pathlib import Path
from typing import Callable

import attrs

from k3lab.data.dataset import MANIFEST, Dataset
from k3lab.model.config import KimiK3Config
from k3lab.registry.fields import is_field
from k3lab.registry.model_variants import inactive_fields
from k3lab.runner.runtime.gpu_gate import (MemoryGate, MemoryMeter, TrialMemory, enter_gate, is_out_of_memory,
                                           leave_gate)
from k3lab.runner.runtime.memory import Packing, variant_keys
from k3lab.runner.runtime.slots import TrainingSlot, slot_folder
from k3lab.store import runs
from k3lab.store.colours import variant_colours
from k3lab.store.labels import run_labels, short_labels
from k3lab.store.runs import RUN_ID_KEY
from k3lab.store.tracking import BUILD_PARTS, MLflowTracker, flatten
from k3lab.store.trial_run import TrialRunKey, close_trial_run, closed_on_error, log_trial_inputs, open_trial_run
from k3lab.runner.train.checkpoint import CHECKPOINT_FILE, load_checkpoint
from k3lab.runner.train.diagnostics import device_name
from k3lab.registry.train_spec import TrainSpec
from k3lab.runner.train.loop import fit
from k3lab.runner.train.trainer import FINISHED, TrainResult, Trainer
from k3lab.runner.tune.ray_reports import TrialReporter
from k3lab.runner.tune.system import with_system_metrics


@attrs.frozen
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
    params: dict = attrs.Factory(dict)  # its MLflow params but the parameter counts (`variant_params`)
    axes: tuple[str, ...] = ()  # the axes its variant sets (the run's `k3lab.axes` tag)
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
    def run_key(self) -> TrialRunKey:
        """Which trial its MLflow run is (`k3lab.store.trial_run`)."""
        return TrialRunKey(self.tracking_uri, self.experiment, self.parent_run_id, self.variant_id,
                           self.variant_name, self.seed, self.colour, self.axes, self.label, self.group)


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
                            params=variant_params(trial.variant, run.sweep.train_of(trial.variant), trial.seed),
                            axes=tuple(trial.variant.overrides),
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


def variant_params(variant, train: TrainSpec, seed: int) -> dict:
    """The MLflow params of a trial of `variant` (a `k3lab.registry.Variant`) but its parameter
    counts, resolved once as the driver makes the trial: the flattened model config (the fields of
    a switched-off feature read off), the train spec, the swept values that no `model.*` param
    holds (`value_params`), the seed and the variant."""
    config, swept = variant.config, variant.overrides
    params = runs.model_params(config.to_dict(), inactive_fields(config))
    params |= flatten("train", attrs.asdict(train))
    params |= {key: swept[axis] for axis, key in value_params(swept).items() if key not in params}
    return params | {"seed": seed, "variant_id": variant.id, "variant_name": variant.name}


def trial_params(spec: TrialSpec, counts: dict) -> dict:
    """MLflow params of a trial run: its variant's (`TrialSpec.params`) and its parameter counts."""
    counted = {f"params.{k}": v for k, v in counts.items() if k != "by_component"}
    return spec.params | counted | {f"params.component.{k}": v for k, v in counts["by_component"].items()}


def value_params(axes) -> dict[str, str]:
    """The param each swept axis's value is logged as, one param per value: a config field's
    `model.<name>`, else (an axis of its own: layer_schedule, ffn, fidelity) `axis.<name>`."""
    return {axis: f"model.{axis}" if is_field(axis) else f"axis.{axis}" for axis in axes}


def run_trial(spec: TrialSpec, checkpoint=None, reporter=None, device=None, progress=None,
              flush_with_checkpoints: bool = False, started_at: float | None = None,
              rank: int = 0, world_size: int = 1, trainer: Trainer | None = None,
              keep: Callable[[Trainer], None] | None = None) -> tuple[TrainResult, str | None]:
    """Train one trial with MLflow tracking (when a tracking URI is set); returns (result, run_id):
    the trial's run opened, the trainer fitted, the run closed as the trial ended.

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
    trainer, startup = ready_trainer(spec, trainer, device, rank, world_size)
    tracker = open_run(spec, trainer, state, flush_with_checkpoints, started_at, startup)
    if reporter is not None:
        reporter.tracker = tracker
    train_start = time.perf_counter()
    with closed_on_error(tracker, discard_pending=flush_with_checkpoints, step=lambda: trainer.step):
        result = fit_in_slot(spec, trainer, tracker, state, reporter, progress, started_at, world_size)
    if tracker is not None:
        train_wall = time.perf_counter() - train_start - result.slot_wait_s  # the loop's time, waiting excluded
        close_trial_run(tracker, final_metrics(result), result.step, train_wall,
                        None if result.status == FINISHED else result.error or result.status,
                        {"cuda_graph": trainer.cuda_graph})
    if keep is not None:
        keep(trainer)
    return result, tracker.run_id if tracker else None


def ready_trainer(spec: TrialSpec, trainer: Trainer | None, device, rank: int,
                  world_size: int) -> tuple[Trainer, tuple[float, float, float]]:
    """The trial's Trainer: an earlier trial's restarted with this seed (`KeptTrainer`: its corpus
    is open already), else one built on the driver's corpus; with its start-up's times for
    `build_parts` (when it began, how long the Trainer took, how much of that the corpus)."""
    trainer_started = time.time()
    if trainer is not None:
        trainer.restart(spec.seed)
        return trainer, (trainer_started, time.time() - trainer_started, 0.0)
    dataset = prepared_by_driver(spec.dataset_dir)
    opened_s = time.time() - trainer_started
    trainer = Trainer(spec.config, spec.train, seed=spec.seed, device=device, rank=rank,
                      world_size=world_size, dataset=dataset)
    return trainer, (trainer_started, time.time() - trainer_started, opened_s + trainer.data_s)


def open_run(spec: TrialSpec, trainer: Trainer, state: dict | None, flush_with_checkpoints: bool,
             started_at: float | None, startup: tuple[float, float, float]) -> MLflowTracker | None:
    """The trial's MLflow run (the checkpoint's, for a restored trial) with its inputs and its
    start-up's parts logged, measuring the system as it trains; None without a tracking URI."""
    if not spec.tracking_uri:
        return None
    run_id = (state or {}).get("extra", {}).get(RUN_ID_KEY)
    tracker = open_trial_run(spec.run_key, trial_params(spec, trainer.counts), trainer.counts, run_id,
                             None if flush_with_checkpoints else 50, execution=trainer.execution())
    log_trial_inputs(tracker, device_name(trainer.device), data_params(trainer), trainer.dataset)
    tracker = with_system_metrics(tracker, trainer.device)
    if started_at is not None:  # the part of startup_s before the first step, and its parts, at the step it starts from
        tracker.log_metrics(build_parts(started_at, *startup), state["step"] if state else trainer.step)
    return tracker


def fit_in_slot(spec: TrialSpec, trainer: Trainer, tracker, state: dict | None, reporter, progress,
                started_at: float | None, world_size: int) -> TrainResult:
    """`fit`, training only while the trial holds one of its GPU's training slots (`spec.training_slots`
    at once, one-GPU trials); the slot is given back however the loop ends."""
    slot = TrainingSlot(spec.training_slots, slot_folder(trainer.device)) \
        if spec.training_slots and world_size == 1 else None
    try:
        return fit(trainer, tracker=tracker, checkpoint=state, on_eval=reporter and reporter.on_eval,
                   progress=progress, started_at=started_at, wait_to_train=slot and slot.acquire)
    finally:
        if slot is not None:
            slot.release()


def final_metrics(result: TrainResult) -> dict[str, float]:
    """What a trial that ended on its own logs last (NaN where it has no value)."""
    return {"final_val_loss": result.val_loss or float("nan"), "final_val_bpb": result.val_bpb or float("nan"),
            "avg_tokens_per_s": result.average_tokens_per_s or float("nan")}


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
    gate = enter_gate(spec.memory, spec.name)
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


def out_of_memory(gate: MemoryGate, reporter: TrialReporter, error: BaseException) -> None:
    """A CUDA out-of-memory error: one trial fewer at once on this GPU for the rest of the sweep,
    and the driver told before the error reaches Tune (`k3lab.runner.tune.status`), so that the restart
    it makes from the last checkpoint, in a fresh process, is not counted as a crash. A trial that
    was alone on its GPU does not fit at all: its error is a crash like any other."""
    if gate.lower_after_oom() >= 1:
        reporter.report_out_of_memory(str(error))
    _kept.drop()
    leave_gate(gate)
