"""Loading a sweep file into a `Sweep`: the resolved specs and its variants.

`load_sweep(path, profile=None)` reads the YAML, applies the profile, checks
every section (and every other profile, so a broken `gpu` profile fails even
on a laptop), resolves the base model, expands the variants and raises a
one-line `UserError` naming the file and the key path for any problem,
including a sweep in which no variant is valid.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

import attrs

from k3lab.errors import UserError
from k3lab.model.config import KimiK3Config
from k3lab.registry.axes import Axis, parse_axes
from k3lab.registry.baselines import baseline_values, default_baselines, group_baselines, named_baseline
from k3lab.registry.compute_curves import compute_variants, size_families
from k3lab.registry.convert import describe, structure
from k3lab.registry.keypath import SpecError
from k3lab.registry.matching import check_adjusted_unswept
from k3lab.registry.presets import base_fields_of
from k3lab.registry.profiles import apply_profile, check_profiles, locate, profile_names
from k3lab.registry.sections import (BudgetSpec, ComputeSpec, MatchSpec, MetricSpec, ResourceSpec, SchedulerSpec,
                                     SeedsSpec, SweepSpec)
from k3lab.registry.train_spec import TrainSpec
from k3lab.registry.model_variants import Point, Variant, expand, parse_explicit, point_names, points
from k3lab.registry.yamlfile import read_yaml

MAX_VARIANTS = 1000


@attrs.frozen
class Trial:
    """One training run: a valid variant and a seed."""

    variant: Variant
    seed: int

    @property
    def name(self) -> str:
        return f"{self.variant.name}_s{self.seed}"

    @property
    def id(self) -> str:
        return f"{self.variant.id}_s{self.seed}"


@attrs.frozen
class Sweep:
    """A loaded sweep under one profile: what `k3lab.runner.tune` needs to start trials."""

    name: str
    description: str
    path: str
    profile: str | None
    profiles: tuple[str, ...]
    base: KimiK3Config
    axes: tuple[Axis, ...]
    seeds: tuple[int, ...]
    train: TrainSpec
    metric: MetricSpec
    resources: ResourceSpec
    scheduler: SchedulerSpec  # max_t resolved from train when the file leaves it null
    match: MatchSpec | None
    variants: tuple[Variant, ...]
    baseline: str  # the valid variant the others are compared against, paired by seed
    kernel_cache: str | None = None  # as written in the file, relative to it; see k3lab.runner.runtime.kernel_cache
    notes: tuple[str, ...] = ()  # defaults adapted to what the file sets, shown with the plan
    seed_policy: SeedsSpec | None = None  # `seeds: {start, max, until}`; then `seeds` holds every seed it may use
    budget: BudgetSpec | None = None
    baselines: dict[str, str] = attrs.Factory(dict)  # compared variant -> the baseline of its group, in file order
    baseline_axes: dict[str, Any] = attrs.Factory(dict)  # `baseline: {axis: value}` as parsed, or the default's
    # compared axis (`default_baselines`); {} for one baseline
    compute: ComputeSpec | None = None  # the baselines' compute curves: their stretched copies are in `variants`
    compute_sizes: dict[str, Any] | None = None  # with compute.sizes: `k3lab.registry.compute_curves.size_families`

    def train_of(self, variant: Variant) -> TrainSpec:
        """How `variant` trains: the file's `train`, stretched for a point of a compute curve."""
        return self.train if variant.compute_scale == 1 else self.train.stretched(variant.compute_scale)

    @property
    def compute_curves(self) -> dict[str, dict[str, float]]:
        """baseline -> {its stretched copy: the multiple of the token budget it trains}, in file order."""
        curves: dict[str, dict[str, float]] = {}
        for variant in self.valid_variants:
            if variant.stretches is not None:
                steps = self.train_of(variant).steps
                curves.setdefault(variant.stretches, {})[variant.name] = steps / self.train.steps
        return curves

    @property
    def adaptive(self) -> bool:
        """Seeds are added while comparisons are imprecise (`seeds:` is a policy, not a list)."""
        return self.seed_policy is not None

    @property
    def valid_variants(self) -> tuple[Variant, ...]:
        """The variants to train: valid and not duplicates."""
        return tuple(v for v in self.variants if v.ok)

    @property
    def trials(self) -> tuple[Trial, ...]:
        """valid_variants x seeds, variant-major."""
        return tuple(Trial(v, seed) for v in self.valid_variants for seed in v.seeds)


@attrs.frozen
class _Resolved:
    """A sweep document with its base model, axes and explicit variants resolved."""

    spec: SweepSpec
    base_fields: dict[str, Any]
    base: KimiK3Config
    axes: tuple[Axis, ...]
    explicit: tuple[Point, ...]
    notes: tuple[str, ...]


def load_sweep(path: str | Path, profile: str | None = None) -> Sweep:
    """The sweep in `path` under `profile` (None: the top-level settings)."""
    path = Path(path)
    document = _read(path)
    try:
        check_profiles(document)
        names = profile_names(document)
        if profile is not None and profile not in names:
            known = f"profiles: {', '.join(names)}" if names else "the file defines no profiles"
            raise SpecError(("profiles",), f"no profile named {profile!r} ({known})")
        resolved = {name: _resolve_profile(document, name, path.parent) for name in [None, *names]}
    except SpecError as error:
        raise UserError(f"{path}: {error}") from None
    variants = _variants(path, profile, resolved[profile])  # none valid: that is the error, not the baseline
    try:
        for name in [None, *names]:
            _check_baseline_named(resolved[name], name, document)
    except SpecError as error:
        raise UserError(f"{path}: {error}") from None
    return _sweep(path, profile, tuple(names), resolved[profile], variants)


def sweep_profiles(path: str | Path) -> tuple[str, ...]:
    """The profile names a sweep file defines, read without expanding any variant."""
    return tuple(profile_names(_read(Path(path))))


def resolve_profile(path: str | Path, profile: str | None) -> str | None:
    """The profile a `--profile` flag names. `auto` is `gpu` on a machine with CUDA, else
    `cpu`, when the file defines that profile (else the top-level settings); `none` (or
    None) is the top-level settings. Every command resolves the flag here, so `variants`,
    `sweep --dry-run`, `sweep` and `report` see the same trials."""
    if profile in (None, "none"):
        return None
    if profile != "auto":
        return profile
    import torch

    wanted = "gpu" if torch.cuda.device_count() > 0 else "cpu"  # NVML, not cuInit (k3lab.runner.runtime.preflight.cuda_gpus)
    return wanted if wanted in sweep_profiles(path) else None


def profile_option(sweep: Sweep) -> str | None:
    """The `--profile` that a printed command needs to load `sweep` again on this machine (`k3lab.hints`):
    None where `auto` picks its profile, else its name (`none` for the top-level settings)."""
    if resolve_profile(sweep.path, "auto") == sweep.profile:
        return None
    return sweep.profile or "none"


def _read(path: Path) -> dict[str, Any]:
    try:
        document = read_yaml(path)
    except SpecError as error:
        raise UserError(f"{path}: {error}") from None
    if document is None:  # nothing, or comments only
        raise UserError(f"{path}: the file is empty: expected a mapping of sweep settings (name, base, axes, ...)")
    if not isinstance(document, dict):
        raise UserError(f"{path}: expected a mapping of sweep settings (name, base, axes, ...), got {describe(document)}")
    return document


def _resolve_profile(document: dict[str, Any], profile: str | None, directory: Path) -> _Resolved:
    if profile is None:
        resolved = _resolve({k: v for k, v in document.items() if k != "profiles"}, directory, document)
    else:
        try:
            resolved = _resolve(apply_profile(document, profile), directory, document)
        except SpecError as error:
            raise error.mapped(lambda p: locate(p, document["profiles"][profile], profile)) from None
    return resolved


def _resolve(document: dict[str, Any], directory: Path, original: dict[str, Any]) -> _Resolved:
    spec = structure({**document, "profiles": original.get("profiles") or {}}, SweepSpec)
    base_fields = base_fields_of(spec.base, directory)
    try:
        base = KimiK3Config(**base_fields)
    except ValueError as error:
        raise SpecError(("base",), f"invalid base model: {error}") from None
    axes = parse_axes(spec.axes)
    explicit = parse_explicit(spec.variants)
    if not axes and not explicit:
        raise SpecError(("axes",), "the sweep needs at least one axis or one entry under variants")
    size = math.prod(len(a.values) for a in axes) if axes else 0
    if size + len(explicit) > MAX_VARIANTS:
        raise SpecError(("axes",), f"{size + len(explicit):,} variants is more than {MAX_VARIANTS:,}; split the sweep")
    if spec.match is not None:
        check_adjusted_unswept(spec.match, [a.name for a in axes] + [k for p in explicit for k in p.overrides])
    notes = spec.train.default_notes(document.get("train") or {})
    return _Resolved(spec, base_fields, base, axes, explicit, notes)


def _check_baseline_named(resolved: _Resolved, profile: str | None, document: dict[str, Any]) -> None:
    """`baseline:`, when set, names one of the variants (checked for every profile)."""
    baseline = resolved.spec.baseline
    names = point_names(points(resolved.axes, resolved.explicit))
    if isinstance(baseline, dict):
        try:
            baseline_values(baseline, resolved.axes)
        except SpecError as error:
            raise error.mapped(lambda p: locate(p, document["profiles"][profile], profile) if profile else p) from None
        return
    if baseline is None or baseline in names:
        return
    path = ("baseline",)
    if profile is not None:
        path = locate(path, document["profiles"][profile], profile)
    hint = ("; name it by axis values instead, e.g. baseline: {" + f"{resolved.axes[0].name}: ...}}"
            if len(resolved.axes) > 1 else "")
    raise SpecError(path, f"no variant named {baseline!r}{_profile_note(profile)} (variants: {', '.join(names)}){hint}")


def _variants(path: Path, profile: str | None, resolved: _Resolved) -> tuple[Variant, ...]:
    """The variants of the resolved sweep; a UserError naming the rules that rejected them when none is valid."""
    spec = resolved.spec
    variants = expand(resolved.base, resolved.base_fields, points(resolved.axes, resolved.explicit),
                      spec.all_seeds, spec.train, spec.match)
    if not any(v.ok for v in variants):
        raise UserError(f"{path}: no valid variant{_profile_note(profile)}: " + _summarise(variants))
    return variants


def _sweep(path: Path, profile: str | None, profiles: tuple[str, ...], resolved: _Resolved,
           variants: tuple[Variant, ...]) -> Sweep:
    spec = resolved.spec
    policy, seeds = spec.seed_policy, spec.all_seeds
    try:
        baseline = named_baseline(spec, variants)
    except SpecError as error:
        raise UserError(f"{path}: {error}{_profile_note(profile)}") from None
    notes = resolved.notes
    wanted = baseline_values(spec.baseline, resolved.axes) if isinstance(spec.baseline, dict) else {}
    if wanted:
        baselines, missing = group_baselines(variants, wanted)
        notes += missing
        if not baselines:
            raise UserError(f"{path}: baseline: no variant has a baseline in its group{_profile_note(profile)}")
        baseline = next(iter(baselines.values()))
    elif spec.baseline is None:
        wanted, baselines = default_baselines(resolved.axes, variants, baseline)
    else:
        baselines = {v.name: baseline for v in variants if v.ok and v.name != baseline}
    try:
        variants += compute_variants(spec.compute, baselines, variants)
        sizes = size_families(spec.compute, resolved.axes, baselines, variants)
    except SpecError as error:
        raise UserError(f"{path}: {error}{_profile_note(profile)}") from None
    start_trials = policy.start * sum(v.ok for v in variants) if policy is not None else 0
    if spec.budget is not None and spec.budget.trials is not None and spec.budget.trials < start_trials:
        raise UserError(f"{path}: budget.trials: must be at least the {start_trials} trials of the start seeds "
                        f"({policy.start} for each of {start_trials // policy.start} variants), got "
                        f"{spec.budget.trials}: fewer leave comparisons without an interval{_profile_note(profile)}")
    return Sweep(
        name=spec.name, description=spec.description, path=str(path), profile=profile, profiles=profiles,
        base=resolved.base, axes=resolved.axes, seeds=seeds, train=spec.train, metric=spec.metric,
        resources=spec.resources, scheduler=spec.scheduler.resolved(spec.train), match=spec.match,
        variants=variants, baseline=baseline, kernel_cache=_relative_to(path.parent, spec.kernel_cache),
        notes=notes, seed_policy=policy, budget=spec.budget, baselines=baselines, baseline_axes=wanted,
        compute=spec.compute, compute_sizes=sizes,
    )


def _relative_to(directory: Path, value: str | None) -> str | None:
    """A path written in the sweep file, made relative to the file's folder."""
    return None if value is None else str(directory / Path(value).expanduser())


def _profile_note(profile: str | None) -> str:
    return f" under profile {profile}" if profile else ""


def _summarise(variants: tuple[Variant, ...], limit: int = 3) -> str:
    """Why the variants were rejected, one rule at a time with the swept value it names and the
    variants it rejected: 'num_experts_per_token=9: num_experts_per_token must be in [1, num_experts=8) (top9)'."""
    by_reason: dict[str, list[Variant]] = {}
    for variant in variants:
        by_reason.setdefault(variant.reason or variant.status, []).append(variant)
    parts = []
    for reason, group in list(by_reason.items())[:limit]:
        names = [v.name for v in group]
        shown = ", ".join(names[:limit]) + (f" and {len(names) - limit} more" if len(names) > limit else "")
        parts.append(f"{_swept_values(reason, group)}{reason} ({shown})")
    rest = len(by_reason) - limit
    return "; ".join(parts) + (f"; and {rest} more reason{'s' if rest != 1 else ''}" if rest > 0 else "")



def _swept_values(reason: str, group: list[Variant]) -> str:
    """'field=value: ' for each swept field the reason names, when every variant of the group has that value."""
    first = group[0].overrides
    named = [k for k in first if re.search(rf"\b{re.escape(k)}\b", reason)
             and all(v.overrides.get(k) == first[k] for v in group)]
    return "".join(f"{k}={first[k]}: " for k in named)
