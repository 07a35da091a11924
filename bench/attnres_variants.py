"""Candidate AttnRes kernels, measured by bench/bench_attnres.py against the model's own before
any of them goes into `k3lab.model` (where a change also means re-making the shipped tunings).

forward_rows: `k3lab.model.attn_res_kernel.forward` with ROWS token rows per program instead of
one. The model's kernel reads its bytes at 37-42% of the H200's copy rate (2026-12-02), where
its backward reaches 81-83%. Each source there costs two reductions (the RMS and the score)
over one row of D values spread over all 4 warps: shared memory and a barrier each. With ROWS
rows a program on ROWS warps, fewer warps share a row and each program keeps ROWS rows' loads in
flight per source. At D = 512 in bf16 Triton 3.6 lays a row on 2 warps (warpsPerCTA [2, 2] for
4 rows, [4, 2] for 8; compiled for sm_90 on CPU), so the reductions still cross warps, only
fewer of them; at D <= 256 a row fits one warp. Same math; the plain-PyTorch twin is
`k3lab.model.attn_res_fused.reference_forward`, as for the model's kernel
(tests/test_attn_res_kernel_interpreted.py runs both through Triton's interpreter, which sums in
the same order as the model's kernel, so there they agree exactly; a GPU may round otherwise).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit(do_not_specialize=["N", "L"])
def attn_res_fwd_rows_kernel(q, w, ow, res, o, rstd, logit, lse, N, L, eps, L2: tl.constexpr, D: tl.constexpr,
                             BD: tl.constexpr, ROWS: tl.constexpr, HAS_ONORM: tl.constexpr):
    n = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)  # (ROWS,)
    d = tl.arange(0, BD)
    rows_in, inside = n < N, d < D
    mask = rows_in[:, None] & inside[None, :]
    at = n[:, None] * D + d[None, :]  # (ROWS, BD)
    qw = tl.load(q + d, mask=inside, other=0.0).to(tl.float32) * tl.load(w + d, mask=inside, other=0.0).to(tl.float32)

    m = tl.full([ROWS], float("-inf"), dtype=tl.float32)
    total = tl.zeros([ROWS], dtype=tl.float32)
    o_pre = tl.zeros([ROWS, BD], dtype=tl.float32)
    for i in tl.static_range(L2):
        if i < L:
            v = tl.load(res[i] + at, mask=mask, other=0.0, eviction_policy="evict_first").to(tl.float32)
            r = tl.rsqrt(tl.sum(v * v, axis=1) / D + eps)
            s = tl.sum(v * qw[None, :], axis=1) * r
            tl.store(rstd + i * N + n, r, mask=rows_in)
            tl.store(logit + i * N + n, s, mask=rows_in)
            m_new = tl.maximum(m, s)
            shrink = tl.exp(m - m_new)
            p = tl.exp(s - m_new)
            total = total * shrink + p
            o_pre = o_pre * shrink[:, None] + p[:, None] * v
            m = m_new
    tl.store(lse + n, m + tl.log(total), mask=rows_in)
    out = o_pre / total[:, None]
    if HAS_ONORM:
        o_rstd = tl.rsqrt(tl.sum(out * out, axis=1) / D + eps)
        out = out * o_rstd[:, None] * tl.load(ow + d, mask=inside, other=0.0).to(tl.float32)[None, :]
    tl.store(o + at, out.to(o.dtype.element_ty), mask=mask)


def forward_rows(q, w, ow, residuals, eps: float, rows: int = 4):
    """As `k3lab.model.attn_res_kernel.forward`, `rows` token rows a program (one per warp)."""
    K = len(residuals)
    N, D = residuals[0].shape
    L2 = max(8, triton.next_power_of_2(K))
    o = torch.empty_like(residuals[0])
    rstd = torch.empty(K, N, dtype=torch.float32, device=o.device)
    logit = torch.empty_like(rstd)
    lse = torch.empty(N, dtype=torch.float32, device=o.device)
    attn_res_fwd_rows_kernel[(triton.cdiv(N, rows),)](
        q, w, ow, tuple(residuals) + (residuals[0],) * (L2 - K), o, rstd, logit, lse, N, K, eps,
        L2=L2, D=D, BD=triton.next_power_of_2(D), ROWS=rows, HAS_ONORM=ow is not None, num_warps=rows)
    return o, rstd, logit, lse
