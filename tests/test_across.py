"""One file's comparisons across several sweeps (k3lab.report.across, `k3lab report --also`): each
sweep's side by side, and pooled with one pair per distinct seed."""

import json

import pytest

from k3lab.cli import main
from k3lab.report.across import POOLED, Sweep, compare_across, pooled_values
from k3lab.report.records import TrialRecord
from k3lab.store import runs
from k3lab.store.tracking import MLflowTracker

VARIANTS = ("attnres_off", "attnres_full", "attnres_bs2", "attnres_bs4", "attnres_bs8")


def records(values: dict) -> list[TrialRecord]:
    """{(variant, seed): val_loss} -> finished trials."""
    return [TrialRecord(f"{v}-{s}", v, s, "FINISHED", {}, {"val_loss": x}, 0, 1) for (v, s), x in values.items()]


def test_a_seed_in_two_sweeps_is_one_pair_with_its_differences_averaged():
    h200 = Sweep("h200.db", records({("off", 0): 3.0, ("bs4", 0): 2.9, ("off", 1): 3.1, ("bs4", 1): 3.05}))
    h100 = Sweep("h100.db", records({("off", 0): 3.2, ("bs4", 0): 3.0, ("off", 2): 3.0, ("bs4", 2): 2.98,
                                     ("off", 3): 3.0}))  # seed 3: no pair
    variant, baseline = pooled_values([h200, h100], "bs4", "off", "val_loss", "min", 1, None)
    assert sorted(variant) == sorted(baseline) == [0, 1, 2]
    assert variant[0] - baseline[0] == pytest.approx((-0.1 - 0.2) / 2) and baseline[0] == pytest.approx(3.1)
    (row,) = compare_across([h200, h100], {"bs4": "off"}, "val_loss", "min")
    assert [(label, c.pairs) for label, c in row["by_sweep"]] == [("h200.db", 2), ("h100.db", 2)]
    assert row["pooled"].pairs == 3 and row["pooled"].mean_diff == pytest.approx((-0.15 - 0.05 - 0.02) / 3)
    assert row["pooled"].half_width is not None  # three distinct seeds: an interval neither sweep has alone


def store(path, values) -> str:
    uri = f"sqlite:///{path}"
    experiment = "attnres_block-cpu"
    parent = MLflowTracker.start(uri, experiment, experiment, tags=runs.sweep_tags(
        "attnres_block", "cpu", "0", "abc", "", "k3lab sweep experiments/attnres_block.yaml", "attnres_off"))
    for (variant, seed), value in values.items():
        trial = MLflowTracker.start(uri, experiment, f"{variant}-s{seed}", parent_run_id=parent.run_id,
                                    tags=runs.trial_tags(f"id-{variant}", variant, seed))
        trial.log_metrics({"train_loss": 4.0, "val_loss": value}, step=1)
        trial.finish("FINISHED")
    parent.finish("FINISHED")
    return uri


def test_report_also_puts_two_stores_of_one_file_side_by_side_and_pooled(tmp_path, capsys):
    first = store(tmp_path / "h200.db", {(v, s): 3.0 - 0.01 * i + 0.02 * s for i, v in enumerate(VARIANTS)
                                         for s in (0, 1, 2)})
    (tmp_path / "h100").mkdir()
    store(tmp_path / "h100" / "mlflow.db", {(v, s): 3.1 - 0.02 * i + 0.03 * s for i, v in enumerate(VARIANTS)
                                            for s in (1, 2, 3)})
    out = tmp_path / "report"
    code = main(["report", "experiments/attnres_block.yaml", "--profile", "cpu", "--storage", str(tmp_path / "runs"),
                 "--tracking-uri", first, "--also", str(tmp_path / "h100"), "--out", str(out)])
    printed = capsys.readouterr().out
    assert code == 0 and "per sweep and pooled" in printed
    stored = json.loads((out / "across.json").read_text())
    assert [row["variant"] for row in stored] == list(VARIANTS[1:])
    bs8 = stored[-1]
    assert sorted(bs8["by_sweep"]) == ["h100", "h200.db"]
    assert bs8["by_sweep"]["h200.db"]["pairs"] == 3 and bs8[POOLED]["pairs"] == 4  # seeds 0-3
    assert bs8[POOLED]["mean_diff"] == pytest.approx((-0.04 + 2 * (-0.04 - 0.08) / 2 - 0.08) / 4)


def test_report_also_a_store_without_the_sweep_is_one_line(tmp_path, capsys):
    first = store(tmp_path / "a.db", {(v, 0): 3.0 for v in VARIANTS})
    other = MLflowTracker.start(f"sqlite:///{tmp_path / 'b.db'}", "another", "another")
    other.finish("FINISHED")
    code = main(["report", "experiments/attnres_block.yaml", "--profile", "cpu", "--storage", str(tmp_path / "runs"),
                 "--tracking-uri", first, "--also", str(tmp_path / "b.db"), "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 2 and f"--also {tmp_path / 'b.db'}: no sweep of attnres_block-cpu in it" in err
    assert not (tmp_path / "out").exists()  # refused before the report wrote anything


def pooled_sweeps(seeds_a, seeds_b, shift=-0.01) -> list[Sweep]:
    """Two stores of one comparison (bs4 against off) with distinct seeds; bs4 `shift` below off."""
    def one(label, seeds):
        return Sweep(label, records({**{("off", s): 3.0 + 0.01 * (s % 3) for s in seeds},
                                     **{("bs4", s): 3.0 + 0.01 * (s % 3) + shift + 0.002 * (-1) ** s for s in seeds}}))
    return [one("a.db", seeds_a), one("b.db", seeds_b)]


def test_pooled_seeds_of_a_looks_design_use_its_level_at_the_look_at_or_below_their_count():
    """10 distinct seeds under looks 6, 8, 12, 16: one look over all 10 at the look-8 threshold (one
    comparison open), and the interval is the t-interval at that level."""
    from k3lab.report.sequential import Design
    from k3lab.report.stats import t_interval

    design = Design(1, 16, 6, looks=(6, 8, 12, 16)).calibrated()
    sweeps = pooled_sweeps(range(5), range(5, 10))
    (row,) = compare_across(sweeps, {"bs4": "off"}, "val_loss", "min", design)
    level = design.levels[0][1]
    diffs = [-0.01 + 0.002 * (-1) ** s for s in range(10)]
    assert row["pooled"].pairs == 10 and "look at 8 seeds" in row["pooled_design"]
    assert row["pooled"].half_width == pytest.approx(t_interval(diffs, confidence=1 - level)[1])


def test_pooled_seeds_short_of_a_looks_designs_first_look_are_not_decided_and_say_why():
    from k3lab.report.sequential import Design

    design = Design(1, 16, 6, looks=(6, 8, 12, 16)).calibrated()
    (row,) = compare_across(pooled_sweeps(range(2), range(2, 5)), {"bs4": "off"}, "val_loss", "min", design)
    assert row["pooled"].half_width is None and row["pooled"].verdict == "not resolved"
    assert "5 distinct seeds: the design looks from 6" in row["pooled_design"]
