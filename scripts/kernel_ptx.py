"""Compile k3lab's AttnRes Triton kernels to H200 (sm_90) PTX on a machine without a GPU, and
compare the code two source trees generate.

A rewrite of a kernel's text that should not change what runs (a condition spelled another way,
a helper split out) can be checked here without device time: if every case's PTX is the same,
the GPU runs the same instructions, and the timings measured for the old text still hold.
Debug information (source file names and line numbers) is left out of the comparison.

    PYTHONPATH=/path/to/triton python scripts/kernel_ptx.py OLD_TREE NEW_TREE
    PYTHONPATH=/path/to/triton python scripts/kernel_ptx.py --resources TREE [TREE ...] [--rows R] [--warps W] [--steps S]

With --resources, each case's PTX goes through the ptxas that Triton ships (as Triton itself does
to make the cubin) and the line gives what ptxas reports: registers a thread, spill bytes, and the
warps an SM can hold at that register count (65,536 registers an SM, allocated per warp in units
of 256). A memory-bound kernel at one warp a program needs many warps resident to keep enough
loads in flight, so a variant that lowers the registers can be told apart before any GPU time.

A tree is a folder holding `k3lab/` (e.g. `git archive REV k3lab | tar x -C DIR`). Needs Triton
(3.6 on the H200 image) importable; no CUDA driver. Prints one line per kernel and case, and
exits 1 when any case differs.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import re
import subprocess
import sys
import tempfile

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.backends.nvidia.compiler import get_ptxas
from triton.runtime import driver
from triton.runtime.jit import MockTensor

SOURCES = (1, 2, 3, 4, 5, 13)  # exact K up to EXACT_SOURCES, then padded to 8 and 16 slots
D, N = 512, 65_536
SM_REGISTERS, WARP_ALLOCATION = 65_536, 256  # sm_90: registers an SM, a warp's allocation unit


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


def kernel_codes(tree: str, warps: int | None = None, steps: int | None = None,
                 rows: int | None = None) -> dict[str, str]:
    """{case: PTX} for the forward and backward kernels of the k3lab under `tree`, at `rows` token rows
    a program (default: the model's) on `warps` warps (default: one a row, as the model), the backward
    walking `steps` row blocks a program (default: the model's `row_steps(N, K)`)."""
    sys.path.insert(0, tree)
    for name in [m for m in sys.modules if m == "k3lab" or m.startswith("k3lab.")]:
        del sys.modules[name]
    kernels = importlib.import_module("k3lab.ops.attn_res.kernel")
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
                ROWS=rows or kernels.FWD_ROWS, num_warps=warps or rows or kernels.FWD_ROWS, **common)
            bwd = kernels.attn_res_bwd_dv_kernel.warmup(
                bf16(), bf16(), ow, res, tuple(bf16() for _ in range(L)), fp32(), fp32(), fp32(), bf16(), fp32(),
                N, K, 3, 1e-6, ROWS=rows or kernels.BWD_ROWS, STEPS=steps or kernels.row_steps(N, K),
                num_warps=warps or rows or kernels.BWD_ROWS,
                **common)
            for kind, compiled in (("forward", fwd), ("backward", bwd)):
                codes[f"{kind} K={K} slots={L} output norm={onorm}"] = compiled.asm["ptx"]
    return codes


def resources(ptx: str) -> dict[str, int]:
    """What ptxas reports for one kernel's PTX: registers a thread and spill bytes, and the warps an
    SM can hold at that register count."""
    arch = re.search(r"^\.target\s+(\S+)", ptx, re.MULTILINE).group(1)  # sm_90a: Triton's H200 target
    with tempfile.NamedTemporaryFile("w", suffix=".ptx") as source:
        source.write(ptx)
        source.flush()
        report = subprocess.run([get_ptxas(90).path, f"-arch={arch}", "-v", source.name, "-o", "/dev/null"],
                                capture_output=True, text=True, check=True).stderr
    registers = int(re.search(r"Used (\d+) registers", report).group(1))
    spills = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", report)
    return {"registers": registers, "spill_stores": int(spills.group(1)), "spill_loads": int(spills.group(2)),
            "warps_per_sm": warps_per_sm(registers)}


def warps_per_sm(registers: int) -> int:
    """Warps an sm_90 SM can hold when each thread uses `registers` (a warp's share rounded up to 256)."""
    per_warp = -(-registers * 32 // WARP_ALLOCATION) * WARP_ALLOCATION
    return SM_REGISTERS // per_warp


def compare(codes: list[dict[str, str]]) -> int:
    """One line a case with each tree's digest; 1 when any case differs."""
    differs = False
    for case in codes[0]:
        texts = [code_of(c[case]) for c in codes]
        digests = [hashlib.sha256(text.encode()).hexdigest()[:12] for text in texts]
        same = len(set(digests)) == 1
        differs |= not same
        verdict = "" if len(codes) == 1 else ("  same" if same else "  DIFFERS")
        print(f"{case:<42} {' '.join(digests)}  ({texts[0].count(chr(10)) + 1} lines){verdict}")
    return int(differs)


def show_resources(codes: list[dict[str, str]]) -> int:
    """One line a case: each tree's registers, spill bytes and warps an SM holds."""
    for case in codes[0]:
        cells = []
        for c in codes:
            r = resources(c[case])
            cells.append(f"{r['registers']:>3} registers, {r['spill_stores']:>4} B spilled, {r['warps_per_sm']:>2} warps/SM")
        print(f"{case:<42} {' | '.join(cells)}")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("trees", nargs="+", help="folders holding k3lab/ (one to list, two to compare)")
    parser.add_argument("--resources", action="store_true", help="registers and spills from ptxas, per tree")
    parser.add_argument("--warps", type=int, default=None,
                        help="compile at this many warps a program instead of the model's (what-if, with --resources)")
    parser.add_argument("--steps", type=int, default=None,
                        help="compile the backward at this many row blocks a program instead of the model's (what-if)")
    parser.add_argument("--rows", type=int, default=None,
                        help="compile at this many token rows a program, a warp each unless --warps (what-if)")
    args = parser.parse_args()
    driver.set_active(OfflineDriver())
    codes = [kernel_codes(tree, args.warps, args.steps, args.rows) for tree in args.trees]
    return show_resources(codes) if args.resources else compare(codes)


if __name__ == "__main__":
    sys.exit(main())
