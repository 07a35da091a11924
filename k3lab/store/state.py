"""Where a sweep's records are found: the storage folder, the tracking store, and the state file.

    <storage>/<experiment>.k3lab.json   {"parent_run_id", "tracking_uri", "trials": [trial ids]}

written by a sweep's first run; `--resume` reopens that parent run and checks that the sweep
file still describes the same trials, and `k3lab report` finds the parent run through it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from k3lab.errors import UserError
from k3lab.store.tracking import check_tracking_uri, default_tracking_uri


def default_storage() -> Path:
    """K3LAB_STORAGE, else ./k3lab_runs. A blank K3LAB_STORAGE is an error: it would put a sweep's
    folders into the current folder (or one named by spaces), as `--storage ''` would."""
    value = os.environ.get("K3LAB_STORAGE")
    if value is None:
        return Path("k3lab_runs")
    if not value.strip():
        raise UserError(f"K3LAB_STORAGE={value!r}: names no folder (unset it for ./k3lab_runs)")
    return Path(value)


def tracking_uri_or_default(uri: str | None) -> str:
    """--tracking-uri's value, else MLFLOW_TRACKING_URI, else ./mlflow.db; checked for what MLflow
    cannot use (`check_tracking_uri`)."""
    named_by = "--tracking-uri" if uri else "MLFLOW_TRACKING_URI"
    uri = uri or default_tracking_uri()
    check_tracking_uri(uri, named_by)
    return uri


def state_file(storage: Path, experiment: str) -> Path:
    return storage / f"{experiment}.k3lab.json"


def read_state(path: Path) -> dict:
    """The state file's contents: parent_run_id, tracking_uri, trials (absent in old files)."""
    return json.loads(path.read_text())


def write_state(path: Path, parent_run_id: str, tracking_uri: str, trials: list[str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"parent_run_id": parent_run_id, "tracking_uri": tracking_uri, "trials": trials}))
