"""A store whose MLflow schema the installed MLflow does not have, in one line that says what opens it.

MLflow refuses a store written by a newer MLflow (and calls it out of date). Which MLflow wrote
it: the `k3lab.mlflow_version` tag k3lab puts on every run it creates (read from SQLite directly,
as the installed MLflow cannot open the store).
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

MLFLOW_VERSION = "k3lab.mlflow_version"  # on parent and trial runs: the MLflow that created the run


def mlflow_version_tags() -> dict[str, str]:
    import mlflow

    return {MLFLOW_VERSION: mlflow.__version__}


def schema_mismatch(tracking_uri: str, found: str, expected: str) -> str:
    """The one line for a store of schema `found` that the installed MLflow (schema `expected`) refuses."""
    import mlflow
    import mlflow.store.db_migrations

    where = tracking_uri.removeprefix("sqlite:///")
    migrations = Path(mlflow.store.db_migrations.__file__).parent / "versions"
    if any(migrations.glob(f"{found}_*.py")):  # a schema this MLflow migrates from
        return (f"{where}: its MLflow schema ({found}) is older than mlflow {mlflow.__version__}'s ({expected}); "
                f"back it up, then `mlflow db upgrade {tracking_uri}`")
    writer = writer_version(tracking_uri)
    head = f"{where}: written by a newer MLflow than the installed {mlflow.__version__} (schema {found}"
    if writer is None:
        return f"{head}, unknown to it); open it with that MLflow (pip install -U mlflow)"
    return f"{head}, mlflow {writer}'s); open it with that one: pip install 'mlflow=={writer}'"


def writer_version(tracking_uri: str) -> str | None:
    """The newest MLflow version tagged on the runs of a SQLite store; None where there is none to read."""
    if not tracking_uri.startswith("sqlite:///"):
        return None
    path = Path(tracking_uri.removeprefix("sqlite:///"))
    try:
        with sqlite3.connect(f"{path.as_uri()}?mode=ro", uri=True) as db:
            values = [row[0] for row in db.execute("SELECT DISTINCT value FROM tags WHERE key = ?", (MLFLOW_VERSION,))]
    except sqlite3.Error:
        return None
    return max(values, key=version_key, default=None)


def version_key(version: str) -> tuple:
    from packaging.version import InvalidVersion, Version

    try:
        return (1, Version(version))
    except InvalidVersion:
        return (0, version)
