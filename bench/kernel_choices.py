"""Constants of the GPU model chosen by measurement, timed over their candidate values.

    python bench/kernel_choices.py            # this checkout, on a GPU
    python bench/kernel_choices.py OLD_TREE   # an older checkout (its KDA layer only, if it lacks the constants)

- `k3lab.model.attn_res_kernel.BWD_ROWS` (token rows a backward block, one warp each) and
  `PARTIAL_ROWS` (the most partial sums of dq/dw a backward leaves): the backward kernel alone at
  N = 65,536 rows, D = 512 (a `small` trial's step), K = 2, 4 and 13 sources, storing every
  source's gradient.
- `k3lab.model.attn_res_kernel.EXACT_SOURCES` (up to how many sources a kernel is compiled per K;
  above, sources are padded and tested at run time): forward and backward at K = 5, 6 and 8,
  N = 32,768 rows, D = 1,024 (bench/bench_gpu.py's AttnRes model, whose last block has K = 5),
  with the seconds the first call took (the compile) beside the time per call.
- `k3lab.model.kda_fused.WIDTH_MULTIPLE` (the fused input matmul's width is padded to it): one
  `small` KDA layer's forward and backward in bf16 autocast, eagerly, at 64 x 1024 tokens.
Milliseconds per call from CUDA events, the mean over 20 calls (10 for the layer) after 3 warm-up
calls; the kernel cache k3lab ships is opened first, as the trials open it.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import yaml

ROOT = Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).resolve().parent.parent).resolve()
sys.path.insert(0, str(ROOT))
from k3lab.model.config import KimiK3Config  # noqa: E402


def mean_ms(fn, reps: int = 20, warmup: int = 3) -> float:
    from bench.bench_attnres import timed

    return 1e3 * timed(fn, reps, warmup, torch.device("cuda"))


def attn_res_backward_rows(N: int = 65536, D: int = 512) -> None:
    from bench.bench_attnres import inputs
    from k3lab.model import attn_res_kernel as ark  # Triton: imported once a GPU is known to be here

    if not hasattr(ark, "BWD_ROWS"):  # an older checkout
        return
    for K in (2, 4, 13):
        residuals, q, w, ow, do = inputs(K, N, D, torch.device("cuda"), requires_grad=False)
        _, rstd, logit, lse = ark.forward(q, w, ow, residuals, 1e-6)
        targets = [torch.empty_like(r) for r in residuals]
        for rows in (1, 2, 4):
            for partial in (1024, 4096, 16384):
                ark.BWD_ROWS, ark.PARTIAL_ROWS = rows, partial
                ms = mean_ms(lambda: ark.dv_backward(q, w, ow, residuals, rstd, logit, lse, do, targets, 0, 1e-6))
                print(f"dv K={K} rows={rows} partial={partial}: {ms:.3f} ms", flush=True)


def attn_res_exact_sources(N: int = 32768, D: int = 1024) -> None:
    import time

    from bench.bench_attnres import inputs
    from k3lab.model import attn_res_kernel as ark

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
    from k3lab.model import kda_fused

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


def main() -> None:
    if not torch.cuda.is_available():
        sys.exit("kernel_choices.py: no CUDA GPU here")
    from k3lab.tune.kernels import open_kernel_cache

    open_kernel_cache()  # before FLA is imported
    attn_res_backward_rows()
    attn_res_exact_sources()
    kda_layer_width()


if __name__ == "__main__":
    main()
