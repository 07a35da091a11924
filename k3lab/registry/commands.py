"""`k3lab variants FILE [--profile NAME] [--json]`: list a sweep's variants."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from k3lab.registry.counts import count
from k3lab.registry.sweep import Sweep, load_sweep
from k3lab.registry.variants import OK, REJECTED, Variant


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("variants", help="expand a sweep file into model variants and list them")
    parser.add_argument("file", help="sweep YAML file, e.g. experiments/attnres_block.yaml")
    parser.add_argument("--profile", default=None, help="a profile of the sweep file, e.g. cpu or gpu")
    parser.add_argument("--json", action="store_true", help="print a JSON list instead of a table")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    sweep = load_sweep(args.file, args.profile)  # a UserError when nothing is valid
    if args.json:
        print(json.dumps([_json(sweep, v) for v in sweep.variants], indent=2))
    else:
        Console(file=sys.stdout, width=max(Console().width, 140)).print(variant_table(sweep))
    return 0


def variant_table(sweep: Sweep) -> Table:
    """A rich table of the sweep's variants with their sizes and status."""
    trials = len(sweep.trials)
    title = (f"{sweep.name} ({sweep.profile or 'default'} profile): {len(sweep.valid_variants)} variants x "
             f"{len(sweep.seeds)} seeds = {trials} trials, {sweep.train.steps} steps of "
             f"{sweep.train.tokens_per_step:,} tokens")
    table = Table(title=escape(title), title_justify="left")
    for header, justify in (("id", "left"), ("name", "left"), ("overrides", "left"), ("layers", "left"),
                            ("total", "right"), ("active", "right"), ("FLOPs/tok", "right"), ("status", "left")):
        table.add_column(header, justify=justify, overflow="fold")
    for variant in sweep.variants:
        table.add_row(variant.id, escape(variant.name), escape(_overrides(variant)), *_sizes(sweep, variant),
                      _status(variant))
    return table


def _overrides(variant: Variant) -> str:
    parts = [f"{k}={_show(v)}" for k, v in variant.overrides.items()]
    parts += [f"{k}={v} (matched)" for k, v in variant.matched.items()]
    return ", ".join(parts) or "(base)"


def _show(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, tuple):
        return "".join(str(v)[0].upper() for v in value)
    return str(value)


def _sizes(sweep: Sweep, variant: Variant) -> tuple[str, str, str, str]:
    if variant.config is None:
        return "-", "-", "-", "-"
    counts = count(variant.config, sweep.train.seq_len)
    return variant.config.schedule, _human(counts.total), _human(counts.active), _human(counts.flops_per_token)


def _status(variant: Variant) -> str:
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


def _json(sweep: Sweep, variant: Variant) -> dict[str, Any]:
    data = variant.to_json()
    if variant.config is not None:
        counts = count(variant.config, sweep.train.seq_len)
        data["counts"] = {"total": counts.total, "active": counts.active, "embedding": counts.embedding,
                          "flops_per_token": counts.flops_per_token, "seq_len": counts.seq_len}
    return data
