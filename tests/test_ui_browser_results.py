"""The answers of a sweep in a real browser (Playwright driving Debian's chromium, 1600 x 1000), as
issue 81 found them missing: a factorial sweep's effects and each variant against its own baseline
(the moe_ablation cpu_factorial store of docs/runs, under `k3lab ui`, which fills in a store written
before them), and a sweep stopped by --stop-after whose store no k3lab viewer has opened, under a
plain `mlflow server`: its verdicts, every planned variant (one with no pairs), its parent not
failed and its resume command as the sweep printed it. Screenshots go to K3LAB_UI_SCREENSHOTS (docs/ui:
`K3LAB_UI_SCREENSHOTS=docs/ui python -m pytest tests/test_ui_browser_results.py`), else to the
test's temporary folder."""

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from conftest import stopped_long_sweep
from test_ui_browser import TIMEOUT_MS, browser_or_skip, click_centre, free_port, screenshot_folder, served_ui

pytestmark = [pytest.mark.browser, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[1]
FACTORIAL = REPO / "docs/runs/moe_ablation-cpu_factorial-2026-12-06.db.xz"
VIEWPORT = {"width": 1600, "height": 1000}


@contextlib.contextmanager
def plain_mlflow(database: Path, folder: Path):
    """`mlflow server` on the store, nothing of k3lab in between; yields its base URL."""
    port = free_port()
    log = open(folder / "mlflow.log", "w")
    server = subprocess.Popen([str(Path(sys.executable).parent / "mlflow"), "server", "--backend-store-uri",
                               f"sqlite:///{database}", "--port", str(port), "--workers", "1"], cwd=folder,
                              stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 180
        while True:
            with contextlib.suppress(OSError):
                if urllib.request.urlopen(base + "/health", timeout=5).read() == b"OK":
                    break
            assert server.poll() is None and time.time() < deadline, (folder / "mlflow.log").read_text()[-3000:]
            time.sleep(1)
        yield base
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=30)
        log.close()


@contextlib.contextmanager
def page_of(chromium: str):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        try:
            context = browser.new_context(viewport=VIEWPORT)  # a first visit: nothing stored
            context.set_default_timeout(TIMEOUT_MS)
            yield context, context.new_page()
        finally:
            browser.close()


def open_experiment(page, base: str, name: str) -> None:
    """Click 1: the experiment in the experiment list; in the training view where MLflow starts a
    new browser in GenAI's (a plain `mlflow server`), its switch."""
    page.goto(base + "/#/experiments")
    page.locator("main").get_by_role("link", name=name, exact=True).first.click()
    page.wait_for_url("**/experiments/*/**")


def open_linked_view(context, page, name: str):
    """Click 2: a view linked from the experiment's description (a new tab); its page once its
    runs have loaded."""
    link = page.get_by_role("link", name=name)
    link.wait_for()
    with context.expect_page() as opened:
        click_centre(link)
    view = opened.value
    view.get_by_text(re.compile(r"^[1-9][0-9]* matching runs?$")).wait_for()
    return view


@pytest.fixture(scope="module")
def factorial_ui(tmp_path_factory):
    chromium = browser_or_skip()
    folder = tmp_path_factory.mktemp("factorial-ui")
    with served_ui(FACTORIAL, folder, "--unpack-dir", str(folder / "store")) as base:
        yield base, chromium


def test_factorial_effects_are_a_chart_and_a_table_row_each_within_three_clicks(factorial_ui, tmp_path):
    from playwright.sync_api import expect

    base, chromium = factorial_ui
    with page_of(chromium) as (context, page):
        open_experiment(page, base, "moe_ablation-cpu_factorial")
        effects = open_linked_view(context, page, "Factorial effects")  # click 2
        expect(effects.get_by_text("6 matching runs")).to_be_visible()  # 3 main effects, 3 interactions
        section = effects.locator("[data-testid=experiment-view-compare-runs-section-header]").first
        expect(section).to_contain_text("Factorial effects on val_loss, %")
        card = effects.locator("[data-testid=experiment-view-compare-runs-card]").first
        expect(card.locator("h4")).to_have_text("effect_pct")  # a bar per effect (MLflow titles bars by metric)
        assert card.bounding_box()["width"] > 0.6 * VIEWPORT["width"]  # one wide chart
        effects.wait_for_timeout(2000)  # the bars drawn
        effects.screenshot(path=screenshot_folder(tmp_path) / "13-factorial-effects.png")
        row = effects.get_by_role("link", name=re.compile(r"^ffn=latent_moe x num_experts_per_token=2: nonzero, "
                                                          r"-0\.60% \(-\d\.\d\d to -0\.\d\d\)$"))
        expect(row).to_be_visible()  # its row in the runs list: the interaction, its interval (below 0) and verdict


def test_each_variant_is_shown_against_its_own_baseline_and_the_first_chart_holds_only_variants(factorial_ui,
                                                                                               tmp_path):
    from playwright.sync_api import expect

    base, chromium = factorial_ui
    with page_of(chromium) as (context, page):
        open_experiment(page, base, "moe_ablation-cpu_factorial")
        verdicts = open_linked_view(context, page, "Verdicts: each variant against its baseline")
        expect(verdicts.get_by_text("5 matching runs")).to_be_visible()  # its legend: the 5 compared variants
        for variant, baseline in (("latent top2 shared1", "top2 shared1"),  # ffn_latent_moe_top2_shared1 vs
                                  ("dense", "top1 shared0")):                # ffn_moe_top2_shared1, by their labels
            expect(verdicts.get_by_text(f"{variant} vs {baseline}: ", exact=False).first).to_be_visible()
        section = verdicts.locator("[data-testid=experiment-view-compare-runs-section-header]").first
        expect(section).to_contain_text("Is val_loss lower than the baseline's?")  # the question, first
        card = verdicts.locator("[data-testid=experiment-view-compare-runs-card]").first
        expect(card.locator("h4")).to_have_text("verdict_pct")  # a bar per variant: its verdict's difference, %
        assert card.bounding_box()["width"] > 0.6 * VIEWPORT["width"]
        verdicts.wait_for_timeout(2000)
        verdicts.screenshot(path=screenshot_folder(tmp_path) / "15-verdicts-first-chart.png")


def test_a_grids_variants_are_told_apart_where_mlflow_cuts_names_and_throughput_is_a_line_each(factorial_ui,
                                                                                                 tmp_path):
    """"Group: ffn_latent_m..." rows and "ffn_latent_moe_top2_sh..." trials could not be told apart;
    tokens_per_s was a tangle of every trial; the parent run sat under "Additional runs"."""
    from playwright.sync_api import expect

    from k3lab.store.colours import variant_colours
    from test_ui_browser import rgb

    base, chromium = factorial_ui
    order = ["ffn_moe_top1_shared0", "ffn_moe_top1_shared1", "ffn_moe_top2_shared0", "ffn_moe_top2_shared1",
             "ffn_latent_moe_top1_shared0", "ffn_latent_moe_top1_shared1", "ffn_latent_moe_top2_shared0",
             "ffn_latent_moe_top2_shared1", "dense"]
    with page_of(chromium) as (context, page):
        open_experiment(page, base, "moe_ablation-cpu_factorial")
        view = open_linked_view(context, page, "Loss curves by variant")  # click 2
        groups = view.get_by_text(re.compile(r"^Group: "))
        groups.first.wait_for()
        shown, cut, names = set(), [], set()
        rows = view.locator(".ag-body-viewport").first
        for _ in range(40):  # the list draws the rows in view: scroll it down as a reader does
            view.wait_for_timeout(300)
            for group in groups.all():
                label = group.inner_text().removeprefix("Group: ").strip()
                shown.add(label)
                if not view.get_by_title(label, exact=True).first.evaluate("e => e.scrollWidth <= e.clientWidth"):
                    cut.append(label)
            names |= set(view.get_by_role("link", name=re.compile(r"-s[0-9]+$")).all_inner_texts())
            if rows.evaluate("e => e.scrollTop + e.clientHeight >= e.scrollHeight - 1"):
                break
            rows.evaluate("e => e.scrollBy(0, 250)")
        assert shown == {"t1 s0", "t1 s1", "t2 s0", "t2 s1", "latent t1 s0", "latent t1 s1", "latent t2 s0",
                         "latent t2 s1", "dense"}, shown  # ffn_moe_top1_shared0 ... ffn_latent_moe_top2_shared1
        assert not cut, cut  # each group label whole in the runs list
        assert {"latent top2 shared1-s0", "top2 shared1-s0", "dense-s3"} <= names, names  # trials told apart
        rows.evaluate("e => e.scrollTo(0, 0)")
        assert view.get_by_text("Additional runs", exact=True).count() == 0  # no parent run among the trials
        view.screenshot(path=screenshot_folder(tmp_path) / "18-grid-labels.png")
        card = view.locator("[data-testid=experiment-view-compare-runs-card]",
                            has=view.get_by_role("heading", name="variant_tokens_per_s", exact=True)).first
        card.scroll_into_view_if_needed()
        card.locator("path.js-line[d*='L']").first.wait_for()
        view.wait_for_timeout(2000)
        strokes = card.evaluate("c => Array.from(c.querySelectorAll('path.js-line'), p => p.style.stroke)"
                                ".filter(s => s)")
        colours = variant_colours(order)
        assert set(strokes) == {rgb(colours[name]) for name in order}, strokes  # one line, one colour per variant
        assert len(set(strokes)) == len(order)
        card.screenshot(path=screenshot_folder(tmp_path) / "19-throughput-per-variant.png")


@pytest.fixture(scope="module")
def stopped(tmp_path_factory, data_dir):
    """A CPU sweep stopped by --stop-after mid-trial (its store never opened by k3lab since), and the
    resume command it printed."""
    folder = tmp_path_factory.mktemp("stopped")
    done = stopped_long_sweep(folder, data_dir)
    assert done.returncode == 3, done.stdout[-2000:] + done.stderr[-2000:]
    return folder, re.search(r"continue it with `([^`]+)`", done.stderr).group(1)


def test_plain_mlflow_on_a_stopped_sweeps_store_shows_its_verdicts_and_resume_command(stopped, tmp_path):
    from playwright.sync_api import expect

    chromium = browser_or_skip()
    folder, printed = stopped
    with plain_mlflow(folder / "mlflow.db", folder) as base, page_of(chromium) as (context, page):
        open_experiment(page, base, "long")
        with contextlib.suppress(Exception):  # MLflow starts a new browser in GenAI's view: its switch
            page.get_by_text("Model training", exact=True).first.click(timeout=10_000)
        verdicts = open_linked_view(context, page, "Verdicts: each variant against its baseline")
        expect(verdicts.get_by_text("attnres_bs1 vs attnres_off: not resolved, no pairs (1 killed trial)",
                                    exact=True).first).to_be_visible()  # a variant with no pairs is there
        verdicts.screenshot(path=screenshot_folder(tmp_path) / "16-stopped-sweep-verdicts.png")
        losses = open_linked_view(context, page, "Loss curves by variant")  # its parent is no "Additional run"
        losses.get_by_text(re.compile(r"^Group: ")).first.wait_for()
        assert losses.get_by_text("Additional runs", exact=True).count() == 0
        expect(losses.get_by_text("2 matching runs")).to_be_visible()  # the variant run and the baseline run
        losses.close()
        page.get_by_role("link", name="long", exact=True).last.click()  # the parent run
        expect(page.get_by_text(printed, exact=True).first).to_be_visible()  # the command as printed, whole
        expect(page.get_by_text("Finished", exact=True).first).to_be_visible()  # not Killed, not a red cross
        assert page.get_by_text("Killed", exact=True).count() == 0
        page.screenshot(path=screenshot_folder(tmp_path) / "17-stopped-sweep-parent.png")
