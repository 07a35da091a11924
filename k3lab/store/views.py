"""How a sweep reads in the MLflow UI: a saved view of its loss curves, and descriptions with links.

MLflow 3.18's experiment page keeps its layout (charts, sections, grouping, columns) in the
browser, per experiment, and shares it through saved views: an experiment tag
`mlflow.sharedViewState.<id>` = {"name", "createdAt", "updatedAt", "state"} with the state as
"deflate;" + base64(zlib(JSON)), opened by `#/experiments/<id>/runs?viewStateShareKey=<id>` and
listed under the page's "Views" button. (The UI leaves a view's `runsExpanded`, `runsPinned`,
`runsHidden` and `runsVisibilityMap` out: nested trials are reached by grouping instead.)

Every k3lab sweep's experiment gets one such view, LOSS_VIEW: the chart view of the runs the
verdicts rest on (filtered on `k3lab.counted`: finished trials that did not diverge, and the
sweep's variant runs; killed, failed and diverged trials are left out), grouped by variant (the tag
`k3lab.variant_name`, so group labels name variants and the nested trials show without expanding
the parent), each run drawn in its variant's colour (`mlflow.runColor`), all of them (not the
UI's default first 10). Its first section is the answer, titled with each variant's verdict: per
variant, its variant run's mean paired difference from the baseline at every evaluation and its
family-wise interval's bounds (three lines in its colour: `k3lab.store.verdicts`, written by
`k3lab report`); then train_loss, val_loss and tokens_per_s. Its table leads with the verdict and
its numbers, so a group's values there are the report's. The experiment's description (shown
above its runs) links to it and to the sweep's report plots; the parent run's description leads
with its links (the UI's fold covers the lower lines of a long description), then each variant's
verdict, and says how to compare. The views that answer the question come first in the
experiment's description (`k3lab.store.result_views`: the variant runs' verdicts, a factorial
sweep's effects); the loss view's loss charts open on the second half of training (`zoomed_ranges`).
"""

from __future__ import annotations

import base64
import json
import re
import time
import urllib.parse
import zlib
from typing import Collection, Sequence

from k3lab.store import runs, verdicts
from k3lab.store.colours import variant_colours
from k3lab.store.labels import FULL_NAME, LABEL, run_labels, short_labels, trial_run_name
from k3lab.store.view_state import ORDER_BY, group_keys, loss_view_state

SHARED_VIEW = "mlflow.sharedViewState."
LOSS_VIEW, LOSS_VIEW_NAME = "k3lab-loss-curves", "Loss curves by variant"
DEFAULT_NEXT_STEPS = ("k3lab sweep FILE --resume", "k3lab report FILE --close")  # where none was kept
NOTED_STEPS = re.compile(r"`([^`]+)` continues it(?:, `([^`]+)` ends it)?")  # as `parent_note` writes them
REPORT_PLOT = "report/loss_curves.png"  # the parent run's artifact the links open (the report's folder beside it)


def parent_verdicts(parent_data, variant_order: Sequence[str] = ()) -> list[tuple[str, str]]:
    """(variant, verdict) from the parent's verdict tags, in `variant_order` (then by name)."""
    prefix = verdicts.VERDICT + "."
    found = [key.removeprefix(prefix) for key in parent_data.tags if key.startswith(prefix)]
    order = {name: i for i, name in enumerate(variant_order)}
    found.sort(key=lambda name: (order.get(name, len(order)), name))
    return [(name, parent_data.tags[prefix + name]) for name in found]


def pack_state(state: dict) -> str:
    return "deflate;" + base64.b64encode(zlib.compress(json.dumps(state, separators=(",", ":")).encode())).decode()


def unpack_state(packed: str) -> dict:
    return json.loads(zlib.decompress(base64.b64decode(packed.removeprefix("deflate;"))))


def saved_view_tag(view_id: str, name: str, state: dict, created_ms: int | None = None) -> dict[str, str]:
    now = int(time.time() * 1000)
    envelope = {"name": name, "createdAt": created_ms or now, "updatedAt": now, "state": pack_state(state)}
    return {SHARED_VIEW + view_id: json.dumps(envelope, separators=(",", ":"))}


# -- links inside the UI (hash routes of MLflow 3.18's web app) --------------------------------

def view_link(experiment_id: str, view_id: str = LOSS_VIEW) -> str:
    return f"#/experiments/{experiment_id}/runs?viewStateShareKey={view_id}&compareRunsMode=CHART"


def artifacts_link(experiment_id: str, run_id: str, path: str = "") -> str:
    return f"#/experiments/{experiment_id}/runs/{run_id}/artifacts" + (f"/{path}" if path else "")


def metric_page_link(experiment_id: str, run_ids: Sequence[str], metrics: Sequence[str], log_y: bool = False) -> str:
    """The metric page: the curves of `metrics` for every run in `run_ids`, overlaid."""
    def js(value) -> str:
        return urllib.parse.quote(json.dumps(value, separators=(",", ":")), safe="")

    return (f"#/metric/{urllib.parse.quote(metrics[0], safe='')}?runs={js(list(run_ids))}&metric={js(metrics[0])}"
            f"&experiments={js([experiment_id])}&plot_metric_keys={js(list(metrics))}&plot_layout={js({})}"
            f"&x_axis=step&y_axis_scale={'log' if log_y else 'linear'}&line_smoothness=1&show_point=false"
            f"&deselected_curves={js([])}&last_linear_y_axis_range={js([])}")


# -- descriptions ----------------------------------------------------------------------------

def how_to_compare(metric: str) -> str:
    return (f"To compare by hand: *Runs*, the chart view, *Group by* the tag `{LABEL}` (the seeds "
            f"of one variant together, and the trials show without expanding the parent run). Curves of chosen "
            f"trials overlaid: open a trial, *Model metrics*, a chart's title: the metric page, where more runs "
            f"can be added. Trials are named `variant-sN` (seed N; a grid's variants by the values that differ "
            f"among them, the full name in the tag `{runs.VARIANT_NAME}`), one colour per variant as in k3lab's "
            f"plots; each trial's final {metric} is `final_{metric}`.")


def experiment_note(experiment_id: str, parent_run_id: str, title: str,
                    result_links: Sequence[tuple[str, str]] = ()) -> str:
    """The experiment's description: its first line (all the UI shows until expanded) links to the
    result views (`result_links`: (name, view id), `k3lab.store.result_views`), the loss view and
    the latest sweep's report plots."""
    results = "".join(f"[{name}]({view_link(experiment_id, view_id)}) · " for name, view_id in result_links)
    return (f"**{title}** · {results}[{LOSS_VIEW_NAME}]({view_link(experiment_id)}) · "
            f"[report plots of the latest sweep]({artifacts_link(experiment_id, parent_run_id, REPORT_PLOT)})\n\n"
            f"One parent run per sweep (the latest: `{parent_run_id}`), one nested run per trial. "
            f"The view above shows the runs the verdicts rest on (finished trials that did not diverge): first "
            f"each variant's mean difference from the baseline at every evaluation with its family-wise interval "
            f"(% of the baseline's mean; below 0: lower), then every trial's train_loss, val_loss and "
            f"tokens_per_s; one colour per variant, grouped by variant (also under *Views*).")


def percent(value: float | None) -> str:
    return "n/a" if value is None else f"{value:+.2f}%"


def verdict_lines(parent_data, variant_order: Sequence[str] = ()) -> list[str]:
    """One line per compared variant from the parent's verdict tags and effect metrics (`k3lab report`),
    in `variant_order`; "no interval: too few pairs" where there is none."""
    lines = []
    for name, verdict in parent_verdicts(parent_data, variant_order):
        effect = {p: parent_data.metrics.get(verdicts.effect_key(p, name))
                  for p in (verdicts.VS_BASELINE, verdicts.VS_LOW, verdicts.VS_HIGH)}
        interval = (f" ({percent(effect[verdicts.VS_LOW])} to {percent(effect[verdicts.VS_HIGH])})"
                    if effect[verdicts.VS_LOW] is not None else " (no interval: too few pairs)")
        lines.append(f"**{name}**: {verdict}, {percent(effect[verdicts.VS_BASELINE])}{interval}")
    return lines


def variant_lines(tracking_uri: str, parent_run_id: str, variant_order: Sequence[str] = ()) -> list[str]:
    """One line per variant run of the sweep (every compared variant of the plan, with its baseline,
    verdict and numbers, or the state of its trials where it has no pairs), in `variant_order`."""
    found = verdicts.variant_runs(runs.client(tracking_uri), parent_run_id)
    order = {name: i for i, name in enumerate(variant_order)}
    names = sorted(found, key=lambda name: (order.get(name, len(order)), name))
    return [f"**{name}**{verdicts.full_name(found[name]).removeprefix(name)}" for name in names]


def parent_note(experiment_id: str, parent_run_id: str, description: str, metric: str,
                trial_run_ids: Sequence[str] = (), state: str | None = None, verdicts_: Sequence[str] = (),
                next_steps: tuple[str, str] = DEFAULT_NEXT_STEPS) -> str:
    """The parent run's description: where to look (the links first, clear of the UI's fold),
    the verdicts, what the sweep is, how to compare; interrupted, `next_steps`: the commands that
    continue it and that end it (`k3lab.hints`)."""
    links = [f"[{LOSS_VIEW_NAME}]({view_link(experiment_id)})",
             f"[report plots and summary.json]({artifacts_link(experiment_id, parent_run_id, REPORT_PLOT)})"]
    if trial_run_ids:
        curves = list(dict.fromkeys([metric, "train_loss"]))
        links.insert(1, f"[every trial's {' and '.join(curves)} on one page]"
                        f"({metric_page_link(experiment_id, trial_run_ids, curves)})")
    lines = [" · ".join(links), ""]
    if state == runs.STOPPED:  # MLflow calls it Killed, in red: above the fold, what it is
        lines += [f"**Stopped, resumable**: its state is saved; `{next_steps[0]}` continues it.", ""]
    if verdicts_:  # one paragraph, above the fold
        lines += [f"{metric} against the baseline, % (family-wise interval where there are pairs enough): "
                  + " · ".join(verdicts_), ""]
    lines += [description or "k3lab sweep", ""]
    if state == runs.INTERRUPTED:
        lines += [f"**Interrupted**: its driver stopped before the sweep ended; `{next_steps[0]}` "
                  f"continues it, `{next_steps[1]}` ends it.", ""]
    lines += [how_to_compare(metric)]
    return "\n".join(lines)


# -- writing them ------------------------------------------------------------------------------

def present_sweep(tracking_uri: str, parent_run_id: str, *, axis_params: Sequence[str] = (), metric: str = "val_loss",
                  variant_order: Sequence[str] = (), description: str | None = None, title: str | None = None,
                  state: str | None = None, next_steps: tuple[str, str] | None = None) -> None:
    """Write what the UI shows of a sweep: the experiment's kind, saved view and description, the
    parent's description (`next_steps`: see `parent_note`; a parent tagged stopped says so), and a
    colour on every trial without one (variants in `variant_order`, then any others, sorted);
    `axis_params`: the params that hold the swept values (`k3lab.store.runs.axis_param`), the view's
    columns. Idempotent; used when a sweep starts and ends, by `k3lab report`, and by `k3lab ui` on stores
    made before these existed."""
    client = runs.client(tracking_uri)
    parent = client.get_run(parent_run_id)
    if state in (None, "KILLED", "FINISHED") and parent.data.tags.get(runs.STATUS) == runs.STOPPED:
        state = runs.STOPPED
    next_steps = keep_next_steps(client, parent, next_steps)
    experiment_id = parent.info.experiment_id
    experiment = client.get_experiment(experiment_id)
    trials = runs.trial_runs(tracking_uri, parent_run_id)
    shown = run_labels([*variant_order, *sorted({runs.variant_of(t) for t in trials} - set(variant_order))])
    loss_view = loss_view_state(axis_params, metric, [(shown.get(name, name), verdict) for name, verdict in
                                                      parent_verdicts(parent.data, variant_order)],
                                zoomed_ranges(client, trials, metric))
    tags = experiment_tags(tracking_uri, experiment, parent, title or f"k3lab sweep {experiment.name}", loss_view,
                           metric)
    for key, value in tags.items():
        if experiment.tags.get(key) != value:
            client.set_experiment_tag(experiment_id, key, value)
    name_runs(tracking_uri, parent_run_id, trials, variant_order)
    if description is None:  # stores from before k3lab.description kept it in the note
        note = parent.data.tags.get(runs.NOTE, "")
        description = parent.data.tags.get(runs.DESCRIPTION, "" if LOSS_VIEW_NAME in note else note)
    ordered = sorted(trials, key=lambda t: (variant_order.index(runs.variant_of(t)) if runs.variant_of(t) in
                                            variant_order else len(variant_order), runs.seed_of(t)))
    lines = variant_lines(tracking_uri, parent_run_id, variant_order) or verdict_lines(parent.data, variant_order)
    note = parent_note(experiment_id, parent_run_id, description, metric,
                       [t.info.run_id for t in ordered], state, lines, next_steps)
    if parent.data.tags.get(runs.NOTE) != note:
        client.set_tag(parent_run_id, runs.NOTE, note)


def name_runs(tracking_uri: str, parent_run_id: str, trials: list, variant_order: Sequence[str] = ()) -> None:
    """Every trial and summary run (variant, baseline) of the sweep in its variant's colour (the one
    its trials carry, else its place in `variant_order`, then the others sorted: as the sweep gives
    them) and labelled (`k3lab.store.labels`: the label its trials carry, else its short label among
    the plan's variants); a trial named as an older k3lab named it (`variant-sN`) and a variant run
    named with full variant names get the label's name, their full name kept in `k3lab.full_name`."""
    client = runs.client(tracking_uri)
    summaries = [run for kind in (verdicts.VARIANT_KIND, verdicts.BASELINE_KIND)
                 for run in verdicts.variant_runs(client, parent_run_id, kind).values()]
    names = [runs.variant_of(t) for t in trials]
    every = [*variant_order, *sorted(set(names) - set(variant_order))]
    every += sorted({runs.variant_of(r) for r in summaries} | {r.data.tags.get(verdicts.COMPARED_WITH) for r in summaries
                                                               if r.data.tags.get(verdicts.COMPARED_WITH)} - set(every))
    colours = variant_colours(every) | {n: t.data.tags[runs.RUN_COLOR] for n, t in zip(names, trials)
                                        if t.data.tags.get(runs.RUN_COLOR)}
    groups = short_labels(every) | {n: t.data.tags[LABEL] for n, t in zip(names, trials) if t.data.tags.get(LABEL)}
    labels = run_labels(every)
    for run in [*trials, *summaries]:
        name, tags = runs.variant_of(run), run.data.tags
        wanted = {runs.RUN_COLOR: colours[name], LABEL: groups[name]}
        full, shown = run.info.run_name, None
        if tags.get(runs.KIND) == "trial" and runs.VARIANT_NAME in tags and full == trial_run_name(name, runs.seed_of(run)):
            shown = trial_run_name(labels[name], runs.seed_of(run))
        baseline = tags.get(verdicts.COMPARED_WITH)
        if baseline and full.startswith(f"{name} vs {baseline}: "):
            shown = f"{labels[name]} vs {labels.get(baseline, baseline)}" + full.removeprefix(f"{name} vs {baseline}")
        if shown is not None and shown != full:
            wanted[FULL_NAME] = full
            client.update_run(run.info.run_id, name=shown)
        for key, value in wanted.items():
            if tags.get(key) != value:
                client.set_tag(run.info.run_id, key, value)


def keep_next_steps(client, parent, next_steps: tuple[str, str] | None) -> tuple[str, str]:
    """The commands that continue and end the sweep as its driver printed them: given (the driver),
    they are kept in the parent's tags; else read back from those tags, or from a description an
    earlier k3lab wrote (so a viewer never shortens them to `DEFAULT_NEXT_STEPS`)."""
    tags = parent.data.tags
    if next_steps:
        for key, value in zip((runs.RESUME_COMMAND, runs.CLOSE_COMMAND), next_steps):
            if tags.get(key) != value:
                client.set_tag(parent.info.run_id, key, value)
        return next_steps
    noted = NOTED_STEPS.search(tags.get(runs.NOTE, ""))
    resume = tags.get(runs.RESUME_COMMAND) or (noted.group(1) if noted else DEFAULT_NEXT_STEPS[0])
    close = tags.get(runs.CLOSE_COMMAND) or (noted and noted.group(2)) or DEFAULT_NEXT_STEPS[1]
    return resume, close


def experiment_tags(tracking_uri: str, experiment, parent, title: str, loss_view: dict,
                    metric: str) -> dict[str, str]:
    """The experiment's kind, its saved views (the loss view, and the result views the sweep has
    runs for: `k3lab.store.result_views`, each keeping its creation time) and its description."""
    from k3lab.store.result_views import result_views

    mode = parent.data.params.get("metric", "val_loss:min").partition(":")[2] or "min"
    shown = {LOSS_VIEW: (LOSS_VIEW_NAME, loss_view)}
    shown |= result_views(tracking_uri, parent.info.run_id, metric, mode)
    links = [(name, view_id) for view_id, (name, _) in shown.items() if view_id != LOSS_VIEW]
    tags = {runs.EXPERIMENT_KIND: runs.MODEL_TRAINING,
            runs.NOTE: experiment_note(experiment.experiment_id, parent.info.run_id, title, links)}
    for view_id, (name, state) in shown.items():
        envelope = experiment.tags.get(SHARED_VIEW + view_id)
        tags |= saved_view_tag(view_id, name, state, json.loads(envelope).get("createdAt") if envelope else None)
    return tags


def zoomed_ranges(client, trials: list, metric: str) -> dict[str, dict]:
    """{train_loss, metric: the chart range of the second half of training over the counted trials}
    (x from half the last step, y their values there with a margin): the whole run's axis spans the
    first steps' loss, and a 1% difference between variants is invisible on it."""
    import math

    ranges = {}
    counted = [t for t in trials if t.data.tags.get(verdicts.COUNTED, "true") == "true"]
    for name in dict.fromkeys(["train_loss", metric]):
        points = [(m.step, m.value) for t in counted for m in client.get_metric_history(t.info.run_id, name)
                  if math.isfinite(m.value)]
        if len({step for step, _ in points}) < 2:
            continue
        last = max(step for step, _ in points)
        values = [value for step, value in points if step >= last / 2]
        margin = (max(values) - min(values)) * 0.05 or abs(max(values)) * 0.01 or 0.01
        ranges[name] = {"xMin": last / 2, "xMax": last, "yMin": min(values) - margin, "yMax": max(values) + margin}
    return ranges


def view_is_current(experiment_tags: dict) -> bool:
    """The experiment has LOSS_VIEW as this k3lab writes it (its first chart the difference, ordered
    so that MLflow adds no parent run, grouped by the variants' labels, a throughput line per variant)."""
    envelope = experiment_tags.get(SHARED_VIEW + LOSS_VIEW)
    try:
        state = unpack_state(json.loads(envelope)["state"]) if envelope else {}
        charts = state.get("compareRunCharts") or []
    except (ValueError, KeyError, TypeError, AttributeError, zlib.error):
        return False
    return (bool(charts) and charts[0].get("selectedMetricKeys") == list(verdicts.CURVE)
            and state.get("orderByKey") == ORDER_BY and (state.get("groupBy") or {}).get("groupByKeys") == group_keys()
            and any(chart.get("metricKey") == verdicts.THROUGHPUT for chart in charts))


def views_are_current(tracking_uri: str, parent, client) -> bool:
    """The parent's experiment has the loss view as this k3lab writes it and a result view for each
    kind of result run the sweep has (`k3lab.store.result_views`)."""
    from k3lab.store.result_views import result_views

    tags = client.get_experiment(parent.info.experiment_id).tags
    return view_is_current(tags) and all(SHARED_VIEW + view_id in tags
                                         for view_id in result_views(tracking_uri, parent.info.run_id, "val_loss"))


def present_earlier_sweeps(tracking_uri: str, refresh: Collection[str] = (), skip: Collection[str] = ()) -> int:
    """`present_sweep` for the sweeps of experiments without the current loss view (stores from an
    older k3lab) and for the parent runs in `refresh` (verdicts just recorded), never for those in
    `skip` (sweeps whose driver runs): axes from the trials (`k3lab.store.runs.swept_axes`),
    variants in the sweep's order (`k3lab.store.runs.variant_order`). Returns how many."""
    client = runs.client(tracking_uri)
    done, count = set(), 0
    for parent in reversed(runs.sweep_runs(tracking_uri)):  # oldest first: the latest ends in the description
        experiment_id = parent.info.experiment_id
        if parent.info.run_id in skip or (experiment_id not in done and parent.info.run_id not in refresh
                                          and views_are_current(tracking_uri, parent, client)):
            continue
        done.add(experiment_id)
        trials = runs.trial_runs(tracking_uri, parent.info.run_id)
        metric = parent.data.params.get("metric", "val_loss:min").split(":")[0]
        state = runs.sweep_state(parent, trials)
        if state == runs.INTERRUPTED and parent.info.status == "RUNNING":
            runs.mark_interrupted(tracking_uri, parent.info.run_id)
        if state == runs.STOPPED and parent.info.status == "KILLED":  # as an older k3lab ended a stopped sweep
            client.update_run(parent.info.run_id, status="FINISHED")
        present_sweep(tracking_uri, parent.info.run_id, axis_params=runs.axis_params(trials, runs.swept_axes(trials)),
                      metric=metric, variant_order=runs.variant_order(tracking_uri, parent, trials), state=state)
        count += 1
    return count
