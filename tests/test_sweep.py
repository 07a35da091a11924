"""`k3lab sweep` end to end on CPU: Ray Tune trials, MLflow runs, crash recovery and --resume."""

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import mini_sweep, stopped_long_sweep, sweep_args, sweep_that_gets_sigterm
from mlflow.tracking import MlflowClient

from k3lab.cli import main
from k3lab.runner.tune.status import final_status

pytestmark = [pytest.mark.usefixtures("isolated_data"), pytest.mark.slow]

SWEEP = mini_sweep("mini", "two variants of a very small model")
REPO = Path(__file__).resolve().parents[1]


def fake_tune_folder(folder: Path) -> None:
    """What --resume's check of a Tune experiment folder looks for (a restore would still fail)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "tuner.pkl").write_bytes(b"x")
    (folder / "experiment_state-2026-01-01_00-00-00.json").write_text('{"trial_data": [["{}", "{}"]]}')


def trial_runs(machine):
    client = MlflowClient(f"sqlite:///{machine / 'mlflow.db'}")
    parent_id = json.loads((machine / "runs" / "mini.k3lab.json").read_text())["parent_run_id"]
    parent = client.get_run(parent_id)
    runs = client.search_runs([parent.info.experiment_id], f"tags.mlflow.parentRunId = '{parent_id}'")
    return client, parent, runs


def assert_one_clean_run_per_trial(client, runs):
    assert sorted(r.data.tags["k3lab.variant_name"] for r in runs) == ["attnres_bs1", "attnres_off"]
    for run in runs:
        assert run.info.status == "FINISHED"
        steps = [m.step for m in client.get_metric_history(run.info.run_id, "train_loss")]
        assert sorted(steps) == list(range(1, 9))  # every step once: no repeats after recovery
        assert [m.step for m in client.get_metric_history(run.info.run_id, "val_loss")] == [4, 8]
        assert int(run.data.params["params.total"]) > 0
        assert run.data.params["model.use_attn_res"] in ("True", "False")
        metrics = run.data.metrics
        assert 0 < metrics["startup_build_s"] < metrics["startup_s"]  # start-up, split
        parts = [metrics[f"startup_{part}_s"] for part in ("data", "model", "tracking")]  # and the build's parts
        assert min(parts) > 0 and sum(parts) <= metrics["startup_build_s"]


def test_sweep_logs_one_run_per_trial_and_recovers_from_a_crash(tmp_path, sweep_file, monkeypatch, capsys):
    monkeypatch.setenv("K3LAB_FAIL_AT_STEP", "8")  # every trial crashes once, after its step-4 checkpoint
    assert main(sweep_args(tmp_path, sweep_file, "--max-failures", "1", "--max-concurrent", "2")) == 0
    client, parent, runs = trial_runs(tmp_path)
    assert_one_clean_run_per_trial(client, runs)
    assert [r.data.tags["k3lab.crashes"] for r in runs] == ["1", "1"]  # each crash counted on its trial's run
    log = tmp_path / "runs" / "mini.log"  # the driver told its watchdog it shut Ray down itself
    assert "ended without shutting Ray down" not in (log.read_text() if log.exists() else "")
    assert all("K3LAB_FAIL_AT_STEP" in r.data.tags["k3lab.last_crash"] for r in runs)
    assert parent.info.status == "FINISHED"
    assert parent.data.params["resources.max_concurrent_trials"] == "2"  # the flag, not the file's null
    artifacts = {a.path for a in client.list_artifacts(parent.info.run_id)}
    assert {"mini.yaml", "report"} <= artifacts
    report = {a.path for a in client.list_artifacts(parent.info.run_id, "report")}
    assert {"report/loss_curves.png", "report/val_loss_by_variant.png", "report/val_loss_vs_params.png",
            "report/val_loss_vs_baseline.png", "report/summary.json"} <= report
    summary = json.loads(open(client.download_artifacts(parent.info.run_id, "report/summary.json")).read())["variants"]
    assert {row["axes"]["attn_res_block_size"] for row in summary} == {"off", "1"}
    assert all(row["seeds"] == 1 and row["val_loss_mean"] > 0 for row in summary)
    paired = {row["variant"]: row["paired"] for row in summary}
    assert paired["attnres_off"] is None  # the baseline
    assert (paired["attnres_bs1"]["pairs"], paired["attnres_bs1"]["reason"]) == (1, "one pair")
    assert parent.data.metrics["sweep_crashes"] == 2  # both trials' crashes, in the sweep's metrics
    out = capsys.readouterr().out
    assert "attnres_off" in out and "attnres_bs1" in out
    assert "paired by seed" in out and "not resolved (one pair)" in out
    assert "restarts: 2 (crashed 2)" in out


def test_a_trial_checkpointing_every_second_evaluation_restarts_from_its_last_checkpoint(tmp_path, monkeypatch):
    """train.checkpoint_every: 2, evaluations at steps 2, 4, 6, 8: a crash at the last report restarts
    the trial from its step-4 checkpoint (not 6, which it did not save), and its run has every step once."""
    path = tmp_path / "mini.yaml"
    path.write_text(mini_sweep("mini", "checkpoints at every second evaluation", eval_interval=2).replace(
        "log_interval: 2}", "log_interval: 2, checkpoint_every: 2}"))
    monkeypatch.setenv("K3LAB_FAIL_AT_STEP", "8")
    assert main(sweep_args(tmp_path, path, "--max-failures", "1", "--max-concurrent", "2")) == 0
    client, _, runs = trial_runs(tmp_path)
    assert [r.data.tags["k3lab.crashes"] for r in runs] == ["1", "1"]
    for run in runs:
        history = lambda key: sorted(m.step for m in client.get_metric_history(run.info.run_id, key))  # noqa: E731
        assert history("train_loss") == list(range(1, 9)) and history("val_loss") == [2, 4, 6, 8]
        assert history("startup_s") == [1, 5]  # the second attempt's first step: the one after step 4


def test_resume_finishes_an_interrupted_sweep_in_the_same_runs(tmp_path, sweep_file, monkeypatch):
    monkeypatch.setenv("K3LAB_FAIL_AT_STEP", "8")
    assert main(sweep_args(tmp_path, sweep_file, "--max-failures", "0")) == 1  # both trials errored
    client, _, runs = trial_runs(tmp_path)
    before = {r.info.run_id for r in runs}
    assert {r.info.status for r in runs} == {"FAILED"}
    monkeypatch.delenv("K3LAB_FAIL_AT_STEP")
    text = sweep_file.read_text()  # the state file the first run wrote holds its train section
    sweep_file.write_text(text.replace("eval_batches: 1", "eval_batches: 2"))
    assert main(sweep_args(tmp_path, sweep_file, "--resume")) == 2
    sweep_file.write_text(text)
    assert main(sweep_args(tmp_path, sweep_file, "--resume")) == 0
    client, parent, runs = trial_runs(tmp_path)
    assert {r.info.run_id for r in runs} == before  # the same runs continued, no duplicates
    assert_one_clean_run_per_trial(client, runs)


def test_unreachable_tracking_server_is_reported_before_any_trial(tmp_path, sweep_file, capsys):
    args = ["sweep", str(sweep_file), "--storage", str(tmp_path / "runs"), "--no-live",
            "--tracking-uri", "http://127.0.0.1:9"]
    assert main(args) == 2
    out, err = capsys.readouterr()
    assert "the MLflow server does not answer" in err and err.count("\n") == 1
    assert not (tmp_path / "runs").exists()  # nothing started, nothing written
    assert str(tmp_path / "runs") not in out  # and no message names a file that is not there


def test_dry_run_lists_trials_and_starts_nothing(tmp_path, sweep_file, capsys):
    assert main(sweep_args(tmp_path, sweep_file, "--dry-run")) == 0
    out = capsys.readouterr().out
    assert "attnres_off" in out and "dry run" in out
    assert not (tmp_path / "runs").exists() and not (tmp_path / "mlflow.db").exists()


def test_sweep_file_error_stops_before_ray_starts(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text(SWEEP.replace("attn_res_block_size: [off, 1]", "attn_res_block_size: [0]"))
    assert main(["sweep", str(bad), "--storage", str(tmp_path / "runs"), "--no-live"]) == 2
    err = capsys.readouterr().err
    assert str(bad) in err and err.count("\n") == 1 and "Traceback" not in err
    assert not (tmp_path / "runs").exists()


def test_sweep_refuses_to_mix_runs_and_to_resume_nothing(tmp_path, sweep_file, capsys):
    assert main(sweep_args(tmp_path, sweep_file, "--resume")) == 2
    assert "no earlier run of mini" in capsys.readouterr().err
    (tmp_path / "runs" / "mini").mkdir(parents=True)
    assert main(sweep_args(tmp_path, sweep_file)) == 2
    err = capsys.readouterr().err
    assert "--resume` continues it" in err and "--overwrite` starts it again" in err


def test_resume_and_overwrite_together_are_refused_before_the_earlier_run_is_touched(tmp_path, sweep_file, capsys):
    (tmp_path / "runs" / "mini").mkdir(parents=True)
    (tmp_path / "runs" / "mini.k3lab.json").write_text('{"parent_run_id": "x"}')
    assert main(sweep_args(tmp_path, sweep_file, "--resume", "--overwrite")) == 2
    assert "--resume and --overwrite: pass one" in capsys.readouterr().err
    assert (tmp_path / "runs" / "mini").is_dir() and (tmp_path / "runs" / "mini.k3lab.json").is_file()


def test_report_names_a_state_file_whose_parent_run_is_not_in_the_store_given(tmp_path, sweep_file, capsys):
    from mlflow.tracking import MlflowClient

    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    MlflowClient(store).create_experiment("another")  # a store, but not the sweep's
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "mini.k3lab.json").write_text('{"parent_run_id": "0123abc", "tracking_uri": "sqlite:///elsewhere.db"}')
    capsys.readouterr()
    assert main(["report", str(sweep_file), "--storage", str(tmp_path / "runs"), "--tracking-uri", store]) == 2
    err = capsys.readouterr().err
    assert err == (f"error: {tmp_path / 'runs' / 'mini.k3lab.json'}: its parent run 0123abc is not in {store} "
                   "(the sweep logged to sqlite:///elsewhere.db)\n")
    assert main(["report", str(sweep_file), "--out", str(sweep_file)]) == 2
    assert "is a file, not a folder" in capsys.readouterr().err


def test_a_ray_address_that_is_malformed_or_unanswered_is_refused_in_seconds(tmp_path, sweep_file, capsys):
    import socket

    with socket.socket() as closed:  # a port nothing listens on once the socket is closed
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    assert main(sweep_args(tmp_path, sweep_file, "--address", "garbage")) == 2
    assert "--address garbage: expected HOST:PORT" in capsys.readouterr().err
    started = time.monotonic()
    assert main(sweep_args(tmp_path, sweep_file, "--address", f"127.0.0.1:{port}")) == 2
    assert f"--address 127.0.0.1:{port}: no Ray head answers there" in capsys.readouterr().err
    assert time.monotonic() - started < 30  # ray.init retried for minutes
    assert not (tmp_path / "runs").exists() and not (tmp_path / "mlflow.db").exists()


def test_a_negative_number_of_retries_and_an_empty_storage_are_refused(tmp_path, sweep_file, capsys):
    assert main(sweep_args(tmp_path, sweep_file, "--max-failures", "-1")) == 2
    assert "--max-failures must be 0 or more" in capsys.readouterr().err
    assert main(sweep_args(tmp_path, sweep_file, "--dry-run", "--storage", "")) == 2  # it fell back to ./k3lab_runs
    assert "--storage: names no folder" in capsys.readouterr().err


@pytest.mark.parametrize("value", ["", "   "])
def test_a_blank_k3lab_storage_is_refused_like_an_empty_storage_flag(tmp_path, sweep_file, capsys, monkeypatch, value):
    """K3LAB_STORAGE='' put a sweep's folders into the current folder, '   ' into a folder named by spaces."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("K3LAB_STORAGE", value)
    before = set(tmp_path.iterdir())
    assert main(["sweep", str(sweep_file), "--no-live", "--tracking-uri", f"sqlite:///{tmp_path / 'mlflow.db'}"]) == 2
    assert capsys.readouterr().err == f"error: K3LAB_STORAGE={value!r}: names no folder (unset it for ./k3lab_runs)\n"
    assert set(tmp_path.iterdir()) == before


@pytest.mark.parametrize("result, errored, status", [
    ({"done_steps": 8, "total_steps": 8}, False, "FINISHED"),
    ({"done_steps": 4, "total_steps": 8}, False, "KILLED"),
    ({"done_steps": 3, "total_steps": 8, "trial_status": "diverged"}, False, "FAILED"),
    ({"done_steps": 4, "total_steps": 8}, True, "FAILED"),
])
def test_trial_end_maps_to_mlflow_status(result, errored, status):
    assert final_status(result, errored) == status


def test_ui_refuses_a_tracking_server_uri(capsys):
    assert main(["ui", "--tracking-uri", "http://127.0.0.1:5000"]) == 2
    assert "is already a server" in capsys.readouterr().err


def test_diverged_trial_reports_the_worst_metric_value():
    from k3lab.registry import TrainSpec
    from k3lab.runner.train.trainer import TrainResult
    from k3lab.runner.tune.ray_reports import diverged_report
    from k3lab.runner.tune.trial import TrialSpec

    spec = TrialSpec("id", "v", 0, {}, TrainSpec(steps=10, warmup_steps=1), None, "x", metric="val_bpb", mode="max")
    report = diverged_report(spec, TrainResult(status="diverged", step=3, tokens=300, error="nan"), "run")
    # Tune requires the sweep's metric in every result: without it the whole sweep would stop
    assert report["val_bpb"] == float("-inf") and report["trial_status"] == "diverged"
    assert final_status(report, errored=False) == "FAILED"


def test_resume_refuses_a_changed_sweep_file(tmp_path, sweep_file, capsys):
    import json as _json

    (tmp_path / "runs" / "mini").mkdir(parents=True)
    (tmp_path / "runs" / "mini.k3lab.json").write_text(_json.dumps({"parent_run_id": "x", "trials": ["other_s0"]}))
    assert main(sweep_args(tmp_path, sweep_file, "--resume")) == 2
    assert "no longer describes the trials" in capsys.readouterr().err


def test_resume_refuses_a_changed_train_section_naming_the_field(tmp_path, sweep_file, capsys):
    """--resume of a sweep whose train.steps changed finished it with trials of both lengths in one report."""
    from k3lab.registry import load_sweep
    from k3lab.store.state import sweep_spec, write_state

    (tmp_path / "runs" / "mini").mkdir(parents=True)
    sweep = load_sweep(sweep_file)
    write_state(tmp_path / "runs" / "mini.k3lab.json", "x", "sqlite:///x.db", [t.id for t in sweep.trials],
                sweep_spec(sweep))
    sweep_file.write_text(sweep_file.read_text().replace("{steps: 8,", "{steps: 6,"))
    assert main(sweep_args(tmp_path, sweep_file, "--resume")) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "changed train.steps from 8 to 6" in err and "--overwrite" in err
    sweep_file.write_text(mini_sweep("mini", "x").replace("resources:", "metric: {name: val_loss, mode: max}\nresources:"))
    assert main(sweep_args(tmp_path, sweep_file, "--resume")) == 2
    assert 'changed metric.mode from "min" to "max"' in capsys.readouterr().err


@pytest.mark.parametrize("change, message", [
    ("start: 2", "changed seeds.start from 3 to 2"),
    ("start: 3, max: 4, until: max", 'changed seeds.until.rule from "decided" to "max"'),
])
def test_resume_refuses_a_changed_seeds_policy_naming_the_field(tmp_path, sweep_file, capsys, change, message):
    """The design (its looks and level) is stored with the parent run when the sweep starts; a resumed
    sweep with another start or rule would end its seeds under a design no view reads."""
    from k3lab.registry import load_sweep
    from k3lab.store.state import sweep_spec, write_state

    sweep_file.write_text(sweep_file.read_text().replace("seeds: [0]", "seeds: {start: 3, max: 4, until: decided}"))
    (tmp_path / "runs" / "mini").mkdir(parents=True)
    sweep = load_sweep(sweep_file)
    write_state(tmp_path / "runs" / "mini.k3lab.json", "x", "sqlite:///x.db", [t.id for t in sweep.trials],
                sweep_spec(sweep))
    sweep_file.write_text(sweep_file.read_text().replace("start: 3, max: 4, until: decided", change))
    assert main(sweep_args(tmp_path, sweep_file, "--resume")) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err and "--overwrite" in err


def overwrite_hint(tmp_path, sweep_file) -> str:
    """The `--overwrite` command a refusal prints for the sweep that `sweep_args` runs (`k3lab.hints`)."""
    return (f"k3lab sweep {sweep_file} --storage {tmp_path / 'runs'} --tracking-uri sqlite:///{tmp_path / 'mlflow.db'} "
            "--overwrite")


@pytest.mark.parametrize("text, problem", [
    ("", "not JSON"), ('{"parent_run_id": "ab', "not JSON"), ("[1]", "a JSON list, not an object"),
    ("{}", "no parent_run_id"), ('{"trials": []}', "no parent_run_id"),
    ('{"parent_run_id": "x", "trials": "a_s0"}', "trials is not a list of trial ids"),
    ('{"parent_run_id": 3}', "parent_run_id is not a run id"),
])
def test_a_damaged_state_file_is_named_in_one_line_by_resume_and_report(tmp_path, sweep_file, capsys, text, problem):
    """They raised JSONDecodeError, AttributeError, TypeError or KeyError (for `{}` after Ray started)."""
    state = tmp_path / "runs" / "mini.k3lab.json"
    (tmp_path / "runs" / "mini").mkdir(parents=True)
    state.write_text(text)
    (tmp_path / "mlflow.db").touch()  # report looks for the store first
    capsys.readouterr()
    for args in (sweep_args(tmp_path, sweep_file, "--resume"),
                 ["report", str(sweep_file), "--storage", str(tmp_path / "runs"),
                  "--tracking-uri", f"sqlite:///{tmp_path / 'mlflow.db'}"]):
        assert main(args) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"error: {state}: not a k3lab sweep state file ({problem}")
        assert err.count("\n") == 1 and err.endswith(" --overwrite` starts the sweep again\n")
        assert f"`k3lab sweep {sweep_file} --storage {tmp_path / 'runs'}" in err  # run as printed, it acts on this sweep
    assert main(sweep_args(tmp_path, sweep_file)) == 2  # a plain run still asks for --resume or --overwrite
    assert "--overwrite" in capsys.readouterr().err


def test_resume_with_a_store_that_lacks_the_parent_run_is_refused_before_ray_and_creates_no_store(
        tmp_path, sweep_file, capsys):
    """It raised MlflowException "Run with id=... not found" after Ray started, leaving a new database."""
    from k3lab.registry import load_sweep
    from k3lab.store.state import write_state

    fake_tune_folder(tmp_path / "runs" / "mini")
    state = tmp_path / "runs" / "mini.k3lab.json"
    write_state(state, "0123abc", "sqlite:///first.db", [t.id for t in load_sweep(sweep_file).trials])
    capsys.readouterr()
    assert main(sweep_args(tmp_path, sweep_file, "--resume")) == 2
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    assert capsys.readouterr().err == (f"error: {state}: its parent run 0123abc is not in {store} "
                                       "(the sweep logged to sqlite:///first.db)\n")
    assert not (tmp_path / "mlflow.db").exists()
    MlflowClient(store).create_experiment("another")  # a store, but not the sweep's
    assert main(sweep_args(tmp_path, sweep_file, "--resume")) == 2
    assert "its parent run 0123abc is not in" in capsys.readouterr().err


@pytest.mark.parametrize("damage, problem", [
    ("tuner.pkl", "tuner.pkl is missing"), ("experiment_state", "no experiment_state-*.json"),
    ("truncated", "experiment_state-2026-01-01_00-00-00.json is not JSON"), ("empty", "tuner.pkl is missing"),
])
def test_a_damaged_tune_folder_is_refused_by_resume_before_mlflow_is_touched(
        tmp_path, sweep_file, capsys, damage, problem):
    """Tuner.restore raised FileNotFoundError or KeyError 'trial' after Ray started, and the parent run ended FAILED."""
    from k3lab.registry import load_sweep
    from k3lab.store.state import write_state

    folder = tmp_path / "runs" / "mini"
    fake_tune_folder(folder)
    state = folder.parent / "mini.k3lab.json"
    write_state(state, "0123abc", "sqlite:///first.db", [t.id for t in load_sweep(sweep_file).trials])
    if damage == "empty":
        shutil.rmtree(folder)
        folder.mkdir()
    elif damage == "truncated":
        next(folder.glob("experiment_state-*")).write_text('{"trial_data": [["{')
    else:
        next(folder.glob(f"{damage}*")).unlink()
    capsys.readouterr()
    assert main(sweep_args(tmp_path, sweep_file, "--resume")) == 2
    assert capsys.readouterr().err == (f"error: --resume: {folder} is not a resumable Ray Tune experiment ({problem}): "
                                       f"`{overwrite_hint(tmp_path, sweep_file)}` starts it again\n")
    assert not (tmp_path / "mlflow.db").exists()


def test_a_run_stopped_before_its_tune_folder_is_named_alike_by_resume_and_a_plain_run(tmp_path, sweep_file, capsys):
    """--resume said "no earlier run", a plain run that the missing Tune folder exists."""
    state = tmp_path / "runs" / "mini.k3lab.json"
    state.parent.mkdir()
    state.write_text('{"parent_run_id": "0123abc"}')
    expected = (f"error: {state}: the earlier run of mini was stopped before any trial started "
                f"(no {tmp_path / 'runs' / 'mini'}): `{overwrite_hint(tmp_path, sweep_file)}` starts it again\n")
    for extra in (("--resume",), ()):
        assert main(sweep_args(tmp_path, sweep_file, *extra)) == 2
        assert capsys.readouterr().err == expected


def test_sweep_moved_to_another_machine_resumes_there(tmp_path, sweep_file, monkeypatch):
    """Preemptible nodes: run part of a sweep, copy its storage folder and SQLite MLflow store
    (mlflow.db and mlartifacts/) to a fresh machine, and --resume it there."""
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir()
    monkeypatch.setenv("K3LAB_FAIL_AT_STEP", "8")  # both trials stop after their step-4 checkpoint
    assert main(sweep_args(first, sweep_file, "--max-failures", "0")) == 1
    before = {r.info.run_id for r in trial_runs(first)[2]}
    second.mkdir()
    for name in ("runs", "mlartifacts"):
        shutil.copytree(first / name, second / name)
    shutil.copy2(first / "mlflow.db", second / "mlflow.db")
    shutil.rmtree(first)  # the first machine is gone: nothing may still point into it
    monkeypatch.delenv("K3LAB_FAIL_AT_STEP")
    assert main(sweep_args(second, sweep_file, "--resume")) == 0
    assert not first.exists(), sorted(str(p) for p in first.rglob("*"))
    client, parent, runs = trial_runs(second)
    assert {r.info.run_id for r in runs} == before  # the same runs continued, no duplicates
    assert_one_clean_run_per_trial(client, runs)  # every step once, none repeated
    for run in [parent, *runs]:  # artifacts live, and are read, at the new place
        assert client.get_run(run.info.run_id).info.artifact_uri.startswith((second / "mlartifacts").as_uri())
    assert {"mini.yaml", "report"} <= {a.path for a in client.list_artifacts(parent.info.run_id)}
    assert (second / "runs" / "mini_report" / "summary.json").exists()
    tags = parent.data.tags  # the commands that ran it, for reports
    assert tags["k3lab.command"].endswith("--max-failures 0") and tags["k3lab.resumed_with"].endswith("--resume")
    assert all(run.data.tags["k3lab.device"].startswith("CPU") for run in runs)


@pytest.fixture(scope="module")
def finished_sweep(tmp_path_factory, data_dir):
    """One sweep run to its end as a user runs it (in a process of its own): its folder and output."""
    folder = tmp_path_factory.mktemp("finished")
    (folder / "mini.yaml").write_text(SWEEP)
    env = {k: v for k, v in os.environ.items() if k != "K3LAB_FAIL_AT_STEP"}
    env |= {"PYTHONPATH": str(REPO), "K3LAB_DATA_DIR": str(data_dir)}
    done = subprocess.run([sys.executable, "-m", "k3lab.cli", *sweep_args(folder, folder / "mini.yaml")],
                          cwd=folder, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr
    return folder, done


def test_sweep_header_counts_variants_seeds_and_trials(finished_sweep):
    _, done = finished_sweep
    header = done.stdout.splitlines()[0]
    assert header == "mini (top-level settings): 2 variants x 1 seeds = 2 trials, 8 steps of 64 tokens"


def test_piped_sweep_output_is_progress_lines_then_tables_each_on_lines_of_their_own(finished_sweep):
    """stdout is a pipe here (as with `| tee log`): a line per trial start, evaluation and end, in
    order, no live table anywhere, and every table's title and borders on lines of their own."""
    folder, done = finished_sweep
    lines = done.stdout.splitlines()
    progress = [line.split("s  ", 1)[1] for line in lines if "-s0 " in line and "s  " in line]
    for name in ("attnres_off-s0", "attnres_bs1-s0"):
        mine = [line for line in progress if line.startswith(name)]
        assert [line.split(" ")[1] for line in mine] == ["started", "step", "done"], mine
        assert mine[1].startswith(f"{name} step 4/8: train loss ") and mine[2].startswith(f"{name} done at step 8/8:")
        assert mine[2].endswith(" tokens/s (last window)") and "val loss -" not in mine[2]
    assert "┏" not in done.stderr and "┃" not in done.stderr  # no table drawn on stderr
    for line in lines:  # a border is never glued to anything
        for border in "┏└┡":
            assert border not in line or line.startswith(border), line
    assert "mini: final val_loss" in [line.strip() for line in lines]
    assert "tokens/s (run average)" in done.stdout
    assert not (folder / "runs" / "mini.ray.json").exists()  # its watchdog is done: nothing left of Ray


def test_sweep_keeps_ray_and_mlflow_notices_in_its_log_file(finished_sweep):
    folder, done = finished_sweep
    assert "Token authentication" not in done.stderr and "mlflow" not in done.stderr.lower()
    assert "Ray and MLflow notices: " in done.stdout
    log = (folder / "runs" / "mini.log").read_text()
    assert "Creating initial MLflow database tables" in log
    assert "Token authentication" in log or "RAY_AUTH_MODE" in os.environ  # Ray 2.59+ says it unless told


def test_resume_of_a_finished_sweep_shows_its_trials_done_and_keeps_the_first_wall_time(finished_sweep, capfd):
    folder, _ = finished_sweep
    client, parent, runs = trial_runs(folder)
    first_wall = parent.data.metrics["sweep_wall_s"]
    args = [a for a in sweep_args(folder, folder / "mini.yaml", "--resume") if a != "--no-live"]
    assert main(args) == 0
    out = capfd.readouterr().out  # not a terminal: the progress lines
    assert "started" not in out
    for run in runs:  # each trial's line: done, every step, its final validation loss
        line = next(line for line in out.splitlines() if f"{run.data.tags['k3lab.variant_name']}-s0 " in line)
        assert f"done in an earlier run, at step 8/8: train loss {run.data.metrics['train_loss']:.3f}, val loss " \
               f"{run.data.metrics['val_loss']:.4f}" in line
    parent = client.get_run(parent.info.run_id)
    metrics = parent.data.metrics
    assert metrics["sweep_wall_s"] == first_wall and metrics["resume_wall_s"] > 0
    assert metrics["sweep_parts"] == 2  # the totals cover both parts, their wall times summed
    assert metrics["sweep_parts_wall_s"] == pytest.approx(first_wall + metrics["resume_wall_s"])
    assert metrics["sweep_tokens_per_s"] == pytest.approx(metrics["sweep_tokens"] / metrics["sweep_parts_wall_s"], rel=0.05)
    assert parent.info.status == "FINISHED"


@pytest.mark.parametrize("resources, cluster, message", [
    ("{cpu: 4, gpus_per_trial: 4, strategy: ddp}", {"CPU": 32, "GPU": 2},
     "resources.gpus_per_trial=4: one trial needs 4 GPUs and the Ray cluster has 2 in all"),
    ("{cpu: 1, gpu: 2}", {"CPU": 32, "GPU": 1}, "resources.gpu=2: one trial needs 2 GPUs"),
    ("{cpu: 16, gpus_per_trial: 2, strategy: ddp}", {"CPU": 16, "GPU": 2},
     "resources.cpu: one trial needs 32.01 CPUs"),  # each worker takes `cpu`
])
def test_a_trial_larger_than_the_ray_cluster_is_refused_with_the_field(tmp_path, resources, cluster, message):
    from k3lab.errors import UserError
    from k3lab.registry.sweep_file import load_sweep
    from k3lab.runner.tune.driver import check_cluster_fits

    path = tmp_path / "big.yaml"
    path.write_text(mini_sweep("big", "too large").replace("resources: {cpu: 1, gpu: 0}", f"resources: {resources}"))
    with pytest.raises(UserError, match=message):
        check_cluster_fits(load_sweep(path), cluster)


def test_a_sweep_refused_once_ray_is_up_leaves_no_log_file_or_storage_folder(tmp_path, capsys):
    path = tmp_path / "big.yaml"
    path.write_text(mini_sweep("big", "too large").replace("resources: {cpu: 1, gpu: 0}", "resources: {cpu: 1000}"))
    (tmp_path / "kept").mkdir()
    (tmp_path / "kept" / "big.log").write_text("an earlier run's notices\n")
    assert main(sweep_args(tmp_path, path, storage=tmp_path / "runs" / "new")) == 2
    assert "resources.cpu: one trial needs 1000 CPUs" in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()  # its log, and the storage folders made for it
    assert main(sweep_args(tmp_path, path, storage=tmp_path / "kept")) == 2
    assert (tmp_path / "kept" / "big.log").read_text().startswith("an earlier run's notices\n")  # a log it found stays


def test_trials_that_fit_the_ray_cluster_pass_and_ddp_workers_fall_back_to_cpu_without_gpus(tmp_path):
    from k3lab.registry.sweep_file import load_sweep
    from k3lab.runner.tune.driver import check_cluster_fits

    for resources, cluster in [("{cpu: 3, gpu: 0.25}", {"CPU": 16, "GPU": 1}),
                               ("{cpu: 8, gpus_per_trial: 2, strategy: ddp}", {"CPU": 32, "GPU": 2}),
                               ("{cpu: 1, gpus_per_trial: 2, strategy: ddp}", {"CPU": 4})]:  # gloo workers
        path = tmp_path / "fits.yaml"
        path.write_text(mini_sweep("fits", "fits").replace("resources: {cpu: 1, gpu: 0}", f"resources: {resources}"))
        check_cluster_fits(load_sweep(path), cluster)


def test_trials_an_asha_scheduler_stops_keep_their_metrics_and_end_finished_or_killed(tmp_path, sweep_file):
    """Tune stops a trial by raising SystemExit inside its report: ASHA cuts some early and
    stops every survivor at max_t, its last report. Neither is a failure, and the metrics of
    the report it was stopped at reach MLflow."""
    sweep_file.write_text(sweep_file.read_text().replace(
        "attn_res_block_size: [off, 1]", "attn_res_block_size: [off, 1, 2]").replace("num_layers: 2", "num_layers: 4")
        .replace("layer_types: [kda, mla]", "layer_types: [kda, mla, kda, mla]")
        + "scheduler: {kind: asha, grace_period: 1, reduction_factor: 3}\n")
    assert main(sweep_args(tmp_path, sweep_file, "--max-concurrent", "1")) == 0
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    parent_id = json.loads((tmp_path / "runs" / "mini.k3lab.json").read_text())["parent_run_id"]
    runs = client.search_runs([client.get_run(parent_id).info.experiment_id],
                              f"tags.mlflow.parentRunId = '{parent_id}'")
    assert len(runs) == 3
    for run in runs:
        assert "k3lab.error" not in run.data.tags, run.data.tags["k3lab.error"]
        evals = [m.step for m in client.get_metric_history(run.info.run_id, "val_loss")]
        if run.info.status == "FINISHED":
            assert evals == [4, 8] and run.data.metrics["final_val_loss"] > 0
        else:
            assert run.info.status == "KILLED"
            assert evals == [4] and run.data.tags["k3lab.stopped_at_step"] == "4"
    assert "FINISHED" in {r.info.status for r in runs}


def test_reused_trial_processes_run_the_next_trial_cleanly_and_to_the_same_result(tmp_path, sweep_file,
                                                                                   finished_sweep):
    """resources.reuse_actors: the second trial runs in the first one's process, still logs
    every step once, and ends exactly where it ends in a process of its own."""
    sweep_file.write_text(sweep_file.read_text().replace("resources: {cpu: 1, gpu: 0}",
                                                         "resources: {cpu: 1, gpu: 0, reuse_actors: true}"))
    assert main(sweep_args(tmp_path, sweep_file, "--max-concurrent", "1")) == 0
    client, parent, runs = trial_runs(tmp_path)
    assert_one_clean_run_per_trial(client, runs)
    assert parent.data.params["resources.reuse_actors"] == "True"
    assert len({run.data.tags["k3lab.process"] for run in runs}) == 1  # one process, both trials
    _, _, fresh = trial_runs(finished_sweep[0])  # the same sweep, each trial in a new process
    final = {r.data.tags["k3lab.variant_name"]: r.data.metrics["final_val_loss"] for r in runs}
    assert final == {r.data.tags["k3lab.variant_name"]: r.data.metrics["final_val_loss"] for r in fresh}


def test_with_one_training_slot_two_trials_at_once_start_together_but_train_one_after_the_other(
        tmp_path, sweep_file, monkeypatch):
    """resources.training_slots: both trials start (Ray runs two at once), but only one trains
    at a time: the other waits after its first step, and the wait is logged."""
    monkeypatch.setenv("K3LAB_SLOT_DIR", str(tmp_path / "slots"))  # not the host's: another CPU sweep's
    steps = 160  # long enough that the second trial is ready before the first ends
    sweep_file.write_text(mini_sweep("mini", "x", steps=steps, eval_interval=80, log_interval=20).replace(
        "resources: {cpu: 1, gpu: 0}", "resources: {cpu: 1, gpu: 0, max_concurrent_trials: 2, training_slots: 1}"))
    assert main(sweep_args(tmp_path, sweep_file)) == 0
    client, parent, runs = trial_runs(tmp_path)
    assert parent.data.params["resources.training_slots"] == "1"
    spans = []  # each trial's time in its slot: from its step-2 metrics (logged at step 20) to its last
    for run in runs:
        assert run.info.status == "FINISHED"
        times = {m.step: m.timestamp for m in client.get_metric_history(run.info.run_id, "train_loss")}
        spans.append((run.info.start_time, times[2], times[steps]))
        assert [m.step for m in client.get_metric_history(run.info.run_id, "slot_wait_s")] == [1]
    (_, first_trains, first_ends), (second_starts, second_trains, _) = sorted(spans, key=lambda span: span[1])
    assert second_starts < first_ends  # the two trials were up at once ...
    assert first_ends <= second_trains  # ... but trained one after the other
    assert max(run.data.metrics["slot_wait_s"] for run in runs) > 0.5
    assert [p.name for p in (tmp_path / "slots" / "cpu").iterdir()] == ["slot-0.lock"]


def ray_processes_of(driver: int) -> dict[int, int]:
    """{pid: start time} of every process under a driver: its Ray instance (and the watchdog)."""
    from k3lab.runner.runtime import reaper

    return reaper.descendants(driver)


def test_a_driver_killed_with_sigkill_leaves_no_ray_process_and_resume_shows_its_finished_trial(
        tmp_path, sweep_file, data_dir, capsys):
    """kill -9 of `k3lab sweep` just after its first trial ended: every process of its Ray instance
    (Ray's agents outlast SIGTERM) is gone soon after, and --resume shows that trial done with the
    figures its MLflow run holds (Tune may run it again from its final checkpoint: nothing to train)."""
    import signal
    import threading
    import time

    from k3lab.runner.runtime import reaper

    if not reaper.supported():
        pytest.skip("needs /proc (Linux)")
    sweep_file.write_text(sweep_file.read_text().replace("steps: 8,", "steps: 40,").replace("eval_interval: 4",
                                                                                             "eval_interval: 20"))
    env = {k: v for k, v in os.environ.items() if k != "K3LAB_FAIL_AT_STEP"}
    env |= {"PYTHONPATH": str(REPO), "K3LAB_DATA_DIR": str(data_dir)}
    driver = subprocess.Popen([sys.executable, "-m", "k3lab.cli", *sweep_args(tmp_path, sweep_file,
                                                                                  "--max-concurrent", "1")],
                              cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    timer = threading.Timer(600, driver.kill)  # whatever happens, the driver does not outlive the test
    timer.start()
    instance: dict[int, int] = {}
    try:
        seen = []
        for line in driver.stdout:
            seen.append(line)
            if "attnres_off-s0 done at step 40/40" in line:
                break
        assert seen and "done at step 40/40" in seen[-1], "".join(seen)
        instance = ray_processes_of(driver.pid)
        names = [reaper.name_of(pid) for pid in instance]
        assert "raylet" in names and any(name.startswith("ray::") for name in names), names

        def unrecorded() -> set[str]:  # the watchdog's record follows the instance (it looks every POLL_S)
            record = reaper.read_record(tmp_path / "runs" / "mini.ray.json")
            return set(map(str, ray_processes_of(driver.pid))) - set(record["processes"]) - {
                str(record["watchdog"]["pid"])}

        deadline = time.monotonic() + 10
        while unrecorded() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not unrecorded()
        instance |= ray_processes_of(driver.pid)
        session = reaper.read_record(tmp_path / "runs" / "mini.ray.json")["session_dir"]
        assert session and session.startswith("/")
        driver.send_signal(signal.SIGKILL)
        driver.wait()

        def left() -> list[str]:
            by_tree = [f"{pid} {reaper.name_of(pid)}" for pid, start in instance.items() if reaper.is_alive(pid, start)]
            by_session = [p.name for p in Path("/proc").iterdir() if p.name.isdigit() and reaper.start_time(int(p.name))
                          and session in (p / "cmdline").read_bytes().decode(errors="replace")]
            return by_tree + by_session

        deadline = time.monotonic() + 3 * reaper.GRACE_S + 20
        while left() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert left() == []
        assert not (tmp_path / "runs" / "mini.ray.json").exists()
        assert "ended without shutting Ray down; ended" in (tmp_path / "runs" / "mini.log").read_text()
    finally:
        timer.cancel()
        if driver.poll() is None:
            driver.kill()
            driver.wait()
        for pid, start in instance.items():  # the test's own clean-up, should the watchdog have failed
            if reaper.is_alive(pid, start):
                os.kill(pid, signal.SIGKILL)
    capsys.readouterr()
    assert main(sweep_args(tmp_path, sweep_file, "--resume")) == 0
    out = capsys.readouterr().out
    client, _, runs = trial_runs(tmp_path)
    first = next(r for r in runs if r.data.tags["k3lab.variant_name"] == "attnres_off")
    line = next(line for line in out.splitlines() if "attnres_off-s0 done" in line)
    assert f"at step 40/40: train loss {first.data.metrics['train_loss']:.3f}, val loss " \
           f"{first.data.metrics['val_loss']:.4f}" in line, out
    assert "inf" not in line and "ray: ended" not in out  # the watchdog had ended them: nothing left over


def test_stop_after_ends_a_sweep_on_time_resumable_with_its_own_exit_code(tmp_path, data_dir):
    """--stop-after is a job scheduler's time limit kept by the sweep itself: it stops as Ctrl-C
    does (state saved, running trials KILLED), says how to go on, and
    exits 3, which a job script tells apart from failure (1) and bad input (2)."""
    done = stopped_long_sweep(tmp_path, data_dir)
    assert done.returncode == 3, done.stdout[-2000:] + done.stderr[-2000:]
    assert "sweep stopped after 45s (--stop-after), its state saved: continue it with `k3lab sweep" in done.stderr
    assert "--stop-after 45s --resume`" in done.stderr  # each part of a run in parts keeps the same limit
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(uri)
    parent_id = json.loads((tmp_path / "runs" / "long.k3lab.json").read_text())["parent_run_id"]
    parent = client.get_run(parent_id)
    assert parent.info.status == "FINISHED" and parent.data.tags["k3lab.status"] == "stopped"  # no red cross
    trials = client.search_runs([parent.info.experiment_id], f"tags.mlflow.parentRunId = '{parent_id}'")
    assert trials and {t.info.status for t in trials} == {"KILLED"}  # stopped mid-run, not failed
    printed = re.search(r"continue it with `([^`]+)`", done.stderr).group(1)
    assert f"`{printed}` continues it" in parent.data.tags["mlflow.note.content"]  # as printed, whole
    from k3lab.store import runs, verdicts  # what a plain `mlflow ui` shows, written by the sweep at its stop

    assert verdicts.variant_runs(runs.client(uri), parent_id)["attnres_bs1"].info.run_name.startswith(
        "attnres_bs1 vs attnres_off: not resolved, no pairs (")


def test_a_stop_after_that_is_not_a_duration_is_one_line_and_nothing_starts(tmp_path, sweep_file, capsys):
    assert main(sweep_args(tmp_path, sweep_file, "--stop-after", "soon")) == 2
    assert capsys.readouterr().err.strip() == "error: --stop-after soon: not a duration (e.g. 10m, 1h30m, 90s)"
    assert not (tmp_path / "mlflow.db").exists() and not (tmp_path / "runs").exists()


def test_a_grid_starts_seed_by_seed_so_a_sweep_stopped_early_holds_whole_pairs():
    from types import SimpleNamespace

    from k3lab.registry.sweep_cli import load_sweep_for
    from k3lab.runner.tune.trial import trial_specs

    sweep = load_sweep_for(str(Path(__file__).resolve().parents[1] / "experiments/pairing.yaml"), "cpu")
    run = SimpleNamespace(sweep=sweep, tracking_uri=None, experiment="pairing-cpu", uses_gpus=False)
    started = [(spec.seed, spec.variant_name) for spec in trial_specs(run, parent_run_id="p").values()]
    variants = [v.name for v in sweep.valid_variants]
    assert started == [(seed, name) for seed in range(8) for name in variants]
    first_six = started[:6]  # e.g. a budget that ends after six trials: two whole seeds, a pair per comparison
    assert {seed for seed, _ in first_six} == {0, 1} and len(set(first_six)) == 6


def test_a_sigterm_signal_stops_a_sweep_as_ctrl_c_does_with_exit_143_and_the_resume_hint(tmp_path, sweep_file,
                                                                                         monkeypatch, capsys):
    """A scheduler's SIGTERM (SLURM, `kill`) mid-sweep: Tune is sent SIGINT (it saves its state), and
    the command says how to go on and exits 143; it died in Ray's crash dump with exit 1."""
    import signal

    import k3lab.runner.tune.driver as sweep_module

    monkeypatch.setattr(sweep_module, "run_sweep", sweep_that_gets_sigterm)
    before = signal.getsignal(signal.SIGTERM)
    assert main(sweep_args(tmp_path, sweep_file)) == 143
    err = capsys.readouterr().err
    assert "sweep stopped by SIGTERM, its state saved: continue it with `k3lab sweep" in err
    assert err.rstrip().endswith("--resume`")
    assert signal.getsignal(signal.SIGTERM) is before  # the handler is the sweep's only


def test_the_sigterm_signal_handler_is_put_back_after_ray_init_replaces_it():
    """ray.init installs its own SIGTERM handler (a crash dump, exit 1): the sweep's comes back after it."""
    import signal

    from k3lab.runner.runtime.sigterm import keep_sigterm_handler, on_sigterm, stop_on_sigterm

    with stop_on_sigterm():
        with keep_sigterm_handler():
            signal.signal(signal.SIGTERM, lambda signum, frame: None)  # as ray.init does
        assert signal.getsignal(signal.SIGTERM) is on_sigterm
    assert signal.getsignal(signal.SIGTERM) is not on_sigterm


def test_a_second_sweep_while_one_holds_the_experiment_lock_is_refused_in_one_line_and_writes_nothing(
        tmp_path, sweep_file, capsys):
    """Two sweeps started seconds apart both passed the folder checks (the Ray record and the state
    file come seconds after the start) and ran into one Tune folder with two parent runs; the lock,
    taken before any check or write, refuses the second at once."""
    import subprocess

    storage = tmp_path / "runs"
    storage.mkdir()
    holder = subprocess.Popen([sys.executable, "-c", "import fcntl, os, sys, time\n"
                               f"fd = os.open({str(storage / 'mini.lock')!r}, os.O_RDWR | os.O_CREAT)\n"
                               "fcntl.flock(fd, fcntl.LOCK_EX); os.write(fd, b'%d\\n' % os.getpid())\n"
                               "print('locked', flush=True); time.sleep(60)"], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        assert main(sweep_args(tmp_path, sweep_file)) == 2
        err = capsys.readouterr().err.strip()
        assert err == (f"error: {storage / 'mini.lock'}: a sweep of this experiment is running (driver PID "
                       f"{holder.pid}): wait for it to end, or stop it, before starting another")
        assert sorted(p.name for p in storage.iterdir()) == ["mini.lock"]  # the holder's, untouched
        assert not (tmp_path / "mlflow.db").exists()
    finally:
        holder.kill()
        holder.wait()


def test_the_sweep_lock_is_released_and_removed_and_a_folder_made_for_it_is_removed_again(tmp_path):
    """A sweep refused after taking the lock (its folder checks) leaves nothing, and the next one gets the lock."""
    from k3lab.runner.runtime.lock import sweep_lock

    path = tmp_path / "runs" / "mini.lock"
    with pytest.raises(RuntimeError), sweep_lock(path):
        assert path.read_text() == f"{os.getpid()}\n"
        raise RuntimeError
    assert not (tmp_path / "runs").exists()
    with sweep_lock(path):
        pass


@pytest.mark.parametrize("stop", [KeyboardInterrupt, "UserError"])
def test_a_sweep_stopped_before_its_state_file_leaves_neither_its_log_nor_an_empty_store_file(tmp_path, stop):
    """--stop-after (or Ctrl-C, SIGTERM) before anything ran said "nothing to resume" and left
    <storage>/<name>.log and the 0-byte SQLite file MLflow had begun."""
    from types import SimpleNamespace

    from k3lab.errors import UserError
    from k3lab.runner.runtime.session import sweep_log

    (tmp_path / "runs").mkdir()
    run = SimpleNamespace(verbose=False, log_file=tmp_path / "runs" / "mini.log", state_file=tmp_path / "runs" / "x",
                          tracking_uri=f"sqlite:///{tmp_path / 'store' / 'mlflow.db'}")
    with pytest.raises(KeyboardInterrupt if stop is KeyboardInterrupt else UserError), sweep_log(run):
        (tmp_path / "store").mkdir()
        (tmp_path / "store" / "mlflow.db").touch()  # as MLflow's engine does before its tables
        raise KeyboardInterrupt if stop is KeyboardInterrupt else UserError("refused")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["runs"] and not any((tmp_path / "runs").iterdir())


def test_a_sweep_stopped_early_keeps_a_store_file_it_did_not_make_or_that_holds_data(tmp_path):
    from types import SimpleNamespace

    from k3lab.runner.runtime.session import sweep_log

    run = SimpleNamespace(verbose=True, log_file=tmp_path / "mini.log", state_file=tmp_path / "x",
                          tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    (tmp_path / "mlflow.db").touch()  # there before the sweep
    with pytest.raises(KeyboardInterrupt), sweep_log(run):
        raise KeyboardInterrupt
    assert (tmp_path / "mlflow.db").exists()


def test_tunes_sigint_handler_left_after_a_finished_fit_no_longer_swallows_a_sigterm_signal():
    """Tune's `fit` leaves its SIGINT handler installed after a normal end: a SIGTERM (sent on as
    SIGINT) during the report set its event and was ignored."""
    import signal

    from k3lab.runner.runtime.sigterm import on_sigterm, sigint_kept, stop_on_sigterm

    before = signal.getsignal(signal.SIGINT)  # ignored where the tests run as a background job
    with stop_on_sigterm():
        with sigint_kept():
            signal.signal(signal.SIGINT, lambda signum, frame: None)  # as Tune's fit does
        with pytest.raises(KeyboardInterrupt):
            on_sigterm(signal.SIGTERM, None)
            time.sleep(5)
    assert signal.getsignal(signal.SIGINT) is before
