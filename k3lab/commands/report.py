"""`k3lab report`: a sweep's summary and plots rebuilt from the MLflow store (and `--close` for
one whose driver died)."""

from __future__ import annotations

import argparse
import contextlib
import os
from pathlib import Path

import attrs

from k3lab.commands.sweep import STORAGE_HELP, TRACKING_HELP, sweep_run_from_args
from k3lab.errors import UserError
from k3lab.registry.sweep_cli import add_profile_argument
from k3lab.registry.sections import METRICS


def register(subparsers: argparse._SubParsersAction) -> None:
    report = subparsers.add_parser("report", help="rebuild a sweep's summary and plots from the MLflow store")
    report.add_argument("file", help="the sweep file")
    add_profile_argument(report)
    report.add_argument("--storage", help=STORAGE_HELP)
    report.add_argument("--tracking-uri", help=TRACKING_HELP)
    report.add_argument("--out", help="folder for the plots and summary.json")
    report.add_argument("--markdown", help="also write the results as a section of this markdown file")
    report.add_argument("--section", help="the --markdown section's name (default: the experiment's): another "
                                          "name keeps a run of the same file on other hardware beside the first")
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
    report.add_argument("--file-design", action="store_true",
                        help="judge under the sweep file's present design instead of the one the run stored (this "
                             "report only: the store keeps its own)")
    report.add_argument("--close", action="store_true",
                        help="end a sweep whose driver died: its parent run and the trials left RUNNING end KILLED "
                             "(--resume continues it instead)")
    report.set_defaults(func=run_report)


def run_report(args) -> int:
    from k3lab.report.summary import build_report
    from k3lab.report.tables import print_summary, wide_console
    from k3lab.runner.tune.parent import present
    from k3lab.runner.tune.stored_sweep import check_interrupted, find_parent_run, other_sweeps, report_across, report_design
    from k3lab.runner.runtime.preflight import check_tracking_server

    run = sweep_run_from_args(args)
    out = Path(args.out) if args.out else run.storage / f"{run.experiment}_report"
    check_report_flags(args, run, out)
    check_tracking_server(run.tracking_uri)
    parent_run_id = find_parent_run(run)
    options = report_design(run, parent_run_id, args.baseline, args.metric, args.file_design)
    also = other_sweeps(args.also, run)  # before anything is written
    console = wide_console()
    state = check_interrupted(console.print, run, parent_run_id, close=args.close)
    report = build_report(run.tracking_uri, parent_run_id, options, out_dir=out,
                          record=not (args.baseline or args.metric or args.file_design))  # the store keeps the sweep's own
    if also:
        report = attrs.evolve(report, across=report_across(run.tracking_uri, report, also, out))
    written = write_results_markdown(args, run, parent_run_id, report) if args.markdown else None
    with contextlib.suppress(Exception):  # the UI's view and descriptions, as of now
        present(run, parent_run_id, state=state)
    print_summary(console, run.experiment, report)
    if written is not None:
        console.print(written, markup=False, highlight=False, soft_wrap=True)
    return 0


def check_report_flags(args, run, out: Path) -> None:
    """`k3lab report`'s flags, before any work: what fails only when the report is written would
    leave summary.json and the plots written and the markdown not."""
    from k3lab.runner.runtime.preflight import check_writable

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
    from k3lab.runner.runtime.preflight import check_writable

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
    from k3lab.report.markdown import check_section_file
    from k3lab.runner.runtime.preflight import check_writable

    check_section_file(markdown, "--markdown")
    check_writable("--markdown", markdown.parent)
    check_writable("--markdown's plots folder", plots_folder(markdown, experiment))


def plots_folder(markdown: Path, experiment: str) -> Path:
    """Where the markdown's plots are copied: docs/results.md -> docs/results/<experiment>/."""
    return markdown.parent / markdown.stem / experiment


def write_results_markdown(args, run, parent_run_id: str, report) -> str:
    """The sweep's section of the markdown file, with its plots copied into a folder beside it
    (docs/results.md -> docs/results/<experiment>/*.png) and linked from the section.
    Returns the line that says what it wrote, and where."""
    from k3lab.report.markdown import replace_section
    from k3lab.report.results import copy_plots, load_parent, results_markdown

    markdown, section = Path(args.markdown), getattr(args, "section", None) or run.experiment
    folder = plots_folder(markdown, section)
    plots = copy_plots(report.files, folder, markdown.parent)
    title = f"{section}: {run.sweep.description}" if run.sweep.description else section
    body = results_markdown(report, load_parent(run.tracking_uri, parent_run_id), title,
                            report_command=args.command_line, gpu_log=args.gpu_log, plots=plots,
                            file_design=args.file_design)
    replaced = replace_section(markdown, section, body, header="# Results\n")
    names = ", ".join(Path(p).name for p in plots)
    return (f"wrote {markdown}: section {section} ({'replaced' if replaced else 'added'})"
            + (f", linking {len(plots)} plot{'s' if len(plots) != 1 else ''} copied to {folder}/ ({names})"
               if plots else " (no plots)"))
