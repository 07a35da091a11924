"""Random training windows and a fixed validation set, seeded, resumable and sharded by rank.

A window is seq_len + 1 consecutive tokens starting anywhere in the flat
split (windows may cross document boundaries; the end-of-document id marks
them); x is its first seq_len tokens, y the last seq_len.

Step s draws the global batch of batch_size * world_size distinct window
starts from a generator seeded by (seed, s) and gives rank r the slice
[r * batch_size, (r + 1) * batch_size): ranks never share a window in a step,
and the state needed to resume is just (seed, step).
"""

from __future__ import annotations

from typing import Iterator

import numpy as np
import torch

from k3lab.errors import UserError

Batch = tuple[torch.Tensor, torch.Tensor]  # x, y: int64 (batch_size, seq_len)


class BatchSampler:
    """Batches (x, y) of shape (batch_size, seq_len), int64, from a 1-D token array."""

    def __init__(self, tokens: np.ndarray, batch_size: int, seq_len: int, seed: int = 0,
                 rank: int = 0, world_size: int = 1, pin_memory: bool = True):
        if tokens.ndim != 1:
            raise ValueError(f"tokens must be 1-D, got shape {tokens.shape}")
        if batch_size < 1 or seq_len < 1 or not 0 <= rank < world_size:
            raise ValueError(f"need batch_size, seq_len >= 1 and 0 <= rank < world_size, got "
                             f"{batch_size}, {seq_len}, rank {rank}, world_size {world_size}")
        if len(tokens) < seq_len + 1:
            raise UserError(f"split has {len(tokens)} tokens, fewer than seq_len + 1 = {seq_len + 1}")
        self.tokens, self.batch_size, self.seq_len, self.seed = tokens, batch_size, seq_len, seed
        self.rank, self.world_size, self.pin_memory = rank, world_size, pin_memory
        self.step = 0  # batches drawn so far
        self.n_windows = len(tokens) - seq_len  # valid starts: 0 .. len - seq_len - 1
        self._offsets = np.arange(seq_len + 1, dtype=np.int64)

    def starts(self, step: int) -> np.ndarray:
        """This rank's window starts for `step`, shape (batch_size,); a pure function of (seed, step)."""
        rng = np.random.Generator(np.random.PCG64([self.seed, step]))
        total = self.batch_size * self.world_size
        global_starts = rng.choice(self.n_windows, size=total, replace=total > self.n_windows)
        return global_starts[self.rank * self.batch_size:(self.rank + 1) * self.batch_size]

    def next_batch(self, device: torch.device | str | None = None) -> Batch:
        """The next training batch, on `device` (pinned + non-blocking copy for CUDA)."""
        batch = self._batch(self.starts(self.step), device)
        self.step += 1
        return batch

    def __iter__(self) -> Iterator[Batch]:
        return self

    def __next__(self) -> Batch:
        return self.next_batch()

    def state_dict(self) -> dict:
        """Enough to resume: seed, step, and the shape of the global batch it assumes."""
        return {"seed": self.seed, "step": self.step, "batch_size": self.batch_size,
                "seq_len": self.seq_len, "world_size": self.world_size}

    def load_state_dict(self, state: dict) -> None:
        """Continue exactly where the saved sampler stopped (same global batch shape required)."""
        mine = self.state_dict()
        for key in ("batch_size", "seq_len", "world_size"):
            if state[key] != mine[key]:
                raise ValueError(f"sampler state has {key}={state[key]}, this sampler {mine[key]}: "
                                 "the batch stream would differ")
        self.seed, self.step = state["seed"], state["step"]

    def eval_batches(self, n_batches: int, device: torch.device | str | None = None) -> Iterator[Batch]:
        """`n_batches` fixed batches: the n_batches * batch_size * world_size window starts are
        spread evenly over the whole split, independent of seed and step, so every call (and
        every run) evaluates the same windows; rank r gets its slice of each global batch."""
        per_step = self.batch_size * self.world_size
        spread = np.linspace(0, self.n_windows - 1, n_batches * per_step).round().astype(np.int64)
        for i in range(n_batches):
            lo = i * per_step + self.rank * self.batch_size
            yield self._batch(spread[lo:lo + self.batch_size], device)

    def _batch(self, starts: np.ndarray, device) -> Batch:
        window = self.tokens[starts[:, None] + self._offsets].astype(np.int64)  # (B, T + 1)
        x = torch.from_numpy(np.ascontiguousarray(window[:, :-1]))
        y = torch.from_numpy(np.ascontiguousarray(window[:, 1:]))
        if device is None or torch.device(device).type == "cpu":
            return x, y
        pin = self.pin_memory and torch.device(device).type == "cuda"
        if pin:
            x, y = x.pin_memory(), y.pin_memory()
        return x.to(device, non_blocking=pin), y.to(device, non_blocking=pin)
