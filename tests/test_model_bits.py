"""The model's outputs and gradients on CPU, bit for bit, before and after a change, on this machine.

A refactoring of the model (a move of its ops, one block forward for both AttnRes paths) must not
change a single bit: each case's logits, loss, AttnRes mixture weights and every parameter's
gradient are hashed (sha256 of the tensor's bytes) and compared with the same hashes of the model
code at the reference commit, computed on this machine in a subprocess from `git archive`. The bits
depend on the CPU's kernels (ATen's vector width, oneDNN's and MKL's choices by instruction set and
vendor), so a hash is only comparable with one made on the same kernel set. Where there is no git
history (an unpacked source tree), tests/model_bits.json's record for this kernel set stands in;
with neither, the test skips and says why. Move the reference only with a change that is meant to
change the numbers (it also records this machine's kernel set):

    python tests/test_model_bits.py --write
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import platform
import subprocess
import sys
import tarfile
from io import BytesIO
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
RECORD = Path(__file__).with_name("model_bits.json")
FUSED_KDA = dict(kda_implementation="fused", kda_chunk_size=32, kda_gate_lower_bound=-5.0)
# CPU flags that change which oneDNN/MKL kernels run, beyond ATen's own capability level
KERNEL_FLAGS = ("avx2", "fma", "avx512f", "avx512_bf16", "avx512_vnni", "avx_vnni", "amx_bf16", "amx_tile")

# name: (config overrides, bf16 autocast, the fused AttnRes path's CPU twins)
CASES = {
    "attn_res_block_2": ({}, False, False),
    "attn_res_block_1": ({"attn_res_block_size": 1}, False, False),
    "prenorm": ({"use_attn_res": False}, False, False),
    "attn_res_block_2_bf16": ({}, True, False),
    "fused_kda_reference": (FUSED_KDA, False, False),
    "fused_attn_res_twins": (FUSED_KDA, False, True),
    "fused_attn_res_twins_bf16_block_1": (FUSED_KDA | {"attn_res_block_size": 1}, True, True),
}


def digest(tensor: torch.Tensor) -> str:
    return hashlib.sha256(tensor.detach().reshape(-1).contiguous().view(torch.uint8).numpy().tobytes()).hexdigest()[:24]


def case_model(overrides: dict, fused_attn_res: bool) -> torch.nn.Module:
    """The tiny model of one case, seeded, with non-zero scorers so that every mixture weighs its candidates."""
    from k3lab.model.config import tiny_config
    from k3lab.model.model import KimiK3

    torch.manual_seed(0)
    model = KimiK3(tiny_config(**overrides))
    for name, p in model.named_parameters():
        if name.endswith("res_proj.weight"):
            torch.nn.init.normal_(p)
    if fused_attn_res:  # the fused path's autograd functions, on CPU running their plain-PyTorch twins
        if hasattr(model, "no_endpoints"):
            from k3lab.ops.attn_res.fused import EndpointTuple

            model.no_endpoints = lambda x: EndpointTuple()
        else:  # a reference commit's model, before the endpoints objects carried the path
            model.uses_fused_attn_res = lambda idx: True
    return model


def model_digests(model: torch.nn.Module, bf16: bool) -> dict[str, str]:
    """{tensor name: digest} of one forward (logits, loss, mixture weights) and backward (gradients)."""
    idx, targets = torch.randint(0, 320, (2, 24)), torch.randint(0, 320, (2, 24))
    autocast = torch.autocast("cpu", dtype=torch.bfloat16) if bf16 else contextlib.nullcontext()
    with autocast:
        logits, _ = model(idx)
        _, loss = model(idx, targets, return_logits=False)
    loss.backward()
    out = {"logits": digest(logits), "loss": digest(loss)}
    for i, layer in enumerate(model.layers):
        out |= {f"weights.{i}.{site}": digest(w) for site, w in sorted(layer.attn_res_weights.items())}
    return out | {f"grad.{name}": digest(p.grad) for name, p in model.named_parameters() if p.grad is not None}


def case_digests(overrides: dict, bf16: bool, fused_attn_res: bool) -> dict[str, str]:
    return model_digests(case_model(overrides, fused_attn_res), bf16)


def all_digests() -> dict[str, dict[str, str]]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # one thread: reductions split the same way on any machine
    try:
        return {name: case_digests(*case) for name, case in CASES.items()}
    finally:
        torch.set_num_threads(threads)


def kernel_set() -> str:
    """This machine's CPU kernel set: torch's version, ATen's capability, the vendor and its ISA flags."""
    flags, vendor = set(), platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "vendor_id":
                vendor = value.strip()
            elif key.strip() == "flags":
                flags = set(value.split())
                break
    isa = "+".join(f for f in KERNEL_FLAGS if f in flags) or "none"
    return f"{torch.__version__}/{torch.backends.cpu.get_cpu_capability()}/{vendor}/{isa}"


def git(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, check=False)


def reference_digests(commit: str, folder: Path) -> dict[str, dict[str, str]]:
    """The digests of the model code at `commit`, computed here in a fresh interpreter on its package."""
    archive = git("archive", "--format=tar", commit, "k3lab")
    if archive.returncode != 0:
        pytest.skip(f"no reference: git archive {commit} failed ({archive.stderr.decode().strip()[:200]})")
    with tarfile.open(fileobj=BytesIO(archive.stdout)) as tar:
        tar.extractall(folder, **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
    code = (
        "import json, sys, k3lab, test_model_bits as bits;"
        "assert k3lab.__file__.startswith(sys.argv[1]), k3lab.__file__;"
        "print(json.dumps(bits.all_digests()))"
    )
    env = os.environ | {"PYTHONPATH": os.pathsep.join([str(folder), str(Path(__file__).parent)])}
    done = subprocess.run([sys.executable, "-c", code, str(folder)], capture_output=True, text=True, env=env, cwd=folder)
    assert done.returncode == 0, f"the reference commit {commit} does not run this test's cases:\n{done.stderr[-2000:]}"
    return json.loads(done.stdout)


@pytest.fixture(scope="module")
def want(tmp_path_factory) -> dict[str, dict[str, str]]:
    """The digests to hold: the reference commit's, made here; else this kernel set's stored record."""
    stored = json.loads(RECORD.read_text())
    if git("cat-file", "-e", f"{stored['reference']}^{{commit}}").returncode == 0:
        return reference_digests(stored["reference"], tmp_path_factory.mktemp("reference"))
    if kernel_set() in stored["records"]:
        return stored["records"][kernel_set()]
    pytest.skip(f"no git history with {stored['reference'][:12]} and no record for this CPU's kernels ({kernel_set()})")


@pytest.fixture(scope="module")
def digests() -> dict[str, dict[str, str]]:
    return all_digests()


@pytest.mark.parametrize("case", CASES)
def test_the_models_outputs_and_gradients_keep_every_bit_of_the_reference(case, want, digests):
    assert digests[case].keys() == want[case].keys()
    changed = [name for name in want[case] if digests[case][name] != want[case][name]]
    assert not changed, f"{case}: {len(changed)} of {len(want[case])} tensors changed, first {changed[:5]}"


def test_one_flipped_bit_in_one_weight_changes_the_digests():
    """The hashes see the smallest change a refactoring can make: the last bit of one weight."""
    overrides, bf16, fused = CASES["attn_res_block_2"]
    model = case_model(overrides, fused)
    torch.manual_seed(1)
    before = model_digests(model, bf16)
    model = case_model(overrides, fused)
    with torch.no_grad():
        model.lm_head.weight.view(torch.int32).view(-1)[0] ^= 1  # every position's logit of token 0 reads it
    torch.manual_seed(1)
    after = model_digests(model, bf16)
    assert after["logits"] != before["logits"]


def write_reference() -> None:
    """Make HEAD the reference and store this machine's digests under its kernel set."""
    if git("diff", "--quiet", "HEAD", "--", "k3lab").returncode != 0:
        sys.exit("k3lab/ differs from HEAD: commit the change the reference is for first")
    head = git("rev-parse", "HEAD").stdout.decode().strip()
    stored = json.loads(RECORD.read_text()) if RECORD.exists() else {}
    records = stored.get("records", {}) if stored.get("reference") == head else {}
    records[kernel_set()] = all_digests()
    RECORD.write_text(json.dumps({"reference": head, "records": records}, indent=1, sort_keys=True) + "\n")
    print(f"wrote {RECORD}: reference {head[:12]}, kernel set {kernel_set()}")


if __name__ == "__main__" and sys.argv[1:] == ["--write"]:
    sys.path.insert(0, str(ROOT))
    write_reference()
