"""The pieces of the MLflow experiment page's saved view state that k3lab writes: line charts,
chart sections, and the loss view's whole state (the keys of MLflow 3.18's saved views). Both the
loss view (`k3lab.store.views`) and the result views (`k3lab.store.result_views`) are built from them."""

from __future__ import annotations

from typing import Sequence

from k3lab.store import verdicts
from k3lab.store.labels import LABEL

FIRST_CHARTS = ("train_loss", "val_loss")  # the loss section, in this order, then `throughput_chart`
LOSS_SECTION = "Loss and throughput"
# Ordered by anything but the start time: MLflow's page adds the parents of the runs a filter
# matches when it orders by start time (its `shouldFetchParents`), and grouped they land under
# "Additional runs" (the sweep's parent run, in a view that shows the trials alone).
ORDER_BY = "attributes.run_name"
DIFFERENCE_SECTION = "Difference from the baseline, % (mean and family-wise interval)"


def line_chart(metric: str, section: str) -> dict:
    """One line chart of the experiment page's chart view (MLflow 3.18's chart card fields)."""
    return {"uuid": f"k3lab-{metric}", "type": "LINE", "runsCountToCompare": 100, "metricSectionId": section,
            "deleted": False, "isGenerated": False, "displayName": metric, "metricKey": metric,
            "lineSmoothness": 0, "xAxisScaleType": "linear", "scaleType": "linear", "range": {},
            "xAxisKey": "step", "selectedXAxisMetricKey": "", "yAxisKey": "metric", "yAxisExpressions": [],
            "ignoreOutliers": False, "useGlobalXaxisKey": True, "useGlobalLineSmoothing": True}


def difference_chart(section: str) -> dict:
    """Each variant run's mean difference from the baseline and its interval's bounds (three lines in
    its colour), against the evaluation step, on a y axis that fits them."""
    return line_chart(verdicts.CURVE[0], section) | {
        "selectedMetricKeys": list(verdicts.CURVE), "displayName": "mean difference from the baseline, % "
                                                                   "(and its interval's bounds)"}


def difference_title(verdicts_: Sequence[tuple[str, str]]) -> str:
    """The answer's section title: each variant's verdict, in the file's order (first, where the UI
    cuts a long title short), then DIFFERENCE_SECTION."""
    return " · ".join([*(f"{name} {verdict}" for name, verdict in verdicts_), DIFFERENCE_SECTION])


def group_keys() -> list[dict]:
    """Group by the variant's label (`k3lab.store.labels`): group labels name variants (not an axis
    value such as `off`), short and distinct where MLflow cuts them."""
    return [{"mode": "tag", "groupByData": LABEL}]


def throughput_chart(section: str) -> dict:
    """One line per variant: its summary run's mean tokens/s of its trials (`k3lab.store.verdicts`),
    not every trial's."""
    return line_chart(verdicts.THROUGHPUT, section) | {
        "displayName": "tokens_per_s: each variant's trials' mean (one line per variant)"}


def loss_view_state(axis_params: Sequence[str], metric: str = "val_loss",
                    verdicts_: Sequence[tuple[str, str]] = (), ranges: dict[str, dict] | None = None) -> dict:
    """The experiment page's state for LOSS_VIEW (the keys of MLflow 3.18's saved views); `ranges`:
    {metric: its chart's range} (`k3lab.store.views.zoomed_ranges`: the second half of training)."""
    section, first = "k3lab-loss", "k3lab-difference"
    charts = list(dict.fromkeys([*FIRST_CHARTS, metric]))
    columns = [f"tags.`{verdicts.VERDICT}`", *(f"metrics.`{name}`" for name in verdicts.VERDICT_NUMBERS)]
    columns += [f"metrics.`{name}`" for name in dict.fromkeys([metric, "train_loss"])]
    columns += [f"params.`{param}`" for param in axis_params] + ["metrics.`avg_tokens_per_s`", "params.`params.active`"]
    return {
        "searchFilter": f"tags.`{verdicts.COUNTED}` = 'true'", "orderByKey": ORDER_BY,
        "orderByAsc": True, "startTime": "ALL",
        "lifecycleFilter": "Active", "datasetsFilter": [], "modelVersionFilter": "All Runs",
        "selectedColumns": columns, "columnOrder": columns, "columnWidths": {},
        "runsHiddenMode": "SHOW_ALL",  # the UI's default draws the first 10 runs only
        "compareRunCharts": [difference_chart(first), *(zoomed(line_chart(name, section), (ranges or {}).get(name))
                                                        for name in charts), throughput_chart(section)],
        "compareRunSections": [chart_section(first, difference_title(verdicts_)),
                               chart_section(section, LOSS_SECTION)],
        "viewMaximized": False, "runListHidden": False, "isAccordionReordered": True,
        "useGroupedValuesInCharts": False,  # every run its own lines, in its run colour
        "hideEmptyCharts": True,
        "groupBy": {"aggregateFunction": "average", "groupByKeys": group_keys()}, "groupsExpanded": {},
        "globalLineChartConfig": {"xAxisKey": "step", "lineSmoothness": 0, "selectedXAxisMetricKey": ""},
    }


def zoomed(chart: dict, chart_range: dict | None) -> dict:
    """A line chart on `chart_range`, its title saying so."""
    if not chart_range:
        return chart
    return chart | {"range": chart_range, "displayName": f"{chart['metricKey']} (second half of training, zoomed)"}


def chart_section(uuid: str, name: str) -> dict:
    return {"uuid": uuid, "name": name, "display": True, "isReordered": False, "deleted": False, "isGenerated": False}
