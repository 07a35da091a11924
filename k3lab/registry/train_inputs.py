"""`k3lab train`'s model and train spec: a preset or model YAML, `--fidelity` and `--set FIELD=VALUE`
overrides, typed and checked as a sweep file's base and train sections are."""

from __future__ import annotations

from pathlib import Path

import yaml

from k3lab.errors import UserError
from k3lab.registry.sections import SEED_MAX
from k3lab.registry.yamlfile import load_text


def parse_overrides(items: list[str]) -> tuple[dict, dict]:
    """['hidden_size=128', 'train.steps=50'] -> ({'hidden_size': 128}, {'steps': 50}); values as YAML
    (as sweep files read it: `1e-3` is a number)."""

    model, train = {}, {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise UserError(f"--set {item!r}: expected FIELD=VALUE")
        try:
            value = load_text(raw)
        except yaml.YAMLError:
            raise UserError(f"--set {item!r}: the value is not valid YAML") from None
        if key.startswith("train."):
            train[key.removeprefix("train.")] = value
        else:
            model[key] = value
    return model, train


def build_train_inputs(args):
    """`k3lab train`'s model and train spec from its arguments (model, overrides, fidelity, seed, steps):
    a preset or model YAML with --fidelity and --set applied, typed and checked as a sweep file's are."""
    import attrs

    from k3lab.model.config import KimiK3Config, config_fields
    from k3lab.registry import load_preset
    from k3lab.registry.axes import apply_fidelity
    from k3lab.registry.convert import structure
    from k3lab.registry.fields import check_fields
    from k3lab.registry.keypath import SpecError
    from k3lab.registry.presets import model_fields
    from k3lab.registry.train_spec import TrainSpec

    model_overrides, train_overrides = parse_overrides(args.overrides)
    load_preset(args.model)  # a preset that does not validate is named in its own error
    unknown = sorted(set(model_overrides) - set(config_fields()))
    if unknown:
        raise UserError(f"--set {unknown[0]}: not a KimiK3Config field (train fields are written train.NAME)")
    try:  # typed as a sweep file's base overrides are (a float is a number, not any string)
        model_overrides = check_fields(model_overrides, ())
    except SpecError as error:
        raise UserError(f"--set {error}") from None
    fields = model_fields(args.model, Path.cwd())  # as written: a derived field (layer_types) follows --set num_layers
    if args.fidelity:
        fields |= apply_fidelity(args.fidelity, fields | model_overrides)
    try:
        config = KimiK3Config(**(fields | model_overrides))
    except (ValueError, TypeError) as error:
        raise UserError(f"--set: {error}") from None
    train_fields = {f.name for f in attrs.fields(TrainSpec)}
    unknown = sorted(set(train_overrides) - train_fields)
    if unknown:
        raise UserError(f"--set train.{unknown[0]}: not a train field ({', '.join(sorted(train_fields))})")
    if not 0 <= args.seed <= SEED_MAX:
        raise UserError(f"--seed: must be 0 .. {SEED_MAX}, got {args.seed}")
    if args.steps is not None:
        if args.steps < 1:
            raise UserError(f"--steps: must be positive, got {args.steps}")
        train_overrides["steps"] = args.steps
    defaults = TrainSpec()
    steps = train_overrides.get("steps")
    if isinstance(steps, int):  # keep warmup and eval inside a short run (any other value: an error below)
        train_overrides.setdefault("warmup_steps", min(defaults.warmup_steps, max(0, steps // 10)))
        train_overrides.setdefault("eval_interval", min(defaults.eval_interval, steps))
    try:  # as a sweep file's train section: typed strictly (a bool is true or false, not any string)
        spec = structure(train_overrides, TrainSpec)
    except SpecError as error:
        raise UserError(f"--set {error.under('train')}") from None
    return config, spec
