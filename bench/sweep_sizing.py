"""Sweep-level throughput of several runs of one sweep, side by side, from their MLflow stores.

    python bench/sweep_sizing.py "4 per GPU=docs/runs/a.db" "2 per GPU=docs/runs/b.db" \
        --measured-on "GPU, DATE" --write

Each store holds one run of a sweep (for example with a different --max-concurrent, or with
NVIDIA MPS on). For each: the parent run's status and wall time, the tokens its trials trained,
aggregate tokens/s and sweep MFU (`k3lab.report.efficiency`, over the GPUs given by --gpus),
the mean tokens/s of one trial, and trial start-up split into build (imports, data, model,
MLflow run) and the first step (compilation from the cache, CUDA-graph capture). A sweep
stopped before its end (status KILLED) still counts what its trials trained until then.
This is how the gpu profiles' trials per GPU were chosen: by measurement, not by guess.

A second table says where the trials' time went (trials at once x wall time): training steps,
evaluations (with their checkpoints and reports), start-ups (each attempt's process start,
build, compile, CUDA-graph capture and first step), and the rest (slots left empty, the steps
a crashed attempt trained past its last checkpoint, trials' closes); see
`k3lab.report.efficiency.time_shares`.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from statistics import mean

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from k3lab.report.efficiency import SHARES, figures_of, sweep_efficiency, time_shares, wall_to_the_end  # noqa: E402

SECTION = "Sweep sizing: trials per GPU"


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("stores", nargs="+", help="LABEL=PATH of an MLflow SQLite store holding one sweep")
    parser.add_argument("--gpus", type=float, default=1.0, help="GPUs each sweep ran on")
    parser.add_argument("--measured-on", default=None, help="machine and date of the runs, when not here and now")
    parser.add_argument("--write", action="store_true", help="write the table into docs/benchmarks.md")
    args = parser.parse_args()
    from bench.report import check_stores

    check_stores(parser, args.stores)
    return args


def sweep_row(label: str, path: str, gpus: float) -> dict:
    """The figures of the one sweep (parent run) in the store at `path`."""
    from k3lab.store import runs

    uri = f"sqlite:///{Path(path).resolve()}"
    parent = runs.sweep_runs(uri)[0]  # the store holds one sweep
    trials = runs.trial_runs(uri, parent.info.run_id)
    device = next((t.data.tags[runs.DEVICE] for t in trials if runs.DEVICE in t.data.tags), None)
    efficiency = parent.data.metrics  # what the sweep's summary printed, when it got that far
    # a sweep run in parts (--resume): its parts' wall times summed
    wall = efficiency.get("sweep_parts_wall_s") or efficiency.get("sweep_wall_s") or wall_to_the_end(
        parent.info.start_time, parent.info.end_time, [t.info.end_time for t in trials])
    if wall is None:
        sys.exit(f"{path}: the sweep has not ended (its parent run and a trial are still open)")
    if "sweep_tokens" not in efficiency:  # stopped before its summary: from the trials' figures
        efficiency = sweep_efficiency(figures_of(trials), wall, gpus, device)
    metrics = [t.data.metrics for t in trials]
    startups = [m["startup_s"] for m in metrics if "startup_s" in m]
    builds = [m["startup_build_s"] for m in metrics if "startup_build_s" in m]
    tags = parent.data.tags
    concurrent = trials_at_once(parent)
    return {"label": label, "sweep": f"{tags.get('k3lab.sweep')} ({tags.get('k3lab.profile')} profile)",
            "status": parent.info.status, "wall_s": wall,
            "finished": sum(t.info.status == "FINISHED" for t in trials), "trials": len(trials),
            "concurrent": concurrent,
            "tokens": efficiency["sweep_tokens"], "tokens_per_s": efficiency["sweep_tokens_per_s"],
            "mfu": efficiency.get("sweep_mfu"),
            "trial_tokens_per_s": mean_or_none([m["avg_tokens_per_s"] for m in metrics if "avg_tokens_per_s" in m]),
            "startup_mean": mean_or_none(startups), "startup_max": max(startups, default=None),
            "build_mean": mean_or_none(builds), "device": device,
            "shares": time_shares(uri, trials, wall, int(concurrent) if concurrent.isdigit() else None)}


def mean_or_none(values: list[float]) -> float | None:
    return mean(values) if values else None


def trials_at_once(parent) -> str:
    """The sweep's max_concurrent_trials; runs before it was logged with --max-concurrent name it in the command."""
    words = parent.data.tags.get("k3lab.command", "").split()
    if "--max-concurrent" in words[:-1]:
        return words[words.index("--max-concurrent") + 1]
    return parent.data.params.get("resources.max_concurrent_trials", "?")


def table(rows: list[dict]) -> str:
    def seconds(x):
        return "-" if x is None else f"{x:.1f}"

    def rate(x):
        return "-" if x is None else f"{x:,.0f}"

    lines = ["| run | trials at once | sweep status | trials finished | wall (s) | tokens | tokens/s | sweep MFU "
             "| tokens/s of one trial (mean) | start-up mean / max (s) | of which build, mean (s) |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        mfu = "-" if r["mfu"] is None else f"{r['mfu']:.1%}"
        lines.append(f"| {r['label']} | {r['concurrent']} | {r['status']} | {r['finished']}/{r['trials']} "
                     f"| {r['wall_s']:.0f} | {r['tokens']:,.0f} | {r['tokens_per_s']:,.0f} | {mfu} "
                     f"| {rate(r['trial_tokens_per_s'])} | {seconds(r['startup_mean'])} / {seconds(r['startup_max'])} "
                     f"| {seconds(r['build_mean'])} |")
    return "\n".join(lines)


def shares_table(rows: list[dict]) -> str:
    lines = ["| run | trials' time (s) | training | evaluations | start-ups | the rest |", "|---|---|---|---|---|---|"]
    for r in rows:
        shares = r["shares"]
        if shares:
            parts = [shares[f"sweep_share_{name}"] for name in SHARES]
            cells = " | ".join(f"{x:.0%}" for x in (*parts, max(0.0, 1 - sum(parts))))
            lines.append(f"| {r['label']} | {r['wall_s'] * shares['sweep_slots']:,.0f} | {cells} |")
    return "\n".join(lines)


def main() -> None:
    args = parse_args()
    rows = [sweep_row(*store.split("=", 1), args.gpus) for store in args.stores]
    devices = sorted({r["device"] for r in rows if r["device"]})
    sweeps = sorted({r["sweep"] for r in rows})
    intro = (f"{', '.join(sweeps)} on {' / '.join(devices) or 'no GPU'}, {args.gpus:g} GPU per sweep; the stores are "
             "the .db.xz files of the same names (`xz -dk`). Wall time: the parent run's, kernel "
             "warm-up and start-up included; a KILLED sweep was stopped before its end and counts the tokens its "
             "trials trained until then. Start-up: from a trial's start to the end of its first step; build: "
             "imports, data, model and MLflow run, before the first step.")
    body = (f"{intro}\n\n{table(rows)}\n\nWhere the trials' time went (trials at once x wall time; "
            f"see the script's docstring):\n\n{shares_table(rows)}\n")
    print(body)
    if args.write:
        from bench.report import write_section

        write_section(SECTION, body, command="python bench/sweep_sizing.py " + " ".join(f'"{s}"' for s in args.stores)
                      + (f" --gpus {args.gpus:g}" if args.gpus != 1 else "")
                      + (f' --measured-on "{args.measured_on}"' if args.measured_on else "") + " --write",
                      measured_on=args.measured_on)


if __name__ == "__main__":
    main()
