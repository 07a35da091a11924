"""Generated sections in markdown files: each marked, each replaced whole on the next write.

Benchmarks (docs/benchmarks.md) and sweep results (docs/results.md) are written by the
code that measured them, never by hand; a marked section keeps hand-written text around
it intact.
"""

from __future__ import annotations

import re
from pathlib import Path

from k3lab.errors import UserError


def check_section_file(path: Path, flag: str) -> None:
    """`replace_section` can add a section to `path`: a file or none yet, and text; checked before
    the work whose section it is (a folder, or bytes that are not UTF-8, failed after it)."""
    if path.is_dir():
        raise UserError(f"{flag} {path}: is a folder, not a markdown file")
    if not path.exists():
        return
    try:
        path.read_text(encoding="utf-8")
    except UnicodeDecodeError as error:
        raise UserError(f"{flag} {path}: not UTF-8 text (byte {error.object[error.start]:#04x} at offset "
                        f"{error.start}): not a markdown file to add a section to") from None
    except OSError as error:
        raise UserError(f"{flag} {path}: cannot read it ({error.strerror})") from None


def replace_section(path: str | Path, name: str, body: str, header: str = "") -> bool:
    """Write `body` as the section `name` of `path`, replacing an earlier one of that name
    (returns True) or added at the end (False)."""
    path = Path(path)
    section = f"<!-- section:{name} -->\n{body.strip()}\n<!-- /section:{name} -->\n"
    text = path.read_text(encoding="utf-8") if path.exists() else header
    pattern = re.compile(rf"<!-- section:{re.escape(name)} -->.*?<!-- /section:{re.escape(name)} -->\n", re.S)
    replaced = bool(pattern.search(text))
    if replaced:
        text = pattern.sub(lambda _: section, text)
    else:
        text = text.rstrip("\n") + ("\n\n" if text.strip() else "") + section
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return replaced


def table_lines(headers: list[str], rows: list[list[str]]) -> list[str]:
    """A markdown table: the header row, the rule under it and one line per row of cells."""
    return (["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
            + ["| " + " | ".join(row) + " |" for row in rows])
