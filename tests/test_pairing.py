"""bench/pairing.py: the share of the seed-to-seed spread that pairing by seed removes."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.pairing import comparison_row, pooled, ratio_lines  # noqa: E402


def test_arms_that_move_together_lose_their_whole_spread_to_pairing():
    baseline = {0: 1.10, 1: 1.14, 2: 1.12, 3: 1.16}
    together = {s: v - 0.01 for s, v in baseline.items()}
    row = comparison_row(together, baseline)
    assert row["rho"] == pytest.approx(1.0) and row["sd_difference"] == pytest.approx(0.0, abs=1e-12)
    assert row["removed"] == pytest.approx(1.0) and row["mean_difference"] == pytest.approx(-0.01)


def test_arms_that_move_apart_gain_spread_from_pairing_and_unpaired_seeds_are_left_out():
    baseline = {0: 1.10, 1: 1.14, 2: 1.12, 3: 1.16, 9: 5.0}
    apart = {0: 1.16, 1: 1.12, 2: 1.14, 3: 1.10, 7: 0.0}  # seed 9 and 7 have no partner
    row = comparison_row(apart, baseline)
    assert row["pairs"] == 4 and row["rho"] == pytest.approx(-1.0)
    assert row["removed"] == pytest.approx(-1.0)  # var(d) = 2 (var v + var b) when they move opposite
    assert comparison_row({0: 1.0, 1: 1.1}, {0: 1.0, 1: 1.2}) is None  # fewer than 3 pairs


def test_the_pooled_variance_weights_each_comparison_by_its_pairs_and_the_ratio_is_an_f_test():
    wide = {"pairs": 5, "sd_difference": 0.02}
    narrow = {"pairs": 3, "sd_difference": 0.01}
    variance, df = pooled([wide, narrow])
    assert df == 6 and variance == pytest.approx((4 * 0.02**2 + 2 * 0.01**2) / 6)
    line, = ratio_lines([("before", [wide]), ("after", [narrow])])
    assert "variance ratio 0.25" in line and "F = 4.00 on 4 and 2 df" in line
    assert "p = 0.210" in line  # P(F(4, 2) > 4) = 0.2099


def test_each_variant_is_compared_with_its_groups_baseline_when_the_sweep_file_is_given(tmp_path):
    import lzma

    from bench.pairing import store_rows
    from k3lab.registry.sweep_cli import load_sweep_for

    root = Path(__file__).resolve().parents[1]
    store = tmp_path / "kkkm.db"  # three schedules, each with its own baseline
    store.write_bytes(lzma.decompress((root / "docs/runs/attnres_kkkm-gpu-2026-12-01.db.xz").read_bytes()))
    baselines = load_sweep_for(str(root / "experiments/attnres_kkkm.yaml"), "gpu").baselines
    rows = store_rows("kkkm", str(store), "val_loss", None, baselines)
    assert [r["comparison"] for r in rows] == [f"{v} - {b}" for v, b in baselines.items()]
    assert all(r["pairs"] >= 3 for r in rows)
    tagged = store_rows("kkkm", str(store), "val_loss", None, None)  # the parent run names one baseline
    assert {r["comparison"].split(" - ")[1] for r in tagged} == {"sched_KKKM_attnres_off"}


def test_only_the_named_variants_are_compared_when_variants_are_given(tmp_path):
    import lzma

    from bench.pairing import store_rows

    root = Path(__file__).resolve().parents[1]
    store = tmp_path / "paired.db"  # off, full, bs2, bs4 and bs8, seeds 0-5
    store.write_bytes(lzma.decompress((root / "docs/runs/attnres_block-gpu-paired-2026-12-02.db.xz").read_bytes()))
    every = store_rows("paired", str(store), "val_loss", None, None)
    assert len(every) == 4
    only, = store_rows("paired", str(store), "val_loss", None, None, {"attnres_full"})
    assert only == next(r for r in every if r["comparison"] == "attnres_full - attnres_off")
