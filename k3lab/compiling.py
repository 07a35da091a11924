"""torch.compile settings shared by the model's compiled blocks and the optimizer."""

from __future__ import annotations


def raise_recompile_limit(at_least: int) -> None:
    """Allow at least `at_least` compiled graphs per code object (dynamo's recompile limit):
    blocks of different kinds, and Muon's buckets of different shapes, share one code object."""
    import torch._dynamo

    config = torch._dynamo.config
    name = "recompile_limit" if hasattr(config, "recompile_limit") else "cache_size_limit"
    setattr(config, name, max(getattr(config, name), at_least))
