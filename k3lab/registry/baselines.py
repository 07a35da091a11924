"""Which variant each variant of a sweep is compared with: the baseline the file names, one per
group of the other axes' values (`baseline: {axis: value}`), or by default the standard residual
stream (`compared_axis` picks the axis a sweep of several axes compares)."""

from __future__ import annotations

from typing import Any

from k3lab.registry.axes import Axis, axis_kind
from k3lab.registry.keypath import SpecError
from k3lab.registry.sections import SweepSpec
from k3lab.registry.model_variants import Variant

def baseline_values(raw: dict[str, Any], axes: tuple[Axis, ...]) -> dict[str, Any]:
    """`baseline: {axis: value}` parsed: every key an axis of the sweep, every value one of its values."""
    by_name = {axis.name: axis for axis in axes}
    parsed = {}
    for name, value in raw.items():
        path = ("baseline", name)
        if name not in by_name:
            known = ", ".join(by_name) or "none"
            raise SpecError(path, f"not an axis of the sweep (axes: {known})")
        parsed[name] = axis_kind(name, path).parse(value, path)
        if parsed[name] not in by_name[name].values:
            shown = ", ".join(str(v) for v in by_name[name].values)
            raise SpecError(path, f"{value!r} is not one of the axis' values ({shown})")
    return parsed


def group_baselines(variants: tuple[Variant, ...], wanted: dict[str, Any]) -> tuple[dict[str, str], tuple[str, ...]]:
    """Each valid variant's baseline: the valid variant with the same values of every other axis and
    `wanted`'s values of the baseline's axes. Returns ({variant: baseline}, notes for variants
    without one)."""
    by_overrides = {tuple(sorted(v.overrides.items(), key=lambda kv: kv[0])): v for v in variants}
    baselines, notes = {}, []
    for variant in (v for v in variants if v.ok):
        target = tuple(sorted({**variant.overrides, **wanted}.items(), key=lambda kv: kv[0]))
        baseline = by_overrides.get(target)
        if baseline is variant:
            continue
        if baseline is None or not baseline.ok:
            why = "no such variant" if baseline is None else f"{baseline.name} is not run ({baseline.status})"
            notes.append(f"baseline: {variant.name} is not compared: its group has no baseline ({why})")
            continue
        baselines[variant.name] = baseline.name
    return baselines, tuple(notes)


def named_baseline(spec: SweepSpec, variants: tuple[Variant, ...]) -> str:
    """The named baseline (it must be valid), else the first valid variant with the standard
    residual stream (the AttnRes ablations' baseline), else the first valid variant."""
    valid = [v for v in variants if v.ok]
    if isinstance(spec.baseline, dict):
        return ""  # one per group: see group_baselines
    if spec.baseline is None:
        standard = [v for v in valid if not v.config.use_attn_res]
        return (standard or valid)[0].name
    named = next(v for v in variants if v.name == spec.baseline)  # present: see _check_baseline_named
    if not named.ok:
        raise SpecError(("baseline",), f"variant {named.name} is not run ({named.status}: {named.reason})")
    return named.name


def default_baselines(axes: tuple[Axis, ...], variants: tuple[Variant, ...],
                      baseline: str) -> tuple[dict[str, Any], dict[str, str]]:
    """Without `baseline:`: with two or more axes, each group of the other axes' values is compared
    with its own baseline, the variant with `baseline`'s value of the compared axis (`compared_axis`);
    a variant without one in its group (an explicit variant) with `baseline`. Returns the compared
    axis' value ({} with one axis) and {variant: its baseline}."""
    single = {v.name: baseline for v in variants if v.ok and v.name != baseline}
    named = next(v for v in variants if v.name == baseline)
    axis = compared_axis(axes, variants)
    if axis is None or axis not in named.overrides:
        return {}, single
    wanted = {axis: named.overrides[axis]}
    grouped, _ = group_baselines(variants, wanted)
    if not grouped:
        return {}, single
    grouped_baselines = set(grouped.values())
    return wanted, {name: grouped.get(name, first) for name, first in single.items()
                    if name not in grouped_baselines or name in grouped}


def compared_axis(axes: tuple[Axis, ...], variants: tuple[Variant, ...]) -> str | None:
    """The axis a sweep of two or more axes compares by default: the first that turns AttnRes on
    and off between variants alike in every other axis (against the standard residual stream),
    else the first axis; None with fewer than two axes."""
    if len(axes) < 2:
        return None
    valid = [v for v in variants if v.ok]
    for axis in axes:
        states: dict[tuple, set[bool]] = {}
        for variant in valid:
            others = tuple(sorted((k, str(v)) for k, v in variant.overrides.items() if k != axis.name))
            states.setdefault(others, set()).add(variant.config.use_attn_res)
        if any(len(found) > 1 for found in states.values()):
            return axis.name
    return axes[0].name
