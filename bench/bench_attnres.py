"""AttnRes alone: FLA's fused kernels against alternatives, in GB/s against the GPU's own copy rate.

    python bench/bench_attnres.py --write                           # the trial shapes, on a GPU
    python bench/bench_attnres.py --sources 4,13 --rows fla,fla_split     # a subset
    python bench/bench_attnres.py --device cpu --tokens 512 --dim 64 --sources 3 --reps 2   # harness check

One AttnRes call as k3lab makes it (`k3lab.ops.attn_res.fused`): K sources of N x D in bf16,
the RMS-normalised scores against a learned query, the softmax over sources, the mixture and the
pre-norm after it (`output_rms_weight`), with its backward. N = 64 x 1024 tokens and D = 512
are the `small` preset's trials in the gpu profiles. K is the number of candidates a layer mixes,
at most: 2 for blocks of 8 (an endpoint and the live prefix), 4 for blocks of 4, 7 for blocks of
2, and 13 for full AttnRes over 12 layers (12 endpoints and the prefix).

Rows:
    fla            fla.ops.attnres.fused_attnres, forward and backward
    fla_gluon      the same entry with FLA's Gluon backend (FLA_ATTNRES_GLUON=1, off by default in FLA
                   0.6.0: sources indexed at compile time, tiles staged through shared memory)
    fla_split      FLA's forward and its dv kernel, then the column sums that give dq, dw and
                   the output norm's weight gradient by torch.sum over the N rows (which spreads
                   the N axis over the whole GPU), instead of FLA's attnres_bwd_kernel_dqdw,
                   whose grid is D / BD programs (8-32 for D = 512) that each walk all N rows
    k3lab          what the model runs (`k3lab.ops.attn_res.fused.AttnResMixture`): k3lab's
                   forward and backward kernels (`k3lab.ops.attn_res.kernel`) and the column sums by
                   torch.sum; here every source is a leaf, so each gradient gets its own
                   buffer, as in the rows above
    naive_compiled `reference_attnres` (plain PyTorch, fp32 math, as fla.ops.attnres.naive_attnres)
                   under torch.compile (eager on CPU)
    dqdw_fla, dqdw_split
                   the reduction stage alone on the same (N, D) fp32 buffers: FLA's kernel
                   against torch.sum
    fwd            the forward kernel alone, at the largest K (`kernel.forward`);
                   GB/s over the forward's bytes (below)
    dv_store, dv_sum, add
                   a source's gradient, at the largest K: k3lab's backward kernel alone
                   writing every source's gradient to its own buffer (dv_store), the same
                   kernel adding the K - 1 endpoints' gradients into buffers that already hold
                   an earlier reader's (dv_sum: one more read each), and one eager add of two
                   N x D bf16 buffers (add), which autograd runs per reader of an endpoint
                   instead; GB/s over the bytes each moves
    copy           a device-to-device copy of 2 GiB: the bandwidth the rows are measured against

Bytes counted (what the algorithm must move, s = 2 bytes for bf16):
    forward   K*N*D*s read + N*D*s written (+ K*N*8 of logits and rstd, N*4 of lse)
    backward  2*K*N*D*s read (checkpoint level 1 re-reads the sources to rebuild the mixture)
              + N*D*s (do) read + K*N*D*s (dv) written + the stats (FLA's kernels and the
              fla_split row also write and read back 2 x N*D*4 of per-row dqw and dow terms,
              which k3lab's kernel sums over its own rows: not counted, so the rows compare
              times on the same bytes)
    dqdw      2 x N*D*4 read
    dv_store  the backward kernel's bytes (K*N*D*s + N*D*s + K*N*D*s read, K*N*D*s written, + the
              stats; its partial sums, G x D fp32 with G <= 4096, are left out); dv_sum adds
              (K-1)*N*D*s read
    add       3 x N*D*s (two read, one written)
GB/s = bytes / mean time; "of copy" = that against the copy row's GB/s (bytes read + written).
Times: CUDA events around `--reps` calls after `--warmup` calls, mean per call.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from k3lab.ops.attn_res.fused import column_sums  # noqa: E402
from k3lab.ops.attn_res.naive import reference_attnres  # noqa: E402

SECTION = "AttnRes alone: FLA's kernels against alternatives"


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tokens", type=int, default=64 * 1024, help="N: rows (batch x sequence)")
    parser.add_argument("--dim", type=int, default=512, help="D: hidden size")
    parser.add_argument("--sources", default="2,4,7,13", help="K values, comma-separated")
    parser.add_argument("--rows", default="fla,fla_gluon,fla_split,k3lab,naive_compiled,dqdw,fwd,dv",
                        help="which rows, comma-separated (dqdw: the reduction rows, fwd: the forward kernel, "
                             "dv: dv_store, dv_sum, add)")
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--write", action="store_true", help="write the table into docs/benchmarks.md")
    return parser.parse_args()


def split_attnres():
    """fused_attnres with FLA's forward and dv kernel and `column_sums` in place of its dqdw kernel."""
    from fla.ops.attnres import fused as fla

    class SplitReduceAttnres(torch.autograd.Function):
        @staticmethod
        def forward(ctx, query, rms_weight, output_rms_weight, eps, *residuals):
            res = fla._build_ptr_table(residuals)
            o, o_pre, rstd, logit, lse = fla.fused_attnres_fwd(q=query, residuals=residuals, res=res, w=rms_weight,
                                                               ow=output_rms_weight, eps=eps, scale=1.0,
                                                               checkpoint_level=1)
            ctx.save_for_backward(query, rms_weight, output_rms_weight, rstd, logit, lse, *residuals)
            ctx.eps, ctx.res = eps, res
            return o

        @staticmethod
        def backward(ctx, do):
            q, w, ow, rstd, logit, lse, *residuals = ctx.saved_tensors
            do = do.contiguous()
            N, D = do.shape
            L = len(residuals)
            dvs = [torch.empty_like(r) for r in residuals]
            partials = torch.empty(1 + (ow is not None), N, D, dtype=torch.float32, device=do.device)
            dqw, dow_partial = partials[0], (partials[1] if ow is not None else None)
            fla.attnres_bwd_kernel_dv[(N,)](
                q=q, res=ctx.res, w=w, ow=ow, o_pre=None, rstd=rstd, logit=logit, lse=lse, do=do,
                dres=fla._build_ptr_table(dvs), dqw=dqw, dow_partial=dow_partial, N=N, L=L,
                L2=max(8, fla.triton.next_power_of_2(L)), D=D, eps=ctx.eps, scale=1.0,
                BD=fla.triton.next_power_of_2(D), HAS_ONORM=ow is not None, SAVE_OPRE=False)
            dq, dw, dow = column_sums(partials, q, w, ow)
            return (dq, dw, dow, None, *dvs)

    def call(query, residuals, rms_weight, output_rms_weight, rms_eps):
        return SplitReduceAttnres.apply(query, rms_weight, output_rms_weight, rms_eps, *residuals)

    return call


def timed(fn, reps: int, warmup: int, device: torch.device) -> float:
    """Mean seconds per call of fn()."""
    for _ in range(warmup):
        fn()
    if device.type == "cuda":
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(reps):
            fn()
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end) / 1000 / reps
    began = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - began) / reps


def copy_gbps(device: torch.device, reps: int, warmup: int) -> float:
    """Bytes read + written per second by a device-to-device copy of 2 GiB (256 MiB on CPU)."""
    n = (2 if device.type == "cuda" else 0.25) * 2**30
    src = torch.empty(int(n), dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    return 2 * src.numel() / timed(lambda: dst.copy_(src), reps, warmup, device) / 1e9


def attnres_bytes(K: int, N: int, D: int, s: int = 2) -> tuple[int, int]:
    """(forward, backward) bytes as the module docstring counts them."""
    stats = K * N * 8 + N * 4
    forward = K * N * D * s + N * D * s + stats
    backward = 2 * K * N * D * s + N * D * s + K * N * D * s + stats
    return forward, backward


def inputs(K: int, N: int, D: int, device: torch.device, dtype=torch.bfloat16, requires_grad: bool = True):
    """(residuals K x (N, D), query, rms_weight, out_weight (D,), do (N, D)); requires_grad=False
    for the stages that call a kernel directly, outside autograd."""
    g = torch.Generator(device="cpu").manual_seed(K)
    residuals = [torch.randn(N, D, generator=g).to(device, dtype).requires_grad_(requires_grad) for _ in range(K)]
    query = (0.02 * torch.randn(D, generator=g)).to(device).requires_grad_(requires_grad)
    rms_weight = (1 + 0.1 * torch.randn(D, generator=g)).to(device).requires_grad_(requires_grad)
    out_weight = (1 + 0.1 * torch.randn(D, generator=g)).to(device).requires_grad_(requires_grad)
    do = torch.randn(N, D, generator=g).to(device, dtype)
    return residuals, query, rms_weight, out_weight, do


def with_gluon_attnres():
    """fused_attnres dispatched to FLA's Gluon backend: FLA reads FLA_ATTNRES_GLUON at each call
    (the forward picks the backend, and its autograd function the backward)."""
    import os

    from fla.ops.attnres import fused_attnres

    def call(q, r, w, ow, eps):
        os.environ["FLA_ATTNRES_GLUON"] = "1"
        try:
            out = fused_attnres(q, r, w, ow, eps)
        finally:
            del os.environ["FLA_ATTNRES_GLUON"]
        if out.requires_grad and not made_by("Gluon", out):  # FLA falls back to Triton silently
            raise RuntimeError("FLA did not dispatch fused_attnres to its Gluon backend here")
        return out

    return call


def made_by(name: str, out: torch.Tensor, depth: int = 3) -> bool:
    """Whether an autograd function whose class name holds `name` made `out` (through a few views)."""
    fn = out.grad_fn
    for _ in range(depth):
        if fn is None:
            return False
        if name in type(fn).__name__:
            return True
        fn = fn.next_functions[0][0] if fn.next_functions else None
    return False


def implementations(names: list[str], device: torch.device) -> dict:
    """name -> fn(query, residuals, rms_weight, output_rms_weight, rms_eps) returning o."""
    found = {}
    if device.type == "cuda" and "fla" in names:
        from fla.ops.attnres import fused_attnres
        found["fla"] = lambda q, r, w, ow, eps: fused_attnres(q, r, w, ow, eps)
    if device.type == "cuda" and "fla_gluon" in names:
        found["fla_gluon"] = with_gluon_attnres()
    if device.type == "cuda" and "fla_split" in names:
        found["fla_split"] = split_attnres()
    if "k3lab" in names:  # on CPU: the same function with its plain-PyTorch twins
        from k3lab.ops.attn_res.fused import AttnResMixture

        found["k3lab"] = lambda q, r, w, ow, eps: AttnResMixture.apply(q, w, ow, eps, *r)[0]
    if "naive_compiled" in names:
        found["naive_compiled"] = torch.compile(reference_attnres) if device.type == "cuda" else reference_attnres
    return found


def measure_call(fn, K: int, N: int, D: int, args, device: torch.device) -> dict:
    residuals, query, rms_weight, out_weight, do = inputs(K, N, D, device)
    leaves = [query, rms_weight, out_weight, *residuals]

    def forward():
        return fn(query, residuals, rms_weight, out_weight, 1e-6)

    out = forward()
    backward = lambda: torch.autograd.grad(out, leaves, do, retain_graph=True)  # noqa: E731
    with torch.no_grad():
        fwd_s = timed(forward, args.reps, args.warmup, device)
    bwd_s = timed(backward, args.reps, args.warmup, device)
    fwd_bytes, bwd_bytes = attnres_bytes(K, N, D)
    return {"fwd_ms": 1e3 * fwd_s, "bwd_ms": 1e3 * bwd_s, "fwd_gbps": fwd_bytes / fwd_s / 1e9,
            "bwd_gbps": bwd_bytes / bwd_s / 1e9}


def measure_dqdw(N: int, D: int, args, device: torch.device) -> dict:
    """The reduction stage alone: FLA's dqdw kernel (on a GPU) and torch.sum, same buffers."""
    g = torch.Generator(device="cpu").manual_seed(0)
    partials = torch.randn(2, N, D, generator=g).to(device)  # per-row dqw and dow terms
    dqw, dow_partial = partials
    q, w, ow = (torch.randn(D, generator=g).to(device) for _ in range(3))
    rows = {"dqdw_split": lambda: column_sums(partials, q, w, ow)}
    if device.type == "cuda":
        from fla.ops.attnres import fused as fla

        dq, dw, dow = torch.empty_like(q), torch.empty_like(w), torch.empty_like(ow)
        grid = lambda meta: (fla.triton.cdiv(D, meta["BD"]),)  # noqa: E731
        rows["dqdw_fla"] = lambda: fla.attnres_bwd_kernel_dqdw[grid](
            q=q, w=w, dqw=dqw, dow_partial=dow_partial, dq=dq, dw=dw, dow=dow, N=N, D=D, HAS_ONORM=True)
    nbytes = 2 * N * D * 4
    return {name: nbytes / timed(fn, args.reps, args.warmup, device) / 1e9 for name, fn in rows.items()}


def measure_fwd(K: int, N: int, D: int, args, device: torch.device) -> dict:
    """The forward kernel alone (on a GPU; the plain-PyTorch twin on CPU): {row: GB/s}."""
    from k3lab.ops.attn_res.naive import reference_forward

    residuals, q, w, ow, _ = inputs(K, N, D, device, requires_grad=False)
    kernels = {"fwd": reference_forward}
    if device.type == "cuda":
        from k3lab.ops.attn_res.kernel import forward

        kernels = {"fwd": forward}
    nbytes = attnres_bytes(K, N, D)[0]
    return {name: nbytes / timed(lambda fn=fn: fn(q, w, ow, residuals, 1e-6), args.reps, args.warmup, device) / 1e9
            for name, fn in kernels.items()}


def measure_dv(K: int, N: int, D: int, args, device: torch.device) -> dict:
    """k3lab's backward kernel alone, storing and summing, and one eager add: {row: GB/s}."""
    from k3lab.ops.attn_res.naive import dv_reference, reference_forward

    residuals, q, w, ow, do = inputs(K, N, D, device, requires_grad=False)
    if device.type == "cuda":
        from k3lab.ops.attn_res.kernel import dv_backward, forward
        _, rstd, logit, lse = forward(q, w, ow, residuals, 1e-6)
    else:
        dv_backward = dv_reference
        _, rstd, logit, lse = reference_forward(q, w, ow, residuals, 1e-6)
    targets = [torch.zeros_like(r) for r in residuals]
    endpoints = (1 << (K - 1)) - 1  # every source but the live prefix (the last)
    stats = K * N * 8 + N * 4
    s = residuals[0].element_size()
    store_bytes = 3 * K * N * D * s + N * D * s + stats
    rows = {"dv_store": (lambda acc=0: dv_backward(q, w, ow, residuals, rstd, logit, lse, do, targets, acc, 1e-6),
                         store_bytes),
            "dv_sum": (lambda acc=endpoints: dv_backward(q, w, ow, residuals, rstd, logit, lse, do, targets, acc,
                                                         1e-6), store_bytes + (K - 1) * N * D * s),
            "add": (lambda: residuals[0] + residuals[1], 3 * N * D * s)}
    return {name: nbytes / timed(fn, args.reps, args.warmup, device) / 1e9 for name, (fn, nbytes) in rows.items()}


def table(results: list[dict], copy: float) -> str:
    lines = [f"Copy (device to device, read + written): {copy:,.0f} GB/s.", "",
             "| row | K | N x D | forward (ms) | forward GB/s | of copy | backward (ms) | backward GB/s | of copy |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in (r for r in results if "fwd_ms" in r):
        forward = f"{r['fwd_ms']:.3f} | {r['fwd_gbps']:,.0f} | {r['fwd_gbps'] / copy:.0%}"
        backward = f"{r['bwd_ms']:.3f} | {r['bwd_gbps']:,.0f} | {r['bwd_gbps'] / copy:.0%}"
        lines.append(f"| {r['row']} | {r['K']} | {r['N']:,} x {r['D']} | {forward} | {backward} |")
    reductions = [r for r in results if "gbps" in r]
    if reductions:
        lines += ["", "| stage | N x D | GB/s | of copy |", "|---|---|---|---|"]
        lines += [f"| {r['row']} | {r['N']:,} x {r['D']} | {r['gbps']:,.0f} | {r['gbps'] / copy:.0%} |"
                  for r in reductions]
    return "\n".join(lines)


def main() -> None:
    args = parse_args()
    device = torch.device(args.device)
    if device.type == "cuda":
        from k3lab.runtime.kernel_cache import open_kernel_cache

        open_kernel_cache()  # before FLA's kernels autotune: k3lab's cache, from its shipped tunings
        if not torch.cuda.is_available():
            sys.exit("bench_attnres.py: no CUDA GPU here (--device cpu checks the harness)")
    names = args.rows.split(",")
    N, D = args.tokens, args.dim
    copy = copy_gbps(device, args.reps, args.warmup)
    results = []
    for name, fn in implementations(names, device).items():
        for K in (int(k) for k in args.sources.split(",")):
            try:
                row = {"row": name, "K": K, "N": N, "D": D, **measure_call(fn, K, N, D, args, device)}
            except RuntimeError as error:  # a row that cannot run here; the others still can
                print(f"{name} K={K}: not measured ({error})", flush=True)
                continue
            print(row, flush=True)
            results.append(row)
    stages = measure_dqdw(N, D, args, device) if "dqdw" in names else {}
    if "fwd" in names:
        stages |= measure_fwd(max(int(k) for k in args.sources.split(",")), N, D, args, device)
    if "dv" in names:
        stages |= measure_dv(max(int(k) for k in args.sources.split(",")), N, D, args, device)
    for name, gbps in stages.items():
        results.append({"row": name, "N": N, "D": D, "gbps": gbps})
        print(results[-1], flush=True)
    body = table(results, copy)
    print(body)
    if args.write:
        from bench.report import write_section

        write_section(SECTION, body)


if __name__ == "__main__":
    main()
