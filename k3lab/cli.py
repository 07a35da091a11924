"""The `k3lab` command.

Each command group lives next to the code it drives and exposes
`register(subparsers)`, which adds its sub-commands and sets `func` on them. A command
module imports what its commands need (torch, Ray, MLflow, pyarrow) inside them, so that
`k3lab --help` and `--version` load none of those.
`main` turns a `UserError` into one line on stderr and exit code 2.
"""

from __future__ import annotations

import argparse
import importlib
import shlex
import sys

import k3lab
from k3lab.errors import UserError

COMMAND_MODULES = (
    "k3lab.registry.commands",  # k3lab variants
    "k3lab.data.commands",  # k3lab data prepare|info
    "k3lab.commands.runs",  # k3lab train|sweep|report
    "k3lab.commands.ui",  # k3lab ui
    "k3lab.commands.kernels",  # k3lab kernels warm|info
    "k3lab.bundle",  # k3lab bundle
    "k3lab.commands.export",  # k3lab export
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="k3lab", description="Architecture ablations of the Kimi K3 decoder.")
    parser.add_argument("--version", action="version", version=f"k3lab {k3lab.__version__}")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as error:
            if not (name == error.name or name.startswith(f"{error.name}.")):
                raise  # a real missing dependency, not an absent command group
            continue
        module.register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    args.command_line = shlex.join(["k3lab", *(sys.argv[1:] if argv is None else argv)])  # for the records
    try:
        result = args.func(args)
    except UserError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    return int(result or 0)


if __name__ == "__main__":
    sys.exit(main())
