"""The README's sample output, from a real run: the summary table of the quick-start sweep
(experiments/attnres_block.yaml, cpu profile), rendered by k3lab's own table code from that run's
MLflow store, which is committed as docs/runs/attnres_block-cpu-<date>.db.xz beside the run's output
(<same name>.sweep.log).

    python scripts/readme_sample.py            # exit 1 when README.md differs from the committed store
    python scripts/readme_sample.py --write    # rewrite the README's table from it

After a change that moves the figures (tests/test_readme.py says so), run the sweep again and
commit its store, on a CPU machine, in an empty folder:

    K3LAB_DATA_DIR=/tmp/k3lab-data k3lab sweep experiments/attnres_block.yaml | tee attnres_block-cpu.sweep.log
    xz -9 -c mlflow.db > docs/runs/attnres_block-cpu-DATE.db.xz && cp attnres_block-cpu.sweep.log docs/runs/attnres_block-cpu-DATE.sweep.log
    python scripts/readme_sample.py --write

params and active are the same on any machine; val_loss is the same in every run of the same code
on one CPU (the trials are deterministic) and near it on a CPU of another instruction set (the README
says how near; tests/test_readme.py trains the baseline again and compares); tokens/s depends on the
machine and on what else runs on it.
"""

from __future__ import annotations

import argparse
import io
import lzma
import re
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
SWEEP_FILE = REPO / "experiments" / "attnres_block.yaml"
PROFILE = "cpu"
EXPERIMENT = f"attnres_block-{PROFILE}"
BEGIN = re.compile(r"<!-- readme-sample: (?P<store>\S+) .*?-->\n```\n")
END = "```\n<!-- /readme-sample -->"


def committed_store(readme: str | None = None) -> Path:
    """The store the README's table names (docs/runs/attnres_block-cpu-<date>.db.xz)."""
    match = BEGIN.search(readme if readme is not None else README.read_text())
    if match is None:
        raise SystemExit(f"{README}: no '<!-- readme-sample: STORE -->' block")
    return REPO / match["store"]


def sample_rows(store: Path) -> list[dict]:
    """The summary rows of the sweep's run in `store` (an MLflow SQLite file, or one compressed with xz),
    as `k3lab report` builds them: variants in the sweep file's order, the baseline first."""
    from k3lab.registry.sweep_file import load_sweep
    from k3lab.report.options import ReportOptions
    from k3lab.report.summary import build_report
    from k3lab.store.runs import latest_sweep_run

    sweep = load_sweep(SWEEP_FILE, PROFILE)
    with tempfile.TemporaryDirectory() as folder:
        database = store
        if store.suffix == ".xz":
            database = Path(folder) / "mlflow.db"
            database.write_bytes(lzma.decompress(store.read_bytes()))
        uri = f"sqlite:///{database}"
        parent = latest_sweep_run(uri, EXPERIMENT)
        if parent is None:
            raise SystemExit(f"{store}: no run of {EXPERIMENT}")
        options = ReportOptions(metric=sweep.metric.name, mode=sweep.metric.mode, baseline=sweep.baseline,
                                variant_order=[v.name for v in sweep.valid_variants])
        return build_report(uri, parent, options).rows


def render(rows: list[dict]) -> str:
    """The table as `k3lab sweep` and `k3lab report` print it (trailing spaces dropped)."""
    from rich.console import Console

    from k3lab.report.tables import summary_table

    console = Console(file=io.StringIO(), width=120, color_system=None)
    console.print(summary_table(rows, "val_loss", title=f"{EXPERIMENT}: final val_loss"))
    return "\n".join(line.rstrip() for line in console.file.getvalue().splitlines()) + "\n"


def readme_table(readme: str) -> str:
    """The table between the README's readme-sample markers."""
    match = BEGIN.search(readme)
    if match is None or END not in readme[match.end():]:
        raise SystemExit(f"{README}: no readme-sample block")
    return readme[match.end():readme.index(END, match.end())]


def write(readme: str, table: str, store: Path) -> str:
    """The README with `table` between its markers, and the markers naming `store`."""
    match = BEGIN.search(readme)
    end = readme.index(END, match.end())
    begin = readme[match.start():match.end()].replace(match["store"], store.resolve().relative_to(REPO).as_posix())
    return readme[:match.start()] + begin + table + readme[end:]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="rewrite README.md's table")
    parser.add_argument("--store", type=Path, help="the MLflow store (default: the one the README names)")
    args = parser.parse_args(argv)
    readme = README.read_text()
    store = args.store or committed_store(readme)
    table = render(sample_rows(store))
    if args.write:
        README.write_text(write(readme, table, store))
        print(f"wrote the table of {store} into {README}")
        return 0
    if readme_table(readme) != table:
        print(f"{README}: the sample table differs from {store}; run python scripts/readme_sample.py --write")
        return 1
    print(f"{README}: the sample table is {store}'s")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    sys.exit(main())
