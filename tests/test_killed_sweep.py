"""A sweep killed with `kill -9` and resumed: its figures count every part's time, the killed one's
included, and the restored trials log each attempt's start-up at the step it started from."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import mini_sweep, sweep_args
from mlflow import MlflowClient

from k3lab.cli import main
from k3lab.store.state import write_state
from k3lab.store.tracking import BUILD_PARTS, MLflowTracker
from k3lab.runner.tune import parent as parent_module
from k3lab.runner.tune.parent import PART_BEAT, PART_WALL, ParentRun, PartClock
from k3lab.runner.tune.run import SweepRun

REPO = Path(__file__).resolve().parents[1]
STARTUP = ("startup_build_s", *BUILD_PARTS)


def resumable_run(tmp_path, sweep_file) -> tuple[SweepRun, str]:
    """A SweepRun with --resume over a parent run that a first part opened and never ended."""
    from k3lab.registry import load_sweep

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    run = SweepRun(sweep=load_sweep(sweep_file), storage=tmp_path / "runs", tracking_uri=uri, resume=True)
    parent = MLflowTracker.start(uri, run.experiment, run.experiment)
    parent.flush()
    write_state(run.state_file, parent.run_id, uri, [t.id for t in run.sweep.trials])
    return run, parent.run_id


def test_a_part_killed_before_its_end_counts_in_the_parts_up_to_its_last_beat(tmp_path, sweep_file, monkeypatch):
    """It counted only the parts that logged their time at their end: after kill -9 and --resume,
    `sweep_parts` was 1 and the killed part's time was lost (tokens/s and the time shares too high)."""
    monkeypatch.setattr(parent_module, "present", lambda *args, **kwargs: None)
    run, run_id = resumable_run(tmp_path, sweep_file)
    client = MlflowClient(run.tracking_uri)
    for seconds in (0.0, 10.0, 20.0, 30.0):  # the killed first part's beats
        client.log_metric(run_id, PART_WALL, seconds, step=0)
    with ParentRun(run) as parent:
        assert parent.part == 1
        total, parts = parent.parts_wall_s(this_part_s=5.0)
    assert (total, parts) == (35.0, 2)
    metrics = client.get_run(run_id).data.metrics
    assert metrics["sweep_parts"] == 2 and metrics["sweep_parts_wall_s"] >= 30.0
    assert [m.step for m in client.get_metric_history(run_id, "resume_wall_s")] == [1]
    assert metrics["sweep_wall_s"] == 30.0  # the killed first run's, from its last beat (docs/sweeps.md)


def test_a_parts_time_counts_from_its_commands_start_not_from_its_parent_run(tmp_path, sweep_file, monkeypatch):
    """A killed part counted 55.9 s where its driver ran ~75 s: Ray's start and the checks before
    the parent run opened were not counted."""
    monkeypatch.setattr(parent_module, "present", lambda *args, **kwargs: None)
    run, run_id = resumable_run(tmp_path, sweep_file)
    run.started = time.time() - 40.0  # the command started 40 s before its parent run opens
    with ParentRun(run):
        pass
    beat = MlflowClient(run.tracking_uri).get_run(run_id).data.tags[f"{PART_BEAT}.0"]  # its first part
    assert float(beat) >= 40.0
    assert MlflowClient(run.tracking_uri).get_run(run_id).data.metrics["resume_wall_s"] >= 40.0


def test_a_running_part_keeps_its_wall_time_in_one_tag_not_a_metric_point_per_beat(tmp_path):
    """Each beat logged a `sweep_part_wall_s` point at the part's step: 115 points at step 1."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    parent = MLflowTracker.start(uri, "mini", "mini")
    parent.flush()
    clock = PartClock(uri, parent.run_id, part=2, started=time.time() - 100, every=0.2)
    time.sleep(1.0)
    first = float(MlflowClient(uri).get_run(parent.run_id).data.tags[f"{PART_BEAT}.2"])
    time.sleep(0.5)
    clock.stop()
    client = MlflowClient(uri)
    assert float(client.get_run(parent.run_id).data.tags[f"{PART_BEAT}.2"]) > first >= 100  # rewritten
    assert client.get_metric_history(parent.run_id, PART_WALL) == []
    from k3lab.runner.tune.parent import earlier_parts

    assert earlier_parts({}, client.get_run(parent.run_id).data.tags)[2] >= 100


@pytest.mark.slow
def test_a_sweep_killed_with_sigkill_and_resumed_counts_both_parts_and_logs_each_start_up_once_per_step(
        tmp_path, data_dir):
    """kill -9 of the driver and its Ray instance once the first trial has checkpointed, then --resume."""
    path = tmp_path / "mini.yaml"
    # long enough that the sweep still runs a beat after its first checkpoint on a fast, quiet machine
    path.write_text(mini_sweep("mini", "killed and resumed", steps=600, eval_interval=200, log_interval=50))
    env = {k: v for k, v in os.environ.items() if k != "K3LAB_FAIL_AT_STEP"} | {
        "PYTHONPATH": str(REPO), "K3LAB_DATA_DIR": str(data_dir)}
    args = [sys.executable, "-m", "k3lab.cli", *sweep_args(tmp_path, path, "--max-concurrent", "1")]
    started = time.time()
    driver = subprocess.Popen(args, cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              start_new_session=True)
    try:
        assert checkpointed_trial(tmp_path, driver, deadline=time.time() + 600), "no trial checkpointed"
        time.sleep(parent_module.PART_BEAT_S + 1)
        assert driver.poll() is None, "the sweep ended before it could be killed"
    finally:
        os.killpg(driver.pid, signal.SIGKILL)  # the driver's process group: it, Ray and the trials
        driver.wait(timeout=60)
    killed_s = time.time() - started
    assert main(sweep_args(tmp_path, path, "--resume", "--max-concurrent", "1")) == 0
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    parent_id = json.loads((tmp_path / "runs" / "mini.k3lab.json").read_text())["parent_run_id"]
    metrics = client.get_run(parent_id).data.metrics
    assert metrics["sweep_parts"] == 2
    slack = parent_module.PART_BEAT_S + 20  # a beat's interval, and the driver's start before its parent run
    assert metrics["sweep_parts_wall_s"] >= metrics["resume_wall_s"] + killed_s - slack, metrics
    trials = client.search_runs([client.get_run(parent_id).info.experiment_id],
                                f"tags.mlflow.parentRunId = '{parent_id}'")
    for trial in trials:
        for key in STARTUP:
            steps = [m.step for m in client.get_metric_history(trial.info.run_id, key)]
            assert len(steps) == len(set(steps)), (trial.info.run_name, key, steps)


def checkpointed_trial(folder: Path, driver, deadline: float) -> bool:
    """Waits until a trial's run has metrics of its first evaluation (sent with its checkpoint)."""
    while time.time() < deadline and driver.poll() is None:
        time.sleep(1)
        try:
            client = MlflowClient(f"sqlite:///{folder / 'mlflow.db'}")
            if any("val_loss" in run.data.metrics for run in client.search_runs(
                    [e.experiment_id for e in client.search_experiments()])):
                return True
        except Exception:  # the store is not there yet
            continue
    return False


def test_a_trial_whose_checkpoint_was_deleted_starts_again_on_resume_instead_of_failing_every_resume(tmp_path):
    """Tune's restore failed the trial at every --resume ("Could not recover from checkpoint as it
    does not exist on storage anymore"); only --overwrite helped."""
    from ray import tune

    from k3lab.runner.tune.run import start_lost_trials_again
    from k3lab.runner.tune.trial import load_ray_checkpoint

    tune_dir = tmp_path / "runs" / "mini"
    kept, lost = tune_dir / "tune_trainable_ab_00000_0_x", tune_dir / "tune_trainable_ab_00001_1_y"
    for folder in (kept / "checkpoint_000002", lost):
        folder.mkdir(parents=True)
    trials = [[json.dumps({"trial_id": f"ab_0000{i}"}),
               json.dumps({"last_result": {"checkpoint_dir_name": "checkpoint_000002", "done": False,
                                           "variant": variant, "seed": 0}})]
              for i, variant in enumerate(("attnres_off", "attnres_bs1"))]
    (tune_dir / "experiment_state-2026-01-01_00-00-00.json").write_text(json.dumps({"trial_data": trials}))
    run = type("Run", (), {"tune_dir": tune_dir})()
    said = []
    start_lost_trials_again(run, say=said.append)
    assert said == [f"attnres_bs1-s0: its checkpoint {lost / 'checkpoint_000002'} is gone: the trial starts again "
                    "from its first step"]
    assert load_ray_checkpoint(tune.Checkpoint.from_directory(str(lost / "checkpoint_000002"))) is None
    start_lost_trials_again(run, say=said.append)
    assert len(said) == 1  # the next --resume finds it there


def test_a_trial_error_is_shown_without_rays_colour_codes(tmp_path):
    from k3lab.runner.tune.status import error_text, plain

    assert plain("\x1b[36mray::ImplicitFunc.train()\x1b[39m (pid=1)") == "ray::ImplicitFunc.train() (pid=1)"
    error_file = tmp_path / "error.txt"
    error_file.write_text("\x1b[36mray::ImplicitFunc.train()\x1b[39m\nValueError: lost\n")
    trial = type("Trial", (), {"error_file": str(error_file)})()
    assert error_text(trial) == "ray::ImplicitFunc.train()\nValueError: lost\n"


def test_a_sweep_stopped_with_its_state_saved_ends_finished_and_tagged_stopped_not_killed(tmp_path, sweep_file,
                                                                                          monkeypatch):
    """A sweep stopped by --stop-after showed a red "Killed" parent (MLflow's red cross) and nothing else."""
    from k3lab.store import runs
    from k3lab.store.views import parent_note

    shown = []
    monkeypatch.setattr(parent_module, "present", lambda run, run_id, state=None: shown.append(state))
    run, run_id = resumable_run(tmp_path, sweep_file)
    run.tune_dir.mkdir(parents=True)
    with pytest.raises(KeyboardInterrupt):
        with ParentRun(run):
            raise KeyboardInterrupt
    parent = MlflowClient(run.tracking_uri).get_run(run_id)
    assert parent.info.status == "FINISHED" and parent.data.tags[runs.STATUS] == runs.STOPPED
    assert runs.sweep_state(parent, []) == runs.STOPPED  # not a sweep that ended: `--resume` goes on
    assert shown[-1] == runs.STOPPED
    note = parent_note("1", run_id, "x", "val_loss", state=runs.STOPPED,
                       next_steps=("k3lab sweep x.yaml --resume", "k3lab report x.yaml --close"))
    assert "**Stopped, resumable**: its state is saved; `k3lab sweep x.yaml --resume` continues it." in \
        note.splitlines()


def test_a_stopped_sweep_writes_its_verdicts_variant_runs_and_resume_command_for_a_plain_mlflow_ui(tmp_path,
                                                                                                   sweep_file):
    """A sweep stopped by --stop-after left no verdict, no variant run and an empty difference section
    until `k3lab ui` or `k3lab report` opened its store; `k3lab ui` then shortened its resume command."""
    from k3lab.report.ui_store import prepare_store
    from k3lab.store import runs, verdicts
    from k3lab.runner.tune.parent import record_sweep

    run, run_id = resumable_run(tmp_path, sweep_file)
    run.tune_dir.mkdir(parents=True)
    for variant, status in (("attnres_off", "FINISHED"), ("attnres_bs1", "KILLED")):
        trial = MLflowTracker.start(run.tracking_uri, run.experiment, f"{variant}-s0", parent_run_id=run_id,
                                    tags=runs.trial_tags(f"id-{variant}", variant, 0))
        trial.log_metrics({"train_loss": 4.0, "val_loss": 3.0}, 4)
        trial.finish(status)
    with pytest.raises(KeyboardInterrupt):
        with ParentRun(run) as parent:
            record_sweep(run, parent)
            raise KeyboardInterrupt
    found = verdicts.variant_runs(runs.client(run.tracking_uri), run_id)
    assert found["attnres_bs1"].info.run_name == ("attnres_bs1 vs attnres_off: not resolved, no pairs "
                                                 "(1 killed trial)")
    parent = MlflowClient(run.tracking_uri).get_run(run_id)
    resume = run.hint("sweep", resume=True)
    assert "--storage" in resume and "--tracking-uri" in resume
    assert f"`{resume}` continues it" in parent.data.tags[runs.NOTE]
    assert "**attnres_bs1** vs attnres_off: not resolved" in parent.data.tags[runs.NOTE]
    assert parent.data.tags[runs.RAN] == "2 of 2 planned trials: 1 finished, 1 killed; seeds 0"
    assert parent.data.params["planned.trials"] == "2" and "trials" not in parent.data.params  # not ended yet
    prepare_store(run.tracking_uri, say=lambda line: None)  # `k3lab ui` after it: the command kept whole
    assert f"`{resume}` continues it" in MlflowClient(run.tracking_uri).get_run(run_id).data.tags[runs.NOTE]
