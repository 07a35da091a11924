"""scripts/first_steps_sweep.py: the sweep tune_shipped.sh runs so that trials write their graphs."""

import subprocess
import sys
from pathlib import Path

import attrs

from k3lab.registry.sweep_cli import load_sweep_for
from k3lab.runner.train.trainer import EAGER_STEPS_BEFORE_CAPTURE

ROOT = Path(__file__).resolve().parents[1]


def test_first_steps_sweep_runs_every_variant_once_past_the_cuda_graph_capture_at_the_same_shapes(tmp_path):
    out = tmp_path / "first_steps.yaml"
    done = subprocess.run([sys.executable, str(ROOT / "scripts/first_steps_sweep.py"),
                           str(ROOT / "experiments/attnres_block.yaml"), str(out)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    full = load_sweep_for(str(ROOT / "experiments/attnres_block.yaml"), "gpu")
    cut = load_sweep_for(str(out), "gpu")
    assert cut.seed_policy is None and [(t.variant.name, t.seed) for t in cut.trials] == \
        [(v.name, 0) for v in full.valid_variants]
    assert [v.config for v in cut.valid_variants] == [v.config for v in full.valid_variants]
    assert cut.train.steps > EAGER_STEPS_BEFORE_CAPTURE  # the capture, and one replay of it
    same = ("dataset", "batch_size", "seq_len", "autocast", "compile", "cuda_graph", "init", "dtype")
    assert {k: getattr(cut.train, k) for k in same} == {k: getattr(full.train, k) for k in same}
    assert attrs.asdict(cut.resources) == attrs.asdict(full.resources)  # four trial processes per GPU, as a sweep
