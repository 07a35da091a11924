"""A tracker that keeps everything in memory (`k3lab.store.tracking.Tracker`), for tests that train
without an MLflow store and read back what was logged."""

from __future__ import annotations

from typing import Any

from k3lab.store.metrics import diagnostic_metrics, diagnostic_tables


class MemoryTracker:
    """Keeps everything in memory: params, metrics per step, tags, diagnostic tables, the status."""

    def __init__(self, run_id: str | None = None):
        self.run_id = run_id
        self.params: dict[str, Any] = {}
        self.metrics: dict[str, list[tuple[int, float]]] = {}
        self.tags: dict[str, str] = {}
        self.tables: dict[str, dict] = {}  # artifact file -> table
        self.status: str | None = None
        self.log_calls = 0
        self.flushes = 0

    def log_params(self, params: dict[str, Any]) -> None:
        self.params.update(params)

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        self.log_calls += 1
        for key, value in metrics.items():
            self.metrics.setdefault(key, []).append((step, float(value)))

    def log_diagnostics(self, diagnostics: dict, step: int, table: bool = False) -> None:
        for key, value in diagnostic_metrics(diagnostics).items():
            self.metrics.setdefault(key, []).append((step, float(value)))
        if table:
            self.tables |= diagnostic_tables(diagnostics, step)

    def set_tags(self, tags: dict[str, str]) -> None:
        self.tags.update(tags)

    def flush(self) -> None:
        self.flushes += 1

    def discard_pending(self) -> int:
        return 0

    def finish(self, status: str) -> None:
        self.status = status
