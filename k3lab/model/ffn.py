"""SiTU-GLU (the Kimi K3 activation), SwiGLU (Kimi Linear's) and the dense feed-forward layer."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def situ_glu(gate: torch.Tensor, up: torch.Tensor, beta: float = 4.0, linear_beta: float = 25.0) -> torch.Tensor:
    """[beta * tanh(g / beta) * sigmoid(g)] * [beta_lin * tanh(u / beta_lin)], in fp32.

    The two tanh soft-caps bound both halves, which keeps bf16 activations in range;
    as beta, beta_lin -> inf this tends to SwiGLU (silu(g) * u). Returns gate's dtype.
    """
    if beta <= 0 or linear_beta <= 0:
        raise ValueError("situ_glu: beta and linear_beta must be positive")
    g, u = gate.float(), up.float()
    gated = beta * torch.tanh(g / beta) * torch.sigmoid(g)
    linear = linear_beta * torch.tanh(u / linear_beta)
    return (gated * linear).to(gate.dtype)


def swiglu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """silu(g) * u, in fp32 (as situ_glu); returns gate's dtype. Kimi Linear's activation."""
    return (F.silu(gate.float()) * up.float()).to(gate.dtype)


def glu(gate: torch.Tensor, up: torch.Tensor, activation: str = "situ_glu", beta: float = 4.0,
        linear_beta: float = 25.0) -> torch.Tensor:
    """The gated activation a config names (`ffn_activation`): situ_glu or swiglu."""
    if activation == "swiglu":
        return swiglu(gate, up)
    if activation == "situ_glu":
        return situ_glu(gate, up, beta, linear_beta)
    raise ValueError(f"glu: activation must be situ_glu or swiglu, got {activation!r}")


class DenseFFN(nn.Module):
    """down(glu(gate(x), up(x))): (..., M) -> (..., M), with SiTU-GLU unless activation="swiglu"."""

    def __init__(self, hidden_size: int, intermediate_size: int, beta: float = 4.0, linear_beta: float = 25.0,
                 activation: str = "situ_glu"):
        super().__init__()
        self.gate_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.up_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=False)
        self.beta, self.linear_beta, self.activation = beta, linear_beta, activation

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(glu(self.gate_proj(x), self.up_proj(x), self.activation, self.beta, self.linear_beta))
