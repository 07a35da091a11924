"""Candidates for k3lab's AttnRes kernels (`k3lab.ops.attn_res.kernel`), timed beside them.

    python scripts/attnres_variants.py            # on a GPU: each candidate against the model's kernels
    TRITON_INTERPRET=1 python scripts/attnres_variants.py --check   # on CPU: outputs only, small N

Written when the model's kernels took the number of sources L as a runtime value (sources padded
to a power of two >= 8, `if i < L` in an unrolled loop, so one compiled kernel served K = 1..8),
with four token rows a program on four warps. Every source's load sat behind a branch, and a
program waited for each load before it issued the next. The candidates made L a compile-time
constant (one kernel per K; a `small` trial has K = 2, 3, 4), each at 1, 2, 4 or 8 rows a program:
- fwd_const: the forward with L constexpr, sources loaded back to back;
- bwd_const: the backward with L constexpr (each source still read twice);
- bwd_once: bwd_const that keeps each source's tile (bf16) and logit from the first pass for the
  second, so a source is read once;
- bwd_once_acc: bwd_once with ACC (which sources add to their buffer) constexpr as well.
fwd_const and bwd_const at one row a program on one warp won, and are the model's kernels for up
to `EXACT_SOURCES` sources (docs/journal/kernel-headroom.md; logs: docs/runs/attnres-variants-*.log).
So this script now runs those two through the model's kernels themselves, at the row counts asked
(rows `model` with rows given); the `model` rows without rows time what the model runs. bwd_once and
bwd_once_acc, not taken, are kept here, one body for both.
Each is checked against the model's kernel on the same inputs (largest absolute difference of every
output) and timed with CUDA events: ms per call and GB/s of the bytes a call must move (each source
read once, each gradient written, the summed ones read, do read, the output written).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench.bench_attnres import inputs, timed  # noqa: E402
from k3lab.ops.attn_res import kernel as model  # noqa: E402


@triton.jit
def onorm_grad(o_pre, g, w_out, eps, D: tl.constexpr):
    """(g through the output RMSNorm, xhat * do for its weight's gradient)."""
    o_rstd = tl.rsqrt(tl.sum(o_pre * o_pre, axis=1) / D + eps)
    xhat = o_pre * o_rstd[:, None]
    c1 = tl.sum(xhat * w_out[None, :] * g, axis=1) / D
    return (w_out[None, :] * g - xhat * c1[:, None]) * o_rstd[:, None], xhat * g


@triton.jit
def bwd_once_program(q, w, ow, res, dres, rstd, logit, lse, do, dqw, dow, N, ACC, eps, L: tl.constexpr,
                     D: tl.constexpr, BD: tl.constexpr, ROWS: tl.constexpr, STEPS: tl.constexpr,
                     HAS_ONORM: tl.constexpr):
    """The backward that reads each source once; ACC is a constant where the caller's is."""
    program = tl.program_id(0).to(tl.int64)
    d = tl.arange(0, BD)
    inside = d < D
    qw = tl.load(q + d, mask=inside, other=0.0).to(tl.float32) * tl.load(w + d, mask=inside, other=0.0).to(tl.float32)
    w_out = qw
    if HAS_ONORM:
        w_out = tl.load(ow + d, mask=inside, other=0.0).to(tl.float32)
    dqw_sum = tl.zeros([ROWS, BD], dtype=tl.float32)
    dow_sum = tl.zeros([ROWS, BD], dtype=tl.float32)
    for step in range(STEPS):
        n = (program * STEPS + step) * ROWS + tl.arange(0, ROWS)
        rows_in = n < N
        mask = rows_in[:, None] & inside[None, :]
        at = n[:, None] * D + d[None, :]
        lse_n = tl.load(lse + n, mask=rows_in, other=0.0)
        g = tl.load(do + at, mask=mask, other=0.0).to(tl.float32)
        o_pre = tl.zeros([ROWS, BD], dtype=tl.float32)
        vs = ()
        ss = ()
        for i in tl.static_range(L):
            v = tl.load(res[i] + at, mask=mask, other=0.0)  # kept in its dtype for the second pass
            s = tl.load(logit + i * N + n, mask=rows_in, other=0.0)
            vs = vs + (v,)
            ss = ss + (s,)
            o_pre += tl.exp(s - lse_n)[:, None] * v.to(tl.float32)
        if HAS_ONORM:
            g, dow_part = onorm_grad(o_pre, g, w_out, eps, D)
            dow_sum += dow_part
        delta = tl.sum(g * o_pre, axis=1)
        for i in tl.static_range(L):
            v = vs[i].to(tl.float32)
            s = ss[i]
            r = tl.load(rstd + i * N + n, mask=rows_in, other=0.0)
            p = tl.exp(s - lse_n)
            ds = p * (tl.sum(v * g, axis=1) - delta)
            k = v * r[:, None]
            dv = p[:, None] * g + (ds * r)[:, None] * (qw[None, :] - k * (s / D)[:, None])
            if (ACC >> i) & 1:
                dv += tl.load(dres[i] + at, mask=mask, other=0.0).to(tl.float32)
            tl.store(dres[i] + at, dv.to(dres[i].dtype.element_ty), mask=mask)
            dqw_sum += ds[:, None] * k
    tl.store(dqw + program * D + d, tl.sum(dqw_sum, axis=0), mask=inside)
    if HAS_ONORM:
        tl.store(dow + program * D + d, tl.sum(dow_sum, axis=0), mask=inside)


@triton.jit(do_not_specialize=["N", "ACC"])
def bwd_once(q, w, ow, res, dres, rstd, logit, lse, do, dqw, dow, N, ACC, eps, L: tl.constexpr, D: tl.constexpr,
             BD: tl.constexpr, ROWS: tl.constexpr, STEPS: tl.constexpr, HAS_ONORM: tl.constexpr):
    bwd_once_program(q, w, ow, res, dres, rstd, logit, lse, do, dqw, dow, N, ACC, eps, L, D, BD, ROWS, STEPS,
                     HAS_ONORM)


@triton.jit(do_not_specialize=["N"])
def bwd_once_acc(q, w, ow, res, dres, rstd, logit, lse, do, dqw, dow, N, eps, ACC: tl.constexpr, L: tl.constexpr,
                 D: tl.constexpr, BD: tl.constexpr, ROWS: tl.constexpr, STEPS: tl.constexpr,
                 HAS_ONORM: tl.constexpr):
    bwd_once_program(q, w, ow, res, dres, rstd, logit, lse, do, dqw, dow, N, ACC, eps, L, D, BD, ROWS, STEPS,
                     HAS_ONORM)


def run_fwd(q, w, ow, residuals, rows=None):
    """The model's forward; at `rows` rows a program (on as many warps) when given."""
    if rows is None:
        return model.forward(q, w, ow, residuals, 1e-6)
    K = len(residuals)
    N, D = residuals[0].shape
    o = torch.empty_like(residuals[0])
    rstd = torch.empty(K, N, dtype=torch.float32, device=o.device)
    logit, lse = torch.empty_like(rstd), torch.empty(N, dtype=torch.float32, device=o.device)
    model.attn_res_fwd_kernel[(triton.cdiv(N, rows),)](
        q, w, ow, tuple(residuals), o, rstd, logit, lse, N, K, 1e-6, L=K, PADDED=False, D=D,
        BD=triton.next_power_of_2(D), ROWS=rows, HAS_ONORM=True, num_warps=rows)
    return o, rstd, logit, lse


def run_bwd(name, q, w, ow, residuals, stats, do, targets, acc, rows=None, warps=None):
    """(dqw, dow) partial sums of the model's backward (`model`) or a candidate; at `rows` rows a
    program on `warps` warps when given (the model's own: one row on one warp)."""
    if name == "model" and rows is None:
        return model.dv_backward(q, w, ow, residuals, *stats, do, targets, acc, 1e-6)
    K = len(residuals)
    N, D = do.shape
    steps = 1
    while triton.cdiv(N, rows * steps) > model.PARTIAL_ROWS:
        steps *= 2
    programs = triton.cdiv(N, rows * steps)
    partials = torch.empty(2, programs, D, dtype=torch.float32, device=do.device)
    meta = dict(L=K, D=D, BD=triton.next_power_of_2(D), ROWS=rows, STEPS=steps, HAS_ONORM=True, num_warps=warps)
    sources = (q, w, ow, tuple(residuals), tuple(targets), *stats, do)
    if name == "model":
        model.attn_res_bwd_dv_kernel[(programs,)](*sources, partials, N, K, acc, 1e-6, PADDED=False, **meta)
    elif name == "bwd_once_acc":
        bwd_once_acc[(programs,)](*sources, *partials, N, 1e-6, ACC=acc, **meta)
    else:
        bwd_once[(programs,)](*sources, *partials, N, acc, 1e-6, **meta)
    return partials


def largest_difference(a, b) -> float:
    return max((x.float() - y.float()).abs().max().item() for x, y in zip(a, b))


def compare(K: int, N: int, D: int, device, reps: int, warmup: int, check_only: bool) -> None:
    residuals, q, w, ow, do = inputs(K, N, D, device, requires_grad=False)
    acc = (1 << (K - 1)) - 1  # every source but the live prefix sums into its buffer, as most readers do
    s = residuals[0].element_size()
    fwd_bytes = (K + 1) * N * D * s
    bwd_bytes = (K + 1) * N * D * s + K * N * D * s + (K - 1) * N * D * s
    base_fwd = run_fwd(q, w, ow, residuals)
    stats = base_fwd[1:]
    base_targets = [torch.ones_like(r) for r in residuals]
    base_sums = run_bwd("model", q, w, ow, residuals, stats, do, base_targets, acc)
    base_sums = [t.sum(0) for t in base_sums]
    cases = [("fwd", "model", {})] + [("fwd", "model", {"rows": rows}) for rows in (1, 2, 4, 8)]
    cases += [("bwd", "model", {})] + [("bwd", name, {"rows": rows, "warps": warps})
                                       for name in ("model", "bwd_once", "bwd_once_acc")
                                       for rows, warps in ((1, 1), (2, 2), (2, 4), (4, 4), (8, 8))]
    for way, name, opts in cases:
        label = f"{way} K={K} N={N} {name} {opts or ''}".rstrip()
        if way == "fwd":
            out = run_fwd(q, w, ow, residuals, **opts)
            diff = largest_difference(out, base_fwd)
            fn, nbytes = (lambda: run_fwd(q, w, ow, residuals, **opts)), fwd_bytes
        else:
            targets = [torch.ones_like(r) for r in residuals]
            sums = [t.sum(0) for t in run_bwd(name, q, w, ow, residuals, stats, do, targets, acc, **opts)]
            diff = max(largest_difference(targets, base_targets), largest_difference(sums, base_sums))
            fn, nbytes = (lambda: run_bwd(name, q, w, ow, residuals, stats, do, targets, acc, **opts)), bwd_bytes
        if check_only:
            print(f"{label}: largest difference {diff:.2e}", flush=True)
            continue
        seconds = timed(fn, reps, warmup, device)
        print(f"{label}: {seconds * 1e3:.3f} ms, {nbytes / seconds / 1e9:,.0f} GB/s, largest difference {diff:.2e}",
              flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="outputs only (small N), e.g. in Triton's interpreter")
    parser.add_argument("--reps", type=int, default=50)
    parser.add_argument("--tokens", type=lambda text: [int(n) for n in text.split(",")], default=[65536, 8192])
    args = parser.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    shapes = [(K, 64, 512) for K in (2, 4)] if args.check else [(K, N, 512) for N in args.tokens for K in (2, 3, 4, 8)]
    for K, N, D in shapes:
        compare(K, N, D, device, args.reps, 5, args.check)


if __name__ == "__main__":
    main()
