"""Errors that point at a key path inside a sweep file.

Everything the registry validates raises `SpecError(path, message)`, where
`path` is a tuple of mapping keys and list indices, e.g. `("axes",
"attn_res_block_size", 2)`. The loader prefixes the file name and turns it
into a one-line `k3lab.errors.UserError`. The spec validators raise
`k3lab.errors.FieldError`, which names only the field.
"""

from __future__ import annotations

import re

Path = tuple  # of str (mapping keys) and int (list indices)


class SpecError(ValueError):
    """One or more problems, each at a key path of a sweep document."""

    def __init__(self, path: Path, message: str, *more: tuple[Path, str]) -> None:
        self.problems = ((tuple(path), message),) + tuple((tuple(p), m) for p, m in more)
        super().__init__("; ".join(_describe(p, m) for p, m in self.problems))

    @property
    def path(self) -> Path:
        return self.problems[0][0]

    @classmethod
    def of(cls, problems) -> "SpecError":
        (path, message), *more = problems
        return cls(path, message, *more)

    def mapped(self, change) -> "SpecError":
        """The same problems with every path passed through `change(path)`."""
        return SpecError.of([(change(p), m) for p, m in self.problems])

    def under(self, *prefix) -> "SpecError":
        """The same problems, seen from a document that holds this one at `prefix`."""
        return self.mapped(lambda path: tuple(prefix) + path)


def _describe(path: Path, message: str) -> str:
    return f"{format_path(path)}: {message}" if path else message


def format_path(path: Path) -> str:
    """('axes', 'x', 2, 'y') -> 'axes.x[2].y'."""
    text = ""
    for part in path:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text


_CATTRS_PART = re.compile(r"\.([A-Za-z_][A-Za-z0-9_]*)|\[(-?\d+)\]|\[(['\"])(.*?)\3\]")


def parse_cattrs_path(text: str) -> Path:
    """'$.axes['x'][2]' (cattrs' notation) -> ('axes', 'x', 2)."""
    text = text.removeprefix("$")
    parts: list = []
    for match in _CATTRS_PART.finditer(text):
        name, index, _, key = match.groups()
        parts.append(name if name is not None else int(index) if index is not None else key)
    return tuple(parts)
