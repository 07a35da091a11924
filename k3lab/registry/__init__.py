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

from k3lab.lazy import lazy_exports

_EXPORTS = {  # name -> the module it comes from, imported on first use (`k3lab --help` imports no torch)
    'Axis': 'k3lab.registry.axes',
    'axis_names': 'k3lab.registry.axes',
    'ParamCounts': 'k3lab.registry.counts',
    'count': 'k3lab.registry.counts',
    'list_presets': 'k3lab.registry.presets',
    'load_preset': 'k3lab.registry.presets',
    'BaseSpec': 'k3lab.registry.sections',
    'MatchSpec': 'k3lab.registry.sections',
    'MetricSpec': 'k3lab.registry.sections',
    'ResourceSpec': 'k3lab.registry.sections',
    'SchedulerSpec': 'k3lab.registry.sections',
    'SweepSpec': 'k3lab.registry.sections',
    'TrainSpec': 'k3lab.registry.train_spec',
    'Sweep': 'k3lab.registry.sweep_file',
    'Trial': 'k3lab.registry.sweep_file',
    'load_sweep': 'k3lab.registry.sweep_file',
    'resolve_profile': 'k3lab.registry.sweep_file',
    'sweep_profiles': 'k3lab.registry.sweep_file',
    'Point': 'k3lab.registry.model_variants',
    'Variant': 'k3lab.registry.model_variants',
    'config_id': 'k3lab.registry.model_variants',
    'expand': 'k3lab.registry.model_variants',
    'points': 'k3lab.registry.model_variants',
}

__all__ = [
    "Axis", "BaseSpec", "MatchSpec", "MetricSpec", "ParamCounts", "Point", "ResourceSpec", "SchedulerSpec", "Sweep",
    "SweepSpec", "TrainSpec", "Trial", "Variant", "axis_names", "config_id", "count", "expand", "list_presets",
    "load_preset", "load_sweep", "points", "resolve_profile", "sweep_profiles",
]


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
