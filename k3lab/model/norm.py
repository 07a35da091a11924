"""RMSNorm computed in fp32, whatever the autocast dtype."""

from __future__ import annotations

import torch
from torch import nn


class RMSNorm(nn.RMSNorm):
    """`w * x / sqrt(mean(x^2) + eps)` over the last dim, in fp32; returns x's dtype."""

    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__(dim, eps=eps, elementwise_affine=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.autocast(x.device.type, enabled=False):
            return super().forward(x.float()).to(x.dtype)
