"""The results/report code on a small MLflow store shaped like a sweep's (no training needed)."""

import json
import math
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import bench_script, mini_sweep
from mlflow.entities import Metric, Param, RunTag
from mlflow.tracking import MlflowClient

from k3lab.cli import main
from k3lab.errors import UserError
from k3lab.report.options import ReportOptions
from k3lab.report.summary import build_report, load_trials, summarize
from k3lab.report.results import busy_fraction, load_parent, read_gpu_log, results_markdown
from k3lab.report.stats import t_quantile

VAL_LOSS = {("attnres_off", 0): 2.00, ("attnres_off", 1): 2.02, ("attnres_bs4", 0): 1.96, ("attnres_bs4", 1): 1.98}


def make_store(tmp_path, val_loss: dict, failed: tuple = (), parent_metrics: dict | None = None):
    """A store shaped like a sweep's: a parent run and one trial run per (variant, seed) of `val_loss`;
    trials listed in `failed` end FAILED with a NaN metric. Returns (uri, parent run id, t0 seconds)."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(uri)
    experiment = client.create_experiment("attnres_block-gpu", artifact_location=(tmp_path / "art").as_uri())
    parent_tags = {"k3lab.kind": "sweep", "k3lab.command": "k3lab sweep experiments/attnres_block.yaml --profile gpu",
                   "k3lab.resumed_with": "k3lab sweep experiments/attnres_block.yaml --profile gpu --resume"}
    parent = client.create_run(experiment, run_name="attnres_block-gpu", tags=parent_tags).info.run_id
    train = {"train.steps": 10, "train.batch_size": 16, "train.seq_len": 512, "train.grad_accum": 1}
    client.log_batch(parent, params=[Param(k, str(v)) for k, v in train.items()],
                     metrics=[Metric(k, v, 0, 0) for k, v in (parent_metrics or {}).items()])
    t0 = int(time.time() * 1000)
    for (variant, seed), value in val_loss.items():
        tags = {"mlflow.parentRunId": parent, "k3lab.variant_name": variant, "k3lab.seed": str(seed),
                "k3lab.device": "NVIDIA H200", "k3lab.host": "node-a"}
        run = client.create_run(experiment, run_name=f"{variant}-s{seed}", tags=tags, start_time=t0).info.run_id
        block = "off" if variant == "attnres_off" else variant.removeprefix("attnres_bs")
        params = {"params.total": 1000 if block == "off" else 1010, "params.active": 600 if block == "off" else 610,
                  "axis.attn_res_block_size": block}
        metrics = [Metric("train_loss", 3.0 - s / 10, t0 + 10_000 + 1000 * s, s) for s in range(1, 11)]
        metrics += [Metric("val_loss", value, t0 + 21_000, 10), Metric("tokens_per_s", 5000.0 + seed, t0, 10),
                    Metric("startup_s", 10.0 + seed, t0, 1), Metric("startup_build_s", 4.0 + seed, t0, 0),
                    Metric("tracking_overhead", 0.004, t0, 10),
                    Metric("tokens", 81920, t0, 10)]
        client.log_batch(run, metrics=metrics, params=[Param(k, str(v)) for k, v in params.items()],
                         tags=[RunTag("k3lab.kind", "trial")])
        client.set_terminated(run, "FAILED" if (variant, seed) in failed else "FINISHED", end_time=t0 + 30_000)
    return uri, parent, t0 / 1000


@pytest.fixture
def store(tmp_path):
    uri, parent, t0 = make_store(tmp_path, VAL_LOSS)
    return uri, parent, t0, tmp_path


# three seeds: bs4 is better on every seed, bs2 lost seed 1 to divergence, bs8 ran one seed only
PAIRED = {("attnres_off", 0): 2.00, ("attnres_off", 1): 2.10, ("attnres_off", 2): 2.20,
          ("attnres_bs4", 0): 1.97, ("attnres_bs4", 1): 2.08, ("attnres_bs4", 2): 2.16,
          ("attnres_bs2", 0): 1.99, ("attnres_bs2", 1): math.nan, ("attnres_bs2", 2): 2.22,
          ("attnres_bs8", 0): 1.95}


@pytest.fixture
def paired_store(tmp_path):
    uri, parent, t0 = make_store(tmp_path, PAIRED, failed=(("attnres_bs2", 1),))
    return uri, parent, tmp_path


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
    summary = build_report(uri, parent, ReportOptions(variant_order=["attnres_off", "attnres_bs4"]),
                           out_dir=tmp_path / "report")
    assert [r["variant"] for r in summary.rows] == ["attnres_off", "attnres_bs4"]
    assert {p.name for p in summary.files} == {"loss_curves.png", "val_loss_by_variant.png",
                                                  "val_loss_vs_params.png", "summary.json"}
    assert all(p.stat().st_size > 1000 for p in summary.files if p.suffix == ".png")


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
    from k3lab.report import plots as report

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
    summary = json.loads((tmp_path / "report" / "summary.json").read_text())["variants"]
    assert [row["variant"] for row in summary] == ["attnres_off", "attnres_bs4"]  # not by name, not by loss
    out = capsys.readouterr().out
    assert out.index("attnres_off") < out.index("attnres_bs4")
    legends = {"loss_curves.png", "val_loss_by_variant.png", "val_loss_vs_params.png"}
    assert legends | {"val_loss_vs_baseline.png"} == set(plots)  # the paired plot labels its axis instead
    first = plots["loss_curves.png"]
    assert set(first) == {"attnres_off", "attnres_bs4"} and first["attnres_off"] != first["attnres_bs4"]
    assert all(plots[name] == first for name in legends)
    from k3lab.store.colours import variant_colours

    assert first == variant_colours(["attnres_off", "attnres_bs4"])  # the trials' mlflow.runColor too


def test_results_markdown_reports_table_startup_tracking_and_gpu_busy(store):
    uri, parent, t0, tmp_path = store
    log = tmp_path / "gpu.csv"
    # 0% for the first 10 s (start-up), then busy 90% of the time until the end at 30 s
    log.write_text("".join(f"{t0 + t:.3f},{0 if t < 10 else 90}\n" for t in range(0, 31)))
    summary = build_report(uri, parent, ReportOptions(baseline="attnres_off"))
    text = results_markdown(summary, load_parent(uri, parent), "AttnRes", gpu_log=log)
    assert "| attnres_bs4 | 2/2 | 1.9700 ± 0.0141 | 1,010 | 610 | 5,000 | 81,920 |" in text
    assert "mean 10.5 s, max 11.0 s, 42 trial-seconds" in text
    assert "building the trainer (imports, data, model, MLflow run): mean 4.5 s" in text
    assert "mean 0.40%" in text
    assert "60.0% of the sweep; 90.0% after the first trial's first step" in text


def test_report_pairs_variants_by_seed_against_the_baseline(paired_store):
    uri, parent, tmp_path = paired_store
    summary = build_report(uri, parent, ReportOptions(baseline="attnres_off"), out_dir=tmp_path / "report")
    paired = {c.variant: c for c in summary.comparisons}
    assert set(paired) == {"attnres_bs4", "attnres_bs2", "attnres_bs8"}
    # bs4: diffs -0.03, -0.02, -0.04 -> mean -0.03, sd 0.01; three comparisons open at the list's one
    # look, so its interval is the t-interval at the look's simulated threshold with three open
    bs4 = paired["attnres_bs4"]
    half = three_seeds_half_width()
    assert (bs4.pairs, bs4.seeds, bs4.verdict, bs4.reason) == (3, 3, "not resolved", "interval covers 0")
    assert bs4.mean_diff == pytest.approx(-0.03) and bs4.half_width == pytest.approx(half)
    assert half > 0.03 > t_quantile(0.975, 2) * 0.01 / math.sqrt(3)  # a per-comparison 95% t would call it
    # bs2: seed 1 failed, so two pairs: too few for the list's one look (its test needs 3)
    bs2 = paired["attnres_bs2"]
    assert (bs2.pairs, bs2.seeds, bs2.verdict, bs2.reason) == (2, 3, "not resolved", "2 pairs: the one look needs 3")
    assert bs2.mean_diff == pytest.approx(0.005)
    bs8 = paired["attnres_bs8"]
    assert (bs8.pairs, bs8.seeds, bs8.half_width, bs8.reason) == (1, 3, None, "one pair")
    summary_json = json.loads((tmp_path / "report" / "summary.json").read_text())
    rows = {r["variant"]: r for r in summary_json["variants"]}
    assert rows["attnres_off"]["paired"] is None and rows["attnres_bs4"]["baseline"] == "attnres_off"
    assert rows["attnres_bs4"]["paired"]["verdict"] == "not resolved"
    assert rows["attnres_bs4"]["paired"]["low"] == pytest.approx(-0.03 - half)
    assert (summary_json["design"]["rule"], summary_json["design"]["comparisons"]) == ("fixed", 3)
    plot = tmp_path / "report" / "val_loss_vs_baseline.png"
    assert plot in summary.files and plot.stat().st_size > 1000


def three_seeds_half_width() -> float:
    """bs4's half-width in the paired store: sd 0.01 over 3 pairs, 3 comparisons open at one look."""
    from k3lab.report.sequential import fixed_design

    level = fixed_design(3, 3).levels[2][0]
    return t_quantile(1 - level / 2, 2) * 0.01 / math.sqrt(3)


def test_results_markdown_has_how_it_ran_and_the_paired_table(paired_store):
    uri, parent, tmp_path = paired_store
    summary = build_report(uri, parent, ReportOptions(baseline="attnres_off"))
    text = results_markdown(summary, load_parent(uri, parent), "AttnRes", report_command="k3lab report x",
                            plots=["results/attnres_block-gpu/val_loss_vs_baseline.png"])
    assert "- Command: `k3lab sweep experiments/attnres_block.yaml --profile gpu`" in text
    assert "- Resumed with: `k3lab sweep experiments/attnres_block.yaml --profile gpu --resume`" in text
    assert "- Report: `k3lab report x`" in text
    assert "- Machine: NVIDIA H200 on 1 host" in text
    assert "- Tokens per trial: 81,920 (10 steps of 16 x 512 tokens)" in text
    assert "- Sweep: parent run not closed; from its trials" in text  # the store's parent never closed
    assert ("| variant | baseline | pairs | val_loss - baseline | family-wise 95% interval | vs baseline | verdict |"
            in text)
    half = three_seeds_half_width()
    assert f"| attnres_bs4 | attnres_off | 3/3 | -0.0300 | [{-0.03 - half:+.4f}, {-0.03 + half:+.4f}] | -1.43% | not resolved" in text
    assert "| attnres_bs2 | attnres_off | 2/3 | +0.0050 |" in text and "not resolved (2 pairs: the one look needs 3) |" in text
    assert "| attnres_bs8 | attnres_off | 1/3 | -0.0500 | n/a | -2.50% | not resolved (one pair) |" in text
    assert "one look at 3 seeds: Holm over 3 comparisons" in text
    assert "![val_loss_vs_baseline](results/attnres_block-gpu/val_loss_vs_baseline.png)" in text


def test_results_markdown_shows_each_seeds_paired_difference_so_an_outlying_seed_is_seen(paired_store):
    uri, parent, _ = paired_store
    summary = build_report(uri, parent, ReportOptions(baseline="attnres_off"))
    text = results_markdown(summary, load_parent(uri, parent), "AttnRes")
    assert "| variant | baseline | s0 | s1 | s2 |" in text
    assert "| attnres_bs4 | attnres_off | -0.0300 | -0.0200 | -0.0400 |" in text
    assert "| attnres_bs2 | attnres_off | -0.0100 | - | +0.0200 |" in text  # seed 1 diverged: no pair
    assert "| attnres_bs8 | attnres_off | -0.0500 | - | - |" in text


def test_results_markdown_shows_the_sweep_totals_the_parent_logged(tmp_path):
    totals = {"sweep_wall_s": 1234.4, "sweep_tokens": 16_384_000, "sweep_tokens_per_s": 13_272.5, "sweep_mfu": 0.1234,
              "sweep_gpus": 2.0}
    uri, parent, _ = make_store(tmp_path, VAL_LOSS, parent_metrics=totals)
    text = results_markdown(build_report(uri, parent), load_parent(uri, parent), "AttnRes")
    assert "- Sweep: wall time 1,234 s, tokens in all 16,384,000, aggregate tokens/s 13,272, MFU 12.3%" in text
    assert "- Machine: 2 x " in text  # the GPUs the sweep had, not just the device name
    assert "sharing a GPU" not in text  # a sweep from before k3lab.runner.runtime.mps (or one on whole GPUs)


def test_results_markdown_says_how_trials_shared_their_gpu(tmp_path):
    from mlflow.tracking import MlflowClient

    uri, parent, _ = make_store(tmp_path, VAL_LOSS)
    MlflowClient(uri).set_tag(parent, "k3lab.gpu_sharing", "mps")
    text = results_markdown(build_report(uri, parent), load_parent(uri, parent), "AttnRes")
    assert "; trials sharing a GPU: mps" in text.split("- Machine: ")[1].splitlines()[0]


def test_a_sweep_run_in_parts_reports_its_totals_over_the_sum_of_the_parts(tmp_path):
    """A first run and two resumes (as on preemptible nodes): the totals the last part logged
    cover all three, and the line says the wall time is their sum."""
    totals = {"sweep_wall_s": 500.0, "sweep_parts_wall_s": 1200.0, "sweep_parts": 3.0,
              "sweep_tokens": 12_000_000, "sweep_tokens_per_s": 10_000.0}
    uri, parent, _ = make_store(tmp_path, VAL_LOSS, parent_metrics=totals)
    text = results_markdown(build_report(uri, parent), load_parent(uri, parent), "AttnRes")
    assert "- Sweep: wall time 1,200 s (the sum of 3 parts), tokens in all 12,000,000, aggregate tokens/s 10,000" in text


def test_a_sweep_stopped_in_its_last_part_gets_its_totals_from_its_trials_over_every_part(tmp_path):
    """Stopped (Ctrl-C, preempted) in a resumed part: the parent closed with the parts' wall time
    but no totals; the section counts the tokens its trials trained over that time."""
    uri, parent, _ = make_store(tmp_path, VAL_LOSS, parent_metrics={"sweep_wall_s": 515.0,
                                                                   "sweep_parts_wall_s": 935.0, "sweep_parts": 2.0})
    MlflowClient(uri).set_terminated(parent, "KILLED")
    text = results_markdown(build_report(uri, parent), load_parent(uri, parent), "AttnRes")
    tokens = 81920 * len(VAL_LOSS)
    assert (f"- Sweep: stopped before its end; from the tokens its trials trained: wall time 935 s (the sum of 2 "
            f"parts), tokens in all {tokens:,}, aggregate tokens/s {tokens / 935:,.0f}") in text


def test_a_sweep_whose_driver_died_before_its_totals_gets_them_from_its_trials(tmp_path):
    """The parent run never closed (its driver was killed after the trials ended): the section
    still gives the tokens and the rate, up to the last trial's end, and says so."""
    uri, parent, _ = make_store(tmp_path, VAL_LOSS)
    text = results_markdown(build_report(uri, parent), load_parent(uri, parent), "AttnRes")
    line = next(line for line in text.splitlines() if line.startswith("- Sweep: "))
    assert "parent run not closed; from its trials" in line and "MFU n/a" in line
    assert f"tokens in all {81920 * len(VAL_LOSS):,}," in line
    wall = float(line.split("wall time ")[1].split(" s")[0])
    assert 30 <= wall < 60  # the trials end 30 s after they start, the parent a moment before them
    client = MlflowClient(uri)
    still_running = client.create_run(client.get_run(parent).info.experiment_id, run_name="attnres_off-s9",
                                      tags={"mlflow.parentRunId": parent, "k3lab.variant_name": "attnres_off",
                                            "k3lab.seed": "9", "k3lab.kind": "trial"}).info.run_id
    client.log_metric(still_running, "tokens", 81920, step=10)
    text = results_markdown(build_report(uri, parent), load_parent(uri, parent), "AttnRes")
    assert "- Sweep: wall time n/a, tokens in all n/a" in text  # a trial without an end: no rate to give
    client.set_terminated(still_running, "KILLED")
    client.set_terminated(parent, "KILLED")  # closed without totals: nothing to make up
    text = results_markdown(build_report(uri, parent), load_parent(uri, parent), "AttnRes")
    assert "- Sweep: wall time n/a, tokens in all n/a" in text


def test_report_command_writes_markdown_with_plots_beside_it(tmp_path, capsys):
    sweep_file = tmp_path / "mini.yaml"
    sweep_file.write_text(mini_sweep("mini", "two variants").replace("seeds: [0]", "seeds: [0, 1]"))
    uri, parent, _ = make_store(tmp_path, {("attnres_off", 0): 2.0, ("attnres_off", 1): 2.1,
                                           ("attnres_bs1", 0): 1.9, ("attnres_bs1", 1): 2.05})
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "mini.k3lab.json").write_text(json.dumps({"parent_run_id": parent}))
    markdown = tmp_path / "docs" / "results.md"
    args = ["report", str(sweep_file), "--profile", "none", "--storage", str(tmp_path / "runs"),
            "--tracking-uri", uri, "--markdown", str(markdown)]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "paired by seed" in out and "attnres_bs1" in out
    folder = markdown.parent / "results" / "mini"
    # it says what it wrote and where: the file and its section, the plots and their folder
    assert out.splitlines()[-1] == (
        f"wrote {markdown}: section mini (added), linking 4 plots copied to {folder}/ (loss_curves.png, "
        "val_loss_by_variant.png, val_loss_vs_params.png, val_loss_vs_baseline.png)")
    assert sorted(p.name for p in folder.iterdir()) == sorted(out.splitlines()[-1].split("(")[-1][:-1].split(", "))
    text = markdown.read_text()
    assert text.startswith("# Results\n") and "<!-- section:mini -->" in text
    assert "| attnres_bs1 | attnres_off | 2/2 | -0.0750 |" in text
    assert f"- Report: `k3lab report {sweep_file}" in text
    links = [line[line.index("(") + 1:-1] for line in text.splitlines() if line.startswith("![")]
    assert "results/mini/val_loss_vs_baseline.png" in links and len(links) == 4
    assert all((markdown.parent / link).stat().st_size > 1000 for link in links)
    # plots written straight into the folder the markdown links to
    assert main(args + ["--out", str(markdown.parent / "results" / "mini")]) == 0
    assert all((markdown.parent / link).stat().st_size > 1000 for link in links)
    assert f"wrote {markdown}: section mini (replaced), linking 4 plots" in capsys.readouterr().out


def mini_report_args(tmp_path) -> list[str]:
    """`k3lab report` of a two-variant sweep in a store of its runs, under tmp_path/runs."""
    sweep_file = tmp_path / "mini.yaml"
    sweep_file.write_text(mini_sweep("mini", "two variants"))
    uri, parent, _ = make_store(tmp_path, {("attnres_off", 0): 2.0, ("attnres_bs1", 0): 1.9})
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "mini.k3lab.json").write_text(json.dumps({"parent_run_id": parent}))
    return ["report", str(sweep_file), "--profile", "none", "--storage", str(tmp_path / "runs"), "--tracking-uri", uri]


@pytest.mark.parametrize("markdown, problem", [
    ("a_file/results.md", "a_file is a file, not a folder"),
    ("binary.md", "binary.md: not UTF-8 text (byte 0xff at offset 1)"),
    ("a_file", "--markdown's plots folder"),  # docs/results.md's plots go to docs/results/: here a file
])
def test_a_markdown_file_the_report_cannot_write_is_refused_before_the_report_is_written(tmp_path, capsys,
                                                                                          markdown, problem):
    args = mini_report_args(tmp_path)
    (tmp_path / "a_file").write_text("notes\n")
    (tmp_path / "binary.md").write_bytes(b"x\xff")
    capsys.readouterr()  # MLflow's notices as it made the store
    assert main(args + ["--markdown", str(tmp_path / markdown)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and problem in err and "--markdown" in err
    assert not (tmp_path / "runs" / "mini_report").exists()  # no summary.json or plots without their markdown


def test_report_refuses_an_unknown_baseline(tmp_path, capsys):
    sweep_file = tmp_path / "mini.yaml"
    sweep_file.write_text(mini_sweep("mini", "two variants"))
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "mini.k3lab.json").write_text(json.dumps({"parent_run_id": "x"}))
    assert main(["report", str(sweep_file), "--profile", "none", "--storage", str(tmp_path / "runs"),
                 "--baseline", "attnres_bs9"]) == 2
    err = capsys.readouterr().err
    assert "--baseline attnres_bs9: not a variant of" in err and err.count("\n") == 1


def test_busy_fraction_weights_utilisation_by_time():
    samples = [(0.0, 100.0), (1.0, 0.0), (3.0, 100.0), (4.0, 100.0)]
    assert busy_fraction(samples, 0.0, 4.0) == pytest.approx((1 + 0 + 1) / 4)
    assert busy_fraction(samples, 10.0, 20.0) is None


def test_gpu_log_reads_its_samples_in_time_order_past_blank_lines(tmp_path):
    log = tmp_path / "gpu.csv"
    log.write_text("1.5,40\n\n0.5, 20\n")
    assert read_gpu_log(log) == [(0.5, 20.0), (1.5, 40.0)]


@pytest.mark.parametrize("text, problem", [
    ("0.5,20\nnvidia-smi: garbage\n", "gpu.csv, line 2: expected epoch_seconds,percent (e.g. 1733356800.25,87), "
                                       "got 'nvidia-smi: garbage'"),
    ("0.5,20\n1.5\n", "gpu.csv, line 2: expected epoch_seconds,percent"),
    ("0.5,20\n1.5,500\n", "gpu.csv, line 2: utilisation 500 is not a percentage (0 to 100)"),
    ("0.5,-5\n", "gpu.csv, line 1: utilisation -5 is not a percentage"),
    ("inf,5\n", "gpu.csv, line 1: the time inf is not a number of epoch seconds"),
    ("\n", "gpu.csv: no samples in it"),
])
def test_a_gpu_log_line_that_is_not_a_sample_is_an_error_naming_the_file_and_line(tmp_path, text, problem):
    log = tmp_path / "gpu.csv"
    log.write_text(text)
    with pytest.raises(UserError, match=re.escape(f"--gpu-log {tmp_path / problem}")):
        read_gpu_log(log)


def test_a_bad_gpu_log_or_one_without_markdown_is_refused_before_the_report_is_written(tmp_path, capsys):
    args = mini_report_args(tmp_path)
    (tmp_path / "gpu.csv").write_text("0.5,20\n1.5,500\n")
    capsys.readouterr()
    assert main(args + ["--markdown", str(tmp_path / "results.md"), "--gpu-log", str(tmp_path / "gpu.csv")]) == 2
    assert capsys.readouterr().err == f"error: --gpu-log {tmp_path / 'gpu.csv'}, line 2: utilisation 500 is not a " \
                                      "percentage (0 to 100)\n"
    (tmp_path / "gpu.csv").write_text("0.5,20\n")
    assert main(args + ["--gpu-log", str(tmp_path / "gpu.csv")]) == 2  # its one use is the markdown's timing
    assert "pass --markdown too" in capsys.readouterr().err
    assert not (tmp_path / "runs" / "mini_report").exists() and not (tmp_path / "results.md").exists()


def test_sweep_sizing_counts_what_a_stopped_sweeps_trials_trained_and_keeps_a_finished_sweeps_totals(tmp_path):
    stopped = tmp_path / "stopped"
    stopped.mkdir()
    make_store(stopped, VAL_LOSS, parent_metrics={"sweep_wall_s": 100.0})  # no totals: stopped before its summary
    finished = tmp_path / "finished"
    finished.mkdir()
    make_store(finished, VAL_LOSS, parent_metrics={"sweep_wall_s": 50.0, "sweep_tokens": 400_000.0,
                                                    "sweep_tokens_per_s": 8000.0, "sweep_mfu": 0.25})
    done = subprocess.run([sys.executable, "bench/sweep_sizing.py", f"cut={stopped / 'mlflow.db'}",
                           f"whole={finished / 'mlflow.db'}"], cwd=Path(__file__).resolve().parents[1],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = {}
    for line in done.stdout.splitlines():  # the throughput table's rows (the time-shares table follows it)
        if line.startswith(("| cut", "| whole")):
            rows.setdefault(line.split(" | ")[0].strip("| "), line.split(" | "))
    # 4 trials x 81,920 tokens in 100 s; start-up 10/11/10/11 s, of which build 4/5/4/5 s
    assert rows["cut"][4:7] == ["100", "327,680", "3,277"]
    assert rows["cut"][9:] == ["10.5 / 11.0", "4.5 |"]
    assert rows["whole"][4:8] == ["50", "400,000", "8,000", "25.0%"]


def test_bench_trial_table_from_logs_takes_rows_a_stopped_run_printed_and_names_their_run(tmp_path):
    """A run killed before its table still printed each row as it went: those rows count, a
    row measured again replaces the earlier one in place, and each row names its run."""
    row = "| small@64x1024 | {code} | {tps} | 5.8% | 232.0 | 225.1 | 6.4 | 3% | 4,633 | 4,631 | 42.8 | 11.5 |"
    first = tmp_path / "a.log"
    first.write_text("# run a\n| row | code | tokens/s |\n|---|---|---|\n" + row.format(code="after", tps="1")
                     + "\n" + row.format(code="before", tps="2") + "\n        8.33 ms/step  9x  some_kernel\n")
    stopped = tmp_path / "b.log"
    stopped.write_text("# run b\n" + row.format(code="before", tps="3") + "\n")
    origins, rows = bench_script("bench_trial").rows_from_logs([str(first), str(stopped)])
    assert origins == ["run a", "run b"]
    assert [r.split("|")[2:4] for r in rows] == [[" after [1] ", " 1 "], [" before [2] ", " 3 "]]


def test_bench_trial_sums_every_kernel_by_kind_and_each_kernel_counts_once():
    """Kernel names as an H200 profile of a `small` step gave them (bench_trial-2026-12-03-top-all.log)."""
    device_time = [("attn_res_bwd_dv_kernel", 1.38, 24), ("chunk_kda_bwd_kernel_intra", 0.98, 9),
                   ("causal_conv1d_bwd_kernel", 0.83, 27), ("memcpy128", 0.78, 119),
                   ("void at::native::unrolled_elementwise_kernel<at::native::direct_copy_kernel_cuda", 0.33, 58),
                   ("nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT", 0.53, 45),
                   ("void cublasLt::splitKreduce_kernel<32, 16, int, float, __nv_bfloat16, float>", 0.23, 112),
                   ("triton_poi_fused_add_view_19", 0.11, 11), ("Memset (Unknown)", 0.15, 147),
                   ("void at::native::reduce_kernel<128, 4, at::native::ReduceOp<float>>", 0.75, 111),
                   ("void at::native::vectorized_elementwise_kernel<8, at::native::CUDAFunctor_add<c10::BFloat16>", 0.16,
                    24),
                   ("a_kernel_of_a_new_library", 0.01, 1)]
    kinds = bench_script("bench_trial").by_kind(device_time)
    found = {kind: (ms, count) for kind, ms, count in kinds}
    assert found["copies and memsets"] == pytest.approx((1.26, 324))  # the direct copy is no elementwise op
    assert found["GEMMs (cuBLAS, CUTLASS)"] == pytest.approx((0.76, 157))
    assert found["eager elementwise"] == (0.16, 24)
    assert found["AttnRes (k3lab)"] == (1.38, 24) and found["KDA (FLA)"] == (0.98, 9)
    assert found["other"] == (0.01, 1)
    assert sum(ms for _, ms, _ in kinds) == pytest.approx(sum(ms for _, ms, _ in device_time))
    assert [ms for _, ms, _ in kinds] == sorted((ms for _, ms, _ in kinds), reverse=True)


def test_bench_gpu_table_from_a_log_is_its_closing_report_named_by_the_first_line(tmp_path):
    saved = tmp_path / "gpu.log"
    saved.write_text("# 2026-12-03, an H200: python bench/bench_gpu.py\nfla_kda: first step 21.2 s\n| fla_kda | 1 |\n"
                     "B=16, T=2048, settings.\n\n| configuration | params |\n|---|---|\n| fla_kda | 193.5M |\n")
    origin, body = bench_script("bench_gpu").body_from_log(str(saved))
    assert origin == "2026-12-03, an H200: python bench/bench_gpu.py"
    assert body.splitlines() == ["B=16, T=2048, settings.", "", "| configuration | params |", "|---|---|",
                                 "| fla_kda | 193.5M |"]
    saved.write_text("# stopped\nfla_kda: first step 21.2 s\n")
    with pytest.raises(SystemExit, match="no report of bench_gpu.py"):
        bench_script("bench_gpu").body_from_log(str(saved))


def test_a_sweep_resumed_in_parts_lists_each_resume_command_once_with_its_count():
    from k3lab.report.results import resume_lines

    again = "k3lab sweep x.yaml --resume"
    assert resume_lines([again, again, "k3lab sweep x.yaml --resume --max-concurrent 2"]) == [
        f"- Resumed with (2 times): `{again}`", "- Resumed with: `k3lab sweep x.yaml --resume --max-concurrent 2`"]
    assert resume_lines([]) == []


def test_the_data_line_gives_one_figure_when_every_trial_trained_the_same_epochs():
    from types import SimpleNamespace as NS

    from k3lab.report.tables import epochs_line

    same = [NS(params={"data.epochs": "0.0304"}), NS(params={"data.epochs": "0.0301"})]
    assert epochs_line(same) == "Data: each trial trained 0.03 epochs of its corpus (data.epochs)"
    spread = [NS(params={"data.epochs": "0.5"}), NS(params={"data.epochs": "1.25"})]
    assert epochs_line(spread) == "Data: each trial trained 0.50-1.25 epochs of its corpus (data.epochs) (trials repeated data)"


def test_the_report_says_how_often_trials_crashed_and_with_which_error():
    from types import SimpleNamespace as NS

    from k3lab.report.results import crash_lines

    launch = "torch.AcceleratorError: CUDA error: unspecified launch failure"
    records = [NS(tags={"k3lab.crashes": "2", "k3lab.last_crash": launch}),
               NS(tags={"k3lab.crashes": "1", "k3lab.last_crash": launch}), NS(tags={})]
    assert crash_lines(records) == [f"- Crashes: 3 in 2 of 3 trials, each restarted from its last checkpoint "
                                    f"(k3lab.crashes); last errors: `{launch}` (2 trials)."]
    assert crash_lines(records[2:]) == []


def test_the_report_says_how_long_started_trials_waited_for_a_training_slot():
    from types import SimpleNamespace as NS

    from k3lab.report.results import slot_wait_lines

    def record(wait):
        return NS(value=lambda key: wait if key == "slot_wait_s" else None)

    assert slot_wait_lines([record(2.0), record(10.0), record(None)]) == [
        "- Waiting for a training slot after start-up (resources.training_slots): mean 6.0 s, max 10.0 s over 2 trials."]
    assert slot_wait_lines([record(None)]) == []


def test_a_dry_run_says_how_many_pairs_the_rule_takes_at_an_earlier_runs_spreads(paired_store, capsys, monkeypatch):
    """`k3lab sweep --dry-run` on a store that holds a run of the same sweep: the planning figure
    of that run's report, per comparison with two pairs or more, before any GPU time is spent."""
    import statistics

    from k3lab.registry.sweep_cli import load_sweep_for
    from k3lab.report.sequential import pairs_needed
    from k3lab.runner.tune.seeds import design_of

    uri, _, tmp_path = paired_store
    file = str(Path(__file__).resolve().parents[1] / "experiments/attnres_block.yaml")
    monkeypatch.setattr("k3lab.runner.tune.driver.check_dry_run", lambda run: None)  # as on a GPU machine with FLA
    assert main(["sweep", file, "--profile", "gpu", "--dry-run", "--tracking-uri", uri,
                 "--storage", str(tmp_path / "runs")]) == 0
    line = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("earlier run"))
    design = design_of(load_sweep_for(file, "gpu"))
    bs4 = pairs_needed(statistics.stdev([-0.03, -0.02, -0.04]), statistics.fmean([2.00, 2.10, 2.20]), design, 3,
                       mean=-0.03)
    bs2 = pairs_needed(statistics.stdev([-0.01, 0.02]), statistics.fmean([2.00, 2.20]), design, 2, mean=0.005)
    needed = [f"~{n}" if n else ">200" for n in (bs2, bs4)]
    assert f"attnres_bs2 {needed[0]} (ran 2), attnres_bs4 {needed[1]} (ran 3);" in line  # bs8 (one pair): left out
    assert line.endswith("this file allows up to 16 seeds")
    assert not (tmp_path / "runs").exists()  # a dry run writes nothing


def test_a_sweep_that_ran_to_its_end_says_budget_though_its_parent_is_still_open(paired_store):
    """The driver builds the end-of-run report before it closes the parent run (still RUNNING in
    the store): it passes `unfinished="budget"`; the store alone would say running."""
    from k3lab.report.sequential import Design

    uri, parent, _ = paired_store
    design = Design(comparisons=3, max_pairs=8, start=3, halfwidth=0.0001)
    options = ReportOptions(baseline="attnres_off", design=design,
                            baselines={v: "attnres_off" for v in ("attnres_bs2", "attnres_bs4", "attnres_bs8")})
    stopping = lambda **kw: {c.stopping for c in build_report(uri, parent, options, **kw).comparisons}  # noqa: E731
    assert stopping(unfinished="budget") == {"budget"}
    assert stopping() == {"running"}  # the store alone: a parent still open whose trials ended just now


@pytest.mark.parametrize("content, code", [(b"", 0), (b"not a database at all", 2)])
def test_a_dry_run_leaves_an_empty_or_foreign_store_file_untouched(tmp_path, content, code, capsys, monkeypatch):
    monkeypatch.setattr("k3lab.runner.tune.driver.check_dry_run", lambda run: None)  # as on a GPU machine with FLA
    store = tmp_path / "mlflow.db"
    store.write_bytes(content)
    file = str(Path(__file__).resolve().parents[1] / "experiments/attnres_block.yaml")
    assert main(["sweep", file, "--profile", "gpu", "--dry-run", "--tracking-uri", f"sqlite:///{store}",
                 "--storage", str(tmp_path / "runs")]) == code  # a file that is not SQLite: refused
    assert store.read_bytes() == content  # MLflow was not let at it: it would have created its tables
    out, err = capsys.readouterr()
    assert "earlier run" not in out and (code == 0 or "is not an SQLite database" in err)


def test_the_report_splits_the_trial_build_into_corpus_model_and_mlflow_where_trials_logged_them():
    from types import SimpleNamespace as NS

    from k3lab.report.results import build_parts_clause

    def record(data, model, tracking):
        values = {"startup_data_s": data, "startup_model_s": model, "startup_tracking_s": tracking}
        return NS(value=values.get)

    assert build_parts_clause([record(1.0, 6.0, 3.0), record(2.0, 8.0, 5.0)]) == \
        " (corpus 1.5 s, model and optimizers 7.0 s, MLflow run 4.0 s)"
    assert build_parts_clause([record(None, None, None)]) == ""  # runs from before the parts were logged


def test_time_shares_split_the_trials_time_once_and_count_every_attempts_work_up_to_its_checkpoint(tmp_path):
    """Trials a and b ran at once for the sweep's 100 s: 200 s of trials' time. Trial a: 1,000
    tokens at 50 tokens/s (20 s in training steps) in a 26 s loop (6 s evaluating), started in
    10 s, of which 7 s building and 3 s its first step, inside the loop: 17 s training.
    Trial b crashed and its second attempt began at step 5 (100 tokens a step at 60 tokens/s):
    the second trained steps 5-10, 10 s less its first step's 2 s, in a 14 s loop (0.4 s
    evaluating per second trained); the first trained steps 1-4 before its checkpoint, 6.67 s less
    its first step's 3 s, and evaluated 0.4 x 6.67 s. Both attempts' start-ups (12 + 8 s) count.
    Trial c logged no build (a store from before it was logged): its whole rate's time is training."""
    from k3lab.report.efficiency import most_at_once, time_shares

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(uri)
    experiment = client.create_experiment("x", artifact_location=(tmp_path / "art").as_uri())
    t0 = int(time.time() * 1000)
    histories = {"a": [("startup_s", 10.0, 1, t0), ("startup_build_s", 7.0, 0, t0), ("tokens", 1000, 10, t0),
                       ("avg_tokens_per_s", 50.0, 10, t0), ("train_wall_s", 26.0, 10, t0)],
                 "b": [("startup_s", 12.0, 1, t0), ("startup_build_s", 9.0, 0, t0), ("startup_s", 8.0, 5, t0 + 50_000),
                       ("startup_build_s", 6.0, 4, t0 + 50_000), ("tokens", 1000, 10, t0),
                       ("avg_tokens_per_s", 60.0, 10, t0), ("train_wall_s", 14.0, 10, t0)]}
    for name, metrics in histories.items():
        run = client.create_run(experiment, run_name=name, start_time=t0).info.run_id
        client.log_batch(run, metrics=[Metric(k, v, ts, step) for k, v, step, ts in metrics])
        client.set_terminated(run, "FINISHED", end_time=t0 + 80_000)
    trials = [client.get_run(r.info.run_id) for r in client.search_runs([experiment])]
    shares = time_shares(uri, trials, wall_s=100.0)  # both ran at once: 2 slots, observed
    first_attempt = 400 / 60
    assert shares == pytest.approx({"sweep_share_training": (17 + 8 + first_attempt - 3) / 200,
                                    "sweep_share_evaluating": (6 + 4 + 0.4 * first_attempt) / 200,
                                    "sweep_share_starting": 30 / 200, "sweep_slots": 2.0})
    assert time_shares(uri, trials, wall_s=100.0, slots=4)["sweep_share_training"] == \
        pytest.approx((17 + 8 + first_attempt - 3) / 400)
    a = [t for t in trials if t.info.run_name == "a"]
    run = client.create_run(experiment, run_name="c", start_time=t0).info.run_id
    client.log_batch(run, metrics=[Metric(k, v, ts, step) for k, v, step, ts in histories["a"] if k != "startup_build_s"])
    client.set_terminated(run, "FINISHED", end_time=t0 + 80_000)
    assert time_shares(uri, a + [client.get_run(run)], wall_s=100.0)["sweep_share_training"] == \
        pytest.approx((17 + 20) / 200)
    assert most_at_once([(0, 10), (5, 15), (10, 20), (12, 13)]) == 3  # one ends as another begins: not both


def test_a_sweeps_restarts_are_the_sum_of_its_trials_counts_by_cause():
    from types import SimpleNamespace as NS

    from k3lab.report.efficiency import crashes

    trials = [NS(data=NS(tags={"k3lab.crashes": "2", "k3lab.restarts_oom": "1"})), NS(data=NS(tags={})),
              NS(data=NS(tags={"k3lab.crashes": "1", "k3lab.restarts_oom": "3"}))]
    assert crashes(trials) == {"sweep_crashes": 3.0, "sweep_restarts_oom": 4.0}
    assert crashes(trials[1:2]) == {"sweep_crashes": 0.0, "sweep_restarts_oom": 0.0}


def test_the_efficiency_line_names_the_restarts_by_cause():
    from k3lab.report.efficiency import efficiency_line

    e = {"sweep_tokens": 1000, "sweep_wall_s": 10, "sweep_tokens_per_s": 100}
    assert efficiency_line(e | {"sweep_crashes": 1.0, "sweep_restarts_oom": 2.0}).endswith(
        "; restarts: 3 (out of memory 2, crashed 1)")
    assert efficiency_line(e | {"sweep_crashes": 1.0}).endswith("; restarts: 1 (crashed 1)")
    assert efficiency_line(e | {"sweep_crashes": 0.0, "sweep_restarts_oom": 0.0}).endswith("; restarts: 0")
    assert "restarts" not in efficiency_line(e)  # a report of a store that did not count them


def test_the_efficiency_line_says_where_the_trials_time_went_where_it_is_known():
    from k3lab.report.efficiency import efficiency_line

    e = {"sweep_tokens": 1000, "sweep_wall_s": 10, "sweep_tokens_per_s": 100}
    shares = {"sweep_slots": 4.0, "sweep_share_training": 0.55, "sweep_share_evaluating": 0.13,
              "sweep_share_starting": 0.18}
    assert efficiency_line(e | shares).endswith("; 4 trials at once spent 55% training, 13% evaluating, "
                                                "18% starting up")
    assert "trials at once" not in efficiency_line(e)


def test_report_file_design_judges_under_the_files_looks_design_and_the_store_keeps_its_own(tmp_path, capsys):
    from k3lab.cli import main

    noise = [0.004, -0.003, 0.002, -0.004, 0.001, 0.003, -0.002]
    values = {("attnres_off", s): 2.0 + 0.01 * s for s in range(7)} | {
        ("attnres_bs4", s): 2.0 + 0.01 * s - 0.05 + noise[s] for s in range(7)}
    uri, parent, _ = make_store(tmp_path, values)
    sweep = tmp_path / "attnres_block.yaml"
    sweep.write_text("name: attnres_block\nbase: tiny\naxes:\n  attn_res_block_size: [off, 4]\n"
                     "baseline: attnres_off\nprofiles:\n  gpu: {seeds: [0, 1]}\n")
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "attnres_block-gpu.k3lab.json").write_text(json.dumps({"parent_run_id": parent}))
    common = [str(sweep), "--profile", "gpu", "--storage", str(tmp_path / "runs"), "--tracking-uri", uri]
    assert main(["report", *common, "--out", str(tmp_path / "r1")]) == 0  # stores the file's fixed design
    sweep.write_text(sweep.read_text().replace("gpu: {seeds: [0, 1]}",
                                               "gpu: {seeds: {start: 6, max: 16, looks: [6, 8, 12, 16]}}"))
    markdown = tmp_path / "results.md"
    assert main(["report", *common, "--out", str(tmp_path / "r2"), "--file-design", "--markdown", str(markdown)]) == 0
    text = markdown.read_text()
    assert "the sweep file's present design, applied by `k3lab report --file-design`" in text
    assert "looks after 6, 8, 12, 16 seeds" in text and "| better |" in text
    capsys.readouterr()
    assert main(["report", *common, "--out", str(tmp_path / "r3")]) == 0  # again without it: the stored design
    assert "looks after" not in capsys.readouterr().out
