"""A sweep's progress, fed by Ray Tune's callbacks on the driver: a live rich table on a terminal,
else plain lines.

    mode "live":  the table, redrawn in place on stderr (stdout and stderr are terminals)
    mode "lines": one line on stdout when a trial starts, evaluates, restarts or ends, with its
                  figures (stdout piped to a file or `tee`, or --no-live): a log reads in order
                  and nothing is drawn over anything else

On `--resume` the table starts from what the earlier run got to (`show_earlier`):
Tune does not call back for trials it finished before, so they would stay "pending".
A finished trial restored from its final checkpoint reports no metrics of its own; its
figures then come from its MLflow run, as the summary's do (`finished_figures`).
"""

from __future__ import annotations

import math
import sys
import time
from pathlib import Path

from ray import tune
from rich.console import Console
from rich.live import Live
from rich.table import Table

from k3lab.registry.plan import profile_label
from k3lab.runner.tune.ray_reports import OUT_OF_MEMORY
from k3lab.runner.tune.status import crash_line

DONE_STATUSES = ("done", "stopped early", "diverged", "error")
LAST_WINDOW_TPS = "tokens/s (last window)"  # the trial's latest log window (the summary: its run average)


def progress_mode(live: bool) -> str:
    """"live" when asked for and both stdout and stderr are terminals, else "lines"."""
    return "live" if live and sys.stdout.isatty() and sys.stderr.isatty() else "lines"


def earlier_trials(tune_dir: Path) -> list:
    """The trials (status, config, last_result) Tune saved in an experiment folder, or []."""
    try:
        return tune.ExperimentAnalysis(str(tune_dir.resolve())).trials
    except Exception:  # no experiment state saved yet: the table then starts from "pending"
        return []


class SweepProgress(tune.Callback):
    def __init__(self, sweep, specs: dict, mode: str = "live", tracking_uri: str | None = None, say=None,
                 ooms=None):
        self.sweep, self.specs, self.mode, self.tracking_uri = sweep, specs, mode, tracking_uri
        self.ooms = ooms  # which failures were out of GPU memory (`k3lab.runner.tune.status.OutOfMemoryRestarts`)
        self.say = say or (lambda line: print(line, flush=True))
        self.rows = {key: _pending() for key in specs}
        self.started = time.time()
        self._live = (Live(self.table(), refresh_per_second=2, console=Console(stderr=True))
                      if mode == "live" else None)

    def __getstate__(self):  # Tune pickles its callbacks with the experiment state: no live display there
        return self.__dict__ | {"_live": None, "say": None}

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

    def _name(self, trial) -> str:
        key = trial.config["trial"]
        return self.specs[key].name if key in self.specs else key

    def _total_steps(self, key: str) -> int:
        """The trial's steps (a point of a compute curve trains longer than the file's `train.steps`)."""
        return self.specs[key].train.steps if key in self.specs else self.sweep.train.steps

    def on_trial_start(self, iteration, trials, trial, **info):
        self._row(trial)["status"] = "running"
        self._line(trial, "started")
        self._refresh()

    def on_trial_result(self, iteration, trials, trial, result, **info):
        if OUT_OF_MEMORY in result:  # not an evaluation: the trial is about to fail (`on_trial_recover`)
            return
        row = self._row(trial)
        self._show_result(row, result)
        if row["step"] < self._total_steps(trial.config["trial"]):  # the last evaluation: the trial's end
            self._line(trial, f"step {self._steps(trial)}: {self._figures(row)}")
        self._refresh()

    def on_trial_recover(self, iteration, trials, trial, **info):
        if self.ooms is not None and self.ooms.is_oom(trial):
            self._line(trial, "out of GPU memory: restarting from its last checkpoint once its GPU has room "
                              "(one trial fewer at once on it from now on)")
            return
        self._line(trial, f"crashed ({crash_line(trial)[:200]}): restarting from its last checkpoint")

    def on_trial_complete(self, iteration, trials, trial, **info):
        row = self._row(trial)
        row["status"] = completed_status(trial.last_result or {})
        if row["status"] == "done":
            self._show_result(row, trial.last_result or {})
        self._line(trial, f"{row['status']} at step {self._steps(trial)}: {self._figures(row)}")
        self._refresh()

    def on_trial_error(self, iteration, trials, trial, **info):
        row = self._row(trial)
        row["status"] = "error"
        self._line(trial, f"error at step {self._steps(trial)}: {crash_line(trial)[:300]}")
        self._refresh()

    def show_earlier(self, trials) -> None:
        """Rows as an earlier run of this sweep left them: its last metrics, and its finished trials done."""
        for trial in trials:
            key = trial.config.get("trial")
            if key not in self.specs or not trial.last_result:
                continue
            row = self._row(trial)
            self._show_result(row, trial.last_result)
            if trial.status == "TERMINATED":
                row["status"] = completed_status(trial.last_result)
                self._line(trial, f"{row['status']} in an earlier run, at step {self._steps(trial)}: "
                                  f"{self._figures(row)}")
        self._refresh()

    def unfinished(self) -> list[str]:
        """Trials that have not come to an end (after Tune returns: it was interrupted)."""
        return [key for key, row in self.rows.items() if row["status"] not in DONE_STATUSES]

    def _show_result(self, row: dict, result: dict) -> None:
        result = finished_figures(result, self.tracking_uri, self.sweep.metric.name)
        row.update(step=result.get("done_steps", row["step"]), loss=result.get("train_loss"),
                   val=result.get("val_loss"), tps=result.get("tokens_per_s"))

    def _steps(self, trial) -> str:
        key = trial.config["trial"]
        return f"{self._row(trial)['step']}/{self._total_steps(key)}"

    @staticmethod
    def _figures(row: dict) -> str:
        fmt = lambda v, f: "-" if v is None else format(v, f)  # noqa: E731
        return (f"train loss {fmt(row['loss'], '.3f')}, val loss {fmt(row['val'], '.4f')}, "
                f"{fmt(row['tps'], ',.0f')} {LAST_WINDOW_TPS}")

    def _line(self, trial, text: str) -> None:
        if self.mode == "lines":
            self.say(f"{time.time() - self.started:5.0f}s  {self._name(trial)} {text}")

    def _refresh(self):
        if self._live:
            self._live.update(self.table())

    def table(self) -> Table:
        elapsed = time.time() - self.started
        table = Table(title=f"{self.sweep.name} ({profile_label(self.sweep)}) - {elapsed:.0f}s")
        for column in ("trial", "status", "step", "train loss", "val loss", LAST_WINDOW_TPS):
            table.add_column(column, justify="left" if column in ("trial", "status") else "right")
        fmt = lambda v, f: "-" if v is None else format(v, f)  # noqa: E731
        for key, row in self.rows.items():
            name = self.specs[key].name if key in self.specs else key
            table.add_row(name, row["status"], f"{row['step']}/{self._total_steps(key)}",
                          fmt(row["loss"], ".3f"), fmt(row["val"], ".4f"), fmt(row["tps"], ",.0f"))
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


FIGURES = ("train_loss", "val_loss", "tokens_per_s")


def finished_figures(result: dict, tracking_uri: str | None, metric: str) -> dict:
    """`result` itself, unless it is the report of a finished trial that carries no real figures
    (one restored from its final checkpoint, with nothing left to train, reported its metric as
    inf before k3lab read them from its run): then the figures its MLflow run holds."""
    value = result.get(metric)
    real = isinstance(value, (int, float)) and math.isfinite(value) and all(result.get(k) is not None for k in FIGURES)
    run_id = result.get("mlflow_run_id")
    if real or result.get("trial_status") != "finished" or not tracking_uri or not run_id:
        return result
    try:
        from k3lab.store.runs import get_run

        metrics = get_run(tracking_uri, run_id).data.metrics
    except Exception:  # the table is not worth failing a sweep for: it keeps what Tune has
        return result
    return result | {k: metrics[k] for k in FIGURES if k in metrics}
