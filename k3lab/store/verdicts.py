"""How a sweep's verdicts reach the MLflow UI: metrics and tags the runs table and the charts show.

    trial run   vs_baseline_pct                (step: each evaluation) its value minus its baseline
                                               trial's of the same seed, in % of the baseline's
                k3lab.outcome                  finished, killed, failed, diverged or running
                k3lab.counted                  true where the verdicts rest on it (finished, not
                                               diverged), else false: the saved view shows only these
                k3lab.verdict                  its variant's verdict (compared trials only)
    variant run mean_pct, low_pct, high_pct    (step: each evaluation) the variant's mean paired
                                               difference at that evaluation, in % of the baseline's
                                               mean there, and its family-wise interval's bounds
                verdict_pct, verdict_low_pct,  (step: the pairs) the verdict's mean difference and
                verdict_high_pct               interval, as on the parent
                k3lab.verdict, k3lab.counted   its verdict; true
                k3lab.compared_with            its baseline (a sweep may have one per group)
                variant_tokens_per_s           (step: the trials' steps) its trials' mean tokens_per_s
                k3lab.variant_label,           its variant's short display name, and the run's name
                k3lab.full_name                with full variant names (`k3lab.store.labels`)
    baseline    variant_tokens_per_s           a baseline's trials' mean tokens_per_s, as on a variant
    run         k3lab.counted, k3lab.variant_label   run: its line beside theirs in the loss view
    parent run  vs_baseline_pct/<variant>      (step: the pairs it rests on) the mean paired
                vs_baseline_low/<variant>      difference in % of the baseline's mean, and its
                vs_baseline_high/<variant>     interval's bounds
                k3lab.verdict.<variant>        better, worse, equivalent or not resolved
                compute_multiplier/<variant>   (step: the pairs it rests on) with a compute curve:
                compute_multiplier_low/...     the variant's compute multiplier (`k3lab.report.compute_multipliers`)
                compute_multiplier_high/...    and its interval's bounds

    effect run  effect_pct, effect_low_pct,    (step: the pairs) a factorial effect of a multi-axis
                effect_high_pct                grid (main or interaction) in % of its reference
                                               cell's mean, and its family-wise interval's bounds
                k3lab.effect, k3lab.verdict    its full label; nonzero or not resolved

A baseline run is one run per baseline of the plan's comparisons (`k3lab.kind` = baseline, its
variant's name, label and colour), so that every variant of the plan has one line of throughput.
A variant run is one run per compared variant of the plan, with pairs or not (`k3lab.kind` = variant, `k3lab.sweep_run` = the
parent's id, its variant's name and colour; not nested, so the sweep's trials stay the parent's
only children): the MLflow UI draws its three curves in its variant's colour, and its verdict
numbers are its group's values in the runs table.

`k3lab.report` computes them (`k3lab.report.ui_verdicts`); writing them again writes nothing new.
"""

from __future__ import annotations

import re
import time
from typing import Iterable, Sequence

import attrs

from k3lab.store import runs
from k3lab.store.labels import FULL_NAME, LABEL

VS_BASELINE = "vs_baseline_pct"
VS_LOW, VS_HIGH = "vs_baseline_low", "vs_baseline_high"
MULTIPLIER, MULTIPLIER_LOW, MULTIPLIER_HIGH = "compute_multiplier", "compute_multiplier_low", "compute_multiplier_high"
VERDICT = "k3lab.verdict"  # on a trial: its variant's; on the parent, VERDICT + "." + variant
OUTCOME = "k3lab.outcome"
COUNTED = "k3lab.counted"  # "true" on the runs the saved view shows
CURVE = ("mean_pct", "low_pct", "high_pct")  # a variant run's curves, at each evaluation
VERDICT_NUMBERS = ("verdict_pct", "verdict_low_pct", "verdict_high_pct")  # its verdict's, at step = pairs
VARIANT_KIND, SWEEP_RUN = "variant", "k3lab.sweep_run"
BASELINE_KIND = "baseline"  # a baseline's run: its trials' mean throughput beside the variant runs'
TRIAL_THROUGHPUT, THROUGHPUT = "tokens_per_s", "variant_tokens_per_s"  # a trial's; its variant's (mean) on a summary run
COMPARED_WITH = "k3lab.compared_with"  # on a variant run: the baseline its differences are from
EFFECT_KIND, EFFECT = "effect", "k3lab.effect"  # an effect run; its effect's full label (levels and references)
EFFECT_NUMBERS = ("effect_pct", "effect_low_pct", "effect_high_pct")  # at step = its pairs
FINISHED, KILLED, FAILED, DIVERGED, RUNNING = "finished", "killed", "failed", "diverged", "running"
MAX_METRICS_PER_BATCH = 1000  # MLflow's log_batch limit


def metric_safe(name: str) -> str:
    """A variant name as part of an MLflow metric or tag key (letters, digits, _ - . / and spaces)."""
    return re.sub(r"[^A-Za-z0-9_\-./ ]", "_", name)


def effect_key(prefix: str, variant: str) -> str:
    return f"{prefix}/{metric_safe(variant)}"


def verdict_tag(variant: str) -> str:
    return f"{VERDICT}.{metric_safe(variant)}"


def log_batches(client, run_id: str, metrics: list) -> None:
    for i in range(0, len(metrics), MAX_METRICS_PER_BATCH):
        client.log_batch(run_id, metrics=metrics[i:i + MAX_METRICS_PER_BATCH])


def log_differences(client, differences: dict[str, Iterable[tuple[int, float]]]) -> int:
    """{trial run id: [(step, % difference)]} as VS_BASELINE, only at steps the run does not have
    yet. Returns the points written."""
    from mlflow.entities import Metric

    now, written = int(time.time() * 1000), 0
    for run_id, points in differences.items():
        logged = {m.step for m in client.get_metric_history(run_id, VS_BASELINE)}
        new = [Metric(VS_BASELINE, float(value), now, int(step)) for step, value in points if step not in logged]
        log_batches(client, run_id, new)
        written += len(new)
    return written


def log_effects(client, parent_run_id: str, effects: list[dict]) -> None:
    """Per variant on the parent run: {variant, pairs, mean, low, high, verdict} (in %; low and
    high None without an interval), each metric logged where its latest value differs."""
    parent = client.get_run(parent_run_id)
    log_batches(client, parent_run_id, changed_metrics(parent, effects, (VS_BASELINE, VS_LOW, VS_HIGH)))
    for effect in effects:
        tag = verdict_tag(effect["variant"])
        if parent.data.tags.get(tag) != effect["verdict"]:
            client.set_tag(parent_run_id, tag, effect["verdict"])


def log_multipliers(client, parent_run_id: str, multipliers: list[dict]) -> None:
    """Per variant on the parent run: {variant, pairs, mean, low, high}, its compute multiplier
    and its interval's bounds (None: none), each logged where its latest value differs."""
    parent = client.get_run(parent_run_id)
    log_batches(client, parent_run_id, changed_metrics(parent, multipliers, (MULTIPLIER, MULTIPLIER_LOW,
                                                                             MULTIPLIER_HIGH)))


def changed_metrics(parent, rows: list[dict], prefixes: tuple[str, str, str]) -> list:
    """Metrics `<prefix>/<variant>` of rows' mean, low and high (step: their pairs) whose value is
    not the parent's latest."""
    from mlflow.entities import Metric

    now, metrics = int(time.time() * 1000), []
    for row in rows:
        for prefix, name in zip(prefixes, ("mean", "low", "high")):
            key, value = effect_key(prefix, row["variant"]), row[name]
            if value is not None and parent.data.metrics.get(key) != value:
                metrics.append(Metric(key, float(value), now, int(row["pairs"])))
    return metrics


def set_trial_tags(client, tags: dict[str, dict[str, str]], current: dict[str, dict] | None = None) -> None:
    """{trial run id: {tag: value}}, set where the run's tag (`current`: run id -> its tags, else
    read) differs."""
    for run_id, wanted in tags.items():
        have = (current or {}).get(run_id)
        have = client.get_run(run_id).data.tags if have is None else have
        for key, value in wanted.items():
            if have.get(key) != value:
                client.set_tag(run_id, key, value)


def variant_runs(client, parent_run_id: str, kind: str = VARIANT_KIND) -> dict[str, object]:
    """{variant name (an effect run: its effect's label): its run} of a sweep's variant (or `kind`) runs."""
    experiment = client.get_run(parent_run_id).info.experiment_id
    found = client.search_runs([experiment], f"tags.`{runs.KIND}` = '{kind}' and "
                                             f"tags.`{SWEEP_RUN}` = '{parent_run_id}'", max_results=runs.MAX_RUNS)
    return {run.data.tags.get(EFFECT) or runs.variant_of(run): run for run in found}


def summary_run(client, parent, run, name: str, tags: dict[str, str]):
    """A run that carries a sweep's result (a variant's or an effect's), made where `run` is None
    (starting with the sweep, so its duration is the sweep's), renamed and retagged where it differs."""
    if run is None:
        run = client.create_run(parent.info.experiment_id, start_time=parent.info.start_time, tags=tags,
                                run_name=name)
        client.set_terminated(run.info.run_id, "FINISHED")
    if run.info.run_name != name:
        client.update_run(run.info.run_id, name=name)
    for key, value in tags.items():
        if run.data.tags.get(key) != value:
            client.set_tag(run.info.run_id, key, value)
    return run


def number_metrics(run, row: dict, keys: Sequence[str], now: int) -> list:
    """`keys` of row's mean, low and high (step: its pairs) where the run's latest value differs."""
    from mlflow.entities import Metric

    return [Metric(key, float(row[name]), now, int(row["pairs"])) for key, name in zip(keys, ("mean", "low", "high"))
            if row[name] is not None and run.data.metrics.get(key) != row[name]]


def effect_run_name(row: dict) -> str:
    """An effect run's name: its short label (the levels, "ffn=moe x top_k=2"), verdict and numbers."""
    if row["mean"] is None:
        return f"{row['name']}: {row['verdict']}, no pairs"
    interval = f" ({row['low']:+.2f} to {row['high']:+.2f})" if row["low"] is not None else ""
    return f"{row['name']}: {row['verdict']}, {row['mean']:+.2f}%{interval}"


def log_effect_runs(client, parent_run_id: str, rows: list[dict]) -> None:
    """Per factorial effect, {name (short label), label, kind, pairs, mean, low, high (in %; None:
    none), verdict} on its effect run, made where it has none: EFFECT_NUMBERS, its verdict and label,
    what the "Factorial effects" view charts and tabulates (`k3lab.store.views`)."""
    parent = client.get_run(parent_run_id)
    existing = variant_runs(client, parent_run_id, EFFECT_KIND)
    now = int(time.time() * 1000)
    for row in rows:
        tags = {runs.KIND: EFFECT_KIND, SWEEP_RUN: parent_run_id, EFFECT: row["label"], VERDICT: row["verdict"],
                "k3lab.effect_kind": row["kind"]}
        run = summary_run(client, parent, existing.get(row["label"]), effect_run_name(row), tags)
        log_batches(client, run.info.run_id, number_metrics(run, row, EFFECT_NUMBERS, now))


def variant_run_name(row: dict, short: bool = True) -> str:
    """The variant run's name, what the chart's legend, the runs table and the parent's description
    show: the variant, the baseline it is compared with, its verdict and numbers, or without pairs
    the state of its trials ("attnres_bs8 vs attnres_off: not resolved, no pairs (1 killed trial)").
    `short`: the variants by their labels (row's `label`, `baseline_label`: `k3lab.store.labels`),
    else by their full names (the `k3lab.full_name` tag)."""
    variant, baseline = row["variant"], row.get("baseline")
    if short:
        variant, baseline = row.get("label") or variant, baseline and (row.get("baseline_label") or baseline)
    compared = f"{variant} vs {baseline}" if baseline else variant
    if row["mean"] is None:
        return f"{compared}: {row['verdict']}, no pairs ({row.get('state') or 'no trial yet'})"
    interval = f" ({row['low']:+.2f} to {row['high']:+.2f})" if row["low"] is not None else ""
    return f"{compared}: {row['verdict']}, {row['mean']:+.2f}%{interval}"


def full_name(run) -> str:
    """A run's name with its variants' full names (`k3lab.full_name`, else its name)."""
    return run.data.tags.get(FULL_NAME) or run.info.run_name


def log_variant_runs(client, parent_run_id: str, rows: list[dict]) -> None:
    """Per compared variant of the plan, {variant, baseline, label, baseline_label (run labels), group
    (its group label), state, colour, verdict, pairs, mean, low, high, curve: [(step, mean, low, high)],
    throughput: [(step, tokens/s)]} (in %; None: no value, as for a variant without pairs) on its
    variant run, made where it has none (starting with the sweep, so its duration is the
    sweep's); a point logged once is not logged again, a changed verdict number is logged anew."""
    from mlflow.entities import Metric

    parent = client.get_run(parent_run_id)
    existing = variant_runs(client, parent_run_id)
    now = int(time.time() * 1000)
    for row in rows:
        tags = {runs.KIND: VARIANT_KIND, SWEEP_RUN: parent_run_id, runs.VARIANT_NAME: row["variant"],
                VERDICT: row["verdict"], COUNTED: "true"} | ({runs.RUN_COLOR: row["colour"]} if row["colour"] else {})
        tags |= {COMPARED_WITH: row["baseline"]} if row.get("baseline") else {}
        tags |= {LABEL: row.get("group") or row["variant"], FULL_NAME: variant_run_name(row, short=False)}
        run = summary_run(client, parent, existing.get(row["variant"]), variant_run_name(row), tags)
        logged = {m.step for m in client.get_metric_history(run.info.run_id, CURVE[0])}
        metrics = [Metric(key, float(value), now, int(step)) for step, *values in row["curve"] if step not in logged
                   for key, value in zip(CURVE, values) if value is not None]
        metrics += throughput_metrics(client, run, row.get("throughput") or [], now)
        log_batches(client, run.info.run_id, metrics + number_metrics(run, row, VERDICT_NUMBERS, now))


def throughput_metrics(client, run, points: Sequence[tuple[int, float]], now: int) -> list:
    """THROUGHPUT at the steps `run` does not have yet (each step once, however often it is written)."""
    from mlflow.entities import Metric

    logged = {m.step for m in client.get_metric_history(run.info.run_id, THROUGHPUT)} if THROUGHPUT in \
        run.data.metrics else set()
    return [Metric(THROUGHPUT, float(value), now, int(step)) for step, value in points if step not in logged]


def log_baseline_runs(client, parent_run_id: str, rows: list[dict]) -> None:
    """Per baseline of the plan's comparisons, {variant, label, group, colour, state, throughput: [(step,
    tokens/s)]} on its baseline run (made where it has none, as a variant run is)."""
    parent = client.get_run(parent_run_id)
    existing = variant_runs(client, parent_run_id, BASELINE_KIND)
    now = int(time.time() * 1000)
    for row in rows:
        label = row.get("label") or row["variant"]
        tags = {runs.KIND: BASELINE_KIND, SWEEP_RUN: parent_run_id, runs.VARIANT_NAME: row["variant"],
                LABEL: row.get("group") or row["variant"],
                COUNTED: "true", FULL_NAME: f"{row['variant']}: baseline ({row['state']})"}
        tags |= {runs.RUN_COLOR: row["colour"]} if row.get("colour") else {}
        run = summary_run(client, parent, existing.get(row["variant"]), f"{label}: baseline ({row['state']})", tags)
        log_batches(client, run.info.run_id, throughput_metrics(client, run, row.get("throughput") or [], now))


@attrs.frozen
class Outcome:
    """What a report's verdicts write into the store (`k3lab.report.ui_verdicts` computes them): each
    trial's differences and tags (`current_tags`: the tags it has), the parent's effects and
    multipliers, the variant runs', the baseline runs' and the effect runs' rows."""

    differences: dict[str, list[tuple[int, float]]]
    effects: list[dict]
    trial_tags: dict[str, dict[str, str]]
    current_tags: dict[str, dict]
    variant_rows: list[dict]
    baseline_rows: list[dict]
    effect_rows: list[dict]
    multipliers: list[dict]


def write_outcome(client, parent_run_id: str, outcome: Outcome) -> None:
    """`outcome` into the sweep's runs, with one client; each write only where the store differs."""
    log_differences(client, outcome.differences)
    log_effects(client, parent_run_id, outcome.effects)
    set_trial_tags(client, outcome.trial_tags, outcome.current_tags)
    log_variant_runs(client, parent_run_id, outcome.variant_rows)
    log_baseline_runs(client, parent_run_id, outcome.baseline_rows)
    log_effect_runs(client, parent_run_id, outcome.effect_rows)
    log_multipliers(client, parent_run_id, outcome.multipliers)
