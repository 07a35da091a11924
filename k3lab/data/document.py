"""One document of a corpus: the unit the train/validation split hashes and the tokenizer reads."""

from __future__ import annotations

from typing import NamedTuple


class Document(NamedTuple):
    id: str
    text: str
