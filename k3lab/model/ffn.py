"""SiTU-GLU, the Kimi K3 activation, and the dense feed-forward layer built on it."""

from __future__ import annotations

import torch
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


class DenseFFN(nn.Module):
    """down(situ_glu(gate(x), up(x))): (..., M) -> (..., M)."""

    def __init__(self, hidden_size: int, intermediate_size: int, beta: float = 4.0, linear_beta: float = 25.0):
        super().__init__()
        self.gate_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.up_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=False)
        self.beta, self.linear_beta = beta, linear_beta

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(situ_glu(self.gate_proj(x), self.up_proj(x), self.beta, self.linear_beta))
