"""scripts/kernel_ptx.py: the AttnRes kernels compiled to H200 PTX without a GPU (needs Triton)."""

import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
import kernel_ptx  # noqa: E402


def test_warps_per_sm_follow_the_register_file():
    # 65,536 registers an SM, a warp's registers rounded up to 256: 255 -> 8,160 -> 8,192 a warp
    assert kernel_ptx.warps_per_sm(255) == 8
    assert kernel_ptx.warps_per_sm(206) == 9  # 6,592 -> 6,656 a warp
    assert kernel_ptx.warps_per_sm(64) == 32
    assert kernel_ptx.warps_per_sm(48) == 42


def test_resources_come_from_ptxas_for_a_compiled_kernel(monkeypatch):
    import torch
    import triton
    import triton.language as tl
    from triton.runtime import driver
    from triton.runtime.jit import MockTensor

    @triton.jit
    def scale(x, y, n, BLOCK: tl.constexpr):
        i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(y + i, tl.load(x + i, mask=i < n) * 2.0, mask=i < n)

    monkeypatch.setattr(driver, "_active", kernel_ptx.OfflineDriver())  # restored after the test
    compiled = scale.warmup(MockTensor(torch.float32), MockTensor(torch.float32), 1024, BLOCK=128, grid=(1,))
    found = kernel_ptx.resources(compiled.asm["ptx"])
    assert 0 < found["registers"] <= 255
    assert found["spill_stores"] == found["spill_loads"] == 0
    assert found["warps_per_sm"] == kernel_ptx.warps_per_sm(found["registers"])
