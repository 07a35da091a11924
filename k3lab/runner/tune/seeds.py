"""The seeds policy (`k3lab.runner.tune.planner.SeedPlanner`) as a Ray Tune `Searcher`, and what a
sweep's comparisons are made with: its design (`design_of`), the options of its report
(`report_options`), and the value of a trial (`last_mean`: read from its MLflow run, as the report
reads it). Tune saves the searcher with its experiment state, so `--resume` after `kill -9`
reaches the same decisions.
"""

from __future__ import annotations

import json
import statistics
from typing import Callable

from ray.tune.search import Searcher

from k3lab.report.options import ReportOptions
from k3lab.report.paired import diverged_step
from k3lab.report.sequential import Design, fixed_design
from k3lab.report.stats import usable
from k3lab.report.stop_rule import MAX
from k3lab.runner.tune.planner import FINISHED, SeedPlanner


class SeedSearcher(Searcher):
    """The seeds policy as a Ray Tune `Searcher`: `suggest` hands out {"trial": key} for the
    next trial the planner wants (None: wait, FINISHED: done), `on_trial_complete` feeds it the
    trial's value, and `save`/`restore` keep its state in Tune's experiment folder.

    keys: (variant name, seed) -> the trial's key in the sweep's TrialSpecs; value_of(result)
    turns a trial's last result into its value for the comparisons (None: no value)."""

    def __init__(self, planner: SeedPlanner, keys: dict[tuple[str, int], str], metric: str, mode: str,
                 value_of: Callable[[dict | None], float | None] | None = None):
        super().__init__(metric=metric, mode=mode)
        self.planner = planner
        self.keys = dict(keys)
        self.trials: dict[str, tuple[str, int]] = {}  # Tune's trial id -> (variant, seed)
        self.value_of = value_of or (lambda result: final_value(result, metric))
        self.freed: list[str] = []  # the variants of the trials that ended since, first ended first

    def suggest(self, trial_id: str):
        chosen = self.planner.next_trial(prefer=self.freed)
        if chosen == FINISHED:
            return Searcher.FINISHED
        if chosen is None:
            return None
        self.trials[trial_id] = chosen
        if chosen[0] in self.freed:  # the process that variant left takes it
            self.freed.remove(chosen[0])
        elif self.freed:  # the longest-free process takes a trial of another variant
            self.freed.pop(0)
        return {"trial": self.keys[chosen]}

    def on_trial_complete(self, trial_id: str, result: dict | None = None, error: bool = False) -> None:
        """Feed the planner the trial's value; a trial that ended without error leaves Tune a
        process (`reuse_actors`) with its variant's trainer in it, which the next suggestion
        prefers to fill with the same variant."""
        if trial_id not in self.trials:
            return
        variant, seed = self.trials[trial_id]
        self.planner.complete(variant, seed, None if error else self.value_of(result))
        if not error:
            self.freed.append(variant)

    def starts_with(self, key: str) -> bool:
        """Whether the trial `key` is one of the start seeds (every variant runs those)."""
        start = set(self.planner.seeds[:self.planner.start])
        return any(k == key and seed in start for (_, seed), k in self.keys.items())

    def unfinished(self) -> bool:
        """True when Tune returned before the policy was done (interrupted)."""
        return not self.planner.done()

    def get_state(self) -> dict:
        return {"planner": self.planner.get_state(), "trials": {t: list(k) for t, k in self.trials.items()}}

    def set_state(self, state: dict) -> None:
        self.planner.set_state(state["planner"])
        self.trials = {t: (v, int(s)) for t, (v, s) in state["trials"].items()}

    def save(self, checkpoint_path: str) -> None:
        """Tune's checkpoint of the searcher (periodic, and the last one as the sweep stops). The
        planner's clock is counted up to now first: it is otherwise counted only when a trial is
        asked for or ends, and the wall budget of a sweep run in parts is the sum of its parts."""
        self.planner.tick()
        with open(checkpoint_path, "w") as handle:
            json.dump(self.get_state(), handle)

    def restore(self, checkpoint_path: str) -> None:
        """Tune's restore on `--resume`: the saved state, and the wall clock counted from now."""
        with open(checkpoint_path) as handle:
            self.set_state(json.load(handle))
        self.planner.tick()


def trained_to_the_end(result: dict | None) -> bool:
    """Whether a trial's last result says it trained every step (not diverged, not stopped early)."""
    return bool(result) and result.get("trial_status") != "diverged" and \
        result.get("done_steps", 0) >= result.get("total_steps", 1)


def final_value(result: dict | None, metric: str) -> float | None:
    """A trial's value from its last result: the metric, when the trial trained every step."""
    if not trained_to_the_end(result):
        return None
    value = result.get(metric)
    return float(value) if usable(value) else None


def last_mean(tracking_uri: str, metric: str, last: int, result: dict | None, mode: str = "min",
              rise: float | None = None) -> float | None:
    """A trial's value as the mean of its last `last` evaluations of `metric`, read from its MLflow
    run: the same values the report compares, and None where its curve diverged
    (`k3lab.report.paired.diverged_step`). (A trial's reports to Tune do not survive a restore,
    and one restored from its final checkpoint reports no metric of its own; its run has them.)"""
    if not trained_to_the_end(result):
        return None
    from k3lab.store import runs

    run_id = result.get(runs.RUN_ID_KEY)
    if not run_id:
        return final_value(result, metric) if last == 1 else None
    history = runs.metric_history(tracking_uri, run_id, metric)
    if diverged_step(history, mode, rise) is not None:
        return None
    values = [v for _, v in history[-last:]]
    return statistics.fmean(values) if len(values) == last and all(usable(v) for v in values) else None


def design_of(sweep) -> Design | None:
    """How a sweep's comparisons are made (`k3lab.registry.Sweep`): its seeds policy's design, or
    for a list of seeds one look with Bonferroni t-intervals; None without comparisons."""
    if not sweep.baselines:
        return None
    margin = sweep.metric.margin
    if not sweep.adaptive:
        return fixed_design(len(sweep.baselines), len(sweep.seeds), margin=margin)
    policy = sweep.seed_policy
    return Design(comparisons=len(sweep.baselines), max_pairs=policy.max, start=policy.start,
                  confidence=policy.confidence, halfwidth=policy.until.halfwidth, rule=policy.until.rule,
                  margin=margin, looks=policy.looks).calibrated()


def build_searcher(sweep, tracking_uri: str) -> SeedSearcher:
    """The `SeedSearcher` of a sweep with a seeds policy; its keys are the sweep's trial ids."""
    import functools

    policy, budget = sweep.seed_policy, sweep.budget
    planner = SeedPlanner(variants=[v.name for v in sweep.valid_variants], baselines=dict(sweep.baselines),
                          followers={v.name: v.stretches for v in sweep.valid_variants if v.stretches},
                          seeds=list(policy.seeds), start=policy.start, design=design_of(sweep),
                          budget_trials=budget.trials if budget else None,
                          budget_wall_s=budget.wall_s if budget else None)
    keys = {(trial.variant.name, trial.seed): trial.id for trial in sweep.trials}
    metric = sweep.metric
    value_of = functools.partial(last_mean, tracking_uri, metric.name, metric.last, mode=metric.mode,
                                 rise=metric.diverged)
    return SeedSearcher(planner, keys, metric.name, metric.mode, value_of)


def report_options(sweep) -> ReportOptions:
    """How `build_report` compares a sweep's variants as its file asks: the metric, the baseline
    of each group, the design, the verdict metric's `last`, the divergence rule, the variants in
    the file's order and the baselines' compute curves. The parent run stores them
    (`ReportOptions.to_record`)."""
    metric = sweep.metric
    return ReportOptions(metric=metric.name, mode=metric.mode, baseline=sweep.baseline,
                         baselines=dict(sweep.baselines), design=design_of(sweep), last=metric.last,
                         rise=metric.diverged, variant_order=[v.name for v in sweep.valid_variants],
                         compute=sweep.compute_curves, compute_sizes=sweep.compute_sizes)


def earlier_run_line(run) -> str | None:
    """For a dry run of a sweep whose seeds policy asks a precision: what the latest run of its
    experiment in this SQLite store says that precision takes per comparison, at the spreads that
    run saw (a server store is not contacted: a dry run starts nothing and asks nobody)."""
    from k3lab.store.tracking import holds_mlflow_runs, sqlite_path

    sweep, path = run.sweep, sqlite_path(run.tracking_uri)
    if not (sweep.adaptive and sweep.seed_policy.until.rule != MAX) or path is None or not holds_mlflow_runs(path):
        return None
    from k3lab.report.paired import comparisons_for
    from k3lab.report.tables import pairs_needed_line
    from k3lab.report.summary import load_trials
    from k3lab.store.runs import latest_sweep_run

    metric = sweep.metric
    try:
        parent = latest_sweep_run(run.tracking_uri, run.experiment)
        if parent is None:
            return None
        records = load_trials(run.tracking_uri, parent, curves=(metric.name,))  # the comparisons only, no report
        comparisons = comparisons_for(records, dict(sweep.baselines), metric.name, metric.mode, design_of(sweep),
                                      metric.last, rise=metric.diverged)
    except Exception as error:  # an estimate only: a store it cannot read does not fail the dry run
        return f"earlier run in this store: not read ({type(error).__name__}: {str(error).splitlines()[0][:200]})"
    return pairs_needed_line(comparisons, sweep.seed_policy.max, parent)
