"""The report's comparison table keeps every variant's and baseline's whole name: in a log at its full
width, on a narrow terminal folded onto more lines, never cut to an ellipsis (the MoE ablation's
names, `ffn_latent_moe_top1_shared0`, were printed as `ffn_latent_m…`)."""

import io

from rich.console import Console

from k3lab.report.tables import sequential_table, wide_console
from k3lab.report.sequential import fixed_design
from k3lab.report.stats import Comparison

NAMES = [(f"ffn_latent_moe_top{k}_shared{s}", f"ffn_moe_top{k}_shared{s}") for k in (1, 2) for s in (0, 1)]


def table():
    comparisons = [Comparison(variant, baseline, 4, 4, -0.0989, 0.115, 2.72, "not resolved", "interval covers 0")
                   for variant, baseline in NAMES]
    return sequential_table(comparisons, "val_loss", fixed_design(len(NAMES), 4), "moe: val_loss")


def test_a_log_gets_the_comparison_table_with_whole_names_on_one_line_each():
    out = io.StringIO()
    wide_console(file=out).print(table())  # stdout is not a terminal under pytest: a log's width
    lines = out.getvalue().splitlines()
    assert "…" not in out.getvalue()
    for variant, baseline in NAMES:
        assert any(variant in line and baseline in line for line in lines), variant


def test_a_narrow_terminal_folds_long_names_instead_of_cutting_them():
    out = io.StringIO()
    Console(file=out, width=100).print(table())
    cells = [line.split("│")[1:3] for line in out.getvalue().splitlines() if line.startswith("│")]
    variants = "".join(cell[0].strip() for cell in cells)
    assert "…" not in variants
    assert variants == "".join(variant for variant, _ in NAMES)
