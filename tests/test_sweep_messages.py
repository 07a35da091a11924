"""What `k3lab sweep` tells a user around a sweep: a dry run refused as the sweep would be, printed
commands that stay one line in a file, and the next steps after a finished sweep."""

import io
from pathlib import Path

import pytest

from k3lab.cli import main

FLAGSHIP = Path(__file__).resolve().parents[1] / "experiments" / "attnres_block.yaml"


def test_a_dry_run_on_a_machine_without_a_gpu_is_refused_as_the_gpu_sweep_would_be(tmp_path, capsys, monkeypatch):
    """It exited 0 and never said that the real sweep would be refused (exit 2)."""
    monkeypatch.setattr("k3lab.runner.runtime.preflight.cuda_gpus", lambda: 0)
    assert main(["sweep", str(FLAGSHIP), "--profile", "gpu", "--dry-run", "--storage", str(tmp_path / "runs"),
                 "--tracking-uri", f"sqlite:///{tmp_path / 'mlflow.db'}"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: {FLAGSHIP}: profile gpu: resources.gpu=")
    assert "this machine has no CUDA GPU" in err[0]
    assert not (tmp_path / "runs").exists() and not (tmp_path / "mlflow.db").exists()


def test_a_printed_command_is_never_wrapped_in_a_file():
    """`k3lab report FILE --close` went to the next line when the output was a file."""
    from k3lab.report.tables import wide_console

    out = io.StringIO()
    command = f"k3lab report experiments/attnres_block.yaml --storage /a/long/{'x' * 120} --close"
    wide_console(file=out).print(f"[yellow]interrupted: the parent run abc of attnres_block is still RUNNING; "
                                 f"`{command}` ends it")
    assert len(out.getvalue().splitlines()) == 1 and command in out.getvalue()


@pytest.mark.parametrize("uri, ui", [
    (None, "`k3lab ui` opens it in MLflow"),
    ("sqlite:////elsewhere/mlflow.db", "`k3lab ui --tracking-uri sqlite:////elsewhere/mlflow.db` opens it in MLflow"),
    ("http://mlflow:5000", "open http://mlflow:5000 in a browser"),
])
def test_a_finished_sweep_names_its_next_steps_with_the_flags_that_point_at_its_store(tmp_path, monkeypatch, uri,
                                                                                      ui):
    """A killed sweep printed what to run next, a finished one nothing."""
    from k3lab.registry import load_sweep
    from k3lab.runner.tune.run import SweepRun, local_tracking_uri, next_steps

    monkeypatch.chdir(tmp_path)
    run = SweepRun(sweep=load_sweep(FLAGSHIP), storage=Path("k3lab_runs"), tracking_uri=uri or local_tracking_uri())
    line = next_steps(run)
    assert line.startswith(f"next: `k3lab report {FLAGSHIP}")
    assert ("--tracking-uri" in line.split("`")[1]) == (uri is not None) and line.endswith(ui)
