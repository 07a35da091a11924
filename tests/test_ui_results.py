"""The views that answer a sweep's question in the MLflow UI (k3lab.store.result_views): its variant
runs (each against its own baseline) and a factorial sweep's effect runs, on the moe_ablation
cpu_factorial store of docs/runs as `k3lab ui` fills in a store written before them."""

import json
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from k3lab.store import runs, verdicts, views
from k3lab.store.labels import FITS, LABEL, run_labels, short_labels
from k3lab.store.result_views import EFFECT_VIEW, VERDICT_VIEW

STORE = Path(__file__).resolve().parents[1] / "docs/runs/moe_ablation-cpu_factorial-2026-12-06.db.xz"
INTERACTION = "ffn=latent_moe (vs moe) x num_experts_per_token=2 (vs 1)"


@pytest.fixture(scope="module")
def factorial(tmp_path_factory):
    """The store unpacked and prepared as `k3lab ui` does: (tracking URI, parent run, its report summary)."""
    from k3lab.report.summary import build_report
    from k3lab.report.ui_store import prepare_store, report_options
    from k3lab.store.archive import store_tracking_uri

    uri = store_tracking_uri(str(STORE), str(tmp_path_factory.mktemp("factorial")))
    prepare_store(uri, say=lambda line: None)
    parent = runs.sweep_runs(uri)[0]
    trials = runs.trial_runs(uri, parent.info.run_id)
    summary = build_report(uri, parent.info.run_id, report_options(uri, parent, trials), record=False)
    return uri, parent, summary


def saved_view(uri: str, parent, view_id: str) -> dict:
    tags = MlflowClient(uri).get_experiment(parent.info.experiment_id).tags
    return views.unpack_state(json.loads(tags[views.SHARED_VIEW + view_id])["state"])


def test_each_factorial_effect_is_an_effect_run_with_its_interval_and_the_reports_verdict(factorial):
    """The main effects and interactions (the ffn x top-k interaction -0.60% +/- 0.34%) appeared in no
    chart, table, metric or description: only in summary.json."""
    uri, parent, summary = factorial
    found = verdicts.variant_runs(runs.client(uri), parent.info.run_id, verdicts.EFFECT_KIND)
    assert set(found) == {effect.label for effect in summary.factorial} and INTERACTION in found
    effect = next(e for e in summary.factorial if e.label == INTERACTION)
    run = found[INTERACTION]
    assert run.data.tags[verdicts.VERDICT] == effect.verdict == "nonzero"
    assert run.data.metrics["effect_pct"] == pytest.approx(effect.relative)
    assert run.data.metrics["effect_high_pct"] - run.data.metrics["effect_pct"] == pytest.approx(
        effect.relative_half_width)
    assert run.info.run_name == (f"ffn=latent_moe x num_experts_per_token=2: nonzero, {effect.relative:+.2f}% "
                                 f"({effect.relative - effect.relative_half_width:+.2f} to "
                                 f"{effect.relative + effect.relative_half_width:+.2f})")


def test_the_factorial_effects_view_is_linked_from_the_experiments_first_line_and_charts_only_effects(factorial):
    uri, parent, _ = factorial
    state = saved_view(uri, parent, EFFECT_VIEW)
    assert state["searchFilter"] == f"tags.`{runs.KIND}` = '{verdicts.EFFECT_KIND}'"  # the legend: effects alone
    assert [(c["type"], c["metricKey"]) for c in state["compareRunCharts"]] == [("BAR", "effect_pct")]
    assert state["compareRunSections"][0]["columns"] == 1  # one wide chart
    assert "metrics.`effect_low_pct`" in state["selectedColumns"]
    first_line = MlflowClient(uri).get_experiment(parent.info.experiment_id).tags[runs.NOTE].splitlines()[0]
    assert f"viewStateShareKey={EFFECT_VIEW}" in first_line and f"viewStateShareKey={VERDICT_VIEW}" in first_line


def test_the_verdict_view_asks_the_question_in_percent_and_charts_only_variant_runs(factorial):
    """Its first chart was 308 x 258 px, titled "mean_pct vs low_pct vs high_pct", with a legend of
    mean/low/high for every trial."""
    uri, parent, _ = factorial
    state = saved_view(uri, parent, VERDICT_VIEW)
    assert state["searchFilter"] == f"tags.`{runs.KIND}` = '{verdicts.VARIANT_KIND}'"
    first = state["compareRunCharts"][0]
    assert first["displayName"].startswith("Is val_loss lower than the baseline's?") and "%" in first["displayName"]
    assert first["metricKey"] == "verdict_pct" and state["compareRunSections"][0]["columns"] == 1
    assert state["compareRunSections"][0]["name"].startswith("Is val_loss lower than the baseline's?")


def test_in_a_sweep_with_a_baseline_per_group_each_variant_run_names_its_own(factorial):
    """The view's difference section and val_loss_vs_baseline.png named ffn_moe_top1_shared0 for every row."""
    uri, parent, summary = factorial
    found = verdicts.variant_runs(runs.client(uri), parent.info.run_id)
    assert set(found) == set(summary.pairs)
    labels = run_labels(summary.variant_order)
    for variant, baseline in summary.pairs.items():
        assert found[variant].info.run_name.startswith(f"{labels[variant]} vs {labels[baseline]}: ")
        assert found[variant].data.tags[verdicts.COMPARED_WITH] == baseline
        assert verdicts.full_name(found[variant]).startswith(f"{variant} vs {baseline}: ")
    assert len(set(summary.pairs.values())) > 1  # a baseline per group indeed


def test_the_grids_runs_are_named_by_the_values_that_differ_their_full_names_in_tags(factorial):
    """"Group: ffn_latent_m..." rows and "ffn_latent_moe_top2_sh..." trials could not be told apart
    where the runs list cuts names short."""
    uri, parent, summary = factorial
    labels, groups = run_labels(summary.variant_order), short_labels(summary.variant_order)
    assert labels["ffn_latent_moe_top2_shared1"] == "latent top2 shared1" and labels["dense"] == "dense"
    assert labels["ffn_moe_top2_shared1"] == "top2 shared1" and len(set(labels.values())) == len(labels)
    assert groups["ffn_latent_moe_top2_shared1"] == "latent t2 s1" and groups["ffn_moe_top2_shared1"] == "t2 s1"
    assert max(map(len, groups.values())) <= FITS and len(set(groups.values())) == len(groups)
    trials = runs.trial_runs(uri, parent.info.run_id)
    for trial in trials:
        variant, seed = runs.variant_of(trial), runs.seed_of(trial)
        assert trial.info.run_name == f"{labels[variant]}-s{seed}" and trial.data.tags[LABEL] == groups[variant]
        assert verdicts.full_name(trial) == f"{variant}-s{seed}"
    assert len({t.info.run_name for t in trials}) == len(trials)
    for variant, run in verdicts.variant_runs(runs.client(uri), parent.info.run_id).items():
        assert run.data.tags[LABEL] == groups[variant] and run.info.run_name.startswith(f"{labels[variant]} vs ")
    assert saved_view(uri, parent, views.LOSS_VIEW)["groupBy"]["groupByKeys"] == [{"mode": "tag", "groupByData": LABEL}]


def test_throughput_is_one_line_per_variant_in_its_trials_colour(factorial):
    """tokens_per_s was a tangle of every trial."""
    uri, parent, summary = factorial
    client = MlflowClient(uri)
    summaries = {**verdicts.variant_runs(runs.client(uri), parent.info.run_id),
                 **verdicts.variant_runs(runs.client(uri), parent.info.run_id, verdicts.BASELINE_KIND)}
    assert set(summaries) == set(summary.variant_order)  # every variant of the plan: compared or a baseline
    trials = runs.trial_runs(uri, parent.info.run_id)
    for variant, run in summaries.items():
        own = [t for t in trials if runs.variant_of(t) == variant]
        assert {t.data.tags[runs.RUN_COLOR] for t in own} == {run.data.tags[runs.RUN_COLOR]}  # one colour
        line = client.get_metric_history(run.info.run_id, verdicts.THROUGHPUT)
        last = max(m.step for m in line)
        at_last = [m.value for t in own for m in client.get_metric_history(t.info.run_id, "tokens_per_s")
                   if m.step == last]
        assert [m.value for m in line if m.step == last] == [pytest.approx(sum(at_last) / len(at_last))]
        assert len({m.step for m in line}) == len(line)  # each step once
    charts = saved_view(uri, parent, views.LOSS_VIEW)["compareRunCharts"]
    assert verdicts.THROUGHPUT in [c["metricKey"] for c in charts] and "tokens_per_s" not in [
        c["metricKey"] for c in charts]


def test_the_loss_charts_are_zoomed_on_the_second_half_of_training(factorial):
    """They spanned 1-6, so 0.03 differences were invisible."""
    uri, parent, _ = factorial
    charts = {c["metricKey"]: c for c in saved_view(uri, parent, views.LOSS_VIEW)["compareRunCharts"]}
    zoom = charts["val_loss"]["range"]
    finals = [t.data.metrics["val_loss"] for t in runs.trial_runs(uri, parent.info.run_id)
              if t.data.tags.get(verdicts.COUNTED) == "true"]
    assert zoom["yMin"] <= min(finals) and zoom["yMax"] - zoom["yMin"] < 0.5 * max(finals)
    assert zoom["xMin"] > 0 and "zoomed" in charts["val_loss"]["displayName"]


def test_k3lab_ui_shows_a_stopped_sweep_of_an_older_store_finished_not_killed(tmp_path):
    """An older k3lab ended a resumable stop KILLED: a red cross in the UI, its description saying
    "Stopped, resumable"."""
    from k3lab.store.tracking import MLflowTracker

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    parent = MLflowTracker.start(uri, "old", "old", tags=runs.sweep_tags("old", None, "0", "abc", "", "", None))
    parent.set_tags({runs.STATUS: runs.STOPPED})
    parent.finish("KILLED")
    views.present_earlier_sweeps(uri)
    run = MlflowClient(uri).get_run(parent.run_id)
    assert run.info.status == "FINISHED" and run.data.tags[runs.STATUS] == runs.STOPPED
    assert runs.sweep_state(run, []) == runs.STOPPED
