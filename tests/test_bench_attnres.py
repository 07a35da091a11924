"""bench/bench_attnres.py: the split reduction it measures against FLA's, checked on CPU.

The GPU rows (FLA's kernels) need CUDA; what is checked here is the arithmetic the `fla_split`
row relies on: the dv kernel's per-row buffers, summed over rows, give the same gradients as
autograd through the plain-PyTorch AttnRes (as FLA's `naive_attnres`)."""

import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from k3lab.ops.attn_res.fused import column_sums  # noqa: E402
from k3lab.ops.attn_res.naive import dv_twin, reference_attnres  # noqa: E402


@pytest.mark.parametrize("sources", [1, 3, 7])
def test_column_sums_of_the_dv_kernels_buffers_give_autograds_gradients(sources):
    torch.manual_seed(sources)
    N, D = 48, 32
    residuals = [torch.randn(N, D, dtype=torch.float64, requires_grad=True) for _ in range(sources)]
    q, w, ow = (torch.randn(D, dtype=torch.float64, requires_grad=True) for _ in range(3))
    do = torch.randn(N, D, dtype=torch.float64)
    o = reference_attnres(q, residuals, w, ow, 1e-6)
    expected = torch.autograd.grad(o, [q, w, ow, *residuals], do)

    dvs, dqw, dow_partial = dv_twin(q.detach(), w.detach(), ow.detach(), [r.detach() for r in residuals], do)
    dq, dw, dow = column_sums(torch.stack([dqw, dow_partial]), q.detach(), w.detach(), ow.detach())
    for got, want in zip([dq, dw, dow, *dvs], expected):  # both in fp32 math, summed in other orders:
        torch.testing.assert_close(got.double(), want, rtol=1e-4, atol=1e-5)  # 3e-6 apart on the H200 host


def test_the_bench_runs_its_cpu_rows_and_prints_their_table():
    done = subprocess.run([sys.executable, "bench/bench_attnres.py", "--device", "cpu", "--tokens", "256", "--dim",
                           "64", "--sources", "3", "--reps", "2", "--warmup", "1"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "| naive_compiled | 3 | 256 x 64 |" in done.stdout
    assert "| dqdw_split | 256 x 64 |" in done.stdout
    assert "| k3lab | 3 | 256 x 64 |" in done.stdout
    assert "| dv_sum | 256 x 64 |" in done.stdout
    assert "| fwd | 256 x 64 |" in done.stdout  # the forward alone (its candidates need a GPU)
    assert "Copy (device to device, read + written): " in done.stdout


def test_the_gluon_row_knows_which_autograd_function_made_its_output():
    from bench.bench_attnres import made_by

    class FusedAttnresGluonFunction(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2

        @staticmethod
        def backward(ctx, grad):
            return grad * 2

    x = torch.ones(4, 3, requires_grad=True)
    assert made_by("Gluon", FusedAttnresGluonFunction.apply(x).view(12).view(4, 3))  # through views
    assert not made_by("Gluon", (x * 2).view(12))  # what a fallback to another function would give


@pytest.mark.skipif(not torch.cuda.is_available(), reason="FLA's AttnRes kernels need CUDA")
def test_the_split_reduction_gives_flas_gradients_on_a_gpu():
    from fla.ops.attnres import fused_attnres

    from bench.bench_attnres import inputs, split_attnres

    residuals, q, w, ow, do = inputs(5, 4096, 512, torch.device("cuda"))
    leaves = [q, w, ow, *residuals]
    fla = torch.autograd.grad(fused_attnres(q, residuals, w, ow, 1e-6), leaves, do)
    split = torch.autograd.grad(split_attnres()(q, residuals, w, ow, 1e-6), leaves, do)
    for mine, theirs in zip(split, fla):
        torch.testing.assert_close(mine, theirs, rtol=1e-3, atol=1e-3)
