"""One trial's MLflow run: opened (or reopened, for a trial that resumes), then closed as the trial ended.

The trial's run id travels inside its checkpoints (`k3lab.store.runs.RUN_ID_KEY`), so a trial
restored by `Tuner.restore` reopens the same run and logs the steps after the checkpoint into it:
exactly one MLflow run per trial, no repeated steps.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Callable, Iterator

import attrs

from k3lab.store import runs
from k3lab.store.inputs import log_corpus
from k3lab.store.labels import trial_run_name
from k3lab.store.runs import execution_tags, node_tags
from k3lab.store.tracking import MLflowTracker

CONSTANTS = {"params_total": "total", "params_active": "active", "params_embedding": "embedding",
             "flops_per_token": "flops_per_token"}  # metric at step 0: its key in the parameter counts


@attrs.frozen
class TrialRunKey:
    """Which trial a run is: where its sweep logs, under which parent run, its variant and seed,
    its colour, the axes its variant sets (its `k3lab.axes` tag), and the variant's run label and
    group label among its siblings (`k3lab.store.labels`; default its name)."""

    tracking_uri: str
    experiment: str
    parent_run_id: str | None
    variant_id: str
    variant_name: str
    seed: int
    colour: str | None = None
    axes: tuple[str, ...] = ()
    label: str | None = None
    group: str | None = None

    @property
    def name(self) -> str:
        """The run's name: `<label>-s<seed>`, what the runs list shows of it in full."""
        return trial_run_name(self.label or self.variant_name, self.seed)


def open_trial_run(key: TrialRunKey, params: dict, counts: dict, run_id: str | None = None,
                   flush_every: int | None = 50, execution: dict | None = None) -> MLflowTracker:
    """The trial's MLflow run: reopened when `run_id` is known (a resumed trial) or when an
    earlier attempt made one before crashing ahead of its first checkpoint; else created with
    `params` and the parameter `counts` as its constants."""
    run_id = run_id or existing_trial_run(key)
    if run_id is not None:
        return reopen_trial_run(key.tracking_uri, run_id, flush_every, execution)
    return start_trial_run(key, params, counts, flush_every, execution)


def existing_trial_run(key: TrialRunKey) -> str | None:
    """This trial's run under the sweep's parent run, if an earlier attempt created one."""
    if key.parent_run_id is None:
        return None
    return runs.find_trial_run(key.tracking_uri, key.parent_run_id, key.variant_id, key.seed)


def reopen_trial_run(tracking_uri: str, run_id: str, flush_every: int | None, execution: dict | None) -> MLflowTracker:
    """A resumed trial's run, RUNNING again; it logs only the steps it does not have yet."""
    tracker = MLflowTracker(tracking_uri, run_id, flush_every)
    tracker.skip_steps_already_logged()
    tracker.client.update_run(run_id, status="RUNNING")
    tracker.set_tags(node_tags() | execution_tags(execution))  # a restored trial may run on another node
    return tracker


def start_trial_run(key: TrialRunKey, params: dict, counts: dict, flush_every: int | None,
                    execution: dict | None) -> MLflowTracker:
    """A new run for the trial, nested under its sweep's parent run, with its params and constants."""
    tags = runs.trial_tags(key.variant_id, key.variant_name, key.seed, key.colour, list(key.axes), key.label,
                           key.group)
    tracker = MLflowTracker.start(key.tracking_uri, key.experiment, key.name,
                                  tags=tags | node_tags() | execution_tags(execution),
                                  parent_run_id=key.parent_run_id, flush_every=flush_every)
    tracker.log_params(params | {f"run.{k}": v for k, v in (execution or {}).items()})
    tracker.log_metrics({metric: counts[count] for metric, count in CONSTANTS.items()}, step=0)
    tracker.flush()  # constants of the run: sent now, whatever happens to the trial later
    return tracker


def log_trial_inputs(tracker: MLflowTracker, device: str, data_params: dict, dataset) -> None:
    """Where the trial runs and what it trains on: its device, its corpus' params and the corpus itself."""
    tracker.set_tags({runs.DEVICE: device})
    tracker.log_params(data_params)
    log_corpus(tracker.client, tracker.run_id, dataset.path, dataset.manifest)


@contextmanager
def closed_on_error(tracker: MLflowTracker | None, discard_pending: bool, step: Callable[[], int]) -> Iterator[None]:
    """Around the trial's training: a trial Tune stopped after taking a report (an ASHA cut, or
    SIGTERM: SystemExit) ends KILLED and tagged stopped at `step()`; any other error ends it FAILED
    (KILLED for Ctrl-C) with the error tagged, its unsent metrics dropped where they go only with
    checkpoints (`discard_pending`). Closing is best effort: Ray may end the process first."""
    try:
        yield
    except SystemExit:
        if tracker is not None:  # metrics went before the report
            tracker.set_tags(runs.stopped_tags(step()))
            tracker.finish("KILLED")
        raise
    except BaseException as error:
        if tracker is not None:
            if discard_pending:
                tracker.discard_pending()
            tracker.set_tags(runs.error_tags(f"{type(error).__name__}: {error}"))
            tracker.finish("FAILED" if not isinstance(error, KeyboardInterrupt) else "KILLED")
        raise


def close_trial_run(tracker: MLflowTracker, final: dict[str, float], step: int, train_wall_s: float,
                    error: str | None, execution: dict) -> None:
    """The run of a trial that ended on its own: its `final` metrics, the loop's wall time and the
    share of it spent in the tracker, how it ran in the end (a failed CUDA-graph capture turns the
    graphs off), then FINISHED, or FAILED with `error` (a diverged trial)."""
    tracker.log_metrics(final | {"train_wall_s": train_wall_s,
                                 # time inside the tracker (buffering and sending metrics) over the loop's time
                                 "tracking_overhead": tracker.seconds_in_tracking / train_wall_s}, step=step)
    tracker.set_tags(execution_tags(execution))
    if error is not None:
        tracker.set_tags({runs.ERROR: error})
    tracker.finish("FINISHED" if error is None else "FAILED")
