"""Closing each trial's MLflow run with the status Ray Tune gave the trial.

A trial that ASHA stops early never gets to close its own run (its actor is stopped),
and a trial that crashed past its retries ends in Tune, not in the trial; so the driver
sets the final status: FINISHED, FAILED (with the error) or KILLED (early-stopped).
"""

from __future__ import annotations

from ray import tune

from k3lab.store import runs
from k3lab.store.runs import RUN_ID_KEY


def final_status(result: dict, errored: bool) -> str:
    if errored or result.get("trial_status") == "diverged":
        return "FAILED"
    if result.get("done_steps", 0) >= result.get("total_steps", 1):
        return "FINISHED"
    return "KILLED"


class MLflowStatusCallback(tune.Callback):
    def __init__(self, tracking_uri: str):
        self.tracking_uri = tracking_uri
        self.uncounted: dict[str, list[str]] = {}  # Tune's trial id -> errors of crashes before its run was known

    def _close(self, trial, errored: bool) -> None:
        result = trial.last_result or {}
        run_id = result.get(RUN_ID_KEY)
        if not run_id:
            return
        status = final_status(result, errored)
        tags = runs.error_tags(first_error_line(trial)) if errored and trial.error_file else {}
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
        if run_id:
            runs.count_crash(self.tracking_uri, run_id, first_error_line(trial))
        else:
            self.uncounted.setdefault(trial.trial_id, []).append(first_error_line(trial))

    def on_trial_result(self, iteration, trials, trial, result, **info):
        run_id = result.get(RUN_ID_KEY)
        if run_id and trial.trial_id in self.uncounted:
            for error in self.uncounted.pop(trial.trial_id):
                runs.count_crash(self.tracking_uri, run_id, error)


def first_error_line(trial) -> str:
    try:
        with open(trial.error_file) as handle:
            lines = [line.strip() for line in handle if line.strip()]
        return (lines[-1] if lines else "error")[:5000]
    except (OSError, TypeError):  # TypeError: no error file named
        return "error (no error file)"
