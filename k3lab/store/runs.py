"""The MLflow record layout of k3lab: which runs there are, how they are tagged, how they are found.

    experiment <sweep>[-<profile>]
      parent run   k3lab.kind=sweep: the sweep file, its params, sweep_* metrics, the report
        trial runs k3lab.kind=trial, nested (mlflow.parentRunId), one per variant x seed:
                   k3lab.variant_id, k3lab.variant_name, k3lab.seed, k3lab.axes (the axes its
                   variant sets; each value one param: `axis_value`), where and how it ran

Every tag name and every search query of the store is written here, once; the rest of k3lab
asks these functions. A trial's checkpoints and its Ray reports name its run under RUN_ID_KEY,
so a restored trial reopens the same run.
"""

from __future__ import annotations

import json
import os
import re
import socket
import sys
import time
from pathlib import Path
from typing import Any, Sequence

from k3lab.errors import UserError
from k3lab.store.labels import FULL_NAME, LABEL, trial_run_name
from k3lab.store.schema import mlflow_version_tags, schema_mismatch

RUN_ID_KEY = "mlflow_run_id"  # in a trial's checkpoint extras and in each of its Ray reports

PARENT = "mlflow.parentRunId"
NOTE = "mlflow.note.content"  # a run's (or an experiment's) description in the MLflow UI, markdown
RUN_COLOR = "mlflow.runColor"  # the run's colour in the MLflow UI's tables and charts
# The experiment's kind: MLflow's web app knows custom_model_development (model training: the
# Runs tab) and genai_development (traces). The 3.18 UI picks its view from a global
# "GenAI / Model training" switch and ignores this tag (see `k3lab.commands.ui`).
EXPERIMENT_KIND, MODEL_TRAINING = "mlflow.experimentKind", "custom_model_development"
KIND = "k3lab.kind"  # "sweep" (a parent run) or "trial"
DESCRIPTION = "k3lab.description"  # on the parent run: the sweep file's description
VARIANT_ID, VARIANT_NAME, SEED = "k3lab.variant_id", "k3lab.variant_name", "k3lab.seed"
AXES = "k3lab.axes"  # on a trial run: the axes its variant sets, a JSON list (their values: `axis_value`)
ERROR = "k3lab.error"  # the first line of what stopped a trial
STOPPED_AT = "k3lab.stopped_at_step"  # a trial the scheduler (or a signal) stopped
CRASHES, LAST_CRASH = "k3lab.crashes", "k3lab.last_crash"  # a trial's crashes Tune restarted from a checkpoint
OOM_RESTARTS = "k3lab.restarts_oom"  # its restarts after running out of GPU memory (not crashes: no budget used)
CRASHED, OOM = "crashed", "out of memory"  # the causes of a restart
DEVICE, HOST = "k3lab.device", "k3lab.host"
COMMAND, RESUMED_WITH = "k3lab.command", "k3lab.resumed_with"  # on the parent run: how it was run
DRIVER = "k3lab.driver"  # on the parent run: host:pid of the process running the sweep (the last one)
# on the parent run: "mps", "each node's own: why" or "time-slicing: why" (k3lab.runner.runtime.mps)
GPU_SHARING = "k3lab.gpu_sharing"
STATUS = "k3lab.status"  # on the parent: running, finished, failed, killed, stopped (resumable), interrupted
INTERRUPTED = "interrupted"
STOPPED = "stopped"  # Ctrl-C, SIGTERM or --stop-after: its state saved, `--resume` continues it (FINISHED in MLflow)
RAN = "k3lab.ran"  # on the parent: what ran of the plan, one line (`ran_line`)
RESUME_COMMAND, CLOSE_COMMAND = "k3lab.resume_command", "k3lab.close_command"  # as the sweep printed them
MAX_TAG = 5000  # characters kept of an error message
# on the parent run: how its variants are compared (metric, baselines, statistical design), as JSON;
# where it exceeds MLflow's tag limit, the artifact DESIGN_FILE holds it and the tag says so
DESIGN, DESIGN_FILE, DESIGN_TAG_LIMIT = "k3lab.design", "design.json", 8000

MAX_RUNS = 10000  # of one sweep, in one search


def client(tracking_uri: str):
    """MLflow's client for the store. A store whose schema the installed MLflow does not have is
    one line (`k3lab.store.schema`): MLflow's own message calls even a store written by a newer
    MLflow out of date, and its `mlflow db upgrade` would not open that one."""
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    quiet_alembic()
    try:
        return MlflowClient(tracking_uri)
    except MlflowException as error:
        found = re.search(r"found version (\w+), but expected (\w+)", str(error))
        if found is None:
            raise
        raise UserError(schema_mismatch(tracking_uri, *found.groups())) from None


def quiet_alembic() -> None:
    """alembic's INFO lines (each store opened) at WARNING, as MLflow sets them itself from 3.1x on."""
    import logging

    alembic = logging.getLogger("alembic")
    alembic.setLevel(max(alembic.level, logging.WARNING))


def get_run(tracking_uri: str, run_id: str):
    """The MLflow run (info, data.params, data.metrics, data.tags)."""
    return client(tracking_uri).get_run(run_id)


# -- finding runs -------------------------------------------------------------------------


def trial_runs(tracking_uri: str, parent_run_id: str, running_only: bool = False) -> list:
    """The trial runs nested under a sweep's parent run (only those still RUNNING, if asked)."""
    mlflow = client(tracking_uri)
    experiment = mlflow.get_run(parent_run_id).info.experiment_id
    query = f"tags.{PARENT} = '{parent_run_id}'" + (" and attributes.status = 'RUNNING'" if running_only else "")
    return mlflow.search_runs([experiment], query, max_results=MAX_RUNS)


def find_trial_run(tracking_uri: str, parent_run_id: str, variant_id: str, seed: int) -> str | None:
    """The run of one variant and seed under the parent run, if an earlier attempt created one."""
    mlflow = client(tracking_uri)
    experiment = mlflow.get_run(parent_run_id).info.experiment_id
    query = (f"tags.{PARENT} = '{parent_run_id}' and tags.`{VARIANT_ID}` = '{variant_id}' "
             f"and tags.`{SEED}` = '{seed}'")
    runs = mlflow.search_runs([experiment], query, max_results=1)
    return runs[0].info.run_id if runs else None


def latest_sweep_run(tracking_uri: str, experiment: str) -> str | None:
    """The newest parent run of an experiment (a store copied without its state file)."""
    mlflow = client(tracking_uri)
    found = mlflow.get_experiment_by_name(experiment)
    runs = [] if found is None else mlflow.search_runs(
        [found.experiment_id], f"tags.`{KIND}` = 'sweep'", order_by=["attributes.start_time DESC"], max_results=1)
    return runs[0].info.run_id if runs else None


def variant_of(run) -> str:
    return run.data.tags.get(VARIANT_NAME, run.info.run_name)


def seed_of(run) -> int:
    return int(run.data.tags.get(SEED, 0))


# -- tags ---------------------------------------------------------------------------------


def sweep_tags(name: str, profile: str | None, version: str, commit: str, description: str, command: str,
               baseline: str | None) -> dict[str, str]:
    """A new parent run's tags."""
    return {KIND: "sweep", "k3lab.sweep": name, "k3lab.profile": profile or "", "k3lab.version": version,
            "git_commit": commit, NOTE: description or "", DESCRIPTION: description or "", COMMAND: command,
            "k3lab.baseline": baseline} | reopen_tags() | mlflow_version_tags()


def trial_tags(variant_id: str, variant_name: str, seed: int, colour: str | None = None,
               axes: Sequence[str] | None = None, label: str | None = None,
               group: str | None = None) -> dict[str, str]:
    """A new trial run's tags (with `node_tags` and `execution_tags`); `colour`: the variant's
    (`k3lab.store.colours`), so every seed of a variant has one colour in the MLflow UI; `axes`:
    the names of the axes its variant sets (their values are params: `axis_value`); `label`, `group`:
    the variant's run label and group label among its siblings (`k3lab.store.labels`; default its name)."""
    tags = {VARIANT_ID: variant_id, VARIANT_NAME: variant_name, SEED: str(seed), KIND: "trial",
            LABEL: group or label or variant_name}
    tags |= {FULL_NAME: trial_run_name(variant_name, seed)} if label and label != variant_name else {}
    tags |= {AXES: json.dumps(list(axes))} if axes is not None else {}
    return tags | mlflow_version_tags() | ({RUN_COLOR: colour} if colour else {})


def driver_tags() -> dict[str, str]:
    """The process that runs (or resumes) a sweep, on its parent run: `sweep_state` tells from it
    whether a RUNNING parent still has a driver."""
    return {DRIVER: f"{socket.gethostname()}:{os.getpid()}"}


def node_tags() -> dict[str, str]:
    """Where a trial runs: k3lab.host, k3lab.process (host:pid; trials of a sweep with
    `resources.reuse_actors` share processes) and k3lab.node (the Ray node id) inside a Ray worker."""
    tags = {HOST: socket.gethostname(), "k3lab.process": f"{socket.gethostname()}:{os.getpid()}"}
    ray = sys.modules.get("ray")  # never imported outside Ray: no Ray node to name
    try:
        if ray is not None and ray.is_initialized():
            tags["k3lab.node"] = ray.get_runtime_context().get_node_id()
    except Exception:  # a tag is not worth failing a trial for
        pass
    return tags


def execution_tags(execution: dict | None) -> dict[str, str]:
    """How the trial actually runs (resolved KDA path, CUDA graph, compile) as k3lab.* tags."""
    return {f"k3lab.{k}": str(v) for k, v in (execution or {}).items()}


OFF = "off"  # the value of a param whose feature the model has switched off


def flatten(prefix: str, value: Any) -> dict[str, Any]:
    """{'a': {'b': 1}} -> {'a.b': 1}; lists and tuples become strings."""
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for key, item in value.items():
            out.update(flatten(f"{prefix}.{key}" if prefix else str(key), item))
        return out
    if isinstance(value, (list, tuple)):
        value = ",".join(map(str, value))
    return {prefix: value}


def model_params(config: dict, inactive=()) -> dict[str, str]:
    """A trial's `model.*` params; the fields of a switched-off feature (`inactive`, e.g. the AttnRes
    block size of a model without AttnRes) read "off", not their unused default."""
    return flatten("model", config) | {f"model.{name}": OFF for name in inactive}


def error_tags(message: str) -> dict[str, str]:
    return {ERROR: message[:MAX_TAG]}


def crash_count(tags: dict) -> int:
    """How often a trial crashed and went on from its last checkpoint (its `k3lab.crashes` tag)."""
    return int(tags.get(CRASHES, "0"))


def oom_restart_count(tags: dict) -> int:
    """How often a trial ran out of GPU memory and went on from its last checkpoint."""
    return int(tags.get(OOM_RESTARTS, "0"))


def count_crash(tracking_uri: str, run_id: str, error: str, cause: str = CRASHED) -> int:
    """One more restart of a trial that goes on from its last checkpoint, on its run, by cause: a
    crash (`k3lab.crashes`) or out of GPU memory (`k3lab.restarts_oom`), each over every part of a
    sweep, and the last one's error line. Returns that cause's count."""
    mlflow = client(tracking_uri)
    tags = mlflow.get_run(run_id).data.tags
    tag, count = (OOM_RESTARTS, oom_restart_count(tags) + 1) if cause == OOM else (CRASHES, crash_count(tags) + 1)
    mlflow.set_tag(run_id, tag, str(count))
    mlflow.set_tag(run_id, LAST_CRASH, error[:MAX_TAG])
    return count


def stopped_tags(step) -> dict[str, str]:
    return {STOPPED_AT: str(step)}


def resume_tags(earlier: str | None, command: str) -> dict[str, str]:
    """The parent's `k3lab.resumed_with` with one more resume's command (one line each)."""
    return {RESUMED_WITH: f"{earlier}\n{command}" if earlier else command}


def end_tags(status: str) -> dict[str, str]:
    """A parent run's `k3lab.status` as it ends: finished, failed, killed, or stopped (resumable)."""
    return {STATUS: status.lower()}


def close_run(tracking_uri: str, run_id: str, status: str, tags: dict[str, str] | None = None) -> None:
    """Set tags on a run, then end it with `status` (FINISHED, FAILED, KILLED)."""
    mlflow = client(tracking_uri)
    for key, value in (tags or {}).items():
        mlflow.set_tag(run_id, key, value)
    mlflow.set_terminated(run_id, status)


def metric_history(tracking_uri: str, run_id: str, metric: str) -> list[tuple[int, float]]:
    """One metric of one run as (step, value) pairs, by step."""
    return sorted((m.step, m.value) for m in client(tracking_uri).get_metric_history(run_id, metric))


def write_design(tracking_uri: str, parent_run_id: str, design: dict) -> None:
    """Store how a sweep's variants are compared with its parent run (see DESIGN)."""
    text = json.dumps(design, sort_keys=True)
    mlflow_client = client(tracking_uri)
    if len(text) <= DESIGN_TAG_LIMIT:
        mlflow_client.set_tag(parent_run_id, DESIGN, text)
        return
    mlflow_client.log_text(parent_run_id, text, DESIGN_FILE)
    mlflow_client.set_tag(parent_run_id, DESIGN, json.dumps({"artifact": DESIGN_FILE}))


def read_design(tracking_uri: str, parent_run) -> dict | None:
    """The comparison design stored with a parent run (`write_design`); None where it has none or
    it cannot be read (a store from before designs were stored, an artifact not copied with it)."""
    text = parent_run.data.tags.get(DESIGN)
    if not text:
        return None
    try:
        design = json.loads(text)
        if isinstance(design, dict) and set(design) == {"artifact"}:
            path = client(tracking_uri).download_artifacts(parent_run.info.run_id, design["artifact"])
            design = json.loads(Path(path).read_text())
    except Exception:  # noqa: BLE001 - an unreadable record (or an artifact not copied) is no design
        return None
    return design if isinstance(design, dict) else None


# -- a parent run whose driver died ----------------------------------------------------------

STALE_MS = 10 * 60 * 1000  # seen from another host: every trial ended this long ago and the parent still runs


def driver_alive(driver: str | None) -> bool | None:
    """Whether the driver process `host:pid` still runs: None when it runs on another host
    (or is not recorded), where this process cannot tell."""
    host, _, pid = (driver or "").rpartition(":")
    if not host or host != socket.gethostname() or not pid.isdigit():
        return None
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: it exists
        return True
    return True


def sweep_state(parent, trials: list, now_ms: int | None = None) -> str:
    """What a sweep's parent run is: its MLflow status (FINISHED, FAILED, KILLED), RUNNING while a
    driver runs it, or INTERRUPTED when it is RUNNING with no driver left: the driver's process is
    gone (same host), or (another host, or a store from before `k3lab.driver`) no trial is running
    and the last one ended more than STALE_MS ago."""
    if parent.info.status != "RUNNING":  # a closed interrupted sweep (report --close) stays one
        return parent.data.tags[STATUS] if parent.data.tags.get(STATUS) in (INTERRUPTED, STOPPED) else parent.info.status
    alive = driver_alive(parent.data.tags.get(DRIVER))
    if alive is not None:
        return "RUNNING" if alive else INTERRUPTED
    if any(t.info.status == "RUNNING" for t in trials):
        return "RUNNING"
    ends = [t.info.end_time for t in trials if t.info.end_time]
    now_ms = now_ms if now_ms is not None else int(time.time() * 1000)
    return INTERRUPTED if ends and now_ms - max(ends) > STALE_MS else "RUNNING"


def mark_interrupted(tracking_uri: str, parent_run_id: str) -> None:
    """The parent's tag says so (the UI shows the run as RUNNING: MLflow has no such status)."""
    client(tracking_uri).set_tag(parent_run_id, STATUS, INTERRUPTED)


def close_interrupted(tracking_uri: str, parent_run_id: str) -> int:
    """End an interrupted sweep: its trials still RUNNING end KILLED, then the parent KILLED at
    its last trial's end (its own end was never recorded). Returns the trials ended."""
    mlflow = client(tracking_uri)
    trials = trial_runs(tracking_uri, parent_run_id)
    running = [t for t in trials if t.info.status == "RUNNING"]
    for trial in running:
        mlflow.set_terminated(trial.info.run_id, "KILLED")
    ends = [t.info.end_time for t in trials if t.info.end_time]
    mlflow.set_tag(parent_run_id, STATUS, INTERRUPTED)
    mlflow.set_terminated(parent_run_id, "KILLED", end_time=max(ends) if ends and not running else None)
    return len(running)


def ran_line(trials: list, planned: int) -> str:
    """What ran of a sweep's plan: "13 of 80 planned trials: 12 finished, 1 killed; seeds 0, 1, 2"."""
    counts: dict[str, int] = {}
    for trial in trials:
        counts[trial.info.status.lower()] = counts.get(trial.info.status.lower(), 0) + 1
    seeds = sorted({seed_of(t) for t in trials})
    states = ", ".join(f"{n} {status}" for status, n in sorted(counts.items()))
    return f"{len(trials)} of {planned} planned trials" + (f": {states}; seeds {', '.join(map(str, seeds))}"
                                                          if trials else "")


def ran_params(trials: list) -> dict[str, str]:
    """The parent's params of what ran (the plan's are `planned.*`): trials, seeds, variants."""
    seeds = sorted({seed_of(t) for t in trials})
    return {"trials": str(len(trials)), "seeds": str(seeds), "variants": str(len({variant_of(t) for t in trials}))}


def reopen_tags() -> dict[str, str]:
    """A resumed sweep's parent: this process drives it now, and it is running again."""
    return driver_tags() | {STATUS: "running"}


def sweep_runs(tracking_uri: str) -> list:
    """Every sweep's parent run in the store, newest first."""
    mlflow = client(tracking_uri)
    experiments = [e.experiment_id for e in mlflow.search_experiments()]
    return mlflow.search_runs(experiments, f"tags.`{KIND}` = 'sweep'", order_by=["attributes.start_time DESC"],
                              max_results=MAX_RUNS) if experiments else []


def variant_order(tracking_uri: str, parent, trials: list) -> list[str]:
    """The sweep's variants in its file's order: as its stored design lists them (`write_design`),
    else (a store from before designs were stored) the baseline first, then in the order their
    first trials started, as the sweep started them."""
    stored = (read_design(tracking_uri, parent) or {}).get("variant_order") or []
    baseline = parent.data.tags.get("k3lab.baseline")
    first: dict[str, int] = {}
    for trial in trials:
        name = variant_of(trial)
        first[name] = min(first.get(name, trial.info.start_time or 0), trial.info.start_time or 0)
    position = {name: i for i, name in enumerate(stored)}
    return sorted(first, key=lambda n: (n not in position, position.get(n, 0), n != baseline, first[n], n))


# -- swept values ---------------------------------------------------------------------------


def axis_param(params: dict, axis: str) -> str:
    """The param that holds a trial's value of `axis` (one param per value): `axis.<name>` for an
    axis no config field is named after (layer_schedule, ffn, fidelity), and for every axis in
    stores written before (they logged it beside `model.<name>`, spelled as in the sweep file);
    else the config field's `model.<name>`."""
    key = f"axis.{axis}"
    return key if key in params else f"model.{axis}"


def axis_value(params: dict, axis: str) -> str | None:
    """A trial's value of `axis`, from its params (`axis_param`)."""
    return params.get(axis_param(params, axis))


def trial_axes(params: dict, tags: dict) -> dict[str, str | None]:
    """A trial's swept values, {axis: value}, for the axes its variant sets: named by its AXES tag,
    or in a store written before that tag, by its `axis.*` params."""
    names = json.loads(tags[AXES]) if AXES in tags else [k.removeprefix("axis.") for k in params
                                                         if k.startswith("axis.")]
    return {name: axis_value(params, name) for name in names}


def swept_axes(trials: list) -> list[str]:
    """The axes a sweep swept: those every trial's variant sets (`trial_axes`; a sweep of named
    variants, whose overrides differ per variant, has none)."""
    keys = [set(trial_axes(t.data.params, t.data.tags)) for t in trials]
    common = set.intersection(*keys) if keys else set()
    return sorted(common)


def axis_params(trials: list, axes: Sequence[str]) -> list[str]:
    """The params that hold `axes`' values in these trials (`axis_param`): the UI's columns."""
    params = trials[0].data.params if trials else {}
    return [axis_param(params, axis) for axis in axes]
