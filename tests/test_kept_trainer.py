"""A Ray actor Tune reuses (`resources.reuse_actors`) keeps its trial's trainer -- the model, its
compiled blocks and captured step -- for the next seed of the same variant (`tune.trial.KeptTrainer`)."""

from __future__ import annotations

import pytest

from k3lab.registry.presets import load_preset
from k3lab.registry.train_spec import TrainSpec

pytestmark = pytest.mark.usefixtures("isolated_data")


class StandInCheckpoint:
    @classmethod
    def from_directory(cls, directory):
        return cls()


def test_the_next_seed_of_a_variant_in_one_process_neither_builds_nor_compiles_again(monkeypatch):
    ray_tune = pytest.importorskip("ray.tune")
    import k3lab.runner.train.trainer as trainer_module
    import k3lab.runner.tune.trial as trial

    builds, compiles, reports = [], [], []

    class CountedTrainer(trial.Trainer):
        def __init__(self, config, spec, seed=0, **kwargs):
            builds.append((config.attn_res_block_size, seed))
            super().__init__(config, spec, seed=seed, **kwargs)

    monkeypatch.setattr(trial, "Trainer", CountedTrainer)
    monkeypatch.setattr(trainer_module, "compile_blocks", lambda model: compiles.append(model) or model)
    monkeypatch.setattr(trial, "_kept", trial.KeptTrainer())  # this process's, as a fresh actor's
    monkeypatch.setattr(ray_tune, "get_checkpoint", lambda: None)
    monkeypatch.setattr(ray_tune, "report", lambda metrics, checkpoint=None: reports.append(metrics))
    monkeypatch.setattr(ray_tune, "Checkpoint", StandInCheckpoint)
    train = TrainSpec(steps=2, batch_size=2, seq_len=32, warmup_steps=1, eval_interval=2, eval_batches=1, compile=True)
    specs = {f"{block}/{seed}": trial.TrialSpec(f"v{block}", f"bs{block}", seed,
                                               load_preset("tiny").replace(attn_res_block_size=block), train, None, "x")
             for block, seed in [(2, 0), (2, 1), (1, 0)]}
    for key in specs:
        trial.tune_trainable({"trial": key}, specs)
    # seed 1 of bs2 took seed 0's trainer, restarted; bs1, another variant, built its own
    assert builds == [(2, 0), (1, 0)]
    assert len(compiles) == 2
    assert [r["done_steps"] for r in reports if "done_steps" in r][-3:] == [2, 2, 2]
    assert trial._kept.key == trial.KeptTrainer.key_of(specs["1/0"])  # bs1's, kept for its next seed
