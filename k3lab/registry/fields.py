"""KimiK3Config fields as the registry sees them: names, types, strict values."""

from __future__ import annotations

import difflib
import functools
import typing
from typing import Any

import attrs

from k3lab.model.config import KimiK3Config
from k3lab.registry.convert import structure
from k3lab.registry.keypath import Path, SpecError


@functools.cache
def field_types() -> dict[str, Any]:
    """Each KimiK3Config field name -> its resolved type annotation."""
    hints = typing.get_type_hints(KimiK3Config)
    return {f.name: hints[f.name] for f in attrs.fields(KimiK3Config)}


def is_field(name: str) -> bool:
    return name in field_types()


def check_field(name: str, value: Any, path: Path) -> Any:
    """`value` for config field `name`, strictly typed (a YAML list becomes a
    tuple, an int a float where the field is a float); `SpecError` at `path`."""
    try:
        return structure(value, field_types()[name])
    except SpecError as error:
        raise error.under(*path) from None


def check_fields(mapping: Any, path: Path) -> dict[str, Any]:
    """A mapping of config fields, each checked; unknown names are errors."""
    if not isinstance(mapping, dict):
        raise SpecError(path, "expected a mapping of KimiK3Config fields")
    checked = {}
    for name, value in mapping.items():
        if not isinstance(name, str) or not is_field(name):
            raise SpecError(path + (name,), unknown_field(name))
        checked[name] = check_field(name, value, path + (name,))
    return checked


def unknown_field(name: Any, extra: tuple[str, ...] = ()) -> str:
    """The message for a name that is not a KimiK3Config field."""
    close = difflib.get_close_matches(str(name), list(field_types()) + list(extra), n=1)
    return f"not a KimiK3Config field{f'; did you mean {close[0]!r}?' if close else ''}"
