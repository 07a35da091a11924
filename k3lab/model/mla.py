"""Gated Multi-head Latent Attention (DeepSeek-V2/V3 MLA without RoPE, as in Kimi Linear)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from k3lab.model.config import KimiK3Config
from k3lab.model.norm import RMSNorm


class GatedMLA(nn.Module):
    """Causal softmax attention with low-rank q/kv and a sigmoid output gate.

    q  = q_b(RMSNorm(q_a(x)))                      (B, T, H, d_qk + s)   (or one full-rank Linear)
    c, k_s = kv_a(x) split [r_kv, s]               the kv latent, and the shared key part (B, T, s)
    kv = kv_b(RMSNorm(c)) -> k_h, v                (B, T, H, d_qk), (B, T, H, d_v)
    k  = [k_h, k_s]                                every head's key ends with the same k_s (B, T, H, d_qk + s)
    o  = SDPA(q, k, v, causal, scale (d_qk + s)^-0.5) * sigmoid(g_proj(x)), then o_proj: (B, T, M)
    No positional encoding (NoPE): the KDA layers carry position. s = config.mla_shared_key_dim
    (K3's qk_rope_head_dim: the rotary part of DeepSeek's MLA, used without rotation) is 0 by
    default; the output gate (config.mla_output_gate) is on by default (Kimi Linear has none).

    On CUDA under bf16 autocast, q, k, v come out of the projections in bf16 and SDPA
    picks its flash backend. Flash needs one head dim for q, k and v, so when
    d_qk + s != d_v the smaller side is zero-padded (`causal_attention`): exact, and it
    keeps flash instead of falling back to the memory-efficient kernel.
    """

    def __init__(self, config: KimiK3Config):
        super().__init__()
        M, H = config.hidden_size, config.mla_num_heads
        self.num_heads, self.qk_dim, self.v_dim = H, config.mla_qk_head_dim, config.mla_v_head_dim
        self.kv_rank, self.shared_key_dim = config.mla_kv_lora_rank, config.mla_shared_key_dim
        q_dim, eps = self.qk_dim + self.shared_key_dim, config.mla_latent_norm_eps
        if config.mla_q_lora_rank is None:
            self.q_proj = nn.Linear(M, H * q_dim, bias=False)
        else:
            self.q_proj = nn.Sequential(
                nn.Linear(M, config.mla_q_lora_rank, bias=False),
                RMSNorm(config.mla_q_lora_rank, eps),
                nn.Linear(config.mla_q_lora_rank, H * q_dim, bias=False),
            )
        self.kv_a_proj = nn.Linear(M, self.kv_rank + self.shared_key_dim, bias=False)
        self.kv_norm = RMSNorm(self.kv_rank, eps)
        self.kv_b_proj = nn.Linear(self.kv_rank, H * (self.qk_dim + self.v_dim), bias=False)
        self.g_proj = nn.Linear(M, H * self.v_dim, bias=False) if config.mla_output_gate else None
        self.o_proj = nn.Linear(H * self.v_dim, M, bias=False)

    OLD_KV_NAMES = {"kv_proj.0.": "kv_a_proj.", "kv_proj.1.": "kv_norm.", "kv_proj.2.": "kv_b_proj."}

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        """Checkpoints from before the shared key part hold the kv path as one Sequential
        (`kv_proj.0/1/2`): the same three weights under their new names."""
        for old, new in self.OLD_KV_NAMES.items():
            for key in [k for k in state_dict if k.startswith(prefix + old)]:
                state_dict[prefix + new + key[len(prefix + old):]] = state_dict.pop(key)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def keys_values(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x (B, T, M) -> k (B, T, H, d_qk + s), v (B, T, H, d_v)."""
        B, T, _ = x.shape
        H = self.num_heads
        latent, shared_key = self.kv_a_proj(x).split([self.kv_rank, self.shared_key_dim], dim=-1)
        kv = self.kv_b_proj(self.kv_norm(latent)).view(B, T, H, self.qk_dim + self.v_dim)
        k, v = kv.split([self.qk_dim, self.v_dim], dim=-1)
        if self.shared_key_dim:
            k = torch.cat([k, shared_key.unsqueeze(2).expand(B, T, H, self.shared_key_dim)], dim=-1)
        return k, v

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, _ = x.shape
        H = self.num_heads
        q = self.q_proj(x).view(B, T, H, self.qk_dim + self.shared_key_dim)
        k, v = self.keys_values(x)
        o = causal_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))  # (B, H, T, d_v)
        o = o.transpose(1, 2).reshape(B, T, H * self.v_dim)
        if self.g_proj is not None:
            o = o * torch.sigmoid(self.g_proj(x))
        return self.o_proj(o)


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
