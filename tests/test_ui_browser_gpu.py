"""A GPU sweep's system metrics in the MLflow UI, in a real browser: `k3lab ui` on the store of a
two-trial sweep run on an H100 (docs/runs/gpu_system_metrics-h100-2026-12-06.db.xz, made with
`k3lab sweep docs/runs/gpu_system_metrics-2026-12-06.yaml` and K3LAB_SYSTEM_METRICS_S=2; the
command and its output in docs/ui.md). A trial's System metrics tab draws its GPU's busy share,
memory and power and the trial process's own GPU memory; the parent run holds the sweep's GPU busy
share. Skips without Playwright and chromium, as tests/test_ui_browser.py does.
"""

from pathlib import Path

import pytest
from test_ui_browser import browser_or_skip, new_page, screenshot_folder, served_ui, system_metric_charts

pytestmark = [pytest.mark.browser, pytest.mark.slow]

STORE = Path(__file__).resolve().parents[1] / "docs/runs/gpu_system_metrics-h100-2026-12-06.db.xz"
GPU_METRICS = ("gpu_0_utilization_percentage", "gpu_0_memory_usage_megabytes", "gpu_0_power_usage_watts",
               "gpu_0_process_memory_megabytes")


@pytest.fixture(scope="module")
def gpu_store(tmp_path_factory):
    """The H100 store unpacked into a folder of its own, served by `k3lab ui`."""
    chromium = browser_or_skip()
    folder = tmp_path_factory.mktemp("gpu-ui")
    with served_ui(STORE, folder, "--unpack-dir", str(folder / "store")) as base:
        yield base, chromium, f"sqlite:///{folder / 'store' / 'mlflow.db'}"


def test_a_gpu_trials_page_shows_its_gpus_busy_share_memory_and_power(gpu_store, tmp_path):
    from mlflow.tracking import MlflowClient

    base, chromium, uri = gpu_store
    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("gpu_system_metrics").experiment_id
    runs = {r.info.run_name: r for r in client.search_runs([experiment])}
    parent, trial = runs["gpu_system_metrics"], runs["attnres_bs2-s0"]
    assert parent.data.metrics["sweep_gpus"] == 1 and 0 < parent.data.metrics["sweep_gpu_busy_pct"] <= 100
    with new_page(chromium) as page:
        headings = system_metric_charts(page, base, experiment, trial.info.run_id)
        for name in GPU_METRICS:
            assert name in headings, headings
        page.screenshot(path=screenshot_folder(tmp_path) / "12-gpu-trial-system-metrics.png")
