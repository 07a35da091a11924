"""A sweep's compute curves (`compute:` in the sweep file), for `k3lab.report.compute_multipliers`.

- `scales`: each baseline's stretched copies, `<baseline>_x1.5` trained 1.5x as long, appended
  to the sweep's variants (`compute_variants`).
- `sizes: AXIS, at: FLOPS`: the variants grouped into families, one per value of the other axes,
  each family a curve over the sizes, and each compared family paired with its baseline's family
  (`size_families`).
"""

from __future__ import annotations

from typing import Any

from k3lab.registry.axes import Axis, label
from k3lab.registry.keypath import SpecError
from k3lab.registry.sections import ComputeSpec
from k3lab.registry.model_variants import Variant


def compute_variants(compute: ComputeSpec | None, baselines: dict[str, str],
                     variants: tuple[Variant, ...]) -> tuple[Variant, ...]:
    """The points of each baseline's compute curve: the baseline stretched to each scale."""
    if compute is None or not compute.scales:
        return ()
    if not baselines:
        raise SpecError(("compute",), "needs a comparison (a baseline and a variant compared with it)")
    by_name = {v.name: v for v in variants}
    stretched = tuple(by_name[b].stretched(scale) for b in dict.fromkeys(baselines.values())
                      for scale in sorted(compute.scales))
    taken = next((v.name for v in stretched if v.name in by_name), None)
    if taken is not None:
        raise SpecError(("compute", "scales"), f"the baseline's stretched copy {taken} has the name of a variant of "
                                               "the file; rename that variant")
    return stretched


def size_families(compute: ComputeSpec | None, axes: tuple[Axis, ...], baselines: dict[str, str],
                  variants: tuple[Variant, ...]) -> dict[str, Any] | None:
    """With `compute: {sizes: AXIS, at: FLOPS}`: {"axis", "at", "families": family -> its variants
    by size, "baselines": compared family -> its baseline's family}; a family is named by its values
    of the other axes (e.g. attnres_full)."""
    if compute is None or compute.sizes is None:
        return None
    axis = next((a for a in axes if a.name == compute.sizes), None)
    if axis is None:
        raise SpecError(("compute", "sizes"), f"must name one of the sweep's axes "
                                              f"({', '.join(a.name for a in axes) or 'none'}), got {compute.sizes!r}")
    if len(axis.values) < 2:
        raise SpecError(("compute", "sizes"), f"the axis {axis.name} needs at least two sizes to fit a curve over")
    family = {v.name: label({k: x for k, x in v.overrides.items() if k != axis.name})
              for v in variants if v.ok and v.stretches is None}
    families: dict[str, list[str]] = {}
    for name, fam in family.items():
        families.setdefault(fam, []).append(name)
    paired: dict[str, str] = {}
    for variant, baseline in baselines.items():
        if family[variant] == family[baseline]:
            raise SpecError(("compute", "sizes"), f"{axis.name} is the axis the variants are compared along; "
                                                  "name the axis that sets the model's size")
        paired.setdefault(family[variant], family[baseline])
    return {"axis": axis.name, "at": compute.at, "families": families, "baselines": paired}
