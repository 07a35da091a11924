"""Structuring YAML documents into the spec classes with cattrs, strictly.

Scalars are not coerced (2.5 is not an int, "3" is not a number, a string is
not a list), unknown keys are errors, and every failure becomes one
`SpecError` listing each problem at its key path, taken from cattrs' detailed
validation via `cattrs.transform_error`.
"""

from __future__ import annotations

import difflib
import math
import types
import typing
from typing import Any, get_args, get_origin

import attrs
import cattrs
from cattrs.errors import ClassValidationError, ForbiddenExtraKeysError, IterableValidationError
from cattrs.v import format_exception as cattrs_format_exception

from k3lab.errors import FieldError
from k3lab.registry.keypath import SpecError, parse_cattrs_path
from k3lab.registry.sections import BaseSpec, SchedulerSpec, SeedsSpec, UntilSpec
from k3lab.report.stop_rule import DECIDED, HALFWIDTH, MAX

_FIELD_MARK = "\x00"  # separates a validator's field name from its message in transform_error output


class StrictTypeError(TypeError):
    """A YAML value of the wrong type; the message says what was expected."""


def describe(value: Any) -> str:
    """A short rendering of a YAML value and its type for error messages."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"boolean {str(value).lower()}"
    kind = {int: "integer", float: "number", str: "string", list: "list", dict: "mapping"}.get(
        type(value), type(value).__name__)
    text = repr(value)
    return f"{kind} {text if len(text) <= 40 else text[:37] + '...'}" if kind not in ("list", "mapping") else kind


def _int(value, _type) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise StrictTypeError(f"expected an integer, got {describe(value)}")
    return value


def _float(value, _type) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise StrictTypeError(f"expected a number, got {describe(value)}")
    if not math.isfinite(value):
        raise StrictTypeError(f"expected a finite number, got {value}")
    return float(value)


def _bool(value, _type) -> bool:
    if not isinstance(value, bool):
        raise StrictTypeError(f"expected true or false, got {describe(value)}")
    return value


def _str(value, _type) -> str:
    if not isinstance(value, str):
        raise StrictTypeError(f"expected a string, got {describe(value)}")
    return value


def _any(value, _type) -> Any:
    return value


_SCALAR_HOOKS = {int: (_int, "an integer"), float: (_float, "a number"), bool: (_bool, "true or false"),
                 str: (_str, "a string")}


def _is_scalar_union(type_) -> bool:
    """`int | str` and the like: two or more scalar members (`int | None` stays cattrs')."""
    if get_origin(type_) not in (typing.Union, types.UnionType):
        return False
    members = [m for m in get_args(type_) if m is not type(None)]
    return len(members) > 1 and all(m in _SCALAR_HOOKS for m in members)


def _scalar_union(type_):
    """The first member whose strict hook takes the value, e.g. 16 or "full" for `int | str`."""
    members = get_args(type_)
    expected = " or ".join("null" if m is type(None) else _SCALAR_HOOKS[m][1] for m in members)

    def structure(value, _type):
        if value is None and type(None) in members:
            return None
        for member in members:
            if member is not type(None):
                try:
                    return _SCALAR_HOOKS[member][0](value, member)
                except StrictTypeError:
                    pass
        raise StrictTypeError(f"expected {expected}, got {describe(value)}")

    return structure


def _structure_base(value, _type) -> BaseSpec:
    if value is None or isinstance(value, str):
        return BaseSpec(preset=value)
    if not isinstance(value, dict):
        raise StrictTypeError(f"expected a preset name, a model YAML path or a mapping, got {describe(value)}")
    overrides = dict(value)
    preset = overrides.pop("preset", None)
    if preset is not None and not isinstance(preset, str):
        raise FieldError("preset", f"expected a preset name or a model YAML path, got {describe(preset)}")
    return BaseSpec(preset=preset, fidelity=overrides.pop("fidelity", None), overrides=overrides)


def _sequence_factory(converter: cattrs.Converter, make_inner):
    def factory(type_):
        inner = make_inner(type_, converter)

        def structure(value, _type):
            if not isinstance(value, (list, tuple)):
                raise StrictTypeError(f"expected a list, got {describe(value)}")
            return inner(value, _type)

        return structure

    return factory


def _scheduler_hook(converter: cattrs.Converter):
    inner = cattrs.gen.make_dict_structure_fn(SchedulerSpec, converter, _cattrs_forbid_extra_keys=True)

    def structure(value, _type) -> SchedulerSpec:
        if value is None or isinstance(value, str):
            value = {"kind": "none" if value is None else value}
        if not isinstance(value, dict):
            raise StrictTypeError(f"expected none, asha or a mapping, got {describe(value)}")
        return inner(value, _type)

    return structure


def _mapping_hook_factory(converter: cattrs.Converter):
    """Every other attrs class (train, budget, match, until, ...) is written as a mapping: a
    scalar there is a type error in one line, not cattrs' 'no attribute keys'."""
    def factory(cls):
        inner = cattrs.gen.make_dict_structure_fn(cls, converter, _cattrs_forbid_extra_keys=True)

        def structure(value, _type):
            if not isinstance(value, dict):
                raise StrictTypeError(f"expected a mapping, got {describe(value)}")
            return inner(value, _type)

        return structure

    return factory


def _seeds_hook(converter: cattrs.Converter):
    """`seeds:` is a list of seeds or a policy mapping (SeedsSpec)."""
    def structure(value, _type):
        if isinstance(value, (list, tuple)):
            return converter.structure(value, list[int])
        if isinstance(value, dict):
            return converter.structure(value, SeedsSpec)
        raise StrictTypeError(f"expected a list of seeds or a mapping {{start, max, until}}, got {describe(value)}")

    return structure


def _until_hook(converter: cattrs.Converter):
    """`until:` is decided, max, or a mapping {halfwidth: H}."""
    inner = cattrs.gen.make_dict_structure_fn(UntilSpec, converter, _cattrs_forbid_extra_keys=True)

    def structure(value, _type) -> UntilSpec:
        if value is None or value in (DECIDED, MAX):
            return UntilSpec(rule=value or DECIDED)
        if not isinstance(value, dict) or "rule" in value:
            raise StrictTypeError(f"expected decided, max or a mapping {{halfwidth: H}}, got {describe(value)}")
        return inner({"rule": HALFWIDTH} | value, _type)

    return structure


def make_converter() -> cattrs.Converter:
    """A cattrs converter that structures sweep documents strictly."""
    converter = cattrs.Converter(forbid_extra_keys=True, detailed_validation=True)
    for type_, hook in ((int, _int), (float, _float), (bool, _bool), (str, _str), (Any, _any)):
        converter.register_structure_hook(type_, hook)
    converter.register_structure_hook_factory(attrs.has, _mapping_hook_factory(converter))
    converter.register_structure_hook(BaseSpec, _structure_base)
    converter.register_structure_hook_factory(
        lambda t: get_origin(t) is list, _sequence_factory(converter, cattrs.cols.list_structure_factory))
    converter.register_structure_hook_factory(
        lambda t: get_origin(t) is tuple, _sequence_factory(converter, cattrs.cols.homogenous_tuple_structure_factory))
    converter.register_structure_hook(SchedulerSpec, _scheduler_hook(converter))
    converter.register_structure_hook(UntilSpec, _until_hook(converter))
    converter.register_structure_hook_factory(_is_scalar_union, _scalar_union)
    converter.register_structure_hook(list[int] | SeedsSpec, _seeds_hook(converter))
    return converter


CONVERTER = make_converter()


def structure(document: Any, cls: Any):
    """`document` structured as `cls` (an attrs class or a type such as
    `int | None`), or a `SpecError` with paths relative to `document`."""
    if attrs.has(cls) and not isinstance(document, dict):
        raise SpecError((), f"expected a mapping, got {describe(document)}")
    try:
        return CONVERTER.structure(document, cls)
    except StrictTypeError as error:
        raise SpecError((), str(error))
    except (ClassValidationError, IterableValidationError) as error:
        raise SpecError.of([_parse(line, cls) for line in cattrs.transform_error(error, format_exception=_format)])
    except ForbiddenExtraKeysError as error:  # top-level unknown keys
        raise SpecError.of([((key,), _unknown_key(key, cls)) for key in sorted(error.extra_fields)])
    except FieldError as error:  # a validator of `cls` itself
        raise SpecError((error.field,), error.message)


def _format(error: BaseException, type_) -> str:
    if isinstance(error, FieldError):
        return f"{error.field}{_FIELD_MARK}{error.message}"
    if isinstance(error, StrictTypeError):
        return str(error)
    if isinstance(error, ForbiddenExtraKeysError):
        key = sorted(error.extra_fields)[0]
        more = len(error.extra_fields) - 1
        suffix = f" (and {more} more unknown keys: {', '.join(sorted(error.extra_fields)[1:])})" if more else ""
        return f"{key}{_FIELD_MARK}{_unknown_key(key, error.cl)}{suffix}"
    if isinstance(error, KeyError):
        return "required key missing"
    if attrs.has(type_) and isinstance(error, (TypeError, AttributeError)):
        return "expected a mapping"
    return cattrs_format_exception(error, type_)


def _parse(line: str, cls: type) -> tuple[tuple, str]:
    message, _, where = line.rpartition(" @ ")
    path = parse_cattrs_path(where)
    if _FIELD_MARK in message:
        field, message = message.split(_FIELD_MARK, 1)
        path += (field,)
    return path, message


def _unknown_key(key: str, cls: type) -> str:
    known = [f.name for f in attrs.fields(cls)] if attrs.has(cls) else []
    close = difflib.get_close_matches(key, known, n=1)
    return f"unknown key{f'; did you mean {close[0]!r}?' if close else ''}"
