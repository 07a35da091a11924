"""Experiment tracking: MLflow runs fed in batches, and an in-memory tracker for tests.

The training loop calls `log_metrics(values, step)` every step; the MLflow tracker
buffers those values and sends them with `log_batch` (at most 1000 metrics a call)
every `flush_every` steps, so tracking never costs a network round trip per value.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import time
from pathlib import Path
from typing import Any, Protocol

from k3lab.errors import UserError
from k3lab.store.metrics import diagnostic_metrics, diagnostic_tables, with_page_sections
from k3lab.store.runs import EXPERIMENT_KIND, MODEL_TRAINING, client, flatten  # noqa: F401  (flatten: for callers)

MAX_METRICS_PER_BATCH = 1000  # MLflow's limit for one log_batch call
MAX_PARAMS_PER_BATCH = 100
MAX_PARAM_LENGTH = 6000


class Tracker(Protocol):
    run_id: str | None

    def log_params(self, params: dict[str, Any]) -> None: ...
    def log_metrics(self, metrics: dict[str, float], step: int) -> None: ...
    def log_diagnostics(self, diagnostics: dict, step: int, table: bool = False) -> None: ...
    def set_tags(self, tags: dict[str, str]) -> None: ...
    def flush(self) -> None: ...
    def finish(self, status: str) -> None: ...


def default_tracking_uri(root: str | Path | None = None) -> str:
    """MLFLOW_TRACKING_URI if set, else a SQLite file `mlflow.db` in `root` (default: cwd)."""
    if os.environ.get("MLFLOW_TRACKING_URI"):
        return os.environ["MLFLOW_TRACKING_URI"]
    return f"sqlite:///{Path(root or Path.cwd()).resolve() / 'mlflow.db'}"


def sqlite_path(tracking_uri: str | None) -> Path | None:
    """The database file of a local SQLite store (`sqlite:///...`), else None."""
    if tracking_uri and tracking_uri.startswith("sqlite:///"):
        return Path(tracking_uri[len("sqlite:///"):])
    return None


SQLITE_HEADER = b"SQLite format 3\x00"
DATABASE_SCHEMES = ("postgresql", "mysql", "mssql")  # SQLAlchemy URLs MLflow stores runs in (with +driver)


def check_tracking_uri(uri: str, named_by: str) -> None:
    """A one-line UserError for a tracking URI MLflow would fail on later, after a sweep's checks
    passed and Ray had started: a plain path, an unknown scheme, a SQLite URI naming no file, a
    folder or a file that is not a database, a damaged SQLite file, a database whose driver is not installed. Nothing is
    contacted or created; an HTTP server's answer is checked in the preflight. named_by: where the
    URI came from (--tracking-uri, MLFLOW_TRACKING_URI), for the message."""
    scheme = uri.partition(":")[0].lower() if "://" in uri else ""
    where = f"{named_by} {uri}"
    if scheme in ("http", "https", "databricks"):
        return
    if scheme == "sqlite":
        path = sqlite_path(uri)
        if path is None or not str(path):
            raise UserError(f"{where}: names no database file (sqlite:///mlflow.db in this folder, "
                            "sqlite:////absolute/path/mlflow.db)")
        if path.is_dir():
            raise UserError(f"{where}: {path} is a folder, not a database file")
        if path.is_file() and path.stat().st_size and read_header(path) != SQLITE_HEADER:
            raise UserError(f"{where}: {path} is not an SQLite database")
        problem = sqlite_damage(path) if path.is_file() and path.stat().st_size else None
        if problem:
            raise UserError(f"{where}: {path} is not a readable SQLite database ({problem})")
        return
    if scheme.partition("+")[0] in DATABASE_SCHEMES:
        check_database_driver(uri, where)
        return
    hint = f"; for a SQLite file: sqlite:///{Path(uri).resolve()}" if not scheme else ""
    raise UserError(f"{where}: expected an MLflow server (http://host:5000) or a database "
                    f"(sqlite:///mlflow.db, postgresql://user@host/db){hint}")


QUICK_CHECK_MAX_BYTES = 256 << 20  # PRAGMA quick_check reads every page


def sqlite_damage(path: Path) -> str | None:
    """What is wrong with an SQLite file whose header is right (a copy cut short, a damaged page),
    as SQLite says it, or None: MLflow failed on it with a SQLAlchemy traceback. Read-only: the
    file is neither created nor changed. A file shorter than its header's page count is found
    without reading it; the catalogue is read; every page is checked only in a file up to
    QUICK_CHECK_MAX_BYTES. A file SQLite cannot open or lock now is left to MLflow."""
    if truncated(path):
        return "database disk image is malformed: shorter than its header says"
    try:
        with contextlib.closing(sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)) as db:
            db.execute("SELECT name FROM sqlite_master").fetchall()
            if path.stat().st_size <= QUICK_CHECK_MAX_BYTES:
                verdict = db.execute("PRAGMA quick_check(1)").fetchone()[0]
                return None if verdict == "ok" else f"database disk image is malformed: {one_line(verdict)}"
    except sqlite3.OperationalError:  # locked, or not openable read-only (a WAL without its index)
        return None
    except sqlite3.DatabaseError as error:  # malformed, not a database
        return str(error)
    return None


def one_line(verdict: str) -> str:
    """PRAGMA quick_check's first finding on one line ("*** in database main ***" and a page's fault)."""
    return "; ".join(line.strip() for line in verdict.splitlines() if line.strip() and not line.startswith("***"))


def truncated(path: Path) -> bool:
    """The file is shorter than the page count its header gives (where that count is valid: the
    header's change counter matches, and no write-ahead log holds newer pages)."""
    with path.open("rb") as file:
        header = file.read(100)
    if len(header) < 100 or header[24:28] != header[92:96] or Path(f"{path}-wal").exists():
        return False
    page_size = int.from_bytes(header[16:18], "big")
    page_size = 65536 if page_size == 1 else page_size
    return int.from_bytes(header[28:32], "big") * page_size > path.stat().st_size


def read_header(path: Path) -> bytes:
    with path.open("rb") as file:
        return file.read(len(SQLITE_HEADER))


def check_database_driver(uri: str, where: str) -> None:
    """SQLAlchemy builds the engine of a database URL without connecting: that imports its driver."""
    import sqlalchemy
    from sqlalchemy.exc import ArgumentError, NoSuchModuleError

    try:
        sqlalchemy.create_engine(uri).dispose()
    except ImportError as error:
        raise UserError(f"{where}: its database driver is not installed ({error})") from None
    except (ArgumentError, NoSuchModuleError) as error:
        raise UserError(f"{where}: not a database URL SQLAlchemy reads ({error})") from None


def holds_mlflow_runs(path: Path) -> bool:
    """Whether a file is a SQLite database with MLflow's tables, looked at without creating anything
    (MLflow itself would create its tables in an empty or foreign file; a dry run must write
    nothing). Read-only first; a store whose writer was killed mid-transaction (kill -9) has a hot
    journal that only a read-write connection can roll back, so that one is opened read-write
    (`mode=rw` never creates a file, and falls back to read-only where the file is write-protected)."""
    if not path.is_file():
        return False
    for mode in ("ro", "rw"):
        try:
            with contextlib.closing(sqlite3.connect(f"{path.resolve().as_uri()}?mode={mode}", uri=True)) as db:
                tables = {row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
            return {"experiments", "runs", "metrics"} <= tables
        except sqlite3.Error:
            continue
    return False


def artifact_folder_for(tracking_uri: str | None) -> Path | None:
    """Local artifacts beside a local SQLite store (`mlartifacts/`); a server picks its own."""
    database = sqlite_path(tracking_uri)
    return (database.parent / "mlartifacts").resolve() if database else None


def artifact_root_for(tracking_uri: str) -> str | None:
    folder = artifact_folder_for(tracking_uri)
    return folder.as_uri() if folder else None


def relocate_artifacts(tracking_uri: str, experiment: str) -> int:
    """Point a moved SQLite store's artifact locations at the `mlartifacts/` beside it now.

    MLflow stores absolute URIs: the experiment's artifact location and each run's artifact URI.
    After the store (mlflow.db with mlartifacts/) is copied to another folder or machine, they
    still name the old place, and a resumed run would write its artifacts there. MLflow has no
    API to change them, so the two columns are rewritten in the database. Only k3lab's own layout
    (file:.../mlartifacts/<experiment>) is touched. Returns the number of runs moved.
    """
    root = artifact_root_for(tracking_uri)
    if root is None:
        return 0
    found = client(tracking_uri).get_experiment_by_name(experiment)
    old, new = (found.artifact_location if found else None), f"{root}/{experiment}"
    if old is None or old == new or not (old.startswith("file:") and old.endswith(f"/mlartifacts/{experiment}")):
        return 0
    with sqlite3.connect(tracking_uri[len("sqlite:///"):]) as db:
        db.execute("UPDATE experiments SET artifact_location = ? WHERE experiment_id = ?", (new, int(found.experiment_id)))
        moved = db.execute("UPDATE runs SET artifact_uri = ? || substr(artifact_uri, ?) "
                           "WHERE experiment_id = ? AND substr(artifact_uri, 1, ?) = ?",
                           (new, len(old) + 1, int(found.experiment_id), len(old) + 1, old + "/"))
    forget_artifact_locations()
    return moved.rowcount


def forget_artifact_locations() -> None:
    """Drop MLflow's per-process cache of run artifact repositories (private, keyed by run id),
    which would keep the old locations in a process that used the store before it moved."""
    from mlflow.tracking._tracking_service import utils

    getattr(utils, "_artifact_repos_cache", {}).clear()


def get_or_create_experiment(client, name: str, tracking_uri: str) -> str:
    """The experiment's id; a new one is a model-training experiment (`runs.EXPERIMENT_KIND`) with
    its artifacts in the `mlartifacts/` beside a local store."""
    experiment = client.get_experiment_by_name(name)
    if experiment is not None:
        if EXPERIMENT_KIND not in experiment.tags:  # made by a k3lab before the tag
            client.set_experiment_tag(experiment.experiment_id, EXPERIMENT_KIND, MODEL_TRAINING)
        return experiment.experiment_id
    root = artifact_root_for(tracking_uri)
    location = f"{root}/{name}" if root else None
    try:
        return client.create_experiment(name, artifact_location=location, tags={EXPERIMENT_KIND: MODEL_TRAINING})
    except Exception:  # created by a concurrent trial in the meantime
        experiment = client.get_experiment_by_name(name)
        if experiment is None:
            raise
        return experiment.experiment_id


BUILD_PARTS = ("startup_data_s", "startup_model_s", "startup_tracking_s")  # startup_build_s's parts
PER_ATTEMPT = ("startup_s", "startup_build_s", *BUILD_PARTS, "slot_wait_s")  # by every attempt, restored ones too


class MLflowTracker:
    """One MLflow run. Metrics are buffered and sent in batches."""

    def __init__(self, tracking_uri: str, run_id: str, flush_every: int | None = 50):
        self.client = client(tracking_uri)
        self.tracking_uri, self.run_id, self.flush_every = tracking_uri, run_id, flush_every
        self._pending: list = []
        self._steps_since_flush = 0
        self._logged_through, self._logged_keys = -1, frozenset()  # see skip_steps_already_logged
        self.seconds_in_tracking = 0.0  # wall time spent inside this tracker, for overhead figures

    @classmethod
    def start(cls, tracking_uri: str, experiment: str, run_name: str, tags: dict[str, str] | None = None,
              parent_run_id: str | None = None, flush_every: int | None = 50) -> "MLflowTracker":
        """Open a new run (nested under `parent_run_id` when given)."""
        mlflow = client(tracking_uri)
        experiment_id = get_or_create_experiment(mlflow, experiment, tracking_uri)
        tags = dict(tags or {})
        if parent_run_id:
            tags["mlflow.parentRunId"] = parent_run_id
        run = mlflow.create_run(experiment_id, run_name=run_name, tags=tags)
        return cls(tracking_uri, run.info.run_id, flush_every)

    def log_params(self, params: dict[str, Any]) -> None:
        from mlflow.entities import Param

        start = time.perf_counter()
        items = [Param(k, str(v)[:MAX_PARAM_LENGTH]) for k, v in params.items()]
        existing = self.client.get_run(self.run_id).data.params
        items = [p for p in items if p.key not in existing]  # a resumed run re-logs nothing
        for i in range(0, len(items), MAX_PARAMS_PER_BATCH):
            self.client.log_batch(self.run_id, params=items[i:i + MAX_PARAMS_PER_BATCH])
        self.seconds_in_tracking += time.perf_counter() - start

    def skip_steps_already_logged(self) -> None:
        """For a reopened run: do not send again what it has up to its last training step.

        A trial sends its metrics just before each checkpointed report; when it crashes in
        between, it is restored from the checkpoint before and trains those steps again."""
        keys = frozenset(self.client.get_run(self.run_id).data.metrics)
        if "train_loss" in keys:
            history = self.client.get_metric_history(self.run_id, "train_loss")
            self._logged_through, self._logged_keys = max(m.step for m in history), keys

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        from mlflow.entities import Metric

        start = time.perf_counter()
        now = int(time.time() * 1000)
        metrics = with_page_sections(metrics)
        if step <= self._logged_through:  # keys the run never had (final figures) and each attempt's start-up still go
            metrics = {k: v for k, v in metrics.items() if k not in self._logged_keys or k in PER_ATTEMPT}
        self._pending.extend(Metric(k, float(v), now, step) for k, v in metrics.items())
        self._steps_since_flush += 1
        self.seconds_in_tracking += time.perf_counter() - start
        if self.flush_every is not None and self._steps_since_flush >= self.flush_every:
            self.flush()

    def log_diagnostics(self, diagnostics: dict, step: int, table: bool = False) -> None:
        """A window's per-layer diagnostics as `probe/...` metrics (`k3lab.store.metrics`), sent with
        the step's metrics; with `table`, in full as table artifacts, now."""
        from mlflow.entities import Metric

        start = time.perf_counter()
        metrics = diagnostic_metrics(diagnostics)
        if step <= self._logged_through:
            metrics = {k: v for k, v in metrics.items() if k not in self._logged_keys}
        now = int(time.time() * 1000)
        self._pending.extend(Metric(k, float(v), now, step) for k, v in metrics.items())
        for artifact, content in (diagnostic_tables(diagnostics, step) if table else {}).items():
            self.client.log_dict(self.run_id, content, artifact)
        self.seconds_in_tracking += time.perf_counter() - start

    def set_tags(self, tags: dict[str, str]) -> None:
        for key, value in tags.items():
            self.client.set_tag(self.run_id, key, str(value))

    def log_artifact(self, path: str | Path, artifact_path: str | None = None) -> None:
        self.client.log_artifact(self.run_id, str(path), artifact_path)

    def flush(self) -> None:
        start = time.perf_counter()
        pending, self._pending, self._steps_since_flush = self._pending, [], 0
        for i in range(0, len(pending), MAX_METRICS_PER_BATCH):
            self.client.log_batch(self.run_id, metrics=pending[i:i + MAX_METRICS_PER_BATCH])
        self.seconds_in_tracking += time.perf_counter() - start

    def discard_pending(self) -> int:
        """Drop metrics not yet sent (those a restored trial will log again); returns how many."""
        dropped, self._pending, self._steps_since_flush = len(self._pending), [], 0
        return dropped

    def finish(self, status: str) -> None:
        """Flush and close the run; status FINISHED, FAILED or KILLED."""
        self.flush()
        self.client.set_terminated(self.run_id, status)
