"""Every command k3lab prints for a user to run next, run as printed from the folder where it was
printed, acts on the sweep it names: its profile, storage and tracking store travel with it."""

import json
import shlex
import socket
import subprocess
import sys

import pytest
from conftest import mini_sweep, sweep_args, sweep_that_gets_sigterm
from mlflow import MlflowClient
from test_ui import fake_sweep

from k3lab.cli import build_parser, main
from k3lab.commands.sweep import sweep_run_from_args
from k3lab.store import runs

PROFILES = """profiles:
  cpu: {}
  wide: {train: {batch_size: 4}}
"""


@pytest.fixture
def profiled_sweep(tmp_path):
    """The mini sweep with a `cpu` profile (what `auto` picks here) and a `wide` one."""
    path = tmp_path / "mini.yaml"
    path.write_text(mini_sweep("mini", "two variants") + PROFILES)
    return path


def hints_in(text: str) -> list[str]:
    """The `k3lab ...` commands quoted in a printed message."""
    return [part for part in text.split("`")[1::2] if part.startswith("k3lab ")]


def sweep_named_by(hint: str):
    """The SweepRun that `hint`, run here as printed, acts on (parsed as the `k3lab` command parses it)."""
    args = build_parser().parse_args(shlex.split(hint)[1:])
    return args, sweep_run_from_args(args)


def assert_acts_on(hint: str, run) -> None:
    args, named = sweep_named_by(hint)
    assert (named.experiment, named.storage.resolve(), named.tracking_uri) == \
        (run.experiment, run.storage.resolve(), run.tracking_uri), hint


def run_of(tmp_path, sweep_file, *extra):
    return sweep_named_by(shlex.join(["k3lab", *sweep_args(tmp_path, sweep_file, *extra)]))[1]


def test_a_printed_hint_carries_the_profile_storage_and_store_of_its_sweep(tmp_path, profiled_sweep, monkeypatch):
    (tmp_path / "cwd").mkdir()
    monkeypatch.chdir(tmp_path / "cwd")  # where ./k3lab_runs and ./mlflow.db are other folders than the sweep's
    run = run_of(tmp_path, profiled_sweep, "--profile", "wide")
    for verb, flag in (("sweep", "resume"), ("sweep", "overwrite"), ("report", "close")):
        hint = run.hint(verb, **{flag: True})
        assert hint.startswith(f"k3lab {verb} {profiled_sweep} --profile wide --storage {tmp_path / 'runs'} "
                               f"--tracking-uri sqlite:///{tmp_path / 'mlflow.db'} --{flag}"), hint
        assert_acts_on(hint, run)


def test_a_hint_leaves_out_only_what_the_defaults_give_in_the_same_folder(tmp_path, profiled_sweep, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for name in ("K3LAB_STORAGE", "MLFLOW_TRACKING_URI", "RAY_ADDRESS"):
        monkeypatch.delenv(name, raising=False)
    args = build_parser().parse_args(["sweep", "mini.yaml"])
    run = sweep_run_from_args(args)
    assert run.hint("sweep", resume=True) == "k3lab sweep mini.yaml --resume"
    monkeypatch.setenv("K3LAB_STORAGE", str(tmp_path / "elsewhere"))  # another shell may not have it
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'other.db'}")
    run = sweep_run_from_args(args)
    hint = run.hint("report", close=True)
    assert f"--storage {tmp_path / 'elsewhere'}" in hint and f"--tracking-uri sqlite:///{tmp_path / 'other.db'}" in hint
    for name in ("K3LAB_STORAGE", "MLFLOW_TRACKING_URI"):
        monkeypatch.delenv(name)
    assert_acts_on(hint, run)


def test_the_report_of_an_interrupted_sweep_prints_hints_that_act_on_that_sweep(tmp_path, profiled_sweep,
                                                                                capsys, monkeypatch):
    """It printed `k3lab sweep FILE --resume`, which from the same folder resumed the default store's sweep."""
    monkeypatch.chdir(tmp_path)
    uri = f"sqlite:///{tmp_path / 'store' / 'mlflow.db'}"
    (tmp_path / "store").mkdir()
    parent_run_id, _ = fake_sweep(uri, experiment="mini-wide", seeds=(0,), parent_status="RUNNING")
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    MlflowClient(uri).set_tag(parent_run_id, runs.DRIVER, f"{socket.gethostname()}:{gone.stdout.strip()}")
    storage = tmp_path / "elsewhere"
    (storage / "mini-wide").mkdir(parents=True)
    (storage / "mini-wide.k3lab.json").write_text(json.dumps({"parent_run_id": parent_run_id, "tracking_uri": uri}))
    argv = ["report", str(profiled_sweep), "--profile", "wide", "--storage", str(storage), "--tracking-uri", uri]
    assert main(argv) == 0
    printed = hints_in(" ".join(capsys.readouterr().out.split()))
    assert [shlex.split(h)[1] for h in printed] == ["sweep", "report"], printed
    run = sweep_named_by(shlex.join(["k3lab", *argv]))[1]
    for hint in printed:
        assert_acts_on(hint, run)
    assert sweep_named_by(printed[0])[0].resume and sweep_named_by(printed[1])[0].close


def test_the_errors_of_a_sweep_run_again_print_hints_that_act_on_that_sweep(tmp_path, profiled_sweep, capsys):
    storage = tmp_path / "runs"
    (storage / "mini-wide").mkdir(parents=True)
    run = run_of(tmp_path, profiled_sweep, "--profile", "wide")
    assert main(sweep_args(tmp_path, profiled_sweep, "--profile", "wide")) == 2  # the Tune folder exists
    (storage / "mini-wide.k3lab.json").write_text("{")
    assert main(sweep_args(tmp_path, profiled_sweep, "--profile", "wide", "--resume")) == 2  # a damaged state file
    err = capsys.readouterr().err
    printed = hints_in(err)
    assert len(printed) == 3 and "Traceback" not in err, err
    for hint in printed:
        assert_acts_on(hint, run)


def test_the_resume_hint_of_a_stopped_sweep_acts_on_it_and_keeps_how_it_ran(tmp_path, profiled_sweep, monkeypatch,
                                                                              capsys):
    import k3lab.runner.tune.driver as sweep_module

    monkeypatch.setattr(sweep_module, "run_sweep", sweep_that_gets_sigterm)
    argv = sweep_args(tmp_path, profiled_sweep, "--profile", "wide", "--max-concurrent", "1", "--overwrite")
    assert main(argv) == 143
    (hint,) = hints_in(capsys.readouterr().err)
    assert_acts_on(hint, run_of(tmp_path, profiled_sweep, "--profile", "wide"))
    args, _ = sweep_named_by(hint)
    assert args.resume and not args.overwrite and args.max_concurrent == 1 and args.no_live
