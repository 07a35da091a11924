"""scripts/downgrade_store.py: a store of a newer MLflow's schema, walked down with that MLflow's own
migrations (a wheel), opens with this install and keeps its runs."""

import importlib.util
import shutil
import sqlite3
import zipfile
from pathlib import Path

import mlflow.store.db_migrations
import pytest

from k3lab.errors import UserError
from k3lab.store import runs
from k3lab.store.tracking import MLflowTracker

ROOT = Path(__file__).resolve().parents[1]
NEWER = '''
import sqlalchemy as sa
from alembic import op

revision = "0a1b2c3d4e5f"
down_revision = "{head}"
branch_labels = None
depends_on = None


def upgrade():
    op.create_table("newer_feature", sa.Column("id", sa.Integer, primary_key=True))


def downgrade():
    op.drop_table("newer_feature")
'''


def script():
    spec = importlib.util.spec_from_file_location("downgrade_store", ROOT / "scripts/downgrade_store.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def newer_wheel(tmp_path: Path, head: str) -> Path:
    """A wheel whose migrations are this MLflow's and one more (a table a newer MLflow adds)."""
    wheel = tmp_path / "mlflow_skinny-99.0.0-py3-none-any.whl"
    source = Path(mlflow.store.db_migrations.__file__).parent
    with zipfile.ZipFile(wheel, "w") as archive:
        for path in source.rglob("*"):
            if path.is_file() and "__pycache__" not in path.parts:
                archive.write(path, f"mlflow/store/db_migrations/{path.relative_to(source)}")
        archive.writestr("mlflow/store/db_migrations/versions/0a1b2c3d4e5f_newer_feature.py", NEWER.format(head=head))
    return wheel


def test_a_store_from_a_newer_mlflow_is_walked_down_with_its_own_migrations(tmp_path):
    from alembic import command
    from alembic.config import Config

    downgrade_store = script()
    head = downgrade_store.installed_head()
    store = tmp_path / "gpu.db"
    tracker = MLflowTracker.start(f"sqlite:///{store}", "sweep", "trial")
    tracker.log_metrics({"val_loss": 3.25}, step=7)
    tracker.finish("FINISHED")
    wheel = newer_wheel(tmp_path, head)
    with zipfile.ZipFile(wheel) as archive:  # the newer MLflow writes its schema into the store
        archive.extractall(tmp_path / "newer")
    config = Config()
    config.set_main_option("script_location", str(tmp_path / "newer/mlflow/store/db_migrations"))
    config.set_main_option("sqlalchemy.url", f"sqlite:///{store}")
    command.upgrade(config, "0a1b2c3d4e5f")
    store = Path(shutil.copy(store, tmp_path / "from-the-gpu.db"))  # a new URI: MLflow keeps a store per URI
    with pytest.raises(UserError, match="written by a newer MLflow"):
        runs.client(f"sqlite:///{store}")
    out = tmp_path / "laptop.db"
    assert downgrade_store.main([str(store), str(out), "--wheel", str(wheel)]) == 0
    with sqlite3.connect(store) as db:  # the store itself is left as it was
        assert db.execute("SELECT version_num FROM alembic_version").fetchone()[0] == "0a1b2c3d4e5f"
    client = runs.client(f"sqlite:///{out}")
    (run,) = client.search_runs([client.get_experiment_by_name("sweep").experiment_id])
    assert run.data.metrics["val_loss"] == 3.25
