"""Main effects and two-way interactions of a multi-axis sweep (k3lab.report.factorial): the grid read
from the trials' axis params, the contrasts, their family-wise intervals, and a simulated factorial
with known effects recovered at the nominal coverage."""

import itertools
import json
import random

import pytest

from k3lab.report.factorial import contrasts, factorial_effects, factorial_grid
from k3lab.report.tables import factorial_lines
from k3lab.report.records import TrialRecord
from k3lab.report.sequential import fixed_design

AXES = {"ffn": ("moe", "latent_moe"), "top_k": ("1", "2"), "shared": ("0", "1")}
# the truth: main effects and interactions, in loss units
MAIN = {"ffn": -0.030, "top_k": -0.010, "shared": 0.0}
PAIRS = {("ffn", "top_k"): 0.015, ("ffn", "shared"): 0.0, ("top_k", "shared"): -0.005}


def name(cell: dict) -> str:
    return "-".join(f"{a}{cell[a]}" for a in AXES)


def true_value(cell: dict) -> float:
    on = {a: cell[a] != AXES[a][0] for a in AXES}
    return 3.0 + sum(MAIN[a] for a in AXES if on[a]) + sum(v for (a, b), v in PAIRS.items() if on[a] and on[b])


def simulated(seeds: int, rng: random.Random, noise: float = 0.02, extra: bool = True) -> list[TrialRecord]:
    records = []
    for seed in range(seeds):
        shared = rng.gauss(0, 0.1)  # a seed's luck, common to its cells: what pairing removes
        for levels in itertools.product(*AXES.values()):
            cell = dict(zip(AXES, levels))
            value = true_value(cell) + shared + rng.gauss(0, noise)
            records.append(TrialRecord(f"{name(cell)}-{seed}", name(cell), seed, "FINISHED",
                                       {f"axis.{a}": v for a, v in cell.items()}, {"val_loss": value}, 0, 1))
        if extra:  # an all-dense variant outside the grid
            records.append(TrialRecord(f"dense-{seed}", "dense", seed, "FINISHED", {"axis.ffn": "dense"},
                                       {"val_loss": 2.0 + shared}, 0, 1))
    return records


ORDER = ["dense"] + [name(dict(zip(AXES, levels))) for levels in itertools.product(*AXES.values())]


def truth(effect) -> float:
    """A main effect averages over the other axes' levels: half of each of its interactions comes with it."""
    if effect.kind == "main":
        axis = effect.axes[0]
        return MAIN[axis] + sum(v / 2 for pair, v in PAIRS.items() if axis in pair)
    return PAIRS[effect.axes]


def test_the_grid_leaves_out_variants_outside_it_and_orders_axes_as_the_file():
    grid = factorial_grid(simulated(1, random.Random(0)), ORDER)
    assert grid.axes == ("ffn", "top_k", "shared") and grid.levels["ffn"] == ("moe", "latent_moe")
    assert len(grid.cells) == 8 and "dense" not in grid.cells.values()
    records = simulated(1, random.Random(0))
    assert factorial_grid([r for r in records if r.variant != ORDER[-1]], ORDER) is None  # a cell missing
    single = [r for r in records if r.params.get("axis.top_k") == "1" and r.params.get("axis.shared") == "0"]
    assert factorial_grid([TrialRecord(r.run_id, r.variant, 0, "FINISHED", {"axis.ffn": r.params["axis.ffn"]},
                                       r.final, 0, 1) for r in single], ORDER) is None  # one axis
    assert factorial_grid(records, ORDER, {"ffn": "latent_moe"}).levels["ffn"] == ("latent_moe", "moe")


def test_contrasts_of_a_three_level_axis_and_a_two_level_axis():
    levels = {"schedule": ("3:1", "all_kda", "all_mla"), "dense": ("0", "1")}
    cells = {c: "-".join(c) for c in itertools.product(*levels.values())}
    from k3lab.report.factorial import Grid

    found = contrasts(Grid(("schedule", "dense"), levels, cells))
    assert [(axes, lv) for axes, lv, _ in found] == [
        (("schedule",), ("all_kda",)), (("schedule",), ("all_mla",)), (("dense",), ("1",)),
        (("schedule", "dense"), ("all_kda", "1")), (("schedule", "dense"), ("all_mla", "1"))]
    main = found[0][2]
    assert main == {("all_kda", "0"): 0.5, ("all_kda", "1"): 0.5, ("3:1", "0"): -0.5, ("3:1", "1"): -0.5}
    interaction = found[3][2]
    assert interaction == {("all_kda", "1"): 1, ("3:1", "1"): -1, ("all_kda", "0"): -1, ("3:1", "0"): 1}
    assert all(abs(sum(w.values())) < 1e-12 for _, _, w in found)  # contrasts: a constant shift cancels


def test_known_effects_are_recovered_with_many_seeds():
    effects, design = factorial_effects(simulated(200, random.Random(1)), "val_loss", ORDER)
    assert len(effects) == 6 and design.comparisons == 6
    for effect in effects:
        assert effect.difference == pytest.approx(truth(effect), abs=0.006), effect.label
        assert effect.pairs == 200 and effect.half_width < 0.01
    ffn = effects[0]
    assert ffn.label == "ffn=latent_moe (vs moe)" and ffn.verdict == "nonzero"
    assert ffn.relative == pytest.approx(100 * ffn.difference / 3.0, rel=0.05)


def test_simulated_factorials_are_covered_at_the_family_wise_level():
    """Holm over the 6 effects at 95% (one shape-calibrated look): all six intervals, each at the level its
    effect was tested at, hold the truth together in >= 95% of sweeps."""
    rng = random.Random(2)
    together, single, sweeps = 0, 0, 400
    for _ in range(sweeps):
        effects, _ = factorial_effects(simulated(5, rng, extra=False), "val_loss", ORDER[1:])
        covered = [abs(e.difference - truth(e)) <= e.half_width for e in effects]
        together += all(covered)
        single += sum(covered)
    assert together / sweeps >= 0.925  # nominal 0.95; 3 Monte Carlo standard errors below it
    assert single / (6 * sweeps) >= 0.98  # each at 1 - 0.05/6


def test_unadjusted_intervals_would_miss_the_family_wise_level():
    """The check above can fail: per-effect 95% intervals cover all six at once far less often."""
    rng = random.Random(3)
    narrower = fixed_design(1, 5).half_width_at(5, 1) / fixed_design(6, 5).half_width_at(5, 1)
    together, sweeps = 0, 300
    for _ in range(sweeps):
        effects, _ = factorial_effects(simulated(5, rng, extra=False), "val_loss", ORDER[1:])
        together += all(abs(e.difference - truth(e)) <= e.half_width * narrower for e in effects)
    assert together / sweeps < 0.9


def test_a_seed_missing_a_cell_is_left_out_of_the_effects_that_read_it():
    records = [r for r in simulated(4, random.Random(4)) if not (r.seed == 3 and r.variant == ORDER[-1])]
    effects, _ = factorial_effects(records, "val_loss", ORDER)
    assert {e.pairs for e in effects} == {3}  # every effect of a 2x2x2 reads every cell
    one, _ = factorial_effects(simulated(1, random.Random(5)), "val_loss", ORDER)
    assert all(e.half_width is None and e.verdict == "not resolved" for e in one)


def test_the_markdown_table_has_a_row_per_effect():
    effects, design = factorial_effects(simulated(4, random.Random(6)), "val_loss", ORDER)
    lines = factorial_lines(effects, design, "val_loss")
    assert len([line for line in lines if line.startswith("| main") or line.startswith("| interaction")]) == 6
    assert "Holm over 6" in lines[0]
    assert json.loads(json.dumps([e.to_json() for e in effects]))[3]["axes"] == ["ffn", "top_k"]


def test_the_report_of_a_two_axis_sweep_prints_and_stores_its_effects(tmp_path):
    from rich.console import Console

    from k3lab.report.options import ReportOptions
    from k3lab.report.summary import build_report
    from k3lab.report.tables import print_summary
    from k3lab.store import runs
    from k3lab.store.tracking import MLflowTracker

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    parent = MLflowTracker.start(uri, "grid", "grid")
    records = [r for r in simulated(3, random.Random(7), extra=False) if r.params["axis.shared"] == "0"]
    for r in records:
        trial = MLflowTracker.start(uri, "grid", f"{r.variant}-s{r.seed}", parent_run_id=parent.run_id,
                                    tags=runs.trial_tags(r.variant, r.variant, r.seed))
        trial.log_params({k: v for k, v in r.params.items() if k != "axis.shared"})
        trial.log_metrics({"train_loss": 4.0, "val_loss": r.final["val_loss"]}, step=1)
        trial.finish("FINISHED")
    parent.finish("FINISHED")
    order = [v for v in ORDER if v.endswith("shared0")]
    summary = build_report(uri, parent.run_id, ReportOptions(baseline=order[0], variant_order=order),
                           out_dir=tmp_path / "report", record=False)
    stored = json.loads((tmp_path / "report" / "summary.json").read_text())["factorial"]
    assert [e["label"] for e in stored["effects"]] == [
        "ffn=latent_moe (vs moe)", "top_k=2 (vs 1)", "ffn=latent_moe (vs moe) x top_k=2 (vs 1)"]
    assert stored["design"]["comparisons"] == 3
    console = Console(record=True, width=200)
    print_summary(console, "grid", summary)
    assert "main effects and interactions of the axes" in console.export_text()
