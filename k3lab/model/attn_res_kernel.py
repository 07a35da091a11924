"""k3lab's Triton kernels for AttnRes: the mixture forward, and its backward with each source's
gradient summed where it is kept.

Both run one program per token row n (N of them), all K sources of the row in turn, D in one
block, 4 warps, with no autotuning (a fresh machine has nothing to tune for them).

Forward, one read of each source (an online softmax, as flash attention does over keys):
    rstd_l  = 1 / sqrt(mean(v_l^2) + eps),   logit_l = rstd_l <v_l, q * w>
    o_pre   = sum_l p_l v_l,                 p_l = softmax_l(logit_l) = exp(logit_l - lse)
    o       = RMSNorm(o_pre) * ow            (the pre-norm after the mixture, when ow is given)
rstd, logit (K, N) and lse (N,) are kept for the backward, in fp32, as FLA's forward keeps them.
The plain-PyTorch twin is `attn_res_fused.reference_forward`.

Backward:
    o_pre = sum_l p_l v_l                      the mixture, rebuilt from the sources
    g     = d out / d o_pre                    through the output RMSNorm (its weight's
                                               per-row gradient staged in dow_partial)
    dv_l  = p_l g + ds_l rstd_l (qw - k_l logit_l / D),   ds_l = p_l (<v_l, g> - <g, o_pre>)
    dqw   = sum_l ds_l k_l                     per row; summed over rows afterwards
with k_l = rstd_l v_l, qw = q * w and p_l = exp(logit_l - lse) from the forward's statistics.
The plain-PyTorch twin is `attn_res_fused.dv_twin`; the tests hold the kernels to the twins.

What differs from FLA's kernels (fla.ops.attnres.fused), which compute the same terms:
- the forward reads source l through its own pointer in an unrolled loop, where FLA's gathers
  BL sources at a time through a pointer table (its forward moved its bytes at 30-39% of the
  H200's copy rate at the trial shapes, bench/bench_attnres.py, 2026-12-01);
- in the backward, source l's gradient is added to what its buffer already holds when bit l of
  `ACC` is set (a stored endpoint read by an earlier consumer's backward), so the sum over an
  endpoint's readers costs one read here instead of one more buffer and an eager add per reader.
ACC is an int32: at most 31 sources (`attn_res_fused.MAX_SOURCES`).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit(do_not_specialize=["N", "L"])
def attn_res_fwd_kernel(q, w, ow, res, o, rstd, logit, lse, N, L, eps,
                        L2: tl.constexpr, D: tl.constexpr, BD: tl.constexpr, HAS_ONORM: tl.constexpr):
    n = tl.program_id(0).to(tl.int64)
    d = tl.arange(0, BD)
    inside = d < D
    row = n * D + d
    qw = tl.load(q + d, mask=inside, other=0.0).to(tl.float32) * tl.load(w + d, mask=inside, other=0.0).to(tl.float32)

    m = tl.full([], float("-inf"), dtype=tl.float32)  # the running max of the logits
    total = tl.zeros([], dtype=tl.float32)  # sum_l exp(logit_l - m)
    o_pre = tl.zeros([BD], dtype=tl.float32)  # sum_l exp(logit_l - m) v_l
    for i in tl.static_range(L2):  # res is padded to L2 entries; those past L are never read
        if i < L:
            v = tl.load(res[i] + row, mask=inside, other=0.0, eviction_policy="evict_first").to(tl.float32)
            r = tl.rsqrt(tl.sum(v * v, axis=0) / D + eps)
            s = tl.sum(v * qw, axis=0) * r
            tl.store(rstd + i * N + n, r)
            tl.store(logit + i * N + n, s)
            m_new = tl.maximum(m, s)
            shrink = tl.exp(m - m_new)
            p = tl.exp(s - m_new)
            total = total * shrink + p
            o_pre = o_pre * shrink + p * v
            m = m_new
    tl.store(lse + n, m + tl.log(total))
    out = o_pre / total
    if HAS_ONORM:
        o_rstd = tl.rsqrt(tl.sum(out * out, axis=0) / D + eps)
        out = out * o_rstd * tl.load(ow + d, mask=inside, other=0.0).to(tl.float32)
    tl.store(o + row, out.to(o.dtype.element_ty), mask=inside)


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


def forward(q, w, ow, residuals, eps: float):
    """residuals K x (N, D) contiguous, 16-byte aligned, one dtype -> (o (N, D) in their dtype,
    rstd (K, N), logit (K, N), lse (N,)) fp32, as `attn_res_fused.reference_forward` returns them."""
    K = len(residuals)
    N, D = residuals[0].shape
    L2 = max(8, triton.next_power_of_2(K))
    o = torch.empty_like(residuals[0])
    rstd = torch.empty(K, N, dtype=torch.float32, device=o.device)
    logit = torch.empty_like(rstd)
    lse = torch.empty(N, dtype=torch.float32, device=o.device)
    attn_res_fwd_kernel[(N,)](
        q, w, ow, tuple(residuals) + (residuals[0],) * (L2 - K), o, rstd, logit, lse, N, K, eps,
        L2=L2, D=D, BD=triton.next_power_of_2(D), HAS_ONORM=ow is not None, num_warps=4)
    return o, rstd, logit, lse
