"""The model's outputs and gradients on CPU, bit for bit, against a record the model code wrote before.

A refactoring of the model (a move of its ops, one block forward for both AttnRes paths) must not
change a single bit: each case's logits, loss, AttnRes mixture weights and every parameter's
gradient are hashed (sha256 of the tensor's bytes) and held to tests/model_bits.json. The record
holds the torch version it was made with: another torch may round differently, so the test then
skips. Re-make the record only for a change that is meant to change the numbers:

    python tests/test_model_bits.py --write
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
RECORD = Path(__file__).with_name("model_bits.json")
FUSED_KDA = dict(kda_implementation="fused", kda_chunk_size=32, kda_gate_lower_bound=-5.0)

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


def case_digests(overrides: dict, bf16: bool, fused_attn_res: bool) -> dict[str, str]:
    """{tensor name: digest} of one forward (logits, loss, mixture weights) and backward (gradients)."""
    from k3lab.model.config import tiny_config
    from k3lab.model.model import KimiK3

    torch.manual_seed(0)
    model = KimiK3(tiny_config(**overrides))
    for name, p in model.named_parameters():  # non-zero scorers, so that every mixture weighs its candidates
        if name.endswith("res_proj.weight"):
            torch.nn.init.normal_(p)
    if fused_attn_res:  # the fused path's autograd functions, on CPU running their plain-PyTorch twins
        model.uses_fused_attn_res = lambda idx: True
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


def all_digests() -> dict[str, dict[str, str]]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # one thread: reductions split the same way on any machine
    try:
        return {name: case_digests(*case) for name, case in CASES.items()}
    finally:
        torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def record() -> dict:
    stored = json.loads(RECORD.read_text())
    if stored["torch"] != torch.__version__:
        pytest.skip(f"tests/model_bits.json was made with torch {stored['torch']}, this is {torch.__version__}")
    return stored


@pytest.fixture(scope="module")
def digests() -> dict[str, dict[str, str]]:
    return all_digests()


@pytest.mark.parametrize("case", CASES)
def test_the_models_outputs_and_gradients_keep_every_bit_of_the_record(case, record, digests):
    want, got = record["cases"][case], digests[case]
    assert got.keys() == want.keys()
    changed = [name for name in want if got[name] != want[name]]
    assert not changed, f"{case}: {len(changed)} of {len(want)} tensors changed, first {changed[:5]}"


if __name__ == "__main__" and sys.argv[1:] == ["--write"]:
    sys.path.insert(0, str(ROOT))
    RECORD.write_text(json.dumps({"torch": torch.__version__, "cases": all_digests()}, indent=1) + "\n")
    print(f"wrote {RECORD}")
