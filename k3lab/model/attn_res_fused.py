"""The GPU path of Attention Residuals: the mixture and the pre-norm after it in one FLA kernel.

Imported only when the fused path runs (`KimiK3.uses_fused_attn_res`): its
`torch.compiler.disable` imports torch._dynamo, and with it Triton on CUDA builds of torch.

FLA API facts this module relies on (checked against fla-core 0.6.0):
- `fla.ops.attnres.fused_attnres(query (D,), residuals [..., D] list, rms_weight,
  output_rms_weight=None, rms_eps=1e-6, scale=1.0, return_weights=False)`: softmax
  over sources of <RMSNorm(v_l) , query>, sum of raw v_l in fp32, output in the
  sources' dtype; `output_rms_weight` applies the following RMSNorm in the same
  kernel (one eps for both norms). Sources must share a dtype and be 16-byte aligned.
"""

from __future__ import annotations

import torch
from torch import nn


@torch.compiler.disable
def fused_attn_res(candidates, norm: nn.RMSNorm, proj: nn.Linear, out_norm: nn.RMSNorm):
    """out_norm(apply_attn_res(...)) in one FLA kernel; returns (h, mean weights (K,)).

    candidates: K tensors (B, T, M) -- the stored endpoints then the live prefix. They
    are brought to the first candidate's dtype (the residual stream's), as FLA needs
    one dtype; h (B, T, M) comes back in that dtype, already normalised by out_norm.
    """
    from fla.ops.attnres import fused_attnres

    dtype = candidates[0].dtype
    residuals = [aligned(c.to(dtype)) for c in candidates]
    h, p = fused_attnres(
        query=proj.weight.view(-1), residuals=residuals, rms_weight=norm.weight,
        output_rms_weight=out_norm.weight, rms_eps=norm.eps, return_weights=True,
    )  # p: (K, B, T)
    return h, p.detach().flatten(1).mean(dim=1)


def aligned(x: torch.Tensor) -> torch.Tensor:
    """x contiguous with a 16-byte aligned start, as FLA's attnres kernel asserts."""
    x = x.contiguous()
    return x if x.data_ptr() % 16 == 0 else x.clone()
