"""Closing each trial's MLflow run with the status Ray Tune gave the trial.

A trial that ASHA stops early never gets to close its own run (its actor is stopped),
and a trial that crashed past its retries ends in Tune, not in the trial; so the driver
sets the final status: FINISHED, FAILED (with the error) or KILLED (early-stopped).
Crashes Tune restarts are counted on the run. Where the trial's process died of a signal,
the error is the fault its worker's own log shows, and that log is kept with the run
(`k3lab.runner.runtime.crashes`).
"""

from __future__ import annotations

import re

import warnings

from ray import tune

from k3lab.store import runs
from k3lab.store.runs import RUN_ID_KEY
from k3lab.runner.runtime.crashes import dead_worker_log, fault_line
from k3lab.runner.tune.ray_reports import OUT_OF_MEMORY


class OutOfMemoryRestarts(tune.Callback):
    """Trials that ran out of GPU memory restart without using their crash budget: the trial
    reports `OUT_OF_MEMORY` before its error reaches Tune (`k3lab.runner.tune.trial.out_of_memory`, which
    has also lowered the trials at once on its GPU), and this callback, first in the driver's
    list, raises that trial's `max_failures` by one before Tune weighs the failure. `is_oom` tells
    the other callbacks which failure it was."""

    def __init__(self):
        self.expected: dict[str, int] = {}  # Tune's trial id -> its failure count once the OOM lands

    def on_trial_result(self, iteration, trials, trial, result, **info):
        if OUT_OF_MEMORY in result:
            self.expected[trial.trial_id] = trial.run_metadata.num_failures + 1
            if trial.max_failures >= 0:
                trial.max_failures += 1

    def is_oom(self, trial) -> bool:
        expected = self.expected.get(trial.trial_id)
        return expected is not None and expected == trial.run_metadata.num_failures


def final_status(result: dict, errored: bool) -> str:
    if errored or result.get("trial_status") == "diverged":
        return "FAILED"
    if result.get("done_steps", 0) >= result.get("total_steps", 1):
        return "FINISHED"
    return "KILLED"


class MLflowStatusCallback(tune.Callback):
    def __init__(self, tracking_uri: str, ooms: OutOfMemoryRestarts | None = None):
        self.tracking_uri = tracking_uri
        self.ooms = ooms or OutOfMemoryRestarts()
        self.uncounted: dict[str, list] = {}  # Tune's trial id -> restarts before its run was known

    def _close(self, trial, errored: bool) -> None:
        result = trial.last_result or {}
        run_id = result.get(RUN_ID_KEY)
        if not run_id:
            return
        status = final_status(result, errored)
        tags = {}
        if errored and trial.error_file:
            line, worker_log = crash_report(trial)
            tags = runs.error_tags(line)
            keep_worker_log(self.tracking_uri, run_id, "final", worker_log)
        if status == "KILLED":
            tags |= runs.stopped_tags(result.get("done_steps"))
        runs.close_run(self.tracking_uri, run_id, status, tags)

    def on_trial_complete(self, iteration, trials, trial, **info):
        self._close(trial, errored=False)

    def on_trial_error(self, iteration, trials, trial, **info):
        self._close(trial, errored=True)

    def on_trial_recover(self, iteration, trials, trial, **info):
        """A crash Tune retries from the trial's last checkpoint: counted on the trial's run, so
        the report can say how much of a sweep went into restarts (the progress log says it too).
        A trial that crashed before its first report (a reused actor, as it set the trial up) has
        no run yet: its crash is counted on the run its first report names."""
        run_id = (trial.last_result or {}).get(RUN_ID_KEY)
        crash = (*crash_report(trial), runs.OOM if self.ooms.is_oom(trial) else runs.CRASHED)
        if run_id:
            count_crash(self.tracking_uri, run_id, *crash)
        else:
            self.uncounted.setdefault(trial.trial_id, []).append(crash)

    def on_trial_result(self, iteration, trials, trial, result, **info):
        run_id = result.get(RUN_ID_KEY)
        if run_id and trial.trial_id in self.uncounted:
            for crash in self.uncounted.pop(trial.trial_id):
                count_crash(self.tracking_uri, run_id, *crash)


def count_crash(tracking_uri: str, run_id: str, line: str, worker_log: tuple[int, str] | None,
                cause: str = "crashed") -> None:
    """One more restart on the run (`runs.count_crash`, by cause), with the dead worker's log kept."""
    count = runs.count_crash(tracking_uri, run_id, line, cause)
    keep_worker_log(tracking_uri, run_id, f"{count}" if cause == runs.CRASHED else f"oom-{count}", worker_log)


def keep_worker_log(tracking_uri: str, run_id: str, which: str, worker_log: tuple[int, str] | None) -> None:
    """The dead worker's log tail as the run's artifact `crashes/<which>-worker-<pid>.err`
    (which: the crash's number, or `final` for the error that ended the trial). A diagnostic:
    an artifact store that cannot take it costs a warning, not the sweep or the run's status."""
    if worker_log is None:
        return
    pid, text = worker_log
    try:
        runs.client(tracking_uri).log_text(run_id, text, f"crashes/{which}-worker-{pid}.err")
    except Exception as error:
        warnings.warn(f"k3lab: the crashed worker's log (pid {pid}) was not kept with run {run_id}: {error}")


def crash_report(trial) -> tuple[str, tuple[int, str] | None]:
    """What went wrong, in one line, and (pid, log tail) of the dead worker when its log is on
    this node: where the worker died of a signal, the line is the fault its own log shows
    (`k3lab.runner.runtime.crashes`); else the error's last line."""
    found = dead_worker_log(error_text(trial) or "")
    return (found and fault_line(found[1])) or first_error_line(trial), found


def crash_line(trial) -> str:
    return crash_report(trial)[0]


def error_text(trial) -> str | None:
    """The whole of Tune's error file for the trial, as plain text (None without one)."""
    try:
        with open(trial.error_file, errors="replace") as handle:
            return plain(handle.read())
    except (OSError, TypeError):  # TypeError: no error file named
        return None


ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def plain(text: str) -> str:
    """`text` without terminal colour codes (Ray colours the task names in its errors)."""
    return ANSI_ESCAPE.sub("", text)


def first_error_line(trial) -> str:
    text = error_text(trial)
    if text is None:
        return "error (no error file)"
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return (lines[-1] if lines else "error")[:5000]
