"""One MLflow param per swept value: a config-field axis is its trial's `model.<name>` param, an axis
of its own (ffn, layer_schedule, fidelity) is `axis.<name>`, and the axes a variant sets are its
`k3lab.axes` tag. Every reader (records, summary, factorial, swept axes, the UI's view) reads them
from such a store and from a committed one that logged every axis as `axis.*` beside `model.*`."""

import json
import lzma
from pathlib import Path

import pytest

from k3lab.model.config import KimiK3Config, tiny_config
from k3lab.registry.axes import apply_overrides
from k3lab.report.factorial import factorial_grid
from k3lab.report.summary import load_trials, summarize
from k3lab.store import runs, views
from k3lab.store.tracking import MLflowTracker
from k3lab.registry.train_spec import TrainSpec
from k3lab.registry.model_variants import Variant
from k3lab.runner.tune.trial import TrialSpec, trial_params, value_params, variant_params
from k3lab.store.trial_run import open_trial_run

ROOT = Path(__file__).resolve().parents[1]
COUNTS = {"total": 1, "active": 1, "embedding": 1, "flops_per_token": 1, "by_component": {}}
GRID = [{"attn_res_block_size": block, "ffn": ffn} for block in ("off", 2) for ffn in ("moe", "latent_moe")]
EXTRA = {"ffn": "dense"}  # a variant outside the grid: its attn_res_block_size is the base's, not swept


def variant_name(overrides: dict) -> str:
    return "-".join(f"{k}_{v}" for k, v in overrides.items())


def new_store(uri: str) -> str:
    """A sweep's parent and trials as k3lab logs them now (`open_trial_run`), two seeds each."""
    parent = MLflowTracker.start(uri, "grid", "grid", tags=runs.sweep_tags("grid", None, "0", "abc", "", "k3lab", None))
    base = tiny_config().to_dict()
    for overrides in [*GRID, EXTRA]:
        config = KimiK3Config(**apply_overrides(base, overrides))
        for seed in (0, 1):
            variant = Variant(variant_name(overrides), variant_name(overrides), "ok", overrides, (0, 1), config)
            spec = TrialSpec(variant_id=variant.id, variant_name=variant.name, seed=seed, config=config,
                             train=TrainSpec(), tracking_uri=uri, experiment="grid", parent_run_id=parent.run_id,
                             params=variant_params(variant, TrainSpec(), seed), axes=tuple(overrides))
            trial = open_trial_run(spec.run_key, trial_params(spec, COUNTS), COUNTS)
            trial.log_metrics({"val_loss": 3.0 + seed}, 1)
            trial.finish("FINISHED")
    parent.finish("FINISHED")
    return parent.run_id


@pytest.fixture(scope="module")
def new(tmp_path_factory):
    uri = f"sqlite:///{tmp_path_factory.mktemp('new') / 'mlflow.db'}"
    return uri, new_store(uri)


def test_a_swept_config_field_is_one_param_and_an_axis_of_its_own_is_its_axis_param(new):
    uri, parent = new
    for trial in runs.trial_runs(uri, parent):
        params = trial.data.params
        assert not [k for k in params if k.startswith("axis.") and f"model.{k.removeprefix('axis.')}" in params]
    trial = next(t for t in runs.trial_runs(uri, parent) if runs.variant_of(t) == variant_name(GRID[3]))
    assert trial.data.params["model.attn_res_block_size"] == "2" and trial.data.params["axis.ffn"] == "latent_moe"
    assert "axis.attn_res_block_size" not in trial.data.params
    assert json.loads(trial.data.tags[runs.AXES]) == ["attn_res_block_size", "ffn"]


def test_the_readers_find_the_swept_values_of_a_new_store(new):
    uri, parent = new
    records = load_trials(uri, parent)
    by_variant = {r.variant: r.axes for r in records}
    assert by_variant[variant_name(GRID[0])] == {"attn_res_block_size": "off", "ffn": "moe"}
    assert by_variant[variant_name(EXTRA)] == {"ffn": "dense"}  # not the base's block size: it did not set it
    assert {row["variant"]: row["axes"] for row in summarize(records)} == by_variant
    order = [variant_name(o) for o in [EXTRA, *GRID]]
    grid = factorial_grid(records, order)
    assert set(grid.axes) == {"attn_res_block_size", "ffn"} and variant_name(EXTRA) not in grid.cells.values()
    assert grid.levels["attn_res_block_size"] == ("off", "2") and len(grid.cells) == 4
    trials = runs.trial_runs(uri, parent)
    assert runs.swept_axes(trials) == ["ffn"]  # the extra variant sets ffn only
    assert runs.axis_params(trials, ["attn_res_block_size", "ffn"]) == ["model.attn_res_block_size", "axis.ffn"]
    assert list(value_params(["attn_res_block_size", "ffn"]).values()) == ["model.attn_res_block_size", "axis.ffn"]


def test_the_readers_find_the_swept_values_of_a_store_that_logged_them_twice(tmp_path):
    store = tmp_path / "kkkm.db"  # three schedules x AttnRes off or block size 4, axis.* beside model.*
    store.write_bytes(lzma.decompress((ROOT / "docs/runs/attnres_kkkm-gpu-2026-12-01.db.xz").read_bytes()))
    uri = f"sqlite:///{store}"
    parent = runs.sweep_runs(uri)[0].info.run_id
    trials = runs.trial_runs(uri, parent)
    assert runs.swept_axes(trials) == ["attn_res_block_size", "layer_schedule"]
    assert runs.axis_params(trials, runs.swept_axes(trials)) == ["axis.attn_res_block_size", "axis.layer_schedule"]
    records = load_trials(uri, parent)
    assert {r.axes["layer_schedule"] for r in records} == {"KKKM", "KKMK", "KKKK"}
    assert {row["axes"]["attn_res_block_size"] for row in summarize(records)} == {"off", "4"}
    grid = factorial_grid(records, [])
    assert set(grid.axes) == {"attn_res_block_size", "layer_schedule"} and len(grid.cells) == 6
    views.present_earlier_sweeps(uri, refresh={parent})
    experiment = runs.client(uri).get_experiment(trials[0].info.experiment_id)
    state = views.unpack_state(json.loads(experiment.tags[views.SHARED_VIEW + views.LOSS_VIEW])["state"])
    assert {"params.`axis.attn_res_block_size`", "params.`axis.layer_schedule`"} <= set(state["selectedColumns"])
