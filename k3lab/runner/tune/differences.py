"""The paired differences on the trials' runs while the sweep runs: once a trial and its pair (its
variant's baseline trial of the same seed, or for a baseline its variants' trials) have both
ended, each compared trial's run gets `vs_baseline_pct` at every evaluation, the metric the MLflow
UI's first chart draws (`k3lab.report.ui_verdicts`, `k3lab.store.verdicts`). `k3lab report` writes
the same values again; a point already logged is not logged twice.
"""

from __future__ import annotations

import warnings

from ray import tune


class DifferencesCallback(tune.Callback):
    """On the driver, after `MLflowStatusCallback` has closed the trial's run. specs: the sweep's
    TrialSpecs by trial key; pairs: compared variant -> its baseline; rise: the divergence rule."""

    def __init__(self, tracking_uri: str, parent_run_id: str, specs: dict, pairs: dict[str, str], metric: str,
                 mode: str, rise: float | None):
        self.tracking_uri, self.parent_run_id = tracking_uri, parent_run_id
        paired = set(pairs) | set(pairs.values())  # a compute curve's trials have no pair: nothing to read
        self.seeds = {key: spec.seed for key, spec in specs.items() if spec.variant_name in paired}
        self.pairs, self.metric, self.mode, self.rise = dict(pairs), metric, mode, rise

    def on_trial_complete(self, iteration, trials, trial, **info):
        seed = self.seeds.get(trial.config.get("trial"))
        if seed is None:
            return
        try:
            log_seed_differences(self.tracking_uri, self.parent_run_id, seed, self.pairs, self.metric, self.mode,
                                 self.rise)
        except Exception as error:  # a diagnostic view: the sweep goes on, and `k3lab report` writes them again
            warnings.warn(f"k3lab: the differences of seed {seed} were not logged: {error}")


def log_seed_differences(tracking_uri: str, parent_run_id: str, seed: int, pairs: dict[str, str], metric: str,
                         mode: str = "min", rise: float | None = None) -> int:
    """`vs_baseline_pct` on the runs of seed `seed` whose pair has ended too, and on its finished
    runs their outcome (`k3lab.counted`: the saved view shows them while the sweep runs); returns
    the points written."""
    from k3lab.report.summary import load_trials
    from k3lab.report.ui_verdicts import outcome_tags, trial_differences
    from k3lab.store import runs, verdicts

    records = [r for r in load_trials(tracking_uri, parent_run_id, curves=(metric,), seed=seed)
               if r.status == "FINISHED"]
    client = runs.client(tracking_uri)
    verdicts.set_trial_tags(client, outcome_tags(records, metric, mode, rise), {r.run_id: r.tags for r in records})
    return verdicts.log_differences(client, trial_differences(records, pairs, metric, mode, rise))
