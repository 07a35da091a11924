"""Write a benchmark's measured results into docs/benchmarks.md, one marked section per benchmark.

Each section is replaced whole on every run, so the file always holds what the last run
of that benchmark measured, with the command that produced it and the machine it ran on.
"""

from __future__ import annotations

import datetime
import os
import platform
import re
import sys
from pathlib import Path

import torch

DOC = Path(__file__).resolve().parent.parent / "docs" / "benchmarks.md"
HEADER = "# Benchmarks\n\nEvery section below is written by the benchmark it names; none is typed by hand.\n"


def machine() -> str:
    if torch.cuda.is_available():
        device = torch.cuda.get_device_name()
    else:
        device = f"CPU ({platform.processor() or platform.machine()}, {os.cpu_count()} cores, {torch.get_num_threads()} threads)"
    return f"{device}; torch {torch.__version__}; Python {platform.python_version()}"


def write_section(name: str, body: str, command: str | None = None, doc: Path = DOC) -> None:
    command = command or "python " + " ".join(sys.argv)
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    section = (f"<!-- bench:{name} -->\n## {name}\n\nCommand: `{command}`  \nMachine: {machine()}  \n"
               f"Measured: {date}\n\n{body.strip()}\n<!-- /bench:{name} -->\n")
    text = doc.read_text() if doc.exists() else HEADER
    pattern = re.compile(rf"<!-- bench:{re.escape(name)} -->.*?<!-- /bench:{re.escape(name)} -->\n", re.S)
    text = pattern.sub(lambda _: section, text) if pattern.search(text) else text.rstrip("\n") + "\n\n" + section
    doc.parent.mkdir(parents=True, exist_ok=True)
    doc.write_text(text)
