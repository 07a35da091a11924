"""Attention Residuals in plain PyTorch: the model's reference path, and the twins the kernels are held to.

The mixture over depth candidates V = [stored endpoints..., live prefix] (DESIGN.md, arXiv 2603.15031):

    scores  = (RMSNorm(V) * proj_weight).sum(-1)     one learned vector, shared over candidates
    weights = softmax(scores, over K)
    h       = sum_K weights * V                       raw V, not normalised; fp32

in two layouts:
- `attn_res_mixture` / `apply_attn_res`: the model's path on CPU (and with the chunkwise KDA),
  endpoints stacked as (BT, P, M), the norm and scorer the block's modules;
- `reference_forward` / `dv_twin`: the layout of the fused kernels (`kernel.py`): K sources of
  (N, D) and the weight vectors, returning the statistics the kernels keep; `dv_reference` is
  `kernel.dv_backward` in plain PyTorch. `fused.AttnResMixture` runs these on CPU tensors, so the
  CPU tests check its bookkeeping, and the GPU tests hold the kernels to them.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def attn_res_mixture(block_residual, prefix_sum, norm, proj):
    """`apply_attn_res`, also returning the mixture weights (BT, K) for logging."""
    V = torch.cat([block_residual, prefix_sum.unsqueeze(1)], dim=1).float()  # (BT, K, M)
    with torch.autocast(V.device.type, enabled=False):
        scores = F.linear(norm(V), proj.weight.float()).squeeze(-1)  # (BT, K)
        weights = scores.softmax(dim=-1)
        h = (weights.unsqueeze(-1) * V).sum(dim=1)  # (BT, M), raw candidates, not normalised
    return h.to(prefix_sum.dtype), weights


def apply_attn_res(block_residual, prefix_sum, norm, proj):
    """Softmax mixture over depth candidates for each token.

    block_residual (BT, P, M) stored endpoints; prefix_sum (BT, M) the live prefix.
    Candidates V = [endpoints..., prefix] (BT, K=P+1, M); scores = proj(norm(V)) with one
    learned vector shared over candidates; h = sum_K softmax(scores) * V, in fp32.
    """
    return attn_res_mixture(block_residual, prefix_sum, norm, proj)[0]


# -- the kernels' layout (fp32 math) -------------------------------------------------------------

def scored_sources(q, w, residuals, eps: float):
    """residuals K x (N, D) -> v (K, N, D) fp32, rstd (K, N), k = v * rstd, qw = q * w (D,), logit (K, N)."""
    v = torch.stack([r.float() for r in residuals])  # (K, N, D)
    rstd = torch.rsqrt(v.pow(2).mean(-1) + eps)
    k = v * rstd[..., None]
    qw = q.float() * w.float()
    logit = (k * qw).sum(-1)  # (K, N); no matmul, which autocast would cast
    return v, rstd, k, qw, logit


def reference_forward(q, w, ow, residuals, eps: float = 1e-6):
    """residuals K x (N, D) -> (o (N, D) in their dtype, rstd (K, N), logit (K, N), lse (N,)),
    as FLA's forward kernel returns them."""
    D = residuals[0].shape[-1]
    v, rstd, _, _, logit = scored_sources(q, w, residuals, eps)
    lse = logit.logsumexp(dim=0)
    o = ((logit - lse).exp()[..., None] * v).sum(0)
    if ow is not None:
        o = F.rms_norm(o, (D,), ow.float(), eps)
    return o.to(residuals[0].dtype), rstd, logit, lse


def reference_attnres(query, residuals, rms_weight, output_rms_weight=None, rms_eps: float = 1e-6):
    """AttnRes in plain PyTorch, fp32 math, as FLA's `naive_attnres` (which imports Triton, so CPU
    machines without it cannot use FLA's): residuals K x (N, D) -> (N, D) in their dtype."""
    return reference_forward(query, rms_weight, output_rms_weight, residuals, rms_eps)[0]


def dv_twin(q, w, ow, residuals, do, eps: float = 1e-6):
    """The backward's per-row terms in plain PyTorch: (dvs K x (N, D) fp32, dqw (N, D),
    dow_partial (N, D) or None) for residuals K x (N, D), q, w, ow (D,), do (N, D)."""
    v, rstd, k, qw, logit = scored_sources(q, w, residuals, eps)
    D = v.shape[-1]
    p = torch.softmax(logit, dim=0)
    o_pre = (p[..., None] * v).sum(0)  # (N, D)
    do = do.float()
    dow_partial = None
    if ow is not None:
        o_rstd = torch.rsqrt(o_pre.pow(2).mean(-1, keepdim=True) + eps)
        xhat = o_pre * o_rstd
        dow_partial = xhat * do
        c1 = (xhat * ow.float() * do).sum(-1, keepdim=True) / D
        do = (ow.float() * do - xhat * c1) * o_rstd
    delta = (do * o_pre).sum(-1)  # (N,)
    dp = (v * do).sum(-1)  # (K, N)
    ds = p * (dp - delta)
    dv = p[..., None] * do + (ds * rstd)[..., None] * (qw - k * (logit / D)[..., None])
    dqw = (ds[..., None] * k).sum(0)  # (N, D)
    return list(dv), dqw, dow_partial


def dv_reference(q, w, ow, residuals, rstd, logit, lse, do, targets, acc: int, eps: float):
    """`kernel.dv_backward` in plain PyTorch (the statistics are recomputed); its partial sums
    are the per-row terms, (1 or 2, N, D)."""
    dvs, dqw, dow_partial = dv_twin(q, w, ow, residuals, do, eps)
    for i, (target, dv) in enumerate(zip(targets, dvs)):
        target.copy_(target.float() + dv if acc >> i & 1 else dv)
    return torch.stack([dqw] if ow is None else [dqw, dow_partial])


# -- the model's AttnRes state on this path: the stored endpoints as one (BT, P, M) tensor ------

class StackedEndpoints:
    """The completed block endpoints of a forward, stacked as one (BT, P, M) tensor, with the two
    things a block does with them: `add` one and `mix` them with the live prefix.
    `fused.EndpointTuple` is the same state on the fused path; the candidates and their order are
    the same on both."""

    def __init__(self, stacked: torch.Tensor):
        self.stacked = stacked  # (BT, P, M)

    @classmethod
    def empty(cls, x: torch.Tensor) -> StackedEndpoints:
        """The state before the first layer: no endpoints, (B*T, 0, M) for x (B, T, M)."""
        B, T, M = x.shape
        return cls(x.new_zeros(B * T, 0, M))

    def add(self, x: torch.Tensor) -> StackedEndpoints:
        """These endpoints with x (B, T, M) stored after them: (BT, P+1, M)."""
        B, T, M = x.shape
        return StackedEndpoints(torch.cat([self.stacked, x.reshape(B * T, 1, M)], dim=1))

    def mix(self, prefix: torch.Tensor, norm, proj, out_norm):
        """out_norm(the mixture of [endpoints..., prefix]) (B, T, M) and the mean weights (K,), for logging."""
        B, T, M = prefix.shape
        h, weights = attn_res_mixture(self.stacked, prefix.reshape(B * T, M), norm, proj)
        return out_norm(h.view(B, T, M)), weights.detach().mean(dim=0)
