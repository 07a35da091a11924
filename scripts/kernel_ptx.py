"""Compile k3lab's AttnRes Triton kernels to H200 (sm_90) PTX on a machine without a GPU, and
compare the code two source trees generate.

A rewrite of a kernel's text that should not change what runs (a condition spelled another way,
a helper split out) can be checked here without device time: if every case's PTX is the same,
the GPU runs the same instructions, and the timings measured for the old text still hold.
Debug information (source file names and line numbers) is left out of the comparison.

    PYTHONPATH=/path/to/triton python scripts/kernel_ptx.py OLD_TREE NEW_TREE

A tree is a folder holding `k3lab/` (e.g. `git archive REV k3lab | tar x -C DIR`). Needs Triton
(3.6 on the H200 image) importable; no CUDA driver. Prints one line per kernel and case, and
exits 1 when any case differs.
"""

from __future__ import annotations

import hashlib
import importlib
import sys

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.runtime import driver
from triton.runtime.jit import MockTensor

SOURCES = (1, 2, 3, 4, 5, 13)  # exact K up to EXACT_SOURCES, then padded to 8 and 16 slots
D, N = 512, 65_536


class OfflineDriver:
    """Just enough of Triton's driver for `warmup` to compile for sm_90 without a GPU."""

    def get_current_device(self):
        return 0

    def get_current_stream(self, device=None):
        return 0

    def get_current_target(self):
        return GPUTarget("cuda", 90, 32)

    def get_active_torch_device(self):
        return torch.device("cpu")


def code_of(ptx: str) -> str:
    """The PTX without its debug sections, file names and line markers."""
    body = ptx[ptx.index(".visible"):].split(".section")[0]
    return "\n".join(line for line in body.splitlines() if not line.strip().startswith((".loc", ".file", "//")))


def kernel_codes(tree: str) -> dict[str, str]:
    """{case: PTX code} for the forward and backward kernels of the k3lab under `tree`."""
    sys.path.insert(0, tree)
    for name in [m for m in sys.modules if m == "k3lab" or m.startswith("k3lab.")]:
        del sys.modules[name]
    kernels = importlib.import_module("k3lab.model.attn_res_kernel")
    sys.path.remove(tree)
    bf16, fp32 = (lambda: MockTensor(torch.bfloat16)), (lambda: MockTensor(torch.float32))
    codes = {}
    for K in SOURCES:
        L = kernels.source_slots(K)
        for onorm in (False, True):
            res = tuple(bf16() for _ in range(L))
            ow = bf16() if onorm else None
            common = dict(L=L, PADDED=L != K, D=D, BD=triton.next_power_of_2(D), HAS_ONORM=onorm, grid=(1,))
            fwd = kernels.attn_res_fwd_kernel.warmup(
                bf16(), bf16(), ow, res, bf16(), fp32(), fp32(), fp32(), N, K, 1e-6,
                ROWS=kernels.FWD_ROWS, num_warps=kernels.FWD_ROWS, **common)
            bwd = kernels.attn_res_bwd_dv_kernel.warmup(
                bf16(), bf16(), ow, res, tuple(bf16() for _ in range(L)), fp32(), fp32(), fp32(), bf16(), fp32(),
                N, K, 3, 1e-6, ROWS=kernels.BWD_ROWS, STEPS=kernels.row_steps(N), num_warps=kernels.BWD_ROWS,
                **common)
            for kind, compiled in (("forward", fwd), ("backward", bwd)):
                codes[f"{kind} K={K} slots={L} output norm={onorm}"] = code_of(compiled.asm["ptx"])
    return codes


def main(trees: list[str]) -> int:
    driver.set_active(OfflineDriver())
    codes = [kernel_codes(tree) for tree in trees]
    differs = False
    for case in codes[0]:
        digests = [hashlib.sha256(c[case].encode()).hexdigest()[:12] for c in codes]
        same = len(set(digests)) == 1
        differs |= not same
        verdict = "" if len(trees) == 1 else ("  same" if same else "  DIFFERS")
        print(f"{case:<42} {' '.join(digests)}  ({codes[0][case].count(chr(10)) + 1} lines){verdict}")
    return int(differs)


if __name__ == "__main__":
    if not sys.argv[1:]:
        sys.exit(__doc__)
    sys.exit(main(sys.argv[1:]))
