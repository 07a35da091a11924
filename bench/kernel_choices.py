"""Constants of the GPU model chosen by measurement, timed over their candidate values.

    python bench/kernel_choices.py            # this checkout, on a GPU
    python bench/kernel_choices.py OLD_TREE   # an older checkout (its KDA layer only, if it lacks the constants)
    python bench/kernel_choices.py --only conv_backend   # one of the functions below

- `k3lab.ops.attn_res.kernel.BWD_ROWS` (token rows a backward block, one warp each) and
  `PARTIAL_ROWS` (the most partial sums of dq/dw a backward leaves): the backward kernel and the
  reduction of its partial sums at N = 65,536 rows, D = 512 (a `small` trial's step), K = 2, 4 and 13
  sources, storing every source's gradient; 1 to 8 rows a program (a warp each), up to one partial sum
  a program, where the kernel has no row loop and needs the fewest registers
  (`scripts/kernel_ptx.py --resources --steps 1`); and so `LOOP_SLOTS` (above how many source
  slots the backward has no row loop at all), which this overrides while it times.
- `k3lab.ops.attn_res.kernel.EXACT_SOURCES` (up to how many sources a kernel is compiled per K;
  above, sources are padded and tested at run time): forward and backward at K = 5, 6 and 8,
  N = 32,768 rows, D = 1,024 (bench/bench_gpu.py's AttnRes model, whose last block has K = 5),
  with the seconds the first call took (the compile) beside the time per call.
- `k3lab.model.kda.WIDTH_MULTIPLE` (the fused input matmul's width is padded to it): one
  `small` KDA layer's forward and backward in bf16 autocast, eagerly, at 64 x 1024 tokens.
- FLA's causal convolution backend (`FLA_CONV_GLUON`, Triton by default, Gluon when set): the
  convolution alone, forward and backward on a strided (64, 1024, 512) view as KDA's q, k and v
  are, with the largest difference between the two backends' results; then the KDA layer above.
- FLA's TileLang backend for KDA's backward (`FLA_TILELANG`; FLA 0.6.0 takes it for
  `chunk_kda_bwd_wy_dqkg_fused`, a `small` trial's costliest kernel, whenever the `tilelang` package
  and nvcc are there): the KDA layer above with it off and on, the largest difference of the
  layer's input gradient, whether TileLang's kernel ran, and whether a step on it can be captured
  in a CUDA graph (trials replay their steps as one).
Milliseconds per call from CUDA events, the mean over 20 calls (10 for the layer) after 3 warm-up
calls; the kernel cache k3lab ships is opened first, as the trials open it.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import yaml

ROOT = Path(__file__).resolve().parent.parent  # the checkout timed: this one, or the tree given (`main`)


def mean_ms(fn, reps: int = 20, warmup: int = 3) -> float:
    from bench.bench_attnres import timed

    return 1e3 * timed(fn, reps, warmup, torch.device("cuda"))


def attn_res_backward_rows(N: int = 65536, D: int = 512) -> None:
    from bench.bench_attnres import inputs
    from k3lab.ops.attn_res import kernel as ark  # Triton: imported once a GPU is known to be here
    from k3lab.ops.attn_res.fused import column_sums

    if not hasattr(ark, "BWD_ROWS"):  # an older checkout
        return
    ark.LOOP_SLOTS = 32  # PARTIAL_ROWS decides the row loop at every K here
    for K in (2, 4, 13):
        residuals, q, w, ow, do = inputs(K, N, D, torch.device("cuda"), requires_grad=False)
        _, rstd, logit, lse = ark.forward(q, w, ow, residuals, 1e-6)
        targets = [torch.empty_like(r) for r in residuals]

        def call():  # the kernel and the reduction of its partial sums, as the model's backward runs them
            column_sums(ark.dv_backward(q, w, ow, residuals, rstd, logit, lse, do, targets, 0, 1e-6), q, w, ow)

        for rows in (1, 2, 4, 8):
            # a program walks N / (rows x partial) row blocks: 16 at the model's 1 row and 4,096; one at
            # partial = N / rows, with no loop and the fewest registers (scripts/kernel_ptx.py --steps 1),
            # but N / rows partial sums to add up
            for partial in sorted(p for p in {1024, 4096, 16384, N // rows} if p <= N // rows):
                ark.BWD_ROWS, ark.PARTIAL_ROWS = rows, partial
                print(f"dv K={K} rows={rows} partial={partial}: {mean_ms(call):.3f} ms", flush=True)


def attn_res_exact_sources(N: int = 32768, D: int = 1024) -> None:
    import time

    from bench.bench_attnres import inputs
    from k3lab.ops.attn_res import kernel as ark

    if not hasattr(ark, "EXACT_SOURCES"):  # an older checkout
        return
    for K in (5, 6, 8):
        residuals, q, w, ow, do = inputs(K, N, D, torch.device("cuda"), requires_grad=False)
        targets = [torch.empty_like(r) for r in residuals]
        for exact in (4, 8):
            ark.EXACT_SOURCES = exact

            def call():
                _, rstd, logit, lse = ark.forward(q, w, ow, residuals, 1e-6)
                ark.dv_backward(q, w, ow, residuals, rstd, logit, lse, do, targets, 0, 1e-6)

            torch.cuda.synchronize()
            began = time.perf_counter()
            call()
            torch.cuda.synchronize()
            first = time.perf_counter() - began
            print(f"attn_res K={K} EXACT_SOURCES={exact}: {mean_ms(call):.3f} ms forward+backward, "
                  f"first call {first:.1f} s", flush=True)


def kda_layer_width() -> None:
    from k3lab.model import kda as kda_fused
    from k3lab.model.config import KimiK3Config

    config = KimiK3Config(**yaml.safe_load((ROOT / "k3lab/presets/small.yaml").read_text()), kda_implementation="fused")
    layer = kda_fused.KDAFused(config).cuda()
    x = torch.randn(64, 1024, config.hidden_size, device="cuda", dtype=torch.bfloat16, requires_grad=True)

    def step():
        with torch.autocast("cuda", torch.bfloat16):
            y = layer(x)
        y.backward(torch.ones_like(y))

    for multiple in (16, 1) if hasattr(kda_fused, "WIDTH_MULTIPLE") else (None,):
        if multiple is not None:
            kda_fused.WIDTH_MULTIPLE = multiple
        print(f"KDA layer fwd+bwd WIDTH_MULTIPLE={multiple}: {mean_ms(step, reps=10):.3f} ms", flush=True)


def conv_backend(B: int = 64, T: int = 1024, D: int = 512, W: int = 4) -> None:
    import os

    from fla.modules.causal_conv1d import causal_conv1d

    wide = torch.randn(B, T, 3 * D + 16, device="cuda", dtype=torch.bfloat16)  # q, k, v side by side, as in KDA
    x = wide[..., D:2 * D].requires_grad_(True)
    weight = (0.5 * torch.randn(D, W, device="cuda")).requires_grad_(True)
    dy = torch.randn(B, T, D, device="cuda", dtype=torch.bfloat16)

    def call():
        y, _ = causal_conv1d(x=x, weight=weight, bias=None, activation="silu")
        y.backward(dy)
        return y

    results = {}
    for backend, flag in (("triton", "0"), ("gluon", "1")):
        os.environ["FLA_CONV_GLUON"] = flag
        x.grad = weight.grad = None
        y = call()
        results[backend] = (y.float(), x.grad.float(), weight.grad.float())
        print(f"causal_conv1d {backend} fwd+bwd ({B}, {T}, {D}) strided: {mean_ms(call):.3f} ms", flush=True)
    for name, a, b in zip(("y", "dx", "dw"), results["triton"], results["gluon"]):
        print(f"  {name}: largest |triton - gluon| {(a - b).abs().max().item():.3e} (largest |triton| "
              f"{a.abs().max().item():.3e})", flush=True)
    for flag in ("0", "1"):
        os.environ["FLA_CONV_GLUON"] = flag
        print(f"FLA_CONV_GLUON={flag}:", flush=True)
        kda_layer_width()
    os.environ.pop("FLA_CONV_GLUON")


def kda_backend() -> None:
    import importlib.util
    import os

    if importlib.util.find_spec("tilelang") is None:
        print("kda_backend: the tilelang package is not installed here; skipped", flush=True)
        return
    from k3lab.model import kda as kda_fused
    from k3lab.model.config import KimiK3Config

    config = KimiK3Config(**yaml.safe_load((ROOT / "k3lab/presets/small.yaml").read_text()), kda_implementation="fused")
    layer = kda_fused.KDAFused(config).cuda()
    x = torch.randn(64, 1024, config.hidden_size, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    dy = torch.randn_like(x)

    def step():
        with torch.autocast("cuda", torch.bfloat16):
            y = layer(x)
        y.backward(dy)

    grads = {}
    for backend, flag in (("triton", "0"), ("tilelang", "1")):
        os.environ["FLA_TILELANG"] = flag
        x.grad = None
        step()
        grads[backend] = x.grad.float()
        print(f"KDA layer fwd+bwd FLA_TILELANG={flag}: {mean_ms(step, reps=10):.3f} ms", flush=True)
    ran = "fla.ops.kda.backends.tilelang.chunk_bwd_dqkg" in sys.modules
    print(f"  TileLang's chunk_kda_bwd_wy_dqkg_fused ran: {ran}; largest |dx triton - dx tilelang| "
          f"{(grads['triton'] - grads['tilelang']).abs().max().item():.3e} (largest |dx| "
          f"{grads['triton'].abs().max().item():.3e})", flush=True)
    try:  # as trials do: warm up on a side stream, capture, replay
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            step()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            step()
        graph.replay()
        torch.cuda.synchronize()
        print("  a step on TileLang's kernel captured in a CUDA graph and replayed", flush=True)
    except Exception as error:  # noqa: BLE001 - the finding is the error itself
        print(f"  CUDA graph capture on TileLang's kernel failed: {type(error).__name__}: {str(error)[:200]}", flush=True)
    os.environ.pop("FLA_TILELANG")


def main() -> None:
    global ROOT
    choices = {f.__name__: f for f in (attn_res_backward_rows, attn_res_exact_sources, kda_layer_width, conv_backend,
                                       kda_backend)}
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("tree", nargs="?", default=ROOT, help="the k3lab checkout to time (default: this one)")
    parser.add_argument("--only", choices=choices, default=None, help="time one choice only")
    args = parser.parse_args()
    ROOT = Path(args.tree).resolve()
    sys.path.insert(0, str(ROOT))  # before k3lab is imported: its model is the one timed
    if not torch.cuda.is_available():
        sys.exit("kernel_choices.py: no CUDA GPU here")
    from k3lab.runner.runtime.kernel_cache import open_kernel_cache

    open_kernel_cache()  # before FLA is imported
    for name, choice in choices.items():
        if args.only in (None, name):
            choice()


if __name__ == "__main__":
    main()
