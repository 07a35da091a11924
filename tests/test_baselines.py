"""Baselines by axis values, each variant compared with the baseline of its own group, and the
whole curve: paired differences at every evaluation (k3lab.report.paired), on hand-made records."""

import math
from pathlib import Path

import pytest

from k3lab.report.sequential import fixed_design

from k3lab.cli import main
from k3lab.registry import load_sweep
from k3lab.report.paired import comparisons_for, curve_differences, diverged_step, trial_value
from k3lab.report.plots import plot_curve_differences
from k3lab.report.tables import curve_table_lines, sequential_table_lines
from k3lab.report.sequential import Design
from k3lab.report.summary import TrialRecord
from k3lab.report.stats import BETTER, NOT_RESOLVED, t_interval

ROOT = Path(__file__).resolve().parents[1]

REPO = Path(__file__).resolve().parents[1]
ATTNRES = (REPO / "experiments" / "attnres_block.yaml").read_text()
TWO_AXES = ATTNRES.replace("  attn_res_block_size: [off, full, 2, 4, 8]\n",
                           "  attn_res_block_size: [off, full, 2, 4, 8]\n  num_experts_per_token: [1, 2]\n")


def write(tmp_path, text, name="two.yaml"):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_a_second_axis_with_the_old_baseline_name_says_how_to_name_it(tmp_path, capsys):
    assert main(["variants", str(write(tmp_path, TWO_AXES)), "--profile", "cpu"]) == 2
    err = capsys.readouterr().err
    assert "baseline: no variant named 'attnres_off'" in err and "attnres_off_top1" in err
    assert "name it by axis values instead, e.g. baseline: {attn_res_block_size: ...}" in err
    assert err.count("\n") == 1


def test_a_baseline_by_axis_values_gives_every_group_its_own(tmp_path, capsys):
    path = write(tmp_path, TWO_AXES.replace("baseline: attnres_off ", "baseline: {attn_res_block_size: off} "))
    sweep = load_sweep(path, "cpu")
    assert sweep.baselines == {f"attnres_{b}_top{k}": f"attnres_off_top{k}"
                               for b in ("full", "bs2", "bs4", "bs8") for k in (1, 2)}
    assert list(sweep.baselines)[:2] == ["attnres_full_top1", "attnres_full_top2"]  # the file's order
    assert sweep.baseline == "attnres_off_top1"  # the first group's, for tags and old readers
    assert main(["variants", str(path), "--profile", "cpu"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert ("baselines: attn_res_block_size=off in each group of the other axes' values "
            "(2 groups: attnres_off_top1, attnres_off_top2)") in out


def test_a_second_axis_without_a_baseline_compares_each_group_with_its_own_and_says_so(tmp_path, capsys):
    """It compared every variant with the first standard-residual variant (attnres_off_top1, also for
    the top-2 variants), and neither `variants` nor `--dry-run` named it."""
    path = write(tmp_path, TWO_AXES.replace("baseline: attnres_off ", "# "))
    sweep = load_sweep(path, "cpu")
    assert sweep.baselines == {f"attnres_{b}_top{k}": f"attnres_off_top{k}"
                               for b in ("full", "bs2", "bs4", "bs8") for k in (1, 2)}
    printed = ("baselines: attn_res_block_size=off in each group of the other axes' values "
               "(2 groups: attnres_off_top1, attnres_off_top2)")
    assert main(["variants", str(path), "--profile", "cpu"]) == 0
    assert printed in " ".join(capsys.readouterr().out.split())
    assert main(["sweep", str(path), "--profile", "cpu", "--dry-run", "--storage", str(tmp_path / "runs")]) == 0
    assert printed in " ".join(capsys.readouterr().out.split())


def test_without_a_baseline_the_first_axis_is_compared_and_a_variant_in_no_group_meets_the_first_baseline(capsys):
    """moe_ablation: latent MoE against plain MoE at the same top-k and shared expert; the explicit
    `dense` variant (in no group of the axes) against the first variant."""
    path = REPO / "experiments" / "moe_ablation.yaml"
    sweep = load_sweep(path, "cpu")
    assert sweep.baselines == {f"ffn_latent_moe_top{k}_shared{s}": f"ffn_moe_top{k}_shared{s}"
                               for k in (1, 2) for s in (0, 1)} | {"dense": "ffn_moe_top1_shared0"}
    assert main(["variants", str(path), "--profile", "cpu"]) == 0
    assert "baseline: ffn_moe_top1_shared0 for dense (in no group of the axes)" in capsys.readouterr().out


def test_variants_and_dry_run_name_the_one_baseline(tmp_path, capsys):
    path = REPO / "experiments" / "attnres_block.yaml"
    assert main(["variants", str(path), "--profile", "cpu"]) == 0
    assert "baseline: attnres_off\n" in capsys.readouterr().out
    assert main(["sweep", str(path), "--profile", "cpu", "--dry-run", "--storage", str(tmp_path / "runs")]) == 0
    assert "baseline: attnres_off\n" in capsys.readouterr().out


def test_the_one_axis_file_keeps_its_name_form():
    sweep = load_sweep(REPO / "experiments" / "attnres_block.yaml", "cpu")
    assert sweep.baseline == "attnres_off"
    assert sweep.baselines == {v: "attnres_off" for v in ("attnres_full", "attnres_bs2", "attnres_bs4", "attnres_bs8")}


@pytest.mark.parametrize("baseline, message", [
    ("{num_experts: 2}", "baseline.num_experts: not an axis of the sweep (axes: attn_res_block_size, "
                         "num_experts_per_token)"),
    ("{attn_res_block_size: 16}", "baseline.attn_res_block_size: 16 is not one of the axis' values (off, full, 2, 4, 8)"),
    ("{attn_res_block_size: of}", "baseline.attn_res_block_size: expected a block size"),
    ("{}", "baseline: must name at least one axis value"),
    ("[off]", "baseline: expected a variant name or a mapping of axis names to values"),
])
def test_a_wrong_baseline_names_the_field_and_the_rule(tmp_path, capsys, baseline, message):
    path = write(tmp_path, TWO_AXES.replace("baseline: attnres_off ", f"baseline: {baseline} "))
    assert main(["variants", str(path), "--profile", "cpu"]) == 2
    err = capsys.readouterr().err
    assert f"error: {path}: {message}" in err and err.count("\n") == 1


def test_an_explicit_variant_without_a_baseline_in_its_group_is_left_out_with_a_note(tmp_path):
    text = TWO_AXES.replace("baseline: attnres_off ", "baseline: {attn_res_block_size: off} ").replace(
        "seeds: [0, 1]", "variants:\n  - {name: wide, attn_res_block_size: 4, hidden_size: 128}\nseeds: [0, 1]")
    sweep = load_sweep(write(tmp_path, text), "cpu")
    assert "wide" not in sweep.baselines and any("wide is not compared" in note for note in sweep.notes)


def test_the_gpu_profiles_of_the_two_axis_file_load_with_groups(tmp_path):
    path = write(tmp_path, TWO_AXES.replace("baseline: attnres_off ", "baseline: {attn_res_block_size: off} "))
    for profile in ("gpu", "gpu2"):
        assert len(set(load_sweep(path, profile).baselines.values())) == 2


# -- comparisons and curves from records ---------------------------------------------------------


def record(variant, seed, final, curve=(), status="FINISHED"):
    points = list(curve) or [(4, final + 0.5), (8, final)]
    return TrialRecord(run_id=f"{variant}-{seed}", variant=variant, seed=seed, status=status,
                       params={"train.batch_size": "2", "train.seq_len": "32", "train.grad_accum": "1"},
                       final={"val_loss": final}, start_ms=None, end_ms=None, curves={"val_loss": points})


def grouped_records():
    """Two groups (top1, top2), each with its baseline; bs4 is better by 0.1 in top1 only."""
    records = []
    for seed, noise in enumerate([0.0, 0.01, -0.01, 0.02]):
        records += [record("off_top1", seed, 2.0 + noise), record("bs4_top1", seed, 1.9 + noise + 0.001 * seed),
                    record("off_top2", seed, 3.0 + noise), record("bs4_top2", seed, 3.0 + noise + 0.01 * (-1) ** seed)]
    return records


def test_each_variant_is_compared_with_its_own_groups_baseline():
    baselines = {"bs4_top1": "off_top1", "bs4_top2": "off_top2"}
    rows = comparisons_for(grouped_records(), baselines, "val_loss", "min")
    assert [(c.variant, c.baseline) for c in rows] == list(baselines.items())
    diffs = [-0.1 + 0.001 * s for s in range(4)]
    level = fixed_design(2, 4).levels[1][0]  # one look at 4 seeds, both open: Holm's first, shape-calibrated
    mean, half = t_interval(diffs, confidence=1 - level)
    assert rows[0].mean_diff == pytest.approx(mean) and rows[0].half_width == pytest.approx(half)
    assert rows[0].verdict == BETTER and rows[1].verdict == NOT_RESOLVED
    assert rows[0].relative == pytest.approx(mean / 2.005)  # the baseline of its own group


def test_a_family_table_says_which_intervals_and_shows_each_baseline():
    design = Design(comparisons=2, max_pairs=4, start=2, halfwidth=0.01)
    rows = comparisons_for(grouped_records(), {"bs4_top1": "off_top1", "bs4_top2": "off_top2"}, "val_loss", "min",
                           design)
    lines = sequential_table_lines(rows, "val_loss", design)
    assert ("family-wise 95% repeated t-intervals of a group-sequential design (Pocock's boundary: every look from 2 "
            "to 4 pairs") in lines[0] and "Bonferroni over 2 comparisons" in lines[0]
    assert lines[2].startswith("| variant | baseline | pairs |")
    assert lines[4].startswith("| bs4_top1 | off_top1 | 4/4 |")


def test_the_verdict_metric_may_be_the_mean_of_the_last_evaluations():
    r = record("v", 0, 2.0, curve=[(2, 3.0), (4, 2.4), (6, 2.2), (8, 2.0)])
    assert trial_value(r, "val_loss") == 2.0
    assert trial_value(r, "val_loss", last=3) == pytest.approx((2.4 + 2.2 + 2.0) / 3)
    assert trial_value(r, "val_loss", last=5) is None  # fewer evaluations than asked
    assert trial_value(record("v", 0, 2.0, status="FAILED"), "val_loss") is None


def test_the_whole_curve_pairs_every_evaluation_and_shows_an_early_lead(tmp_path):
    records = []
    for seed, noise in enumerate([0.0, 0.02, -0.01]):  # helps early (-0.1 at step 4), not at the end
        records += [record("base", seed, 2.0 + noise, [(4, 3.0 + noise), (8, 2.0 + noise)]),
                    record("v", seed, 2.0 + noise + 0.001 * seed, [(4, 2.9 + noise - 0.001 * seed), (8, 2.0 + noise + 0.001 * seed)])]
    rows = curve_differences(records, {"v": "base"}, "val_loss")
    assert [(r["step"], r["tokens"], r["pairs"]) for r in rows] == [(4, 256, 3), (8, 512, 3)]
    early, late = rows
    assert early["difference"] == pytest.approx(-0.101) and early["relative"] == pytest.approx(-0.101 / 3.00333 * 100,
                                                                                               rel=1e-4)
    assert early["relative"] + early["relative_half_width"] < 0 < late["relative"] + late["relative_half_width"]
    lines = curve_table_lines(rows, "val_loss", "95% t-interval")
    assert lines[2] == "| variant | 256 | 512 |" and lines[4].startswith("| v vs base | -3.36% ± ")
    path = plot_curve_differences(rows, tmp_path / "curve.png", "val_loss", "min", {"v": "C1"}, "95% t")
    assert path.exists() and path.stat().st_size > 1000


def test_curve_intervals_follow_the_design_and_say_where_there_is_none():
    records = []
    for seed in range(3):
        records += [record("base", seed, 2.0 + 0.1 * seed), record("v", seed, 1.9 + 0.1 * seed + 0.01 * seed)]
    design = Design(1, 4, 2)
    rows = curve_differences(records, {"v": "base"}, "val_loss", design)
    diffs = [-0.1 + 0.01 * s for s in range(3)]
    assert rows[-1]["half_width"] == pytest.approx(design.half_width(diffs))
    assert design.half_width(diffs) > t_interval(diffs)[1]  # wider than one fixed look's 95% t
    one = curve_differences(records[:2], {"v": "base"}, "val_loss", design)
    assert all(r["half_width"] is None and r["relative_half_width"] is None for r in one)  # 1 pair: none
    assert not math.isnan(rows[-1]["relative"])


@pytest.mark.parametrize("curve, step", [
    ([(20, 1.9), (40, 1.6), (60, 1.48), (80, 4.68), (100, 2.2), (160, 1.90)], 80),  # blew up, came part-way back
    ([(20, 1.5), (40, 1.3), (60, 1.19), (80, 1.19), (160, 1.99)], 160),  # blew up at the last evaluation
    ([(20, 1.5), (40, float("nan")), (60, 1.2)], 40),  # not finite
    ([(20, 3.0), (40, 2.5), (60, 2.6), (80, 2.4)], None),  # a bump of 4%: noise, not divergence
])
def test_a_curve_that_rises_far_above_its_own_best_diverged(curve, step):
    assert diverged_step(curve, "min", 0.2) == step
    assert trial_value(record("v", 0, curve[-1][1], curve=curve), "val_loss", rise=0.2) is (
        None if step is not None else curve[-1][1])


def test_without_a_rise_only_a_loss_that_is_not_finite_diverged():
    assert diverged_step([(20, 1.48), (80, 4.68), (160, 1.9)], "min", None) is None
    assert diverged_step([(20, 1.48), (80, float("inf"))], "min", None) == 80


def test_a_cpu_trial_that_blew_up_but_trained_every_step_is_named_diverged_and_left_out(tmp_path):
    """docs/runs/blowup-cpu.db.xz: `k3lab sweep docs/runs/blowup-cpu.yaml` on a CPU, a learning rate
    warming up to 3.0 over all 16 steps. attnres_off's loss went infinite (FAILED); attnres_bs1's
    rose from 7.38 to 24.3 at step 6 and 65.8 at its end, and the run called it FINISHED."""
    import lzma

    from k3lab.report.summary import build_report, stored_options
    from k3lab.store import runs

    db = tmp_path / "blowup.db"
    db.write_bytes(lzma.decompress((ROOT / "docs/runs/blowup-cpu.db.xz").read_bytes()))
    uri = f"sqlite:///{db}"
    parent = runs.sweep_runs(uri)[0].info.run_id
    summary = build_report(uri, parent, stored_options(uri, parent))
    assert summary.diverged == ["attnres_bs1 seed 0: diverged at step 6 (val_loss 24.28 after a best of 7.383); "
                                   "left out of the pairs"]
    row, = summary.comparisons
    assert (row.variant, row.pairs, row.seeds) == ("attnres_bs1", 0, 1)
    assert {r.variant: r.status for r in summary.records} == {"attnres_off": "FAILED", "attnres_bs1": "FINISHED"}


def test_a_stored_design_gives_the_comparisons_back_in_the_sweep_files_order(tmp_path):
    from k3lab.report.options import ReportOptions, from_record
    from k3lab.store import runs
    from k3lab.store.tracking import MLflowTracker

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    parent = MLflowTracker.start(uri, "order", "order")
    order = ["off", "full", "bs2", "bs8"]
    options = ReportOptions(baselines={v: "off" for v in order[1:]}, variant_order=order)
    runs.write_design(uri, parent.run_id, options.to_record())
    record = runs.read_design(uri, runs.client(uri).get_run(parent.run_id))
    assert list(record["baselines"]) == ["bs2", "bs8", "full"]  # the tag's JSON has its keys sorted
    assert list(from_record(record).baselines) == ["full", "bs2", "bs8"]


def test_a_sweeps_report_options_come_back_from_its_stored_record_except_the_baseline(tmp_path):
    """The parent run keeps how its sweep compares (`ReportOptions.to_record`), so `k3lab report`
    and the UI judge a stored sweep under the design it ran with; the single baseline is the sweep
    file's or --baseline's, not stored."""
    import attrs

    from k3lab.report.options import from_record
    from k3lab.runner.tune.seeds import report_options
    from k3lab.store import runs
    from k3lab.store.tracking import MLflowTracker

    sweep = load_sweep(ROOT / "experiments" / "attnres_block.yaml", "gpu")
    options = report_options(sweep)
    assert options.design is not None and options.baselines and options.baseline == sweep.baseline
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    parent = MLflowTracker.start(uri, "stored", "stored")
    runs.write_design(uri, parent.run_id, options.to_record())
    record = runs.read_design(uri, runs.client(uri).get_run(parent.run_id))
    assert record["stored_by"] == "sweep" and "baseline" not in record
    stored = from_record(record)
    assert stored.design.to_json() == options.design.to_json()  # the level it computed, now written down
    assert attrs.evolve(stored, design=None) == attrs.evolve(options, baseline=None, design=None)
