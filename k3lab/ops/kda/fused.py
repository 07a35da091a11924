"""The fused path of KDA: FLA's (flash-linear-attention) Triton kernels, as `model.kda.KDAFused` calls them.

FLA is imported inside each function, so this module imports on a machine without FLA; the layer
imports it only when it runs on CUDA. Importing it sets FLA's convolution backend (below).

FLA API facts this module relies on (checked against fla-core 0.6.0):
- `fla.ops.kda.chunk_kda(q, k, v, g, beta, scale=None, ..., use_qk_l2norm_in_kernel,
  use_gate_in_kernel, use_beta_sigmoid_in_kernel, safe_gate, lower_bound, A_log=,
  dt_bias=, chunk_size=)` -> (o, final_state). With `use_gate_in_kernel=True` and
  `lower_bound` set, the kernel computes g = lower_bound * sigmoid(exp(A_log) *
  (g + dt_bias.view(H, K))) -- exactly `model.kda.decay_gate`'s bounded form -- fused with
  the chunk cumsum; A_log is (H,), dt_bias (H*K,). `safe_gate=True` needs
  lower_bound in [-5, 0); chunk_size must be 32 or 64; scale defaults to K^-0.5.
  In-kernel L2 norm is x * rsqrt(sum(x^2) + 1e-6) (F.normalize uses max(|x|, 1e-12));
  in-kernel beta is sigmoid(raw) in fp32.
- `fla.modules.causal_conv1d(x, weight=(D, W), bias=None, activation="silu")`
  -> (y, final_state): the same causal depthwise convolution as nn.Conv1d with
  padding W-1 truncated to T, computed in fp32, stored in x's dtype.
- `fla.modules.fused_norm_gate.rms_norm_gated(x, g, weight, bias, activation="sigmoid",
  eps=)` = RMSNorm(x) * sigmoid(g) over the last dim.
"""

from __future__ import annotations

import os

import torch
from torch import nn

# FLA's causal convolution has a Triton and a Gluon implementation, the second off unless FLA_CONV_GLUON is set.
# Gluon it is, with the same y and dx (chosen by bench/kernel_choices.py --only conv_backend; the figures:
# docs/journal/kernel-headroom.md). FLA itself falls back to Triton where Gluon does not apply
# (distributed runs, states carried in). A user's own setting is kept.
os.environ.setdefault("FLA_CONV_GLUON", "1")


@torch.compiler.disable
def outside_compile(forward, x: torch.Tensor) -> torch.Tensor:
    """forward(x) run eagerly, a graph break in a compiled block: FLA 0.6.0 marks `chunk_kda`
    compiler-disabled, and the fused layer's whole CUDA path runs beside it. The decorator lives
    here, not on the layer, because applying it imports torch._dynamo, which the plain model never needs."""
    return forward(x)


def short_conv(x: torch.Tensor, conv: nn.Conv1d) -> torch.Tensor:
    """SiLU(causal depthwise conv(x)) with FLA's kernel and our nn.Conv1d weight (D, 1, W): (B, T, D)."""
    from fla.modules.causal_conv1d import causal_conv1d

    y, _ = causal_conv1d(x=x, weight=conv.weight.squeeze(1), bias=conv.bias, activation="silu")
    return y


def chunk_kda_gated(q, k, v, f, beta, A_log, dt_bias, lower_bound: float, chunk_size: int,
                    keep_states: bool) -> torch.Tensor:
    """KDA with the bounded decay gate, the q/k L2 norm and the beta sigmoid inside FLA's kernel.

    q, k, v, f (B, T, H, d): f the raw decay input; beta (B, T, H) logits. Returns o (B, T, H, d)
    in q's dtype. `keep_states`: the backward reads the chunk states the forward computed
    (chunk_kda's disable_recompute) instead of recomputing them.
    """
    from fla.ops.kda import chunk_kda

    o, _ = chunk_kda(
        q=q, k=k, v=v, g=f, beta=beta, A_log=A_log, dt_bias=dt_bias,
        use_gate_in_kernel=True, use_qk_l2norm_in_kernel=True, use_beta_sigmoid_in_kernel=True,
        safe_gate=True, lower_bound=lower_bound, chunk_size=chunk_size, disable_recompute=keep_states,
    )
    return o


def gated_rms_norm(o: torch.Tensor, gate: torch.Tensor, norm: nn.RMSNorm) -> torch.Tensor:
    """RMSNorm(o) * sigmoid(gate) over the last dim, in FLA's fused kernel: (B, T, H, d)."""
    from fla.modules.fused_norm_gate import rms_norm_gated

    return rms_norm_gated(o, gate, norm.weight, None, activation="sigmoid", eps=norm.eps)
