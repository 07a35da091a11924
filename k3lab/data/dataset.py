"""A prepared dataset on disk: its manifest, memory-mapped token splits, and tokenizer."""

from __future__ import annotations

import functools
import json
import math
from pathlib import Path

import numpy as np

from k3lab.data.shards import read_split
from k3lab.data.split import TRAIN, VAL
from k3lab.data.tokenizer import ByteTokenizer, FileTokenizer
from k3lab.errors import UserError

MANIFEST = "manifest.json"
TOKENIZER_FILE = "tokenizer.json"


class Dataset:
    """A prepared dataset directory (see `prepare_dataset`).

    `train_tokens` / `val_tokens` are flat read-only numpy arrays (uint16 or
    uint32) memory-mapped from the shards; documents follow each other, each
    ended by `eot_id`. `cached` says whether `prepare_dataset` found it already
    built. Open one by path in other processes with `Dataset.open(path)`.
    """

    def __init__(self, path: Path, manifest: dict, cached: bool = False):
        self.path, self.manifest, self.cached = Path(path), manifest, cached
        self._arrays: dict[str, np.ndarray] = {}

    @classmethod
    def open(cls, path: str | Path, cached: bool = True) -> "Dataset":
        path = Path(path)
        try:
            manifest = json.loads((path / MANIFEST).read_text())
        except FileNotFoundError:
            raise UserError(f"dataset '{path}': no {MANIFEST} (not a prepared dataset)") from None
        return cls(path, manifest, cached)

    @property
    def vocab_size(self) -> int:
        return self.manifest["vocab_size"]

    @property
    def eot_id(self) -> int:
        return self.manifest["eot_id"]

    @functools.cached_property
    def tokenizer(self) -> ByteTokenizer | FileTokenizer:
        """The tokenizer the shards were made with (a copy of tokenizer.json lives in the dataset)."""
        if self.manifest["tokenizer"] == "byte":
            return ByteTokenizer()
        return FileTokenizer(self.path / TOKENIZER_FILE)

    def tokens(self, split: str) -> np.ndarray:
        """The flat token array of `split` ("train" or "val"), shape (N,)."""
        if split not in self._arrays:
            self._arrays[split] = read_split(self.path, self.manifest["splits"][split]["shards"])
        return self._arrays[split]

    @property
    def train_tokens(self) -> np.ndarray:
        return self.tokens(TRAIN)

    @property
    def val_tokens(self) -> np.ndarray:
        return self.tokens(VAL)

    def bytes_per_token(self, split: str = VAL) -> float:
        """UTF-8 bytes of the split's text per token (end-of-document ids counted as tokens)."""
        info = self.manifest["splits"][split]
        return info["bytes"] / info["tokens"]

    def bits_per_byte(self, loss_nats: float, split: str = VAL) -> float:
        """Mean per-token cross-entropy (nats) converted to bits per UTF-8 byte of `split`:
        loss / ln 2 * tokens / bytes, comparable across tokenizers."""
        return loss_nats / math.log(2) / self.bytes_per_token(split)
