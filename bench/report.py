"""Write a benchmark's measured results into docs/benchmarks.md, one marked section per benchmark.

Each section is replaced whole on every run, so the file always holds what the last run
of that benchmark measured, with the command that produced it and the machine it ran on.
"""

from __future__ import annotations

import datetime
import os
import platform
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from k3lab.report.markdown import replace_section  # noqa: E402

DOC = Path(__file__).resolve().parent.parent / "docs" / "benchmarks.md"
HEADER = "# Benchmarks\n\nEvery section below is written by the benchmark it names; none is typed by hand.\n"


def machine() -> str:
    if torch.cuda.is_available():
        device = torch.cuda.get_device_name()
    else:
        device = f"CPU ({platform.processor() or platform.machine()}, {os.cpu_count()} cores, {torch.get_num_threads()} threads)"
    return f"{device}; torch {torch.__version__}; Python {platform.python_version()}"


def write_section(name: str, body: str, command: str | None = None, doc: Path = DOC,
                  measured_on: str | None = None) -> None:
    """measured_on: where and when the figures were measured, when not here and now (a table
    written from saved logs of another machine)."""
    command = command or "python " + " ".join(sys.argv)
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    where = (f"Machine: {machine()}  \nMeasured: {date}" if measured_on is None
             else f"Measured: {measured_on}  \nWritten: {date} on {machine()}")
    text = f"## {name}\n\nCommand: `{command}`  \n{where}\n\n{body.strip()}\n"
    replace_section(doc, name, text, header=HEADER)


def check_stores(parser, stores: list[str]) -> list[tuple[str, str]]:
    """The (label, path) of each LABEL=PATH argument naming an MLflow SQLite store of one sweep;
    a parser error for any other."""
    pairs = []
    for store in stores:
        label, _, path = store.partition("=")
        if not label or not path or not Path(path).is_file():
            parser.error(f"{store!r}: expected LABEL=PATH with PATH an MLflow SQLite file")
        pairs.append((label, path))
    return pairs


def simulation_main(doc: str, table, section: str, sweeps: int, doc_path: Path, command: str | None = None) -> None:
    """The command line of a simulation benchmark: --sweeps, --seed, and --write to put
    `table(sweeps, seed)` into `doc_path`'s `section`; `doc` is the script's docstring."""
    import argparse

    parser = argparse.ArgumentParser(description=doc.split("\n")[0])
    parser.add_argument("--sweeps", type=int, default=sweeps)
    parser.add_argument("--seed", type=int, default=2026)
    parser.add_argument("--write", action="store_true",
                        help=f"write the table into {doc_path.relative_to(doc_path.parents[1])}")
    args = parser.parse_args()
    body = table(args.sweeps, args.seed)
    print(body)
    if args.write:
        write_section(section, body, command, doc=doc_path)

