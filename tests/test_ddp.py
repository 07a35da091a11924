"""A trial spanning two workers (DDP through Ray Train, gloo on CPU) inside a sweep."""

import json
import textwrap

import pytest
from conftest import bench_script
from mlflow.tracking import MlflowClient

from k3lab.cli import main
from k3lab.registry import TrainSpec
from k3lab.runner.tune.trial import TrialSpec
from trackers import MemoryTracker

pytestmark = [pytest.mark.usefixtures("isolated_data"), pytest.mark.slow]

BASE = {"preset": "tiny", "num_layers": 2, "layer_types": ["kda", "mla"], "num_dense_layers": 1}
TRAIN = {"steps": 6, "batch_size": 2, "seq_len": 32, "warmup_steps": 1, "eval_interval": 3, "eval_batches": 1,
         "log_interval": 1}
SWEEP = f"""
name: ddp
base: {json.dumps(BASE)}
variants:
  - {{name: two_workers}}
seeds: [0]
train: {json.dumps(TRAIN)}
resources: {{cpu: 1, gpus_per_trial: 2, strategy: ddp}}
"""


def run_sweep(tmp_path, *extra):
    sweep = tmp_path / "ddp.yaml"
    sweep.write_text(textwrap.dedent(SWEEP))
    return main(["sweep", str(sweep), "--storage", str(tmp_path / "runs"), "--no-live", "--kernel-cache",
                 str(tmp_path / "kernels"), "--tracking-uri", f"sqlite:///{tmp_path / 'mlflow.db'}", *extra])


def trial_runs(tmp_path):
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    parent_id = json.loads((tmp_path / "runs" / "ddp.k3lab.json").read_text())["parent_run_id"]
    experiment = client.get_run(parent_id).info.experiment_id
    return client, client.search_runs([experiment], f"tags.mlflow.parentRunId = '{parent_id}'")


def single_worker_losses(batch_size):
    from k3lab.registry import load_preset

    config = load_preset("tiny").replace(**{k: v for k, v in BASE.items() if k != "preset"})
    spec = TrialSpec("x", "one_worker", 0, config, TrainSpec(**(TRAIN | {"batch_size": batch_size})),
                     tracking_uri=None, experiment="x")
    tracker = MemoryTracker()
    from k3lab.runner.train.loop import train
    from k3lab.runner.train.trainer import Trainer

    train(config, spec.train, tracker=tracker, trainer=Trainer(config, spec.train, seed=0))
    return [v for _, v in tracker.metrics["train_loss"]]


def test_two_workers_match_one_worker_with_the_doubled_batch_in_one_run(tmp_path):
    assert run_sweep(tmp_path) == 0
    client, runs = trial_runs(tmp_path)
    assert len(runs) == 1  # rank 0 logs; rank 1 opens no run
    run = runs[0]
    assert run.info.status == "FINISHED"
    history = sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, "train_loss"))
    assert [s for s, _ in history] == list(range(1, 7))
    # the workers use the sweep's kernel cache, which the warm-up fills on a GPU machine
    assert run.data.tags["k3lab.kernel_cache"] == str((tmp_path / "kernels").resolve())
    expected = single_worker_losses(batch_size=4)
    assert [v for _, v in history] == pytest.approx(expected, rel=2e-3)


def test_ddp_trial_resumes_from_its_checkpoint_in_the_same_run(tmp_path, monkeypatch):
    monkeypatch.setenv("K3LAB_FAIL_AT_STEP", "6")  # both ranks crash once, after the step-3 checkpoint
    assert run_sweep(tmp_path, "--max-failures", "0") == 1
    client, runs = trial_runs(tmp_path)
    run_id = runs[0].info.run_id
    monkeypatch.delenv("K3LAB_FAIL_AT_STEP")
    assert run_sweep(tmp_path, "--resume") == 0
    client, runs = trial_runs(tmp_path)
    assert [r.info.run_id for r in runs] == [run_id]
    steps = sorted(m.step for m in client.get_metric_history(run_id, "train_loss"))
    assert steps == list(range(1, 7)) and runs[0].info.status == "FINISHED"


def test_ddp_bench_runs_one_worker_and_two_with_each_ddp_setting(tmp_path):
    """bench/bench_ddp.py on CPU (gloo): each row is a torchrun job of the trial's Trainer."""
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[1]
    done = subprocess.run([sys.executable, "bench/bench_ddp.py", "--preset", "tiny", "--rows", "1,2:legacy,2:static",
                           "--batch", "2", "--seq", "64", "--steps", "2", "--warmup", "1"],
                          cwd=repo, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = [line for line in done.stdout.splitlines() if line.startswith("| 1 |") or line.startswith("| 2:")]
    assert "failed" not in done.stdout, done.stdout + done.stderr[-6000:]
    assert any(r.startswith("| 2:legacy | 2 | bucket 25 MB, find unused |") for r in rows)
    assert any(r.startswith("| 2:static | 2 | bucket 100 MB, grad views, static graph |") for r in rows)
    assert any(r.startswith("| 1 | 1 | (no DDP) |") and "| 100.0% |" in r for r in rows)


@pytest.mark.parametrize("how, expected", [
    ("raise RuntimeError('gloo: connection closed')", "RuntimeError: gloo: connection closed"),
    ("raise AssertionError", "rank 1: exit code 1: AssertionError"),
    ("os.abort()", "rank 1: exit code -6: Signal 6 (SIGABRT) received by PID"),
])
def test_ddp_bench_names_how_a_rank_failed(tmp_path, how, expected):
    """A failed row says what torchrun saw of the first rank to fail: its exception, its
    traceback when the exception has no message, or the signal that killed it."""
    import subprocess
    import sys

    script = tmp_path / "rank.py"
    script.write_text("import os\nfrom torch.distributed.elastic.multiprocessing.errors import record\n\n\n"
                      f"@record\ndef main():\n    if os.environ['RANK'] == '1':\n        {how}\n\n\nmain()\n")
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
                           str(script)], capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    assert bench_script("bench_ddp").first_failure(done).startswith(expected)
