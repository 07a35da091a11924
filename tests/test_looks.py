"""The group-sequential looks design: spending, alpha passed on, the shape check."""

import numpy as np
import pytest

from bench import looks_sweeps
from k3lab.report.looks import (EQUIVALENT, HIGHER, LOWER, OPEN, LookDesign, decide, null_p_values,
                                pooled_skewness, shape_draws, spending, spent_levels)

PATHS = 40_000


@pytest.fixture(scope="module")
def design():
    return LookDesign(2, margin=0.01).calibrated(PATHS)


def test_spent_levels_spend_the_spending_function_look_by_look():
    looks = (6, 8, 12, 16)
    levels = spent_levels(null_p_values(looks, "normal", 0.0, PATHS), looks, 0.05, 1.0)
    z = shape_draws(np.random.default_rng(3), (PATHS, 16), "normal", 0.0)  # fresh null paths
    d = z[:, None, :]
    crossed = np.zeros(PATHS, bool)
    for j, look in enumerate(looks):
        result = decide(d, np.full((PATHS, 1), look), LookDesign(1, looks[:j + 1], levels=(levels[:j + 1],),
                                                                  heavy_tail_levels=(levels[:j + 1],), check=99))
        crossed = np.isin(result.code[:, 0], (LOWER, HIGHER))
        assert abs(crossed.mean() - 0.05 * spending(look / 16, 1.0)) < 4 * np.sqrt(0.05 / PATHS)
    assert max(levels) < 0.05  # every look stricter than a single look would be


def test_a_decided_comparison_passes_its_alpha_to_the_open_one(design):
    base = np.array([-1.0, 1.0, -1.0, 1.0, -1.0, 1.0])
    strong = 5.0 + 0.1 * base
    from k3lab.report.stats import t_quantile

    target = np.sqrt(design.levels[0][0] * design.levels[1][0])  # a p-value between alpha / 2's level and alpha's
    weak = 1.0 + base * np.sqrt(6) / (t_quantile(1 - target / 2, 5) * np.std(base, ddof=1))
    d = np.array([[strong, weak]])
    alone = decide(d[:, 1:], np.full((1, 1), 6), attrs_one(design))
    both = decide(d, np.full((1, 2), 6), design)
    p_weak = 2 * _t_sf(np.mean(weak) / (np.std(weak, ddof=1) / np.sqrt(6)), 5)
    assert design.levels[1][0] < p_weak <= design.levels[0][0]  # the weak one needs all the alpha
    assert both.code[0, 0] == HIGHER and both.code[0, 1] == HIGHER  # it gets it once the strong one fell
    assert alone.code[0, 0] == OPEN


def attrs_one(design: LookDesign) -> LookDesign:
    """The same design with only the half-alpha row (two comparisons open, none ever decided)."""
    import attrs

    return attrs.evolve(design, comparisons=1, levels=(design.levels[1],), heavy_tail_levels=(design.heavy_tail_levels[1],))


def _t_sf(t, df):
    from k3lab.report.stats import t_two_sided_probability

    return (1 - t_two_sided_probability(abs(t), df)) / 2


def test_the_shape_check_flags_a_second_mode_and_tests_the_call_against_its_skew_at_the_heavy_tail(design):
    """Far-off runs on the right: a lower value than the baseline's is the call the skew makes
    likely by chance, so it is tested at the heavy tail's one-sided level; a higher one at half
    the base level, as unflagged."""
    rng = np.random.default_rng(0)
    main = 0.05 * rng.standard_normal((1, 2, 16))
    main[0, :, [2, 9, 13]] += 1.0  # one run in five trains badly: a second mode
    assert pooled_skewness(main, 6)[0] > design.check
    result = decide(main + np.array([-2.0, 2.0])[None, :, None], np.full((1, 2), 16), design)
    assert result.flagged_at[0] == 0 and result.skew_sign[0] == 1
    assert list(result.code[0]) == [LOWER, HIGHER] and list(result.look[0]) == [0, 0]
    heavy, half = design.heavy_tail_levels[1][0], design.levels[1][0] / 2
    assert heavy < half
    assert result.level[0, 0] == 2 * heavy and result.level[0, 1] == 2 * half


def test_gaussian_pairs_are_not_flagged_by_the_shape_check(design):
    d = np.random.default_rng(1).standard_normal((2000, 2, 16))
    rate = (np.abs(pooled_skewness(d, 6)) > design.check).mean()
    assert 0.05 < rate < 0.4  # a false flag costs power, not error


def test_equivalence_stops_a_comparison_without_passing_its_alpha(design):
    rng = np.random.default_rng(2)
    d = np.stack([0.0005 * rng.standard_normal(16), 0.3 + 0.2 * rng.standard_normal(16)])[None]
    result = decide(d, np.full((1, 2), 16), design, reference=np.full((1, 2), 1.0))
    assert result.code[0, 0] == EQUIVALENT
    assert result.level[0, 1] <= design.levels[1][result.look[0, 1]]  # still tested at alpha / 2


def test_looks_must_rise_from_three_pairs():
    with pytest.raises(ValueError, match="looks must rise"):
        LookDesign(2, (2, 6))
    with pytest.raises(ValueError, match="looks must rise"):
        LookDesign(2, (8, 6))


def test_a_seeds_policy_names_looks_that_do_not_run_from_start_to_max():
    from k3lab.errors import FieldError
    from k3lab.registry.sections import SeedsSpec

    assert SeedsSpec(start=6, max=16, looks=[6, 8, 12, 16]).looks == (6, 8, 12, 16)
    for looks in ([4, 8, 12, 16], [6, 8, 12], [6, 12, 8, 16]):
        with pytest.raises(FieldError, match="looks must rise from start=6 to max=16"):
            SeedsSpec(start=6, max=16, looks=looks)


def test_the_gpu_plan_prints_the_looks_and_the_spread_its_margin_needs():
    from pathlib import Path

    from k3lab.registry.plan import policy_lines
    from k3lab.registry.sweep_file import load_sweep

    sweep = load_sweep(Path(__file__).resolve().parent.parent / "experiments" / "attnres_block.yaml", "gpu")
    [line] = policy_lines(sweep)[:1]
    assert "then looks at 7, 8, 10, 12, 16 seeds" in line and "Holm's alpha passed on" in line
    assert "a pair spread (sd) under" in line and "of 0 and 16 pairs" in line


def test_a_planner_with_looks_starts_the_first_look_and_stops_decided_comparisons_there():
    from k3lab.report.sequential import Design
    from k3lab.runner.tune.planner import FINISHED, SeedPlanner

    design = Design(2, 16, 6, looks=(6, 8, 12, 16)).calibrated()
    plan = SeedPlanner(["base", "a", "b"], {"a": "base", "b": "base"}, list(range(16)), 6, design)
    value = {"base": 1.0, "a": 0.9, "b": 1.0}  # a: far better; b: no difference
    noise = np.random.default_rng(4).standard_normal((3, 16)) * 0.01
    started = []
    while (chosen := plan.next_trial()) not in (None, FINISHED):
        started.append(chosen)
        plan.complete(*chosen, value[chosen[0]] + noise[["base", "a", "b"].index(chosen[0]), chosen[1]])
    assert started[:18] == [(v, s) for s in range(6) for v in ("base", "a", "b")]  # pairs complete seed by seed
    assert plan.seeds_run("a") == 6  # decided at the first look
    assert plan.summary()["a"]["stopping"] == "decided"
    assert plan.seeds_run("b") == 16 and plan.seeds_run("base") == 16  # never decided: every look to max


def test_the_report_judges_a_looks_family_at_each_comparisons_last_look():
    from k3lab.report.sequential import BETTER, NOT_RESOLVED, Design, compare_family

    design = Design(2, 16, 6, looks=(6, 8, 12, 16), margin=0.005).calibrated()
    rng = np.random.default_rng(7)
    base = {s: 1.14 + 0.02 * rng.standard_normal() for s in range(7)}
    values = {"off": base, "full": {s: base[s] - 0.05 + 0.005 * rng.standard_normal() for s in range(6)},
              "bs4": {s: base[s] + 0.001 + 0.01 * rng.standard_normal() for s in range(7)}}
    values["bs4"][3] = None  # a failed trial: its pair is left out
    full, bs4 = compare_family(values, {"full": "off", "bs4": "off"}, "min", design)
    assert (full.verdict, full.pairs, full.stopping) == (BETTER, 6, "decided")
    assert full.half_width < abs(full.mean_diff)
    assert bs4.verdict == NOT_RESOLVED and bs4.pairs == 5  # 7 seeds run: its last look is at 6, one pair failed
    assert bs4.pairs_needed in (None, 8, 12, 16)  # the next look that would decide at this spread, if any


def test_the_report_says_when_the_pairs_shape_sent_a_direction_to_the_heavy_tails_level():
    from k3lab.report.sequential import Design, compare_family

    design = Design(2, 16, 6, looks=(6, 8, 12, 16)).calibrated()
    base = {s: 1.0 for s in range(6)}
    bad = {0: 0.0, 1: 0.0, 2: 1.0, 3: 0.0, 4: 0.0, 5: 0.0}  # one run in six far off: a second mode
    values = {"off": base, "a": {s: 1.0 + 0.01 * bad[s] + 0.0001 * s for s in range(6)},
              "b": {s: 1.0 + 0.01 * bad[(s + 3) % 6] - 0.0001 * s for s in range(6)}}
    rows = compare_family(values, {"a": "off", "b": "off"}, "min", design)
    assert all("pooled skewness passed +0.6 at 6 seeds: a lower value than the baseline's is tested at the heavy "
               "tail's level at every look" in row.reason for row in rows)


def two_mode_family() -> np.ndarray:
    """d[1, 2, 16]: comparison 0 tight and low through its first 6 pairs (a t near -6: past the
    base level, short of the heavy tail's); comparison 1's far-off runs show only after 6 pairs."""
    wiggle = np.tile([-1.0, 1.0], 8) * np.linspace(1.0, 1.5, 16)
    tight = -0.2 + 0.08 * wiggle
    tight[10] = 1.0  # its own far-off run comes late
    other = 0.05 * wiggle
    other[[7, 9, 11]] = 1.0
    return np.stack([tight, other])[None]


def test_a_flag_raised_at_a_later_look_reopens_a_call_made_before_it(design):
    d = two_mode_family()
    seen_at_six = decide(d[..., :6], np.full((1, 2), 6), design)
    assert seen_at_six.code[0, 0] == LOWER and seen_at_six.skew_sign[0] == 0  # alone, the first look calls it
    found = decide(d, np.full((1, 2), 16), design)
    assert found.skew_sign[0] == 1 and design.looks[found.flagged_at[0]] > 6  # the later pairs show the skew
    assert found.code[0, 0] != LOWER or found.look[0, 0] > 0  # not called at the first look any more
    assert found.pairs[0, 0] > 6  # it ran on


def test_the_planner_reopens_a_comparison_a_later_flag_overturns():
    from k3lab.report.sequential import Design
    from k3lab.runner.tune.planner import FINISHED, SeedPlanner

    d = two_mode_family()[0]
    design = Design(2, 16, 6, looks=(6, 8, 12, 16)).calibrated()
    plan = SeedPlanner(["off", "a", "b"], {"a": "off", "b": "off"}, list(range(16)), 6, design)
    runs = {"a": [], "b": [], "off": []}
    while (chosen := plan.next_trial()) not in (None, FINISHED):
        variant, seed = chosen
        runs[variant].append(seed)
        plan.complete(variant, seed, 1.0 + (0.0 if variant == "off" else d["ab".index(variant), seed]))
    assert len(runs["a"]) > 6  # stopped after its first look, then run on once b's pairs flagged the sweep
    assert runs["a"] == sorted(runs["a"]) and len(runs["off"]) >= max(len(runs["a"]), len(runs["b"]))


def test_the_planner_runs_the_trials_the_vectorised_simulation_counts():
    """bench/looks_sweeps.py counts trials from `decide` on whole sweeps; the policy that runs them
    (SeedPlanner, one trial at a time) must start exactly those trials, failed ones included."""
    from k3lab.report.sequential import Design
    from k3lab.runner.tune.planner import FINISHED, SeedPlanner

    design = Design(3, 16, 6, looks=(6, 8, 12, 16), margin=0.005).calibrated()
    names, rng = ["base", "a", "b", "c"], np.random.default_rng(12)
    for _ in range(12):
        d = np.array([-0.03, -0.01, 0.0])[:, None] + np.array([0.012, 0.006, 0.004])[:, None] * rng.standard_normal(
            (3, 16))
        base = np.full(16, 1.14)  # the baseline's mean is the margin's reference in both
        value = {("base", s): base[s] for s in range(16)} | {
            (v, s): base[s] + d[i, s] for i, v in enumerate(names[1:]) for s in range(16)}
        value[("b", 2)] = None  # a failed trial
        plan = SeedPlanner(names, {v: "base" for v in names[1:]}, list(range(16)), 6, design)
        started = []
        while (chosen := plan.next_trial()) not in (None, FINISHED):
            started.append(chosen)
            plan.complete(*chosen, value[chosen])
        d[1, 2] = np.nan
        found = decide(d[None], np.full((1, 3), 16), design.look_design, np.full((1, 3), 1.14))
        seeds = np.asarray(design.looks)[found.look[0]]
        assert len(started) == seeds.sum() + seeds.max()
        assert [plan.seeds_run(v) for v in names[1:]] == list(seeds)


@pytest.mark.parametrize("name", ["Gaussian", "gamma skew -1.5", "lognormal skew +1.5", "K = 2",
                                  "shared baseline, rho 0.8", "three decided, one null, gamma skew +1.5"])
def test_simulated_sweeps_hold_the_family_wise_error_for_the_shapes_covered(name):
    """bench/looks_sweeps.py's rows (docs/statistics.md), fewer sweeps: at or under alpha within
    three Monte Carlo standard errors. (The two-mode shape is not covered: the table shows its rows.)"""
    [scenario] = [s for s in looks_sweeps.SCENARIOS if s.name == name]
    outcome = looks_sweeps.simulate(scenario, 2000, seed=31)
    assert outcome.error <= 0.05 + 3 * looks_sweeps.monte_carlo_se(0.05, 2000)


def test_simulated_gpu_sweeps_decide_all_four_comparisons_in_nearly_every_sweep():
    [scenario] = [s for s in looks_sweeps.SCENARIOS if s.name == "GPU effects and spreads"]
    outcome = looks_sweeps.simulate(scenario, 2000, seed=32)
    assert outcome.all_decided >= 0.95 and outcome.wrong_sign == 0.0
    assert outcome.trials <= 37
