"""How a report compares a sweep's variants (`ReportOptions`): as its sweep file asks
(`k3lab.runner.tune.seeds.report_options`), and as its parent run stores it (`to_record`,
`from_record`), so that every later view of one store gives the same verdicts."""

from __future__ import annotations

from typing import TYPE_CHECKING

import attrs

if TYPE_CHECKING:  # sequential imports scipy: a second and a half that `k3lab ui`'s start-up need not pay
    from k3lab.report.sequential import Design

# what the parent run's record holds (`k3lab.store.runs.write_design`); `baseline` is not stored:
# a report of a stored sweep takes it from the sweep file or from `k3lab report --baseline`
RECORDED = ("metric", "mode", "baselines", "design", "last", "rise", "variant_order", "compute", "compute_sizes")


@attrs.frozen
class ReportOptions:
    """What `k3lab.report.summary.build_report` compares, and how.

    baselines: variant -> its group's baseline, in the sweep file's order; empty: every variant
    against `baseline` (none: no comparisons). design: the seeds policy's
    (`k3lab.report.sequential.Design`); None: one look, Bonferroni t over the family. last:
    verdicts on the mean of the last N evaluations; rise: the divergence rule
    (`k3lab.report.paired.diverged_step`). compute: the baselines' compute curves (baseline ->
    {its stretched copy: multiple}); compute_sizes: families over a size axis
    (`k3lab.registry.compute_curves.size_families`): the compute multipliers'.
    """

    metric: str = "val_loss"
    mode: str = "min"
    baseline: str | None = None
    baselines: dict[str, str] = attrs.Factory(dict)
    design: Design | None = None
    last: int = 1
    rise: float | None = None
    variant_order: tuple[str, ...] = attrs.field(default=(), converter=tuple)
    compute: dict[str, dict[str, float]] | None = None
    compute_sizes: dict | None = None

    def pairs(self, variants: list[str]) -> dict[str, str]:
        """variant -> the baseline it is compared with, among `variants` (in their order)."""
        if self.baselines:
            return dict(self.baselines)
        return {v: self.baseline for v in variants if v != self.baseline} if self.baseline else {}

    def to_record(self, stored_by: str = "sweep") -> dict:
        """The JSON the parent run stores; stored_by: "sweep" (as it started) or "report"
        (`k3lab report`, for a run that stored none)."""
        record = {name: getattr(self, name) for name in RECORDED}
        design = self.design.to_json() if self.design is not None else None
        return record | {"design": design, "variant_order": list(self.variant_order), "stored_by": stored_by}


def from_record(record: dict) -> ReportOptions:
    """The stored record back as options (`ReportOptions.to_record`'s inverse); what an older
    record lacks keeps its default."""
    fields = {name: record[name] for name in RECORDED if name in record and record[name] is not None}
    order = {name: i for i, name in enumerate(fields.get("variant_order") or ())}
    if fields.get("baselines"):  # the record is stored with sorted keys: back to the file's order
        fields["baselines"] = dict(sorted(fields["baselines"].items(), key=lambda item: order.get(item[0], len(order))))
    if "design" in fields:
        from k3lab.report.sequential import Design

        fields["design"] = Design.from_json(fields["design"])
    return ReportOptions(**fields)
