"""What the commands that read a sweep file share (`k3lab variants`, `sweep`, `report`,
`kernels warm`: see `k3lab.commands`): the `--profile` flag, loading the sweep under it, and
printing its plan and its variant table.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # imported where used: `k3lab --help` loads this module without torch
    from rich.console import Console
    from rich.table import Table

    from k3lab.registry.sweep_file import Sweep
    from k3lab.registry.model_variants import Variant


def add_profile_argument(parser: argparse.ArgumentParser) -> None:
    """`--profile`, the same for every command that reads a sweep file."""
    parser.add_argument("--profile", default="auto",
                        help="a profile of the sweep file; auto (default): gpu when this machine has CUDA, "
                             "else cpu, when the file has them; none: the file's top-level settings")


def load_sweep_for(path: str, profile: str) -> Sweep:
    """The sweep in `path` under the profile a `--profile` flag names (see `resolve_profile`)."""
    from k3lab.registry.sweep_file import load_sweep, resolve_profile

    return load_sweep(path, resolve_profile(path, profile))  # a UserError when nothing is valid


def print_plan(console: Console, sweep: Sweep, measured: dict[str, float] | None = None) -> None:
    """The plan header and notes (see `k3lab.registry.plan`); measured: {GPU model: tokens/s}."""
    from rich.markup import escape

    from k3lab.registry.plan import plan_lines

    for line in plan_lines(sweep, measured):
        console.print(escape(line))


def print_variant_table(console: Console, sweep: Sweep) -> None:
    """`variant_table`, as wide as it needs to be: no id or override is wrapped inside (`variant_table`),
    and no column cropped at the right, as rich does to a table whose columns do not fit."""
    table = variant_table(sweep)
    width = console.width
    while width < 1000 and cropped(table, width):
        width += 2
    width, console.width = console.width, width  # print(width=) is capped at console.width
    try:
        console.print(table)
    finally:
        console.width = width


def cropped(table: Table, width: int) -> bool:
    """Whether `table` printed `width` columns wide loses the right end of a line."""
    import io

    from rich.console import Console

    console = Console(file=io.StringIO(), width=width, color_system=None)
    console.print(table)
    return any(line and line[-1] not in "┓┃┫┩│┤┘" for line in console.file.getvalue().splitlines())


def variant_table(sweep: Sweep) -> Table:
    """A rich table of the sweep's variants with their sizes and status (`print_plan` heads it)."""
    from rich.markup import escape
    from rich.table import Table

    table = Table()
    # an id and an override never wrap inside (`attn_res_block_size=16`, not `=1|6`): overrides wrap between them
    widest = {"id": max(len(v.id) for v in sweep.variants),
              "overrides": max((len(part) + 1 for v in sweep.variants for part in _override_parts(v)), default=0)}
    for header, justify in (("id", "left"), ("name", "left"), ("overrides", "left"), ("layers", "left"),
                            ("total", "right"), ("active", "right"), ("FLOPs/tok", "right"), ("status", "left")):
        table.add_column(header, justify=justify, overflow="fold", min_width=widest.get(header))
    for variant in sweep.variants:
        table.add_row(variant.id, escape(variant.name), escape(_overrides(variant)), *_sizes(sweep, variant),
                      _status(variant))
    return table


def _overrides(variant: Variant) -> str:
    return ", ".join(_override_parts(variant)) or "(base)"


def _override_parts(variant: Variant) -> list[str]:
    """`field=value` per swept field, then the fields parameter matching resized."""
    parts = [f"{k}={_show(v)}" for k, v in variant.overrides.items()]
    parts += [f"{k}={v} (matched)" for k, v in variant.matched.items()]
    return parts + ([f"{variant.compute_scale:g}x tokens"] if variant.stretches else [])


def _show(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, tuple):
        return "".join(str(v)[0].upper() for v in value)
    return str(value)


def _sizes(sweep: Sweep, variant: Variant) -> tuple[str, str, str, str]:
    from k3lab.registry.counts import count

    if variant.config is None:
        return "-", "-", "-", "-"
    counts = count(variant.config, sweep.train.seq_len)
    return variant.config.schedule, _human(counts.total), _human(counts.active), _human(counts.flops_per_token)


def _status(variant: Variant) -> str:
    from rich.markup import escape

    from k3lab.registry.model_variants import OK, REJECTED

    if variant.status == OK:
        return "[green]ok[/green]"
    colour = "red" if variant.status == REJECTED else "yellow"
    text = f"rejected: {variant.reason}" if variant.status == REJECTED else variant.reason
    return f"[{colour}]{escape(text)}[/{colour}]"


def _human(n: int) -> str:
    for unit, size in (("G", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= size:
            return f"{n / size:.2f}{unit}"
    return str(n)
