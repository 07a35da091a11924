"""A new local store's MLflow tables, made on a thread while Ray starts (`k3lab.store.schema`)."""

from __future__ import annotations

from pathlib import Path

from k3lab.store.schema import StoreAhead
from k3lab.store.tracking import holds_mlflow_runs


def test_a_new_store_appears_only_when_installed_with_mlflows_tables(tmp_path):
    target = tmp_path / "store" / "mlflow.db"
    ahead = StoreAhead(f"sqlite:///{target}")
    ahead.thread.join()
    assert not target.exists() and not target.parent.exists()  # nothing where the store goes yet
    assert ahead.install()
    ahead.discard()
    assert holds_mlflow_runs(target)
    assert not Path(ahead.made or "/nonexistent").exists() and ahead.folder is None
    assert [p.name for p in target.parent.iterdir()] == ["mlflow.db"]  # no staged copy left beside it


def test_a_store_discarded_before_install_leaves_nothing(tmp_path):
    target = tmp_path / "mlflow.db"
    ahead = StoreAhead(f"sqlite:///{target}")
    folder = Path(ahead.folder)
    ahead.discard()
    assert not target.exists() and not folder.exists()


def test_an_existing_store_file_is_left_alone(tmp_path):
    target = tmp_path / "mlflow.db"
    target.write_bytes(b"someone's file")
    ahead = StoreAhead(f"sqlite:///{target}")
    assert ahead.thread is None and not ahead.install()
    ahead.discard()
    assert target.read_bytes() == b"someone's file"


def test_a_store_made_meanwhile_by_another_sweep_is_kept(tmp_path):
    target = tmp_path / "mlflow.db"
    ahead = StoreAhead(f"sqlite:///{target}")
    target.write_bytes(b"the other sweep's store")
    assert not ahead.install()
    ahead.discard()
    assert target.read_bytes() == b"the other sweep's store"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mlflow.db"]


def test_a_tracking_server_needs_no_tables_made_here():
    ahead = StoreAhead("http://127.0.0.1:5000")
    assert ahead.thread is None and ahead.folder is None and not ahead.install()
