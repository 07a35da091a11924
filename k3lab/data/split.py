"""The train/validation split, by document.

A document goes to validation when the hash of its id, read as a number in
[0, 1), is below `val_fraction`. The rule depends on the id alone, so it is the
same on every machine and run, and raising `val_fraction` only moves documents
from train to validation. When the rule leaves a split empty, the document with
the smallest hash (for validation) or the largest (for train) is moved, so both
splits always hold at least one document.
"""

from __future__ import annotations

import hashlib

from k3lab.errors import UserError

DEFAULT_VAL_FRACTION = 0.02  # share of documents held out for validation

TRAIN, VAL = "train", "val"
SPLITS = (TRAIN, VAL)


def check_documents(source_spec: str, documents: int) -> None:
    """Refuse a source of fewer than 2 non-empty documents: each split needs one of its own. Both
    a dataset build and a `bpe:VOCAB` training check it (the training, before it starts: it
    cached a tokenizer of such a source, which the build then refused)."""
    if documents < 2:
        raise UserError(f"source '{source_spec}': {documents} non-empty document(s); "
                        "a train/validation split by document needs at least 2")


def doc_hash(doc_id: str) -> float:
    """A uniform number in [0, 1) derived from the document id (sha256, first 8 bytes)."""
    digest = hashlib.sha256(doc_id.encode("utf-8", errors="surrogatepass")).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def assign(doc_id: str, val_fraction: float, forced: dict[str, str] | None = None) -> str:
    """TRAIN or VAL for one document; `forced` maps ids moved to keep both splits non-empty."""
    if forced and doc_id in forced:
        return forced[doc_id]
    return VAL if doc_hash(doc_id) < val_fraction else TRAIN


class SplitTracker:
    """Watches the assignment of a pass and says which document to move if a split ends empty."""

    def __init__(self):
        self.counts = {TRAIN: 0, VAL: 0}
        self.lowest: tuple[float, str] | None = None
        self.highest: tuple[float, str] | None = None

    def add(self, doc_id: str, split: str) -> None:
        self.counts[split] += 1
        key = (doc_hash(doc_id), doc_id)
        self.lowest = key if self.lowest is None or key < self.lowest else self.lowest
        self.highest = key if self.highest is None or key > self.highest else self.highest

    def forced(self) -> dict[str, str]:
        """{doc_id: split} that fixes an empty split, or {} when both splits have documents."""
        if self.counts[VAL] == 0:
            return {self.lowest[1]: VAL}
        if self.counts[TRAIN] == 0:
            return {self.highest[1]: TRAIN}
        return {}
