"""The training loop of one trial: `fit` steps a `Trainer` to its last step, logs each window of
steps and each evaluation to its tracker, and stops at a non-finite loss; `train` builds the
trainer first. No Ray, no MLflow: callbacks report (`on_eval`, `progress`) and a tracker logs."""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Callable

import torch

from k3lab.model.config import KimiK3Config
from k3lab.runner.train.checkpoint import load_checkpoint
from k3lab.runner.train.diagnostics import compile_cache_counts, compile_cache_snapshot, diagnostics, log_diagnostics, peak_flops
from k3lab.registry.train_spec import TrainSpec
from k3lab.runner.train.trainer import DIVERGED, FINISHED, Trainer, TrainResult


class Window:
    """Per-step device values of one logging window, fetched with one host sync."""

    def __init__(self, trainer: Trainer):
        self.trainer = trainer
        self.steps: list[int] = []
        self.values: list[dict] = []
        self.start = time.perf_counter()
        self.elapsed = 0.0  # set by collect
        self.diagnostics: dict = {}  # set by collect: per-layer MoE loads and AttnRes mixtures (metrics.diagnostics)

    def add(self, step: int, values: dict) -> None:
        self.steps.append(step)
        self.values.append(values)

    @property
    def tokens(self) -> int:
        return len(self.steps) * self.trainer.tokens_per_step

    def collect(self) -> tuple[list[tuple[int, dict[str, float]]], dict[str, float]]:
        """Per-step scalar metrics and the window's throughput/architecture metrics."""
        keys = ("train_loss", "grad_norm", "lr")
        stacked = torch.stack([torch.stack([v[k].float().to(self.trainer.device) for k in keys])
                               for v in self.values]).tolist()  # the one sync
        self.elapsed = elapsed = time.perf_counter() - self.start
        per_step = [(s, dict(zip(keys, row))) for s, row in zip(self.steps, stacked)]
        trainer = self.trainer
        tokens_per_s = self.tokens / elapsed
        window = {"tokens_per_s": tokens_per_s, "step_time_ms": 1e3 * elapsed / len(self.steps)}
        peak = peak_flops(trainer.device)
        if peak:
            window["mfu"] = trainer.counts["flops_per_token"] * tokens_per_s / (peak * trainer.world_size)
        if trainer.device.type == "cuda":
            window["peak_memory_gb"] = torch.cuda.max_memory_allocated(trainer.device) / 1e9
        self.diagnostics = diagnostics(trainer.model, [v["loads"] for v in self.values])
        return per_step, window


def train(config: KimiK3Config, train_spec: TrainSpec, tracker=None, checkpoint: str | Path | dict | None = None,
          *, seed: int = 0, device=None, dataset=None, on_eval: Callable | None = None,
          progress: Callable[[int, dict], None] | None = None, rank: int = 0, world_size: int = 1,
          trainer: Trainer | None = None, started_at: float | None = None,
          wait_to_train: Callable[[], float] | None = None) -> TrainResult:
    """Train one variant for train_spec.steps optimizer steps: `fit` of a Trainer built from the
    arguments, or of `trainer` when given (train_spec then sets only the loop's steps and intervals)."""
    trainer = trainer or Trainer(config, train_spec, seed=seed, device=device, dataset=dataset,
                                 rank=rank, world_size=world_size)
    return fit(trainer, tracker, checkpoint, spec=train_spec, on_eval=on_eval, progress=progress,
               started_at=started_at, wait_to_train=wait_to_train)


def fit(trainer: Trainer, tracker=None, checkpoint: str | Path | dict | None = None, *,
        spec: TrainSpec | None = None, on_eval: Callable | None = None,
        progress: Callable[[int, dict], None] | None = None, started_at: float | None = None,
        wait_to_train: Callable[[], float] | None = None) -> TrainResult:
    """Train `trainer` up to spec.steps (spec: the loop's steps, evaluation and logging intervals;
    default the trainer's own).

    checkpoint: a path or state dict from `Trainer.state_dict()` to resume from; the run
    continues at the saved step with the same batches it would have drawn.
    on_eval(trainer, metrics) is called after every evaluation (Ray Tune reports and saves
    checkpoints there); progress(step, metrics) after every logging window.
    started_at (time.time() when the trial process began) adds `startup_s`: the time from
    then until the first optimizer step had finished (imports, data, model, kernels), with
    torch.compile's cache hits and misses since this call began; every evaluation logs them
    too (`compile_*`: evaluation graphs, CUDA-graph captures and recompiles come after the first step).
    wait_to_train() is called once, when the trainer has `warmed_up` (or before its first
    evaluation, if that comes sooner), and returns the seconds it waited (a training slot,
    `k3lab.runner.runtime.slots`): logged as `slot_wait_s`, and not counted as training time.
    """
    if checkpoint is not None:
        trainer.load_state_dict(load_checkpoint(checkpoint) if not isinstance(checkpoint, dict) else checkpoint)
    loop = FitLoop(trainer, spec or trainer.spec, tracker, started_at, wait_to_train)
    while trainer.step < loop.spec.steps:
        values = loop.step()
        at_eval = loop.at_eval()
        loop.wait_for_slot(values, at_eval)
        if loop.window_full(at_eval) and not loop.log_window(at_eval, progress):
            break  # a non-finite training loss
        if not at_eval:
            continue
        evaluation = loop.evaluate()
        if evaluation is None:
            break  # a non-finite validation loss
        loop.checkpoint(evaluation, on_eval)
    if tracker is not None:
        tracker.flush()
    return loop.result


class FitLoop:
    """The state of one `fit`: the result so far, the open logging window, and the one-off
    start-up and slot-wait measurements still to take."""

    def __init__(self, trainer: Trainer, spec: TrainSpec, tracker, started_at: float | None,
                 wait_to_train: Callable[[], float] | None):
        self.trainer, self.spec, self.tracker = trainer, spec, tracker
        self.started_at, self.wait_to_train = started_at, wait_to_train
        self.result = TrainResult(status=FINISHED, step=trainer.step, tokens=trainer.step * trainer.tokens_per_step,
                                  counts=trainer.counts)
        self.window = Window(trainer)
        self.counts_before = compile_cache_snapshot()  # a reused trial process has counts from its earlier trials

    def log(self, metrics: dict, step: int) -> None:
        if self.tracker is not None:
            self.tracker.log_metrics(metrics, step)

    def step(self) -> dict:
        """One optimizer step, added to the window; after the first, the start-up time."""
        values = self.trainer.train_step()
        self.window.add(self.trainer.step, values)
        if self.started_at is not None:
            self.record_startup(values)
        return values

    def record_startup(self, values: dict) -> None:
        """`startup_s`: from the trial process's start until the first step had finished."""
        values["train_loss"].item()  # one sync: the first step has really finished
        self.result.startup_s = time.time() - self.started_at
        if self.tracker is not None:
            self.log({"startup_s": self.result.startup_s} | compile_cache_counts(self.counts_before), self.trainer.step)
        self.started_at = None

    def at_eval(self) -> bool:
        step = self.trainer.step
        return step % self.spec.eval_interval == 0 or step == self.spec.steps

    def wait_for_slot(self, values: dict, at_eval: bool) -> None:
        """Once warmed up (or at the first evaluation of a trial too short to warm up): wait for a
        training slot, logged as `slot_wait_s` and not counted as training time."""
        if self.wait_to_train is None or not (self.trainer.warmed_up or at_eval):
            return
        values["train_loss"].item()  # the step's GPU work ends before the wait starts
        self.result.slot_wait_s = self.wait_to_train()
        self.window.start += self.result.slot_wait_s  # the wait is not training time
        self.log({"slot_wait_s": self.result.slot_wait_s}, self.trainer.step)
        self.wait_to_train = None

    def window_full(self, at_eval: bool) -> bool:
        return len(self.window.steps) >= self.spec.log_interval or at_eval

    def log_window(self, at_eval: bool, progress: Callable[[int, dict], None] | None) -> bool:
        """The window's per-step metrics logged and added to the result; False when a training loss
        in it is not finite (the result then says diverged, at that step)."""
        trainer, result = self.trainer, self.result
        per_step, window_metrics = self.window.collect()
        bad = next((s for s, m in per_step if not math.isfinite(m["train_loss"])), None)
        for step, metrics in per_step:
            self.log(metrics | (window_metrics if step == per_step[-1][0] else {}), step)
        if self.tracker is not None and bad is None:  # a table of the AttnRes mixtures at each evaluation
            log_diagnostics(self.tracker, self.window.diagnostics, trainer.step, table=at_eval)
        result.train_loss = per_step[-1][1]["train_loss"]
        result.trained_tokens += self.window.tokens
        result.train_seconds += self.window.elapsed
        result.tokens_per_s, result.mfu = window_metrics["tokens_per_s"], window_metrics.get("mfu")
        result.step, result.tokens = trainer.step, trainer.step * trainer.tokens_per_step
        if bad is not None:
            result.status, result.step = DIVERGED, bad
            result.error = f"non-finite training loss at step {bad}"
            return False
        if progress is not None:
            progress(trainer.step, per_step[-1][1] | window_metrics)
        self.window = Window(trainer)
        return True

    def evaluate(self) -> dict | None:
        """An evaluation, logged; None when its loss is not finite (the result then says diverged)."""
        trainer, result = self.trainer, self.result
        evaluation = trainer.evaluate()
        result.val_loss, result.val_bpb = evaluation["val_loss"], evaluation["val_bpb"]
        if self.tracker is not None:
            self.log(evaluation | {"tokens": result.tokens} | compile_cache_counts(self.counts_before, "compile"),
                     trainer.step)
        if not math.isfinite(result.val_loss):  # finite training losses can still evaluate to inf or nan
            result.status, result.error = DIVERGED, f"non-finite validation loss at step {trainer.step}"
            return None
        return evaluation

    def checkpoint(self, evaluation: dict, on_eval: Callable | None) -> None:
        """`on_eval` (Ray Tune reports and saves the checkpoint there), then a fresh window."""
        trainer, result = self.trainer, self.result
        if on_eval is not None:
            on_eval(trainer, evaluation | {"train_loss": result.train_loss, "tokens": result.tokens,
                                           "tokens_per_s": result.tokens_per_s, "step": trainer.step})
        self.window = Window(trainer)  # evaluation time is not training throughput
