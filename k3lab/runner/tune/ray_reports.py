"""The one path from a trial's evaluations to Ray: `TrialReporter`, the same for Tune and DDP trials.

    reporter = TrialReporter(spec, tune.report, tune.Checkpoint, restored=...)
    result, run_id = run_trial(spec, ..., reporter=reporter)   # the loop calls reporter.on_eval
    reporter.finish(result, run_id)                            # the held last report

At each evaluation `on_eval` saves the trainer (with the MLflow run id) and sends the tracker's
metrics, then reports to Ray with that checkpoint: evaluation -> `on_eval` -> `send` -> report.
With `train.checkpoint_every: N` only every Nth evaluation does so; the others report without a
checkpoint and leave their metrics in the tracker, so a crash never leaves steps in MLflow that
the checkpoint it restarts from has not trained.

The metrics go first: when a scheduler stops the trial at a report, Ray ends the trial's process
without waiting for its training thread, so nothing after the report is sure to run. A crash
between the two makes Ray restore the previous checkpoint; the restored trial then skips the
steps its run already has (`MLflowTracker.skip_steps_already_logged`).

The last evaluation's report is held, with a checkpoint of the final model (for `k3lab export`),
until `finish`: after run_trial has sent the final metrics and closed the run, since a scheduler
may end the process at that report (ASHA stops every survivor at max_t).
"""

from __future__ import annotations

import shutil
import tempfile

from k3lab.store.runs import RUN_ID_KEY
from k3lab.runner.train.trainer import FINISHED, save_trainer


class TrialReporter:
    """Reports of one trial (or one DDP rank) to Ray: `report(metrics, checkpoint=)` is
    `ray.tune.report` or `ray.train.report`, `checkpoint_type` the matching Checkpoint class.

    checkpoints: this process saves checkpoints (not the other ranks of a DDP trial);
    extra: added to every report but a diverged trial's (a DDP trial's world_size);
    tracker: the trial's MLflow run, set by run_trial once it is open (None: not tracked);
    meter: measures the trial's GPU memory after each evaluation (`k3lab.runner.runtime.gpu_gate.MemoryMeter`)."""

    def __init__(self, spec, report, checkpoint_type, restored: bool, checkpoints: bool = True,
                 extra: dict | None = None, meter=None):
        self.spec, self.report, self.checkpoint_type = spec, report, checkpoint_type
        self.restored, self.checkpoints, self.extra = restored, checkpoints, extra or {}
        self.meter = meter
        self.last: dict = {}  # the last report sent
        self.tracker = None
        self.held: dict = {}  # the last evaluation's report, sent by `finish`
        self.held_directory: str | None = None

    def on_eval(self, trainer, metrics: dict) -> None:
        """After each evaluation (`on_eval` of the training loop)."""
        if self.meter is not None:
            self.meter.after_eval(trainer.device)
        metrics = report_metrics(self.spec, trainer, metrics, self.tracker) | self.extra
        if trainer.step >= self.spec.train.steps:  # the last: held until the run is closed
            self.held = metrics
            if self.checkpoints:
                self.held_directory = tempfile.mkdtemp(prefix="k3lab-final-")
                save_with_run_id(trainer, self.held_directory, self.tracker)
            return
        if not (self.checkpoints and self.spec.train.checkpoint_at(trainer.step)):
            self.send(metrics, None)  # its metrics wait in the tracker for the next checkpoint
            return
        with tempfile.TemporaryDirectory() as directory:
            save_with_run_id(trainer, directory, self.tracker)
            if self.tracker is not None:
                self.tracker.flush()
            self.send(metrics, self.checkpoint_type.from_directory(directory))

    def send(self, metrics: dict, checkpoint) -> None:
        self.report(metrics, checkpoint=checkpoint)
        self.last = metrics

    def report_out_of_memory(self, error: str) -> None:
        """Before an out-of-memory error reaches Tune: a report that says so (`OUT_OF_MEMORY`), with
        the last evaluation's figures (Tune wants the sweep's metric in every report), so that the
        driver can let the trial restart without counting a crash (`k3lab.runner.tune.status`)."""
        metrics = self.last or diverged_report(self.spec, _NoResult, self.tracker.run_id if self.tracker else None)
        self.report(metrics | {OUT_OF_MEMORY: error[:300], "trial_status": "running"}, checkpoint=None)

    def finish(self, result, run_id: str | None) -> None:
        """After run_trial: the held report (the run is closed: Ray may end us here). A diverged
        trial reports its worst value instead (a retry would diverge again) and stops. With no
        last evaluation (restored from the final checkpoint, nothing left to train) its run
        already holds the final metrics, and Ray gets a report that ends the trial."""
        if result.status != FINISHED:
            self.report(diverged_report(self.spec, result, run_id), checkpoint=None)
            return
        metrics = (self.held or self.figures_from_run(result, run_id)
                   or diverged_report(self.spec, result, run_id) | self.extra)
        checkpoint = self.checkpoint_type.from_directory(self.held_directory) if self.held_directory else None
        try:
            self.send(metrics, checkpoint)
        finally:
            if self.held_directory:
                shutil.rmtree(self.held_directory, ignore_errors=True)


    def figures_from_run(self, result, run_id: str | None) -> dict | None:
        """The report of a finished trial restored from its final checkpoint (it trained and evaluated
        nothing now): its last evaluation's figures, from its MLflow run, so Tune's record and the live
        table show the real ones. None when the run does not have the sweep's metric."""
        if self.tracker is None or not run_id:
            return None
        try:
            metrics = self.tracker.client.get_run(run_id).data.metrics
        except Exception:  # Tune still gets a report that ends the trial (the worst value)
            return None
        if self.spec.metric not in metrics:
            return None
        figures = {k: metrics[k] for k in EVAL_REPORT if k in metrics}
        return figures | {RUN_ID_KEY: run_id, "variant": self.spec.variant_name, "trial_status": "finished",
                          "seed": self.spec.seed, "done_steps": result.step, "step": result.step,
                          "total_steps": self.spec.train.steps} | self.extra


OUT_OF_MEMORY = "out_of_memory"  # in a report: the trial ran out of GPU memory and is about to fail


class _NoResult:
    """The figures of a trial with no evaluation yet, for `diverged_report`."""

    tokens, status, error, step = 0, "running", None, 0


EVAL_REPORT = ("val_loss", "val_bpb", "train_loss", "tokens", "tokens_per_s")  # an evaluation's figures


def report_metrics(spec, trainer, metrics: dict, tracker) -> dict:
    """What a trial reports to Ray at an evaluation: the metrics plus what the driver needs."""
    return metrics | {RUN_ID_KEY: tracker.run_id if tracker else "", "variant": spec.variant_name,
                      "trial_status": "finished" if trainer.step >= spec.train.steps else "running",
                      "seed": spec.seed, "done_steps": trainer.step, "total_steps": spec.train.steps}


def diverged_report(spec, result, run_id: str | None) -> dict:
    """The last report of a diverged trial. Tune requires the sweep's metric in every result,
    so it carries the worst value: schedulers rank the trial last instead of failing the sweep."""
    worst = float("inf") if spec.mode == "min" else float("-inf")
    return {spec.metric: worst, "tokens": result.tokens, "trial_status": result.status, "error": result.error,
            RUN_ID_KEY: run_id or "", "variant": spec.variant_name, "seed": spec.seed, "done_steps": result.step,
            "total_steps": spec.train.steps}


def save_with_run_id(trainer, directory, tracker) -> None:
    """A trainer checkpoint that names its MLflow run, so a restored trial continues that run."""
    save_trainer(trainer, directory, extra={RUN_ID_KEY: tracker.run_id if tracker else None})
