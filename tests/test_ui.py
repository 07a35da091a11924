"""What the MLflow UI is given to show a sweep (k3lab.store.views, k3lab ui), without a browser:
tests/test_ui_browser.py checks it in one."""

import json
import lzma
import shutil
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from k3lab.store import labels, runs, views
from k3lab.store.colours import variant_colours
from k3lab.store.tracking import MLflowTracker


def fake_sweep(uri: str, experiment: str = "mini", variants=("attnres_off", "attnres_bs1"), seeds=(0, 1),
               steps=4, parent_status: str = "FINISHED") -> tuple[str, dict]:
    """A parent run with finished trials logging train_loss/val_loss, as a sweep records them."""
    parent = MLflowTracker.start(uri, experiment, experiment, tags=runs.sweep_tags(
        experiment, None, "0", "abc", "two variants", "k3lab sweep mini.yaml", variants[0]))
    parent.log_params({"metric": "val_loss:min"})
    trials = {}
    for variant in variants:
        for seed in seeds:
            trial = MLflowTracker.start(uri, experiment, f"{variant}-s{seed}",
                                        tags=runs.trial_tags(f"id-{variant}", variant, seed),
                                        parent_run_id=parent.run_id)
            trial.log_params({"axis.attn_res_block_size": variant.removeprefix("attnres_"), "params.total": 10,
                              "params.active": 10})
            for step in range(1, steps + 1):
                trial.log_metrics({"train_loss": 5.0 - step * 0.1 - seed * 0.01, "tokens_per_s": 100.0}, step)
            trial.log_metrics({"val_loss": 4.5 + (variant != variants[0]) * 0.05, "tokens": 64.0}, steps)
            trial.finish("FINISHED")
            trials[(variant, seed)] = trial.run_id
    if parent_status == "RUNNING":
        parent.flush()
    else:
        parent.finish(parent_status)
    return parent.run_id, trials


def test_a_sweep_is_shown_as_model_training_with_its_loss_view_and_colours(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    parent_run_id, trials = fake_sweep(uri)
    views.present_sweep(uri, parent_run_id, axis_params=["axis.attn_res_block_size"],
                        variant_order=["attnres_off", "attnres_bs1"], description="two variants")
    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("mini")
    assert experiment.tags[runs.EXPERIMENT_KIND] == "custom_model_development"
    envelope = json.loads(experiment.tags[views.SHARED_VIEW + views.LOSS_VIEW])
    state = views.unpack_state(envelope["state"])
    assert envelope["name"] == "Loss curves by variant"
    assert [c["metricKey"] for c in state["compareRunCharts"]] == ["mean_pct", "train_loss", "val_loss",
                                                                    "variant_tokens_per_s"]  # a line per variant
    assert state["compareRunCharts"][0]["selectedMetricKeys"] == ["mean_pct", "low_pct", "high_pct"]
    assert state["searchFilter"] == "tags.`k3lab.counted` = 'true'"  # what the verdicts rest on, nothing else
    assert state["selectedColumns"][:4] == ["tags.`k3lab.verdict`", "metrics.`verdict_pct`",
                                            "metrics.`verdict_low_pct`", "metrics.`verdict_high_pct`"]
    assert state["groupBy"]["groupByKeys"] == [{"mode": "tag", "groupByData": labels.LABEL}]
    assert state["runsHiddenMode"] == "SHOW_ALL" and state["useGroupedValuesInCharts"] is False
    # ordered by start time, MLflow's page fetches the parents of the runs it shows (shouldFetchParents),
    # and grouped, the sweep's parent sat under "Additional runs" among the trials
    assert state["orderByKey"] != "attributes.start_time"
    note = experiment.tags[runs.NOTE]
    assert views.view_link(experiment.experiment_id) in note.splitlines()[0]  # in the line the UI shows
    assert f"runs/{parent_run_id}/artifacts/report/loss_curves.png" in note.splitlines()[0]
    colours = variant_colours(["attnres_off", "attnres_bs1"])
    for (variant, seed), run_id in trials.items():
        run = client.get_run(run_id)
        assert run.info.run_name == f"{variant}-s{seed}"
        assert run.data.tags[runs.RUN_COLOR] == colours[variant]  # both seeds of a variant: one colour
    parent_note = client.get_run(parent_run_id).data.tags[runs.NOTE]
    assert parent_note.splitlines()[2] == "two variants"
    assert "#/metric/val_loss?runs=" in parent_note and all(r in parent_note for r in trials.values())
    assert f"Group by* the tag `{labels.LABEL}`" in parent_note
    assert ".." not in parent_note.replace("...", "")  # "is `final_val_loss`.." once
    views.present_sweep(uri, parent_run_id, axis_params=["axis.attn_res_block_size"])  # again: the same, one view
    assert [k for k in client.get_experiment_by_name("mini").tags if k.startswith(views.SHARED_VIEW)] == \
        [views.SHARED_VIEW + views.LOSS_VIEW]


def test_the_report_plots_and_the_ui_colour_a_variant_alike():
    from k3lab.store.colours import colours_in_file_order as report_colours

    order = ["attnres_off", "attnres_full", "attnres_bs2"]
    assert report_colours(["attnres_bs2", "attnres_off"], order) == {
        name: colour for name, colour in variant_colours(order).items() if name != "attnres_full"} | {
        "attnres_full": variant_colours(order)["attnres_full"]}
    assert len(set(variant_colours([f"v{i}" for i in range(20)]).values())) == 20


def test_a_sweep_of_named_variants_is_grouped_by_variant_label():
    state = views.loss_view_state([])
    assert state["groupBy"]["groupByKeys"] == [{"mode": "tag", "groupByData": labels.LABEL}]


def test_ui_app_starts_a_new_browser_in_model_training():
    from k3lab import ui_app

    page = ui_app.flask_app.test_client().get("/")
    assert page.status_code == 200
    html = page.get_data(as_text=True)
    assert html.index("k3lab ui: first-visit defaults") < html.index("<script defer")  # before the app's code
    assert '"mlflow.workflowType_v1": "machine_learning"' in html
    assert "text/html" in page.headers["Content-Type"]
    assert ui_app.flask_app.test_client().get("/health").get_data(as_text=True) == "OK"  # the rest: as it was


def test_a_copied_compressed_store_opens_with_its_artifacts_and_report(tmp_path, capsys):
    from k3lab.commands.ui import store_uri
    from k3lab.report.ui_store import prepare_store

    origin = tmp_path / "origin"
    origin.mkdir()
    parent_run_id, _ = fake_sweep(f"sqlite:///{origin / 'mlflow.db'}")
    archive = tmp_path / "mini.db.xz"  # what docs/runs holds: the database alone, no mlartifacts/
    archive.write_bytes(lzma.compress((origin / "mlflow.db").read_bytes()))
    shutil.rmtree(origin)

    class Args:
        store, tracking_uri, unpack_dir = str(archive), None, str(tmp_path / "opened")

    uri = store_uri(Args)
    assert uri == f"sqlite:///{tmp_path / 'opened' / 'mlflow.db'}"
    prepare_store(uri)
    said = capsys.readouterr().out
    assert "artifact locations" in said and "rebuilt the report" in said
    client = MlflowClient(uri)
    run = client.get_run(parent_run_id)
    assert run.info.artifact_uri.startswith((tmp_path / "opened" / "mlartifacts").as_uri())
    names = {a.path for a in client.list_artifacts(parent_run_id, "report")}
    assert {"report/loss_curves.png", "report/summary.json"} <= names
    experiment = client.get_experiment(run.info.experiment_id)
    assert views.SHARED_VIEW + views.LOSS_VIEW in experiment.tags  # a store from before the view gets it
    prepare_store(uri)  # a second time: nothing left to do
    assert capsys.readouterr().out == ""


def test_ui_refuses_what_its_server_could_not_serve_in_one_line_and_leaves_nothing(tmp_path, capsys, monkeypatch):
    """Where MLflow's server would print its error and still exit 0, or turn a file into a database."""
    import socket

    from k3lab.cli import main
    from k3lab.commands import ui

    def server_started(*args):
        raise AssertionError("the server was started")

    monkeypatch.setattr(ui.os, "execve", server_started)

    store = tmp_path / "mlflow.db"
    fake_sweep(f"sqlite:///{store}")
    (tmp_path / "notes.txt").write_text("")
    (tmp_path / "broken.db.xz").write_bytes(b"not xz")
    capsys.readouterr()  # MLflow's notices while the store was made
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = taken.getsockname()[1]
        cases = [([str(store), "--port", "99999"], "--port: must be 1 .. 65535, got 99999"),
                 ([str(store), "--port", str(busy)], f"--port {busy}: the UI cannot listen there (Address already in use)"),
                 ([str(tmp_path / "notes.txt")], "notes.txt: not an MLflow store (no MLflow tables in it)"),
                 ([str(tmp_path / "broken.db.xz"), "--unpack-dir", str(tmp_path / "opened")],
                  "broken.db.xz: not a complete .xz archive"),
                 ([str(tmp_path / "broken.db.xz"), "--unpack-dir", str(tmp_path / "notes.txt")],
                  "notes.txt: is a file, not a folder")]
        for argv, message in cases:
            assert main(["ui", *argv]) == 2
            err = capsys.readouterr().err
            assert message in err and err.count("\n") == 1, (argv, err)
    assert (tmp_path / "notes.txt").read_text() == "" and not (tmp_path / "opened").exists()


@pytest.mark.parametrize("driver, trials_running, ended_ago_s, expected", [
    ("{host}:{dead}", False, 5, "interrupted"),  # this host, the process is gone
    ("{host}:{alive}", False, 5, "RUNNING"),
    ("elsewhere:1", True, 5000, "RUNNING"),  # another host: trials still running
    ("elsewhere:1", False, 60, "RUNNING"),  # ... the last just ended (the driver may be reporting)
    ("elsewhere:1", False, 5000, "interrupted"),
    (None, False, 5000, "interrupted"),  # a store from before k3lab.driver
])
def test_a_parent_run_whose_driver_died_is_interrupted(driver, trials_running, ended_ago_s, expected):
    import os
    import socket
    import subprocess
    import sys
    from types import SimpleNamespace as NS

    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    tags = {} if driver is None else {runs.DRIVER: driver.format(host=socket.gethostname(), dead=done.stdout.strip(),
                                                                 alive=os.getpid())}
    parent = NS(info=NS(status="RUNNING"), data=NS(tags=tags))
    trial = NS(info=NS(status="RUNNING" if trials_running else "FINISHED", end_time=None if trials_running else 1))
    assert runs.sweep_state(parent, [trial], now_ms=1 + ended_ago_s * 1000) == expected
    assert runs.sweep_state(NS(info=NS(status="FINISHED"), data=NS(tags=tags)), [trial]) == "FINISHED"


def test_params_of_a_switched_off_feature_read_off():
    from k3lab.model.config import tiny_config
    from k3lab.registry.train_spec import TrainSpec
    from k3lab.registry.model_variants import Variant
    from k3lab.runner.tune.trial import TrialSpec, trial_params, variant_params

    def params(**fields):
        config = tiny_config(**fields)
        variant = Variant("v", "v", "ok", {"attn_res_block_size": "off"}, (0,), config)
        spec = TrialSpec(variant_id="v", variant_name="v", seed=0, config=config, train=TrainSpec(),
                         tracking_uri=None, experiment="e", params=variant_params(variant, TrainSpec(), 0))
        return trial_params(spec, {"total": 1, "by_component": {}})

    off = params(use_attn_res=False)
    assert off["model.attn_res_block_size"] == "off" and off["model.attn_res_proj_init"] == "off"
    assert off["model.use_attn_res"] is False and "axis.attn_res_block_size" not in off  # one param per value
    assert off["model.num_experts"] == 4  # MoE is on in tiny
    on = params()
    assert on["model.attn_res_block_size"] == 2
    dense = params(num_dense_layers=4)
    assert dense["model.num_experts"] == "off" and dense["model.moe_latent_size"] == "off"
    all_kda = params(layer_types=("kda",) * 4)
    assert all_kda["model.mla_num_heads"] == "off" and all_kda["model.kda_num_heads"] == tiny_config().kda_num_heads


def test_a_sweep_whose_driver_died_is_reported_interrupted_and_closed(tmp_path, sweep_file, capsys):
    import subprocess
    import socket
    import sys

    from k3lab.cli import main

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    parent_run_id, _ = fake_sweep(uri, seeds=(0,), parent_status="RUNNING")
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    client = MlflowClient(uri)
    client.set_tag(parent_run_id, runs.DRIVER, f"{socket.gethostname()}:{gone.stdout.strip()}")
    report = ["report", str(sweep_file), "--storage", str(tmp_path / "runs"), "--tracking-uri", uri]
    assert main(report) == 0
    out = capsys.readouterr().out
    assert "interrupted" in out and "--resume" in out and "--close" in out
    parent = client.get_run(parent_run_id)
    assert parent.info.status == "RUNNING" and parent.data.tags[runs.STATUS] == "interrupted"
    assert "**Interrupted**" in parent.data.tags[runs.NOTE]
    assert main([*report, "--close"]) == 0
    parent = client.get_run(parent_run_id)
    last_end = max(t.info.end_time for t in runs.trial_runs(uri, parent_run_id))
    assert parent.info.status == "KILLED" and parent.info.end_time == last_end
    assert parent.data.tags[runs.STATUS] == "interrupted"
    capsys.readouterr()
    assert main([*report, "--close"]) == 2  # closed already
    assert "nothing to close" in capsys.readouterr().err


@pytest.mark.parametrize("path", sorted((Path(__file__).resolve().parents[1] / "experiments").glob("*.yaml")))
def test_every_shipped_gpu_profile_makes_val_loss_a_curve(path):
    from k3lab.registry.sweep_cli import load_sweep_for

    for profile in ("gpu", "gpu2"):
        try:
            sweep = load_sweep_for(str(path), profile)
        except Exception as error:  # a file without that profile
            assert profile in str(error) or profile == "gpu2", error
            continue
        assert sweep.train.num_evals >= 8, (path.name, profile, sweep.train.num_evals)


def test_report_of_a_sweep_stopped_before_its_tune_folder_suggests_overwrite_not_resume(tmp_path, sweep_file, capsys):
    """It said `--resume` continues it, which refuses a run with no Tune folder."""
    import json
    import subprocess
    import socket
    import sys

    from k3lab.cli import main

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    parent_run_id, _ = fake_sweep(uri, seeds=(0,), parent_status="RUNNING")
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    MlflowClient(uri).set_tag(parent_run_id, runs.DRIVER, f"{socket.gethostname()}:{gone.stdout.strip()}")
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "mini.k3lab.json").write_text(json.dumps({"parent_run_id": parent_run_id, "tracking_uri": uri}))
    assert main(["report", str(sweep_file), "--storage", str(tmp_path / "runs"), "--tracking-uri", uri]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert (f"`k3lab sweep {sweep_file} --storage {tmp_path / 'runs'} --tracking-uri {uri} --overwrite` starts it again"
            in out and "--resume" not in out)


def test_report_of_a_sweep_killed_before_any_trial_logged_a_metric_is_a_report_not_a_traceback(tmp_path, sweep_file,
                                                                                              capsys):
    """plot_loss_curves ended in `ValueError: number sections must be larger than 0` (a legend of 0 columns)."""
    import json

    from k3lab.cli import main

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    parent = MLflowTracker.start(uri, "mini", "mini", tags=runs.sweep_tags(
        "mini", None, "0", "abc", "two variants", "k3lab sweep mini.yaml", "attnres_off"))
    for variant in ("attnres_off", "attnres_bs1"):  # started, killed before their first step
        MLflowTracker.start(uri, "mini", f"{variant}-s0", tags=runs.trial_tags(f"id-{variant}", variant, 0),
                            parent_run_id=parent.run_id).flush()
    parent.flush()
    (tmp_path / "runs" / "mini").mkdir(parents=True)
    (tmp_path / "runs" / "mini.k3lab.json").write_text(json.dumps({"parent_run_id": parent.run_id, "tracking_uri": uri}))
    assert main(["report", str(sweep_file), "--storage", str(tmp_path / "runs"), "--tracking-uri", uri]) == 0
    out = capsys.readouterr().out
    assert "attnres_bs1" in out and (tmp_path / "runs" / "mini_report" / "loss_curves.png").exists()


def verdicts_of(summary: dict) -> dict[str, tuple]:
    """{variant: (verdict, pairs, low, high)} of a report's summary.json."""
    return {row["variant"]: (row["paired"]["verdict"], row["paired"]["pairs"], round(row["paired"]["low"], 6),
                             round(row["paired"]["high"], 6))
            for row in summary["variants"] if row["paired"] and row["paired"]["low"] is not None}


def test_ui_and_report_give_a_stored_sweep_the_same_verdicts(tmp_path):
    """The H200 run of 2026-12-02 as docs/runs holds it: `k3lab ui`'s rebuilt report and `k3lab
    report` read the design the store carries, so both call full-depth AttnRes better and the rest
    not resolved, with the same intervals (the rebuilt report once called three of them better
    with per-comparison t-intervals, against the results' 'not resolved')."""
    from k3lab.cli import main
    from k3lab.commands.ui import store_uri
    from k3lab.report.ui_store import prepare_store

    class Args:
        store = str(Path(__file__).resolve().parents[1] / "docs/runs/attnres_block-gpu-paired-2026-12-02.db.xz")
        tracking_uri, unpack_dir = None, str(tmp_path / "opened")

    uri = store_uri(Args)
    prepare_store(uri, say=lambda _: None)
    client = MlflowClient(uri)
    parent = runs.sweep_runs(uri)[0].info.run_id
    rebuilt = json.loads(Path(client.download_artifacts(parent, "report/summary.json")).read_text())
    file = Path(__file__).resolve().parents[1] / "experiments/attnres_block.yaml"
    assert main(["report", str(file), "--profile", "gpu", "--tracking-uri", uri, "--storage", str(tmp_path / "runs"),
                 "--out", str(tmp_path / "out")]) == 0
    reported = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert rebuilt["design"] == reported["design"] and rebuilt["design"]["rule"] == "decided"
    assert verdicts_of(rebuilt) == verdicts_of(reported)
    assert {v: row[0] for v, row in verdicts_of(reported).items()} == {
        "attnres_full": "better", "attnres_bs2": "not resolved", "attnres_bs4": "not resolved",
        "attnres_bs8": "not resolved"}


def test_a_store_from_before_designs_gets_family_wise_intervals_in_the_ui(tmp_path):
    from k3lab.report.ui_store import rebuild_missing_reports

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    parent, _ = fake_sweep(uri, variants=("attnres_off", "attnres_bs1", "attnres_bs2"))
    assert runs.read_design(uri, MlflowClient(uri).get_run(parent)) is None
    rebuild_missing_reports(uri)
    summary = json.loads(Path(MlflowClient(uri).download_artifacts(parent, "report/summary.json")).read_text())
    assert (summary["design"]["rule"], summary["design"]["comparisons"]) == ("fixed", 2)
    assert summary["design"]["level"] == pytest.approx(0.025)  # Bonferroni over the 2 comparisons


def sweep_snapshot(uri: str, experiment: str) -> dict:
    """Everything of an experiment a viewer could write: its tags, and each run's status, tags,
    metric histories and artifacts."""
    client = MlflowClient(uri)
    found = client.get_experiment_by_name(experiment)
    snapshot = {"experiment": dict(found.tags)}
    for run in client.search_runs([found.experiment_id]):
        run_id = run.info.run_id
        snapshot[run_id] = (run.info.status, run.info.artifact_uri, dict(run.data.tags),
                            {k: [(m.step, m.value) for m in client.get_metric_history(run_id, k)]
                             for k in run.data.metrics},
                            [a.path for a in client.list_artifacts(run_id)])
    return snapshot


def test_k3lab_ui_never_writes_into_a_sweep_whose_driver_runs(tmp_path):
    """Opened while a sweep ran, it rebuilt the report into the running parent's artifacts and
    tagged a running trial `k3lab.verdict=not resolved`."""
    from k3lab.report.ui_store import prepare_store

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    fake_sweep(uri, experiment="ended")
    live, _ = fake_sweep(uri, experiment="live", parent_status="RUNNING")  # its driver: this process, alive
    before = sweep_snapshot(uri, "live")
    said = []
    prepare_store(uri, say=said.append)
    assert sweep_snapshot(uri, "live") == before
    assert any("left 1 running sweep" in line for line in said), said
    ended = MlflowClient(uri).get_experiment_by_name("ended")
    assert views.SHARED_VIEW + views.LOSS_VIEW in ended.tags  # the ended sweep got what the UI needs


def older_sweep(uri: str, experiment: str = "old") -> list[str]:
    """A finished sweep of two trials as an older k3lab logged it (the plain metric names only);
    returns its trials' run ids."""
    client = MlflowClient(uri)
    experiment_id = client.create_experiment(experiment)
    parent = client.create_run(experiment_id, run_name=experiment, tags=runs.sweep_tags(
        experiment, None, "0", "abc", "", f"k3lab sweep {experiment}.yaml", "attnres_off")).info.run_id
    trials = []
    for variant in ("attnres_off", "attnres_bs1"):
        run_id = client.create_run(experiment_id, run_name=f"{variant}-s0", tags=runs.trial_tags(
            f"id-{variant}", variant, 0) | {runs.PARENT: parent}).info.run_id
        for step in (1, 2, 3):
            for name in ("train_loss", "val_loss", "tokens_per_s"):
                client.log_metric(run_id, name, 4.0 - step / 10 + (variant == "attnres_bs1") * 0.01, step=step)
            client.log_metric(run_id, "diag/attnres_entropy/L00", 0.5, step=step)  # sorts before the loss
        client.set_terminated(run_id, "FINISHED")
        trials.append(run_id)
    client.set_terminated(parent, "FINISHED")
    return trials


def test_an_older_stores_trials_get_their_loss_under_loss_so_their_page_opens_on_it(tmp_path):
    """A trial page on the 2026-12-02 store opened on 23 diagnostics before its loss."""
    from k3lab.report.ui_store import prepare_store
    from k3lab.store.metrics import PAGE_SECTIONS

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    trials = older_sweep(uri)
    prepare_store(uri, say=lambda _: None)
    client = MlflowClient(uri)
    for run_id in trials:
        for name in ("train_loss", "val_loss", "tokens_per_s"):
            history = [(m.step, m.value) for m in client.get_metric_history(run_id, name)]
            assert [(m.step, m.value) for m in client.get_metric_history(run_id, PAGE_SECTIONS[name])] == history
        metrics = client.get_run(run_id).data.metrics
        assert "probe/attnres_entropy/L00" in metrics and "diag/attnres_entropy/L00" not in metrics  # after the loss
        assert len(client.get_metric_history(run_id, "probe/attnres_entropy/L00")) == 3


def test_an_older_stores_diagnostics_move_under_probe_and_mlflows_system_metrics_stay(tmp_path):
    """`k3lab ui` regroups an older store's diagnostics (diag/, moe/, attnres/) under probe/ so that a
    trial's page opens on its loss; the system metrics MLflow shows on their own tab keep their names."""
    from mlflow.tracking import MlflowClient

    from k3lab.store.metrics import regroup_diagnostics

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(uri)
    run = client.create_run(client.create_experiment("older")).info.run_id
    for key in ("diag/grad_norm", "moe/balance", "loss/val_loss", "system/cpu_utilization_percentage"):
        client.log_metric(run, key, 1.0, step=1)
    assert regroup_diagnostics(tmp_path / "mlflow.db", [run]) == 2
    assert sorted(client.get_run(run).data.metrics) == [
        "loss/val_loss", "probe/grad_norm", "probe/moe/balance", "system/cpu_utilization_percentage"]
