"""`k3lab report`: a sweep's summary and plots rebuilt from the MLflow store (and `--close` for
one whose driver died)."""

from __future__ import annotations

import argparse
import contextlib
import os
from pathlib import Path

from k3lab.commands.sweep import STORAGE_HELP, TRACKING_HELP, sweep_run_from_args, wide_console
from k3lab.errors import UserError
from k3lab.registry.commands import add_profile_argument
from k3lab.registry.spec import METRICS


def register(subparsers: argparse._SubParsersAction) -> None:
    report = subparsers.add_parser("report", help="rebuild a sweep's summary and plots from the MLflow store")
    report.add_argument("file", help="the sweep file")
    add_profile_argument(report)
    report.add_argument("--storage", help=STORAGE_HELP)
    report.add_argument("--tracking-uri", help=TRACKING_HELP)
    report.add_argument("--out", help="folder for the plots and summary.json")
    report.add_argument("--markdown", help="also write the results as a section of this markdown file")
    report.add_argument("--metric", choices=METRICS, help="compare this metric instead of the sweep file's")
    report.add_argument("--gpu-log", help="GPU utilisation samples, one epoch_seconds,percent line each (percent "
                                          "0-100, e.g. from nvidia-smi: see k3lab.report.results), for the GPU-busy "
                                          "share in the --markdown section's timing; needs --markdown")
    report.add_argument("--baseline", help="the variant the others are compared against, paired by seed "
                                            "(default: the sweep file's baseline)")
    report.add_argument("--also", action="append", default=[], metavar="STORE",
                        help="another store with a sweep of this file (mlflow.db, its folder, a *.db.xz, or a "
                             "tracking URI; repeatable): each comparison per sweep, side by side, and pooled over "
                             "the distinct seeds")
    report.add_argument("--close", action="store_true",
                        help="end a sweep whose driver died: its parent run and the trials left RUNNING end KILLED "
                             "(--resume continues it instead)")
    report.set_defaults(func=run_report)


def run_report(args) -> int:
    from k3lab.report.summary import build_report, print_summary
    from k3lab.tune.parent import present
    from k3lab.runtime.preflight import check_tracking_server

    run = sweep_run_from_args(args)
    out = Path(args.out) if args.out else run.storage / f"{run.experiment}_report"
    check_report_flags(args, run, out)
    check_tracking_server(run.tracking_uri)
    parent_run_id = find_parent_run(run)
    options = report_design(args, run, parent_run_id)
    also = other_sweeps(args, run)  # before anything is written
    console = wide_console()
    state = check_interrupted(console, run, parent_run_id, close=args.close)
    summary = build_report(run.tracking_uri, parent_run_id, out_dir=out, baseline=args.baseline or run.sweep.baseline,
                           record=not (args.baseline or args.metric), **options)  # the store keeps the sweep's own
    if also:
        summary["across"] = report_across(run, summary, also, out)
    written = write_results_markdown(args, run, parent_run_id, summary) if args.markdown else None
    with contextlib.suppress(Exception):  # the UI's view and descriptions, as of now
        present(run, parent_run_id, state=state)
    print_summary(console, run.experiment, summary)
    if written is not None:
        console.print(written, markup=False, highlight=False, soft_wrap=True)
    return 0


def other_sweeps(args, run) -> list[tuple[str, str, str]]:
    """--also: (label, tracking URI, parent run id) of each store's latest sweep of the experiment."""
    from types import SimpleNamespace

    from k3lab.commands.ui import store_uri
    from k3lab.store.runs import latest_sweep_run

    found = []
    for store in args.also:
        uri = store if "://" in store else store_uri(SimpleNamespace(store=store, tracking_uri=None, unpack_dir=None))
        parent = latest_sweep_run(uri, run.experiment)
        if parent is None:
            raise UserError(f"--also {store}: no sweep of {run.experiment} in it")
        found.append((label_of(store), uri, parent))
    return found


def report_across(run, summary: dict, also: list[tuple[str, str, str]], out: Path) -> dict:
    """The comparisons of this store's sweep and of the --also stores' (`other_sweeps`), per sweep
    and pooled (`k3lab.report.across`); written to `out`/across.json too."""
    import json

    from k3lab.report.across import Sweep, across_json, compare_across
    from k3lab.report.summary import load_trials

    metric = summary["metric"]
    sweeps = [Sweep(label_of(run.tracking_uri), summary["records"])]
    sweeps += [Sweep(label, load_trials(uri, parent, curves=("train_loss", metric))) for label, uri, parent in also]
    rows = compare_across(sweeps, summary["pairs"], metric, summary["mode"], summary["design"], summary["last"],
                          summary["rise"])
    out.mkdir(parents=True, exist_ok=True)
    (out / "across.json").write_text(json.dumps(across_json(rows), indent=2, default=str))
    return {"rows": rows, "sweeps": sweeps}


def label_of(store: str) -> str:
    """A store's name in the tables: its file (a folder's mlflow.db: the folder)."""
    path = Path(store.removeprefix("sqlite:///"))
    return path.parent.name if path.name == "mlflow.db" else path.name.removesuffix(".xz")


def report_design(args, run, parent_run_id: str) -> dict:
    """How the report compares the variants: as the sweep stored it with its parent run, so that
    every view of one store gives the same verdicts; a store from before designs were stored gets
    the file's (and keeps it). --baseline (every variant against one) and --metric change it for
    this report only."""
    import attrs

    from k3lab.report.family import design_record
    from k3lab.report.summary import stored_options
    from k3lab.store.runs import write_design
    from k3lab.tune.seeds import report_options

    options = stored_options(run.tracking_uri, parent_run_id)
    if options is None:
        options = report_options(run.sweep)
        with contextlib.suppress(Exception):  # a read-only store still gets its report
            write_design(run.tracking_uri, parent_run_id, design_record(options, stored_by="report"))
    if args.baseline:
        pairs = {v: args.baseline for v in options["variant_order"] if v != args.baseline}
        design = options.get("design")
        options = options | {"baselines": pairs, "design": None if design is None else
                             attrs.evolve(design, comparisons=len(pairs), level=None)}
    if args.metric:
        options = options | {"metric": args.metric}
    return options


def check_report_flags(args, run, out: Path) -> None:
    """`k3lab report`'s flags, before any work: what fails only when the report is written would
    leave summary.json and the plots written and the markdown not."""
    from k3lab.runtime.preflight import check_writable

    if out.exists() and not out.is_dir():
        raise UserError(f"--out {out}: is a file, not a folder (the report writes its plots and summary.json there)")
    check_writable("--out" if args.out else "the report's folder (--out names another)", out)
    check_store_writable(run)
    if args.markdown:
        check_markdown(Path(args.markdown), run.experiment)
    if args.gpu_log:
        check_gpu_log(args)
    names = {v.name for v in run.sweep.valid_variants}
    if args.baseline and args.baseline not in names:
        raise UserError(f"--baseline {args.baseline}: not a variant of {args.file} ({', '.join(sorted(names))})")


def check_store_writable(run) -> None:
    """A local SQLite store that a report reads can also be written: the report records the sweep's
    state and its UI view there, and SQLite writes a journal beside the file (in a read-only folder
    each write was an MLflow traceback, and the report exited 0)."""
    from k3lab.store.tracking import sqlite_path
    from k3lab.runtime.preflight import check_writable

    store = sqlite_path(run.tracking_uri)
    if store is None or not store.exists():
        return
    problem = "the file is read-only" if not os.access(store, os.W_OK) else None
    try:
        check_writable("folder", store.parent)
    except UserError:
        problem = problem or f"its folder {store.parent} cannot be written (SQLite writes its journal there)"
    if problem:
        raise UserError(f"tracking store {store}: {problem}; the report records the sweep's state in it: copy the "
                        "store to a folder you can write and pass --tracking-uri")


def check_gpu_log(args) -> None:
    """--gpu-log: with --markdown, whose timing section is the one place its figure goes (without
    it the log was ignored), and every line a sample (`read_gpu_log`)."""
    from k3lab.report.results import read_gpu_log

    if not args.markdown:
        raise UserError(f"--gpu-log {args.gpu_log}: its GPU-busy share goes in the --markdown section's timing; "
                        "pass --markdown too")
    read_gpu_log(args.gpu_log)


def check_markdown(markdown: Path, experiment: str) -> None:
    """--markdown: a text file or none yet (`check_section_file`), in a folder that is, or can be
    made (as --out's), and written, as can its plots folder beside it."""
    from k3lab.markdown import check_section_file
    from k3lab.runtime.preflight import check_writable

    check_section_file(markdown, "--markdown")
    check_writable("--markdown", markdown.parent)
    check_writable("--markdown's plots folder", plots_folder(markdown, experiment))


def plots_folder(markdown: Path, experiment: str) -> Path:
    """Where the markdown's plots are copied: docs/results.md -> docs/results/<experiment>/."""
    return markdown.parent / markdown.stem / experiment


def check_interrupted(console, run, parent_run_id: str, close: bool) -> str:
    """The sweep's state (`k3lab.store.runs.sweep_state`): an interrupted one is said so on the
    terminal and in the parent's `k3lab.status` tag, and ended with `close`."""
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
        console.print(f"[yellow]interrupted: the parent run {parent_run_id} of {run.experiment} ended KILLED"
                      + (f", with {ended} trials still marked running" if ended else ""))
        return state
    runs.mark_interrupted(run.tracking_uri, parent_run_id)
    driver = parent.data.tags.get(runs.DRIVER)
    console.print(f"[yellow]interrupted: the parent run {parent_run_id} of {run.experiment} is still RUNNING but "
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


def find_parent_run(run) -> str:
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


def write_results_markdown(args, run, parent_run_id: str, summary: dict) -> str:
    """The sweep's section of the markdown file, with its plots copied into a folder beside it
    (docs/results.md -> docs/results/<experiment>/*.png) and linked from the section.
    Returns the line that says what it wrote, and where."""
    from k3lab.markdown import replace_section
    from k3lab.report.results import copy_plots, load_parent, results_markdown

    markdown = Path(args.markdown)
    folder = plots_folder(markdown, run.experiment)
    plots = copy_plots(summary["files"], folder, markdown.parent)
    title = f"{run.experiment}: {run.sweep.description}" if run.sweep.description else run.experiment
    body = results_markdown(summary, load_parent(run.tracking_uri, parent_run_id), title,
                            report_command=args.command_line, gpu_log=args.gpu_log, plots=plots)
    replaced = replace_section(markdown, run.experiment, body, header="# Results\n")
    names = ", ".join(Path(p).name for p in plots)
    return (f"wrote {markdown}: section {run.experiment} ({'replaced' if replaced else 'added'})"
            + (f", linking {len(plots)} plot{'s' if len(plots) != 1 else ''} copied to {folder}/ ({names})"
               if plots else " (no plots)"))
