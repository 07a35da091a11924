"""bench/determinism.py: how it groups the gradients that differ, and a run on the CPU (where every
step repeats itself)."""

import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.determinism import differing_gradients  # noqa: E402


def test_differing_gradients_are_grouped_by_name_without_layer_numbers():
    same = torch.ones(3)
    first = {"layers.0.attn.q.weight": torch.tensor([1.0, 2.0]), "layers.1.attn.q.weight": torch.tensor([4.0, 0.0]),
             "layers.2.attn.q.weight": same, "embed.weight": same}
    second = {"layers.0.attn.q.weight": torch.tensor([1.0, 2.5]), "layers.1.attn.q.weight": torch.tensor([4.0, 0.2]),
              "layers.2.attn.q.weight": same.clone(), "embed.weight": same.clone()}
    assert differing_gradients(first, second) == {"layers.attn.q.weight": (2, 0.25)}  # 0.5 / 2.0, then 0.2 / 4.0


@pytest.mark.slow
def test_on_a_cpu_every_run_and_every_gradient_repeats_itself(isolated_data):
    done = subprocess.run([sys.executable, "bench/determinism.py", "experiments/attnres_block.yaml", "--profile", "cpu",
                           "--variants", "0,1", "--steps", "3"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.splitlines()
    assert sum("the 2nd and 3rd equal at 3/3 steps, first differing step None" in line for line in lines) == 2
    differ = [line for line in lines if "gradients differ" in line]
    assert len(differ) == 2 and all(": 0 of " in line for line in differ)
