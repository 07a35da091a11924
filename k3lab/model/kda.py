"""Kimi Delta Attention (KDA): the layer of Kimi Linear / K3 around the KDA op (`k3lab.ops.kda`).

`KDAChunkwise` runs the op's plain-PyTorch chunkwise form (`ops.kda.naive.chunk_kda_reference`);
`KDAFused` has the same parameters and runs FLA's fused kernels on CUDA (`ops.kda.fused`), the
padded reference elsewhere.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from k3lab.model.config import KimiK3Config
from k3lab.model.norm import RMSNorm
from k3lab.ops.kda.naive import chunk_kda_reference


class ShortConv(nn.Module):
    """Causal depthwise 1-D convolution followed by SiLU: (B, T, D) -> (B, T, D)."""

    def __init__(self, dim: int, kernel_size: int):
        super().__init__()
        self.conv = nn.Conv1d(dim, dim, kernel_size, groups=dim, padding=kernel_size - 1, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        T = x.shape[1]
        return F.silu(self.conv(x.transpose(1, 2))[..., :T].transpose(1, 2))


def l2_normalize(x: torch.Tensor, form: str = "normalize") -> torch.Tensor:
    """x / |x| over the last dim. "normalize": F.normalize, x / max(|x|, 1e-12);
    "fla": x / sqrt(|x|^2 + 1e-6) in fp32, as FLA's kernels and the Kimi code. Returns x's dtype."""
    if form == "normalize":
        return F.normalize(x, dim=-1)
    x32 = x.float()
    return (x32 / torch.sqrt((x32 * x32).sum(dim=-1, keepdim=True) + 1e-6)).to(x.dtype)


def gate_projection(in_dim: int, out_dim: int, rank: int | None, bias: bool) -> nn.Module:
    """The output gate's projection: one Linear (rank None, K3) or two through `rank` (FLA, Kimi Linear)."""
    if rank is None:
        return nn.Linear(in_dim, out_dim, bias=bias)
    return nn.Sequential(nn.Linear(in_dim, rank, bias=False), nn.Linear(rank, out_dim, bias=bias))


def decay_gate(f: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor, lower_bound: float | None) -> torch.Tensor:
    """Log-space decay g from the low-rank decay input f: (B, T, H, dk) -> (B, T, H, dk), in fp32.

    Unbounded: g = -exp(A_log) * softplus(f + dt_bias).
    Bounded:   g = lb * sigmoid(exp(A_log) * (f + dt_bias)), in [lb, 0).
    """
    a = A_log.float().exp().view(-1, 1)  # (H, 1)
    x = f.float() + dt_bias.float().view(a.shape[0], -1)
    if lower_bound is None:
        return -a * F.softplus(x)
    return lower_bound * torch.sigmoid(a * x)


class KDAChunkwise(nn.Module):
    """The KDA layer of Kimi Linear in plain PyTorch: (B, T, M) -> (B, T, M).

    q, k, v: Linear + causal short conv + SiLU; q, k L2-normalised per head.
    beta = sigmoid(b_proj(x)); decay from a low-rank f_proj through `decay_gate`.
    Output: per-head RMSNorm(o) * sigmoid(g_proj(x)), then o_proj.
    T must be a multiple of config.kda_chunk_size.
    """

    def __init__(self, config: KimiK3Config):
        super().__init__()
        M, H, d = config.hidden_size, config.kda_num_heads, config.kda_head_dim
        self.num_heads, self.head_dim = H, d
        self.chunk_size, self.lower_bound = config.kda_chunk_size, config.kda_gate_lower_bound
        self.qk_l2norm = config.kda_qk_l2norm
        self.q_proj = nn.Linear(M, H * d, bias=False)
        self.k_proj = nn.Linear(M, H * d, bias=False)
        self.v_proj = nn.Linear(M, H * d, bias=False)
        self.q_conv = ShortConv(H * d, config.kda_conv_size)
        self.k_conv = ShortConv(H * d, config.kda_conv_size)
        self.v_conv = ShortConv(H * d, config.kda_conv_size)
        self.b_proj = nn.Linear(M, H, bias=False)
        self.f_proj = nn.Sequential(nn.Linear(M, d, bias=False), nn.Linear(d, H * d, bias=False))
        self.g_proj = gate_projection(M, H * d, config.kda_gate_low_rank, config.kda_gate_bias)
        self.A_log = nn.Parameter(torch.empty(H))
        self.dt_bias = nn.Parameter(torch.empty(H * d))
        self.o_norm = RMSNorm(d, config.rms_norm_eps)
        self.o_proj = nn.Linear(H * d, M, bias=False)
        self.reset_decay_parameters()

    @torch.no_grad()
    def reset_decay_parameters(self) -> None:
        """A_log = log(U(1, 16)); dt_bias = softplus^-1(dt), dt log-uniform in [1e-3, 0.1]."""
        self.A_log.copy_(torch.empty_like(self.A_log).uniform_(1, 16).log())
        dt = torch.exp(torch.empty_like(self.dt_bias).uniform_(math.log(1e-3), math.log(0.1)))
        self.dt_bias.copy_(dt + torch.log(-torch.expm1(-dt)))

    def project(self, x: torch.Tensor):
        """The kernel inputs: q, k (L2-normalised), v, g (log decay), beta; heads split out."""
        B, T, _ = x.shape
        H, d = self.num_heads, self.head_dim
        q = l2_normalize(self.q_conv(self.q_proj(x)).view(B, T, H, d), self.qk_l2norm)
        k = l2_normalize(self.k_conv(self.k_proj(x)).view(B, T, H, d), self.qk_l2norm)
        v = self.v_conv(self.v_proj(x)).view(B, T, H, d)
        g = decay_gate(self.f_proj(x).view(B, T, H, d), self.A_log, self.dt_bias, self.lower_bound)
        beta = torch.sigmoid(self.b_proj(x).float())
        return q, k, v, g, beta

    def gated_output(self, o: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """o (B, T, H, d) -> o_proj(RMSNorm(o) * sigmoid(g_proj(x))): (B, T, M)."""
        B, T = x.shape[:2]
        gate = self.g_proj(x).view(B, T, self.num_heads, self.head_dim)
        o = self.o_norm(o) * torch.sigmoid(gate)
        return self.o_proj(o.reshape(B, T, -1).to(x.dtype))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v, g, beta = self.project(x)
        o, _ = chunk_kda_reference(q, k, v, g, beta, chunk_size=self.chunk_size)
        return self.gated_output(o, x)


WIDTH_MULTIPLE = 16  # the fused input matmul's width is padded to this: FLA's causal conv reads q, k, v
# as views with that row stride, and Triton vectorises their loads only when the stride is a multiple of 16


class KDAFused(KDAChunkwise):
    """KDAChunkwise's parameters (same names, shapes and state_dict keys) run by FLA kernels.

    On CUDA (`k3lab.ops.kda.fused`): the input projections in one matmul (`input_projections`), FLA's short
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
            from k3lab.ops.kda import fused  # imported here: it sets FLA's convolution backend, before FLA runs

            return fused.outside_compile(self.forward_fla, x)
        return self.forward_reference(x)

    def forward_reference(self, x: torch.Tensor) -> torch.Tensor:
        T = x.shape[1]
        pad = (-T) % self.chunk_size  # zeros after the end change nothing before it
        return super().forward(F.pad(x, (0, 0, 0, pad)))[:, :T]

    def forward_fla(self, x: torch.Tensor) -> torch.Tensor:
        """The CUDA path, run outside torch.compile (`forward`)."""
        from k3lab.ops.kda import fused

        B, T, _ = x.shape
        H, d = self.num_heads, self.head_dim
        q, k, v, f, beta, gate = self.input_projections(x)
        q = fused.short_conv(q, self.q_conv.conv).view(B, T, H, d)  # FLA's conv reads the strided views
        k = fused.short_conv(k, self.k_conv.conv).view(B, T, H, d)
        v = fused.short_conv(v, self.v_conv.conv).view(B, T, H, d)
        o = fused.chunk_kda_gated(  # f: raw decay input, gated in the kernel; beta: logits
            q, k, v, f.view(B, T, H, d), beta, self.A_log, self.dt_bias, self.lower_bound, self.chunk_size,
            keep_states=self.keep_states and torch.is_grad_enabled(),  # evaluation keeps nothing
        )  # (B, T, H, d) in q's dtype
        o = fused.gated_rms_norm(o, gate.view(B, T, H, d), self.o_norm)
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
