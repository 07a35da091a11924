"""A sweep's progress without Ray: plain lines off a terminal (one per trial start, evaluation and end,
with the figures), the live table's columns, and a finished trial's real figures after --resume."""

import io
import math
from types import SimpleNamespace

import pytest
from conftest import mini_sweep
from mlflow.tracking import MlflowClient
from rich.console import Console

from k3lab.registry.sweep_file import load_sweep
from k3lab.runner.tune import sweep_progress as progress_module
from k3lab.runner.tune.sweep_progress import SweepProgress, progress_mode
from k3lab.runner.tune.trial import trial_specs
from k3lab.runner.tune.run import SweepRun


@pytest.fixture
def sweep(tmp_path):
    path = tmp_path / "mini.yaml"
    path.write_text(mini_sweep("mini", "x"))
    return load_sweep(path)


def make_progress(sweep, tmp_path, mode="lines", tracking_uri=None):
    run = SweepRun(sweep=sweep, storage=tmp_path / "runs", tracking_uri=tracking_uri or "sqlite:///unused.db")
    specs = trial_specs(run, parent_run_id="parent")
    said = []
    return SweepProgress(sweep, specs, mode=mode, tracking_uri=tracking_uri, say=said.append), specs, said


def trial(key, last_result=None, status="RUNNING"):
    return SimpleNamespace(config={"trial": key}, last_result=last_result or {}, status=status, error_file=None)


def report(step, val, **extra):
    return {"done_steps": step, "total_steps": 8, "train_loss": 5.0, "val_loss": val, "tokens_per_s": 1234.0,
            "trial_status": "finished" if step == 8 else "running"} | extra


def finished_run(tmp_path) -> tuple[str, str]:
    """An MLflow run with a finished trial's figures."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(uri)
    run_id = client.create_run(client.create_experiment("mini")).info.run_id
    for key, value in {"train_loss": 4.25, "val_loss": 4.5, "tokens_per_s": 2000.0}.items():
        client.log_metric(run_id, key, value, step=8)
    return uri, run_id


def test_off_a_terminal_each_trial_start_evaluation_and_end_is_one_line_with_its_figures(sweep, tmp_path):
    progress, specs, said = make_progress(sweep, tmp_path)
    key = next(iter(specs))
    with progress:
        progress.on_trial_start(0, [], trial(key))
        progress.on_trial_result(0, [], trial(key), report(4, 4.75))
        progress.on_trial_result(0, [], trial(key), report(8, 4.5))  # the last: shown as the trial's end
        progress.on_trial_complete(0, [], trial(key, report(8, 4.5)))
    texts = [line.split("s  ", 1)[1] for line in said]  # after the elapsed seconds
    assert texts == ["attnres_off-s0 started",
                     "attnres_off-s0 step 4/8: train loss 5.000, val loss 4.7500, 1,234 tokens/s (last window)",
                     "attnres_off-s0 done at step 8/8: train loss 5.000, val loss 4.5000, 1,234 tokens/s (last window)"]
    assert all("\n" not in line and line.split("s  ")[0].strip().isdigit() for line in said)


def test_a_resumed_trial_that_had_finished_shows_its_runs_figures_not_inf(sweep, tmp_path):
    """Restored from its final checkpoint with nothing left to train, a trial of an older k3lab reported
    `val_loss: inf, trial_status: finished` and no other figures: the table reads its run instead."""
    uri, run_id = finished_run(tmp_path)
    stale = {"val_loss": math.inf, "trial_status": "finished", "done_steps": 8, "total_steps": 8,
             "mlflow_run_id": run_id}
    progress, specs, said = make_progress(sweep, tmp_path, tracking_uri=uri)
    first, second = list(specs)
    progress.show_earlier([trial(first, stale, status="TERMINATED")])
    progress.on_trial_complete(0, [], trial(second, stale))
    assert [line.split("s  ", 1)[1] for line in said] == [
        "attnres_off-s0 done in an earlier run, at step 8/8: train loss 4.250, val loss 4.5000, "
        "2,000 tokens/s (last window)",
        "attnres_bs1-s0 done at step 8/8: train loss 4.250, val loss 4.5000, 2,000 tokens/s (last window)"]
    console = Console(file=io.StringIO(), width=200)
    console.print(progress.table())
    table = console.file.getvalue()
    assert "tokens/s (last window)" in table and "inf" not in table
    assert all("done" in row and "8/8" in row and "4.5000" in row and "2,000" in row
               for row in table.splitlines() if "-s0" in row)


def test_the_live_table_needs_both_stdout_and_stderr_on_a_terminal(monkeypatch):
    for out, err, live, mode in [(True, True, True, "live"), (False, True, True, "lines"),
                                 (True, False, True, "lines"), (True, True, False, "lines")]:
        monkeypatch.setattr(progress_module.sys, "stdout", SimpleNamespace(isatty=lambda out=out: out))
        monkeypatch.setattr(progress_module.sys, "stderr", SimpleNamespace(isatty=lambda err=err: err))
        assert progress_mode(live) == mode


def test_tokenizing_off_a_terminal_is_a_line_before_and_a_line_after(capsys):
    from k3lab.data.tokenizing_progress import progress_bar

    with progress_bar(True, "tokenizing stdlib", 3) as advance:
        advance(2, 100)
        advance(1, 50)
    lines = capsys.readouterr().err.splitlines()
    assert lines[0] == "tokenizing stdlib ..." and lines[1].startswith("tokenizing stdlib: 3 docs, 150 tokens in ")
    assert len(lines) == 2


def test_a_trial_restored_from_its_final_checkpoint_reports_its_runs_figures(tmp_path):
    """Nothing left to train, nothing evaluated: its report to Tune (which the table and Tune's result
    file show) carries the last evaluation's figures from its MLflow run, not the worst value."""
    from k3lab.registry import TrainSpec
    from k3lab.runner.train.trainer import TrainResult
    from k3lab.runner.tune.ray_reports import TrialReporter
    from k3lab.runner.tune.trial import TrialSpec

    uri, run_id = finished_run(tmp_path)
    spec = TrialSpec("id", "attnres_off", 0, {}, TrainSpec(steps=8, warmup_steps=1), uri, "mini")
    sent = []
    reporter = TrialReporter(spec, lambda metrics, checkpoint: sent.append(metrics), None, restored=True)
    reporter.tracker = SimpleNamespace(client=MlflowClient(uri), run_id=run_id)
    reporter.finish(TrainResult(status="finished", step=8, tokens=512), run_id)
    assert sent == [{"train_loss": 4.25, "val_loss": 4.5, "tokens_per_s": 2000.0, "mlflow_run_id": run_id,
                     "variant": "attnres_off", "trial_status": "finished", "seed": 0, "done_steps": 8, "step": 8,
                     "total_steps": 8}]


def test_a_crashed_trial_says_its_error_as_it_restarts(sweep, tmp_path):
    """The log line a crash leaves names what went wrong, so a researcher reading the sweep's
    output sees a CUDA fault without opening the Tune folder."""
    progress, specs, said = make_progress(sweep, tmp_path)
    error_file = tmp_path / "error.txt"
    error_file.write_text("Traceback (most recent call last):\n  ...\n"
                          "torch.AcceleratorError: CUDA error: unspecified launch failure\n")
    crashed = trial(next(iter(specs)))
    crashed.error_file = str(error_file)
    with progress:
        progress.on_trial_recover(0, [], crashed)
    assert said[0].split("s  ", 1)[1] == ("attnres_off-s0 crashed (torch.AcceleratorError: CUDA error: unspecified "
                                          "launch failure): restarting from its last checkpoint")


def test_a_crash_before_a_trials_first_report_is_counted_on_the_run_its_first_report_names(tmp_path):
    """A reused actor can die as it sets up its next trial, before that trial has a run: the
    crash is counted once the restarted trial reports, so the report's crash count is whole."""
    from k3lab.runner.tune.status import MLflowStatusCallback

    uri, run_id = finished_run(tmp_path)
    error_file = tmp_path / "error.txt"
    error_file.write_text("ray.exceptions.ActorDiedError: The actor died unexpectedly\n")
    callback = MLflowStatusCallback(uri)
    started = SimpleNamespace(trial_id="t1", last_result={}, error_file=str(error_file))
    callback.on_trial_recover(0, [], started)  # no report yet: nothing to count it on
    callback.on_trial_result(0, [], started, {"done_steps": 1})  # a report without a run id: still waits
    assert "k3lab.crashes" not in MlflowClient(uri).get_run(run_id).data.tags
    callback.on_trial_result(0, [], started, {"done_steps": 2, "mlflow_run_id": run_id})
    callback.on_trial_result(0, [], started, {"done_steps": 3, "mlflow_run_id": run_id})  # counted once
    tags = MlflowClient(uri).get_run(run_id).data.tags
    assert tags["k3lab.crashes"] == "1"
    assert tags["k3lab.last_crash"] == "ray.exceptions.ActorDiedError: The actor died unexpectedly"
