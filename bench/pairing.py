"""How much pairing by seed takes out of a sweep's comparisons, store by store.

    python bench/pairing.py "sequential init=docs/runs/a.db" "paired init=docs/runs/b.db" --write

For each store (one sweep; each variant against its group's baseline in `--file`, else against
the one baseline its parent run names) and each comparison, over the seeds where both trials
finished: the seed-to-seed spread of the variant
and of the baseline, their correlation across seeds, and the spread of the paired differences,
which is what a comparison's interval is made of. `removed` is 1 - var(difference) /
(var(variant) + var(baseline)): the share of an unpaired comparison's variance that pairing by
seed removes (0 when the two arms vary independently). A last row per store pools the
comparisons' variances of the differences (each weighted by its pairs - 1).

Between two stores, the ratio of the pooled variances is an F statistic with the pooled
degrees of freedom; its one-sided p-value says how surprising the smaller spread would be if
both came from the same spread. That is the before/after of a change to the pairing, such as
`train.init: paired` (k3lab.runner.train.init).
"""

from __future__ import annotations

import argparse
import math
import shlex
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.report import check_stores, write_section  # noqa: E402
from k3lab.registry.sweep_cli import load_sweep_for  # noqa: E402
from k3lab.report.stats import SeedValues, paired_seeds  # noqa: E402

RESULTS = Path(__file__).resolve().parent.parent / "docs" / "results.md"

SECTION = "Pairing: how much of the seed-to-seed spread pairing by seed removes"


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("stores", nargs="+", help="LABEL=PATH of an MLflow SQLite store holding one sweep")
    parser.add_argument("--metric", default="val_loss")
    parser.add_argument("--file", help="the stores' sweep file: each variant is compared with its group's baseline "
                                       "(`baseline: {axis: value}`); without it, with the parent run's one baseline")
    parser.add_argument("--profile", default="gpu", help="with --file: the profile whose baselines to take")
    parser.add_argument("--seeds", help="only these seeds (e.g. 0,1,2,3), for stores that ran different ones")
    parser.add_argument("--variants", help="only these variants' comparisons (e.g. attnres_full), for stores that "
                                           "ran different variants")
    parser.add_argument("--name", help="what the stores have in common (e.g. `gpu`): the section's title ends with it, "
                                       "so each set of runs keeps a section of its own")
    parser.add_argument("--measured-on", default="the machines the stores name", help="where and when the sweeps ran")
    parser.add_argument("--write", action="store_true", help="write the table into docs/results.md")
    args = parser.parse_args()
    args.stores = check_stores(parser, args.stores)
    return args


def stored_trials(path: str, metric: str, seeds: set[int] | None) -> tuple[str, list]:
    """(the baseline its parent run names, the trial records with `metric`'s curve) of the one
    sweep in the store (`k3lab.report.summary.load_trials`)."""
    from k3lab.report.summary import load_trials
    from k3lab.store import runs

    uri = f"sqlite:///{Path(path).resolve()}"
    parent = runs.sweep_runs(uri)[0]
    records = [r for r in load_trials(uri, parent.info.run_id, curves=(metric,)) if seeds is None or r.seed in seeds]
    return parent.data.tags["k3lab.baseline"], records


def paired_values(path: str, metric: str, seeds: set[int] | None) -> tuple[str, dict[str, dict[int, float | None]]]:
    """(the baseline its parent run names, {variant: {seed: final metric}}) of the one sweep in the
    store; None for a trial that did not finish (`k3lab.report.paired.values_by_seed`)."""
    from k3lab.report.paired import values_by_seed

    baseline, records = stored_trials(path, metric, seeds)
    return baseline, values_by_seed(records, metric)


def comparison_row(variant: SeedValues, baseline: SeedValues) -> dict | None:
    """The spreads of one comparison over its paired seeds; None below 3 pairs."""
    seeds = paired_seeds(variant, baseline)
    if len(seeds) < 3:
        return None
    v, b = [variant[s] for s in seeds], [baseline[s] for s in seeds]
    d = [x - y for x, y in zip(v, b)]
    var_v, var_b, var_d = statistics.variance(v), statistics.variance(b), statistics.variance(d)
    rho = statistics.correlation(v, b) if var_v > 0 and var_b > 0 else float("nan")
    return {"pairs": len(seeds), "sd_variant": math.sqrt(var_v), "sd_baseline": math.sqrt(var_b), "rho": rho,
            "sd_difference": math.sqrt(var_d), "removed": 1 - var_d / (var_v + var_b),
            "mean_difference": statistics.fmean(d), "baseline_mean": statistics.fmean(b)}


def pooled(rows: list[dict]) -> tuple[float, int]:
    """(pooled variance of the differences, its degrees of freedom)."""
    df = sum(r["pairs"] - 1 for r in rows)
    return sum((r["pairs"] - 1) * r["sd_difference"] ** 2 for r in rows) / df, df


def store_rows(label: str, path: str, metric: str, seeds: set[int] | None,
               baselines: dict[str, str] | None, variants: set[str] | None = None) -> list[dict]:
    """One row per comparison: `baselines` (variant -> its baseline), else every variant against
    the baseline the parent run names; with `variants`, only those variants' comparisons."""
    named, values = paired_values(path, metric, seeds)
    pairs = baselines or {variant: named for variant in sorted(values) if variant != named}
    pairs = {v: b for v, b in pairs.items() if variants is None or v in variants}
    rows = []
    for variant, baseline in pairs.items():
        row = comparison_row(values.get(variant, {}), values.get(baseline, {}))
        if row is not None:
            rows.append({"store": label, "comparison": f"{variant} - {baseline}"} | row)
    return rows


def table_lines(stores: list[tuple[str, list[dict]]], metric: str) -> list[str]:
    lines = [f"| store | comparison | pairs | sd variant | sd baseline | correlation | sd of {metric} difference "
             "| of the baseline | removed by pairing |",
             "|---|---|---|---|---|---|---|---|---|"]
    for label, rows in stores:
        for r in rows:
            lines.append(f"| {label} | {r['comparison']} | {r['pairs']} | {r['sd_variant']:.4f} | "
                         f"{r['sd_baseline']:.4f} | {r['rho']:+.2f} | {r['sd_difference']:.4f} | "
                         f"{r['sd_difference'] / r['baseline_mean']:.2%} | {r['removed']:.0%} |")
        if rows:
            variance, df = pooled(rows)
            lines.append(f"| {label} | pooled | {df} df | | | | {math.sqrt(variance):.4f} | "
                         f"{math.sqrt(variance) / statistics.fmean(r['baseline_mean'] for r in rows):.2%} | |")
    return lines


def ratio_lines(stores: list[tuple[str, list[dict]]]) -> list[str]:
    """Each store's pooled variance against the first's: F and its one-sided p-value."""
    import scipy.stats

    if len(stores) < 2 or not stores[0][1]:
        return []
    (first, first_rows), lines = stores[0], []
    v1, df1 = pooled(first_rows)
    for label, rows in stores[1:]:
        if not rows:
            continue
        v2, df2 = pooled(rows)
        big, small = (v1, v2) if v1 >= v2 else (v2, v1)
        dfs = (df1, df2) if v1 >= v2 else (df2, df1)
        p = float(scipy.stats.f.sf(big / small, *dfs))  # scipy comes with mlflow
        p_text = "< 0.001" if p < 0.001 else f"= {p:.3f}"
        lines.append(f"- {label} against {first}: pooled sd of the differences {math.sqrt(v2):.4f} against "
                     f"{math.sqrt(v1):.4f}, variance ratio {v2 / v1:.2f} (F = {big / small:.2f} on {dfs[0]} and "
                     f"{dfs[1]} df, one-sided p {p_text}); at that spread a comparison needs {v2 / v1:.2f}x "
                     f"the pairs for the same interval.")
    return lines


def main() -> None:
    args = parse_args()
    seeds = {int(s) for s in args.seeds.split(",")} if args.seeds else None
    variants = set(args.variants.split(",")) if args.variants else None
    baselines = load_sweep_for(args.file, args.profile).baselines if args.file else None
    stores = [(label, store_rows(label, path, args.metric, seeds, baselines, variants))
              for label, path in args.stores]
    lines = table_lines(stores, args.metric) + [""] + ratio_lines(stores)
    print("\n".join(lines))
    if args.write:
        command = shlex.join(["python", "bench/pairing.py", *sys.argv[1:]])  # every option, as it was given
        body = __doc__.split("\n\n")[2] + "\n\n" + "\n".join(lines)
        write_section(f"{SECTION} ({args.name})" if args.name else SECTION, body, command=command, doc=RESULTS,
                      measured_on=args.measured_on)


if __name__ == "__main__":
    main()
