"""The `k3lab ...` commands that k3lab prints for a user to run next (resume, overwrite, close, ...).

Every printed command is built here, quoted for a shell, so that run as printed from the folder
where it was printed it acts on what it names: the options that picked the sweep, the store or the
data (`--profile`, `--storage`, `--tracking-uri`, ...) travel with it. A leaf module: any layer
may import it.
"""

from __future__ import annotations

import shlex
from typing import Any


def command(*words: Any, **options: Any) -> str:
    """`k3lab WORDS... --option value ...` for a shell: an option's `_` is written `-`; None and
    False options are left out, True ones are a bare flag."""
    return shlex.join(["k3lab", *(str(word) for word in words), *option_words(**options)])


def option_words(**options: Any) -> list[str]:
    """The options as command-line words, in their order (see `command`)."""
    words: list[str] = []
    for name, value in options.items():
        if value is None or value is False:
            continue
        flag = "--" + name.replace("_", "-")
        words += [flag] if value is True else [flag, str(value)]
    return words
