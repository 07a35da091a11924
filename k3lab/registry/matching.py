"""Parameter matching: resize one integer width so a variant's parameter count
lies within a relative tolerance of the base model's.

The adjustable fields (`spec.ADJUSTABLE_FIELDS`: intermediate_size,
moe_intermediate_size, moe_latent_size) are searched over multiples of a step:
64 when the variant's current value is a multiple of 64 and at least 512
(tensor-core friendly at GPU sizes), else 8 (fine enough for CPU-sized
models). moe_latent_size stays below hidden_size. A variant already within
tolerance is left unchanged.

The search brackets the target (doubling upwards when needed) and then
narrows the bracket like bisection: the first probes sit at the linearly
interpolated point (parameter counts are linear in these widths, so this
usually ends after two or three probes), later ones at the midpoint, so any
monotone count converges in logarithmically many probes. Each
probe builds the model on the meta device once (cached).
"""

from __future__ import annotations

from k3lab.model.config import KimiK3Config
from k3lab.registry.axes import axis_kind
from k3lab.registry.keypath import SpecError
from k3lab.registry.sections import MatchSpec

MAX_GROWTH = 64  # never search above MAX_GROWTH times the current value


class MatchError(ValueError):
    """The variant cannot be matched; the message says why."""


def match_config(config: KimiK3Config, target: int, spec: MatchSpec, seq_len: int | None = None) -> KimiK3Config:
    """`config`, with `spec.adjust` resized if needed so that its `spec.by`
    count is within `spec.tolerance` of `target`; `MatchError` otherwise."""
    start = getattr(config, spec.adjust)
    if _within(_count(config, spec, seq_len), target, spec.tolerance):
        return config
    if start is None:
        raise MatchError(f"cannot match {spec.by}: {spec.adjust} is null in this variant")
    step = 64 if start % 64 == 0 and start >= 512 else 8
    search = _Search(config, spec, target, seq_len)
    search.check_effect(start, step)
    lo, hi = search.bracket(start, step)
    best = search.narrow(lo, hi, step)
    value = search.count_at(best)
    if not _within(value, target, spec.tolerance):
        raise MatchError(f"cannot match {spec.by}={target:,} within {spec.tolerance:.1%}: closest is "
                         f"{spec.adjust}={best} with {value:,} ({(value - target) / target:+.1%})")
    return config.replace(**{spec.adjust: best})


def _within(value: int, target: int, tolerance: float) -> bool:
    return abs(value - target) <= tolerance * target


def _count(config: KimiK3Config, spec: MatchSpec, seq_len: int | None) -> int:
    from k3lab.registry.counts import count  # torch: imported on first use

    return count(config, seq_len).get(spec.by)


class _Search:
    """Counts of one variant as a function of the adjusted width."""

    def __init__(self, config: KimiK3Config, spec: MatchSpec, target: int, seq_len: int | None) -> None:
        self.config, self.spec, self.target, self.seq_len = config, spec, target, seq_len
        limit = MAX_GROWTH * max(getattr(config, spec.adjust), config.hidden_size)
        self.limit = config.hidden_size - 1 if spec.adjust == "moe_latent_size" else limit

    def count_at(self, value: int) -> int:
        return _count(self.config.replace(**{self.spec.adjust: value}), self.spec, self.seq_len)

    def check_effect(self, start: int, step: int) -> None:
        """Fail early when the adjusted field does not change the count at all."""
        other = start + step if start + step <= self.limit else max(start - step, 1)
        if self.count_at(other) == self.count_at(start):
            self._fail(f"{self.spec.adjust} does not change {self.spec.by} in this variant")

    def bracket(self, start: int, step: int) -> tuple[int, int]:
        """(lo, hi) with count(lo) <= target <= count(hi)."""
        if self.count_at(start) > self.target:
            lo = min(step, start)
            if self.count_at(lo) > self.target:
                self._fail(f"even {self.spec.adjust}={lo} gives {self.count_at(lo):,}")
            return lo, start
        hi = start
        while self.count_at(hi) < self.target:
            if hi >= self.limit:
                self._fail(f"even {self.spec.adjust}={hi} gives {self.count_at(hi):,}")
            hi = min(self.limit, max(hi * 2, hi + step))
        return start, hi

    def narrow(self, lo: int, hi: int, step: int) -> int:
        """The multiple of `step` in [lo, hi] (or lo, hi) whose count is closest."""
        f_lo, f_hi = self.count_at(lo), self.count_at(hi)
        for attempt in range(64):
            probe = self._probe(lo, hi, f_lo, f_hi, step, interpolate=attempt < 3)
            if probe is None:
                break
            f_probe = self.count_at(probe)
            if f_probe <= self.target:
                lo, f_lo = probe, f_probe
            else:
                hi, f_hi = probe, f_probe
        return min((lo, hi), key=lambda v: (abs(self.count_at(v) - self.target), v))

    def _probe(self, lo: int, hi: int, f_lo: int, f_hi: int, step: int, interpolate: bool) -> int | None:
        """A multiple of step strictly inside (lo, hi), at the interpolated
        target (or the midpoint), or None when there is none left."""
        first, last = (lo // step + 1) * step, ((hi - 1) // step) * step
        if first > last:
            return None
        guess = lo + (self.target - f_lo) * (hi - lo) / max(f_hi - f_lo, 1) if interpolate else (lo + hi) / 2
        return min(last, max(first, int(round(guess / step)) * step))

    def _fail(self, why: str) -> None:
        raise MatchError(f"cannot match {self.spec.by}={self.target:,} within {self.spec.tolerance:.1%}: {why}")


def check_adjusted_unswept(match: MatchSpec, axes: list[str]) -> None:
    """A SpecError where one of the sweep's `axes` (its axes and the explicit variants' keys) writes
    the field matching adjusts: matching cannot adjust a field the sweep varies."""
    for name in axes:
        if match.adjust in axis_kind(name, ()).writes:
            raise SpecError(("match", "adjust"), f"{match.adjust} is also set by the axis {name}; "
                                                 "matching cannot adjust a field the sweep varies")
