"""A rich progress bar for tokenizing (documents done of total, tokens so far), or nothing."""

from __future__ import annotations

import contextlib
import time
from typing import Callable, Iterator

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

Advance = Callable[[int, int], None]  # (documents, tokens) just finished


@contextlib.contextmanager
def progress_bar(enabled: bool, description: str, total_documents: int | None) -> Iterator[Advance]:
    """Yield `advance(documents, tokens)`; draws on stderr when `enabled` (total None: no ETA)."""
    if not enabled:
        yield lambda documents, tokens: None
        return
    console = Console(stderr=True)
    if not console.is_terminal:  # a log: a line before and one after, never a bar drawn once without its newline
        with _plain_lines(console, description) as advance:
            yield advance
        return
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn("docs"),
               TextColumn("{task.fields[tokens]:,} tokens"), TimeElapsedColumn(), TimeRemainingColumn())
    with Progress(*columns, console=console) as bar:
        task = bar.add_task(description, total=total_documents, tokens=0)
        done_tokens = 0

        def advance(documents: int, tokens: int) -> None:
            nonlocal done_tokens
            done_tokens += tokens
            bar.update(task, advance=documents, tokens=done_tokens)

        yield advance


@contextlib.contextmanager
def _plain_lines(console: Console, description: str) -> Iterator[Advance]:
    counts = {"documents": 0, "tokens": 0}
    started = time.perf_counter()
    console.print(f"{description} ...", markup=False, highlight=False, soft_wrap=True)

    def advance(documents: int, tokens: int) -> None:
        counts["documents"] += documents
        counts["tokens"] += tokens

    yield advance
    console.print(f"{description}: {counts['documents']:,} docs, {counts['tokens']:,} tokens in "
                  f"{time.perf_counter() - started:.0f} s", markup=False, highlight=False, soft_wrap=True)
