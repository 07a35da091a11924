"""The saved views that answer a sweep's question in the MLflow UI, beside its loss view
(`k3lab.store.views`): each shows only the runs that carry a result (`k3lab.store.verdicts`), so a
chart's legend names variants or effects, never trials, and its section is one chart wide.

    VERDICT_VIEW  "Verdicts": the variant runs. A bar per variant, its verdict's mean difference
                  from its own baseline (`verdict_pct`, % of the baseline's mean; below 0: lower);
                  then its mean difference at every evaluation (`mean_pct`), one line per variant
                  in its colour; the table leads with each one's verdict, interval and baseline.
    EFFECT_VIEW   "Factorial effects" (a sweep over a grid of two or more axes): the effect runs.
                  A bar per main effect and interaction (`effect_pct`, % of its reference cell's
                  mean); the table gives its interval's bounds and its verdict.
"""

from __future__ import annotations

from k3lab.store import runs, verdicts
from k3lab.store.view_state import chart_section, line_chart, loss_view_state

VERDICT_VIEW, VERDICT_VIEW_NAME = "k3lab-verdicts", "Verdicts: each variant against its baseline"
EFFECT_VIEW, EFFECT_VIEW_NAME = "k3lab-effects", "Factorial effects"
WIDE = {"columns": 1, "cardHeight": 520}  # one chart per row: the first chart reads at a glance


def bar_chart(metric: str, section: str, title: str) -> dict:
    """One bar chart of the chart view (MLflow 3.18's bar card): a bar per run, its latest `metric`."""
    return {"uuid": f"k3lab-bars-{metric}", "type": "BAR", "runsCountToCompare": 100, "metricSectionId": section,
            "deleted": False, "isGenerated": False, "displayName": title, "metricKey": metric}


def result_view_state(kind: str, charts: list[dict], section: str, columns: list[str]) -> dict:
    """A chart view of the runs of `kind` only (variant or effect runs), one wide section."""
    return loss_view_state([]) | {
        "searchFilter": f"tags.`{runs.KIND}` = '{kind}'", "selectedColumns": columns, "columnOrder": columns,
        "compareRunCharts": charts, "compareRunSections": [chart_section(charts[0]["metricSectionId"], section) | WIDE],
        "groupBy": None, "orderByKey": "attributes.run_name", "orderByAsc": True}


def question(metric: str, mode: str = "min") -> str:
    return f"Is {metric} {'lower' if mode == 'min' else 'higher'} than the baseline's?"


def verdict_view_state(metric: str = "val_loss", mode: str = "min") -> dict:
    """VERDICT_VIEW's state: the verdict's difference per variant, then at every evaluation."""

    section = "k3lab-verdicts"
    lines = line_chart(verdicts.CURVE[0], section) | {
        "uuid": "k3lab-verdict-curve", "displayName": f"{metric}: mean difference from its baseline at every "
                                                      "evaluation, % of the baseline's (below 0: lower)"}
    charts = [bar_chart(verdicts.VERDICT_NUMBERS[0], section,
                        f"{question(metric, mode)} Mean paired difference from each variant's own baseline, % "
                        "(below 0: lower)"), lines]
    columns = [f"tags.`{verdicts.VERDICT}`", *(f"metrics.`{name}`" for name in verdicts.VERDICT_NUMBERS),
               f"tags.`{verdicts.COMPARED_WITH}`"]
    return result_view_state(verdicts.VARIANT_KIND, charts, f"{question(metric, mode)} Each variant against its "
                                                            "own baseline, % (bars: the verdicts')", columns)


def effect_view_state(metric: str = "val_loss") -> dict:
    """EFFECT_VIEW's state: a bar per factorial effect, its interval and verdict in the table."""
    section = "k3lab-effects"
    charts = [bar_chart(verdicts.EFFECT_NUMBERS[0], section,
                        f"Main effects and interactions on {metric}, % of the reference cell's mean (below 0: lower)")]
    columns = [f"tags.`{verdicts.VERDICT}`", *(f"metrics.`{name}`" for name in verdicts.EFFECT_NUMBERS),
               f"tags.`{verdicts.EFFECT}`"]
    return result_view_state(verdicts.EFFECT_KIND, charts, f"Factorial effects on {metric}, % of the reference "
                                                           "cell's mean (intervals and verdicts: the table)", columns)


def result_views(tracking_uri: str, parent_run_id: str, metric: str, mode: str = "min") -> dict[str, tuple[str, dict]]:
    """{view id: (name, state)} of the result views the sweep has runs for."""
    views, client = {}, runs.client(tracking_uri)
    if verdicts.variant_runs(client, parent_run_id):
        views[VERDICT_VIEW] = (VERDICT_VIEW_NAME, verdict_view_state(metric, mode))
    if verdicts.variant_runs(client, parent_run_id, verdicts.EFFECT_KIND):
        views[EFFECT_VIEW] = (EFFECT_VIEW_NAME, effect_view_state(metric))
    return views
