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


def read_state(path: Path, again: str = "k3lab sweep FILE --overwrite") -> dict:
    """The state file's contents: parent_run_id, tracking_uri, trials and spec (the last two absent
    in old files). A damaged file (a kill while it was written, an edit) is refused in one line
    (`state_problem`), naming `again`, the command that starts its sweep again: its readers would
    fail on it with a traceback, some only after Ray started."""
    try:
        state = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError) as error:
        raise UserError(not_a_state_file(path, getattr(error, "strerror", None) or str(error), again)) from None
    except json.JSONDecodeError as error:
        raise UserError(not_a_state_file(path, f"not JSON: {error}", again)) from None
    problem = state_problem(state)
    if problem:
        raise UserError(not_a_state_file(path, problem, again))
    return state


def not_a_state_file(path: Path, problem: str, again: str) -> str:
    """The error for a damaged state file; `again` is the command that starts its sweep again (`k3lab.hints`)."""
    return f"{path}: not a k3lab sweep state file ({problem}); `{again}` starts the sweep again"


def state_problem(state) -> str | None:
    """What is wrong with a state file's parsed JSON, or None: the keys its readers use, of their types."""
    if not isinstance(state, dict):
        return f"a JSON {type(state).__name__}, not an object"
    if not isinstance(state.get("parent_run_id"), str) or not state["parent_run_id"]:
        return "no parent_run_id" if "parent_run_id" not in state else "parent_run_id is not a run id"
    if not isinstance(state.get("tracking_uri", ""), str):
        return "tracking_uri is not a string"
    trials = state.get("trials", [])
    if not isinstance(trials, list) or not all(isinstance(t, str) for t in trials):
        return "trials is not a list of trial ids"
    if not isinstance(state.get("spec", {}), dict):
        return "spec is not an object"
    return None


def check_parent_run(path: Path, tracking_uri: str, again: str = "k3lab sweep FILE --overwrite") -> str:
    """The parent run id of the state file at `path`, once found in the tracking store `tracking_uri`;
    else one line naming the store the sweep logged to (another --tracking-uri, a store deleted or
    emptied). A SQLite store whose file does not exist or holds no MLflow tables (a 0-byte file) holds
    no run: it is not opened, which would create it or its tables."""
    from mlflow.exceptions import MlflowException

    from k3lab.store.runs import get_run
    from k3lab.store.tracking import holds_mlflow_runs, sqlite_path

    state = read_state(path, again)
    parent_run_id, logged_to = state["parent_run_id"], state.get("tracking_uri")
    missing = UserError(f"{path}: its parent run {parent_run_id} is not in {tracking_uri}"
                        + (f" (the sweep logged to {logged_to})" if logged_to else ""))
    store = sqlite_path(tracking_uri)
    if store is not None and not holds_mlflow_runs(store):
        raise missing
    try:
        get_run(tracking_uri, parent_run_id)
    except MlflowException:  # "Run with id=... not found"
        raise missing from None
    return parent_run_id


def write_state(path: Path, parent_run_id: str, tracking_uri: str, trials: list[str], spec: dict | None = None) -> None:
    """The state file of a sweep's first run; `spec` is `sweep_spec` of its sweep."""
    path.parent.mkdir(parents=True, exist_ok=True)
    state = {"parent_run_id": parent_run_id, "tracking_uri": tracking_uri, "trials": trials}
    if spec is not None:
        state["spec"] = spec
    path.write_text(json.dumps(state))


def sweep_spec(sweep) -> dict:
    """What shapes the trials' results besides their ids (variant and seed): the train section and the
    metric, and what the comparisons' design depends on (the seeds policy: start, max, until,
    confidence; the baselines), as JSON would give them back, so that `--resume` can refuse a changed
    one (a resumed sweep would otherwise mix trials of two settings in one report, or end its
    seeds under another design than the one stored with its parent run, which every view reads)."""
    policy = attrs.asdict(sweep.seed_policy) if sweep.seed_policy is not None else None
    return json.loads(json.dumps({"train": attrs.asdict(sweep.train), "metric": attrs.asdict(sweep.metric),
                                  "seeds": policy, "baselines": dict(sweep.baselines)}))


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
