"""Gated Multi-head Latent Attention (DeepSeek-V2/V3 MLA without RoPE, as in Kimi Linear)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from k3lab.model.config import KimiK3Config
from k3lab.model.norm import RMSNorm


class GatedMLA(nn.Module):
    """Causal softmax attention with low-rank q/kv and a sigmoid output gate.

    q  = q_b(RMSNorm(q_a(x)))                      (B, T, H, d_qk)   (or one full-rank Linear)
    kv = kv_b(RMSNorm(kv_a(x))) -> k, v            (B, T, H, d_qk), (B, T, H, d_v)
    o  = SDPA(q, k, v, causal) * sigmoid(g_proj(x)), then o_proj: (B, T, M)
    No positional encoding (NoPE): the KDA layers carry position.

    On CUDA under bf16 autocast, q, k, v come out of the projections in bf16 and SDPA
    picks its flash backend. Flash needs one head dim for q, k and v, so when
    d_qk != d_v the smaller side is zero-padded (`causal_attention`): exact, and it
    keeps flash instead of falling back to the memory-efficient kernel.
    """

    def __init__(self, config: KimiK3Config):
        super().__init__()
        M, H = config.hidden_size, config.mla_num_heads
        self.num_heads, self.qk_dim, self.v_dim = H, config.mla_qk_head_dim, config.mla_v_head_dim
        if config.mla_q_lora_rank is None:
            self.q_proj = nn.Linear(M, H * self.qk_dim, bias=False)
        else:
            self.q_proj = nn.Sequential(
                nn.Linear(M, config.mla_q_lora_rank, bias=False),
                RMSNorm(config.mla_q_lora_rank, config.rms_norm_eps),
                nn.Linear(config.mla_q_lora_rank, H * self.qk_dim, bias=False),
            )
        self.kv_proj = nn.Sequential(
            nn.Linear(M, config.mla_kv_lora_rank, bias=False),
            RMSNorm(config.mla_kv_lora_rank, config.rms_norm_eps),
            nn.Linear(config.mla_kv_lora_rank, H * (self.qk_dim + self.v_dim), bias=False),
        )
        self.g_proj = nn.Linear(M, H * self.v_dim, bias=False)
        self.o_proj = nn.Linear(H * self.v_dim, M, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, _ = x.shape
        H = self.num_heads
        q = self.q_proj(x).view(B, T, H, self.qk_dim)
        k, v = self.kv_proj(x).view(B, T, H, self.qk_dim + self.v_dim).split([self.qk_dim, self.v_dim], dim=-1)
        o = causal_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))  # (B, H, T, d_v)
        o = o.transpose(1, 2).reshape(B, T, H * self.v_dim)
        return self.o_proj(o * torch.sigmoid(self.g_proj(x)))


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, pad_head_dims: bool | None = None) -> torch.Tensor:
    """Causal softmax attention, scale d_qk^-0.5: q, k (B, H, T, d_qk), v (B, H, T, d_v) -> (B, H, T, d_v).

    With d_qk != d_v and pad_head_dims (default: on CUDA) the smaller head dim is
    zero-padded to the larger one (zero q/k columns add nothing to q.k; zero v columns
    are sliced off), so SDPA's flash backend, which wants equal head dims, stays eligible.
    """
    d_qk, d_v = q.shape[-1], v.shape[-1]
    scale = d_qk**-0.5
    if pad_head_dims is None:
        pad_head_dims = q.is_cuda
    if pad_head_dims and d_qk != d_v:
        if d_v < d_qk:
            v = F.pad(v, (0, d_qk - d_v))
        else:
            q, k = F.pad(q, (0, d_v - d_qk)), F.pad(k, (0, d_v - d_qk))
    o = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale)
    return o[..., :d_v]
