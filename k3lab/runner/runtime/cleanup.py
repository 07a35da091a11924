"""What a refused or early-stopped sweep made, and removes again: a file (its log, an empty store)
and the folders created for it, so that a sweep that never ran leaves nothing behind."""

from __future__ import annotations

import contextlib
from pathlib import Path


def missing_from(path: Path) -> list[Path]:
    """`path` and the folders above it that do not exist yet, deepest first: what writing it makes."""
    missing = []
    while not path.exists() and path != path.parent:
        missing.append(path)
        path = path.parent
    return missing


def remove_made(paths: list[Path]) -> None:
    """Remove what `missing_from` listed, deepest first: the file, then each folder left empty."""
    for path in paths:
        with contextlib.suppress(OSError):  # a folder something else has written to since stays
            if path.is_dir():
                path.rmdir()
            else:
                path.unlink(missing_ok=True)
