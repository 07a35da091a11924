"""Sweep files, model presets and variant generation.

    sweep = load_sweep("experiments/attnres_block.yaml", profile="cpu")
    for trial in sweep.trials:          # valid variants x seeds
        trial.variant.config            # a KimiK3Config
        trial.seed, trial.name, trial.id
    sweep.train                         # TrainSpec
    sweep.resources.tune_resources()    # {"cpu": ..., "gpu": ...}
    sweep.scheduler, sweep.metric

See `spec` for the file format's sections, `axes` for derived axes,
`variants` for expansion, normalisation and ids, `matching` for parameter
matching and `profiles` for profile merging.
"""

from k3lab.registry.axes import Axis, axis_names
from k3lab.registry.counts import ParamCounts, count
from k3lab.registry.presets import list_presets, load_preset
from k3lab.registry.spec import BaseSpec, MatchSpec, MetricSpec, ResourceSpec, SchedulerSpec, SweepSpec
from k3lab.train.spec import TrainSpec
from k3lab.registry.sweep import Sweep, Trial, load_sweep, resolve_profile, sweep_profiles
from k3lab.registry.variants import Point, Variant, config_id, expand, points

__all__ = [
    "Axis", "BaseSpec", "MatchSpec", "MetricSpec", "ParamCounts", "Point", "ResourceSpec", "SchedulerSpec", "Sweep",
    "SweepSpec", "TrainSpec", "Trial", "Variant", "axis_names", "config_id", "count", "expand", "list_presets",
    "load_preset", "load_sweep", "points", "resolve_profile", "sweep_profiles",
]
