"""Arrow token shards: one flat column "tokens" per file, written once, memory-mapped after.

A split is a sequence of shard files `{split}-{index:05d}.arrow` (Arrow IPC
file format, one record batch each, uint16 when the vocabulary fits, else
uint32). Documents follow each other, each ended by the end-of-document id.
Tokens go first to a raw scratch file, so writing needs little memory
however large a shard is; the Arrow file is made from a memory map of it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa

COLUMN = "tokens"
DEFAULT_SHARD_TOKENS = 1 << 28  # 512 MiB of uint16 per file


def token_dtype(vocab_size: int) -> np.dtype:
    """uint16 when every id fits (vocab_size <= 65536), else uint32."""
    return np.dtype(np.uint16) if vocab_size <= 1 << 16 else np.dtype(np.uint32)


class ShardWriter:
    """Appends token arrays to one split's shards in `directory`; a new shard starts
    at the first document boundary after `shard_tokens` tokens."""

    def __init__(self, directory: Path, split: str, dtype: np.dtype, shard_tokens: int = DEFAULT_SHARD_TOKENS):
        self.directory, self.split, self.dtype, self.shard_tokens = Path(directory), split, dtype, shard_tokens
        self.shards: list[dict] = []
        self._raw = None
        self._count = 0

    def append(self, ids: np.ndarray) -> None:
        """Append one document's ids (1-D, end-of-document id included)."""
        if self._raw is None:
            self._raw = open(self._raw_path(), "wb")
        ids.astype(self.dtype, copy=False).tofile(self._raw)
        self._count += len(ids)
        if self._count >= self.shard_tokens:
            self._close_shard()

    def finish(self) -> list[dict]:
        """Write the last shard; returns [{"file": name, "tokens": n}, ...]."""
        if self._raw is not None:
            self._close_shard()
        return self.shards

    def _raw_path(self) -> Path:
        return self.directory / f".{self.split}-{len(self.shards):05d}.raw"

    def _close_shard(self) -> None:
        self._raw.close()
        raw, name = self._raw_path(), f"{self.split}-{len(self.shards):05d}.arrow"
        tokens = np.memmap(raw, dtype=self.dtype, mode="r", shape=(self._count,))
        batch = pa.record_batch([pa.array(tokens)], names=[COLUMN])
        with pa.OSFile(str(self.directory / name), "wb") as sink, pa.ipc.new_file(sink, batch.schema) as writer:
            writer.write_batch(batch)
        del batch, tokens
        raw.unlink()
        self.shards.append({"file": name, "tokens": self._count})
        self._raw, self._count = None, 0


def read_shard(path: Path) -> np.ndarray:
    """A read-only numpy view of one shard's tokens, backed by a memory map (no copy)."""
    reader = pa.ipc.open_file(pa.memory_map(str(path), "r"))
    arrays = [reader.get_batch(i).column(0).to_numpy(zero_copy_only=True) for i in range(reader.num_record_batches)]
    return arrays[0] if len(arrays) == 1 else np.concatenate(arrays)


def read_split(directory: Path, shards: list[dict]) -> np.ndarray:
    """One flat token array for a split: a zero-copy view when it has one shard, else a
    concatenated copy in memory."""
    arrays = [read_shard(Path(directory) / shard["file"]) for shard in shards]
    return arrays[0] if len(arrays) == 1 else np.concatenate(arrays)
