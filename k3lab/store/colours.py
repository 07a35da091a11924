"""One colour per variant, the same in k3lab's plots and in the MLflow UI (`mlflow.runColor`).

The colour of a variant is its position in the sweep file's order of variants (the baseline
first): matplotlib's tab10, then the lighter half of tab20, so a sweep of up to 20 variants
has 20 distinct colours. Every seed of a variant gets the variant's colour.
"""

from __future__ import annotations

from typing import Iterable, Sequence

PALETTE = (
    "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",  # tab10
    "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf",
    "#aec7e8", "#ffbb78", "#98df8a", "#ff9896", "#c5b0d5",  # tab20's lighter shades
    "#c49c94", "#f7b6d2", "#c7c7c7", "#dbdb8d", "#9edae5",
)


def colour_at(index: int) -> str:
    """The colour of the index-th variant (0: the first in the sweep file)."""
    return PALETTE[index % len(PALETTE)]


def variant_colours(variants: Sequence[str]) -> dict[str, str]:
    """{variant: '#rrggbb'} for variants in the sweep file's order."""
    return {variant: colour_at(i) for i, variant in enumerate(dict.fromkeys(variants))}


def file_order(names: Iterable[str], variant_order: Sequence[str]) -> list[str]:
    """`names` in the sweep file's order; names the file does not list (any more) come last, sorted."""
    position = {name: i for i, name in enumerate(variant_order)}
    return sorted(set(names), key=lambda name: (position.get(name, len(position)), name))


def colours_in_file_order(variants: Sequence[str], variant_order: Sequence[str] = ()) -> dict[str, str]:
    """One colour per variant, the same in every plot and in the MLflow UI (the trials'
    `mlflow.runColor`): by the variant's place in the sweep file (`variant_order`), then the others."""
    return variant_colours(file_order({*variant_order, *variants}, variant_order))
