"""A live rich table of a sweep's trials, fed by Ray Tune's callbacks on the driver.

On `--resume` the table starts from what the earlier run got to (`show_earlier`):
Tune does not call back for trials it finished before, so they would stay "pending".
"""

from __future__ import annotations

import time
from pathlib import Path

from ray import tune
from rich.console import Console
from rich.live import Live
from rich.table import Table

from k3lab.registry.plan import profile_label

DONE_STATUSES = ("done", "stopped early", "diverged", "error")


def earlier_trials(tune_dir: Path) -> list:
    """The trials (status, config, last_result) Tune saved in an experiment folder, or []."""
    try:
        return tune.ExperimentAnalysis(str(tune_dir.resolve())).trials
    except Exception:  # no experiment state saved yet: the table then starts from "pending"
        return []


class SweepProgress(tune.Callback):
    def __init__(self, sweep, specs: dict, live: bool = True):
        self.sweep, self.specs, self.live = sweep, specs, live
        self.rows = {key: _pending() for key in specs}
        self.started = time.time()
        self._live = Live(self.table(), refresh_per_second=2, console=Console(stderr=True)) if live else None

    def __getstate__(self):  # Tune pickles its callbacks with the experiment state: no live display there
        return self.__dict__ | {"_live": None}

    def __enter__(self):
        if self._live:
            self._live.__enter__()
        return self

    def __exit__(self, *exc):
        if self._live:
            self._live.update(self.table())
            self._live.__exit__(*exc)

    def _row(self, trial) -> dict:  # a seeds policy starts trials the table did not list at first
        return self.rows.setdefault(trial.config["trial"], _pending())

    def on_trial_start(self, iteration, trials, trial, **info):
        self._row(trial)["status"] = "running"
        self._refresh()

    def on_trial_result(self, iteration, trials, trial, result, **info):
        self._show_result(self._row(trial), result)
        self._refresh()

    def on_trial_complete(self, iteration, trials, trial, **info):
        self._row(trial)["status"] = completed_status(trial.last_result or {})
        self._refresh()

    def on_trial_error(self, iteration, trials, trial, **info):
        self._row(trial)["status"] = "error"
        self._refresh()

    def show_earlier(self, trials) -> None:
        """Rows as an earlier run of this sweep left them: its last metrics, and its finished trials done."""
        for trial in trials:
            key = trial.config.get("trial")
            if key not in self.specs or not trial.last_result:
                continue
            self._show_result(self._row(trial), trial.last_result)
            if trial.status == "TERMINATED":
                self.rows[key]["status"] = completed_status(trial.last_result)
        self._refresh()

    def unfinished(self) -> list[str]:
        """Trials that have not come to an end (after Tune returns: it was interrupted)."""
        return [key for key, row in self.rows.items() if row["status"] not in DONE_STATUSES]

    @staticmethod
    def _show_result(row: dict, result: dict) -> None:
        row.update(step=result.get("done_steps", row["step"]), loss=result.get("train_loss"),
                   val=result.get("val_loss"), tps=result.get("tokens_per_s"))

    def _refresh(self):
        if self._live:
            self._live.update(self.table())

    def table(self) -> Table:
        steps = self.sweep.train.steps
        elapsed = time.time() - self.started
        table = Table(title=f"{self.sweep.name} ({profile_label(self.sweep)}) - {elapsed:.0f}s")
        for column in ("trial", "status", "step", "train loss", "val loss", "tokens/s"):
            table.add_column(column, justify="left" if column in ("trial", "status") else "right")
        fmt = lambda v, f: "-" if v is None else format(v, f)  # noqa: E731
        for key, row in self.rows.items():
            table.add_row(self.specs[key].name, row["status"], f"{row['step']}/{steps}", fmt(row["loss"], ".3f"),
                          fmt(row["val"], ".4f"), fmt(row["tps"], ",.0f"))
        return table


def _pending() -> dict:
    return {"status": "pending", "step": 0, "loss": None, "val": None, "tps": None}


def completed_status(result: dict) -> str:
    """How a trial that Tune completed ended, from its last report."""
    if result.get("trial_status") == "diverged":
        return "diverged"
    if result.get("done_steps", 0) < result.get("total_steps", 1):
        return "stopped early"
    return "done"
