"""A copy of a SQLite store written by a newer MLflow, downgraded to the installed MLflow's schema with
the newer MLflow's own migration scripts (their `downgrade()`s), so this install opens it.

    python scripts/downgrade_store.py STORE.db[.xz] OUT.db --wheel mlflow_skinny-X.Y.Z-py3-none-any.whl

STORE is left as it is. The wheel (mlflow or mlflow-skinny of the version that wrote the store:
`pip download --no-deps mlflow-skinny==X`) carries the migrations this install lacks; alembic walks
them down to the installed MLflow's head. What those migrations added (tables of features this
MLflow does not have) is dropped from the copy; runs, params, metrics and tags stay.
"""

from __future__ import annotations

import argparse
import lzma
import shutil
import sqlite3
import sys
import tempfile
import zipfile
from pathlib import Path

MIGRATIONS = "mlflow/store/db_migrations/"


def installed_head() -> str:
    from alembic.script import ScriptDirectory
    from mlflow.store.db.utils import _get_alembic_config

    return ScriptDirectory.from_config(_get_alembic_config("sqlite://")).get_current_head()


def schema_of(path: Path) -> str:
    """The store's MLflow schema: its alembic revision."""
    with sqlite3.connect(path) as db:
        return db.execute("SELECT version_num FROM alembic_version").fetchone()[0]


def copy_store(store: Path, out: Path) -> None:
    if store.name.endswith(".xz"):
        with lzma.open(store) as source, open(out, "wb") as target:
            shutil.copyfileobj(source, target)
    else:
        shutil.copyfile(store, out)


def downgrade(out: Path, wheel: Path, head: str) -> str:
    """Walk `out`'s schema down to `head` with the wheel's migrations; returns the schema it had."""
    from alembic import command
    from alembic.config import Config

    found = schema_of(out)
    with tempfile.TemporaryDirectory() as folder, zipfile.ZipFile(wheel) as archive:
        members = [m for m in archive.namelist() if m.startswith(MIGRATIONS)]
        if not members:
            sys.exit(f"{wheel}: holds no {MIGRATIONS} (an mlflow or mlflow-skinny wheel)")
        archive.extractall(folder, members)
        config = Config()
        config.set_main_option("script_location", str(Path(folder) / MIGRATIONS))
        config.set_main_option("sqlalchemy.url", f"sqlite:///{out}")
        command.downgrade(config, head)
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("store", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--wheel", type=Path, required=True, help="the MLflow wheel of the version that wrote it")
    args = parser.parse_args(argv)
    if args.out.exists():
        sys.exit(f"{args.out}: exists; name a new file")
    head = installed_head()
    copy_store(args.store, args.out)
    try:
        found = downgrade(args.out, args.wheel, head)
    except BaseException:
        args.out.unlink(missing_ok=True)
        raise
    print(f"{args.out}: schema {found} -> {head} (the installed MLflow's)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
