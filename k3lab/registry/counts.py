"""Parameter and FLOP counts of a config, via `k3lab.model.counting.count_parameters` of the
model built on the meta device (no weights allocated), cached per config and sequence length.

The meta model is built with its initialisers skipped (`MetaShapesOnly`): a count needs shapes,
not values, and PyTorch runs initialisers on meta tensors through its Python references, whose
first call imports torch._dynamo -- seconds of every `k3lab variants` and of a GPU sweep's
driver before its plan (it never compiles anything itself).
"""

from __future__ import annotations

import functools

import attrs
import torch
from torch.overrides import TorchFunctionMode

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
    from k3lab.model.counting import count_parameters
    from k3lab.model.model import KimiK3

    seq_len = seq_len or config.max_seq_len
    with torch.device("meta"), MetaShapesOnly():
        model = KimiK3(config)
    raw = count_parameters(model, seq_len)
    return ParamCounts(
        total=raw["total"], embedding=raw["embedding"], non_embedding=raw["non_embedding"],
        active=raw["active"], flops_per_token=raw["flops_per_token"], seq_len=seq_len,
        by_component=dict(raw["by_component"]),
    )


class MetaShapesOnly(TorchFunctionMode):
    """Inside `torch.device("meta")`: in-place ops on meta tensors (initialisers, copies) do
    nothing, and elementwise arithmetic on meta tensors of one shape (KDA's decay init: log,
    exp, expm1, +, -) returns an empty tensor of that shape. Any other op runs as usual, so a
    model whose initialiser uses one more function still counts right, only slower."""

    ELEMENTWISE = frozenset({"log", "exp", "expm1", "log1p", "sqrt", "rsqrt", "neg", "sigmoid", "add", "sub",
                             "mul", "div", "__add__", "__radd__", "__sub__", "__rsub__", "__mul__", "__rmul__",
                             "__truediv__", "__neg__"})
    RESHAPING = frozenset({"resize_", "resize_as_", "set_", "as_strided_", "squeeze_", "unsqueeze_", "t_",
                           "transpose_", "swapaxes_", "swapdims_"})  # in place, but they change the shape: run

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        tensors = [a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)]
        if tensors and tensors[0].is_meta:
            first = tensors[0]
            if name.endswith("_") and not name.startswith("_") and name not in self.RESHAPING:
                return first
            if name in self.ELEMENTWISE and all(t.is_meta and t.shape == first.shape for t in tensors):
                return torch.empty_like(first)
        return func(*args, **kwargs)
