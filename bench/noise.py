"""Stored AttnRes sweeps on rough data: their verdicts re-judged, where their pairs' spread comes from,
and what cuts it, as pairs to decide.

    python bench/noise.py H200=docs/runs/attnres_block-gpu-paired-2026-12-02.db.xz \
        H100=/work/shared/runs/h100-2026-12-06/attnres_block-gpu-h100.db.xz \
        "H200, deterministic=docs/runs/sweep_ceiling-2026-12-03-det-fresh.db.xz" --write

(stores as .db or .db.xz; the H100 store needs mlflow-skinny 3.18.0 to open)

For each store (one sweep with a stored design, else the attnres_block gpu profile's): (1) every comparison judged under the design the
sweep stored (Gaussian calibration) and under the same design calibrated for skew up to 1.5, as
`k3lab report` now judges a new sweep, with the sample skewness of its paired differences; (2)
the spread of the paired differences at every evaluation of training, and how well the final
difference follows from the one at earlier evaluations (correlation over the seeds): a spread set
early and kept is the seed's training path, one that appears late is late noise; (3) the verdict
metrics a sweep file can ask for instead of the final val_loss (`metric: {name, last}`), each with
its mean difference (to see that it measures the same effect), its spread, and the pairs the
decisions rule would take at that mean and spread (`pairs_needed`), under both calibrations.
"""

from __future__ import annotations

import argparse
import json
import lzma
import math
import shlex
import statistics
import sys
import tempfile
from pathlib import Path

import attrs
import numpy as np
from scipy import stats as scipy_stats

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.report import check_stores, write_section  # noqa: E402
from k3lab.report.calibration import SKEW_COVERED  # noqa: E402
from k3lab.report.paired import values_by_seed  # noqa: E402
from k3lab.report.sequential import NEEDED_CAP, Design, compare_family, pairs_needed  # noqa: E402
from k3lab.report.stats import paired_seeds  # noqa: E402

DOC = Path(__file__).resolve().parent.parent / "docs" / "statistics.md"
SECTION = "Stored AttnRes sweeps on rough data"
OPTIONS = (("val_loss", 1), ("val_loss", 2), ("val_loss", 3), ("train_loss", 20), ("train_loss", 40))


def unpacked(path: str) -> Path:
    """The SQLite file of a store given as .db or .db.xz (unpacked once beside the system's temp files)."""
    if not path.endswith(".xz"):
        return Path(path).resolve()
    target = Path(tempfile.gettempdir()) / "k3lab-noise" / Path(path).name.removesuffix(".xz")
    if not target.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        with lzma.open(path) as packed:
            target.write_bytes(packed.read())
    return target


def load(path: str) -> tuple[dict, list]:
    """(the design JSON the sweep stored with its parent run, its trial records with the curves)."""
    from k3lab.report.summary import load_trials
    from k3lab.store import runs

    uri = f"sqlite:///{unpacked(path)}"
    parent = runs.sweep_runs(uri)[0]
    records = load_trials(uri, parent.info.run_id, curves=("val_loss", "train_loss"))
    if "k3lab.design" in parent.data.tags:
        return json.loads(parent.data.tags["k3lab.design"]), records
    return file_design(parent.data.tags["k3lab.baseline"], {r.variant for r in records}), records


def file_design(baseline: str, variants: set[str]) -> dict:
    """For a store that stored no design (a run of some of the gpu profile's variants): the gpu
    profile's design, Gaussian-calibrated as the stored ones, its variants against `baseline`."""
    from k3lab.registry.sweep_cli import load_sweep_for
    from k3lab.runner.tune.seeds import design_of

    sweep = load_sweep_for(str(Path(__file__).resolve().parent.parent / "experiments/attnres_block.yaml"), "gpu")
    design = attrs.evolve(design_of(sweep), skew=0.0, level=None).calibrated()
    return {"design": design.to_json(), "baselines": {v: baseline for v in sweep.baselines if v in variants},
            "metric": sweep.metric.name, "mode": sweep.metric.mode, "last": sweep.metric.last,
            "rise": sweep.metric.diverged}


def designs(stored: dict) -> dict[str, Design]:
    """The stored design (as the sweep ran) and the same design calibrated for skew."""
    design = Design.from_json(stored["design"])
    return {"stored (Gaussian)": design,
            f"skew {SKEW_COVERED:g}": attrs.evolve(design, skew=SKEW_COVERED, level=None).calibrated()}


def differences(records: list, baselines: dict[str, str], metric: str, last: int) -> dict[str, tuple[list, float]]:
    """comparison -> (its paired differences over the seeds, the baseline's mean over them)."""
    values = values_by_seed(records, metric, last)
    found = {}
    for variant, baseline in baselines.items():
        mine, theirs = values.get(variant, {}), values.get(baseline, {})
        seeds = paired_seeds(mine, theirs)
        found[variant] = ([mine[s] - theirs[s] for s in seeds],
                          statistics.fmean(theirs[s] for s in seeds) if seeds else math.nan)
    return found


def skewness(diffs: list[float]) -> str:
    return f"{scipy_stats.skew(diffs, bias=False):+.2f}" if len(diffs) >= 3 else "n/a"


def verdict_lines(stored: dict, records: list) -> list[str]:
    baselines, chosen = stored["baselines"], designs(stored)
    values = values_by_seed(records, stored["metric"], stored.get("last", 1), stored["mode"], stored.get("rise"))
    judged = {name: compare_family(values, baselines, stored["mode"], d) for name, d in chosen.items()}
    diffs = differences(records, baselines, stored["metric"], stored.get("last", 1))
    lines = ["| comparison | pairs | mean difference | skewness of the differences | "
             + " | ".join(f"{name} (level {100 * d.nominal:.3g}%): interval, verdict" for name, d in chosen.items())
             + " |", "|---|---|---|---|" + "---|" * len(chosen)]
    for variant in baselines:
        rows = [next(c for c in judged[name] if c.variant == variant) for name in chosen]
        first = rows[0]
        cells = [f"{variant} - {baselines[variant]}", str(first.pairs),
                 f"{first.mean_diff:+.4f}" if first.mean_diff is not None else "n/a", skewness(diffs[variant][0])]
        cells += [f"[{c.low:+.4f}, {c.high:+.4f}] {c.verdict}" if c.half_width is not None else c.verdict
                  for c in rows]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def trajectory_lines(stored: dict, records: list) -> list[str]:
    """The sd over seeds of the paired val_loss difference at each evaluation, and the correlation
    of the final difference with earlier ones."""
    baselines = stored["baselines"]
    curves: dict[str, dict[int, dict[int, float]]] = {}
    for r in records:
        if r.status == "FINISHED":
            curves.setdefault(r.variant, {})[r.seed] = dict(r.curves.get("val_loss", []))
    steps = sorted({s for seeds in curves.values() for c in seeds.values() for s in c})
    head = ["comparison", "pairs", *(f"sd at {s}" for s in steps), "corr(final, at %d)" % steps[len(steps) // 2],
            "corr(final, at %d)" % steps[-2], "sd of the variant's own values (final)",
            "sd of the baseline's (final)"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for variant, baseline in baselines.items():
        mine, theirs = curves.get(variant, {}), curves.get(baseline, {})
        seeds = [s for s in sorted(mine.keys() & theirs.keys()) if all(t in mine[s] and t in theirs[s] for t in steps)]
        if len(seeds) < 3:
            continue
        d = np.array([[mine[s][t] - theirs[s][t] for t in steps] for s in seeds])
        middle, before = np.corrcoef(d[:, -1], d[:, len(steps) // 2])[0, 1], np.corrcoef(d[:, -1], d[:, -2])[0, 1]
        lines.append("| " + " | ".join([f"{variant} - {baseline}", str(len(seeds)),
                                        *(f"{x:.4f}" for x in d.std(0, ddof=1)), f"{middle:+.2f}", f"{before:+.2f}",
                                        f"{statistics.stdev(mine[s][steps[-1]] for s in seeds):.4f}",
                                        f"{statistics.stdev(theirs[s][steps[-1]] for s in seeds):.4f}"]) + " |")
    return lines


def option_lines(stored: dict, records: list) -> list[str]:
    """Per verdict metric a sweep file can ask for: mean difference (% of the baseline), sd, and
    pairs to decide under each calibration."""
    baselines, chosen = stored["baselines"], designs(stored)
    head = ["comparison"] + [f"{metric}, last {last}: mean % / sd % / pairs (" + ", ".join(chosen) + ")"
                             for metric, last in OPTIONS]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    found = {option: differences(records, baselines, *option) for option in OPTIONS}
    for variant, baseline in baselines.items():
        cells = [f"{variant} - {baseline}"]
        for option in OPTIONS:
            diffs, reference = found[option][variant]
            if len(diffs) < 3:
                cells.append("-")
                continue
            mean, sd = statistics.fmean(diffs), statistics.stdev(diffs)
            needed = [pairs_needed(sd, reference, d, have=1, mean=mean) for d in chosen.values()]
            cells.append(f"{100 * mean / reference:+.2f} / {100 * sd / reference:.2f} / "
                         + ", ".join(f"~{n}" if n else f">{NEEDED_CAP}" for n in needed))
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def store_lines(label: str, path: str) -> list[str]:
    stored, records = load(path)
    return [f"### {label}: `{Path(path).name}`", "", "Verdicts, as stored and calibrated for skew:", "",
            *verdict_lines(stored, records), "", "The paired val_loss difference over training (sd over the seeds "
            "at each evaluation; correlation over the seeds of the final difference with earlier ones):", "",
            *trajectory_lines(stored, records), "", "Verdict metrics a sweep file can ask for (`metric: {name, "
            "last}`): mean difference and sd in % of the baseline's, and pairs to decide at that mean and sd:", "",
            *option_lines(stored, records), ""]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("stores", nargs="+", help="LABEL=PATH of an MLflow SQLite store holding one sweep")
    parser.add_argument("--measured-on", default="the machines the stores name", help="where the runs ran")
    parser.add_argument("--write", action="store_true", help="write the tables into docs/statistics.md")
    args = parser.parse_args()
    body = "\n".join(line for label, path in check_stores(parser, args.stores) for line in store_lines(label, path))
    print(body)
    if args.write:
        about = next(part for part in __doc__.split("\n\n") if part.startswith("For each store"))
        write_section(SECTION, about.strip() + "\n\n" + body, command=shlex.join(["python", *sys.argv]), doc=DOC,
                      measured_on=args.measured_on)


if __name__ == "__main__":
    main()
