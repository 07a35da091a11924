"""The verdicts as data the MLflow UI draws and sorts (k3lab.report.ui_verdicts, k3lab.store.verdicts):
each compared trial's paired difference at every evaluation, each variant's effect and verdict on
the parent run, each trial's outcome."""

import json

import pytest
from mlflow.tracking import MlflowClient

from k3lab.report.options import ReportOptions
from k3lab.report.summary import build_report
from k3lab.store import runs, verdicts
from k3lab.store.colours import variant_colours
from k3lab.store.tracking import MLflowTracker
from k3lab.store.view_state import line_chart

EVALS = (2, 4, 6)


def val_loss(variant: str, seed: int, step: int) -> float:
    """The baseline at 3 - step/10; attnres_bs1 1% lower at every step, seeds apart by 0.01."""
    base = 3.0 - step / 10 + seed * 0.01
    return base * 0.99 if variant == "attnres_bs1" else base


def curve_sweep(uri: str, variants=("attnres_off", "attnres_bs1"), seeds=(0, 1, 2), status=None,
                values=val_loss) -> tuple[str, dict]:
    """A parent run with trials that evaluate val_loss at EVALS; status: {(variant, seed): status}."""
    parent = MLflowTracker.start(uri, "mini", "mini", tags=runs.sweep_tags(
        "mini", None, "0", "abc", "two variants", "k3lab sweep mini.yaml", variants[0]))
    parent.log_params({"metric": "val_loss:min"})
    trials = {}
    for variant in variants:
        for seed in seeds:
            trial = MLflowTracker.start(uri, "mini", f"{variant}-s{seed}", parent_run_id=parent.run_id,
                                        tags=runs.trial_tags(f"id-{variant}", variant, seed))
            trial.log_params({"params.total": 10, "params.active": 10})
            for step in EVALS:
                trial.log_metrics({"train_loss": 4.0 - step / 10, "val_loss": values(variant, seed, step),
                                   "tokens": 64.0 * step}, step)
            trial.finish((status or {}).get((variant, seed), "FINISHED"))
            trials[(variant, seed)] = trial.run_id
    parent.finish("FINISHED")
    return parent.run_id, trials


def report(uri: str, parent: str, rise: float | None = None, record: bool = True):
    options = ReportOptions(baseline="attnres_off", variant_order=["attnres_off", "attnres_bs1"], rise=rise)
    return build_report(uri, parent, options, record=record)


def test_each_compared_trial_carries_its_paired_difference_in_percent_at_every_evaluation(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    parent, trials = curve_sweep(uri)
    report(uri, parent)
    client = MlflowClient(uri)
    for seed in (0, 1, 2):
        history = sorted((m.step, m.value) for m in client.get_metric_history(trials[("attnres_bs1", seed)],
                                                                             verdicts.VS_BASELINE))
        assert [step for step, _ in history] == list(EVALS)
        assert all(value == pytest.approx(-1.0) for _, value in history)
        assert client.get_metric_history(trials[("attnres_off", seed)], verdicts.VS_BASELINE) == []


def test_a_trial_that_ends_gets_its_differences_as_soon_as_its_pair_has_ended_too(tmp_path):
    from types import SimpleNamespace

    from k3lab.runner.tune.differences import DifferencesCallback

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    parent, trials = curve_sweep(uri, status={("attnres_off", 1): "RUNNING"})  # seed 1's baseline still trains
    specs = {f"key-{seed}": SimpleNamespace(seed=seed, variant_name="attnres_bs1") for seed in (0, 1)}
    callback = DifferencesCallback(uri, parent, specs, {"attnres_bs1": "attnres_off"}, "val_loss", "min", None)
    for seed in (0, 1):  # Tune: the compared trial of each seed ended
        callback.on_trial_complete(0, [], SimpleNamespace(config={"trial": f"key-{seed}"}))
    client = MlflowClient(uri)
    assert [m.step for m in client.get_metric_history(trials[("attnres_bs1", 0)], verdicts.VS_BASELINE)] == \
        list(EVALS)
    assert client.get_metric_history(trials[("attnres_bs1", 1)], verdicts.VS_BASELINE) == []  # its pair runs
    assert client.get_metric_history(trials[("attnres_bs1", 2)], verdicts.VS_BASELINE) == []  # not ended here


def test_a_second_report_does_not_duplicate_the_difference_points(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    parent, trials = curve_sweep(uri)
    report(uri, parent)
    report(uri, parent)
    client = MlflowClient(uri)
    assert len(client.get_metric_history(trials[("attnres_bs1", 0)], verdicts.VS_BASELINE)) == len(EVALS)
    keys = [f"{prefix}/attnres_bs1" for prefix in (verdicts.VS_BASELINE, verdicts.VS_LOW, verdicts.VS_HIGH)]
    assert all(len(client.get_metric_history(parent, key)) == 1 for key in keys)


def test_the_parent_run_carries_each_variants_mean_difference_interval_and_verdict(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    parent, _ = curve_sweep(uri)
    summary = report(uri, parent)
    comparison = summary.comparisons[0]
    run = MlflowClient(uri).get_run(parent)
    mean = run.data.metrics["vs_baseline_pct/attnres_bs1"]
    low, high = run.data.metrics["vs_baseline_low/attnres_bs1"], run.data.metrics["vs_baseline_high/attnres_bs1"]
    assert mean == pytest.approx(100 * comparison.mean_diff / comparison.baseline_mean)
    assert low == pytest.approx(100 * comparison.low / comparison.baseline_mean)
    assert low <= mean <= high and high == pytest.approx(100 * comparison.high / comparison.baseline_mean)
    assert run.data.tags["k3lab.verdict.attnres_bs1"] == comparison.verdict
    assert "vs_baseline_pct/attnres_off" not in run.data.metrics  # the baseline is compared with nothing


def test_a_verdict_that_changes_is_rewritten_on_the_parent(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    parent, _ = curve_sweep(uri)
    report(uri, parent)
    client = MlflowClient(uri)
    client.set_tag(parent, "k3lab.verdict.attnres_bs1", "stale")
    report(uri, parent)
    assert client.get_run(parent).data.tags["k3lab.verdict.attnres_bs1"] != "stale"


def test_killed_failed_and_diverged_trials_are_marked_on_their_runs(tmp_path):
    def blows_up(variant, seed, step):
        return 50.0 if (variant, seed, step) == ("attnres_bs1", 2, 6) else val_loss(variant, seed, step)

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    parent, trials = curve_sweep(uri, status={("attnres_bs1", 0): "KILLED", ("attnres_off", 1): "FAILED"},
                                 values=blows_up)
    report(uri, parent, rise=0.2)
    client = MlflowClient(uri)
    outcome = {key: client.get_run(run_id).data.tags[verdicts.OUTCOME] for key, run_id in trials.items()}
    assert outcome == {("attnres_off", 0): "finished", ("attnres_off", 1): "failed", ("attnres_off", 2): "finished",
                       ("attnres_bs1", 0): "killed", ("attnres_bs1", 1): "finished", ("attnres_bs1", 2): "diverged"}
    diverged = sorted(m.step for m in client.get_metric_history(trials[("attnres_bs1", 2)], verdicts.VS_BASELINE))
    assert diverged == [2, 4]  # nothing from the step where it blew up


def test_a_compared_trial_carries_its_variants_verdict(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    parent, trials = curve_sweep(uri)
    summary = report(uri, parent)
    tags = MlflowClient(uri).get_run(trials[("attnres_bs1", 0)]).data.tags
    assert tags[verdicts.VERDICT] == summary.comparisons[0].verdict
    assert verdicts.VERDICT not in MlflowClient(uri).get_run(trials[("attnres_off", 0)]).data.tags


def test_more_differences_than_one_log_batch_takes_are_sent_in_batches(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    run = MLflowTracker.start(uri, "big", "trial")
    verdicts.log_differences(runs.client(uri), {run.run_id: [(step, 0.5) for step in range(2500)]})
    assert len(MlflowClient(uri).get_metric_history(run.run_id, verdicts.VS_BASELINE)) == 2500


def test_variant_names_become_valid_metric_keys():
    assert verdicts.effect_key(verdicts.VS_BASELINE, "bs=2,full") == "vs_baseline_pct/bs_2_full"


def view_of(uri: str) -> dict:
    from k3lab.store import views

    experiment = MlflowClient(uri).get_experiment_by_name("mini")
    return views.unpack_state(json.loads(experiment.tags[views.SHARED_VIEW + views.LOSS_VIEW])["state"])


def test_the_saved_views_first_chart_is_each_variants_mean_difference_and_interval_titled_with_its_verdict(tmp_path):
    """It drew one line per trial, killed ones too, on a fixed -3..+3% axis, with no mean, interval or verdict."""
    from k3lab.store import views

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    parent, _ = curve_sweep(uri)
    summary = report(uri, parent)
    views.present_sweep(uri, parent, axis_params=["axis.attn_res_block_size"],
                        variant_order=["attnres_off", "attnres_bs1"])
    state = view_of(uri)
    first = state["compareRunCharts"][0]
    assert first["selectedMetricKeys"] == list(verdicts.CURVE) and first["range"] == {}  # an axis that fits them
    assert state["compareRunSections"][0]["uuid"] == first["metricSectionId"]
    title = state["compareRunSections"][0]["name"]
    assert title.startswith(f"attnres_bs1 {summary.comparisons[0].verdict} · Difference from the baseline")


def test_each_variant_run_carries_its_mean_difference_and_interval_at_every_evaluation(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    parent, trials = curve_sweep(uri)
    summary = report(uri, parent)
    report(uri, parent)  # again: nothing twice
    client = MlflowClient(uri)
    run = verdicts.variant_runs(runs.client(uri), parent)["attnres_bs1"]
    assert set(verdicts.variant_runs(runs.client(uri), parent)) == {"attnres_bs1"}  # the baseline is compared with nothing
    assert run.info.run_id not in {t.info.run_id for t in runs.trial_runs(uri, parent)}  # not one of the trials
    assert run.data.tags[runs.RUN_COLOR] == variant_colours(["attnres_off", "attnres_bs1"])["attnres_bs1"]
    mean, low, high = ({m.step: m.value for m in client.get_metric_history(run.info.run_id, key)}
                       for key in verdicts.CURVE)
    assert list(mean) == list(EVALS) and all(v == pytest.approx(-1.0) for v in mean.values())
    assert all(low[step] < mean[step] < high[step] for step in EVALS)
    parent_metrics = client.get_run(parent).data.metrics
    for name, prefix in zip(verdicts.VERDICT_NUMBERS, (verdicts.VS_BASELINE, verdicts.VS_LOW, verdicts.VS_HIGH)):
        assert run.data.metrics[name] == pytest.approx(parent_metrics[f"{prefix}/attnres_bs1"])
        assert len(client.get_metric_history(run.info.run_id, name)) == 1
    assert run.data.tags[verdicts.VERDICT] == summary.comparisons[0].verdict
    assert run.info.run_name.startswith(f"attnres_bs1 vs attnres_off: {summary.comparisons[0].verdict}, -1.00% (-1.")
    assert run.data.tags[verdicts.COMPARED_WITH] == "attnres_off"
    assert run.info.start_time == client.get_run(parent).info.start_time  # its duration is the sweep's


def test_group_labels_name_variants_not_axis_values(tmp_path):
    from k3lab.store import views

    from k3lab.store.labels import LABEL

    assert views.loss_view_state(["model.attn_res_block_size"])["groupBy"]["groupByKeys"] == [
        {"mode": "tag", "groupByData": LABEL}]


def test_the_runs_table_leads_with_the_verdict_and_its_numbers():
    """They came last, cut off at the right edge."""
    from k3lab.store import views

    columns = views.loss_view_state(["model.attn_res_block_size"])["selectedColumns"]
    assert columns[:4] == ["tags.`k3lab.verdict`", "metrics.`verdict_pct`", "metrics.`verdict_low_pct`",
                           "metrics.`verdict_high_pct`"]
    assert views.loss_view_state([])["columnOrder"][:4] == columns[:4]


def test_only_finished_trials_that_did_not_diverge_are_counted_and_shown(tmp_path):
    """The view's averages took killed trials in: bs4 +0.34% where the report said +0.95%."""
    def blows_up(variant, seed, step):
        return 50.0 if (variant, seed, step) == ("attnres_bs1", 2, 6) else val_loss(variant, seed, step)

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    parent, trials = curve_sweep(uri, status={("attnres_bs1", 0): "KILLED"}, values=blows_up)
    report(uri, parent, rise=0.2)
    client = MlflowClient(uri)
    counted = {key: client.get_run(run_id).data.tags[verdicts.COUNTED] for key, run_id in trials.items()}
    assert counted == {("attnres_off", 0): "true", ("attnres_off", 1): "true", ("attnres_off", 2): "true",
                       ("attnres_bs1", 0): "false", ("attnres_bs1", 1): "true", ("attnres_bs1", 2): "false"}
    experiment = client.get_run(parent).info.experiment_id
    from k3lab.store import views

    views.present_sweep(uri, parent, variant_order=["attnres_off", "attnres_bs1"])
    shown = client.search_runs([experiment], view_of(uri)["searchFilter"])  # what the view shows
    assert {r.info.run_id for r in shown} == {trials[k] for k, v in counted.items() if v == "true"} | {
        verdicts.variant_runs(runs.client(uri), parent)["attnres_bs1"].info.run_id,
        verdicts.variant_runs(runs.client(uri), parent, verdicts.BASELINE_KIND)["attnres_off"].info.run_id}  # its throughput


def test_the_verdict_lines_follow_the_files_order_and_say_when_there_is_no_interval(tmp_path):
    """They were alphabetical, and a single pair's line read "(family-wise interval)" with none."""
    from k3lab.store import views

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    parent, _ = curve_sweep(uri, variants=("attnres_off", "attnres_full", "attnres_bs2"), seeds=(0,))
    build_report(uri, parent, ReportOptions(baseline="attnres_off",
                                            variant_order=["attnres_off", "attnres_full", "attnres_bs2"]))
    lines = views.verdict_lines(MlflowClient(uri).get_run(parent).data, ["attnres_off", "attnres_full", "attnres_bs2"])
    assert [line.split("**")[1] for line in lines] == ["attnres_full", "attnres_bs2"]
    assert all(line.endswith("(no interval: too few pairs)") for line in lines)


def test_a_store_without_a_design_lists_variants_in_the_order_its_sweep_started_them(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    parent, _ = curve_sweep(uri, variants=("attnres_off", "attnres_full", "attnres_bs2"), seeds=(0,))
    client = MlflowClient(uri)
    assert runs.variant_order(uri, client.get_run(parent), runs.trial_runs(uri, parent)) == [
        "attnres_off", "attnres_full", "attnres_bs2"]


def test_the_parent_description_leads_with_its_links_and_names_each_variants_verdict(tmp_path):
    from k3lab.store import views

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    parent, _ = curve_sweep(uri)
    summary = report(uri, parent)
    views.present_sweep(uri, parent, variant_order=["attnres_off", "attnres_bs1"], description="two variants")
    note = MlflowClient(uri).get_run(parent).data.tags[runs.NOTE].splitlines()
    assert note[0].startswith(f"[{views.LOSS_VIEW_NAME}]")  # above the UI's fold
    assert note[2].startswith("val_loss against the baseline, %")  # right under the links
    assert f"**attnres_bs1** vs attnres_off: {summary.comparisons[0].verdict}, -1.00% (-1." in note[2]


def test_k3lab_ui_writes_the_verdicts_of_a_store_reported_before_them_and_refreshes_its_view(tmp_path):
    from k3lab.report.ui_store import prepare_store
    from k3lab.store import views

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    parent, trials = curve_sweep(uri)
    report(uri, parent, record=False)  # as an older k3lab reported it
    client = MlflowClient(uri)
    client.log_artifact(parent, __file__, "report")  # it has a report: none rebuilt
    old = views.loss_view_state([]) | {"compareRunCharts": [line_chart("train_loss", "s")]}
    experiment_id = client.get_run(parent).info.experiment_id
    for key, value in views.saved_view_tag(views.LOSS_VIEW, views.LOSS_VIEW_NAME, old).items():
        client.set_experiment_tag(experiment_id, key, value)
    said = []
    prepare_store(uri, say=said.append)
    assert any("verdicts" in line for line in said), said
    assert client.get_metric_history(trials[("attnres_bs1", 0)], verdicts.VS_BASELINE)
    assert view_of(uri)["compareRunCharts"][0]["selectedMetricKeys"] == list(verdicts.CURVE)
    assert "**attnres_bs1** vs attnres_off: " in client.get_run(parent).data.tags[runs.NOTE]
    assert "attnres_bs1" in verdicts.variant_runs(runs.client(uri), parent)
    said.clear()
    prepare_store(uri, say=said.append)
    assert said == []  # nothing left to do


@pytest.mark.slow
def test_the_sweeps_own_report_writes_the_differences_and_verdicts(tmp_path, sweep_file, isolated_data):
    """The end-of-sweep report (`k3lab.runner.tune.parent.report_sweep`) takes the same path as `k3lab report`."""
    from conftest import sweep_args

    from k3lab.cli import main

    assert main(sweep_args(tmp_path, sweep_file)) == 0
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    parent = runs.sweep_runs(uri)[0]
    trial = {runs.variant_of(t): t for t in runs.trial_runs(uri, parent.info.run_id)}
    history = MlflowClient(uri).get_metric_history(trial["attnres_bs1"].info.run_id, verdicts.VS_BASELINE)
    assert sorted(m.step for m in history) == [4, 8]  # the mini sweep evaluates at steps 4 and 8
    assert parent.data.tags["k3lab.verdict.attnres_bs1"] == "not resolved"  # one seed: one pair
    assert "vs_baseline_pct/attnres_bs1" in parent.data.metrics
    assert {t.data.tags[verdicts.OUTCOME] for t in trial.values()} == {"finished"}
    assert "attnres_bs1" in verdicts.variant_runs(runs.client(uri), parent.info.run_id)


def test_a_report_with_another_baseline_or_metric_leaves_the_stores_verdicts_alone(tmp_path, sweep_file):
    from k3lab.cli import main

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    parent, trials = curve_sweep(uri, seeds=(0, 1))
    command = ["report", str(sweep_file), "--storage", str(tmp_path / "runs"), "--tracking-uri", uri,
               "--out", str(tmp_path / "out")]
    assert main([*command, "--metric", "train_loss"]) == 0
    client = MlflowClient(uri)
    assert client.get_metric_history(trials[("attnres_bs1", 0)], verdicts.VS_BASELINE) == []
    assert verdicts.OUTCOME not in client.get_run(trials[("attnres_bs1", 0)]).data.tags
    assert main(command) == 0  # the sweep's own comparison
    assert len(client.get_metric_history(trials[("attnres_bs1", 0)], verdicts.VS_BASELINE)) == len(EVALS)


def test_each_variant_of_the_plan_gets_a_variant_run_naming_its_own_baseline_even_without_pairs(tmp_path):
    """In a sweep with one baseline per group every row was labelled with the first group's baseline,
    and a variant whose one trial was killed (no pairs) had no variant run and no line in the parent's
    description."""
    from k3lab.store import views

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    names = ("attnres_off", "attnres_bs1", "attnres_full", "attnres_bs2")
    parent, _ = curve_sweep(uri, variants=names, seeds=(0,), status={("attnres_bs2", 0): "KILLED"})
    client = MlflowClient(uri)
    build_report(uri, parent, ReportOptions(variant_order=list(names),
                                            baselines={"attnres_bs1": "attnres_off", "attnres_bs2": "attnres_full"}))
    found = verdicts.variant_runs(runs.client(uri), parent)
    assert set(found) == {"attnres_bs1", "attnres_bs2"}
    assert found["attnres_bs1"].info.run_name.startswith("attnres_bs1 vs attnres_off: ")
    assert found["attnres_bs2"].info.run_name == "attnres_bs2 vs attnres_full: not resolved, no pairs (1 killed trial)"
    assert found["attnres_bs2"].data.tags[verdicts.COUNTED] == "true"  # a group in the saved view
    views.present_sweep(uri, parent, variant_order=list(names))
    note = client.get_run(parent).data.tags[runs.NOTE]
    assert "**attnres_bs2** vs attnres_full: not resolved, no pairs (1 killed trial)" in note
