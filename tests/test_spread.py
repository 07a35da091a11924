"""bench/spread.py: a comparison's spread pooled over stored runs, for each verdict metric."""

import lzma
import statistics
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.spread import pool, spread_rows, table_lines  # noqa: E402
from k3lab.report.sequential import Design, pairs_needed  # noqa: E402


def test_a_seed_run_again_is_not_a_new_seed():
    """Stores that re-ran seeds 0 and 1 tell the seed part no more than one store: the df are the
    distinct seeds' (here 1), and repeats add only the run-to-run part."""
    once = pool([{0: 0.01, 1: 0.03}])
    assert (once["seeds"], once["df"]) == (2, 1) and once["sd"] ** 2 == pytest.approx(0.0002)
    runs = {0: [0.01, 0.012, 0.009], 1: [0.03, 0.028, 0.031]}
    again = pool([{seed: runs[seed][r] for seed in runs} for r in range(3)])
    assert (again["runs"], again["pairs"], again["seeds"], again["df"]) == (3, 6, 2, 1)
    within = sum(2 * statistics.variance(d) for d in runs.values()) / 4  # run to run, 4 df
    seed_part = statistics.variance([statistics.fmean(d) for d in runs.values()]) - within / 3
    assert again["sd"] ** 2 == pytest.approx(seed_part + within)
    assert pool([{0: 5.0}])["df"] == 0 and pool([{0: 5.0}])["sd"] is None  # one seed: no spread


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("spread") / "paired.db"  # off, full, bs2, bs4 and bs8, seeds 0-6
    path.write_bytes(lzma.decompress((ROOT / "docs/runs/attnres_block-gpu-paired-2026-12-02.db.xz").read_bytes()))
    return str(path)


def test_one_stores_final_spread_is_the_pairing_benchs_and_last_n_averages_the_curve(store):
    from bench.pairing import store_rows

    baselines = {f"attnres_{v}": "attnres_off" for v in ("full", "bs8")}
    rows = spread_rows([("a", store)], "val_loss", [1, 2], baselines)
    pairing = {r["comparison"]: r for r in store_rows("a", store, "val_loss", None, baselines)}
    for row in rows:
        final = row["pooled"][1]
        assert final["runs"] == 1 and final["df"] == final["pairs"] - 1 == final["seeds"] - 1
        assert final["sd"] == pytest.approx(pairing[row["comparison"]]["sd_difference"])
        assert final["mean"] == pytest.approx(pairing[row["comparison"]]["mean_difference"])
        assert row["pooled"][2]["sd"] != pytest.approx(final["sd"])  # the mean of the last two evaluations


def test_two_copies_of_a_store_double_the_pairs_but_not_the_seeds_or_the_df(store):
    baselines = {"attnres_bs8": "attnres_off"}
    one, = spread_rows([("a", store)], "val_loss", [1], baselines)
    two, = spread_rows([("a", store), ("b", store)], "val_loss", [1], baselines)
    assert two["pooled"][1]["pairs"] == 2 * one["pooled"][1]["pairs"]
    assert (two["pooled"][1]["seeds"], two["pooled"][1]["df"]) == (one["pooled"][1]["seeds"], one["pooled"][1]["df"])
    assert two["pooled"][1]["sd"] == pytest.approx(one["pooled"][1]["sd"])


def test_the_table_plans_pairs_only_where_the_rule_stops_and_marks_comparisons_without_spread():
    rows = [{"comparison": "x - off", "baseline_mean": 1.0,
             "pooled": {1: {"runs": 2, "pairs": 6, "seeds": 5, "mean": -0.01, "sd": 0.004, "df": 4}}},
            {"comparison": "y - off", "baseline_mean": None,
             "pooled": {1: {"runs": 0, "pairs": 0, "seeds": 0, "mean": None, "sd": None, "df": 0}}}]
    plain = table_lines(rows, "val_loss", [1], None)
    assert "pairs for" not in plain[0] and plain[2].startswith("| x - off | 2 | 6 | 5 | -0.0100 | -1.00% | 0.0040 | 4 |")
    assert plain[3] == "| y - off | 0 | 0 | 0 | - | - | - | - |"
    design = Design(comparisons=4, max_pairs=16, start=4, halfwidth=0.0035)
    planned = table_lines(rows, "val_loss", [1], design)
    needed = pairs_needed(0.004, 1.0, design, have=1, mean=-0.01)  # at the sd of x and the baseline's mean
    assert "pairs for 0.35%" in planned[0] and needed > 4 and f"| ~{needed} |" in planned[2]
    at_max = design.half_width_at(16, 0.004)  # relative: the baseline's mean is 1
    assert "half-width at 16 pairs" in planned[0] and planned[2].endswith(f"| {at_max:.2%} |")
    decided = table_lines(rows, "val_loss", [1], Design(comparisons=4, max_pairs=16, start=4))
    assert "pairs to decide" in decided[0] and "| ~" in decided[2]  # -1% at sd 0.4%: decided in a few pairs
