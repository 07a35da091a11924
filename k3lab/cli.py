"""The `k3lab` command.

Each command group is a module of `k3lab.commands`, imported here, with `register(subparsers)`,
which adds its sub-commands and sets `func` on them. A command module imports what its commands
need (torch, Ray, MLflow, pyarrow) inside them, so that `k3lab --help` and `--version` load none
of those.
`main` turns a `UserError` into one line on stderr and exit code 2.
"""

from __future__ import annotations

import argparse
import shlex
import sys

import k3lab
from k3lab.commands import data, export, kernels, report, sweep, train, ui, variants
from k3lab.errors import UserError

COMMANDS = (variants, data, train, sweep, report, ui, kernels, export)  # in `k3lab --help`'s order


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="k3lab", description="Architecture ablations of the Kimi K3 decoder.")
    parser.add_argument("--version", action="version", version=f"k3lab {k3lab.__version__}")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in COMMANDS:
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
