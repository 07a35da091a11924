"""A live rich table of a sweep's trials, fed by Ray Tune's callbacks on the driver."""

from __future__ import annotations

import time

from ray import tune
from rich.console import Console
from rich.live import Live
from rich.table import Table


class SweepProgress(tune.Callback):
    def __init__(self, sweep, specs: dict, live: bool = True):
        self.sweep, self.specs, self.live = sweep, specs, live
        self.rows = {key: {"status": "pending", "step": 0, "loss": None, "val": None, "tps": None}
                     for key in specs}
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

    def _row(self, trial) -> dict:
        return self.rows[trial.config["trial"]]

    def on_trial_start(self, iteration, trials, trial, **info):
        self._row(trial)["status"] = "running"
        self._refresh()

    def on_trial_result(self, iteration, trials, trial, result, **info):
        row = self._row(trial)
        row.update(step=result.get("done_steps", row["step"]), loss=result.get("train_loss"),
                   val=result.get("val_loss"), tps=result.get("tokens_per_s"))
        self._refresh()

    def on_trial_complete(self, iteration, trials, trial, **info):
        result = trial.last_result or {}
        row = self._row(trial)
        if result.get("trial_status") == "diverged":
            row["status"] = "diverged"
        elif result.get("done_steps", 0) < result.get("total_steps", 1):
            row["status"] = "stopped early"
        else:
            row["status"] = "done"
        self._refresh()

    def on_trial_error(self, iteration, trials, trial, **info):
        self._row(trial)["status"] = "error"
        self._refresh()

    def _refresh(self):
        if self._live:
            self._live.update(self.table())

    def table(self) -> Table:
        steps = self.sweep.train.steps
        elapsed = time.time() - self.started
        table = Table(title=f"{self.sweep.name} ({self.sweep.profile or 'default'}) - {elapsed:.0f}s")
        for column in ("trial", "status", "step", "train loss", "val loss", "tokens/s"):
            table.add_column(column, justify="left" if column in ("trial", "status") else "right")
        fmt = lambda v, f: "-" if v is None else format(v, f)  # noqa: E731
        for key, row in self.rows.items():
            table.add_row(self.specs[key].name, row["status"], f"{row['step']}/{steps}", fmt(row["loss"], ".3f"),
                          fmt(row["val"], ".4f"), fmt(row["tps"], ",.0f"))
        return table
