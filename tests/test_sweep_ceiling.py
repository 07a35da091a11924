"""bench/sweep_ceiling.py: the sweep files its phases run (the GPU runs themselves are benchmarks)."""

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.sweep_ceiling import sweep_file_for  # noqa: E402
from k3lab.registry.commands import load_sweep_for  # noqa: E402


def test_the_slots_phase_runs_the_warm_phases_trials_with_training_slots(tmp_path):
    args = argparse.Namespace(file=str(ROOT / "experiments/attnres_block.yaml"), profile="gpu", training_slots=2,
                              seeds="0,1")
    warm, slots = (load_sweep_for(sweep_file_for(args, tmp_path, phase), "gpu") for phase in ("warm", "slots"))
    assert [t.id for t in warm.trials] == [t.id for t in slots.trials] and len(warm.trials) == 10  # 5 variants x 2
    assert not warm.adaptive and warm.budget is None
    assert warm.resources.training_slots is None and slots.resources.training_slots == 2
    assert slots.resources.max_concurrent_trials == warm.resources.max_concurrent_trials == 4


def test_without_seeds_the_warm_phase_runs_the_file_itself(tmp_path):
    args = argparse.Namespace(file="experiments/attnres_block.yaml", profile="gpu", training_slots=2, seeds=None)
    assert sweep_file_for(args, tmp_path, "warm") == "experiments/attnres_block.yaml"
