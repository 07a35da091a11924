"""The MLflow UI in a real browser: Playwright driving Debian's chromium against `k3lab ui` on the
store of a CPU mini sweep made here (3 seeds, and a killed trial added to it), clicking as a
researcher would from the experiment list.

Checks what issues 25, 65 and 73 found wrong: the experiment opens in the training view (not
GenAI's Overview) with the parent run; the loss curves of every counted trial, one colour per
variant, are two clicks away (the test counts them), the first chart each compared variant's mean
difference from the baseline and its interval (three lines in its colour), no killed trial in the
view, and the view's group values the report's means; a trial's val_loss chart renders; its params
say "off" for AttnRes off; the parent's report plots open as artifacts; the descriptions' links
open under a mouse click at their centre; a trial of an older store opens on its loss; and a sweep
whose driver runs is left exactly as it was by opening the UI on its store. Screenshots go to
K3LAB_UI_SCREENSHOTS (docs/ui for the README: `K3LAB_UI_SCREENSHOTS=docs/ui python -m pytest
tests/test_ui_browser.py`), else to the test's temporary folder.

Needs `playwright` (the test extra) and a `chromium` on PATH (`apt-get install chromium`; .ci/run
installs it); Playwright never downloads a browser here. Without them the test skips and says why.
"""

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from conftest import mini_sweep, sweep_args
from test_ui import fake_sweep, older_sweep, sweep_snapshot

pytestmark = [pytest.mark.browser, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[1]
TIMEOUT_MS = 90_000  # a cold MLflow UI on two shared cores


def browser_or_skip() -> str:
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        pytest.skip("playwright is not installed (pip install -e '.[test]')")
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.skip("no chromium on PATH (Debian: apt-get install chromium; .ci/run installs it)")
    return chromium


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def swept(tmp_path_factory, data_dir):
    """A CPU mini sweep (AttnRes off against block size 1, 3 seeds, 8 steps) in its own folder, with
    a killed trial of seed 3 added to it as a stopped sweep leaves one (a partial curve far off its
    variant's), the report then written again; beside it in the store an older k3lab's sweep
    (`older_sweep`) and a sweep whose driver runs (`fake_sweep`: this process drives it)."""
    from mlflow import MlflowClient

    from k3lab.cli import main
    from k3lab.store import runs

    folder = tmp_path_factory.mktemp("ui-sweep")
    sweep_file = folder / "mini.yaml"
    text = mini_sweep("mini", "AttnRes off against block size 1 on a 2-layer tiny model")
    sweep_file.write_text(text.replace("seeds: [0]", "seeds: [0, 1, 2]"))
    uri = f"sqlite:///{folder / 'mlflow.db'}"
    os.environ["K3LAB_DATA_DIR"] = str(data_dir)
    os.environ["K3LAB_SYSTEM_METRICS_S"] = "0.5"  # a few system samples in trials of seconds
    try:
        assert main(sweep_args(folder, sweep_file)) == 0
        client = MlflowClient(uri)
        parent = runs.sweep_runs(uri)[0]
        killed = client.create_run(parent.info.experiment_id, run_name="attnres_bs1-s3", tags=runs.trial_tags(
            "killed", "attnres_bs1", 3) | {runs.PARENT: parent.info.run_id}).info.run_id
        for step, value in ((4, 4.0), (8, 3.9)):
            client.log_metric(killed, "val_loss", value, step=step)
            client.log_metric(killed, "train_loss", value, step=step)
        client.set_terminated(killed, "KILLED")
        assert main(["report", str(sweep_file), "--storage", str(folder / "runs"), "--tracking-uri", uri,
                     "--out", str(folder / "report")]) == 0
    finally:
        os.environ.pop("K3LAB_DATA_DIR", None)
        os.environ.pop("K3LAB_SYSTEM_METRICS_S", None)
    older_sweep(uri)
    fake_sweep(uri, experiment="live", parent_status="RUNNING")
    return folder


@pytest.fixture(scope="module")
def live_before(swept):
    """The running sweep's experiment as it was before `k3lab ui` opened the store."""
    return sweep_snapshot(f"sqlite:///{swept / 'mlflow.db'}", "live")


@contextlib.contextmanager
def served_ui(store: Path, folder: Path, *options: str):
    """`k3lab ui STORE` at a free loopback port, its log in `folder`; yields its base URL and stops the
    server (its process group) at the end."""
    port = free_port()
    env = os.environ | {"K3LAB_UI_DIR": str(folder / "ui"),
                        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    log = open(folder / "ui.log", "w")
    server = subprocess.Popen([sys.executable, "-m", "k3lab.cli", "ui", str(store), "--port", str(port),
                               "--workers", "1", *options], cwd=folder, env=env, stdout=log,
                              stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 180
        while True:
            try:
                if urllib.request.urlopen(base + "/health", timeout=5).read() == b"OK":
                    break
            except OSError:
                pass
            assert server.poll() is None, (folder / "ui.log").read_text()[-3000:]
            assert time.time() < deadline, "k3lab ui did not answer in 180 s"
            time.sleep(1)
        yield base
    finally:
        os.killpg(server.pid, signal.SIGTERM)  # the server's own group: mlflow, uvicorn and its workers
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()
        log.close()


@pytest.fixture(scope="module")
def ui(swept, live_before):
    """`k3lab ui` on the sweep's store."""
    chromium = browser_or_skip()
    with served_ui(swept / "mlflow.db", swept) as base:
        yield base, chromium


def screenshot_folder(tmp_path) -> Path:
    folder = Path(os.environ.get("K3LAB_UI_SCREENSHOTS") or tmp_path / "screenshots")
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def store_ids(folder: Path, name: str = "mini") -> dict:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{folder / 'mlflow.db'}")
    experiment = client.get_experiment_by_name(name)
    runs = client.search_runs([experiment.experiment_id])
    parent = next(r for r in runs if r.data.tags.get("k3lab.kind") == "sweep")
    trials = {r.info.run_name: r.info.run_id for r in runs if r.data.tags.get("k3lab.kind") == "trial"}
    return {"experiment": experiment.experiment_id, "parent": parent.info.run_id, "trials": trials}


def rgb(colour: str) -> str:
    red, green, blue = (int(colour[i:i + 2], 16) for i in (1, 3, 5))
    return f"rgb({red}, {green}, {blue})"


def click_centre(locator) -> None:
    """A mouse click at the centre of the element's box, as a researcher clicks (not `goto`, not a
    click Playwright would move to wherever the element is not covered)."""
    locator.scroll_into_view_if_needed()
    box = locator.bounding_box()
    locator.page.mouse.click(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)


def test_the_ui_opens_on_the_loss_curves_of_every_trial_by_variant(ui, swept, tmp_path):
    from playwright.sync_api import expect, sync_playwright

    from k3lab.store.colours import variant_colours

    base, chromium = ui
    ids = store_ids(swept)
    colours = variant_colours(["attnres_off", "attnres_bs1"])  # the sweep file's order, as in k3lab's plots
    shots = screenshot_folder(tmp_path)
    clicks = []
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        try:
            context = browser.new_context(viewport={"width": 1440, "height": 900})  # a first visit: nothing stored
            context.set_default_timeout(TIMEOUT_MS)
            page = context.new_page()

            # the experiment list, then the experiment: the training view (Runs), not GenAI's Overview
            page.goto(base + "/#/experiments")
            page.locator("main").get_by_role("link", name="mini", exact=True).first.click()
            clicks.append("experiment 'mini' in the experiment list")
            page.wait_for_url(f"**/experiments/{ids['experiment']}/runs**")
            expect(page.get_by_role("heading", name="Runs")).to_be_visible()
            expect(page.get_by_role("link", name="mini", exact=True).last).to_be_visible()  # the parent run
            assert page.get_by_text("Detect Issues").count() == 0 and "overview" not in page.url
            view = page.get_by_role("link", name="Loss curves by variant")
            expect(view).to_be_visible()  # in the experiment's description, its first line
            page.get_by_text(re.compile(r"^[1-9][0-9]* matching runs?$")).wait_for()  # the runs table has loaded
            expect(page.get_by_role("link", name=re.compile(r"^attnres_bs1")).first).to_be_visible()  # and drawn its rows
            page.screenshot(path=shots / "01-experiment-runs.png")

            # one click more: each variant's mean difference from the baseline and its interval first,
            # then every counted trial's train_loss, val_loss and tokens_per_s, grouped by variant
            with context.expect_page() as opened:  # the description's links open a new tab
                click_centre(view)
            clicks.append("'Loss curves by variant' in the experiment's description")
            charts = opened.value
            charts.get_by_text("Loss and throughput").wait_for()
            expect(charts.get_by_text("attnres_bs1 ", exact=False).first).to_be_visible()
            expect(charts.get_by_text("Group by: k3lab.variant_label")).to_be_visible()
            for name in ("attnres_off-s0", "attnres_bs1-s0"):  # the trials, without expanding the parent
                expect(charts.get_by_role("link", name=name, exact=True)).to_be_visible()
            assert charts.get_by_role("link", name="attnres_bs1-s3", exact=True).count() == 0  # the killed trial
            cards = charts.locator("[data-testid=experiment-view-compare-runs-card]")
            headings = cards.locator("h4").all_inner_texts()
            assert headings[0].startswith("mean_pct") and headings[1:4] == ["train_loss", "val_loss",
                                                                             "variant_tokens_per_s"], headings
            drawn = ("c => Array.from(c.querySelectorAll('path.js-line'), p => [p.style.stroke, "
                     "p.style.strokeDasharray, p.getAttribute('d') || '']).filter(l => l[2].includes('L'))")
            charts.wait_for_function(f"new Set(({drawn})(document.querySelector("
                                     f"'[data-testid=experiment-view-compare-runs-card]')).map(l => l[2])).size >= 3")
            charts.wait_for_timeout(2000)  # every chart drawn
            lines = {tuple(line) for line in cards.first.evaluate(drawn)}  # plotly draws each path twice
            assert len(lines) == 3 and {stroke for stroke, _, _ in lines} == {rgb(colours["attnres_bs1"])}, lines
            assert len({dash for _, dash, _ in lines}) == 3  # the mean solid, the interval's bounds dashed
            strokes_in = "c => Array.from(c.querySelectorAll('path.js-line'), p => p.style.stroke)"
            strokes = set(charts.evaluate("Array.from(document.querySelectorAll('path.js-line'), p => p.style.stroke)"))
            assert strokes - {""} == {rgb(colours["attnres_off"]), rgb(colours["attnres_bs1"])}, strokes
            charts.screenshot(path=shots / "02-loss-curves-by-variant.png")
            cards.first.screenshot(path=shots / "06-difference-from-the-baseline.png")
            assert len(clicks) <= 2, clicks

            # a trial: its page opens on the loss, then throughput, then the per-layer diagnostics;
            # its val_loss chart renders; AttnRes off reads off in its params
            trial = ids["trials"]["attnres_bs1-s0"]
            page.goto(f"{base}/#/experiments/{ids['experiment']}/runs/{trial}/model-metrics")
            headers = page.locator("[data-testid=experiment-view-compare-runs-section-header]")
            headers.first.wait_for()
            sections = [text.split("\n")[0].strip() for text in headers.all_inner_texts()]
            assert sections[:3] == ["loss", "perf", "probe/attnres_entropy"], sections
            page.locator("path.js-line").first.wait_for()
            page.screenshot(path=shots / "08-trial-page.png")
            trial = ids["trials"]["attnres_off-s0"]
            page.goto(f"{base}/#/experiments/{ids['experiment']}/runs/{trial}/model-metrics")
            page.get_by_role("searchbox", name="Search metric charts").fill("val_loss")  # charts draw when in view
            card = page.locator("[data-testid=experiment-view-compare-runs-card]",
                                has=page.get_by_role("heading", name="val_loss", exact=True)).first
            card.locator("path.js-line[d*='L']").first.wait_for()  # a line through its evaluations
            page.screenshot(path=shots / "03-trial-val-loss.png")
            page.goto(f"{base}/#/experiments/{ids['experiment']}/runs/{trial}")
            page.get_by_placeholder("Search parameters").fill("attn_res_block_size")
            expect(page.get_by_role("row", name="model.attn_res_block_size off")).to_be_visible()

            # the parent's report plots open as artifacts
            page.goto(f"{base}/#/experiments/{ids['experiment']}/runs/{ids['parent']}/artifacts/report/loss_curves.png")
            page.wait_for_function("Array.from(document.images).some(i => i.complete && i.naturalWidth > 500)")
            for name in ("summary.json", "val_loss_vs_baseline.png"):
                expect(page.get_by_text(name, exact=True)).to_be_visible()
            page.screenshot(path=shots / "04-parent-report-artifacts.png")

            # the parent's description links the metric page with every trial's curves overlaid:
            # a real click at the link's centre opens it
            page.goto(f"{base}/#/experiments/{ids['experiment']}/runs/{ids['parent']}")
            link = page.get_by_role("link", name="every trial's val_loss and train_loss on one page")
            expect(link).to_be_visible()
            page.screenshot(path=shots / "07-parent-run.png")
            with context.expect_page() as opened:
                click_centre(link)
            metric_page = opened.value
            metric_page.locator("path.js-line").first.wait_for()
            for name in ids["trials"]:
                expect(metric_page.get_by_role("link", name=name, exact=True).first).to_be_visible()
            metric_page.screenshot(path=shots / "05-metric-page.png")
        finally:
            browser.close()
    (shots / "clicks.json").write_text(json.dumps({"from": "the experiment list", "to": "every trial's loss curves, "
                                                   "coloured by variant", "clicks": clicks}, indent=2) + "\n")
    print(f"clicks from the experiment list to the loss curves of every trial: {len(clicks)}: {clicks}")


@contextlib.contextmanager
def new_page(chromium: str):
    """A page of a fresh browser (a first visit), closed at the end."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        try:
            context = browser.new_context(viewport={"width": 1440, "height": 900})
            context.set_default_timeout(TIMEOUT_MS)
            yield context.new_page()
        finally:
            browser.close()


def test_the_views_table_shows_the_reports_means_for_each_variant(ui, swept, tmp_path):
    """Its group rows averaged killed trials too: bs4 +0.34% where the report said +0.95%."""
    from mlflow import MlflowClient
    from playwright.sync_api import expect

    from k3lab.report.ui_store import report_options
    from k3lab.report.summary import build_report
    from k3lab.store import runs

    base, chromium = ui
    ids = store_ids(swept)
    uri = f"sqlite:///{swept / 'mlflow.db'}"
    parent = MlflowClient(uri).get_run(ids["parent"])
    options = report_options(uri, parent, runs.trial_runs(uri, ids["parent"]))
    summary = build_report(uri, ids["parent"], options, record=False)
    means = {row["variant"]: row["val_loss_mean"] for row in summary.rows}
    compared = summary.comparisons[0]
    with new_page(chromium) as page:
        page.goto(base + "/#/experiments")
        page.locator("main").get_by_role("link", name="mini", exact=True).first.click()
        page.get_by_role("link", name="Loss curves by variant").wait_for()
        page.goto(f"{base}/#/experiments/{ids['experiment']}/runs?viewStateShareKey=k3lab-loss-curves"
                  f"&compareRunsMode=TABLE")

        def group_value(variant: str, column: str) -> float:
            cell = page.locator(f'[row-id="tag.k3lab.variant_label.{variant}"] [col-id="{column}"]').last
            expect(cell).to_have_text(re.compile(r"^\s*[-+]?\d"), timeout=TIMEOUT_MS)  # drawn with its value
            return float(cell.inner_text().split()[0])

        for variant, mean in means.items():
            assert group_value(variant, "metrics.`val_loss`") == pytest.approx(mean, rel=1e-9), variant
        assert group_value("attnres_bs1", "metrics.`verdict_pct`") == pytest.approx(
            100 * compared.mean_diff / compared.baseline_mean, rel=1e-9)
        expect(page.locator('.ag-header-cell[col-id="tags.`k3lab.verdict`"]').first).to_be_attached(timeout=TIMEOUT_MS)
        headers = page.locator(".ag-header-cell[col-id]").evaluate_all("cs => cs.map(c => c.getAttribute('col-id'))")
        assert "tags.`k3lab.verdict`" in headers and "metrics.`val_loss`" in headers, headers
        page.screenshot(path=screenshot_folder(tmp_path) / "09-view-table.png")


def test_an_older_stores_trial_page_opens_on_its_loss(ui, swept):
    base, chromium = ui
    ids = store_ids(swept, "old")
    with new_page(chromium) as page:
        page.goto(base + "/#/experiments")
        page.wait_for_timeout(1000)
        page.goto(f"{base}/#/experiments/{ids['experiment']}/runs/{ids['trials']['attnres_off-s0']}/model-metrics")
        headers = page.locator("[data-testid=experiment-view-compare-runs-section-header]")
        headers.first.wait_for()
        sections = [text.split("\n")[0].strip() for text in headers.all_inner_texts()]
        assert sections[:2] == ["loss", "perf"], sections


def test_opening_the_ui_during_a_sweep_changes_nothing_in_its_store(ui, swept, live_before):
    """`k3lab ui` rebuilt the report into a running parent's artifacts and tagged a running trial."""
    base, chromium = ui
    ids = store_ids(swept, "live")
    with new_page(chromium) as page:
        page.goto(base + "/#/experiments")
        page.locator("main").get_by_role("link", name="live", exact=True).first.click()
        page.wait_for_url(f"**/experiments/{ids['experiment']}/runs**")
        page.get_by_text(re.compile(r"^[1-9][0-9]* matching runs?$")).wait_for()
    assert sweep_snapshot(f"sqlite:///{swept / 'mlflow.db'}", "live") == live_before


def system_metric_charts(page, base: str, experiment: str, run_id: str) -> str:
    """The titles of the charts on a run's System metrics tab, once every chart is drawn."""
    page.goto(f"{base}/#/experiments/{experiment}/runs/{run_id}/system-metrics")
    cards = page.locator("[data-testid=experiment-view-compare-runs-card]")
    cards.first.wait_for()
    page.wait_for_timeout(2000)  # every chart drawn
    return " ".join(cards.locator("h4").all_inner_texts())


def test_a_trials_page_shows_its_system_metrics_and_the_corpus_it_trained_on(ui, swept, tmp_path):
    """On a CPU sweep: the machine's CPU and memory and the trial process's own, on the run's System
    metrics tab; the corpus among its datasets."""
    from playwright.sync_api import expect

    base, chromium = ui
    ids = store_ids(swept)
    trial = ids["trials"]["attnres_bs1-s0"]
    shots = screenshot_folder(tmp_path)
    with new_page(chromium) as page:
        headings = system_metric_charts(page, base, ids["experiment"], trial)
        for name in ("cpu_utilization_percentage", "system_memory_usage_megabytes", "process_memory_megabytes"):
            assert name in headings, headings
        assert "gpu_" not in headings  # no GPU on this machine: none pretended
        page.screenshot(path=shots / "10-trial-system-metrics.png")
        page.goto(f"{base}/#/experiments/{ids['experiment']}/runs/{trial}")
        expect(page.get_by_text("stdlib-byte").first).to_be_visible()  # its corpus, under Datasets
        page.screenshot(path=shots / "11-trial-datasets.png")
