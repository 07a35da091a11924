"""The results/report code on a small MLflow store shaped like a sweep's (no training needed)."""

import json
import time

import pytest
from mlflow.entities import Metric, Param, RunTag
from mlflow.tracking import MlflowClient

from k3lab.cli import main
from k3lab.runner.report import build_report, summarize, load_trials
from k3lab.runner.results import busy_fraction, read_gpu_log, results_markdown

VAL_LOSS = {("attnres_off", 0): 2.00, ("attnres_off", 1): 2.02, ("attnres_bs4", 0): 1.96, ("attnres_bs4", 1): 1.98}


@pytest.fixture
def store(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(uri)
    experiment = client.create_experiment("attnres_block-gpu", artifact_location=(tmp_path / "art").as_uri())
    parent = client.create_run(experiment, run_name="attnres_block-gpu", tags={"k3lab.kind": "sweep"}).info.run_id
    t0 = int(time.time() * 1000)
    for (variant, seed), val_loss in VAL_LOSS.items():
        tags = {"mlflow.parentRunId": parent, "k3lab.variant_name": variant, "k3lab.seed": str(seed)}
        run = client.create_run(experiment, run_name=f"{variant}-s{seed}", tags=tags, start_time=t0).info.run_id
        block = "off" if variant == "attnres_off" else "4"
        params = {"params.total": 1000 if block == "off" else 1010, "params.active": 600 if block == "off" else 610,
                  "axis.attn_res_block_size": block}
        metrics = [Metric("train_loss", 3.0 - s / 10, t0 + 10_000 + 1000 * s, s) for s in range(1, 11)]
        metrics += [Metric("val_loss", val_loss, t0 + 21_000, 10), Metric("tokens_per_s", 5000.0 + seed, t0, 10),
                    Metric("startup_s", 10.0 + seed, t0, 1), Metric("tracking_overhead", 0.004, t0, 10),
                    Metric("tokens", 81920, t0, 10)]
        client.log_batch(run, metrics=metrics, params=[Param(k, str(v)) for k, v in params.items()],
                         tags=[RunTag("k3lab.kind", "trial")])
        client.set_terminated(run, "FINISHED", end_time=t0 + 30_000)
    return uri, parent, t0 / 1000, tmp_path


def test_summary_has_mean_and_std_over_seeds(store):
    uri, parent, _, _ = store
    rows = {r["variant"]: r for r in summarize(load_trials(uri, parent))}
    assert rows["attnres_bs4"]["val_loss_mean"] == pytest.approx(1.97)
    assert rows["attnres_bs4"]["val_loss_std"] == pytest.approx(0.01414, rel=1e-3)
    assert rows["attnres_off"]["seeds"] == 2 and rows["attnres_off"]["params_total"] == 1000
    assert rows["attnres_bs4"]["axes"] == {"attn_res_block_size": "4"}


def test_report_writes_plots_with_variants_in_the_sweep_files_order(store):
    uri, parent, _, tmp_path = store
    # alphabetical and by-metric order would both put attnres_bs4 first
    summary = build_report(uri, parent, "val_loss", out_dir=tmp_path / "report",
                           variant_order=["attnres_off", "attnres_bs4"])
    assert [r["variant"] for r in summary["rows"]] == ["attnres_off", "attnres_bs4"]
    assert {p.name for p in summary["files"]} == {"loss_curves.png", "val_loss_by_variant.png",
                                                  "val_loss_vs_params.png", "summary.json"}
    assert all(p.stat().st_size > 1000 for p in summary["files"] if p.suffix == ".png")


def legend_colours(fig) -> dict[str, str]:
    """{variant: colour} of every labelled line or error bar in a figure."""
    from matplotlib.colors import to_hex

    colours = {}
    for ax in fig.axes:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            line = handle.lines[0] if hasattr(handle, "lines") else handle  # an error bar, or a line
            colours[label] = to_hex(line.get_color())
    return colours


def test_report_command_keeps_the_files_order_and_one_colour_per_variant_in_every_plot(store, monkeypatch, capsys):
    from k3lab.runner import report

    uri, parent, _, tmp_path = store
    sweep = tmp_path / "attnres_block.yaml"  # the baseline first, as in the store's runs
    sweep.write_text("name: attnres_block\nbase: tiny\naxes:\n  attn_res_block_size: [off, 4]\n"
                     "profiles:\n  gpu: {seeds: [0, 1]}\n")
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "attnres_block-gpu.k3lab.json").write_text(json.dumps({"parent_run_id": parent}))
    plots, save = {}, report.save_figure

    def save_and_record(plt, fig, path):
        plots[path.name] = legend_colours(fig)
        return save(plt, fig, path)

    monkeypatch.setattr(report, "save_figure", save_and_record)
    assert main(["report", str(sweep), "--profile", "gpu", "--storage", str(tmp_path / "runs"),
                 "--tracking-uri", uri, "--out", str(tmp_path / "report")]) == 0
    summary = json.loads((tmp_path / "report" / "summary.json").read_text())
    assert [row["variant"] for row in summary] == ["attnres_off", "attnres_bs4"]  # not by name, not by loss
    out = capsys.readouterr().out
    assert out.index("attnres_off") < out.index("attnres_bs4")
    assert set(plots) == {"loss_curves.png", "val_loss_by_variant.png", "val_loss_vs_params.png"}
    first = plots["loss_curves.png"]
    assert set(first) == {"attnres_off", "attnres_bs4"} and first["attnres_off"] != first["attnres_bs4"]
    assert all(colours == first for colours in plots.values())


def test_results_markdown_reports_deltas_startup_tracking_and_gpu_busy(store):
    uri, parent, t0, tmp_path = store
    log = tmp_path / "gpu.csv"
    # 0% for the first 10 s (start-up), then busy 90% of the time until the end at 30 s
    log.write_text("".join(f"{t0 + t:.3f},{0 if t < 10 else 90}\n" for t in range(0, 31)))
    text = results_markdown(uri, parent, "AttnRes", gpu_log=log, baseline="attnres_off")
    assert "| attnres_bs4 | 2/2 | 1.9700 ± 0.0141 | -1.99% | 1,010 | 610 | 5,000 | 81,920 |" in text
    assert "mean 10.5 s, max 11.0 s, 42 trial-seconds" in text
    assert "mean 0.40%" in text
    assert "60.0% of the sweep; 90.0% after the first trial's first step" in text


def test_busy_fraction_weights_utilisation_by_time():
    samples = [(0.0, 100.0), (1.0, 0.0), (3.0, 100.0), (4.0, 100.0)]
    assert busy_fraction(samples, 0.0, 4.0) == pytest.approx((1 + 0 + 1) / 4)
    assert busy_fraction(samples, 10.0, 20.0) is None


def test_gpu_log_skips_unparsable_lines(tmp_path):
    log = tmp_path / "gpu.csv"
    log.write_text("1.5,40\nnvidia-smi: garbage\n0.5,20\n")
    assert read_gpu_log(log) == [(0.5, 20.0), (1.5, 40.0)]
