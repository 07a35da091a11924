"""The report's figures as a paper would use them (k3lab.report.plots):
titled with the sweep, intervals on the difference curves, y limits from the later part of
training, tokens without an axis offset, crosses only on trials that stopped early."""

import pytest

from k3lab.report import paired, plots
from k3lab.report.records import TrialRecord

TOKENS_PER_STEP = 2 * 32 * 100_000  # tokens of millions: matplotlib would write "1e7" beside the axis


def record(variant, seed, values, status="FINISHED", steps=(100, 200, 300, 400)):
    curve = list(zip(steps, values))
    return TrialRecord(run_id=f"{variant}-{seed}", variant=variant, seed=seed, status=status,
                       params={"train.batch_size": "2", "train.seq_len": "32", "train.grad_accum": "100000"},
                       final={"val_loss": curve[-1][1]}, start_ms=None, end_ms=None,
                       curves={"val_loss": curve, "train_loss": [(s, v + 1) for s, v in curve]})


def early_gap_records():
    """v is 20% worse at the first evaluation, then about 0.5% better, over three seeds."""
    records = []
    for seed, noise in enumerate([0.0, 0.01, -0.01]):
        base = [3.0 + noise, 2.5 + noise, 2.2 + noise, 2.0 + noise]
        records += [record("base", seed, base),
                    record("v", seed, [3.6 + noise, *(b * (0.995 + 0.001 * seed) for b in base[1:])])]
    return records


@pytest.fixture
def figures(monkeypatch):
    """{file name: the figure} of every plot saved."""
    saved = {}

    def keep(plt, fig, path):
        fig.canvas.draw()
        saved[path.name] = fig
        return path

    monkeypatch.setattr(plots, "save_figure", keep)
    return saved


def curve_figure(figures, tmp_path, title="attnres_block-gpu"):
    rows = paired.curve_differences(early_gap_records(), {"v": "base"}, "val_loss")
    plots.plot_curve_differences(rows, tmp_path / "curve.png", "val_loss", "min", {"v": "C1"}, "95% t", title)
    return figures["curve.png"], rows


def test_the_curve_difference_plot_is_titled_with_the_sweep(figures, tmp_path):
    fig, _ = curve_figure(figures, tmp_path)
    assert "attnres_block-gpu" in fig._suptitle.get_text()


def test_the_curve_difference_plot_draws_each_evaluations_interval(figures, tmp_path):
    fig, rows = curve_figure(figures, tmp_path)
    (ax,) = fig.axes
    bars = [c for c in ax.containers if c.has_yerr]
    assert len(bars) == 1 and len(bars[0].lines[2][0].get_segments()) == len(rows)


def test_the_curve_difference_plots_y_axis_is_set_by_the_later_half_of_training(figures, tmp_path):
    fig, rows = curve_figure(figures, tmp_path)
    low, high = fig.axes[0].get_ylim()
    assert rows[0]["relative"] > 15 and high < 5  # the first evaluation's +20% leaves the axes
    late = [r for r in rows if r["tokens"] >= rows[-1]["tokens"] / 2]
    assert all(low <= r["relative"] - r["relative_half_width"] and r["relative"] + r["relative_half_width"] <= high
               for r in late)


def test_the_tokens_axis_has_no_offset(figures, tmp_path):
    fig, _ = curve_figure(figures, tmp_path)
    axis = fig.axes[0].xaxis
    assert axis.get_offset_text().get_text() == ""
    assert plots.token_count(25_600_000) == "25.6M" and plots.token_count(1.5e9) == "1.5B"


def test_a_cross_marks_only_a_trial_that_stopped_before_the_sweeps_end(figures, tmp_path):
    records = [record("base", 0, [3, 2.5, 2.2, 2.0]),
               record("v", 0, [3, 2.5, 2.2, 2.0], status="KILLED"),  # killed after its last step: not early
               record("w", 0, [3, 2.5], status="KILLED", steps=(100, 200))]
    plots.plot_loss_curves(records, tmp_path / "loss.png", "val_loss", {"base": "C0", "v": "C1", "w": "C2"}, "base",
                           "sweep")
    fig = figures["loss.png"]
    crosses = [line for ax in fig.axes for line in ax.lines if line.get_marker() == "X"]
    assert len(crosses) == 1 and list(crosses[0].get_xdata()) == [200]


def test_the_loss_plots_difference_panels_take_their_y_axis_from_the_later_half(figures, tmp_path):
    plots.plot_loss_curves(early_gap_records(), tmp_path / "loss.png", "val_loss", {"base": "C0", "v": "C1"}, "base",
                           "sweep")
    val = figures["loss.png"].axes[2]
    assert val.get_ylim()[1] < 0.3  # v's +0.6 gap at the first evaluation does not stretch it


def test_the_loss_plots_metric_panel_draws_each_evaluations_interval(figures, tmp_path):
    records = early_gap_records()
    rows = paired.curve_differences(records, {"v": "base"}, "val_loss")
    plots.plot_loss_curves(records, tmp_path / "loss.png", "val_loss", {"base": "C0", "v": "C1"}, "base", "sweep",
                           rows)
    val = figures["loss.png"].axes[2]
    bars = [c for c in val.containers if c.has_yerr]
    assert len(bars) == 1 and len(bars[0].lines[2][0].get_segments()) == len(rows)
    assert "interval" in val.get_title()


def test_a_report_from_stored_baselines_draws_the_loss_plots_differences(figures, tmp_path):
    """The stored design names baselines per variant (no single `baseline`), as `k3lab ui` rebuilds it."""
    from test_ui_verdicts import curve_sweep

    from k3lab.report.options import ReportOptions
    from k3lab.report.summary import build_report

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    parent, _ = curve_sweep(uri)
    options = ReportOptions(baselines={"attnres_bs1": "attnres_off"}, variant_order=["attnres_off", "attnres_bs1"])
    build_report(uri, parent, options, out_dir=tmp_path / "out", record=False)
    val = figures["loss_curves.png"].axes[2]
    assert "minus the baseline attnres_off" in val.get_title()


def test_each_row_of_the_paired_differences_names_its_own_baseline(figures, tmp_path):
    """In a sweep with one baseline per group every row read "minus ffn_moe_top1_shared0", the first
    group's, though three rows were compared with their own counterparts."""
    from test_ui_verdicts import curve_sweep

    from k3lab.report.options import ReportOptions
    from k3lab.report.summary import build_report

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    names = ["attnres_off", "attnres_bs1", "attnres_full", "attnres_bs2"]
    parent, _ = curve_sweep(uri, variants=names, seeds=(0, 1))
    options = ReportOptions(variant_order=names, baselines={"attnres_bs1": "attnres_off", "attnres_bs2": "attnres_full"})
    build_report(uri, parent, options, out_dir=tmp_path / "out", record=False)
    ax = figures["val_loss_vs_baseline.png"].axes[0]
    labels = [tick.get_text() for tick in ax.get_yticklabels()]
    assert [label.split(":")[0] for label in labels] == ["attnres_bs1 − attnres_off", "attnres_bs2 − attnres_full"]
    assert "each row's own baseline" in ax.get_xlabel() and "attnres_off" not in ax.get_title()
