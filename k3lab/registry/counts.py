"""Parameter and FLOP counts of a config, via `k3lab.model.counting.count_config`
(the model built on the meta device), cached per config and sequence length."""

from __future__ import annotations

import functools

import attrs

from k3lab.model.config import KimiK3Config


@attrs.frozen
class ParamCounts:
    """What `count_config` reports, as data. `flops_per_token` is for training
    (forward + backward) at `seq_len`."""

    total: int
    embedding: int
    non_embedding: int
    active: int
    flops_per_token: int
    seq_len: int
    by_component: dict[str, int] = attrs.field(factory=dict, eq=False)

    def get(self, by: str) -> int:
        """The count a MatchSpec names: active_params or total_params."""
        return {"active_params": self.active, "total_params": self.total}[by]


@functools.lru_cache(maxsize=4096)
def count(config: KimiK3Config, seq_len: int | None = None) -> ParamCounts:
    """Counts of `config` at `seq_len` (default max_seq_len)."""
    from k3lab.model.counting import count_config

    seq_len = seq_len or config.max_seq_len
    raw = count_config(config, seq_len=seq_len)
    return ParamCounts(
        total=raw["total"], embedding=raw["embedding"], non_embedding=raw["non_embedding"],
        active=raw["active"], flops_per_token=raw["flops_per_token"], seq_len=seq_len,
        by_component=dict(raw["by_component"]),
    )
