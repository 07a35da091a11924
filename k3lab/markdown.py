"""Generated sections in markdown files: each marked, each replaced whole on the next write.

Benchmarks (docs/benchmarks.md) and sweep results (docs/results.md) are written by the
code that measured them, never by hand; a marked section keeps hand-written text around
it intact.
"""

from __future__ import annotations

import re
from pathlib import Path


def replace_section(path: str | Path, name: str, body: str, header: str = "") -> bool:
    """Write `body` as the section `name` of `path`, replacing an earlier one of that name
    (returns True) or added at the end (False)."""
    path = Path(path)
    section = f"<!-- section:{name} -->\n{body.strip()}\n<!-- /section:{name} -->\n"
    text = path.read_text() if path.exists() else header
    pattern = re.compile(rf"<!-- section:{re.escape(name)} -->.*?<!-- /section:{re.escape(name)} -->\n", re.S)
    replaced = bool(pattern.search(text))
    if replaced:
        text = pattern.sub(lambda _: section, text)
    else:
        text = text.rstrip("\n") + ("\n\n" if text.strip() else "") + section
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return replaced
