"""A whole CPU sweep's store holds every metric once per (run, key, step): the trials' own metrics,
their system samples, the parent's sweep timings and system samples, and the result runs'."""

import sqlite3

import pytest
from conftest import mini_sweep, sweep_args

from k3lab.cli import main
from k3lab.store import runs, verdicts

pytestmark = pytest.mark.usefixtures("isolated_data")


@pytest.mark.slow
def test_a_cpu_sweeps_store_holds_each_metric_once_per_run_key_and_step(tmp_path, monkeypatch):
    """Five `system/*` keys of 3 of 5 trials were logged twice at the last step, and the parent's
    `sweep_part_wall_s` repeated (step 0 x17, step 1 x115)."""
    monkeypatch.setenv("K3LAB_SYSTEM_METRICS_S", "0.05")  # samples between every two log calls
    path = tmp_path / "mini.yaml"
    path.write_text(mini_sweep("mini", "two variants, two seeds").replace("seeds: [0]", "seeds: [0, 1]"))
    assert main(sweep_args(tmp_path, path)) == 0
    database = sqlite3.connect(tmp_path / "mlflow.db")
    repeated = database.execute("SELECT run_uuid, key, step, COUNT(*) FROM metrics GROUP BY run_uuid, key, step "
                                "HAVING COUNT(*) > 1").fetchall()
    keys = {key for (key,) in database.execute("SELECT DISTINCT key FROM metrics")}
    assert repeated == []
    assert {"system/cpu_utilization_percentage", "train_loss", "val_loss", "sweep_wall_s",
            verdicts.VS_BASELINE, verdicts.CURVE[0]} <= keys  # what could repeat is there
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    parent = runs.sweep_runs(uri)[0]
    assert parent.data.params["trials"] == "4" and parent.data.params["planned.trials"] == "4"
