"""Where a sweep's records are found: the storage folder, the tracking store, and the state file.

    <storage>/<experiment>.k3lab.json   {"parent_run_id", "tracking_uri", "trials": [trial ids],
                                         "spec": {"train": {...}, "metric": {...}}}

written by a sweep's first run; `--resume` reopens that parent run and checks that the sweep
file still describes the same trials, trained and measured alike (`spec`), and `k3lab report`
finds the parent run through it. Files of older versions lack `trials` or `spec`.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import attrs

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
    """The state file's contents: parent_run_id, tracking_uri, trials and spec (the last two absent in old files)."""
    return json.loads(path.read_text())


def write_state(path: Path, parent_run_id: str, tracking_uri: str, trials: list[str], spec: dict | None = None) -> None:
    """The state file of a sweep's first run; `spec` is `sweep_spec` of its sweep."""
    path.parent.mkdir(parents=True, exist_ok=True)
    state = {"parent_run_id": parent_run_id, "tracking_uri": tracking_uri, "trials": trials}
    if spec is not None:
        state["spec"] = spec
    path.write_text(json.dumps(state))


def sweep_spec(sweep) -> dict:
    """What shapes the trials' results besides their ids (variant and seed): the train section and the
    metric, as JSON would give them back, so that `--resume` can refuse a changed one
    (a resumed sweep would otherwise mix trials of two settings in one report)."""
    return json.loads(json.dumps({"train": attrs.asdict(sweep.train), "metric": attrs.asdict(sweep.metric)}))


def first_difference(old, new, where: str = ""):
    """The first field that differs between two JSON values, as (dotted name, old, new), or None.
    A field that `old` lacks (one added to k3lab since its run) is not compared: that run knew no other value."""
    if isinstance(old, dict) and isinstance(new, dict):
        for key in old:
            found = first_difference(old.get(key), new.get(key), f"{where}.{key}" if where else key)
            if found:
                return found
        return None
    return None if old == new else (where, old, new)
