"""`k3lab train`: one model (a preset or a model YAML) trained in this process, with live progress."""

from __future__ import annotations

import argparse
from pathlib import Path

from k3lab.commands.sweep import TRACKING_HELP
from k3lab.errors import UserError
from k3lab.model.fidelity import FIDELITIES
from k3lab.registry.sections import SEED_MAX


def register(subparsers: argparse._SubParsersAction) -> None:
    train = subparsers.add_parser("train", help="train one model (a preset or a model YAML) with live progress")
    train.add_argument("model", nargs="?", default="tiny", help="preset name (tiny, small, base) or model YAML path")
    train.add_argument("--steps", type=int, help="optimizer steps (default: the train spec's)")
    train.add_argument("--seed", type=int, default=0,
                       help=f"the run's seed, 0 .. {SEED_MAX}: its initial weights and the order of its training "
                            "batches (default 0)")
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


def parse_device(name: str | None):
    """The torch device `--device` names (default: cuda when available)."""
    from k3lab.runner.train.trainer import resolve_device

    try:
        device = resolve_device(name)
    except RuntimeError:
        device = None
    if device is None or device.type not in ("cpu", "cuda"):  # meta, mps, xpu...: k3lab trains on neither
        raise UserError(f"--device {name}: expected cpu, cuda or cuda:N")
    return device


def train_preflight(args, config, spec, tracking_uri: str | None, device, log_file: Path | None):
    """What `k3lab train` needs, for `run_preflight`."""
    from k3lab.runner.runtime.preflight import Preflight

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
        from k3lab.runner.tune.ray_reports import save_with_run_id

        self.console.print(f"step {metrics['step']}: val_loss {metrics['val_loss']:.4f} val_bpb {metrics['val_bpb']:.3f}")
        if self.save:
            save_with_run_id(trainer, self.save, self.tracker)


def run_train(args) -> int:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    from k3lab.registry.train_inputs import build_train_inputs
    from k3lab.store.state import default_storage, tracking_uri_or_default
    from k3lab.runner.runtime.logs import library_logs
    from k3lab.runner.runtime.preflight import run_preflight
    from k3lab.runner.tune.trial import TrialSpec, run_trial

    config, spec = build_train_inputs(args)  # checked: a mistake is one line, before anything starts
    tracking_uri = None if args.no_tracking else tracking_uri_or_default(args.tracking_uri)
    device = parse_device(args.device)
    log_file = None if args.verbose or tracking_uri is None else default_storage() / "train.log"
    run_preflight(train_preflight(args, config, spec, tracking_uri, device, log_file))
    if device.type == "cuda":
        from k3lab.runner.runtime.kernel_cache import open_kernel_cache

        open_kernel_cache(args.kernel_cache, say=Console(stderr=True).print)
    name = Path(args.model).stem
    trial = TrialSpec(variant_id="train", variant_name=name, seed=args.seed, config=config, train=spec,
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
