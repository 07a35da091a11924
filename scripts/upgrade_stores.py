"""Compressed stores (`*.db.xz`, as in docs/runs) upgraded in place to the installed MLflow's schema
with MLflow's own migrations (`mlflow db upgrade`), each checked before it replaces its file.

    python scripts/upgrade_stores.py docs/runs/*.db.xz

The check: every table the runs live in (experiments, runs, params, metrics, tags, inputs ...)
has the same rows after the upgrade as before, by count and by a digest of its rows; the metrics'
values sum the same. A store that fails the check, or whose upgrade fails, is left as it was.
"""

from __future__ import annotations

import argparse
import hashlib
import lzma
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
from pathlib import Path

from downgrade_store import copy_store, installed_head, schema_of

# the tables a run's record is in; a migration may add tables and columns, but must keep these rows
RUN_TABLES = ("experiments", "experiment_tags", "runs", "params", "metrics", "latest_metrics", "tags",
              "datasets", "inputs", "input_tags")


def rows_of(db: sqlite3.Connection, table: str, columns: tuple[str, ...]) -> tuple[int, str]:
    """(count, digest) of a table's rows, read on `columns` in their order."""
    listed = ", ".join(columns)
    rows = db.execute(f"SELECT {listed} FROM {table} ORDER BY {listed}").fetchall()
    return len(rows), hashlib.sha256(repr(rows).encode()).hexdigest()


def metric_total(db: sqlite3.Connection) -> float:
    return db.execute("SELECT TOTAL(value) FROM metrics").fetchone()[0]


def contents(path: Path) -> tuple[dict[str, tuple], float | None]:
    """{table: (its columns, (count, digest))} for the run tables the store has, and the metrics' sum."""
    found = {}
    with sqlite3.connect(path) as db:
        tables = {name for (name,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        for table in (t for t in RUN_TABLES if t in tables):
            columns = tuple(row[1] for row in db.execute(f"PRAGMA table_info({table})"))
            found[table] = (columns, rows_of(db, table, columns))
        return found, metric_total(db) if "metrics" in found else None


def changed(path: Path, tables: dict[str, tuple], total: float | None) -> list[str]:
    """What differs from `contents` before, each table read on the columns it had then (a migration may add some)."""
    with sqlite3.connect(path) as db:
        differ = [table for table, (columns, counted) in tables.items() if rows_of(db, table, columns) != counted]
        if total is not None and metric_total(db) != total:
            differ.append("metric values")
    return differ


def upgrade(store: Path, head: str) -> str:
    """Upgrade one `*.db.xz` in place; returns what was done, in a line."""
    with tempfile.TemporaryDirectory(dir=store.parent) as folder:
        db = Path(folder) / "mlflow.db"
        copy_store(store, db)
        found = schema_of(db)
        if found == head:
            return f"{store}: schema {head} already"
        tables, total = contents(db)
        done = subprocess.run([sys.executable, "-m", "mlflow", "db", "upgrade", f"sqlite:///{db}"],
                              capture_output=True, text=True)
        if done.returncode != 0:
            raise SystemExit(f"{store}: mlflow db upgrade failed, the file is left as it was:\n{done.stderr[-2000:]}")
        if differ := changed(db, tables, total):
            raise SystemExit(f"{store}: the upgrade changed {', '.join(differ)}; the file is left as it was")
        packed = Path(folder) / store.name
        with open(db, "rb") as source, lzma.open(packed, "wb", preset=9) as target:
            shutil.copyfileobj(source, target)
        os.replace(packed, store)
    runs, metrics = (tables[t][1][0] if t in tables else 0 for t in ("runs", "metrics"))
    return f"{store}: schema {found} -> {head}; {runs} runs and {metrics} metric points, each unchanged"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("stores", type=Path, nargs="+", help="*.db.xz files")
    args = parser.parse_args(argv)
    if bad := [str(s) for s in args.stores if not s.name.endswith(".db.xz") or not s.is_file()]:
        parser.error(f"not a *.db.xz file: {', '.join(bad)}")
    head = installed_head()
    for store in args.stores:
        print(upgrade(store, head), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
