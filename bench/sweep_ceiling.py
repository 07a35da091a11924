"""A GPU sweep against its own ceiling: a fresh machine, the same machine warm, one trial alone.

    python bench/sweep_ceiling.py experiments/attnres_block.yaml --phase fresh --work /tmp/ceiling
    python bench/sweep_ceiling.py experiments/attnres_block.yaml --phase warm --phase slots --phase alone \
        --work /tmp/ceiling --seeds 0,1 --write

Phases (each adds its figures to WORK/results.json; --write puts every phase measured so far
into docs/benchmarks.md, so a run split over two calls of a lent machine is one table):
- fresh: `k3lab sweep FILE` with an empty kernel cache and data cache (WORK/kernels, WORK/data),
  as on a new machine: what it takes is the shipped tunings and the default corpus. The first
  training step is the earliest trial's `startup_s` metric (logged as its first step ends),
  counted from the command's start.
- warm: the same sweep again on the caches the fresh phase left (a second sweep on one machine).
- slots: the warm sweep with `resources.training_slots: N` added to its profile (`--training-slots`,
  default 2; a copy of the file in WORK): as many trials at once, but only N of them train while
  the others start up (`k3lab.runner.runtime.slots`). Against warm, it says what hiding start-ups gives.
  Kept in results.json as `slots-N`: one row per N measured.
- any sweep phase with `--trials-at-once N`: the same trials, N at a time on the GPU
  (resources.max_concurrent_trials N, gpu 1/N), kept as `PHASE-N-at-once`.
- any sweep phase with `--no-reuse-actors`: the same with `resources.reuse_actors: false` (a new
  process for every trial), kept as `PHASE-noreuse`; with `--no-mps`: with `resources.mps: false`,
  the trials taking turns on the GPU instead of running side by side through the MPS daemon a
  sweep starts where it can (`k3lab.runner.runtime.mps`), kept as `PHASE-nomps`.
- any sweep phase with `--tree DIR --label NAME`: the same, run by the k3lab of another checkout
  (its own folder and store; the caches are shared), kept as `PHASE-NAME`: before and after a
  change, side by side on one machine.
- alone: each variant's first trial (its first seed) alone on the GPU, one after another in one
  process, through the same trial code (`run_trial`, no tracking; `--alone-steps` shortens them).
  A trial's tokens/s over its last log window is what it trains with the GPU to itself. The
  sweep's ceiling is its own trials run so, one at a time: all its tokens over the sum of each
  variant's tokens divided by that variant's rate alone. Variants differ in cost (full-depth
  AttnRes reads every earlier layer), so the baseline's trial alone, the fastest, is no ceiling
  for a sweep of them all; both ratios are reported. So is the sweep's rate from its first
  training step to its end: the rate a sweep of more trials approaches when its start stays
  the same length (no trial trains in the first part of a sweep).
- Every sweep phase also gets an overlap table, from its trials' step-time logs: how long 0, 1,
  2, ... trials trained at once, and their tokens/s together then. It says whether the GPU is
  lost to time-sharing (four training together near their rate alone: not much) or to trials
  that evaluate or start up while the others train.
- `--figures-from PHASE=STORE`: read a phase's store figures again from a copy of its store
  (e.g. one brought back from a lent machine), keeping the phase's command wall and timeline;
  `--merge RESULTS_JSON` adds the phases of another WORK (a fresh phase with caches of its own).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
SECTION = "Sweep ceiling: fresh machine, warm machine, one trial alone"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("file", help="sweep file")
    parser.add_argument("--profile", default="gpu")
    parser.add_argument("--phase", action="append", choices=["fresh", "warm", "slots", "alone"], default=[],
                        help="what to measure (repeatable, in order)")
    parser.add_argument("--work", required=True, help="folder for the caches, stores and results.json")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--training-slots", type=int, default=2, help="N for the slots phase")
    parser.add_argument("--alone-steps", type=int, help="steps of each trial in the alone phase (default: the "
                                                        "profile's); its rate is the last log window's")
    parser.add_argument("--seeds", help="run every phase with these seeds (e.g. 0,1) instead of the profile's "
                                        "seeds policy, so that each phase is the same fixed set of trials")
    parser.add_argument("--trials", type=int, help="run the profile's own seeds policy, stopped after this many "
                                                   "trials (budget.trials; the first stage is start x variants)")
    parser.add_argument("--trials-at-once", type=int, help="run the sweep phases with this many trials at once on "
                                                              "the GPU (a copy of the file; rows PHASE-N-at-once)")
    parser.add_argument("--no-reuse-actors", action="store_true",
                        help="run the sweep phases with resources.reuse_actors: false (rows PHASE-noreuse)")
    parser.add_argument("--no-mps", action="store_true",
                        help="run the sweep phases with resources.mps: false, the trials taking turns on the GPU "
                             "(rows PHASE-nomps)")
    parser.add_argument("--merge", action="append", default=[], metavar="RESULTS_JSON",
                        help="add the phases of another WORK's results.json (e.g. a fresh phase with caches of its own)")
    parser.add_argument("--tree", help="run the sweep phases with the k3lab of this checkout (e.g. the commit before "
                                       "a change, from `git archive`), for a before/after in one run")
    parser.add_argument("--label", help="with --tree: the rows' name suffix, e.g. `before` (a `warm-before` row)")
    parser.add_argument("--write", action="store_true", help="write the table into docs/benchmarks.md")
    parser.add_argument("--figures-from", action="append", default=[], metavar="PHASE=STORE",
                        help="read PHASE's figures from this copy of its MLflow store (sqlite file) into results.json")
    parser.add_argument("--measured-on", help="with --write and no --phase: where and when WORK/results.json was "
                                              "measured, for a table written on another machine")
    return parser.parse_args(argv)


def caches(work: Path) -> dict[str, str]:
    return {"K3LAB_KERNEL_CACHE": str(work / "kernels"), "K3LAB_DATA_DIR": str(work / "data")}


def sweep_file_for(args: argparse.Namespace, work: Path, phase: str) -> str:
    """The sweep file a phase runs: the file itself, or a copy in `work` whose profile has the
    `--seeds` (every phase, so that they run the same trials) or the `--trials` budget, the
    resources of `--trials-at-once`, `--no-reuse-actors` and `--no-mps` and, for the slots phase,
    resources.training_slots."""
    at_once = args.trials_at_once
    if phase != "slots" and args.seeds is None and not at_once and not args.trials and not args.no_reuse_actors \
            and not args.no_mps:
        return args.file
    import yaml

    data = yaml.safe_load(Path(args.file).read_text())
    profile = data.setdefault("profiles", {}).setdefault(args.profile, {})
    if args.seeds is not None:
        profile["seeds"] = [int(seed) for seed in args.seeds.split(",")]
        profile["budget"] = None  # a fixed list of seeds has no policy to budget
    if args.trials:
        profile["budget"] = {"trials": args.trials}  # the policy's own order and decisions, no wall budget
    resources = profile.setdefault("resources", dict(data.get("resources") or {}))
    if phase == "slots":
        resources["training_slots"] = args.training_slots
    if at_once:
        resources.update(max_concurrent_trials=at_once, gpu=round(1 / at_once, 4))
    if args.no_reuse_actors:
        resources["reuse_actors"] = False
    if args.no_mps:
        resources["mps"] = False
    path = work / f"{Path(args.file).stem}-{phase}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return str(path)


def run_sweep(args: argparse.Namespace, work: Path, phase: str) -> dict:
    """One `k3lab sweep` in a fresh storage and store; its wall time, first step and parent metrics."""
    folder = work / phase_key(args, phase)
    store = folder / "mlflow.db"
    file = str(Path(sweep_file_for(args, work, phase)).resolve())
    command = [sys.executable, "-m", "k3lab.cli", "sweep", file, "--profile", args.profile, "--no-live",
               "--storage", str(folder / "k3lab_runs"), "--tracking-uri", f"sqlite:///{store}", "--overwrite"]
    started = time.time()
    tree = Path(args.tree).resolve() if args.tree else ROOT  # `python -m` imports k3lab from its working folder
    code, milestones = run_and_stamp(command, started, env=os.environ | caches(work) | tree_first(tree), cwd=tree)
    wall = time.time() - started
    figures = sweep_figures(store)
    first = figures.pop("first_trial")
    timeline = milestones | ({} if first is None else {
        "first_trial_began_s": first["began_at"] - started, "first_trial_build_s": first["build_s"],
        "first_trial_build_parts": first["build_parts"]})
    return {"phase": phase, "exit": code, "command_wall_s": wall,
            "training_slots": args.training_slots if phase == "slots" else None,
            "trials_at_once": args.trials_at_once,
            "first_step_s": None if first is None else first["first_step_at"] - started, "timeline": timeline, **figures}


def tree_first(tree: Path) -> dict[str, str]:
    """PYTHONPATH with `tree` first: the sweep's Ray workers, which do not start in its working
    folder, import k3lab from the same checkout as its driver."""
    return {"PYTHONPATH": os.pathsep.join([str(tree)] + [p for p in [os.environ.get("PYTHONPATH")] if p])}


MILESTONES = {"kernels:": "warmup_began_s", "kernels: warm in": "warmup_ended_s"}  # the first line that starts so


def run_and_stamp(command: list[str], started: float, env: dict, cwd: Path = ROOT) -> tuple[int, dict[str, float]]:
    """Run the sweep, echoing its output with seconds since `started` in front of each line, and
    note when the driver's milestones (MILESTONES: the kernel warm-up's start and end) appeared."""
    seen: dict[str, float] = {}
    with subprocess.Popen(command, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, bufsize=1) as child:
        for line in child.stdout:
            at = time.time() - started
            print(f"[{at:6.1f} s] {line}", end="", flush=True)
            for start, name in MILESTONES.items():
                if line.startswith(start):
                    seen.setdefault(name, at)
    return child.returncode, seen


def sweep_figures(store: Path) -> dict:
    from k3lab.report.efficiency import crashes
    from k3lab.store import runs
    from k3lab.store.tracking import BUILD_PARTS

    uri = f"sqlite:///{store}"
    parent = runs.sweep_runs(uri)[0]
    trials = runs.trial_runs(uri, parent.info.run_id)
    client = runs.client(uri)
    firsts = []  # per trial with a first step, its first attempt's: when it ended, when it began, its build
    for t in trials:
        startups = client.get_metric_history(t.info.run_id, "startup_s")
        if not startups:
            continue
        m = min(startups, key=lambda metric: metric.timestamp)
        build = {key: client.get_metric_history(t.info.run_id, key) for key in ("startup_build_s", *BUILD_PARTS)}
        build = {key: min(history, key=lambda metric: metric.timestamp).value for key, history in build.items()
                 if history}
        firsts.append({"first_step_at": m.timestamp / 1000, "began_at": m.timestamp / 1000 - m.value,
                       "build_s": build.pop("startup_build_s", None), "build_parts": build})
    keep = ("sweep_wall_s", "sweep_tokens", "sweep_tokens_per_s", "sweep_mfu", "kernel_warmup_s",
            "trial_startup_s_mean", "trial_startup_s_max")
    tokens_by_variant = {}  # variant id: the tokens its trials trained (for the ceiling of the same trials alone)
    for t in trials:
        variant = t.data.tags.get(runs.VARIANT_ID)
        tokens_by_variant[variant] = tokens_by_variant.get(variant, 0) + (t.data.metrics.get("tokens") or 0)
    compiled = compiled_graphs(client, trials)
    first = min(firsts, key=lambda f: f["first_step_at"], default=None)
    metrics = {key: parent.data.metrics.get(key) for key in keep}
    overlap = training_overlap([trial_windows(client, t.info.run_id) for t in trials])
    first_in_sweep = None if first is None else first["first_step_at"] - parent.info.start_time / 1000
    return {"device": next((t.data.tags[runs.DEVICE] for t in trials if runs.DEVICE in t.data.tags), None),
            "trials": len(trials), "finished": sum(t.info.status == "FINISHED" for t in trials),
            "crashes": crashes(trials)["sweep_crashes"],
            "tokens_by_variant": tokens_by_variant, "first_trial": first, **metrics,
            "first_step_in_sweep_s": first_in_sweep,
            "tokens_per_s_after_first_step": after_first_step(metrics["sweep_tokens"], metrics["sweep_wall_s"],
                                                              first_in_sweep),
            "training_overlap": {str(n): figures for n, figures in overlap.items()}, "compiled_graphs": compiled}


COMPILE_COUNTS = ("fxgraph_cache_hits", "fxgraph_cache_misses", "aot_cache_hits", "aot_cache_misses")


def compiled_graphs(client, trials) -> dict[str, float]:
    """torch.compile's cache hits and misses summed over the trials (k3lab.runner.train.diagnostics): at each
    trial's first step (`first_step_*`, its first attempt's) and by its last evaluation
    (`trial_*`, the largest count of any attempt). Misses are graphs a trial compiled because
    the kernel cache did not have them: a fresh sweep that misses did not find them in the
    shipped tunings."""
    sums = {f"{when}_{name}": 0.0 for when in ("first_step", "trial") for name in COMPILE_COUNTS}
    for t in trials:
        for name in COMPILE_COUNTS:
            first = client.get_metric_history(t.info.run_id, f"startup_{name}")
            if first:
                sums[f"first_step_{name}"] += min(first, key=lambda metric: metric.timestamp).value
            whole = client.get_metric_history(t.info.run_id, f"compile_{name}")
            if whole:
                sums[f"trial_{name}"] += max(metric.value for metric in whole)
    return sums


def trial_windows(client, run_id: str) -> list[tuple[float, float, float]]:
    """A trial's training windows from its step-time logs: (start s, end s, tokens/s) for each
    log window but the first (its compile and capture), its steps placed at the window's end
    (what comes before them in the window is its evaluations, checkpoints and logging)."""
    tokens = client.get_metric_history(run_id, "tokens")
    logs = {}
    for m in client.get_metric_history(run_id, "step_time_ms"):  # a restarted trial logs no step twice
        logs.setdefault(m.step, (m.timestamp / 1000, m.value / 1000))
    if not tokens or not logs:
        return []
    per_step = tokens[0].value / tokens[0].step
    steps = sorted(logs)
    windows = []
    for before, step in zip(steps, steps[1:]):
        end, seconds_per_step = logs[step]
        windows.append((end - (step - before) * seconds_per_step, end, per_step / seconds_per_step))
    return windows


def training_overlap(trials: list[list[tuple[float, float, float]]]) -> dict[int, list[float]]:
    """{trials training at once: [seconds of the sweep, their tokens/s together]} over the span
    from the first window's start to the last one's end; trials: each trial's windows
    (start s, end s, tokens/s), as `trial_windows` gives them."""
    windows = [w for trial in trials for w in trial]
    edges = sorted({t for start, end, _ in windows for t in (start, end)})
    totals: dict[int, list[float]] = {}
    for a, b in zip(edges, edges[1:]):
        training = [rate for start, end, rate in windows if start <= a and b <= end]
        seconds, tokens = totals.setdefault(len(training), [0.0, 0.0])
        totals[len(training)] = [seconds + (b - a), tokens + sum(training) * (b - a)]
    return {n: [seconds, tokens / seconds] for n, (seconds, tokens) in sorted(totals.items()) if seconds > 0}


def after_first_step(tokens: float | None, sweep_wall_s: float | None, first_step_s: float | None) -> float | None:
    """The sweep's tokens/s from its first training step's end (first_step_s into the parent run)
    to its end: what is left once the start no trial trains through is taken out. The first
    step's own tokens (one batch) stay in, a rounding at a sweep's size."""
    if None in (tokens, sweep_wall_s, first_step_s) or sweep_wall_s <= first_step_s:
        return None
    return tokens / (sweep_wall_s - first_step_s)


def refresh_figures(results: dict, phase: str, store: Path) -> None:
    """Read `phase`'s store figures again from `store` (a copy of its store), keeping what the
    run itself measured (its command wall, exit, first step and timeline)."""
    if phase not in results:
        sys.exit(f"--figures-from: results.json has no phase {phase!r} (it has {', '.join(results) or 'none'})")
    if not store.is_file():
        sys.exit(f"--figures-from: {store}: no such file")
    figures = sweep_figures(store)
    figures.pop("first_trial")
    results[phase].update(figures)


def run_alone(args: argparse.Namespace, work: Path) -> dict:
    """Each variant's first trial alone, in a child process (this one never touches the GPU)."""
    command = [sys.executable, __file__, args.file, "--profile", args.profile, "--work", str(work), "--child"]
    if args.alone_steps:
        command += ["--alone-steps", str(args.alone_steps)]
    out = subprocess.run(command, env=os.environ | caches(work), cwd=ROOT, stdout=subprocess.PIPE, text=True)
    if out.returncode != 0:
        sys.exit(f"alone: exit {out.returncode} (its output is above)")
    return json.loads(out.stdout.strip().splitlines()[-1])


def alone_child(args: argparse.Namespace) -> dict:
    """One trial of each variant, one after another in this process (so imports are paid once)."""
    import attrs
    import torch

    from k3lab.registry.sweep_cli import load_sweep_for
    from k3lab.runner.runtime.kernel_cache import open_kernel_cache
    from k3lab.runner.tune.trial import TrialSpec, forget_earlier_trial, run_trial

    open_kernel_cache(say=lambda line: print(line, file=sys.stderr))
    sweep = load_sweep_for(args.file, args.profile)
    train = attrs.evolve(sweep.train, steps=args.alone_steps) if args.alone_steps else sweep.train
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    rows = []
    for variant in sweep.valid_variants:
        forget_earlier_trial()
        spec = TrialSpec(variant_id=variant.id, variant_name=variant.name, seed=variant.seeds[0],
                         config=variant.config, train=train, tracking_uri=None, experiment="alone")
        result, _ = run_trial(spec, device=device)
        rows.append({"trial": spec.name, "variant": variant.id, "status": result.status, "tokens": result.tokens,
                     "tokens_per_s_last_window": result.tokens_per_s,
                     "tokens_per_s_run_average": result.average_tokens_per_s, "startup_s": result.startup_s})
        print(f"alone: {json.dumps(rows[-1])}", file=sys.stderr, flush=True)
    return {"phase": "alone", "steps": train.steps, "trials": rows,
            "device": torch.cuda.get_device_name() if device.type == "cuda" else None}


def alone_trials(alone: dict) -> list[dict]:
    """The alone phase's trials; an older results.json kept one, at the top level."""
    return alone.get("trials") or ([alone] if alone.get("trial") else [])


def ceiling_tokens_per_s(sweep: dict, alone: dict) -> float | None:
    """The sweep's tokens/s if its trials ran alone, one at a time: its tokens over the sum of
    each variant's tokens / that variant's rate alone. None where a variant has no rate."""
    rates = {t.get("variant"): t.get("tokens_per_s_last_window") for t in alone_trials(alone)}
    tokens = sweep.get("tokens_by_variant") or {}
    if not tokens or not all(rates.get(v) for v in tokens):
        return None
    return sum(tokens.values()) / sum(n / rates[v] for v, n in tokens.items())


def table(results: dict) -> str:
    def number(x, fmt="{:,.0f}"):
        return "-" if x is None else fmt.format(x)

    lines = ["| phase | exit | trials finished | crashes | command wall (s) | first training step (s) | kernel warm-up (s) "
             "| trial start-up mean / max (s) | sweep tokens/s | sweep MFU |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for name in sweep_phases(results):
        r = results[name]
        if r:
            label = name.replace(f"slots-{r.get('training_slots')}", f"warm, training_slots {r.get('training_slots')}")
            label = re.sub(r"-(\d+)-at-once", r", \1 trials at once", label)
            lines.append(f"| {label} | {r['exit']} | {r['finished']}/{r['trials']} | {number(r.get('crashes'))} "
                         f"| {r['command_wall_s']:.0f} "
                         f"| {number(r['first_step_s'], '{:.1f}')} | {number(r['kernel_warmup_s'], '{:.1f}')} "
                         f"| {number(r['trial_startup_s_mean'], '{:.1f}')} / {number(r['trial_startup_s_max'], '{:.1f}')} "
                         f"| {number(r['sweep_tokens_per_s'])} | {number(r['sweep_mfu'], '{:.1%}')} |")
    notes = []
    if results.get("fresh") and results.get("warm"):
        ratio = results["fresh"]["command_wall_s"] / results["warm"]["command_wall_s"]
        notes.append(f"Fresh against warm, command wall time: {ratio:.2f}x.")
    alone = results.get("alone") or {}
    trials = alone_trials(alone)
    if trials:
        steps = f", {alone['steps']} steps each" if alone.get("steps") else ""
        notes.append(f"Alone, one after another ({len(trials)} trial{'s' if len(trials) > 1 else ''}{steps}; tokens/s over the "
                     "last log window, then over the run): " + "; ".join(
                         f"{t['trial']} ({t['status']}) {number(t['tokens_per_s_last_window'])}, "
                         f"{number(t['tokens_per_s_run_average'])}" for t in trials) + ".")
        first = trials[0]
        for name in sweep_phases(results):
            r = results[name]
            if r and r.get("sweep_tokens_per_s") and first.get("tokens_per_s_last_window"):
                notes.append(f"The {name} sweep's tokens/s against {first['trial']} alone: "
                             f"{r['sweep_tokens_per_s'] / first['tokens_per_s_last_window']:.0%}.")
            ceiling = r and r.get("sweep_tokens_per_s") and ceiling_tokens_per_s(r, alone)
            if ceiling:
                notes.append(f"Against its own trials run alone one at a time ({number(ceiling)} tokens/s): "
                             f"{r['sweep_tokens_per_s'] / ceiling:.0%}.")
                steady = r.get("tokens_per_s_after_first_step")
                if steady:
                    notes.append(f"From its first training step ({r['first_step_in_sweep_s']:.1f} s into the sweep) "
                                 f"to its end: {number(steady)} tokens/s, {steady / ceiling:.0%} of that.")
    return ("\n".join(lines) + ("\n\n" + " ".join(notes) if notes else "") + "\n\n" + timeline_table(results)
            + overlap_table(results) + compiled_table(results))


def compiled_table(results: dict) -> str:
    """Per phase: the graphs its trials loaded from the kernel cache and the ones they compiled
    (`compiled_graphs`), at their first steps and by their last evaluations."""
    phases = [name for name in sweep_phases(results) if (results[name] or {}).get("compiled_graphs")]
    if not phases:
        return ""
    lines = ["", "", "torch.compile's caches, summed over the trials (loaded / compiled: cache hits / misses; at each "
             "trial's first step, then by its last evaluation, evaluation graphs and recompiles included):", "",
             "| phase | FX graphs, first steps | FX graphs, whole trials | AOT autograd, first steps | "
             "AOT autograd, whole trials |", "|---|---|---|---|---|"]
    for name in phases:
        c = results[name]["compiled_graphs"]
        cells = [f"{c[f'{when}_{kind}_cache_hits']:.0f} / {c[f'{when}_{kind}_cache_misses']:.0f}"
                 for kind in ("fxgraph", "aot") for when in ("first_step", "trial")]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def overlap_table(results: dict) -> str:
    """Per phase: how long 0, 1, 2, ... trials trained at once, and the tokens/s they trained
    together then (from the trials' step-time logs, `training_overlap`)."""
    phases = [name for name in sweep_phases(results) if (results[name] or {}).get("training_overlap")]
    if not phases:
        return ""
    columns = 1 + max(int(n) for name in phases for n in results[name]["training_overlap"])
    lines = ["", "", "Trials training at once (from the trials' step-time logs: each log window's steps placed at "
             "its end, a trial's first window left out; share of the time from the first window to the last, and the "
             "tokens/s of the trials training then, together):", "",
             "| phase | " + " | ".join(f"{n} training" for n in range(columns)) + " |", "|---" * (columns + 1) + "|"]
    for name in phases:
        overlap = results[name]["training_overlap"]
        span = sum(seconds for seconds, _ in overlap.values())
        cells = []
        for n in range(columns):
            seconds, rate = overlap.get(str(n), (0.0, 0.0))
            cells.append("-" if not seconds else f"{seconds / span:.0%}" + (f", {rate:,.0f}" if n else ""))
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


KEY_FLAGS = {"noreuse": "no_reuse_actors", "nomps": "no_mps"}  # key suffix: the option that adds it


def phase_key(args: argparse.Namespace, phase: str) -> str:
    """results.json's key (and the phase's folder): slots-N for the slots phase, then -N-at-once
    with --trials-at-once, -noreuse, -nomps, then -LABEL for another checkout's run (--tree, --label)."""
    key = f"slots-{args.training_slots}" if phase == "slots" else phase
    if args.trials_at_once:
        key += f"-{args.trials_at_once}-at-once"
    key += "".join(f"-{suffix}" for suffix, flag in KEY_FLAGS.items() if getattr(args, flag))
    return f"{key}-{args.label}" if args.tree and args.label else key


def sweep_phases(results: dict) -> list[str]:
    """The sweep phases in results, in table order: fresh, warm, then slots-N by N, each before
    its runs by other checkouts (fresh-before after fresh)."""
    order = ("fresh", "warm", "slots")

    def rank(key: str):
        base, _, rest = key.partition("-")
        slots = int(rest.split("-")[0]) if base == "slots" else 0
        return order.index(base), slots, key

    return sorted((k for k in results if k.partition("-")[0] in order), key=rank)


def timeline_steps(r: dict) -> list[float | None]:
    """The first training step's time split at the driver's milestones and the earliest trial's:
    until the kernel warm-up began, the warm-up, until that trial began, its build, the rest."""
    t = r.get("timeline") or {}
    marks = [0.0, t.get("warmup_began_s"), t.get("warmup_ended_s"), t.get("first_trial_began_s")]
    marks.append(None if None in (marks[-1], t.get("first_trial_build_s")) else marks[-1] + t["first_trial_build_s"])
    marks.append(r.get("first_step_s"))
    return [None if None in (a, b) else b - a for a, b in zip(marks, marks[1:])]


def timeline_table(results: dict) -> str:
    lines = ["Where the first training step's time went (s; the trial is the one whose first step ended first):", "",
             "| phase | driver until the kernel warm-up (imports, checks, data, Ray) | kernel warm-up | "
             "until the trial began (Tune, trial process) | trial build (data, model, MLflow run) | "
             "compile, CUDA-graph capture, first step | first training step |",
             "|---|---|---|---|---|---|---|"]
    for name in sweep_phases(results):
        r = results[name]
        if r and r.get("timeline") is not None:
            cells = ["-" if x is None else f"{x:.1f}" for x in timeline_steps(r)]
            parts = r["timeline"].get("first_trial_build_parts") or {}
            if parts:  # the build's parts (k3lab.runner.tune.trial.build_parts), where the trial logged them
                from k3lab.report.results import BUILD_PART_LABELS

                cells[3] += " (" + ", ".join(f"{label} {parts[key]:.1f}" for key, label in BUILD_PART_LABELS.items()
                                             if key in parts) + ")"
            cells = " | ".join(cells)
            first = "-" if r["first_step_s"] is None else f"{r['first_step_s']:.1f}"
            lines.append(f"| {name} | {cells} | {first} |")
    return "\n".join(lines)


def main() -> None:
    args = parse_args()
    work = Path(args.work).resolve()
    if args.child:
        print(json.dumps(alone_child(args)))
        return
    work.mkdir(parents=True, exist_ok=True)
    path = work / "results.json"
    results = json.loads(path.read_text()) if path.is_file() else {}
    for other in args.merge:
        results.update(json.loads(Path(other).read_text()))
    for item in args.figures_from:
        phase, _, store = item.partition("=")
        refresh_figures(results, phase, Path(store))
    if args.merge or args.figures_from:  # once all of them were read: a bad --figures-from leaves the file as it was
        path.write_text(json.dumps(results, indent=1))
    for phase in args.phase:
        key = "alone" if phase == "alone" else phase_key(args, phase)
        results[key] = run_alone(args, work) if phase == "alone" else run_sweep(args, work, phase)
        path.write_text(json.dumps(results, indent=1))
        print(f"{key}: {json.dumps(results[key])}", flush=True)
    device = next((r["device"] for r in results.values() if r.get("device")), "no GPU")
    body = (f"`{args.file}` ({args.profile} profile) on {device}. Fresh: empty kernel and data caches, so the sweep "
            "starts from k3lab's shipped tunings and prepares the corpus; warm: the same sweep again on those caches; "
            "first training step: from the command's start to the end of the earliest trial's first step.\n\n"
            + table(results))
    print(body)
    if args.write:
        from bench.report import write_section

        write_section(SECTION, body, command=commands_for(args, results), measured_on=args.measured_on)


def commands_for(args: argparse.Namespace, results: dict) -> str:
    """The commands that measured `results`: one for this checkout's plain phases, one per
    slots-N row, one per row of another checkout (PHASE-LABEL: --tree, --label)."""
    base = f"python bench/sweep_ceiling.py {args.file} --profile {args.profile} --work WORK" + \
        (f" --seeds {args.seeds}" if args.seeds else "") + (f" --trials {args.trials}" if args.trials else "")
    plain = [k for k in results if "-" not in k]
    steps = (results.get("alone") or {}).get("steps")
    lines = [base + "".join(f" --phase {k}" for k in plain)
             + (f" --alone-steps {steps}" if "alone" in plain and steps else "")] if plain else []
    for key in sweep_phases(results):  # the keys phase_key made: PHASE[-N-at-once][-LABEL], slots-N[...]
        phase, _, rest = key.partition("-")
        slots, _, label = rest.partition("-") if phase == "slots" else ("", "", rest)
        at_once = re.match(r"(\d+)-at-once-?(.*)", label)
        if at_once:
            at_once, label = at_once.groups()
        options = ""
        for suffix, flag in KEY_FLAGS.items():
            if label == suffix or label.startswith(suffix + "-"):
                options += " --" + flag.replace("_", "-")
                label = label[len(suffix) + 1:]
        if rest:
            lines.append(f"{base} --phase {phase}" + (f" --training-slots {slots}" if slots else "")
                         + (f" --trials-at-once {at_once}" if at_once else "") + options
                         + (f" --tree OTHER_CHECKOUT --label {label}" if label else ""))
    return "`, then `".join(lines) + "`, then the same with `--write"


if __name__ == "__main__":
    main()
