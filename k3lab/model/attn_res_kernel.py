"""k3lab's Triton kernel for the AttnRes backward: each source's gradient summed where it is kept.

One program per token row n (N of them), all K sources of the row in turn, D in one block:
    o_pre = sum_l p_l v_l                      the mixture, rebuilt from the sources
    g     = d out / d o_pre                    through the output RMSNorm (its weight's
                                               per-row gradient staged in dow_partial)
    dv_l  = p_l g + ds_l rstd_l (qw - k_l logit_l / D),   ds_l = p_l (<v_l, g> - <g, o_pre>)
    dqw   = sum_l ds_l k_l                     per row; summed over rows afterwards
with k_l = rstd_l v_l, qw = q * w and p_l = exp(logit_l - lse) from the forward's statistics.
The plain-PyTorch twin is `attn_res_fused.dv_twin`; the tests hold the kernel to it.

What differs from FLA's attnres_bwd_kernel_dv, which computes the same terms: source l's
gradient is added to what its buffer already holds when bit l of `ACC` is set (a stored
endpoint read by an earlier consumer's backward), so the sum over an endpoint's readers costs
one read here instead of one more buffer and an eager add per reader; and there is no
autotuning (4 warps over one D block), so a fresh machine has nothing to tune for it.
ACC is an int32: at most 31 sources (`attn_res_fused.MAX_SOURCES`).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

@triton.jit(do_not_specialize=["N", "L", "ACC"])
def attn_res_bwd_dv_kernel(q, w, ow, res, dres, rstd, logit, lse, do, dqw, dow_partial, N, L, ACC, eps,
                           L2: tl.constexpr, D: tl.constexpr, BD: tl.constexpr, HAS_ONORM: tl.constexpr):
    n = tl.program_id(0).to(tl.int64)
    d = tl.arange(0, BD)
    inside = d < D
    row = n * D + d
    qw = tl.load(q + d, mask=inside, other=0.0).to(tl.float32) * tl.load(w + d, mask=inside, other=0.0).to(tl.float32)
    lse_n = tl.load(lse + n)
    g = tl.load(do + row, mask=inside, other=0.0).to(tl.float32)

    o_pre = tl.zeros([BD], dtype=tl.float32)
    for i in tl.static_range(L2):  # res is padded to L2 entries; those past L are never read
        if i < L:
            p = tl.exp(tl.load(logit + i * N + n) - lse_n)
            o_pre += p * tl.load(res[i] + row, mask=inside, other=0.0).to(tl.float32)

    if HAS_ONORM:
        o_rstd = tl.rsqrt(tl.sum(o_pre * o_pre, axis=0) / D + eps)
        xhat = o_pre * o_rstd
        w_out = tl.load(ow + d, mask=inside, other=0.0).to(tl.float32)
        tl.store(dow_partial + row, xhat * g, mask=inside)
        c1 = tl.sum(xhat * w_out * g, axis=0) / D
        g = (w_out * g - xhat * c1) * o_rstd
    delta = tl.sum(g * o_pre, axis=0)

    dqw_n = tl.zeros([BD], dtype=tl.float32)
    for i in tl.static_range(L2):
        if i < L:
            v = tl.load(res[i] + row, mask=inside, other=0.0).to(tl.float32)
            r = tl.load(rstd + i * N + n)
            s = tl.load(logit + i * N + n)
            p = tl.exp(s - lse_n)
            ds = p * (tl.sum(v * g, axis=0) - delta)
            k = v * r
            dv = p * g + ds * r * (qw - k * (s / D))
            if (ACC >> i) & 1:
                dv += tl.load(dres[i] + row, mask=inside, other=0.0).to(tl.float32)
            tl.store(dres[i] + row, dv.to(dres[i].dtype.element_ty), mask=inside)
            dqw_n += ds * k
    tl.store(dqw + row, dqw_n, mask=inside)


def dv_backward(q, w, ow, residuals, rstd, logit, lse, do, targets, acc: int, eps: float):
    """Write (acc bit l set: add) source l's gradient into targets[l]; returns the per-row
    buffers (dqw, dow_partial), (N, D) fp32, that `column_sums` reduces.

    residuals, targets: K (N, D) contiguous, 16-byte aligned; rstd, logit: (K, N) fp32; lse (N,).
    """
    K = len(residuals)
    N, D = do.shape
    L2 = max(8, triton.next_power_of_2(K))
    pad = lambda tensors: tuple(tensors) + (tensors[0],) * (L2 - K)  # noqa: E731
    dqw = torch.empty_like(do, dtype=torch.float32)
    dow_partial = torch.empty_like(do, dtype=torch.float32) if ow is not None else None
    attn_res_bwd_dv_kernel[(N,)](
        q, w, ow, pad(residuals), pad(targets), rstd, logit, lse, do, dqw, dow_partial, N, K, acc, eps,
        L2=L2, D=D, BD=triton.next_power_of_2(D), HAS_ONORM=ow is not None, num_warps=4)
    return dqw, dow_partial
