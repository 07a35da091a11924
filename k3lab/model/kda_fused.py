"""The GPU path of KDA: FLA's fused Triton kernels (AttnRes's are in `attn_res_fused`).

With `attn_res_fused`, the only model file that uses FLA (flash-linear-attention); it
imports FLA inside the functions that need it, so building a fused model on a machine without
FLA still works (the CPU fallback below needs no FLA).

FLA API facts this module relies on (checked against fla-core 0.6.0):
- `fla.ops.kda.chunk_kda(q, k, v, g, beta, scale=None, ..., use_qk_l2norm_in_kernel,
  use_gate_in_kernel, use_beta_sigmoid_in_kernel, safe_gate, lower_bound, A_log=,
  dt_bias=, chunk_size=)` -> (o, final_state). With `use_gate_in_kernel=True` and
  `lower_bound` set, the kernel computes g = lower_bound * sigmoid(exp(A_log) *
  (g + dt_bias.view(H, K))) -- exactly `decay_gate`'s bounded form -- fused with
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
import torch.nn.functional as F
from torch import nn

from k3lab.model.kda import KDAChunkwise


WIDTH_MULTIPLE = 16  # the fused input matmul's width is padded to this: FLA's causal conv reads q, k, v
# as views with that row stride, and Triton vectorises their loads only when the stride is a multiple of 16

# FLA's causal convolution has a Triton and a Gluon implementation, the second off unless FLA_CONV_GLUON is set.
# Gluon is the faster at a `small` trial's view, with the same y and dx (bench/kernel_choices.py --only conv_backend;
# docs/journal/kernel-headroom.md). FLA itself falls back to
# Triton where Gluon does not apply (distributed runs, states carried in). A user's own setting is kept.
os.environ.setdefault("FLA_CONV_GLUON", "1")


class KDAFused(KDAChunkwise):
    """KDAChunkwise's parameters (same names, shapes and state_dict keys) run by FLA kernels.

    On CUDA: the input projections in one matmul (`input_projections`), FLA's short
    convolution, `chunk_kda` with the bounded gate, L2 norm and beta sigmoid inside the
    kernel, and the fused gated RMSNorm. Any sequence length.
    Elsewhere: the plain PyTorch reference, padded to the chunk size (exact, causal).
    The output gate g_proj is whichever projection the config asks for (low rank or K3's
    full rank, with or without bias); the in-kernel q/k L2 norm is always FLA's form, i.e.
    kda_qk_l2norm="fla", whatever the config says (the two differ by ~1e-6 relative for
    vectors of norm ~1).
    """

    keep_states = False  # chunk_kda's disable_recompute: the backward reads the chunk states (w, u, h, ...)
    # the forward computed instead of recomputing them; set per model by `keep_kda_states`

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.is_cuda:
            return self.forward_fla(x)
        return self.forward_reference(x)

    def forward_reference(self, x: torch.Tensor) -> torch.Tensor:
        T = x.shape[1]
        pad = (-T) % self.chunk_size  # zeros after the end change nothing before it
        return super().forward(F.pad(x, (0, 0, 0, pad)))[:, :T]

    @torch.compiler.disable
    def forward_fla(self, x: torch.Tensor) -> torch.Tensor:
        from fla.modules.fused_norm_gate import rms_norm_gated
        from fla.ops.kda import chunk_kda

        B, T, _ = x.shape
        H, d = self.num_heads, self.head_dim
        q, k, v, f, beta, gate = self.input_projections(x)
        q = short_conv(q, self.q_conv.conv).view(B, T, H, d)  # FLA's conv reads the strided views
        k = short_conv(k, self.k_conv.conv).view(B, T, H, d)
        v = short_conv(v, self.v_conv.conv).view(B, T, H, d)
        o, _ = chunk_kda(
            q=q, k=k, v=v, g=f.view(B, T, H, d), beta=beta,  # g: raw decay input, gated in the kernel; beta: logits
            A_log=self.A_log, dt_bias=self.dt_bias,
            use_gate_in_kernel=True, use_qk_l2norm_in_kernel=True, use_beta_sigmoid_in_kernel=True,
            safe_gate=True, lower_bound=self.lower_bound, chunk_size=self.chunk_size,
            disable_recompute=self.keep_states and torch.is_grad_enabled(),  # evaluation keeps nothing
        )  # (B, T, H, d) in q's dtype
        o = rms_norm_gated(o, gate.view(B, T, H, d), self.o_norm.weight, None, activation="sigmoid",
                           eps=self.o_norm.eps)
        return self.o_proj(o.reshape(B, T, H * d))

    def input_projections(self, x: torch.Tensor):
        """x (B, T, M) -> q, k, v (B, T, H*d) before their convolutions, the decay input f (B, T, H*d),
        beta logits (B, T, H) and the output gate (B, T, H*d): every Linear that reads x in one matmul.

        One matmul instead of six gives x one gradient in the backward: autograd otherwise adds
        the six projections' input gradients one eager add at a time (dozens of B x T x M adds
        a step). The parameters stay the chunkwise layer's.
        """
        gate_in, gate_out = self.gate_linears()
        first = [self.q_proj, self.k_proj, self.v_proj, self.f_proj[0], self.b_proj, gate_in]
        widths = [linear.out_features for linear in first]
        pad = -sum(widths) % WIDTH_MULTIPLE  # zero rows: see WIDTH_MULTIPLE
        zeros = x.new_zeros(pad, x.shape[-1], dtype=first[0].weight.dtype)  # F.pad would copy the weights again
        weight = torch.cat([linear.weight for linear in first] + [zeros])
        q, k, v, f, beta, gate, _ = F.linear(x, weight).split(widths + [pad], dim=-1)  # views, row stride sum + pad
        f = self.f_proj[1](f)
        if gate_out is not None:  # low rank: the gate's second Linear (with its bias)
            gate = gate_out(gate)
        elif gate_in.bias is not None:  # K3's full-rank gate with a bias: added here
            gate = (gate + gate_in.bias).to(gate.dtype)
        return q, k, v, f, beta, gate

    def gate_linears(self) -> tuple[nn.Linear, nn.Linear | None]:
        """The output gate as (the Linear that reads x, the low-rank gate's second Linear or None)."""
        if isinstance(self.g_proj, nn.Linear):
            return self.g_proj, None
        return self.g_proj[0], self.g_proj[1]


def short_conv(x: torch.Tensor, conv: nn.Conv1d) -> torch.Tensor:
    """SiLU(causal depthwise conv(x)) with FLA's kernel and our nn.Conv1d weight (D, 1, W): (B, T, D)."""
    from fla.modules.causal_conv1d import causal_conv1d

    y, _ = causal_conv1d(x=x, weight=conv.weight.squeeze(1), bias=conv.bias, activation="silu")
    return y


def keep_kda_states(model: nn.Module, keep: bool) -> None:
    """Whether the fused KDA layers of `model` keep their forward's chunk states for the backward.

    Keeping them spares the backward FLA's recomputation of the gate cumsum, w, u and the
    state recurrence h, for more activation memory: per layer B*T*H*d*(5*s + 4) bytes for w, u,
    qg, kg, v_new (s bytes an element: 2 under bf16 autocast) and the gate cumsum (fp32), plus
    h's B*(T/chunk)*H*d*d*s.
    """
    for module in model.modules():
        if isinstance(module, KDAFused):
            module.keep_states = keep
