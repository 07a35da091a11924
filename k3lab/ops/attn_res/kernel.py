"""k3lab's Triton kernels for AttnRes: the mixture forward, and its backward with each source's
gradient summed where it is kept.

Both run one token row a program on one warp (a row's reductions stay inside its warp), all K
sources of the row in turn, D in one block, with no autotuning (a fresh machine has nothing to
tune for them). Up to EXACT_SOURCES sources, K is a compile-time constant (a kernel per K; a
`small` trial has K = 1 to 4), so the unrolled loop over the sources has no branches and a
program issues its loads back to back; more sources are padded (`source_slots`). It replaced
kernels with K a runtime value and four rows a program on four warps (scripts/attnres_variants.py
times both; the figures: docs/journal/kernel-headroom.md).

Forward, one read of each source (an online softmax, as flash attention does over keys):
    rstd_l  = 1 / sqrt(mean(v_l^2) + eps),   logit_l = rstd_l <v_l, q * w>
    o_pre   = sum_l p_l v_l,                 p_l = softmax_l(logit_l) = exp(logit_l - lse)
    o       = RMSNorm(o_pre) * ow            (the pre-norm after the mixture, when ow is given)
rstd, logit (K, N) and lse (N,) are kept for the backward, in fp32, as FLA's forward keeps them.
The plain-PyTorch twin is `naive.reference_forward`.

Backward:
    o_pre = sum_l p_l v_l                      the mixture, rebuilt from the sources
    g     = d out / d o_pre                    through the output RMSNorm (its weight's
                                               gradient terms xhat * do summed like dqw)
    dv_l  = p_l g + ds_l rstd_l (qw - k_l logit_l / D),   ds_l = p_l (<v_l, g> - <g, o_pre>)
    dqw   = sum_l ds_l k_l                     summed over rows: dq = dqw * w, dw = dqw * q
with k_l = rstd_l v_l, qw = q * w and p_l = exp(logit_l - lse) from the forward's statistics.
Each program walks STEPS x ROWS rows and writes one partial sum of dqw and one of the output
norm's weight gradient over them, into one (2, G, D) fp32 buffer, G = N / (STEPS x ROWS),
that `column_sums` finishes in one reduction. Per-row buffers would cost two N x D fp32 writes and
reads a call (at a `small` trial's step more than the kernel's own bf16 traffic at K = 4).
The plain-PyTorch twin is `naive.dv_twin` (per-row terms); the tests hold the kernels
to the twins.

What differs from FLA's kernels (fla.ops.attnres.fused), which compute the same terms:
- the forward reads source l through its own pointer in an unrolled loop, where FLA's gathers
  BL sources at a time through a pointer table (well below the copy rate at the trial shapes:
  bench/bench_attnres.py, docs/benchmarks.md);
- in the backward, source l's gradient is added to what its buffer already holds when bit l of
  `ACC` is set (a stored endpoint read by an earlier consumer's backward), so the sum over an
  endpoint's readers costs one read here instead of one more buffer and an eager add per reader;
- the backward reduces dq/dw over its own rows (FLA's `attnres_bwd_kernel_dqdw` walks all N rows
  on D / BD programs).
ACC is an int32: at most 31 sources (`fused.MAX_SOURCES`).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


FWD_ROWS = 1  # token rows a forward program, one warp each (chosen by scripts/attnres_variants.py)
BWD_ROWS = 1  # token rows a backward block, one warp each (chosen by bench/kernel_choices.py)
PARTIAL_ROWS = 4096  # the backward walks blocks of rows until at most this many partial sums are left
LOOP_SLOTS = 8  # a backward of more source slots walks one row block a program: no row loop (below)
EXACT_SOURCES = 4  # up to this many sources a kernel per K; above, sources padded (`source_slots`)


def source_slots(K: int) -> int:
    """Source slots a kernel is compiled for: K itself up to EXACT_SOURCES, else the next power of
    two >= 8, with `i < K` tested at run time. Compile time grows with the slots, and full AttnRes
    has K = 1..13 over 12 layers, more in deeper models; above EXACT_SOURCES, the kernels of 8, 16
    and 32 slots serve every K."""
    return K if K <= EXACT_SOURCES else max(8, triton.next_power_of_2(K))


@triton.jit
def fwd_source(v_ptr, i, n, at, mask, rows_in, qw, rstd, logit, N, eps, m, total, o_pre, D: tl.constexpr):
    """Source i read once: its rstd and logit stored, the online softmax (m, total, o_pre) updated."""
    v = tl.load(v_ptr + at, mask=mask, other=0.0, eviction_policy="evict_first").to(tl.float32)
    r = tl.rsqrt(tl.sum(v * v, axis=1) / D + eps)
    s = tl.sum(v * qw[None, :], axis=1) * r
    tl.store(rstd + i * N + n, r, mask=rows_in)
    tl.store(logit + i * N + n, s, mask=rows_in)
    m_new = tl.maximum(m, s)
    shrink = tl.exp(m - m_new)
    p = tl.exp(s - m_new)
    return m_new, total * shrink + p, o_pre * shrink[:, None] + p[:, None] * v


@triton.jit(do_not_specialize=["N", "K"])
def attn_res_fwd_kernel(q, w, ow, res, o, rstd, logit, lse, N, K, eps, L: tl.constexpr, PADDED: tl.constexpr,
                        D: tl.constexpr, BD: tl.constexpr, ROWS: tl.constexpr, HAS_ONORM: tl.constexpr):
    n = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)  # (ROWS,)
    d = tl.arange(0, BD)
    rows_in, inside = n < N, d < D
    mask = rows_in[:, None] & inside[None, :]
    at = n[:, None] * D + d[None, :]  # (ROWS, BD)
    qw = tl.load(q + d, mask=inside, other=0.0).to(tl.float32) * tl.load(w + d, mask=inside, other=0.0).to(tl.float32)

    m = tl.full([ROWS], float("-inf"), dtype=tl.float32)  # the running max of the logits
    total = tl.zeros([ROWS], dtype=tl.float32)  # sum_l exp(logit_l - m)
    o_pre = tl.zeros([ROWS, BD], dtype=tl.float32)  # sum_l exp(logit_l - m) v_l
    for i in tl.static_range(L):  # L slots: the K sources, or K padded (`source_slots`)
        if i < (K if PADDED else L):  # a run-time test only in padded slots
            m, total, o_pre = fwd_source(res[i], i, n, at, mask, rows_in, qw, rstd, logit, N, eps, m, total, o_pre, D)
    tl.store(lse + n, m + tl.log(total), mask=rows_in)
    out = o_pre / total[:, None]
    if HAS_ONORM:
        o_rstd = tl.rsqrt(tl.sum(out * out, axis=1) / D + eps)
        out = out * o_rstd[:, None] * tl.load(ow + d, mask=inside, other=0.0).to(tl.float32)[None, :]
    tl.store(o + at, out.to(o.dtype.element_ty), mask=mask)


@triton.jit
def bwd_mix_source(v_ptr, i, n, at, mask, rows_in, logit, lse_n, N, o_pre):
    """o_pre plus source i's share of the mixture."""
    p = tl.exp(tl.load(logit + i * N + n, mask=rows_in, other=0.0) - lse_n)
    return o_pre + p[:, None] * tl.load(v_ptr + at, mask=mask, other=0.0).to(tl.float32)


@triton.jit
def bwd_grad_source(v_ptr, dv_ptr, add, i, n, at, mask, rows_in, qw, g, delta, rstd, logit, lse_n, N, dqw_sum,
                    D: tl.constexpr):
    """Source i's gradient stored in dv_ptr (added to what it holds when `add`); dqw_sum plus its terms."""
    v = tl.load(v_ptr + at, mask=mask, other=0.0).to(tl.float32)
    r = tl.load(rstd + i * N + n, mask=rows_in, other=0.0)
    s = tl.load(logit + i * N + n, mask=rows_in, other=0.0)
    p = tl.exp(s - lse_n)
    ds = p * (tl.sum(v * g, axis=1) - delta)
    k = v * r[:, None]
    dv = p[:, None] * g + (ds * r)[:, None] * (qw[None, :] - k * (s / D)[:, None])
    if add:
        dv += tl.load(dv_ptr + at, mask=mask, other=0.0).to(tl.float32)
    tl.store(dv_ptr + at, dv.to(dv_ptr.dtype.element_ty), mask=mask)
    return dqw_sum + ds[:, None] * k


@triton.jit(do_not_specialize=["N", "K", "ACC"])
def attn_res_bwd_dv_kernel(q, w, ow, res, dres, rstd, logit, lse, do, partials, N, K, ACC, eps,
                           L: tl.constexpr, PADDED: tl.constexpr, D: tl.constexpr, BD: tl.constexpr,
                           ROWS: tl.constexpr, STEPS: tl.constexpr, HAS_ONORM: tl.constexpr):
    program = tl.program_id(0).to(tl.int64)
    d = tl.arange(0, BD)
    inside = d < D
    qw = tl.load(q + d, mask=inside, other=0.0).to(tl.float32) * tl.load(w + d, mask=inside, other=0.0).to(tl.float32)
    if HAS_ONORM:
        w_out = tl.load(ow + d, mask=inside, other=0.0).to(tl.float32)
    dqw_sum = tl.zeros([ROWS, BD], dtype=tl.float32)  # this program's rows, summed at the end
    dow_sum = tl.zeros([ROWS, BD], dtype=tl.float32)
    for step in range(STEPS):  # a loop, not unrolled
        n = (program * STEPS + step) * ROWS + tl.arange(0, ROWS)  # (ROWS,)
        rows_in = n < N
        mask = rows_in[:, None] & inside[None, :]
        at = n[:, None] * D + d[None, :]
        lse_n = tl.load(lse + n, mask=rows_in, other=0.0)
        g = tl.load(do + at, mask=mask, other=0.0).to(tl.float32)  # rows past N: g = 0, no share

        o_pre = tl.zeros([ROWS, BD], dtype=tl.float32)
        for i in tl.static_range(L):  # L slots: the K sources, or K padded (`source_slots`)
            if i < (K if PADDED else L):
                o_pre = bwd_mix_source(res[i], i, n, at, mask, rows_in, logit, lse_n, N, o_pre)

        if HAS_ONORM:
            o_rstd = tl.rsqrt(tl.sum(o_pre * o_pre, axis=1) / D + eps)
            xhat = o_pre * o_rstd[:, None]
            dow_sum += xhat * g
            c1 = tl.sum(xhat * w_out[None, :] * g, axis=1) / D
            g = (w_out[None, :] * g - xhat * c1[:, None]) * o_rstd[:, None]
        delta = tl.sum(g * o_pre, axis=1)

        for i in tl.static_range(L):
            if i < (K if PADDED else L):
                dqw_sum = bwd_grad_source(res[i], dres[i], (ACC >> i) & 1, i, n, at, mask, rows_in, qw, g, delta,
                                          rstd, logit, lse_n, N, dqw_sum, D)
    tl.store(partials + program * D + d, tl.sum(dqw_sum, axis=0), mask=inside)  # partials[0, program]
    if HAS_ONORM:
        tl.store(partials + (tl.num_programs(0) + program) * D + d, tl.sum(dow_sum, axis=0), mask=inside)


def row_steps(N: int, K: int) -> int:
    """Row blocks a backward program walks: the fewest (a power of two) that leave at most
    PARTIAL_ROWS partial sums, so a small N still spreads over the whole GPU; one for K sources
    in more than LOOP_SLOTS slots, whose row loop costs more than N partial sums do (chosen by
    `bench/kernel_choices.py --only attn_res_backward_rows`; docs/journal/kernel-headroom.md)."""
    if source_slots(K) > LOOP_SLOTS:
        return 1
    steps = 1
    while triton.cdiv(N, BWD_ROWS * steps) > PARTIAL_ROWS:
        steps *= 2
    return steps


def dv_backward(q, w, ow, residuals, rstd, logit, lse, do, targets, acc: int, eps: float) -> torch.Tensor:
    """Write (acc bit l set: add) source l's gradient into targets[l]; returns the partial sums of
    dqw (and of dow when ow is given) over blocks of rows, (1 or 2, G, D) fp32, that
    `fused.column_sums` finishes in one reduction.

    residuals, targets: K (N, D) contiguous, 16-byte aligned; rstd, logit: (K, N) fp32; lse (N,).
    """
    K, (N, D) = len(residuals), do.shape
    L = source_slots(K)
    steps = row_steps(N, K)
    programs = triton.cdiv(N, BWD_ROWS * steps)
    partials = torch.empty(1 + (ow is not None), programs, D, dtype=torch.float32, device=do.device)
    attn_res_bwd_dv_kernel[(programs,)](
        q, w, ow, padded(residuals, L), padded(targets, L), rstd, logit, lse, do, partials, N, K, acc, eps,
        L=L, PADDED=L != K, D=D, BD=triton.next_power_of_2(D), ROWS=BWD_ROWS, STEPS=steps,
        HAS_ONORM=ow is not None, num_warps=BWD_ROWS)
    return partials


def forward(q, w, ow, residuals, eps: float):
    """residuals K x (N, D) contiguous, 16-byte aligned, one dtype -> (o (N, D) in their dtype,
    rstd (K, N), logit (K, N), lse (N,)) fp32, as `naive.reference_forward` returns them."""
    K = len(residuals)
    N, D = residuals[0].shape
    o = torch.empty_like(residuals[0])
    rstd = torch.empty(K, N, dtype=torch.float32, device=o.device)
    logit = torch.empty_like(rstd)
    lse = torch.empty(N, dtype=torch.float32, device=o.device)
    L = source_slots(K)
    attn_res_fwd_kernel[(triton.cdiv(N, FWD_ROWS),)](
        q, w, ow, padded(residuals, L), o, rstd, logit, lse, N, K, eps, L=L, PADDED=L != K, D=D,
        BD=triton.next_power_of_2(D), ROWS=FWD_ROWS, HAS_ONORM=ow is not None, num_warps=FWD_ROWS)
    return o, rstd, logit, lse


def padded(tensors, slots: int) -> tuple:
    """tensors as a tuple of `slots` entries, the first repeated in the slots past K (never read)."""
    return tuple(tensors) + (tensors[0],) * (slots - len(tensors))
