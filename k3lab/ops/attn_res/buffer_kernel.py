"""k3lab's Triton kernels for AttnRes over the endpoint buffer: every source of a token row held
in registers, so each is read once forward and once backward.

The sources of a mixture are the P stored endpoints, slots 0..P-1 of one (S, N, D) buffer
(`fused.EndpointBuffer`), then the live prefix (N, D). With the endpoints one stride apart a
program loads all of a row's endpoints as one (SLOTS, BD) block (SLOTS = P rounded up to a power
of two, P a run-time value: one compiled kernel per SLOTS, not per P), so the backward rebuilds
the mixture and takes every source's gradient from the same registers where `kernel.py`'s reads
each source twice (once to rebuild the mixture, once for its gradient). The math and the
statistics kept between the two are `kernel.py`'s (its docstring; twins: `naive.reference_forward`
and `naive.buffer_dv_reference`):

    logit_l = rstd_l <v_l, q * w>,  p = softmax(logit),  o = RMSNorm(sum_l p_l v_l) * ow
    dv_l    = p_l g + ds_l rstd_l (qw - k_l logit_l / D),  ds_l = p_l (<v_l, g> - <g, o_pre>)

The backward adds each endpoint's gradient to what its slot of the gradient buffer holds (the
buffer starts at zero; every reader of an endpoint adds its share there) and stores the prefix's.
Each backward program walks STEPS rows and writes one partial sum of dqw and of the output norm's
weight gradient, finished by `fused.column_sums`, as `kernel.py`'s backward does.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

PARTIAL_ROWS = 4096  # the backward walks rows until at most this many partial sums are left (as kernel.py's)


def slots_of(P: int) -> int:
    """Endpoint slots a kernel is compiled for: P rounded up to a power of two (1 when P = 0)."""
    return triton.next_power_of_2(max(P, 1))


def warps_of(slots: int, BD: int) -> int:
    """Warps a program: a row's (SLOTS + 1) x BD fp32 values at about 32 a thread, 1 to 8 warps."""
    return min(8, max(1, triton.next_power_of_2((slots + 1) * BD // 1024)))


@triton.jit
def row_sources(values, prefix, n, N, P, s, d, D: tl.constexpr):
    """Row n's endpoints (SLOTS, BD) and prefix (BD,) in fp32, and their masks."""
    stored = (s < P) & (n < N)
    inside = d < D
    vmask = stored[:, None] & inside[None, :]
    xmask = inside & (n < N)
    at = (s.to(tl.int64) * N)[:, None] * D + n * D + d[None, :]
    V = tl.load(values + at, mask=vmask, other=0.0).to(tl.float32)
    x = tl.load(prefix + n * D + d, mask=xmask, other=0.0).to(tl.float32)
    return V, x, at, stored, vmask, xmask


@triton.jit(do_not_specialize=["N", "P"])
def buffer_fwd_kernel(q, w, ow, values, prefix, o, rstd, logit, lse, N, P, eps, SLOTS: tl.constexpr,
                      D: tl.constexpr, BD: tl.constexpr, HAS_ONORM: tl.constexpr):
    n = tl.program_id(0).to(tl.int64)
    s, d = tl.arange(0, SLOTS), tl.arange(0, BD)
    inside = d < D
    qw = tl.load(q + d, mask=inside, other=0.0).to(tl.float32) * tl.load(w + d, mask=inside, other=0.0).to(tl.float32)
    V, x, _, stored, _, xmask = row_sources(values, prefix, n, N, P, s, d, D)
    rv = tl.rsqrt(tl.sum(V * V, axis=1) / D + eps)  # (SLOTS,)
    sv = tl.where(stored, tl.sum(V * qw[None, :], axis=1) * rv, float("-inf"))
    rx = tl.rsqrt(tl.sum(x * x, axis=0) / D + eps)
    sx = tl.sum(x * qw, axis=0) * rx
    m = tl.maximum(tl.max(sv, axis=0), sx)
    ev, ex = tl.exp(sv - m), tl.exp(sx - m)
    total = tl.sum(ev, axis=0) + ex
    out = (tl.sum(ev[:, None] * V, axis=0) + ex * x) / total
    tl.store(rstd + s * N + n, rv, mask=stored)
    tl.store(logit + s * N + n, sv, mask=stored)
    tl.store(rstd + P * N + n, rx)
    tl.store(logit + P * N + n, sx)
    tl.store(lse + n, m + tl.log(total))
    if HAS_ONORM:
        o_rstd = tl.rsqrt(tl.sum(out * out, axis=0) / D + eps)
        out = out * o_rstd * tl.load(ow + d, mask=inside, other=0.0).to(tl.float32)
    tl.store(o + n * D + d, out.to(o.dtype.element_ty), mask=xmask)


@triton.jit(do_not_specialize=["N", "P"])
def buffer_bwd_kernel(q, w, ow, values, prefix, grads, dprefix, rstd, logit, lse, do, partials, N, P, eps,
                      SLOTS: tl.constexpr, D: tl.constexpr, BD: tl.constexpr, STEPS: tl.constexpr,
                      HAS_ONORM: tl.constexpr):
    program = tl.program_id(0).to(tl.int64)
    s, d = tl.arange(0, SLOTS), tl.arange(0, BD)
    inside = d < D
    qw = tl.load(q + d, mask=inside, other=0.0).to(tl.float32) * tl.load(w + d, mask=inside, other=0.0).to(tl.float32)
    w_out = qw  # unread without the output norm
    if HAS_ONORM:
        w_out = tl.load(ow + d, mask=inside, other=0.0).to(tl.float32)
    dqw_sum = tl.zeros([BD], dtype=tl.float32)
    dow_sum = tl.zeros([BD], dtype=tl.float32)
    for step in range(STEPS):
        n = program * STEPS + step
        V, x, at, stored, vmask, xmask = row_sources(values, prefix, n, N, P, s, d, D)
        g = tl.load(do + n * D + d, mask=xmask, other=0.0).to(tl.float32)  # rows past N: g = 0, no share
        lse_n = tl.load(lse + n, mask=n < N, other=0.0)
        rv = tl.load(rstd + s * N + n, mask=stored, other=0.0)
        sv = tl.load(logit + s * N + n, mask=stored, other=0.0)
        rx = tl.load(rstd + P * N + n, mask=n < N, other=0.0)
        sx = tl.load(logit + P * N + n, mask=n < N, other=0.0)
        pv = tl.where(stored, tl.exp(sv - lse_n), 0.0)
        px = tl.exp(sx - lse_n)
        o_pre = tl.sum(pv[:, None] * V, axis=0) + px * x
        if HAS_ONORM:
            o_rstd = tl.rsqrt(tl.sum(o_pre * o_pre, axis=0) / D + eps)
            xhat = o_pre * o_rstd
            dow_sum += xhat * g
            c1 = tl.sum(xhat * w_out * g, axis=0) / D
            g = (w_out * g - xhat * c1) * o_rstd
        delta = tl.sum(g * o_pre, axis=0)
        dsv = pv * (tl.sum(V * g[None, :], axis=1) - delta)
        dsx = px * (tl.sum(x * g, axis=0) - delta)
        kV, kx = V * rv[:, None], x * rx
        dV = pv[:, None] * g[None, :] + (dsv * rv)[:, None] * (qw[None, :] - kV * (sv / D)[:, None])
        dV += tl.load(grads + at, mask=vmask, other=0.0).to(tl.float32)
        tl.store(grads + at, dV.to(grads.dtype.element_ty), mask=vmask)
        dx = px * g + (dsx * rx) * (qw - kx * (sx / D))
        tl.store(dprefix + n * D + d, dx.to(dprefix.dtype.element_ty), mask=xmask)
        dqw_sum += tl.sum(dsv[:, None] * kV, axis=0) + dsx * kx
    tl.store(partials + program * D + d, dqw_sum, mask=inside)  # partials[0, program]
    if HAS_ONORM:
        tl.store(partials + (tl.num_programs(0) + program) * D + d, dow_sum, mask=inside)


def forward(q, w, ow, values, count: int, prefix, eps: float):
    """Slots 0..count-1 of values (S, N, D) and prefix (N, D), one dtype, contiguous -> (o (N, D)
    in their dtype, rstd (K, N), logit (K, N), lse (N,)) fp32, K = count + 1, as
    `naive.reference_forward` returns them for the sources [slots..., prefix]."""
    N, D = prefix.shape
    o = torch.empty_like(prefix)
    rstd = torch.empty(count + 1, N, dtype=torch.float32, device=o.device)
    logit = torch.empty_like(rstd)
    lse = torch.empty(N, dtype=torch.float32, device=o.device)
    SLOTS, BD = slots_of(count), triton.next_power_of_2(D)
    buffer_fwd_kernel[(N,)](q, w, ow, values, prefix, o, rstd, logit, lse, N, count, eps, SLOTS=SLOTS, D=D, BD=BD,
                            HAS_ONORM=ow is not None, num_warps=warps_of(SLOTS, BD))
    return o, rstd, logit, lse


def backward(q, w, ow, values, count: int, prefix, rstd, logit, lse, do, grads, dprefix, eps: float):
    """Add slot l's gradient into grads[l] (S, N, D) for l < count, store the prefix's in dprefix
    (N, D); returns the (1 or 2, G, D) fp32 partial sums of dqw (and dow) for `fused.column_sums`."""
    N, D = prefix.shape
    steps = 1
    while triton.cdiv(N, steps) > PARTIAL_ROWS:
        steps *= 2
    programs = triton.cdiv(N, steps)
    partials = torch.empty(1 + (ow is not None), programs, D, dtype=torch.float32, device=do.device)
    SLOTS, BD = slots_of(count), triton.next_power_of_2(D)
    buffer_bwd_kernel[(programs,)](q, w, ow, values, prefix, grads, dprefix, rstd, logit, lse, do, partials, N, count,
                                   eps, SLOTS=SLOTS, D=D, BD=BD, STEPS=steps, HAS_ONORM=ow is not None,
                                   num_warps=warps_of(SLOTS, BD))
    return partials
