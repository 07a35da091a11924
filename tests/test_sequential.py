"""Anytime-valid family-wise comparisons (k3lab.report.sequential) and the seeds policy that looks
at them after every seed pair (k3lab.tune.seeds.SeedPlanner), on simulated sweeps: trial results
drawn from a distribution with known true differences, no model."""

import math

import numpy as np
import pytest

from k3lab.report.sequential import (
    BETTER, MAX_SEEDS, NOT_RESOLVED, PRECISE, WORSE, Design, compare_family, compare_sequential, cs_half_width,
    mixture_precision, naive_t_half_width,
)
from k3lab.tune.seeds import FINISHED, SeedPlanner

# -- the confidence sequence itself -------------------------------------------------------------


def mixture_martingale(diffs, m, c):
    """M_n(m) of the module docstring, computed from its definition."""
    y = np.asarray(diffs) - m
    n, s, v = len(y), y.sum(), (y * y).sum()
    return math.sqrt(c / (c + n)) * (v / (v - s * s / (n + c))) ** (n / 2)


@pytest.mark.parametrize("diffs", [[0.1, 0.3, 0.2, 0.25], [1.0, -1.0, 0.5, 0.2, 0.1, -0.3, 0.7], list(np.arange(12.0))])
def test_the_closed_form_is_where_the_mixture_martingale_crosses_one_over_alpha(diffs):
    alpha, c = 0.05, 0.5
    n, mean = len(diffs), float(np.mean(diffs))
    half = cs_half_width(n, float(((np.asarray(diffs) - mean) ** 2).sum()), alpha, c)
    assert math.isfinite(half)
    assert mixture_martingale(diffs, mean + half, c) == pytest.approx(1 / alpha, rel=1e-9)
    assert mixture_martingale(diffs, mean - half * 0.999, c) < 1 / alpha < mixture_martingale(diffs, mean - half * 1.001, c)


def test_one_observation_carries_no_evidence_and_two_give_no_finite_interval():
    assert mixture_martingale([0.7], 0.0, 0.5) == pytest.approx(1.0)  # M_1 = 1: the martingale starts at 1
    assert cs_half_width(1, 0.0, 0.05, 0.5) == math.inf
    assert cs_half_width(2, 1.0, 0.05, 0.5) == math.inf


def test_the_interval_scales_with_the_data_and_narrows_with_more_pairs():
    c = mixture_precision(10, 0.0125)
    widths = [cs_half_width(n, n - 1.0, 0.0125, c) for n in range(6, 17)]
    assert widths == sorted(widths, reverse=True)
    assert cs_half_width(8, 7.0 * 9, 0.0125, c) == pytest.approx(3 * cs_half_width(8, 7.0, 0.0125, c))


def test_it_is_wider_than_a_fixed_n_t_interval_and_says_by_how_much():
    pytest.importorskip("scipy")
    design = Design(comparisons=4, max_pairs=16, start=3)
    cs = cs_half_width(10, 9.0, design.alpha, design.precision)
    t = float(naive_t_half_width(10, 9.0, design.alpha))
    assert 1.4 < cs / t < 1.8  # the docs' "about 1.6x at 10 pairs"


def test_verdicts_and_stopping_reasons_of_a_family():
    design = Design(comparisons=2, max_pairs=6, start=3, halfwidth=0.01)
    base = {s: 2.0 + 0.1 * s for s in range(6)}
    better = {s: base[s] - 0.05 + 0.001 * (-1) ** s for s in range(6)}  # clearly better, tight
    noisy = {s: base[s] + (0.3 if s % 2 else -0.3) for s in range(6)}
    rows = compare_family({"b": base, "v": better, "w": noisy}, {"v": "b", "w": "b"}, "min", design)
    assert [(r.variant, r.verdict, r.stopping) for r in rows] == [("v", BETTER, PRECISE), ("w", NOT_RESOLVED, MAX_SEEDS)]
    assert rows[0].relative_half_width <= 0.01 and rows[0].to_json()["family"] == 2
    worse = compare_sequential("x", {s: v + 0.05 for s, v in base.items()}, "b", base, "min", design)
    assert worse.verdict == WORSE
    short = compare_sequential("x", {0: 1.0, 1: 1.1}, "b", {0: 1.2, 1: 1.25}, "min", design)
    assert (short.verdict, short.reason, short.half_width) == (NOT_RESOLVED, "unbounded at 2 pairs", None)


@pytest.mark.parametrize("state, ended, reason", [
    ("FINISHED", True, "budget"), ("FAILED", True, "budget"),  # FAILED at its end: some trials failed
    ("FAILED", False, "stopped"),  # the driver itself failed before the end
    ("KILLED", False, "stopped"), ("interrupted", False, "stopped"), ("RUNNING", False, "running")])
def test_an_imprecise_comparison_says_whether_the_budget_or_a_stop_ended_it(state, ended, reason):
    """A sweep stopped after two of its three 10-minute parts has spent 20 of its 30 minutes: its
    imprecise comparisons were stopped, not ended by the budget, and `--resume` would add seeds."""
    from k3lab.report.family import unfinished_reason

    design = Design(comparisons=1, max_pairs=8, start=3, halfwidth=0.001)
    base = {s: 2.0 + 0.1 * s for s in range(4)}
    noisy = {s: base[s] + (0.3 if s % 2 else -0.2) for s in range(4)}
    row = compare_sequential("w", noisy, "b", base, "min", design, unfinished_reason(state, ended))
    assert row.verdict == NOT_RESOLVED and row.stopping == reason


# -- the seeds policy on plain data ------------------------------------------------------------


def planner(halfwidth=0.01, start=3, max_seeds=8, variants=("base", "a", "b"), **budget):
    compared = {v: "base" for v in variants if v != "base"}
    return SeedPlanner(list(variants), compared, list(range(max_seeds)), start,
                       Design(len(compared), max_seeds, start, halfwidth=halfwidth), **budget)


def drive(plan, value, concurrency=1, order=None):
    """Run a planner as Tune would, `concurrency` trials at a time, ending them in `order`
    ("fifo" or "lifo"); value(variant, seed) is a trial's result. Returns the trials in start order."""
    running, started = [], []
    while True:
        while len(running) < concurrency:
            chosen = plan.next_trial()
            if chosen is None or chosen == FINISHED:
                break
            running.append(chosen)
            started.append(chosen)
        if not running:
            assert plan.next_trial() == FINISHED and plan.done()
            return started
        variant, seed = running.pop(-1 if order == "lifo" else 0)
        plan.complete(variant, seed, value(variant, seed))


def test_every_variant_starts_with_start_seeds_and_a_precise_one_stops_there():
    truth = {"base": 0.0, "a": -0.1, "b": 0.0}
    rng = np.random.default_rng(3)
    noise = {v: rng.normal(0, 1, 8) for v in truth}
    spread = {"base": 1e-4, "a": 1e-4, "b": 0.02}  # a: almost no spread -> precise at once; b: noisy

    def value(v, s):
        return 2.0 + 0.05 * s + truth[v] + spread[v] * noise[v][s]

    plan = planner(halfwidth=0.002)
    started = drive(plan, value)
    assert started[:9] == [(v, s) for s in range(3) for v in ("base", "a", "b")]  # seed by seed
    runs = {v: sorted(s for w, s in started if w == v) for v in truth}
    assert runs["a"] == list(range(plan.seeds_run("a"))) and len(runs["a"]) < 8
    assert runs["b"] == list(range(8)) and runs["base"] == list(range(8))
    assert plan.summary()["a"]["stopping"] == "precise" and plan.summary()["b"]["stopping"] == "max seeds"


def test_the_decisions_do_not_depend_on_concurrency_or_the_order_trials_end_in():
    rng = np.random.default_rng(7)
    values = {v: 2.0 + rng.normal(0, 0.01, 8) for v in ("base", "a", "b")}
    values["a"] = values["base"] - 0.02 + rng.normal(0, 0.002, 8)

    def value(v, s):
        return float(values[v][s])

    runs = []
    for concurrency, order in ((1, "fifo"), (3, "fifo"), (4, "lifo"), (7, "fifo")):
        plan = planner(halfwidth=0.004)
        runs.append(sorted(drive(plan, value, concurrency, order)))
    assert all(run == runs[0] for run in runs)
    assert 9 < len(runs[0]) < 24  # some seeds added, not all


def test_the_widest_comparison_gets_its_seeds_first():
    plan = planner(halfwidth=None, max_seeds=8)
    base = [2.0, 2.1, 2.2, 2.05, 2.15, 2.12, 2.0, 2.1]
    for s in range(3):
        plan.next_trial(), plan.next_trial(), plan.next_trial()
        plan.complete("base", s, base[s])
        plan.complete("a", s, base[s] - 0.01 + 0.001 * s)  # tight
        plan.complete("b", s, base[s] + 0.2 * (-1) ** s)  # wide
    assert plan.relative_half_width("b", 3) >= plan.relative_half_width("a", 3)  # both unbounded at 3 pairs here
    plan.complete("base", 3, 2.0), plan.suggested.append(("base", 3))
    for s in range(3, 6):
        for v, x in (("a", base[s] - 0.01 + 0.001 * s), ("b", base[s] + 0.2 * (-1) ** s), ("base", base[s])):
            if (v, s) not in plan.suggested:
                plan.suggested.append((v, s))
            plan.complete(v, s, x)
    wanted = plan.wanted()
    assert wanted[:2] == [("base", 6), ("b", 6)] and ("a", 6) in wanted


def test_a_trial_budget_stops_adding_seeds_and_says_so():
    plan = planner(halfwidth=None, budget_trials=11)
    started = drive(plan, lambda v, s: 2.0 + 0.01 * s + (0.001 if v == "a" else 0.0))
    assert len(started) == 11 and plan.budget_hit
    assert {row["stopping"] for row in plan.summary().values()} == {"budget"}


def test_a_wall_budget_starts_no_trial_the_time_left_cannot_hold():
    now = [0.0]
    plan = planner(halfwidth=None, budget_wall_s=1000.0, clock=lambda: now[0])
    started = []
    while (chosen := plan.next_trial()) not in (None, FINISHED):
        started.append(chosen)
        now[0] += 100.0  # every trial takes 100 s, one at a time
        plan.complete(*chosen, 2.0 + 0.01 * chosen[1])
    assert len(started) == 10 and plan.budget_hit and plan.done()  # 10 x 100 s fit in 1000 s


def test_the_state_survives_a_restore_and_reaches_the_same_decisions():
    rng = np.random.default_rng(11)
    values = {v: 2.0 + rng.normal(0, 0.01, 8) for v in ("base", "a", "b")}

    def value(v, s):
        return float(values[v][s])

    whole = sorted(drive(planner(halfwidth=0.004), value))
    first = planner(halfwidth=0.004)
    for _ in range(13):  # part of the sweep, then the driver dies with two trials running
        chosen = first.next_trial()
        if len(first.in_flight()) > 2:
            first.complete(*first.in_flight()[0], value(*first.in_flight()[0]))
    state = first.get_state()
    second = planner(halfwidth=0.004)
    second.set_state(state)
    for variant, seed in second.in_flight():  # Tune restores the trials that were running
        second.complete(variant, seed, value(variant, seed))
    rest = drive(second, value)
    assert sorted(set(state_trials(state)) | set(rest)) == whole
    assert not set(rest) & {t for t in state_trials(state)}  # nothing handed out twice


def state_trials(state):
    return [tuple(t) for t in state["suggested"]]


# -- whole sweeps, simulated -------------------------------------------------------------------

SWEEPS = 1000
K, START, MAX = 4, 3, 16
HALFWIDTH = 0.0025  # relative, as in the example
BASE_LOSS = 2.0
TARGET = HALFWIDTH * BASE_LOSS
SEED_SPREAD = 0.02  # the seed-to-seed spread, shared by the trials of one seed (cancels in the pairs)
NOISE = np.array([0.002, 0.0015, 0.002, 0.003, 0.004])  # per variant (0: the baseline); sd of a trial


def draw(rng, truth, sweeps=SWEEPS):
    """Trial results [sweep, variant, seed]: loss + the seed's shared part + the variant's own noise."""
    seed_part = rng.normal(0, SEED_SPREAD, (sweeps, 1, MAX))
    noise = rng.normal(0, 1, (sweeps, K + 1, MAX)) * NOISE[None, :, None]
    return BASE_LOSS + seed_part + np.concatenate([[0.0], truth])[None, :, None] + noise


def planner_sweep(results):
    """One simulated sweep through the real policy; returns (comparisons, seeds each variant ran)."""
    names = ["base"] + [f"v{i}" for i in range(1, K + 1)]
    design = Design(K, MAX, START, halfwidth=HALFWIDTH)
    plan = SeedPlanner(names, {v: "base" for v in names[1:]}, list(range(MAX)), START, design)
    started = drive(plan, lambda v, s: float(results[names.index(v), s]))
    values = {v: {s: float(results[names.index(v), s]) for w, s in started if w == v} for v in names}
    rows = compare_family(values, {v: "base" for v in names[1:]}, "min", design)
    return rows, [len(values[v]) for v in names[1:]]


def vectorised_sweeps(results, half_width):
    """The same stopping rule for every sweep at once, with any interval `half_width(n, ss, alpha)`:
    each comparison stops at the first n >= START with half-width <= TARGET-relative, or at MAX.
    Returns (mean, half, stop n) per [sweep, comparison]."""
    d = results[:, 1:, :] - results[:, :1, :]
    n = np.arange(1, MAX + 1)
    mean = np.cumsum(d, -1) / n
    ss = np.cumsum(d * d, -1) - n * mean ** 2
    base_mean = np.cumsum(results[:, :1, :], -1) / n
    half = half_width(n, ss, 0.05 / K)
    stop_now = half <= HALFWIDTH * np.abs(base_mean)
    stop_now[..., :START - 1] = False
    stop_now[..., MAX - 1] = True
    stop = np.argmax(stop_now, -1)
    pick = lambda a: np.take_along_axis(np.broadcast_to(a, d.shape), stop[..., None], -1)[..., 0]  # noqa: E731
    return pick(mean), pick(half), stop + 1


def cs(n, ss, alpha):
    return cs_half_width(n, ss, alpha, Design(K, MAX, START).precision)


def family_figures(mean, half, truth):
    """(simultaneous coverage, family-wise error over the comparisons whose truth is 0)."""
    cover = (np.abs(mean - truth) <= half).all(-1).mean()
    nulls = truth == 0
    called = (np.abs(mean[:, nulls]) > half[:, nulls]).any(-1).mean() if nulls.any() else 0.0
    return float(cover), float(called)


@pytest.fixture(scope="module")
def simulated():
    """1,000 sweeps of 4 variants against one baseline, through the real policy."""
    rng = np.random.default_rng(2026)
    truth = np.array([0.0, 0.0, -0.004, 0.002])  # two variants with no effect, one better, one worse
    results = draw(rng, truth)
    sweeps = [planner_sweep(r) for r in results]
    null = np.zeros(K)
    null_results = draw(rng, null)
    null_sweeps = [planner_sweep(r) for r in null_results]
    return truth, results, sweeps, null_results, null_sweeps


def figures_of(sweeps, truth):
    mean = np.array([[c.mean_diff for c in rows] for rows, _ in sweeps])
    half = np.array([[c.half_width if c.half_width is not None else np.inf for c in rows] for rows, _ in sweeps])
    return family_figures(mean, half, truth)


def test_simulated_sweeps_cover_the_true_differences_under_the_stopping_rule(simulated):
    truth, _, sweeps, _, _ = simulated
    coverage, error = figures_of(sweeps, truth)
    seeds = np.array([ran for _, ran in sweeps])
    print(f"\nsimulation: {SWEEPS} sweeps, K={K}: simultaneous coverage {coverage:.3f} (nominal 0.95), "
          f"family-wise error on the 2 null variants {error:.3f} (nominal <= 0.05), "
          f"seeds per variant: mean {seeds.mean():.1f}, {np.mean(seeds < MAX):.0%} stopped before max")
    assert coverage >= 0.95
    assert error <= 0.05
    assert 0.2 < np.mean(seeds < MAX)  # the rule does stop early: this tests the adaptive case
    assert len({tuple(s) for s in seeds}) > 50  # and the seeds differ from sweep to sweep


def test_simulated_sweeps_with_no_effect_call_better_or_worse_at_most_at_the_family_wise_rate(simulated):
    _, _, _, _, null_sweeps = simulated
    coverage, error = figures_of(null_sweeps, np.zeros(K))
    print(f"\nsimulation, every true difference 0: family-wise error {error:.3f} (nominal <= 0.05), "
          f"coverage {coverage:.3f}")
    assert error <= 0.05 and coverage >= 0.95
    verdicts = {c.verdict for rows, _ in null_sweeps for c in rows}
    assert NOT_RESOLVED in verdicts


def test_the_vectorised_rule_is_the_policy(simulated):
    """The vectorised simulation below stops where the real policy stops (so its comparison with
    the naive interval is a comparison under the same rule)."""
    truth, results, sweeps, _, _ = simulated
    mean, half, stop = vectorised_sweeps(results[:200], cs)
    assert np.array_equal(stop, np.array([ran for _, ran in sweeps[:200]]))
    policy_mean = np.array([[c.mean_diff for c in rows] for rows, _ in sweeps[:200]])
    np.testing.assert_allclose(mean, policy_mean, rtol=0, atol=1e-12)


def test_a_fixed_t_interval_rechecked_after_every_pair_would_under_cover(simulated):
    """The naive rule: the same stopping rule with Student t-intervals (even Bonferroni-split
    at alpha / K, which is valid for a fixed number of seeds) fails the nominal rates: it stops
    where the sample spread happens to be small. The per-comparison 95% t-interval k3lab uses for
    fixed seed lists fails by far. At a fixed n the Bonferroni t-intervals are fine."""
    pytest.importorskip("scipy")
    truth, results, _, null_results, _ = simulated
    rng = np.random.default_rng(5)
    more = draw(rng, truth, 4000)  # more sweeps for the naive rule, so its shortfall is not chance
    more_null = draw(rng, np.zeros(K), 4000)
    naive = lambda n, ss, alpha: naive_t_half_width(n, ss, alpha)  # noqa: E731
    unsplit = lambda n, ss, alpha: naive_t_half_width(n, ss, alpha * K)  # noqa: E731
    cover_naive, _ = family_figures(*vectorised_sweeps(more, naive)[:2], truth)
    _, error_naive = family_figures(*vectorised_sweeps(more_null, naive)[:2], np.zeros(K))
    cover_unsplit, error_unsplit = family_figures(*vectorised_sweeps(more_null, unsplit)[:2], np.zeros(K))
    cover_cs, _ = family_figures(*vectorised_sweeps(more, cs)[:2], truth)
    _, error_cs = family_figures(*vectorised_sweeps(more_null, cs)[:2], np.zeros(K))
    fixed = more[..., :8]  # no stopping rule: 8 seeds, decided before
    d = fixed[:, 1:] - fixed[:, :1]
    fixed_half = naive_t_half_width(8, ((d - d.mean(-1, keepdims=True)) ** 2).sum(-1), 0.05 / K)
    cover_fixed, _ = family_figures(d.mean(-1), fixed_half, truth)
    print(f"\nnaive Bonferroni t re-checked after every pair: coverage {cover_naive:.3f}, family-wise error "
          f"{error_naive:.3f}; per-comparison 95% t re-checked: family-wise error {error_unsplit:.3f}, coverage "
          f"{cover_unsplit:.3f}; confidence sequence: coverage {cover_cs:.3f}, error {error_cs:.3f}; "
          f"Bonferroni t at a fixed 8 seeds: coverage {cover_fixed:.3f}")
    assert cover_naive < 0.95 and error_naive > 0.05  # ~0.93 and ~0.07 with these draws (4.7 sd from 0.95)
    assert error_unsplit > 0.10 and cover_unsplit < 0.90
    assert cover_cs >= 0.95 and error_cs <= 0.05
    assert cover_fixed >= 0.95 - 3 * math.sqrt(0.05 * 0.95 / 4000)


def test_an_imprecise_comparison_says_about_how_many_pairs_the_asked_precision_would_take():
    """At a spread of 0.01 on a loss of 1.0, 0.5% needs the confidence sequence at about half a
    spread: tens of pairs; the figure is the first n at which the interval (planned for max n) is
    that narrow, and a precise comparison shows none."""
    from k3lab.report.sequential import needed_cell, pairs_needed

    design = Design(comparisons=4, max_pairs=12, start=3, halfwidth=0.005)
    needed = pairs_needed(0.01, 1.0, design, have=5)
    precision = lambda n: mixture_precision(-(-(3 + n) // 2), design.alpha)  # noqa: E731
    assert cs_half_width(needed, (needed - 1) * 1e-4, design.alpha, precision(needed)) <= 0.005
    assert cs_half_width(needed - 1, (needed - 2) * 1e-4, design.alpha, precision(needed - 1)) > 0.005
    assert pairs_needed(0.001, 1.0, design, have=40) == 41  # never the pairs it has: those were not enough
    assert 20 < needed < 200 and pairs_needed(1.0, 1.0, design, have=5) is None  # hopeless: over the cap
    base = {s: 1.0 + 0.01 * s for s in range(5)}
    noisy = compare_sequential("w", {s: v + (0.01 if s % 2 else -0.01) for s, v in base.items()}, "b", base, "min",
                               design, "stopped")
    assert noisy.pairs_needed is not None and needed_cell(noisy) == f"~{noisy.pairs_needed}"
    tight = compare_sequential("v", {s: v - 0.05 + 1e-5 * (-1) ** s for s, v in base.items()}, "b", base, "min",
                               design)
    assert tight.stopping == PRECISE and tight.pairs_needed is None and needed_cell(tight) == "-"


def test_without_an_asked_half_width_the_table_has_no_pairs_for_asked_column():
    """`pairs for asked` answers "how far from what was asked": a policy that asks for no precision
    (seeds up to max) has nothing to measure it against, so its table leaves the column out."""
    from k3lab.report.family import sequential_table_lines

    base = {s: 1.0 + 0.01 * s for s in range(5)}
    rows = [compare_sequential("w", {s: v + 0.01 * (-1) ** s for s, v in base.items()}, "b", base, "min",
                               Design(comparisons=1, max_pairs=8, start=3, halfwidth=halfwidth))
            for halfwidth in (None, 0.005)]
    plain, asked = (sequential_table_lines([row], "val_loss", row_design)
                    for row, row_design in zip(rows, (Design(1, 8, 3), Design(1, 8, 3, halfwidth=0.005))))
    assert "pairs for asked" not in plain[2] and "pairs for asked" in asked[2]
    assert rows[0].pairs_needed is None and rows[1].pairs_needed is not None
