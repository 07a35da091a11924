"""How wide a sweep's comparisons are, from every stored run of it, for each verdict metric.

    python bench/spread.py "LABEL=STORE.db" "LABEL=STORE.db" ... --file experiments/attnres_block.yaml --last 1,2,3 --write

Each store holds one run of the sweep file's trials. What a sweep's interval sees is the spread
of a *new seed's* paired difference in one run. Stores that re-ran the same seeds measure the same
seed contrasts again, so the differences are grouped by seed, not pooled by store: a one-way
random-effects model on seeds (method of moments) splits their variance into a seed-to-seed part
and a run-to-run part (from the seeds run more than once), and the spread is the square root of
their sum. Its degrees of freedom are those of the seed part: distinct seeds - 1. The columns
`last N` are the spread when the verdicts compare the mean of a trial's last N evaluations
(`metric: {last: N}`) instead of its final value; the planning column is how many pairs the
file's seeds policy (its rule and family of comparisons; `--halfwidth` asks a precision instead)
would take at the mean and spread of the first of them (`k3lab.report.sequential.pairs_needed`),
and the last column the relative half-width its interval would have at the policy's `max` seeds.
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
from k3lab.registry.sweep_cli import load_sweep_for  # noqa: E402
from k3lab.report.paired import values_by_seed  # noqa: E402
from k3lab.report.sequential import NEEDED_CAP, Design, pairs_needed  # noqa: E402
from k3lab.report.stop_rule import HALFWIDTH, MAX  # noqa: E402
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


def store_differences(records: list, metric: str, last: int, baselines: dict[str, str]) -> dict[str, tuple[dict, list]]:
    """{comparison: ({seed: paired difference} over one store, the baseline's values)}."""
    values = values_by_seed(records, metric, last)
    found = {}
    for variant, baseline in baselines.items():
        mine, theirs = values.get(variant, {}), values.get(baseline, {})
        seeds = paired_seeds(mine, theirs)
        found[f"{variant} - {baseline}"] = ({s: mine[s] - theirs[s] for s in seeds}, [theirs[s] for s in seeds])
    return found


def pool(samples: list[dict[int, float]]) -> dict:
    """One comparison's differences, a {seed: difference} per store: the stores that have any, the
    pairs, the distinct seeds, the mean over the seeds' means, and the spread of a new seed's
    difference in one run (seed part + run part, see the module docstring) with its df."""
    by_seed: dict[int, list[float]] = {}
    for sample in samples:
        for seed, difference in sample.items():
            by_seed.setdefault(seed, []).append(difference)
    pairs, seeds = sum(map(len, by_seed.values())), len(by_seed)
    empty = {"runs": sum(1 for d in samples if d), "pairs": pairs, "seeds": seeds, "mean": None, "sd": None, "df": 0}
    if seeds < 2:
        return empty
    means = {seed: statistics.fmean(d) for seed, d in by_seed.items()}
    grand = math.fsum(x for d in by_seed.values() for x in d) / pairs
    between = math.fsum(len(by_seed[s]) * (m - grand) ** 2 for s, m in means.items()) / (seeds - 1)
    if pairs == seeds:  # every seed once: the plain sample variance
        variance = between
    else:
        within = math.fsum((x - means[s]) ** 2 for s, d in by_seed.items() for x in d) / (pairs - seeds)
        n0 = (pairs - math.fsum(len(d) ** 2 for d in by_seed.values()) / pairs) / (seeds - 1)
        variance = max(0.0, (between - within) / n0) + within
    return empty | {"mean": statistics.fmean(means.values()), "sd": math.sqrt(variance), "df": seeds - 1}


def spread_rows(stores: list[tuple[str, str]], metric: str, lasts: list[int], baselines: dict[str, str]) -> list[dict]:
    """A row per comparison: its pooled spread for each `last`, with the first's mean difference
    and the baseline's mean (over the same pairs)."""
    records = [stored_trials(path, metric, None)[1] for _, path in stores]  # each store read once
    by_last = {n: [store_differences(trials, metric, n, baselines) for trials in records] for n in lasts}
    rows = []
    for comparison in (f"{v} - {b}" for v, b in baselines.items()):
        pooled = {n: pool([found[comparison][0] for found in by_last[n]]) for n in lasts}
        reference = [x for found in by_last[lasts[0]] for x in found[comparison][1]]
        rows.append({"comparison": comparison, "pooled": pooled,
                     "baseline_mean": statistics.fmean(reference) if reference else None})
    return rows


def design_for(sweep, halfwidth: float | None) -> Design | None:
    """The sweep's comparisons as its seeds policy makes them (asking `halfwidth` if given); None
    for a policy that runs to max seeds, or a list of seeds, without --halfwidth."""
    policy = sweep.seed_policy
    if halfwidth is None and (policy is None or policy.until.rule == MAX):
        return None
    rule = HALFWIDTH if halfwidth is not None else policy.until.rule
    return Design(comparisons=len(sweep.baselines), max_pairs=policy.max if policy else 16,
                  start=policy.start if policy else 3, rule=rule, margin=sweep.metric.margin,
                  halfwidth=halfwidth if halfwidth is not None else policy.until.halfwidth)


def planning_heads(design: Design, first: int) -> list[str]:
    asked = f"pairs for {design.halfwidth:.2%}" if design.rule == HALFWIDTH else "pairs to decide"
    return [f"{asked} (sd of last {first})", f"half-width at {design.max_pairs} pairs"]


def planning_cells(pooled: dict, reference: float, design: Design) -> list[str]:
    """The pairs the rule would take at this mean and spread, and the half-width at max seeds."""
    needed = pairs_needed(pooled["sd"], reference, design, have=1, mean=pooled["mean"])
    at_max = design.half_width_at(design.max_pairs, pooled["sd"]) / abs(reference)
    return [f"~{needed}" if needed else f">{NEEDED_CAP}", f"{at_max:.2%}"]


def table_lines(rows: list[dict], metric: str, lasts: list[int], design: Design | None) -> list[str]:
    first = lasts[0]
    heads = ["comparison", "runs", "pairs", "distinct seeds", f"mean difference (last {first})", "of the baseline"]
    heads += [f"sd, last {n}" for n in lasts] + ["df"] + (planning_heads(design, first) if design else [])
    lines = ["| " + " | ".join(heads) + " |", "|" + "---|" * len(heads)]
    for r in rows:
        p = r["pooled"][first]
        if not p["df"]:
            lines.append(f"| {r['comparison']} | {p['runs']} | {p['pairs']} | {p['seeds']} |"
                         + " - |" * (len(heads) - 4))
            continue
        cells = [r["comparison"], str(p["runs"]), str(p["pairs"]), str(p["seeds"]), f"{p['mean']:+.4f}",
                 f"{p['mean'] / r['baseline_mean']:+.2%}"]
        cells += [f"{r['pooled'][n]['sd']:.4f}" if r["pooled"][n]["df"] else "-" for n in lasts] + [str(p["df"])]
        if design:
            cells += planning_cells(p, r["baseline_mean"], design)
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
