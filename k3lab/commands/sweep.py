"""`k3lab sweep`: every variant x seed of a sweep file as Ray Tune trials; what it shares with
`k3lab train` and `k3lab report` (the store's flags, the sweep they name, a wide console)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from k3lab.errors import UserError
from k3lab.registry.sweep_cli import add_profile_argument

STORAGE_HELP = "folder for Tune state, checkpoints and reports (default: K3LAB_STORAGE or ./k3lab_runs)"
TRACKING_HELP = "MLflow tracking URI (default: MLFLOW_TRACKING_URI or ./mlflow.db)"
MAX_FAILURES = 2  # --max-failures' default
STOPPED_ON_TIME = 3  # exit code of a sweep --stop-after stopped: resumable, not failed


def register(subparsers: argparse._SubParsersAction) -> None:
    sweep = subparsers.add_parser("sweep", help="run every variant x seed of a sweep file as Ray Tune trials")
    sweep.add_argument("file", help="sweep file, e.g. experiments/attnres_block.yaml")
    add_profile_argument(sweep)
    sweep.add_argument("--storage", help=STORAGE_HELP)
    sweep.add_argument("--kernel-cache", default=None,
                       help="GPU kernel cache folder (default: the sweep file's kernel_cache, $K3LAB_KERNEL_CACHE, "
                            "or ~/.cache/k3lab/kernels)")
    sweep.add_argument("--tracking-uri", help=TRACKING_HELP)
    sweep.add_argument("--address", help="Ray cluster address (default: RAY_ADDRESS, else a local Ray instance)")
    sweep.add_argument("--resume", action="store_true", help="continue an interrupted run of this sweep")
    sweep.add_argument("--overwrite", action="store_true", help="discard an earlier run of this sweep and start again")
    sweep.add_argument("--max-failures", type=int, default=MAX_FAILURES,
                       help="retries of a crashed trial (from its checkpoint)")
    sweep.add_argument("--max-concurrent", type=int, help="trials at a time (default: the sweep file's, else all "
                                                          "that fit)")
    sweep.add_argument("--stop-after", metavar="DURATION",
                       help="stop cleanly after this wall time (10m, 1h30m, 90s), the state saved for --resume, "
                            f"as before a job scheduler's time limit or a preemptible node's end; exit code {STOPPED_ON_TIME}")
    sweep.add_argument("--dry-run", action="store_true", help="list the trials that would run, start nothing")
    sweep.add_argument("--no-live", action="store_true",
                       help="plain progress lines instead of the live table (the default when stdout or stderr "
                            "is not a terminal: logs, tee, CI)")
    sweep.add_argument("--verbose", action="store_true",
                       help="Ray's and MLflow's notices on the terminal, not in <storage>/<experiment>.log")
    sweep.set_defaults(func=run_sweep_command)


def sweep_run_from_args(args, **options):
    """The sweep file under its profile, with the storage and tracking store the flags name."""
    from k3lab.registry.sweep_cli import load_sweep_for
    from k3lab.store.state import default_storage, tracking_uri_or_default
    from k3lab.runner.tune.run import SweepRun

    if args.storage is not None and not args.storage.strip():
        raise UserError("--storage: names no folder (leave it out for K3LAB_STORAGE or ./k3lab_runs)")
    return SweepRun(sweep=load_sweep_for(args.file, args.profile),
                    storage=Path(args.storage) if args.storage else default_storage(),
                    tracking_uri=tracking_uri_or_default(args.tracking_uri), **options)


def run_sweep_command(args) -> int:
    from k3lab.commands.variants import measured_rates, print_packing
    from k3lab.registry.sweep_cli import print_plan
    from k3lab.report.tables import print_summary, wide_console
    from k3lab.runner.runtime.sigterm import stop_on_sigterm
    from k3lab.runner.runtime.stopping import stop_after_seconds, stop_timer
    from k3lab.runner.tune.driver import run_sweep
    from k3lab.runner.tune.run import check_options, next_steps

    check_options(args.max_concurrent, args.max_failures, args.resume, args.overwrite)
    stop_after = stop_after_seconds(args.stop_after)  # a bad value: refused before anything starts
    run = sweep_run_from_args(args, address=args.address, resume=args.resume, overwrite=args.overwrite,
                              max_failures=args.max_failures, max_concurrent=args.max_concurrent,
                              kernel_cache_dir=args.kernel_cache, command=args.command_line, verbose=args.verbose)
    run.resume_command = resume_command(args, run)  # the parent run keeps the one printed when stopped
    sweep = run.sweep
    console = wide_console()
    print_plan(console, sweep, measured_rates(sweep, args.kernel_cache))
    if args.dry_run:
        print_packing(console, sweep, args.kernel_cache)
        return dry_run(console, run)

    def say(line: str) -> None:  # one line as it is: no markup, never wrapped
        console.print(line, markup=False, highlight=False, soft_wrap=True)

    timer = stop_timer(stop_after)  # --stop-after: SIGINT once its time has passed
    try:
        with stop_on_sigterm():  # a scheduler's SIGTERM stops it as Ctrl-C does
            end = run_sweep(run, live=not args.no_live, say=say)  # says where it logs, once the checks pass
    except KeyboardInterrupt:
        return stopped_sweep(args, run, on_time=timer is not None and timer.fired.is_set())
    finally:
        if timer is not None:
            timer.cancel()
    console.line()  # the tables start on a line of their own, after the progress lines or the live table
    print_summary(console, run.experiment, end.report)
    for error in end.errors:
        console.print(f"[red]trial error: {error}")
    say(next_steps(run))
    return 1 if end.errors else 0


def dry_run(console, run) -> int:
    """What the sweep would run, and where, after the checks the real sweep makes before it starts
    anything (`check_dry_run`: a sweep that would be refused is refused here too, exit 2)."""
    from k3lab.registry.sweep_cli import print_variant_table
    from k3lab.runner.tune.seeds import earlier_run_line
    from k3lab.runner.tune.driver import check_dry_run, dry_run_line

    check_dry_run(run)
    print_variant_table(console, run.sweep)
    console.print(dry_run_line(run))
    earlier = earlier_run_line(run)
    if earlier:
        console.print(earlier, markup=False, highlight=False)
    return 0


def stopped_sweep(args, run, on_time: bool) -> int:
    """The exit of a sweep stopped by Ctrl-C, SIGTERM or --stop-after: the `--resume` command that
    continues it where its state was saved, and the exit code (130 for Ctrl-C, re-raised; 143 for
    SIGTERM; 3 for --stop-after, or 1 when it stopped before anything could be resumed)."""
    from k3lab.runner.runtime import sigterm

    terminated = not on_time and sigterm.received.is_set()
    stopped = (f"sweep stopped after {args.stop_after} (--stop-after)" if on_time
               else "sweep stopped by SIGTERM" if terminated else "sweep stopped")
    resumable = run.state_file.exists() and run.tune_dir.exists()  # what --resume needs to go on
    if resumable:
        print(f"{stopped}, its state saved: continue it with `{resume_command(args, run)}`",
              file=sys.stderr)
    if terminated:
        if not resumable:
            print(f"{stopped} before its trials started: nothing to resume", file=sys.stderr)
        return sigterm.EXIT_CODE
    if not on_time:
        raise KeyboardInterrupt
    if not resumable:  # not exit 3: a job script that resumes on 3 would find nothing to resume
        print(f"{stopped} before its trials started: nothing to resume; give it more time", file=sys.stderr)
        return 1
    return STOPPED_ON_TIME


def resume_command(args, run) -> str:
    """The command that continues a stopped sweep: the options that point at it (`SweepRun.hint`),
    those of the stopped command that say how it runs, and --resume (never --overwrite, which would
    discard what it continues)."""
    return run.hint("sweep", kernel_cache=args.kernel_cache, max_concurrent=args.max_concurrent,
                    max_failures=None if args.max_failures == MAX_FAILURES else args.max_failures,
                    no_live=args.no_live, verbose=args.verbose, stop_after=args.stop_after, resume=True)
