"""What a local store needs before the MLflow UI shows it (`k3lab ui`), done for every sweep whose
driver is not running: a viewer never writes into a running sweep (its driver writes it; what the
view lacks then, the sweep's own report writes at its end).

- its artifact locations (absolute paths in the database) point at the `mlartifacts/` beside it,
  so a store copied from another machine shows its artifacts (`relocate_artifacts`);
- a sweep whose parent run has no report artifacts (a store copied without `mlartifacts/`) gets
  its report rebuilt from the store and logged to the parent run (plots, summary.json), and one
  reported before k3lab wrote its verdicts as the view shows them (`k3lab.counted` on its trials,
  its variant runs) gets them (`k3lab.report.ui_verdicts`);
- trials recorded before k3lab logged the loss and throughput under `loss/` and `perf/` get those
  copies, so their page opens on the loss as a new store's does (`k3lab.store.metrics`);
- sweeps recorded before k3lab wrote the UI's current view and descriptions, or whose verdicts
  were just written, get them (`k3lab.store.views.present_earlier_sweeps`).
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Collection

from k3lab.report.options import ReportOptions
from k3lab.store import runs


def prepare_store(tracking_uri: str, say=print) -> None:
    """Everything the module docstring lists, saying what it did in one line each."""
    from k3lab.store.tracking import artifact_folder_for
    from k3lab.store.views import present_earlier_sweeps

    running = running_sweeps(tracking_uri)
    if running:
        say(f"left {len(running)} running sweep(s) as they are: their drivers write them, the UI shows what "
            f"they have written so far")
    moved = relocate_ended(tracking_uri, running)
    if moved:
        say(f"pointed {moved} runs' artifact locations at {artifact_folder_for(tracking_uri)}")
    rebuilt = rebuild_missing_reports(tracking_uri, skip=running)
    for parent_run_id, name in rebuilt:
        say(f"rebuilt the report of {name} (parent run {parent_run_id}) from the store into its artifacts")
    recorded = record_missing_verdicts(tracking_uri, skip=running)
    if recorded:
        say(f"wrote the verdicts and differences from the baselines of {len(recorded)} sweeps into the store")
    copied = add_page_sections(tracking_uri, skip=running)
    if copied:
        say(f"logged the loss and throughput of {copied} trials under loss/ and perf/ (their pages open on the loss)")
    presented = present_earlier_sweeps(tracking_uri, refresh={run_id for run_id, _ in rebuilt} | set(recorded),
                                       skip=running)
    if presented:
        say(f"added the current loss view and descriptions to {presented} sweeps")


def ended_sweeps(tracking_uri: str, skip: Collection[str] = ()) -> list[tuple[object, list]]:
    """(parent run, its trials) of every sweep in the store but those in `skip`."""
    return [(parent, runs.trial_runs(tracking_uri, parent.info.run_id)) for parent in runs.sweep_runs(tracking_uri)
            if parent.info.run_id not in skip]


def running_sweeps(tracking_uri: str) -> set[str]:
    """The parent run ids of the sweeps whose driver runs (`k3lab.store.runs.sweep_state` RUNNING)."""
    return {parent.info.run_id for parent, trials in ended_sweeps(tracking_uri)
            if runs.sweep_state(parent, trials) == "RUNNING"}


def relocate_ended(tracking_uri: str, running: Collection[str]) -> int:
    """`relocate_artifacts` for every experiment of the store without a running sweep."""
    from k3lab.store.tracking import relocate_artifacts, sqlite_path

    if sqlite_path(tracking_uri) is None:
        return 0
    client = runs.client(tracking_uri)
    busy = {client.get_run(run_id).info.experiment_id for run_id in running}
    return sum(relocate_artifacts(tracking_uri, e.name) for e in client.search_experiments()
               if e.experiment_id not in busy)


def rebuild_missing_reports(tracking_uri: str, skip: Collection[str] = ()) -> list[tuple[str, str]]:
    """Log a report (plots, summary.json) to every sweep's parent run that has none."""
    from k3lab.report.summary import build_report

    client = runs.client(tracking_uri)
    rebuilt = []
    for parent, trials in ended_sweeps(tracking_uri, skip):
        run_id = parent.info.run_id
        try:
            if client.list_artifacts(run_id, "report"):
                continue
        except Exception:  # an artifact location this machine cannot read: nothing to add to
            continue
        if not trials:
            continue
        with tempfile.TemporaryDirectory() as folder:
            report = build_report(tracking_uri, run_id, report_options(tracking_uri, parent, trials),
                                  out_dir=Path(folder))
            for path in report.files:
                client.log_artifact(run_id, str(path), "report")
        rebuilt.append((run_id, client.get_experiment(parent.info.experiment_id).name))
    return rebuilt


def record_missing_verdicts(tracking_uri: str, skip: Collection[str] = ()) -> list[str]:
    """Write the verdicts (`k3lab.report.ui_verdicts`) of every sweep with a trial that has no
    `k3lab.counted` tag (reported before k3lab wrote it), or with variant runs and no baseline run
    (reported before k3lab wrote each variant's throughput); returns their parent run ids."""
    from k3lab.report.summary import build_report
    from k3lab.store.verdicts import BASELINE_KIND, COUNTED, variant_runs

    client, recorded = runs.client(tracking_uri), []
    for parent, trials in ended_sweeps(tracking_uri, skip):
        run_id = parent.info.run_id
        if trials and (any(COUNTED not in t.data.tags for t in trials) or (
                variant_runs(client, run_id) and not variant_runs(client, run_id, BASELINE_KIND))):
            build_report(tracking_uri, parent.info.run_id, report_options(tracking_uri, parent, trials))
            recorded.append(parent.info.run_id)
    return recorded


def add_page_sections(tracking_uri: str, skip: Collection[str] = ()) -> int:
    """Copies of the loss and throughput histories under `loss/` and `perf/` for the trials that have
    none (`k3lab.store.metrics.PAGE_SECTIONS`), and their diagnostics under older names moved under
    `probe/` (`regroup_diagnostics`), so that a trial's page opens on its loss; returns how many
    trials got them."""
    from mlflow.entities import Metric

    from k3lab.store.metrics import PAGE_SECTIONS, regroup_diagnostics
    from k3lab.store.tracking import sqlite_path
    from k3lab.store.verdicts import log_batches

    client, count = runs.client(tracking_uri), 0
    for _, trials in ended_sweeps(tracking_uri, skip):
        for trial in trials:
            names = [name for name, copy in PAGE_SECTIONS.items()
                     if name in trial.data.metrics and copy not in trial.data.metrics]
            copies = [Metric(PAGE_SECTIONS[name], m.value, m.timestamp, m.step) for name in names
                      for m in client.get_metric_history(trial.info.run_id, name)]
            log_batches(client, trial.info.run_id, copies)
            count += bool(copies)
        database = sqlite_path(tracking_uri)
        if database is not None:
            regroup_diagnostics(database, [t.info.run_id for t in trials])
    return count


def report_options(tracking_uri: str, parent, trials: list) -> ReportOptions:
    """`build_report`'s options as the sweep stored them (`stored_options`), else `options_of_old_store`."""
    from k3lab.report.summary import stored_options

    return stored_options(tracking_uri, parent.info.run_id) or options_of_old_store(tracking_uri, parent, trials)


def options_of_old_store(tracking_uri: str, parent, trials: list) -> ReportOptions:
    """`build_report` options for a store from before sweeps stored their design: its metric, every
    variant against its one recorded baseline (family-wise Bonferroni t-intervals), variants in the
    order the sweep started them (`k3lab.store.runs.variant_order`). `k3lab report` with the sweep
    file stores the file's design instead."""
    baseline = parent.data.tags.get("k3lab.baseline") or None
    metric, _, mode = parent.data.params.get("metric", "val_loss:min").partition(":")
    names = runs.variant_order(tracking_uri, parent, trials)
    return ReportOptions(metric=metric, mode=mode or "min", baseline=baseline if baseline in names else None,
                         variant_order=names)
