"""How wide a sweep's comparisons are, from every stored run of it, for each verdict metric.

    python bench/spread.py "LABEL=STORE.db" "LABEL=STORE.db" ... --file experiments/attnres_block.yaml --last 1,2,3 --write

Each store holds one run of the sweep file's trials. Within a store, a comparison's paired
differences spread over its seeds as the sweep's interval sees them (a store needs 2 pairs of a
comparison to count); the rows pool those spreads over the stores, each weighted by its pairs - 1,
so that many short runs give one planning figure with many degrees of freedom. A seed repeated in
another store is not a new seed, so nothing is pooled across stores but the within-store spreads.
The columns `last N` are the spread when the verdicts compare the mean of a trial's last N
evaluations (`metric: {last: N}`) instead of its final value; `pairs for asked` is how many pairs
the file's seeds policy (its family of comparisons and its asked half-width, or `--halfwidth`)
would take at the spread of the first of them (`k3lab.report.sequential.pairs_needed`), and the
last column the relative half-width its interval would have at the policy's `max` seeds.
"""

from __future__ import annotations

import argparse
import math
import shlex
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.pairing import RESULTS, stored_trials  # noqa: E402
from bench.report import check_stores, write_section  # noqa: E402
from k3lab.registry.commands import load_sweep_for  # noqa: E402
from k3lab.report.family import values_by_seed  # noqa: E402
from k3lab.report.sequential import NEEDED_CAP, Design, cs_half_width, pairs_needed  # noqa: E402
from k3lab.report.stats import paired_seeds  # noqa: E402

SECTION = "Spread of the paired differences over stored runs"


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("stores", nargs="+", help="LABEL=PATH of an MLflow SQLite store holding one run of the sweep")
    parser.add_argument("--file", required=True, help="the stores' sweep file: its baselines and seeds policy")
    parser.add_argument("--profile", default="gpu")
    parser.add_argument("--metric", default="val_loss")
    parser.add_argument("--last", default="1,2,3", help="the verdict metrics: the mean of the last N evaluations, "
                                                        "for each N (1: the final value)")
    parser.add_argument("--halfwidth", type=float, help="the relative half-width `pairs for asked` plans for "
                                                        "(default: the seeds policy's until.halfwidth)")
    parser.add_argument("--name", help="the section's title ends with it, so each set of runs keeps its own")
    parser.add_argument("--measured-on", default="the machines the stores name", help="where and when the runs ran")
    parser.add_argument("--write", action="store_true", help="write the table into docs/results.md")
    args = parser.parse_args()
    args.stores = check_stores(parser, args.stores)
    args.last = [int(n) for n in args.last.split(",")]
    return args


def store_differences(records: list, metric: str, last: int, baselines: dict[str, str]) -> dict[str, tuple[list, list]]:
    """{comparison: (paired differences over one store's seeds, the baseline's values)}."""
    values = values_by_seed(records, metric, last)
    found = {}
    for variant, baseline in baselines.items():
        mine, theirs = values.get(variant, {}), values.get(baseline, {})
        seeds = paired_seeds(mine, theirs)
        found[f"{variant} - {baseline}"] = ([mine[s] - theirs[s] for s in seeds], [theirs[s] for s in seeds])
    return found


def pool(samples: list[list[float]]) -> dict:
    """One comparison's differences, a list per store: the stores with 2 pairs or more, their
    pairs, the mean difference over those pairs, and the pooled within-store sd and its df."""
    used = [d for d in samples if len(d) >= 2]
    df = sum(len(d) - 1 for d in used)
    if not df:
        return {"runs": 0, "pairs": 0, "mean": None, "sd": None, "df": 0}
    ss = sum((len(d) - 1) * statistics.variance(d) for d in used)
    return {"runs": len(used), "pairs": sum(map(len, used)), "mean": statistics.fmean(x for d in used for x in d),
            "sd": math.sqrt(ss / df), "df": df}


def spread_rows(stores: list[tuple[str, str]], metric: str, lasts: list[int], baselines: dict[str, str]) -> list[dict]:
    """A row per comparison: its pooled spread for each `last`, with the first's mean difference
    and the baseline's mean (over the same pairs)."""
    records = [stored_trials(path, metric, None)[1] for _, path in stores]  # each store read once
    by_last = {n: [store_differences(trials, metric, n, baselines) for trials in records] for n in lasts}
    rows = []
    for comparison in (f"{v} - {b}" for v, b in baselines.items()):
        pooled = {n: pool([found[comparison][0] for found in by_last[n]]) for n in lasts}
        reference = [x for found in by_last[lasts[0]] if len(found[comparison][0]) >= 2 for x in found[comparison][1]]
        rows.append({"comparison": comparison, "pooled": pooled,
                     "baseline_mean": statistics.fmean(reference) if reference else None})
    return rows


def design_for(sweep, halfwidth: float | None) -> Design | None:
    """The sweep's comparisons as its seeds policy makes them, asking `halfwidth` if given."""
    policy = sweep.seed_policy
    asked = halfwidth if halfwidth is not None else (policy.until.halfwidth if policy and policy.until else None)
    if asked is None:
        return None
    return Design(comparisons=len(sweep.baselines), max_pairs=policy.max if policy else 16,
                  start=policy.start if policy else 3, halfwidth=asked)


def half_width_at(pairs: int, sd: float, design: Design) -> float:
    """The confidence sequence's half-width after `pairs` differences of spread `sd`."""
    return cs_half_width(pairs, (pairs - 1) * sd ** 2, design.alpha, design.precision)


def table_lines(rows: list[dict], metric: str, lasts: list[int], design: Design | None) -> list[str]:
    first = lasts[0]
    heads = ["comparison", "runs", "pairs", f"mean difference (last {first})", "of the baseline"]
    heads += [f"sd, last {n}" for n in lasts] + ["df"]
    heads += [f"pairs for {design.halfwidth:.2%} (sd of last {first})",
              f"half-width at {design.max_pairs} pairs"] if design else []
    lines = ["| " + " | ".join(heads) + " |", "|" + "---|" * len(heads)]
    for r in rows:
        p = r["pooled"][first]
        if not p["df"]:
            lines.append(f"| {r['comparison']} | 0 | 0 |" + " - |" * (len(heads) - 3))
            continue
        cells = [r["comparison"], str(p["runs"]), str(p["pairs"]), f"{p['mean']:+.4f}",
                 f"{p['mean'] / r['baseline_mean']:+.2%}"]
        cells += [f"{r['pooled'][n]['sd']:.4f}" if r["pooled"][n]["df"] else "-" for n in lasts] + [str(p["df"])]
        if design:
            needed = pairs_needed(p["sd"], r["baseline_mean"], design, have=1)
            cells.append(f"~{needed}" if needed else f">{NEEDED_CAP}")
            cells.append(f"{half_width_at(design.max_pairs, p['sd'], design) / abs(r['baseline_mean']):.2%}")
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def main() -> None:
    args = parse_args()
    sweep = load_sweep_for(args.file, args.profile)
    rows = spread_rows(args.stores, args.metric, args.last, sweep.baselines)
    lines = table_lines(rows, args.metric, args.last, design_for(sweep, args.halfwidth))
    print("\n".join(lines))
    if args.write:
        command = shlex.join(["python", "bench/spread.py", *sys.argv[1:]])  # every option, as it was given
        body = __doc__.split("\n\n")[2].strip() + "\n\n" + "\n".join(lines)
        write_section(f"{SECTION} ({args.name})" if args.name else SECTION, body, command=command, doc=RESULTS,
                      measured_on=args.measured_on)


if __name__ == "__main__":
    main()
