"""What `k3lab report` needs of a sweep that ran: its parent run (from its state file, or the
latest of its experiment in the store), its state (an interrupted one said so, or closed), and the
design its comparisons are made with."""

from __future__ import annotations

import contextlib
from pathlib import Path

from k3lab.errors import UserError
from k3lab.report.options import ReportOptions
from k3lab.runner.tune.run import SweepRun
from k3lab.runner.tune.seeds import report_options


def report_design(run: SweepRun, parent_run_id: str, baseline: str | None = None, metric: str | None = None,
                  file_design: bool = False) -> ReportOptions:
    """How the report compares the variants: as the sweep stored it with its parent run, so that
    every view of one store gives the same verdicts; a store from before designs were stored gets
    the file's (and keeps it). --baseline (every variant against one), --metric and file_design
    (the sweep file's present design) change it for this report only."""
    import attrs

    from k3lab.report.summary import stored_options
    from k3lab.store.runs import write_design

    options = report_options(run.sweep) if file_design else stored_options(run.tracking_uri, parent_run_id)
    if options is None:
        options = report_options(run.sweep)
        with contextlib.suppress(Exception):  # a read-only store still gets its report
            write_design(run.tracking_uri, parent_run_id, options.to_record(stored_by="report"))
    options = attrs.evolve(options, baseline=baseline or run.sweep.baseline)
    if baseline:
        pairs = {v: baseline for v in options.variant_order if v != baseline}
        design = options.design
        options = attrs.evolve(options, baselines=pairs, design=None if design is None else
                               attrs.evolve(design, comparisons=len(pairs), level=None))
    if metric:
        options = attrs.evolve(options, metric=metric)
    return options


def check_interrupted(say, run: SweepRun, parent_run_id: str, close: bool) -> str:
    """The sweep's state (`k3lab.store.runs.sweep_state`): an interrupted one is said so (`say`, rich
    markup) and in the parent's `k3lab.status` tag, and ended with `close`."""
    from k3lab.store import runs

    parent = runs.get_run(run.tracking_uri, parent_run_id)
    state = runs.sweep_state(parent, runs.trial_runs(run.tracking_uri, parent_run_id))
    if close and parent.info.status != "RUNNING":
        raise UserError(f"--close: the parent run {parent_run_id} of {run.experiment} has ended already "
                        f"({parent.info.status}): nothing to close")
    if close and state != runs.INTERRUPTED:
        raise UserError(f"--close: the parent run {parent_run_id} of {run.experiment} is still running "
                        f"(its driver {parent.data.tags.get(runs.DRIVER, '?')} is alive)")
    if state != runs.INTERRUPTED or parent.info.status != "RUNNING":
        return state
    if close:
        ended = runs.close_interrupted(run.tracking_uri, parent_run_id)
        say(f"[yellow]interrupted: the parent run {parent_run_id} of {run.experiment} ended KILLED"
                      + (f", with {ended} trials still marked running" if ended else ""))
        return state
    runs.mark_interrupted(run.tracking_uri, parent_run_id)
    driver = parent.data.tags.get(runs.DRIVER)
    say(f"[yellow]interrupted: the parent run {parent_run_id} of {run.experiment} is still RUNNING but "
                  + (f"its driver ({driver}) is gone" if driver else "no trial has run for a while")
                  + f"; `{run.hint('sweep', **{again_flag(run): True})}` {again_verb(run)}, "
                  f"`{run.hint('report', close=True)}` ends it")
    return state


def check_store_to_read(run) -> None:
    """A local SQLite store a report reads exists and holds MLflow's tables: MLflow opening a
    missing or empty (0-byte) file, or one of other tables, would create its tables there (and
    the file and its folder) before saying that the run is not in it."""
    from k3lab.store.tracking import holds_mlflow_runs, sqlite_path

    store = sqlite_path(run.tracking_uri)
    if store is None or holds_mlflow_runs(store):
        return
    what = f"no store at {store}" if not store.exists() else f"{store} holds no MLflow store"
    raise UserError(f"{run.sweep.path}: {what} (--tracking-uri {run.tracking_uri})"
                    + ("" if run.state_file.exists() else f", and no run of {run.experiment} under {run.storage}"))


def stopped_before_trials(run) -> bool:
    """Its state file but no Tune folder: killed before any trial started, nothing for --resume (`check_started`)."""
    return run.state_file.exists() and not run.tune_dir.exists()


def again_flag(run) -> str:
    return "overwrite" if stopped_before_trials(run) else "resume"


def again_verb(run) -> str:
    return "starts it again" if stopped_before_trials(run) else "continues it"


def find_parent_run(run: SweepRun) -> str:
    """The sweep's parent run: from its state file under --storage, else the latest sweep run
    of its experiment in the tracking store (a store copied from another machine)."""
    from k3lab.store.runs import latest_sweep_run
    from k3lab.store.state import check_parent_run

    if run.state_file.exists():  # its own file and store checks, a damaged state file first
        return check_parent_run(run.state_file, run.tracking_uri, run.hint("sweep", overwrite=True))
    check_store_to_read(run)
    run_id = latest_sweep_run(run.tracking_uri, run.experiment)
    if run_id is None:
        raise UserError(f"{run.sweep.path}: no run of {run.experiment} under {run.storage} or in {run.tracking_uri}")
    return run_id


def other_sweeps(stores: list[str], run: SweepRun) -> list[tuple[str, str, str]]:
    """`k3lab report --also STORE`: (label, tracking URI, parent run id) of each store's latest sweep
    of the experiment; a store without one is a one-line error, before anything is written."""
    from k3lab.store.archive import store_tracking_uri
    from k3lab.store.runs import latest_sweep_run

    found = []
    for store in stores:
        uri = store if "://" in store else store_tracking_uri(store)
        parent = latest_sweep_run(uri, run.experiment)
        if parent is None:
            raise UserError(f"--also {store}: no sweep of {run.experiment} in it")
        found.append((label_of(store), uri, parent))
    return found


def report_across(tracking_uri: str, report, also: list[tuple[str, str, str]], out: Path) -> dict:
    """The comparisons of this store's sweep (`report`, `build_report`'s) and of the other stores'
    (label, tracking URI, parent run id), per sweep and pooled; written to `out`/across.json too."""
    import json

    from k3lab.report.across import Sweep, across_json, compare_across
    from k3lab.report.summary import load_trials

    metric = report.metric
    sweeps = [Sweep(label_of(tracking_uri), report.records)]
    sweeps += [Sweep(label, load_trials(uri, parent, curves=("train_loss", metric))) for label, uri, parent in also]
    rows = compare_across(sweeps, report.pairs, metric, report.mode, report.design, report.last, report.rise)
    out.mkdir(parents=True, exist_ok=True)
    (out / "across.json").write_text(json.dumps(across_json(rows), indent=2, default=str))
    return {"rows": rows, "sweeps": sweeps}


def label_of(store: str) -> str:
    """A store's name in the tables: its file (a folder's mlflow.db: the folder)."""
    path = Path(store.removeprefix("sqlite:///"))
    return path.parent.name if path.name == "mlflow.db" else path.name.removesuffix(".xz")
