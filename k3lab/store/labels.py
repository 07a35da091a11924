"""Short, distinct display names of a sweep's variants, for where the MLflow UI cuts names short.

MLflow 3.18's runs list shows about 22 characters of a run name and a group row about 12 of its
label ("Group: ffn_latent_m..."), so the variants of a grid (`ffn_latent_moe_top2_shared1`,
`ffn_moe_top2_shared1`, ...) cannot be told apart there. A variant's label drops the parts of its
name every sibling shares (the axis names and values common to the grid: `ffn`, `moe`) and keeps
the values that differ, spaced: `latent top2 shared1`, `top2 shared1`, `dense` (its run label,
RUN_FITS); where that is still too long for a group row (FITS), a value's name shrinks to its
first letter: `latent t2 s1`, `t2 s1` (its group label). Where every name fits already
(`attnres_bs1`), or shortening would leave one empty or two alike, the labels are the names.

    trial run     named `<run label>-s<seed>`; k3lab.variant_label = its group label (the loss view
                  groups by it); k3lab.full_name = `<variant>-s<seed>` where the label is not the name
    variant run   named `<run label> vs <baseline's run label>: <verdict>, ...`; k3lab.variant_label;
                  k3lab.full_name = the name with the variants' full names

The full names stay in `k3lab.variant_name` (and `k3lab.compared_with`), which k3lab reads.
"""

from __future__ import annotations

import re
from typing import Sequence

LABEL = "k3lab.variant_label"  # a trial's or variant run's variant, as its display name shows it
FULL_NAME = "k3lab.full_name"  # a run's name with its variants' full names, where the shown one is shortened
FITS = 12  # characters of a group label the runs list shows
RUN_FITS = 20  # of a run name, its seed's `-sN` aside
VALUE = re.compile(r"^([A-Za-z]+)(\d[\w.]*)$")  # a value by its axis's short name: top2, shared1, L12


def short_labels(names: Sequence[str], fits: int = FITS) -> dict[str, str]:
    """{variant name: its label} for the variants of one sweep (`names`: all of them, siblings):
    the names where they fit in `fits` characters, else without the parts all share, else with
    each value's name shortened to its first letter (the module docstring)."""
    names = list(dict.fromkeys(names))
    same = {name: name for name in names}
    if all(len(name) <= fits for name in names):
        return same
    parts = {name: name.split("_") for name in names}
    several = [set(p) for p in parts.values() if len(p) > 1]
    common = set.intersection(*several) if len(several) > 1 else set()
    kept = {name: [token for token in tokens if token not in common] for name, tokens in parts.items()}
    labels = {name: " ".join(kept[name]) if kept[name] and len(kept[name]) < len(tokens) else name
              for name, tokens in parts.items()}
    if any(len(label) > fits for label in labels.values()):
        shrunk = {name: " ".join(VALUE.sub(lambda m: m.group(1)[0] + m.group(2), token) for token in label.split(" "))
                  if " " in label else label for name, label in labels.items()}
        labels = shrunk if distinct(shrunk) else labels
    return labels if distinct(labels) else same


def run_labels(names: Sequence[str]) -> dict[str, str]:
    """The labels of run names, which the runs list shows longer than a group's."""
    return short_labels(names, RUN_FITS)


def distinct(labels: dict[str, str]) -> bool:
    return len(set(labels.values())) == len(labels)


def trial_run_name(label: str, seed: int) -> str:
    return f"{label}-s{seed}"
