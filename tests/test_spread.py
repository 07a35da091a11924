"""bench/spread.py: a comparison's spread pooled over stored runs, for each verdict metric."""

import lzma
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.spread import pool, spread_rows, table_lines  # noqa: E402
from k3lab.report.sequential import Design, cs_half_width, pairs_needed  # noqa: E402


def test_the_pool_weights_each_store_by_its_pairs_and_leaves_out_stores_of_one_pair():
    two, three, one = [0.01, 0.03], [0.0, 0.02, 0.04], [5.0]
    p = pool([two, three, one])
    assert (p["runs"], p["pairs"], p["df"]) == (2, 5, 3)
    assert p["sd"] ** 2 == pytest.approx((1 * 0.0002 + 2 * 0.0004) / 3)  # variances 0.0002 and 0.0004
    assert p["mean"] == pytest.approx(0.02)  # the one-pair store's 5.0 is not in it
    assert pool([one])["df"] == 0 and pool([one])["sd"] is None


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
        assert final["runs"] == 1 and final["df"] == final["pairs"] - 1
        assert final["sd"] == pytest.approx(pairing[row["comparison"]]["sd_difference"])
        assert final["mean"] == pytest.approx(pairing[row["comparison"]]["mean_difference"])
        assert row["pooled"][2]["sd"] != pytest.approx(final["sd"])  # the mean of the last two evaluations


def test_two_copies_of_a_store_double_the_pairs_and_keep_the_spread(store):
    baselines = {"attnres_bs8": "attnres_off"}
    one, = spread_rows([("a", store)], "val_loss", [1], baselines)
    two, = spread_rows([("a", store), ("b", store)], "val_loss", [1], baselines)
    assert two["pooled"][1]["pairs"] == 2 * one["pooled"][1]["pairs"]
    assert two["pooled"][1]["sd"] == pytest.approx(one["pooled"][1]["sd"])


def test_the_table_plans_pairs_only_where_a_half_width_is_asked_and_marks_comparisons_without_spread():
    rows = [{"comparison": "x - off", "baseline_mean": 1.0,
             "pooled": {1: {"runs": 2, "pairs": 6, "mean": -0.01, "sd": 0.004, "df": 4}}},
            {"comparison": "y - off", "baseline_mean": None,
             "pooled": {1: {"runs": 0, "pairs": 0, "mean": None, "sd": None, "df": 0}}}]
    plain = table_lines(rows, "val_loss", [1], None)
    assert "pairs for" not in plain[0] and plain[2].startswith("| x - off | 2 | 6 | -0.0100 | -1.00% | 0.0040 | 4 |")
    assert plain[3] == "| y - off | 0 | 0 | - | - | - | - |"
    design = Design(comparisons=4, max_pairs=16, start=4, halfwidth=0.0035)
    planned = table_lines(rows, "val_loss", [1], design)
    needed = pairs_needed(0.004, 1.0, design, have=1)  # at the sd of x and the baseline's mean
    assert "pairs for 0.35%" in planned[0] and needed > 4 and f"| ~{needed} |" in planned[2]
    at_max = cs_half_width(16, 15 * 0.004 ** 2, design.alpha, design.precision)  # relative: the baseline's mean is 1
    assert "half-width at 16 pairs" in planned[0] and planned[2].endswith(f"| {at_max:.2%} |")
    assert at_max > 0.0035  # ~22 pairs needed: 16 are not enough
