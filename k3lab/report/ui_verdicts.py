"""A report's verdicts as the MLflow UI shows them (`k3lab.store.verdicts` writes them): each
compared trial's paired difference from its baseline trial at every evaluation, each variant's
mean difference, interval and verdict, and each trial's outcome.

Differences are in % of the baseline trial's (or, per variant, the baseline's mean) value; a trial
that diverged (`k3lab.report.paired.diverged_step`) has none from the step where it or its
baseline trial did.
"""

from __future__ import annotations

from k3lab.report import stats
from k3lab.report.paired import diverged_step, diverged_trials
from k3lab.report.records import TrialRecord
from k3lab.store import runs
from k3lab.store import verdicts as store
from k3lab.store.colours import file_order, variant_colours
from k3lab.store.labels import LABEL, run_labels, short_labels

OUTCOMES = {"FINISHED": store.FINISHED, "KILLED": store.KILLED, "FAILED": store.FAILED, "RUNNING": store.RUNNING}


def usable_points(record: TrialRecord, metric: str, mode: str, rise: float | None) -> dict[int, float]:
    """{step: value} of a trial's finite evaluations before it diverged."""
    points = record.curves.get(metric, [])
    end = diverged_step(points, mode, rise)
    return {step: value for step, value in points if stats.usable(value) and (end is None or step < end)}


def trial_differences(records: list[TrialRecord], pairs: dict[str, str], metric: str, mode: str = "min",
                      rise: float | None = None) -> dict[str, list[tuple[int, float]]]:
    """{compared trial's run id: [(step, 100 * (value - baseline's) / |baseline's|)]} at every step
    it and its variant's baseline trial of the same seed both evaluated."""
    by_key = {(r.variant, r.seed): r for r in records}
    out = {}
    for record in records:
        base = by_key.get((pairs.get(record.variant), record.seed))
        if base is None:
            continue
        mine, theirs = (usable_points(r, metric, mode, rise) for r in (record, base))
        out[record.run_id] = [(step, 100 * (mine[step] - theirs[step]) / abs(theirs[step]))
                              for step in sorted(mine.keys() & theirs.keys()) if theirs[step]]
    return out


def percent_of(value: float | None, reference: float | None) -> float | None:
    return None if value is None or not reference else 100 * value / abs(reference)


def variant_effects(comparisons: list[stats.Comparison]) -> list[dict]:
    """{variant, pairs, mean, low, high, verdict} per comparison with pairs (in % of the
    baseline's mean over the paired seeds)."""
    return [{"variant": c.variant, "pairs": c.pairs, "verdict": c.verdict,
             "mean": percent_of(c.mean_diff, c.baseline_mean), "low": percent_of(c.low, c.baseline_mean),
             "high": percent_of(c.high, c.baseline_mean)}
            for c in comparisons if c.pairs and c.mean_diff is not None]


def trial_outcomes(records: list[TrialRecord], metric: str, mode: str = "min",
                   rise: float | None = None) -> dict[str, str]:
    """{run id: finished, killed, failed, running or diverged}."""
    diverged = {record.run_id for record, _ in diverged_trials(records, metric, mode, rise)}
    return {r.run_id: store.DIVERGED if r.run_id in diverged else OUTCOMES.get(r.status, r.status.lower())
            for r in records}


def outcome_tags(records: list[TrialRecord], metric: str, mode: str = "min",
                 rise: float | None = None) -> dict[str, dict[str, str]]:
    """{run id: {k3lab.outcome, k3lab.counted}}: counted (what the verdicts rest on, what the saved
    view shows) when it finished and did not diverge."""
    return {run_id: {store.OUTCOME: outcome, store.COUNTED: str(outcome == store.FINISHED).lower()}
            for run_id, outcome in trial_outcomes(records, metric, mode, rise).items()}


def trial_tags(records: list[TrialRecord], comparisons: list[stats.Comparison], metric: str, mode: str = "min",
               rise: float | None = None) -> dict[str, dict[str, str]]:
    """{run id: {k3lab.outcome, k3lab.counted, and for a compared trial k3lab.verdict}}."""
    verdict = {c.variant: c.verdict for c in comparisons}
    tags = outcome_tags(records, metric, mode, rise)
    for record in records:
        if record.variant in verdict:
            tags[record.run_id][store.VERDICT] = verdict[record.variant]
    return tags


def variant_looks(records: list[TrialRecord], names: list[str], variant_order=()) -> tuple[dict, dict, dict]:
    """({variant: colour}, {variant: run label}, {variant: group label}) as its trials carry them
    (`mlflow.runColor`, `k3lab.variant_label`), else by the variant's place in the sweep file
    (`variant_order`, then the others: as the sweep gave its trials theirs) and its labels among all."""
    every = file_order([*variant_order, *names], variant_order)
    colour = variant_colours(every)  # `every` is in the sweep file's order already
    colour |= {r.variant: r.tags[runs.RUN_COLOR] for r in records if r.tags.get(runs.RUN_COLOR)}
    group = short_labels(every) | {r.variant: r.tags[LABEL] for r in records if r.tags.get(LABEL)}
    return colour, run_labels(every), group


def variant_rows(records: list[TrialRecord], comparisons: list[stats.Comparison], curves: list[dict],
                 variant_order=(), throughput: dict[str, list] | None = None) -> list[dict]:
    """Per compared variant of the plan, what its variant run shows (`store.log_variant_runs`): its
    baseline, `variant_effects`' numbers (None without pairs), the state of its trials ("1 killed
    trial"), its colour and label and its baseline's (`variant_looks`), its mean difference and
    interval at every evaluation (`k3lab.report.paired.curve_differences`, in %), and its trials'
    mean throughput at every step they logged it (`throughput`: `variant_throughput`)."""
    names = [*(r.variant for r in records), *(c.variant for c in comparisons), *(c.baseline for c in comparisons)]
    colour, label, group = variant_looks(records, names, variant_order)
    effects = {effect["variant"]: effect for effect in variant_effects(comparisons)}
    rows = []
    for c in comparisons:
        effect = effects.get(c.variant, {"variant": c.variant, "pairs": c.pairs, "verdict": c.verdict,
                                         "mean": None, "low": None, "high": None})
        points = [row for row in curves if row["variant"] == c.variant and row["relative"] is not None]
        rows.append(effect | {"baseline": c.baseline, "colour": colour.get(c.variant),
                              "label": label.get(c.variant), "baseline_label": label.get(c.baseline),
                              "group": group.get(c.variant),
                              "state": trial_states([r for r in records if r.variant == c.variant]),
                              "curve": [curve_point(row) for row in points],
                              "throughput": (throughput or {}).get(c.variant, [])})
    return rows


def baseline_rows(records: list[TrialRecord], comparisons: list[stats.Comparison], variant_order=(),
                  throughput: dict[str, list] | None = None) -> list[dict]:
    """Per baseline of the plan's comparisons, what its baseline run shows (`store.log_baseline_runs`):
    {variant, label, colour, state, throughput}."""
    baselines = list(dict.fromkeys(c.baseline for c in comparisons if c.baseline))
    colour, label, group = variant_looks(records, [*(r.variant for r in records), *baselines], variant_order)
    return [{"variant": name, "label": label.get(name), "group": group.get(name), "colour": colour.get(name),
             "state": trial_states([r for r in records if r.variant == name]),
             "throughput": (throughput or {}).get(name, [])} for name in baselines]


def variant_throughput(tracking_uri: str, records: list[TrialRecord]) -> dict[str, list[tuple[int, float]]]:
    """{variant: [(step, the mean tokens/s of its trials that logged that step)]}: one line per
    variant where the trials' own `tokens_per_s` are a tangle of every seed."""
    client = runs.client(tracking_uri)
    by_variant: dict[str, dict[int, list[float]]] = {}
    for record in records:
        steps = by_variant.setdefault(record.variant, {})
        for m in client.get_metric_history(record.run_id, store.TRIAL_THROUGHPUT):
            if stats.usable(m.value):
                steps.setdefault(m.step, []).append(m.value)
    return {variant: [(step, sum(values) / len(values)) for step, values in sorted(steps.items())]
            for variant, steps in by_variant.items()}


def trial_states(records: list[TrialRecord]) -> str:
    """What a variant's trials are, in words: "no trial yet", "1 killed trial", "3 finished, 1 killed trials"."""
    if not records:
        return "no trial yet"
    counts: dict[str, int] = {}
    for record in records:
        outcome = OUTCOMES.get(record.status, record.status.lower())
        counts[outcome] = counts.get(outcome, 0) + 1
    return ", ".join(f"{n} {outcome}" for outcome, n in counts.items()) + (" trial" if len(records) == 1 else " trials")


def curve_point(row: dict) -> tuple[int, float, float | None, float | None]:
    """(step, mean, low, high) in % of a `curve_differences` row; low and high None without an interval."""
    mean, half = row["relative"], row["relative_half_width"]
    return (row["step"], mean, *((None, None) if half is None else (mean - half, mean + half)))


def effect_rows(effects: list) -> list[dict]:
    """Per factorial effect (`k3lab.report.factorial.Effect`), what its effect run shows: its short
    name (the levels it sets, "ffn=moe x top_k=2"), full label, kind, pairs, verdict, and its mean
    and interval in % of its reference cell's mean (None: none)."""
    rows = []
    for e in effects:
        half = e.relative_half_width
        rows.append({"name": " x ".join(f"{axis}={level}" for axis, level in zip(e.axes, e.levels)),
                     "label": e.label, "kind": e.kind, "pairs": e.pairs, "verdict": e.verdict, "mean": e.relative,
                     "low": None if half is None or e.relative is None else e.relative - half,
                     "high": None if half is None or e.relative is None else e.relative + half})
    return rows


def record_verdicts(tracking_uri: str, parent_run_id: str, report) -> None:
    """A `k3lab.report.summary.SweepReport`'s differences, effects, verdicts and outcomes into the store."""
    r = report
    records, metric, mode, rise = r.records, r.metric, r.mode, r.rise
    throughput = variant_throughput(tracking_uri, records)
    outcome = store.Outcome(
        differences=trial_differences(records, r.pairs, metric, mode, rise),
        effects=variant_effects(r.comparisons),
        trial_tags=trial_tags(records, r.comparisons, metric, mode, rise), current_tags={t.run_id: t.tags for t in records},
        variant_rows=variant_rows(records, r.comparisons, r.curves, r.variant_order, throughput),
        baseline_rows=baseline_rows(records, r.comparisons, r.variant_order, throughput),
        effect_rows=effect_rows(r.factorial),
        multipliers=[{"variant": m.variant, "pairs": m.pairs, "mean": m.estimate, "low": m.low, "high": m.high}
                     for m in [*r.multipliers, *r.size_multipliers]])
    store.write_outcome(runs.client(tracking_uri), parent_run_id, outcome)
