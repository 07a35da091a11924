"""A store whose schema the installed MLflow does not have is one line that names the file and
says what opens it (k3lab.store.runs.client), not MLflow's traceback."""

import shutil
import sqlite3
from pathlib import Path

import pytest

from k3lab.cli import main
from k3lab.errors import UserError
from k3lab.store import runs, schema

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def written(tmp_path_factory) -> Path:
    """A store the installed MLflow wrote: one experiment, one run."""
    from k3lab.store.tracking import MLflowTracker

    path = tmp_path_factory.mktemp("schema") / "written.db"
    MLflowTracker.start(f"sqlite:///{path}", "x", "run").finish("FINISHED")
    return path


def with_schema(written: Path, folder: Path, revision: str) -> str:
    """A copy of the store (a new path: MLflow keeps a store per URI) that says it has this schema."""
    path = folder / "mlflow.db"
    shutil.copy(written, path)
    with sqlite3.connect(path) as db:
        db.execute("UPDATE alembic_version SET version_num = ?", (revision,))
    return f"sqlite:///{path}"


def test_a_store_from_a_newer_mlflow_is_one_line_saying_so(written, tmp_path):
    uri = with_schema(written, tmp_path, "0123456789ab")
    with pytest.raises(UserError, match=rf"^{tmp_path}/mlflow.db: written by a newer MLflow than the installed "
                                        r"[\d.]+ \(schema 0123456789ab, unknown to it\); open it with that MLflow"):
        runs.client(uri)


def test_a_store_tagged_by_a_newer_mlflow_says_which_version_to_install(written, tmp_path):
    uri = with_schema(written, tmp_path, "0123456789ab")
    with sqlite3.connect(tmp_path / "mlflow.db") as db:
        run = db.execute("SELECT run_uuid FROM runs").fetchone()[0]
        db.executemany("INSERT INTO tags (key, value, run_uuid) VALUES (?, ?, ?)",
                       [(schema.MLFLOW_VERSION, "3.99.1", run), ("other", "4.0.0", run)])
    with pytest.raises(UserError) as error:
        runs.client(uri)
    assert str(error.value).endswith("(schema 0123456789ab, mlflow 3.99.1's); open it with that one: "
                                     "pip install 'mlflow==3.99.1'")


def test_every_run_k3lab_creates_names_the_mlflow_that_wrote_it():
    import mlflow

    for tags in (runs.trial_tags("id", "v", 0), runs.sweep_tags("s", None, "0.1", "abc", "", "k3lab sweep", None)):
        assert tags[schema.MLFLOW_VERSION] == mlflow.__version__


def test_a_store_from_an_older_mlflow_says_how_to_upgrade_it(written, tmp_path):
    import mlflow.store.db_migrations

    first = sorted((Path(mlflow.store.db_migrations.__file__).parent / "versions").glob("*_*.py"))[0]
    revision = first.name.split("_")[0]
    uri = with_schema(written, tmp_path, revision)
    with pytest.raises(UserError, match=rf"its MLflow schema \({revision}\) is older than mlflow [\d.]+'s .*; "
                                        rf"back it up, then `mlflow db upgrade {uri}`"):
        runs.client(uri)


def test_a_report_on_a_store_from_a_newer_mlflow_exits_2_with_one_line(written, tmp_path, capsys):
    uri = with_schema(written, tmp_path, "0123456789ab")
    code = main(["report", str(ROOT / "experiments/attnres_block.yaml"), "--profile", "cpu", "--tracking-uri", uri])
    err = capsys.readouterr().err
    assert code == 2 and "written by a newer MLflow" in err and len(err.strip().splitlines()) == 1


def test_a_report_on_a_store_that_does_not_exist_creates_nothing(tmp_path, capsys):
    missing = tmp_path / "elsewhere" / "mlflow.db"
    code = main(["report", str(ROOT / "experiments/attnres_block.yaml"), "--profile", "cpu",
                 "--storage", str(tmp_path / "runs"), "--tracking-uri", f"sqlite:///{missing}"])
    err = capsys.readouterr().err
    assert code == 2 and f"no store at {missing}" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "elsewhere").exists()


def test_a_store_whose_writer_was_killed_mid_transaction_still_holds_its_runs(tmp_path):
    """kill -9 of a sweep while it wrote to its SQLite store leaves a hot journal, which a read-only
    connection cannot roll back ('attempt to write a readonly database'): `sweep --resume` then said
    the sweep's parent run was not in its store."""
    import os
    import subprocess
    import sys

    from k3lab.store.tracking import holds_mlflow_runs

    path = tmp_path / "mlflow.db"
    with sqlite3.connect(path) as db:
        for table in ("experiments", "runs", "metrics"):
            db.execute(f"CREATE TABLE {table} (x)")
        db.executemany("INSERT INTO metrics VALUES (?)", [(i,) for i in range(20000)])
    writer = ("import os, signal, sqlite3\n"
              f"db = sqlite3.connect({str(path)!r}, isolation_level=None)\n"
              "db.execute('PRAGMA cache_size=1'); db.execute('BEGIN IMMEDIATE')\n"
              "db.execute('UPDATE metrics SET x = x + 1')  # spills pages into the file: the journal is hot\n"
              "os.kill(os.getpid(), signal.SIGKILL)\n")
    subprocess.run([sys.executable, "-c", writer], check=False)
    assert (tmp_path / "mlflow.db-journal").stat().st_size > 0
    with pytest.raises(sqlite3.OperationalError, match="readonly"):
        sqlite3.connect(f"{path.as_uri()}?mode=ro", uri=True).execute("SELECT name FROM sqlite_master").fetchall()
    assert holds_mlflow_runs(path)
    assert not os.path.exists(tmp_path / "mlflow.db-journal") or (tmp_path / "mlflow.db-journal").stat().st_size == 0
