"""k3lab's AttnRes Triton kernels (`k3lab.ops.attn_res.kernel`) on CPU, through Triton's
interpreter, against their plain-PyTorch twins in `k3lab.ops.attn_res.naive`.

The GPU tests (tests/test_gpu_fused.py) hold the compiled kernels to the same twins at the trial
shapes; these run the kernels' own code on any machine with Triton installed, at small shapes,
including a D that is not a power of two (masked lanes), K past 8 (the padded source tuple) and
a number of rows that is not a multiple of a program's rows, and backward programs that walk
several blocks of rows (PARTIAL_ROWS lowered in the child).
Triton reads TRITON_INTERPRET when it is imported, so the kernels run in a child process that
sets it first (this file run as a script), and the tests check the errors it reports.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

CASES = [(2, 64, "float32", True), (5, 48, "bfloat16", True), (13, 64, "float32", False), (9, 32, "bfloat16", False)]
N = 37


def relative(a, b) -> float:
    return ((a.float() - b.float()).abs().max() / b.float().abs().max()).item()


def case_errors(K: int, D: int, dtype_name: str, with_out_norm: bool) -> dict[str, float]:
    """In the child: each kernel output's max error relative to its twin's largest value."""
    import torch

    from k3lab.ops.attn_res import kernel as attn_res_kernel, naive

    g = torch.Generator().manual_seed(K)
    dtype = getattr(torch, dtype_name)
    residuals = [(torch.randn(N, D, generator=g) * (1 + i % 3)).to(dtype) for i in range(K)]
    q, w, ow = 0.3 * torch.randn(D, generator=g), *(1 + 0.1 * torch.randn(2, D, generator=g))
    ow = ow if with_out_norm else None
    errors = {}
    got = attn_res_kernel.forward(q, w, ow, residuals, 1e-6)
    want = naive.reference_forward(q, w, ow, residuals, 1e-6)
    errors["o_dtype_matches"] = float(got[0].dtype == dtype)
    for name, a, b in zip(["o", "rstd", "logit", "lse"], got, want):
        errors[name] = relative(a, b)
    do = torch.randn(N, D, generator=g).to(dtype)
    held = [torch.randn(N, D, generator=g).to(dtype) for _ in range(K)]
    acc = 0b0101010101010 & ((1 << K) - 1)  # every other source already holds a reader's share
    targets = [h.clone() for h in held]
    partials = attn_res_kernel.dv_backward(q, w, ow, residuals, *got[1:], do, targets, acc, 1e-6)  # (1 or 2, G, D)
    dvs, want_dqw, want_dow = naive.dv_twin(q, w, ow, residuals, do, 1e-6)
    errors["dv_stored"] = max(relative(t, dv) for i, (t, dv) in enumerate(zip(targets, dvs)) if not acc >> i & 1)
    errors["dv_added"] = max(relative(t, dv + h.float()) for i, (t, dv, h) in enumerate(zip(targets, dvs, held))
                             if acc >> i & 1)
    errors["partial_sums"] = partials.shape[1]
    errors["dqw"] = relative(partials[0].sum(0), want_dqw.sum(0))  # partial sums over blocks of rows
    errors["dow"] = relative(partials[1].sum(0), want_dow.sum(0)) if ow is not None else partials.shape[0] - 1.0
    return errors


@pytest.fixture(scope="module")
def errors() -> dict[str, dict[str, float]]:
    pytest.importorskip("triton")
    root = Path(__file__).resolve().parent.parent
    path = os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": path}
    child = subprocess.run([sys.executable, __file__], env=env, capture_output=True, text=True, timeout=600)
    assert child.returncode == 0, child.stderr[-3000:]
    return json.loads(child.stdout.splitlines()[-1])


@pytest.mark.parametrize("case", CASES, ids=str)
def test_forward_kernel_returns_the_twins_output_and_statistics(errors, case):
    found = errors[str(case)]
    assert found["o_dtype_matches"] == 1.0
    assert found["o"] < (1e-5 if case[2] == "float32" else 1e-2)  # one rounding to bf16
    for name in ("rstd", "logit", "lse"):  # fp32 whatever the sources' dtype
        assert found[name] < 1e-5, name


@pytest.mark.parametrize("case", CASES, ids=str)
def test_backward_kernel_stores_or_adds_each_sources_gradient_as_the_twin(errors, case):
    found = errors[str(case)]
    bound = 1e-5 if case[2] == "float32" else 1e-2  # bf16: one rounding of the stored sum
    assert found["dv_stored"] < bound and found["dv_added"] < bound
    assert found["dqw"] < 1e-4 and found["dow"] < 1e-4


def test_backward_programs_walk_several_blocks_of_rows_when_rows_are_many(errors):
    """With at most 3 partial sums allowed, each program walks several blocks of the N = 37 rows
    (the last past N): 3 partial sums, whose total the twin's per-row terms give (test above)."""
    assert {found["partial_sums"] for found in errors.values()} == {3}


if __name__ == "__main__":
    from k3lab.ops.attn_res import kernel as attn_res_kernel

    attn_res_kernel.PARTIAL_ROWS = 3  # so that N = 37 rows take several steps a program,
    attn_res_kernel.LOOP_SLOTS = 32  # at every K
    print(json.dumps({str(case): case_errors(*case) for case in CASES}))
