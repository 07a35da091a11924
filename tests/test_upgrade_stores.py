"""scripts/upgrade_stores.py: a compressed store from an older MLflow schema, upgraded in place with
MLflow's own migrations, its runs, params and metrics unchanged."""

from __future__ import annotations

import lzma
import sqlite3
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def alembic_config(path: Path):
    from mlflow.store.db.utils import _get_alembic_config

    return _get_alembic_config(f"sqlite:///{path}")


def schema_of(path: Path) -> str:
    with sqlite3.connect(path) as db:
        return db.execute("SELECT version_num FROM alembic_version").fetchone()[0]


def older_store(folder: Path) -> tuple[Path, str]:
    """A `*.db.xz` this MLflow wrote (one run: a param, three val_loss points), walked one schema
    back with MLflow's own migrations; and the schema it was walked back to."""
    from alembic import command

    from k3lab.store.tracking import MLflowTracker

    db = folder / "written.db"
    tracker = MLflowTracker.start(f"sqlite:///{db}", "old", "run")
    tracker.log_params({"model.hidden_size": 64})
    for step, loss in enumerate((3.5, 3.25, 3.125)):
        tracker.log_metrics({"val_loss": loss}, step=step)
    tracker.finish("FINISHED")
    command.downgrade(alembic_config(db), "-1")
    store = folder / "old.db.xz"
    store.write_bytes(lzma.compress(db.read_bytes(), preset=9))
    return store, schema_of(db)


def test_an_older_store_is_upgraded_in_place_with_its_runs_unchanged(tmp_path):
    from alembic.script import ScriptDirectory

    from k3lab.store import runs

    store, older = older_store(tmp_path)
    head = ScriptDirectory.from_config(alembic_config(tmp_path / "x.db")).get_current_head()
    assert older != head
    done = subprocess.run([sys.executable, "scripts/upgrade_stores.py", str(store)], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    with sqlite3.connect(tmp_path / "written.db") as db:
        points = db.execute("SELECT COUNT(*) FROM metrics").fetchone()[0]  # val_loss's and the tracker's own
    assert done.stdout == f"{store}: schema {older} -> {head}; 1 runs and {points} metric points, each unchanged\n"
    opened = tmp_path / "opened.db"
    opened.write_bytes(lzma.decompress(store.read_bytes()))
    assert schema_of(opened) == head
    client = runs.client(f"sqlite:///{opened}")
    (run,) = client.search_runs([client.get_experiment_by_name("old").experiment_id])
    assert run.data.params == {"model.hidden_size": "64"} and run.info.status == "FINISHED"
    assert [m.value for m in client.get_metric_history(run.info.run_id, "val_loss")] == [3.5, 3.25, 3.125]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["old.db.xz", "opened.db", "written.db"]  # no leftovers


def test_a_store_at_the_installed_schema_is_left_as_it_is(tmp_path):
    store, _ = older_store(tmp_path)
    subprocess.run([sys.executable, "scripts/upgrade_stores.py", str(store)], cwd=ROOT, check=True, timeout=300,
                   capture_output=True)
    packed = store.read_bytes()
    done = subprocess.run([sys.executable, "scripts/upgrade_stores.py", str(store)], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.endswith("already\n") and store.read_bytes() == packed
