"""Model presets shipped as YAML in `k3lab/presets/`, and model YAML files.

A preset (or any model YAML file) is a mapping of KimiK3Config fields. Fields
it leaves out keep KimiK3Config's defaults; in particular a preset without
`layer_types` follows the Kimi Linear 3:1 pattern for whatever `num_layers`
a variant ends up with.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Any

from k3lab.errors import UserError
from k3lab.model.config import KimiK3Config
from k3lab.registry.axes import apply_fidelity
from k3lab.registry.fields import check_fields
from k3lab.registry.keypath import SpecError
from k3lab.registry.sections import BaseSpec
from k3lab.registry.yamlfile import read_yaml



def list_presets() -> list[str]:
    """Names of the shipped presets, e.g. ['base', 'small', 'tiny']."""
    files = _preset_dir().iterdir()
    return sorted(f.name.removesuffix(".yaml") for f in files if f.name.endswith(".yaml"))


def load_preset(name: str) -> KimiK3Config:
    """The shipped preset `name`, or a model YAML file when `name` is a path."""
    try:
        fields = model_fields(name, Path.cwd())
        return KimiK3Config(**fields)
    except (SpecError, ValueError) as error:
        raise UserError(f"preset {name}: {error}") from None


def model_fields(name: str, relative_to: Path) -> dict[str, Any]:
    """The checked config fields of a preset name or a model YAML path (relative
    to `relative_to`). Raises `SpecError` naming the file on problems."""
    if is_preset_name(name):
        if name not in list_presets():
            raise SpecError((), f"unknown preset {name!r} (presets: {', '.join(list_presets())}; "
                                "or a path to a model YAML file)")
        path = Path(str(_preset_dir().joinpath(f"{name}.yaml")))
    else:
        path = relative_to / name
    try:
        return check_fields(read_yaml(path), ())
    except SpecError as error:
        raise SpecError((), f"{name}: {error}") from None


def _preset_dir():
    return resources.files("k3lab").joinpath("presets")


def is_preset_name(name: str) -> bool:
    """A bare name like 'tiny' (no path separator, no .yaml/.yml suffix)."""
    return "/" not in name and "\\" not in name and not name.endswith((".yaml", ".yml"))


def base_fields_of(base: BaseSpec, directory: Path) -> dict[str, Any]:
    """A sweep file's base model as config fields: the preset's fields (a preset file found from
    `directory`), then the fidelity's choices, then the file's overrides."""
    fields = {}
    if base.preset is not None:
        try:
            fields = model_fields(base.preset, directory)
        except SpecError as error:
            raise SpecError(("base",), str(error)) from None
    overrides = check_fields(base.overrides, ("base",))
    if base.fidelity is not None:
        fields |= apply_fidelity(base.fidelity, fields | overrides)
    return fields | overrides
