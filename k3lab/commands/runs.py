"""`k3lab train`, `k3lab sweep` and `k3lab report` (`k3lab ui` is `k3lab.commands.ui`)."""

from __future__ import annotations

import argparse
import contextlib
import os
import shlex
import signal
import sys
import threading
from pathlib import Path

import yaml

from k3lab.errors import UserError
from k3lab.model.fidelity import FIDELITIES
from k3lab.registry.commands import add_profile_argument
from k3lab.registry.spec import METRICS, SEED_MAX, duration_seconds

STORAGE_HELP = "folder for Tune state, checkpoints and reports (default: K3LAB_STORAGE or ./k3lab_runs)"
TRACKING_HELP = "MLflow tracking URI (default: MLFLOW_TRACKING_URI or ./mlflow.db)"
STOPPED_ON_TIME = 3  # exit code of a sweep --stop-after stopped: resumable, not failed


def register(subparsers: argparse._SubParsersAction) -> None:
    train = subparsers.add_parser("train", help="train one model (a preset or a model YAML) with live progress")
    train.add_argument("model", nargs="?", default="tiny", help="preset name (tiny, small, base) or model YAML path")
    train.add_argument("--steps", type=int, help="optimizer steps (default: the train spec's)")
    train.add_argument("--seed", type=int, default=0)
    train.add_argument("--set", dest="overrides", action="append", default=[], metavar="FIELD=VALUE",
                       help="override a model field (hidden_size=128) or a train field (train.batch_size=16)")
    train.add_argument("--tracking-uri", help=TRACKING_HELP)
    train.add_argument("--no-tracking", action="store_true", help="do not log to MLflow")
    train.add_argument("--device", help="cpu, cuda, cuda:1 (default: cuda when available)")
    train.add_argument("--kernel-cache", default=None,
                       help="GPU kernel cache folder (default: $K3LAB_KERNEL_CACHE or ~/.cache/k3lab/kernels)")
    train.add_argument("--fidelity", choices=FIDELITIES,
                       help="the design document's choices, official K3's or Kimi Linear's (before --set)")
    train.add_argument("--save", metavar="DIR", help="write the trainer checkpoint there at every evaluation "
                                                     "(for k3lab export)")
    train.add_argument("--verbose", action="store_true", help="MLflow's notices on the terminal, not in the log file")
    train.set_defaults(func=run_train)

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
    sweep.add_argument("--max-failures", type=int, default=2, help="retries of a crashed trial (from its checkpoint)")
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
    report.add_argument("--close", action="store_true",
                        help="end a sweep whose driver died: its parent run and the trials left RUNNING end KILLED "
                             "(--resume continues it instead)")
    report.set_defaults(func=run_report)


# -- k3lab train -----------------------------------------------------------------------

def parse_overrides(items: list[str]) -> tuple[dict, dict]:
    """['hidden_size=128', 'train.steps=50'] -> ({'hidden_size': 128}, {'steps': 50}); values as YAML
    (as sweep files read it: `1e-3` is a number)."""
    from k3lab.registry.yamlfile import load_text

    model, train = {}, {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise UserError(f"--set {item!r}: expected FIELD=VALUE")
        try:
            value = load_text(raw)
        except yaml.YAMLError:
            raise UserError(f"--set {item!r}: the value is not valid YAML") from None
        if key.startswith("train."):
            train[key.removeprefix("train.")] = value
        else:
            model[key] = value
    return model, train


def build_train_inputs(args):
    import attrs

    from k3lab.model.config import KimiK3Config, config_fields
    from k3lab.registry import load_preset
    from k3lab.registry.axes import apply_fidelity
    from k3lab.registry.convert import structure
    from k3lab.registry.fields import check_fields
    from k3lab.registry.keypath import SpecError
    from k3lab.registry.presets import model_fields
    from k3lab.train.spec import TrainSpec

    model_overrides, train_overrides = parse_overrides(args.overrides)
    load_preset(args.model)  # a preset that does not validate is named in its own error
    unknown = sorted(set(model_overrides) - set(config_fields()))
    if unknown:
        raise UserError(f"--set {unknown[0]}: not a KimiK3Config field (train fields are written train.NAME)")
    try:  # typed as a sweep file's base overrides are (a float is a number, not any string)
        model_overrides = check_fields(model_overrides, ())
    except SpecError as error:
        raise UserError(f"--set {error}") from None
    fields = model_fields(args.model, Path.cwd())  # as written: a derived field (layer_types) follows --set num_layers
    if args.fidelity:
        fields |= apply_fidelity(args.fidelity, fields | model_overrides)
    try:
        config = KimiK3Config(**(fields | model_overrides))
    except (ValueError, TypeError) as error:
        raise UserError(f"--set: {error}") from None
    train_fields = {f.name for f in attrs.fields(TrainSpec)}
    unknown = sorted(set(train_overrides) - train_fields)
    if unknown:
        raise UserError(f"--set train.{unknown[0]}: not a train field ({', '.join(sorted(train_fields))})")
    if not 0 <= args.seed <= SEED_MAX:
        raise UserError(f"--seed: must be 0 .. {SEED_MAX}, got {args.seed}")
    if args.steps is not None:
        if args.steps < 1:
            raise UserError(f"--steps: must be positive, got {args.steps}")
        train_overrides["steps"] = args.steps
    defaults = TrainSpec()
    steps = train_overrides.get("steps")
    if isinstance(steps, int):  # keep warmup and eval inside a short run (any other value: an error below)
        train_overrides.setdefault("warmup_steps", min(defaults.warmup_steps, max(0, steps // 10)))
        train_overrides.setdefault("eval_interval", min(defaults.eval_interval, steps))
    try:  # as a sweep file's train section: typed strictly (a bool is true or false, not any string)
        spec = structure(train_overrides, TrainSpec)
    except SpecError as error:
        raise UserError(f"--set {error.under('train')}") from None
    return config, spec


def parse_device(name: str | None):
    """The torch device `--device` names (default: cuda when available)."""
    from k3lab.train.trainer import resolve_device

    try:
        device = resolve_device(name)
    except RuntimeError:
        device = None
    if device is None or device.type not in ("cpu", "cuda"):  # meta, mps, xpu...: k3lab trains on neither
        raise UserError(f"--device {name}: expected cpu, cuda or cuda:N")
    return device


def train_preflight(args, config, spec, tracking_uri: str | None, device, log_file: Path | None):
    """What `k3lab train` needs, for `run_preflight`."""
    from k3lab.runtime.preflight import Preflight

    folders = {"log folder": log_file.parent} if log_file else {}
    if args.save:  # before training, not at its first evaluation; a .pt path is the checkpoint file itself
        folders["--save"] = Path(args.save).parent if args.save.endswith(".pt") else Path(args.save)
    return Preflight(tracking_uri=tracking_uri, train=spec, models={"": config}, folders=folders,
                     gpus=1 if device.type == "cuda" else 0, gpus_from=f"--device {args.device or device}")


class EvalPrinter:
    """`k3lab train`'s reporter: a line per evaluation, and with --save the trainer checkpoint
    (naming the MLflow run: `tracker` is set by run_trial)."""

    def __init__(self, console, save: str | None):
        self.console, self.save, self.tracker = console, save, None

    def on_eval(self, trainer, metrics: dict) -> None:
        from k3lab.tune.reporter import save_with_run_id

        self.console.print(f"step {metrics['step']}: val_loss {metrics['val_loss']:.4f} val_bpb {metrics['val_bpb']:.3f}")
        if self.save:
            save_with_run_id(trainer, self.save, self.tracker)


def run_train(args) -> int:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    from k3lab.store.state import default_storage, tracking_uri_or_default
    from k3lab.runtime.logs import library_logs
    from k3lab.runtime.preflight import run_preflight
    from k3lab.tune.trial import TrialSpec, run_trial

    config, spec = build_train_inputs(args)
    tracking_uri = None if args.no_tracking else tracking_uri_or_default(args.tracking_uri)
    device = parse_device(args.device)
    log_file = None if args.verbose or tracking_uri is None else default_storage() / "train.log"
    run_preflight(train_preflight(args, config, spec, tracking_uri, device, log_file))
    if device.type == "cuda":
        from k3lab.runtime.kernels import open_kernel_cache

        open_kernel_cache(args.kernel_cache, say=Console(stderr=True).print)
    name = Path(args.model).stem
    trial = TrialSpec(variant_id="train", variant_name=name, seed=args.seed, config=config.to_dict(), train=spec,
                      tracking_uri=tracking_uri, experiment="k3lab-train")
    console = Console(stderr=True)
    columns = [TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
               TextColumn("{task.fields[info]}"), TimeRemainingColumn()]
    with library_logs(log_file), Progress(*columns, console=console) as bar:
        task = bar.add_task(f"train {name}", total=spec.steps, info="")

        def progress(step, metrics):
            bar.update(task, completed=step,
                       info=f"loss {metrics['train_loss']:.3f}  {metrics['tokens_per_s']:,.0f} tok/s")

        result, run_id = run_trial(trial, device=device, progress=progress, reporter=EvalPrinter(bar.console, args.save))
    val = "-" if result.val_loss is None else f"{result.val_loss:.4f}"
    speed = "-" if result.average_tokens_per_s is None else f"{result.average_tokens_per_s:,.0f}"
    console.print(f"{result.status}: {result.step} steps, {result.tokens:,} tokens, val_loss {val}, "
                  f"{speed} tokens/s (run average), {result.counts['total']:,} parameters"
                  + (f"; MLflow run {run_id} in {tracking_uri}" if run_id else "")
                  + (f"; checkpoint in {args.save}" if args.save else ""))
    if result.status != "finished":
        console.print(f"[red]{result.error}")
        return 1
    return 0


# -- k3lab sweep / report -----------------------------------------------------------------

def wide_console():
    """A console at least 120 columns wide, so summary tables do not wrap in logs."""
    import shutil

    from rich.console import Console

    return Console(width=max(120, shutil.get_terminal_size().columns))


def sweep_run_from_args(args, **options):
    """The sweep file under its profile, with the storage and tracking store the flags name."""
    from k3lab.registry.commands import load_sweep_for
    from k3lab.store.state import default_storage, tracking_uri_or_default
    from k3lab.tune.run import SweepRun

    if args.storage is not None and not args.storage.strip():
        raise UserError("--storage: names no folder (leave it out for K3LAB_STORAGE or ./k3lab_runs)")
    return SweepRun(sweep=load_sweep_for(args.file, args.profile),
                    storage=Path(args.storage) if args.storage else default_storage(),
                    tracking_uri=tracking_uri_or_default(args.tracking_uri), **options)


def print_summary(console, run, summary: dict) -> None:
    """The per-variant table, the paired comparisons against the baseline, then the report files written."""
    from k3lab.report.summary import summary_table

    metric = summary["metric"]
    console.print(summary_table(summary["rows"], metric, title=f"{run.experiment}: final {metric}"))
    if summary.get("comparisons"):
        from k3lab.report.family import sequential_table

        console.print(sequential_table(summary["comparisons"], metric, summary["design"],
                                       title=f"{run.experiment}: {metric} against the baselines, paired by seed"))
    for line in summary.get("diverged", []):
        console.print(f"diverged: {line}", markup=False, highlight=False)
    if len({row["step"] for row in summary.get("curves", [])}) > 1:
        from k3lab.report.family import curve_table

        console.print(curve_table(summary["curves"], f"{run.experiment}: {metric} - baseline at every evaluation, "
                                                     "% of the baseline's"))
    if summary.get("efficiency"):
        console.print(efficiency_line(summary["efficiency"]))
    for path in summary["files"]:
        console.print(f"wrote {path}")


def efficiency_line(e: dict) -> str:
    """The sweep's hardware use in one line (see k3lab.report.efficiency)."""
    mfu = f"sweep MFU {e['sweep_mfu']:.1%}" if "sweep_mfu" in e else "sweep MFU n/a (no known GPU)"
    times = [f"kernel warm-up {e['kernel_warmup_s']:.1f} s"] if e.get("kernel_warmup_s") else []
    if "trial_startup_s_max" in e:
        times.append(f"trial start-up up to {e['trial_startup_s_max']:.1f} s")
    from k3lab.report.results import parts_note

    parts = parts_note(e.get("sweep_parts", 1))
    return (f"sweep: {e['sweep_tokens']:,.0f} tokens in {e['sweep_wall_s']:.0f} s{parts} = {e['sweep_tokens_per_s']:,.0f} "
            f"tokens/s, {mfu}" + (f"; {', '.join(times)}" if times else "") + shares_clause(e) + crashes_clause(e))


def crashes_clause(e: dict) -> str:
    """Crashed trials that went on from a checkpoint (`k3lab.report.efficiency.crashes`), if any."""
    n = int(e.get("sweep_crashes") or 0)
    return f"; {n} {'crash' if n == 1 else 'crashes'}, each trial restarted from its last checkpoint" if n else ""


def shares_clause(e: dict) -> str:
    """Where the trials' time went (`k3lab.report.efficiency.time_shares`), where it is known."""
    from k3lab.report.efficiency import SHARES

    if "sweep_slots" not in e:
        return ""
    shares = ", ".join(f"{e[f'sweep_share_{name}']:.0%} {SHARE_LABELS.get(name, name)}" for name in SHARES)
    return f"; {e['sweep_slots']:.0f} trials at once spent {shares}"


SHARE_LABELS = {"starting": "starting up"}


def run_sweep_command(args) -> int:
    from k3lab.registry.commands import print_plan, variant_table
    from k3lab.runtime.sigterm import stop_on_sigterm
    from k3lab.tune.sweep import run_sweep

    if args.max_concurrent is not None and args.max_concurrent < 1:
        raise UserError(f"--max-concurrent must be at least 1, got {args.max_concurrent}")
    if args.max_failures < 0:
        raise UserError(f"--max-failures must be 0 or more (retries of a crashed trial), got {args.max_failures}")
    if args.resume and args.overwrite:  # --overwrite would delete the very state --resume continues
        raise UserError("--resume and --overwrite: pass one (--resume continues the earlier run, --overwrite "
                        "discards it)")
    stop_after = stop_after_seconds(args.stop_after)
    run = sweep_run_from_args(args, address=args.address, resume=args.resume, overwrite=args.overwrite,
                              max_failures=args.max_failures, max_concurrent=args.max_concurrent,
                              kernel_cache_dir=args.kernel_cache, command=args.command_line, verbose=args.verbose)
    sweep = run.sweep
    console = wide_console()
    print_plan(console, sweep)
    if args.dry_run:
        from k3lab.runtime.preflight import check_cpu_memory, check_inputs
        from k3lab.tune.sweep import sweep_preflight

        plan = sweep_preflight(run, progress=False)
        check_inputs(plan.train, plan.models, plan.train_from)
        if plan.local:
            check_cpu_memory(plan.models, plan.train, plan.gpus)
        console.print(variant_table(sweep))
        console.print(f"dry run: would log to {run.tracking_uri} (experiment {run.experiment}), "
                      f"Tune state in {run.tune_dir}, resources per trial {sweep.resources.tune_resources()}"
                      + slots_clause(sweep.resources) + sharing_clause(run))
        earlier = earlier_run_line(run)
        if earlier:
            console.print(earlier, markup=False, highlight=False, soft_wrap=True)
        return 0
    def say(line: str) -> None:  # one line as it is: no markup, never wrapped
        console.print(line, markup=False, highlight=False, soft_wrap=True)

    timer = stop_timer(stop_after)
    try:
        with stop_on_sigterm():  # a scheduler's SIGTERM stops it as Ctrl-C does
            summary = run_sweep(run, live=not args.no_live, say=say)  # says where it logs, once the checks pass
    except KeyboardInterrupt:
        return stopped_sweep(args, run, on_time=timer is not None and timer.fired.is_set())
    finally:
        if timer is not None:
            timer.cancel()
    console.line()  # the tables start on a line of their own, after the progress lines or the live table
    print_summary(console, run, summary)
    for error in summary["errors"]:
        console.print(f"[red]trial error: {error}")
    return 1 if summary["errors"] else 0


def stopped_sweep(args, run, on_time: bool) -> int:
    """The exit of a sweep stopped by Ctrl-C, SIGTERM or --stop-after: the `--resume` command that
    continues it where its state was saved, and the exit code (130 for Ctrl-C, re-raised; 143 for
    SIGTERM; 3 for --stop-after, or 1 when it stopped before anything could be resumed)."""
    from k3lab.runtime import sigterm

    terminated = not on_time and sigterm.received.is_set()
    stopped = (f"sweep stopped after {args.stop_after} (--stop-after)" if on_time
               else "sweep stopped by SIGTERM" if terminated else "sweep stopped")
    resumable = run.state_file.exists() and run.tune_dir.exists()  # what --resume needs to go on
    if resumable:
        print(f"{stopped}, its state saved: continue it with `{resume_command(args.command_line)}`",
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


def earlier_run_line(run) -> str | None:
    """For a dry run of a sweep whose seeds policy asks a precision: what the latest run of its
    experiment in this SQLite store says that precision takes per comparison, at the spreads that
    run saw (a server store is not contacted: a dry run starts nothing and asks nobody)."""
    from k3lab.store.tracking import holds_mlflow_runs, sqlite_path

    sweep, path = run.sweep, sqlite_path(run.tracking_uri)
    if not (sweep.adaptive and sweep.seed_policy.until.rule != "max") or path is None or not holds_mlflow_runs(path):
        return None
    from k3lab.report.family import comparisons_for
    from k3lab.report.sequential import pairs_needed_line
    from k3lab.report.summary import load_trials
    from k3lab.store.runs import latest_sweep_run
    from k3lab.tune.seeds import design_of

    metric = sweep.metric
    try:
        parent = latest_sweep_run(run.tracking_uri, run.experiment)
        if parent is None:
            return None
        records = load_trials(run.tracking_uri, parent, curves=(metric.name,))  # the comparisons only, no report
        comparisons = comparisons_for(records, dict(sweep.baselines), metric.name, metric.mode, design_of(sweep),
                                      metric.last, rise=metric.diverged)
    except Exception as error:  # an estimate only: a store it cannot read does not fail the dry run
        return f"earlier run in this store: not read ({type(error).__name__}: {str(error).splitlines()[0][:200]})"
    return pairs_needed_line(comparisons, sweep.seed_policy.max, parent)


def slots_clause(resources) -> str:
    if resources.training_slots is None:
        return ""
    return (f"; at most {resources.training_slots} trials per GPU train at once, the others start up "
            "and wait (resources.training_slots)")


def sharing_clause(run) -> str:
    """How trials that share a GPU will run on it (`k3lab.runtime.mps`), as the sweep would decide now."""
    from k3lab.runtime.mps import sharing_plan

    if not run.shares_gpus:
        return ""
    mps = run.sweep.resources.mps
    kind, detail = sharing_plan(mps, run.on_cluster)
    if kind == "yours":
        return f"; trials on one GPU run side by side through the MPS daemon at {detail}"
    if kind == "own":
        return "; trials on one GPU run side by side through an MPS daemon of the sweep's own (resources.mps)"
    if kind == "nodes":
        return f"; trials on one GPU share it as their node has it ({detail})"
    if mps:
        return f"; resources.mps: true, but {detail}: the sweep would stop before its first trial"
    return f"; trials on one GPU take turns on it ({detail})"


def stop_after_seconds(value: str | None) -> float | None:
    """--stop-after as seconds; a value that is not a positive duration is a one-line error."""
    if value is None:
        return None
    seconds = duration_seconds(value)
    if seconds is None or seconds <= 0:
        raise UserError(f"--stop-after {value}: not a duration (e.g. 10m, 1h30m, 90s)")
    return seconds


class StopTimer(threading.Timer):
    """Stops the sweep as Ctrl-C does (SIGINT to this process: Tune saves its state, running trials
    are checkpointed and end KILLED, `--resume` goes on) once `seconds` have passed; `fired` is set
    before the signal, so the handler that sees it knows it was the timer."""

    def __init__(self, seconds: float):
        self.fired = threading.Event()
        super().__init__(seconds, self.stop)
        self.daemon = True

    def stop(self) -> None:
        self.fired.set()
        os.kill(os.getpid(), signal.SIGINT)


def stop_timer(seconds: float | None) -> StopTimer | None:
    """A started StopTimer for --stop-after, or None without one."""
    if seconds is None:
        return None
    timer = StopTimer(seconds)
    timer.start()
    return timer


def resume_command(command_line: str) -> str:
    """The command that continues a stopped sweep: the same one with --resume (and never --overwrite,
    which would discard what it continues)."""
    words = [word for word in shlex.split(command_line) if word != "--overwrite"]
    return shlex.join(words if "--resume" in words else [*words, "--resume"])


def run_report(args) -> int:
    from k3lab.report.summary import build_report
    from k3lab.tune.parent import present
    from k3lab.runtime.preflight import check_tracking_server

    run = sweep_run_from_args(args)
    out = Path(args.out) if args.out else run.storage / f"{run.experiment}_report"
    check_report_flags(args, run, out)
    check_tracking_server(run.tracking_uri)
    parent_run_id = find_parent_run(run)
    options = report_design(args, run, parent_run_id)
    console = wide_console()
    state = check_interrupted(console, run, parent_run_id, close=args.close)
    summary = build_report(run.tracking_uri, parent_run_id, out_dir=out, baseline=args.baseline or run.sweep.baseline,
                           record=not (args.baseline or args.metric), **options)  # the store keeps the sweep's own
    written = write_results_markdown(args, run, parent_run_id, summary) if args.markdown else None
    with contextlib.suppress(Exception):  # the UI's view and descriptions, as of now
        present(run, parent_run_id, state=state)
    print_summary(console, run, summary)
    if written is not None:
        console.print(written, markup=False, highlight=False, soft_wrap=True)
    return 0


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
    if out.exists() and not out.is_dir():
        raise UserError(f"--out {out}: is a file, not a folder (the report writes its plots and summary.json there)")
    if args.markdown:
        check_markdown(Path(args.markdown), run.experiment)
    if args.gpu_log:
        check_gpu_log(args)
    names = {v.name for v in run.sweep.valid_variants}
    if args.baseline and args.baseline not in names:
        raise UserError(f"--baseline {args.baseline}: not a variant of {args.file} ({', '.join(sorted(names))})")


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
                  + f"; `k3lab sweep {run.sweep.path} {again_flag(run)}` {again_verb(run)}, "
                  f"`k3lab report {run.sweep.path} --close` ends it")
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
    return "--overwrite" if stopped_before_trials(run) else "--resume"


def again_verb(run) -> str:
    return "starts it again" if stopped_before_trials(run) else "continues it"


def find_parent_run(run) -> str:
    """The sweep's parent run: from its state file under --storage, else the latest sweep run
    of its experiment in the tracking store (a store copied from another machine)."""
    from k3lab.store.runs import latest_sweep_run
    from k3lab.store.state import check_parent_run

    if run.state_file.exists():  # its own file and store checks, a damaged state file first
        return check_parent_run(run.state_file, run.tracking_uri)
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
