"""`TrialReporter`: which of a trial's evaluations reach Ray with a checkpoint, and when its metrics reach MLflow."""

from types import SimpleNamespace

import pytest

from k3lab.registry import load_preset
from k3lab.runner.train.checkpoint import load_checkpoint
from k3lab.registry.train_spec import TrainSpec
from k3lab.runner.train.loop import fit
from k3lab.runner.train.trainer import Trainer
from k3lab.runner.tune.ray_reports import TrialReporter
from k3lab.runner.tune.trial import TrialSpec

pytestmark = pytest.mark.usefixtures("isolated_data")


class StepOfCheckpoint:
    """Stands in for Ray's Checkpoint class: the step of the trainer state in the directory."""

    @staticmethod
    def from_directory(directory):
        return load_checkpoint(directory)["step"]


def reported_checkpoints(checkpoint_every: int) -> tuple[list, list]:
    """(done_steps, checkpoint's step or None) of every report of an 8-step trial evaluated every
    2 steps, and the steps at which the reporter sent the tracker's metrics to MLflow."""
    train = TrainSpec(steps=8, batch_size=2, seq_len=32, warmup_steps=1, eval_interval=2, eval_batches=1,
                      checkpoint_every=checkpoint_every)
    spec = TrialSpec("id", "attnres_off", 0, {}, train, None, "mini")
    reports, flushes = [], []
    reporter = TrialReporter(spec, lambda metrics, checkpoint: reports.append((metrics["done_steps"], checkpoint)),
                             StepOfCheckpoint, restored=False)
    trainer = Trainer(load_preset("tiny").replace(num_layers=2, layer_types=("kda", "mla")), train, seed=0)
    reporter.tracker = SimpleNamespace(run_id="run", flush=lambda: flushes.append(trainer.step))
    reporter.finish(fit(trainer, on_eval=reporter.on_eval), "run")
    return reports, flushes


def test_a_trial_checkpoints_at_every_nth_evaluation_and_the_last():
    reports, flushes = reported_checkpoints(checkpoint_every=3)
    assert reports == [(2, None), (4, None), (6, 6), (8, 8)]
    assert flushes == [6]  # the last evaluation's metrics go with the run's close (run_trial), not here


def test_by_default_every_evaluation_checkpoints():
    reports, flushes = reported_checkpoints(checkpoint_every=1)
    assert reports == [(2, 2), (4, 4), (6, 6), (8, 8)]
    assert flushes == [2, 4, 6]
