"""Where a trial's step spends its GPU time, AttnRes variant by variant: a journal entry.

    python bench/profile_step.py --journal docs/journal/step-profile.md
    python bench/profile_step.py --row small@64x1024:graph:compile:compilemuon:bf16res:kdastates --variants off,full,bs4
    python bench/profile_step.py --from trial.json --journal docs/journal/step-profile.md   # rows bench_trial saved
    python bench/profile_step.py --row tiny@1x16 --steps 1 --warmup 1                      # on CPU: top ops by CPU time

Each variant's row runs as bench/bench_trial.py runs it (its own process, the trial's step,
torch.profiler over 2 steps after the timed ones), or is read from a `bench_trial.py --json` file
(`--from`), so one GPU run can give both the variants' table and this profile. Per variant: the
step's milliseconds and tokens/s against off's, every kernel's GPU time by kind (bench_trial's
KERNEL_KINDS), the AttnRes kernels' share of it, and the top kernels by GPU time. The entry names
the command that wrote it and the card; with --journal it is added to that file as a dated section.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import bench_trial  # noqa: E402
from k3lab.report.markdown import replace_section  # noqa: E402

DEFAULT_ROW = "small@64x1024:graph:compile:compilemuon:bf16res:kdastates"
ATTN_RES_KIND = "AttnRes (k3lab)"
JOURNAL_HEADER = ("# Step profiles by AttnRes variant\n\nDated entries written by bench/profile_step.py, each with "
                  "its command; the current tables are in [docs/benchmarks.md](../benchmarks.md).\n")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--row", default=DEFAULT_ROW, help="bench_trial's PRESET@BxT[:option...], without a variant")
    parser.add_argument("--variants", default="off,full,bs4", help="AttnRes variants: off, full, bsN")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--top", type=int, default=12, help="kernels listed per variant")
    parser.add_argument("--from", dest="source", default=None, metavar="JSON",
                        help="read the rows from a `bench_trial.py --json` file instead of running them")
    parser.add_argument("--code", default="after", help="with --from: the rows of this code (after, or "
                        "bench_trial's --before-label)")
    parser.add_argument("--journal", default=None, help="add the entry to this markdown file")
    args = parser.parse_args()
    for variant in args.variants.split(","):
        bench_trial.parse_row(f"{args.row}:{variant}", parser.error)
    return args


def measured_rows(args: argparse.Namespace) -> tuple[str, list[tuple[str, dict]]]:
    """(card, [(variant, bench_trial's measurement)]) for each variant, run here or read --from."""
    wanted = [f"{args.row}:{v}" for v in args.variants.split(",")]
    if args.source:
        saved = json.loads(Path(args.source).read_text())
        found = {row: r for row, code, r in saved["rows"] if code == args.code}
        return saved["card"], [(row.rsplit(":", 1)[1], found[row]) for row in wanted if row in found]
    options = argparse.Namespace(steps=args.steps, warmup=args.warmup, top=args.top, where="")
    rows = [(row.rsplit(":", 1)[1], bench_trial.run_row(row, options, ROOT)) for row in wanted]
    card = next((r["device"] for _, r in rows if "device" in r), "no row ran")
    return card, rows


def variant_section(variant: str, r: dict, off: dict | None, top: int) -> list[str]:
    """One variant's lines: its step against off's, GPU time by kind, the top kernels."""
    if "error" in r:
        return [f"### {variant}", "", f"failed: {r['error']}", ""]
    total = sum(ms for _, ms, _ in r["kernel_kinds"]) or float("nan")
    attn_res = sum(ms for kind, ms, _ in r["kernel_kinds"] if kind == ATTN_RES_KIND)
    against = (f", {r['tokens_per_s'] / off['tokens_per_s']:.1%} of off's tokens/s, "
               f"{r['step_ms'] - off['step_ms']:+.1f} ms a step against off" if off and off is not r and "error" not in off else "")
    lines = [f"### {variant}", "",
             f"{r['tokens_per_s']:,.0f} tokens/s, {r['step_ms']:.1f} ms a step{against}; kernels "
             f"{total:.1f} ms a step, k3lab's AttnRes kernels {attn_res:.2f} ms of them ({attn_res / total:.1%}).",
             "", "| kind | ms/step | share | calls/step |", "|---|---|---|---|"]
    lines += [f"| {kind} | {ms:.2f} | {ms / total:.1%} | {count:,.0f} |" for kind, ms, count in r["kernel_kinds"]]
    lines += ["", "| kernel (top by time) | ms/step | calls/step |", "|---|---|---|"]
    lines += [f"| `{name[:90]}` | {ms:.2f} | {count:,.0f} |" for name, ms, count in r["top_kernels"][:top]]
    return lines + [""]


def entry(card: str, rows: list[tuple[str, dict]], command: str, top: int, code: str = "after") -> tuple[str, str]:
    """(section name, markdown) of the journal entry."""
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    name = f"Step profile by AttnRes variant, {card}, {date}"
    if code != "after":
        name += f", {code}"
    off = dict(rows).get("off")
    lines = [f"## {name}", "", f"Command: `{command}`", "",
             "Kernel times from torch.profiler over 2 steps after the timed ones (bench/bench_trial.py's "
             "`profile_steps`); on a CPU, the top ops by self CPU time instead. The AttnRes kernels are k3lab's "
             "(`k3lab.ops.attn_res.kernel`); what AttnRes adds outside them (the step against off's) is in the "
             "first line of each variant.", ""]
    for variant, r in rows:
        lines += variant_section(variant, r, off, top)
    return name, "\n".join(lines)


def main() -> None:
    args = parse_args()
    card, rows = measured_rows(args)
    name, text = entry(card, rows, "python " + " ".join(sys.argv), args.top, args.code)
    print(text)
    if args.journal:
        replace_section(args.journal, name, text, header=JOURNAL_HEADER)


if __name__ == "__main__":
    main()
