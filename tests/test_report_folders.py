"""`k3lab report` where it cannot write: its report folder, or the folder of the SQLite store it
reads (SQLite writes a journal beside the file). One line naming what and where, exit 2, nothing
written, no traceback."""

import os

import pytest
from test_preflight import unwritable_folder
from test_ui import fake_sweep

from k3lab.cli import main


def test_a_report_into_a_folder_it_cannot_write_is_one_line_before_any_work(tmp_path, sweep_file, capsys):
    """It was a traceback (PermissionError or OSError from the plots) after the tables."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    fake_sweep(uri, seeds=(0,))
    storage = unwritable_folder(tmp_path)
    capsys.readouterr()  # MLflow's notices while the store was made
    assert main(["report", str(sweep_file), "--storage", str(storage), "--tracking-uri", uri]) == 2
    captured = capsys.readouterr()
    assert captured.err.count("\n") == 1 and "Traceback" not in captured.err, captured.err
    assert captured.err.startswith(f"error: the report's folder (--out names another) {storage / 'mini_report'}: "
                                   f"cannot write in {storage}")
    assert captured.out == ""


def read_only(folder, monkeypatch) -> None:
    """`folder` read-only; for root (who writes anyway) a folder that the write probe cannot write."""
    if os.geteuid() != 0:
        folder.chmod(0o555)
        return
    import k3lab.runner.runtime.preflight as preflight

    real = preflight.tempfile.NamedTemporaryFile

    def probe(*args, dir=None, **kwargs):
        if dir is not None and os.path.samefile(dir, folder):
            raise PermissionError(13, "Permission denied")
        return real(*args, dir=dir, **kwargs)

    monkeypatch.setattr(preflight.tempfile, "NamedTemporaryFile", probe)


def test_a_report_on_a_store_in_a_read_only_folder_is_one_line_not_mlflow_tracebacks(tmp_path, sweep_file, capsys,
                                                                                      monkeypatch):
    """MLflow printed a traceback for each write (the sweep's state tag, the UI view) and the report exited 0."""
    store = tmp_path / "store"
    store.mkdir()
    uri = f"sqlite:///{store / 'mlflow.db'}"
    fake_sweep(uri, seeds=(0,), parent_status="RUNNING")
    read_only(store, monkeypatch)
    capsys.readouterr()
    try:
        assert main(["report", str(sweep_file), "--storage", str(tmp_path / "runs"), "--tracking-uri", uri]) == 2
    finally:
        store.chmod(0o755)
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith(f"error: tracking store {store / 'mlflow.db'}: its folder {store} cannot be written")
    assert not (tmp_path / "runs").exists()
