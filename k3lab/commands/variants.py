"""`k3lab variants FILE [--profile NAME] [--json]`: list a sweep's variants."""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING, Any

from k3lab.registry.sweep_cli import add_profile_argument, load_sweep_for, print_plan, print_variant_table

if TYPE_CHECKING:  # imported where used: `k3lab --help` registers this command without torch
    from k3lab.registry.sweep_file import Sweep
    from k3lab.registry.model_variants import Variant


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("variants", help="expand a sweep file into model variants and list them")
    parser.add_argument("file", help="sweep YAML file, e.g. experiments/attnres_block.yaml")
    add_profile_argument(parser)
    parser.add_argument("--json", action="store_true", help="print a JSON list instead of a table")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from rich.console import Console

    sweep = load_sweep_for(args.file, args.profile)
    if args.json:
        print(json.dumps([_json(sweep, v) for v in sweep.variants], indent=2))
        return 0
    console = Console(file=sys.stdout, width=max(Console().width, 140))
    print_plan(console, sweep, measured_rates(sweep))
    print_packing(console, sweep)
    print_variant_table(console, sweep)
    return 0


def measured_rates(sweep: Sweep, cache_dir: str | None = None) -> dict[str, float]:
    """{GPU model: the aggregate tokens/s a sweep of these trials measured there} (`k3lab.runner.runtime.throughput`)."""
    from k3lab.runner.runtime.kernel_cache import resolve_kernel_cache
    from k3lab.runner.runtime.throughput import measured_rates as rates

    if not sweep.resources.gpu and not sweep.resources.gpus_per_trial:
        return {}
    return {gpu: entry["tokens_per_s"] for gpu, entry in
            rates(sweep, resolve_kernel_cache(cache_dir, sweep.kernel_cache)).items()}


def print_packing(console, sweep: Sweep, cache_dir: str | None = None) -> None:
    """The trials at once per GPU model that has measured this sweep's variants (`k3lab.runner.runtime.memory`)."""
    from k3lab.runner.runtime.kernel_cache import resolve_kernel_cache
    from k3lab.runner.runtime.memory import packing_lines

    for line in packing_lines(sweep, resolve_kernel_cache(cache_dir, sweep.kernel_cache)):
        console.print(line, markup=False, highlight=False, soft_wrap=True)


def _json(sweep: Sweep, variant: Variant) -> dict[str, Any]:
    from k3lab.registry.counts import count

    data = variant.to_json()
    if variant.config is not None:
        counts = count(variant.config, sweep.train.seq_len)
        data["counts"] = {"total": counts.total, "active": counts.active, "embedding": counts.embedding,
                          "flops_per_token": counts.flops_per_token, "seq_len": counts.seq_len}
    return data
