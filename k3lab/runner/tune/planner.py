"""Seeds until decided, within a budget: the seeds policy on plain data (no Ray).

A sweep file with

    seeds: {start: 4, max: 16, until: decided}   # or until: {halfwidth: 0.0025}, or until: max
    budget: {wall: 30m}                          # optional; also trials: N

starts every variant with `start` seeds (seeds first .. first + start - 1), then adds seed pairs,
the baseline's next seed with the next seed of each variant that still needs it, to the
comparisons its rule has not stopped (`Design.settled` in `k3lab.report.sequential`: decided
better, worse or equivalent, or as precise as asked), the widest first, until each is stopped,
has `max` seeds, or the budget ends (no trial starts once the wall budget left is shorter than
the median trial so far, or once `budget.trials` trials have started; running trials finish).

The decisions are a function of the results alone: whether a variant gets its (k+1)-th seed is
decided once its first k seeds and the baseline's first k have ended (finished, failed or
diverged), from those trials' values. So the trials a sweep runs do not depend on how many run
at once, in what order they end, or on a `kill -9` of the driver and `--resume`: the restored
searcher (Tune saves it with the experiment state, `save`/`restore`) and the trials Tune
restores end in the same decisions; the only thing that depends on timing is the wall budget,
which a sweep run in parts spends as the sum of its parts (`SeedSearcher.save`/`restore`).
Looking after every seed pair is what the design's repeated intervals allow (a plain t-interval
would not). With `seeds: {looks: [...]}` (`k3lab.report.looks`) a comparison is looked at only
after the seed counts listed: between looks it runs on, and at a look the family is decided
together once every comparison that reached it has its seeds (`_open_after_look`), so that a
decided comparison's alpha passes to the open ones; where a later look's pairs flag the shape, a
call made earlier that does not pass the heavy tail's level is reopened and its comparison runs on.
The order of the trials decided so far does depend on timing: a process whose trial just ended
gets its variant's next seed, where one is wanted in the same stage, so that it restarts that
variant's trainer instead of building one (`k3lab.runner.tune.trial.KeptTrainer`).

`SeedPlanner` is the policy (the tests drive it directly and simulate whole sweeps with it,
bench/decisions.py too); `k3lab.runner.tune.seeds.SeedSearcher` is the Ray Tune `Searcher` around it.
"""

from __future__ import annotations

import collections
import math
import statistics
import time
from typing import Any, Callable

import attrs

from k3lab.report.sequential import NOT_RESOLVED, Design, compare_family, stopping_reason
from k3lab.report.stop_rule import BUDGET, DECIDED, RUNNING
from k3lab.report.stats import usable

FINISHED = "FINISHED"  # = ray.tune.search.Searcher.FINISHED


@attrs.define
class SeedPlanner:
    """The seeds policy of one sweep on plain data (see the module docstring).

    variants: every variant that runs, in the sweep file's order; baselines: variant -> the
    baseline of its group, for every compared variant (a baseline is a variant too, and has no
    entry); seeds: every seed the policy may use, in order (len = max); start: seeds every
    variant starts with; design: the comparisons' intervals and the rule that stops them;
    followers: a point of a baseline's compute curve -> that baseline, whose seeds it runs too.
    """

    variants: list[str]
    baselines: dict[str, str]
    seeds: list[int]
    start: int
    design: Design
    followers: dict[str, str] = attrs.Factory(dict)
    budget_trials: int | None = None
    budget_wall_s: float | None = None
    clock: Callable[[], float] = time.time
    # state: what was handed out, what ended with which value, and the time spent
    values: dict[str, dict[int, float | None]] = attrs.Factory(dict)  # variant -> seed -> value (None: no value)
    suggested: list[tuple[str, int]] = attrs.Factory(list)
    started_at: dict[str, float] = attrs.Factory(dict)  # "variant/seed" -> spent_s when handed out
    durations: list[float] = attrs.Factory(list)
    spent_s: float = 0.0
    budget_hit: bool = False
    _last_tick: float | None = None
    _decided: dict = attrs.field(factory=dict, eq=False, repr=False)  # (variant, k) -> final decision
    _widths: dict = attrs.field(factory=dict, eq=False, repr=False)  # (variant, k) -> final width
    _prefixes: dict = attrs.field(factory=dict, eq=False, repr=False)  # variant -> seeds ended in a row
    _looked: dict = attrs.field(factory=dict, eq=False, repr=False)  # looks design: k -> variants open after it

    # -- the decisions ------------------------------------------------------------------

    def ended(self, variant: str, seed: int) -> bool:
        return seed in self.values.get(variant, {})

    def _prefix(self, variant: str) -> int:
        """How many of the first seeds of `variant` have all ended (counted on from the last count:
        trials only ever end)."""
        ended, k = self.values.get(variant, {}), self._prefixes.get(variant, 0)
        while k < len(self.seeds) and self.seeds[k] in ended:
            k += 1
        self._prefixes[variant] = k
        return k

    def pairs(self, variant: str, upto: int) -> tuple[list[float], float]:
        """The paired differences of `variant` against its baseline over the first `upto` seeds,
        and the baseline's mean over the same seeds (0.0 without pairs)."""
        mine, base = self.values.get(variant, {}), self.values.get(self.baselines[variant], {})
        seeds = [s for s in self.seeds[:upto] if usable(mine.get(s)) and usable(base.get(s))]
        reference = math.fsum(base[s] for s in seeds) / len(seeds) if seeds else 0.0
        return [mine[s] - base[s] for s in seeds], reference

    def relative_half_width(self, variant: str, upto: int) -> float:
        """The interval's half-width after the first `upto` seeds, relative to the baseline's mean
        over the same pairs (inf: under two pairs); kept once those trials have all ended."""
        if (variant, upto) in self._widths:
            return self._widths[variant, upto]
        diffs, reference = self.pairs(variant, upto)
        mean = abs(reference)
        half = self.design.half_width(diffs)
        width = half / mean if mean and math.isfinite(half) else math.inf
        if min(self._prefix(variant), self._prefix(self.baselines[variant])) >= upto:
            self._widths[variant, upto] = width
        return width

    def decision(self, variant: str, k: int) -> bool | None:
        """Whether `variant` runs its seed number k (0-based index into `seeds`): True, False, or
        None while the trials it depends on have not ended. A decision, once made, is final
        (it depends only on trials that have ended), so it is kept; under a looks design a later look
        may reopen a stopped comparison (`_reopened`), and the stops are worked out again."""
        if (variant, k) in self._decided:
            return self._decided[variant, k]
        decided = self._decide(variant, k)
        if decided is not None:
            self._decided[variant, k] = decided
        return decided

    def _decide(self, variant: str, k: int) -> bool | None:
        if k < self.start:
            return True
        if k >= len(self.seeds):
            return False
        if variant in self.followers:  # a point of a compute curve: part of its baseline
            return self.decision(self.followers[variant], k)
        if variant not in self.baselines:  # a baseline: a seed as long as a variant of its own needs it
            decisions = [self.decision(v, k) for v, b in self.baselines.items() if b == variant]
            if any(d is True for d in decisions):
                return True
            return None if any(d is None for d in decisions) else False
        if self.design.looks is not None and self._reopened(variant, k):
            return True
        earlier = self.decision(variant, k - 1)
        if not earlier:  # stopped before (False), or not known yet (None)
            return earlier
        if self.design.looks is not None:  # a looks design: between looks a comparison runs on
            if k not in self.design.looks:
                return True
            still_open = self._open_after_look(k)
            return None if still_open is None else variant in still_open
        baseline = self.baselines[variant]
        if min(self._prefix(variant), self._prefix(baseline)) < k:
            return None
        return not self.design.settled(*self.pairs(variant, k))

    def _open_after_look(self, k: int) -> set[str] | None:
        """The compared variants still open after the family's look at k seeds (None until every
        comparison that reached it has its first k seeds and its baseline's ended): the looks
        design decides the family together, alpha passing on as comparisons are decided."""
        if k in self._looked:
            return self._looked[k]
        reached = {v: self.decision(v, k - 1) for v in self.baselines}
        if any(r is None for r in reached.values()):
            return None
        if any(min(self._prefix(v), self._prefix(self.baselines[v])) < k for v, r in reached.items() if r):
            return None
        values = {v: {s: x for s, x in self.values.get(v, {}).items() if s in self.seeds[:k]}
                  for v in {*self.baselines, *self.baselines.values()}}
        rows = compare_family(values, self.baselines, "min", self.design, RUNNING)
        self._looked[k] = {c.variant for c in rows if c.verdict == NOT_RESOLVED}
        if any(reached[v] is False for v in self._looked[k]):  # a flag the check raised reopened a call
            self._decided = {key: kept for key, kept in self._decided.items() if kept is not False}
        return self._looked[k]

    def _reopened(self, variant: str, k: int) -> bool:
        """Whether a later look of the family found `variant` open again (a looks design: a flag
        raised at a later look holds at the look that decided it, and its call did not pass)."""
        return any(variant in still_open for look, still_open in self._looked.items() if look > k)

    def seeds_run(self, variant: str) -> int:
        """How many seeds `variant` runs as far as decided now."""
        k = 0
        while k < len(self.seeds) and self.decision(variant, k):
            k += 1
        return k

    def wanted(self) -> list[tuple[str, int]]:
        """Trials decided but not handed out yet, the widest comparison first (start seeds first,
        seed by seed)."""
        handed = collections.Counter(v for v, _ in self.suggested)  # a variant's seeds go out in order
        wanted = []
        for variant in self.variants:
            k = handed[variant]
            while k < len(self.seeds) and self.decision(variant, k):
                wanted.append((variant, k))
                k += 1
        order = {v: i for i, v in enumerate(self.variants)}

        def key(item):
            variant, k = item
            return (k >= self.start, -self._width_of(variant, k) if k >= self.start else k, k, order[variant])

        return [(v, self.seeds[k]) for v, k in sorted(wanted, key=key)]

    def _width_of(self, variant: str, k: int) -> float:
        """How wide the comparison that needs this trial is (a baseline: its widest dependant; a point
        of a compute curve: its baseline's)."""
        variant = self.followers.get(variant, variant)
        if variant in self.baselines:
            return self.relative_half_width(variant, k)
        widths = [self.relative_half_width(v, k) for v, b in self.baselines.items() if b == variant
                  and self.decision(v, k)]
        return max(widths, default=0.0)

    # -- the budget and the calls from Tune -----------------------------------------------

    def tick(self) -> None:
        """Count the wall time since the last call (the first call after a restore only starts
        the clock)."""
        now = self.clock()
        if self._last_tick is not None:
            self.spent_s += max(0.0, now - self._last_tick)
        self._last_tick = now

    def out_of_budget(self) -> bool:
        if self.budget_trials is not None and len(self.suggested) >= self.budget_trials:
            return True
        if self.budget_wall_s is None:
            return False
        typical = statistics.median(self.durations) if self.durations else 0.0
        return self.spent_s + typical > self.budget_wall_s

    def in_flight(self) -> list[tuple[str, int]]:
        return [(v, s) for v, s in self.suggested if not self.ended(v, s)]

    def next_trial(self, prefer: list[str] = ()) -> tuple[str, int] | str | None:
        """The next trial to start, FINISHED when the sweep is done, or None: wait for results.

        prefer: variants whose trials just ended, first ended first. Of the trials wanted next
        in the same stage (start seeds, or seeds added), one of theirs goes first, so that the
        process a trial leaves takes the variant's next seed and restarts its trainer instead
        of building one (`k3lab.runner.tune.trial.KeptTrainer`). Only the order changes: which trials
        run is decided by the results alone."""
        self.tick()
        wanted = self.wanted()
        if wanted and self.out_of_budget():
            self.budget_hit = True
            wanted = []
        if wanted:
            chosen = self._first_of(wanted, prefer)
            self.suggested.append(chosen)
            self.started_at[_name(*chosen)] = self.spent_s
            return chosen
        return None if self.in_flight() else FINISHED

    def _first_of(self, wanted: list[tuple[str, int]], prefer: list[str]) -> tuple[str, int]:
        """The first wanted trial of the first `prefer` variant that has one in the stage of
        wanted[0]; else wanted[0]."""
        start_seeds = set(self.seeds[:self.start])
        stage = [item for item in wanted if (item[1] in start_seeds) == (wanted[0][1] in start_seeds)]
        for variant in prefer:
            for item in stage:
                if item[0] == variant:
                    return item
        return wanted[0]

    def complete(self, variant: str, seed: int, value: float | None) -> None:
        """A trial ended: its value for the comparisons (None: failed, diverged, stopped)."""
        self.tick()
        self.values.setdefault(variant, {})[seed] = value if usable(value) else None
        if _name(variant, seed) in self.started_at:
            self.durations.append(self.spent_s - self.started_at.pop(_name(variant, seed)))

    def done(self) -> bool:
        """Nothing in flight and nothing more to start."""
        return not self.in_flight() and (not self.wanted() or self.out_of_budget())

    # -- state, for Tune's save/restore ---------------------------------------------------

    def get_state(self) -> dict:
        return {"values": {v: {str(s): x for s, x in seeds.items()} for v, seeds in self.values.items()},
                "suggested": [list(t) for t in self.suggested], "started_at": dict(self.started_at),
                "durations": list(self.durations), "spent_s": self.spent_s, "budget_hit": self.budget_hit}

    def set_state(self, state: dict) -> None:
        self.values = {v: {int(s): x for s, x in seeds.items()} for v, seeds in state["values"].items()}
        self.suggested = [(v, int(s)) for v, s in state["suggested"]]
        self.started_at = dict(state.get("started_at", {}))
        self.durations = list(state.get("durations", []))
        self.spent_s = float(state.get("spent_s", 0.0))
        self.budget_hit = bool(state.get("budget_hit", False))
        self._last_tick = None
        self._decided, self._widths, self._prefixes, self._looked = {}, {}, {}, {}

    def summary(self) -> dict[str, dict[str, Any]]:
        """Per compared variant: seeds decided, the relative half-width, and why it stopped."""
        rows = {}
        for variant in self.baselines:
            k = self.seeds_run(variant)
            why = stopping_reason(self.design, *self.pairs(variant, k), BUDGET if self.budget_hit else RUNNING)
            if self.design.looks is not None and k < len(self.seeds) and self.decision(variant, k) is False:
                why = DECIDED  # a looks design decides the family together: its look said so
            rows[variant] = {"seeds": k, "relative_half_width": self.relative_half_width(variant, k), "stopping": why}
        return rows


def _name(variant: str, seed: int) -> str:
    return f"{variant}/{seed}"
