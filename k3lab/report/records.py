"""One trial as the report reads it back from the MLflow store."""

from __future__ import annotations

import attrs

from k3lab.store.runs import trial_axes


@attrs.define
class TrialRecord:
    run_id: str
    variant: str
    seed: int
    status: str
    params: dict
    final: dict  # last value of every metric
    start_ms: int | None
    end_ms: int | None
    curves: dict[str, list[tuple[int, float]]] = attrs.Factory(dict)
    first_step_ms: int | None = None  # when the trial logged its first optimizer step
    tags: dict = attrs.Factory(dict)

    def value(self, name: str) -> float | None:
        return self.final.get(name)

    @property
    def axes(self) -> dict[str, str | None]:
        """The swept values of the trial's variant, {axis: value} (`k3lab.store.runs.trial_axes`)."""
        return trial_axes(self.params, self.tags)
