"""Sizes of a bundle: read from the command line, written for people, checked against a limit."""

from __future__ import annotations

import re
from pathlib import Path

from k3lab.errors import UserError

_SIZE_UNITS = {"": 1, "b": 1, "k": 2**10, "kib": 2**10, "kb": 10**3, "m": 2**20, "mib": 2**20, "mb": 10**6,
               "g": 2**30, "gib": 2**30, "gb": 10**9}


def parse_size(text: str) -> int:
    """'64MiB', '64M' (MiB), '500MB', '1.5GiB' or a number of bytes."""
    match = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([A-Za-z]*)\s*", str(text))
    if not match or match.group(2).lower() not in _SIZE_UNITS:
        raise UserError(f"cannot read the size {text!r}: use e.g. 64MiB, 500MB or 1.5GiB")
    return int(float(match.group(1)) * _SIZE_UNITS[match.group(2).lower()])


def human(size: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if size >= scale:
            return f"{size / scale:.1f} {unit}"
    return f"{size} B"


def check_size(files: dict[str, int], max_size: int | None) -> int:
    """The total of `files` (relative path -> bytes); a UserError when it is over `max_size`."""
    total = sum(files.values())
    if max_size is not None and total > max_size:
        largest = ", ".join(f"{Path(p).name} {human(s)}" for p, s in sorted(files.items(), key=lambda x: -x[1])[:3])
        raise UserError(f"the bundle is {human(total)} ({total} bytes), over --max-size {human(max_size)}; "
                        f"largest: {largest}")
    return total
