"""Seeds until decided: the sweep file's `seeds: {start, max, until}` and `budget:`, the plan that
`k3lab variants` and `--dry-run` print for them, and CPU sweeps through `SeedSearcher` (Ray Tune's
search interface), including a driver killed with SIGKILL and resumed."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import mini_sweep, sweep_args
from mlflow.tracking import MlflowClient

from k3lab.cli import main
from k3lab.errors import UserError
from k3lab.registry import load_sweep
from k3lab.report.sequential import Design
from k3lab.runner.tune.planner import FINISHED, SeedPlanner

pytestmark = pytest.mark.usefixtures("isolated_data")
REPO = Path(__file__).resolve().parents[1]

# at 2 start seeds the mini model's interval is ~3% of its loss, wider than the 2% asked (so a third
# seed is added); at 3 pairs it is ~0.5%: the comparison stops there, before max
POLICY = "seeds: {start: 2, max: 4, until: {halfwidth: 0.02}}"
SWEEP = mini_sweep("adapt", "seeds until decided").replace("seeds: [0]", POLICY)


def write(tmp_path, text, name="adapt.yaml"):
    path = tmp_path / name
    path.write_text(text)
    return path


# -- the sweep file ------------------------------------------------------------------------------


def test_a_policy_loads_with_every_seed_it_may_use_and_a_list_still_works(tmp_path):
    sweep = load_sweep(write(tmp_path, SWEEP + "budget: {wall: 1h30m, trials: 7}\n"))
    assert sweep.adaptive and sweep.seeds == (0, 1, 2, 3) and len(sweep.trials) == 8
    assert (sweep.seed_policy.start, sweep.seed_policy.until.halfwidth) == (2, 0.02)
    assert (sweep.budget.wall_s, sweep.budget.trials) == (5400.0, 7)
    old = load_sweep(write(tmp_path, mini_sweep("old", "x").replace("seeds: [0]", "seeds: [0, 1]"), "old.yaml"))
    assert not old.adaptive and old.seeds == (0, 1) and old.seed_policy is None and len(old.trials) == 4
    assert old.baselines == {"attnres_bs1": "attnres_off"}


def test_a_profile_may_set_the_policy_and_the_budget(tmp_path):
    text = mini_sweep("p", "x") + "profiles:\n  gpu: {seeds: {start: 3, max: 5}, budget: {wall: 10m}}\n"
    sweep = load_sweep(write(tmp_path, text), "gpu")
    assert sweep.seed_policy.max == 5 and sweep.budget.wall_s == 600 and sweep.seed_policy.until.rule == "decided"
    assert not load_sweep(write(tmp_path, text)).adaptive


@pytest.mark.parametrize("replacement, message", [
    ("seeds: {start: 1, max: 4}", "seeds.start: must be at least 2 (one pair gives no interval), got 1"),
    ("seeds: {start: 5, max: 4}", "seeds.max: must be at least start=5, got 4"),
    ("seeds: {start: 2, max: 4, until: {halfwidth: 2.5}}",
     "seeds.until.halfwidth: must lie in (0, 1) (relative to the baseline's metric), got 2.5"),
    ("seeds: {start: 2, max: 4, until: {half: 0.1}}", "seeds.until.half: unknown key; did you mean 'halfwidth'?"),
    ("seeds: {start: 2, max: 4, until: soon}",
     "seeds.until: expected decided, max or a mapping {halfwidth: H}, got string 'soon'"),
    ("seeds: {start: 2, max: 4}\nmetric: {margin: 2}", "metric.margin: must lie in (0, 1) (relative), got 2.0"),
    ("seeds: [0]\nmetric: {diverged: -1}", "metric.diverged: must be positive, got -1.0"),
    ("seeds: {begin: 2}", "seeds.begin: unknown key"),
    ("seeds: three", "seeds: expected a list of seeds or a mapping {start, max, until}, got string 'three'"),
    ("seeds: {start: 2}\nbudget: {wall: soon}", "budget.wall: expected a duration such as 30m, 1h30m or 90s"),
    ("seeds: [0]\nbudget: {wall: 30m}", "budget: needs a seeds policy (seeds: {start: ..., max: ...})"),
    ("seeds: {start: 2}\nscheduler: asha", "scheduler: must be none with a seeds policy"),
    ("seeds: [0, -1]", "seeds[1]: must be 0 .. 2147483647, got -1"),
    ("seeds: {start: 3}\nbudget: {trials: 5}",
     "budget.trials: must be at least the 6 trials of the start seeds (3 for each of 2 variants), got 5"),
    ("seeds: {start: 2, max: 100000000}", "seeds.max: must be at most 1000 seeds, got 100000000"),
    ("seeds: {start: 2, max: 4, first: 2147483646}",
     "seeds.first: its seeds 2147483646 .. 2147483649 must stay at most 2147483647"),
])
def test_policy_errors_name_the_file_the_field_and_the_rule_in_one_line(tmp_path, capsys, replacement, message):
    path = write(tmp_path, mini_sweep("bad", "x").replace("seeds: [0]", replacement))
    assert main(["variants", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {path}: ") and message in err and err.count("\n") == 1


def test_a_profile_error_points_into_the_profile(tmp_path, capsys):
    path = write(tmp_path, mini_sweep("bad", "x") + "profiles:\n  gpu: {seeds: {start: 2, max: 1}}\n")
    assert main(["variants", str(path)]) == 2
    assert "profiles.gpu.seeds.max: must be at least start=2, got 1" in capsys.readouterr().err


def test_variants_and_dry_run_show_the_policy_and_the_worst_case(tmp_path, capsys):
    path = write(tmp_path, SWEEP + "budget: {wall: 30m}\n")
    assert main(["variants", str(path), "--profile", "none"]) == 0
    variants = capsys.readouterr().out.splitlines()
    assert main(["sweep", str(path), "--profile", "none", "--dry-run", "--storage", str(tmp_path / "runs")]) == 0
    dry_run = capsys.readouterr().out.splitlines()
    for out in (variants, dry_run):
        text = " ".join(out)
        assert out[0] == "adapt (top-level settings): 2 variants x 2 to 4 seeds = 4 to 8 trials, 8 steps of 64 tokens"
        assert "wider than 2% of the baseline's val_loss" in text and "budget: wall 30m" in text
        assert "worst case: 8 trials, 4,096 tokens; time not known" in text
    assert not (tmp_path / "runs").exists()


def test_the_plan_says_which_rule_decides_the_seeds(tmp_path, capsys):
    decided = SWEEP.replace(POLICY, "seeds: {start: 2, max: 4}").replace("resources:", "metric: {margin: 0.005}\nresources:")
    assert main(["variants", str(write(tmp_path, decided)), "--profile", "none"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "each comparison not yet decided, the widest first, up to 4 (until decided: better or worse where" in text
    assert "equivalent where it lies inside +/-0.5% of the baseline's val_loss" in text
    assert main(["variants", str(write(tmp_path, SWEEP.replace(POLICY, "seeds: {start: 2, max: 4, until: max}"))),
                 "--profile", "none"]) == 0
    assert "then seed pairs up to 4 for every comparison" in " ".join(capsys.readouterr().out.split())


def test_the_worst_case_time_when_the_rate_is_known(tmp_path, capsys):
    path = write(tmp_path, SWEEP + "budget: {tokens_per_s: 2.0, trials: 6}\n")
    assert main(["variants", str(path), "--profile", "none"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "worst case: 8 trials, 4,096 tokens; time about 34 min at 2 tokens/s (budget.tokens_per_s)" in text
    assert "the budget stops it at 6 trials" in text


# -- CPU sweeps through the Searcher -------------------------------------------------------------


def trial_table(folder: Path, experiment: str = "adapt") -> dict[tuple[str, int], dict]:
    """(variant, seed) -> {status, value, run_id} of every trial run of the sweep."""
    client = MlflowClient(f"sqlite:///{folder / 'mlflow.db'}")
    parent_id = json.loads((folder / "runs" / f"{experiment}.k3lab.json").read_text())["parent_run_id"]
    parent = client.get_run(parent_id)
    runs = client.search_runs([parent.info.experiment_id], f"tags.mlflow.parentRunId = '{parent_id}'")
    table = {}
    for run in runs:
        key = (run.data.tags["k3lab.variant_name"], int(run.data.tags["k3lab.seed"]))
        assert key not in table, f"two runs of {key}"
        table[key] = {"status": run.info.status, "value": run.data.metrics.get("final_val_loss"),
                      "run_id": run.info.run_id, "epochs": run.data.params.get("data.epochs"),
                      "trainer": run.data.params.get("run.trainer"), "process": run.data.tags.get("k3lab.process")}
    return table


def replay(table, start=2, max_seeds=4, halfwidth=0.02) -> list[tuple[str, int]]:
    """The trials the policy decides for these results, worked out afresh without Ray."""
    plan = SeedPlanner(["attnres_off", "attnres_bs1"], {"attnres_bs1": "attnres_off"}, list(range(max_seeds)),
                       start, Design(1, max_seeds, start, halfwidth=halfwidth))
    chosen = []
    while (trial := plan.next_trial()) not in (None, FINISHED):
        chosen.append(trial)
        plan.complete(*trial, table[trial]["value"])
    return sorted(chosen)


def cli_env(data_dir) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "K3LAB_FAIL_AT_STEP"}
    return env | {"PYTHONPATH": str(REPO), "K3LAB_DATA_DIR": str(data_dir)}


@pytest.fixture(scope="module")
def adaptive_sweep(tmp_path_factory, data_dir):
    """The policy's mini sweep run to its end in a process of its own, one trial at a time."""
    folder = tmp_path_factory.mktemp("adaptive")
    path = write(folder, SWEEP)
    done = subprocess.run([sys.executable, "-m", "k3lab.cli", *sweep_args(folder, path, "--max-concurrent", "1")],
                          cwd=folder, env=cli_env(data_dir), capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return folder, done


@pytest.mark.slow
def test_until_adds_seeds_to_the_start_seeds_and_stops_when_precise(adaptive_sweep):
    folder, done = adaptive_sweep
    table = trial_table(folder)
    assert sorted(table) == [(v, s) for v in ("attnres_bs1", "attnres_off") for s in range(3)]  # 2 start + 1 added
    assert all(row["status"] == "FINISHED" and row["value"] > 0 for row in table.values())
    assert sorted(table) == replay(table)  # the trials Tune ran are the policy's decisions
    assert all(0 < float(row["epochs"]) < 1 for row in table.values())  # data.epochs logged by every trial
    summary = json.loads((folder / "runs" / "adapt_report" / "summary.json").read_text())
    paired = {row["variant"]: row["paired"] for row in summary["variants"]}["attnres_bs1"]
    assert paired["method"] == "halfwidth" and paired["pairs"] == 3 and paired["family"] == 1
    assert paired["stopping"] == "precise" and paired["relative_half_width"] <= 0.02
    assert summary["design"]["rule"] == "halfwidth" and summary["design"]["level"] < 0.05  # looks 2-4 at 5%
    assert "family-wise 95% repeated t-intervals" in " ".join(done.stdout.split())
    assert (folder / "runs" / "adapt_report" / "val_loss_curve_vs_baseline.png").exists()


@pytest.mark.slow
def test_a_driver_killed_with_sigkill_resumes_to_the_same_decisions(tmp_path, adaptive_sweep, data_dir):
    """kill -9 of the driver (and of the Ray instance it started, as a preempted machine loses
    both) once it has started a trial the policy added; --resume then ends in the same trials,
    each run once, with the same values as the sweep that ran through."""
    path = write(tmp_path, SWEEP)
    args = [sys.executable, "-m", "k3lab.cli", *sweep_args(tmp_path, path, "--max-concurrent", "1")]
    driver = subprocess.Popen(args, cwd=tmp_path, env=cli_env(data_dir), stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.time() + 600
        while time.time() < deadline and driver.poll() is None:
            time.sleep(1)
            try:
                started = trial_table(tmp_path)
            except Exception:  # the store or the state file is not there yet
                continue
            if any(seed >= 2 for _, seed in started):  # the policy added a seed: its decision was made
                break
        assert driver.poll() is None, "the sweep ended before it could be killed"
    finally:
        os.killpg(driver.pid, signal.SIGKILL)  # the driver's own process group: it, Ray and the trials
        driver.wait(timeout=60)
    assert main(sweep_args(tmp_path, path, "--resume", "--max-concurrent", "1")) == 0
    resumed, reference = trial_table(tmp_path), trial_table(adaptive_sweep[0])
    assert sorted(resumed) == sorted(reference) == replay(resumed)
    assert all(row["status"] == "FINISHED" for row in resumed.values())
    assert {k: row["value"] for k, row in resumed.items()} == {k: row["value"] for k, row in reference.items()}


@pytest.mark.slow
def test_reused_processes_restart_the_variants_trainer_for_its_next_seed_to_the_same_values(tmp_path,
                                                                                           adaptive_sweep):
    """resources.reuse_actors with the seeds policy: a process that ran a variant's seed runs its
    next one (the searcher prefers it) on the same trainer, restarted; every trial ends with the
    value it has when each trial builds its own (the fixture's sweep)."""
    path = write(tmp_path, SWEEP.replace("resources: {cpu: 1, gpu: 0}", "resources: {cpu: 1, gpu: 0, reuse_actors: true}"))
    assert main(sweep_args(tmp_path, path, "--max-concurrent", "1")) == 0
    reused, reference = trial_table(tmp_path), trial_table(adaptive_sweep[0])
    assert sorted(reused) == sorted(reference)
    assert {k: row["value"] for k, row in reused.items()} == {k: row["value"] for k, row in reference.items()}
    assert len({row["process"] for row in reused.values()}) == 1
    built = sorted(k for k, row in reused.items() if row["trainer"] == "built")
    assert built == [("attnres_bs1", 0), ("attnres_off", 0), ("attnres_off", 2)]  # the rest took their variant's
    assert {row["trainer"] for row in reference.values()} == {"built"}


def test_an_adaptive_resume_refuses_a_changed_policy(tmp_path, capsys):
    path = write(tmp_path, SWEEP)
    (tmp_path / "runs" / "adapt").mkdir(parents=True)
    trials = [t.id for t in load_sweep(path).trials]
    (tmp_path / "runs" / "adapt.k3lab.json").write_text(json.dumps({"parent_run_id": "x", "trials": trials}))
    path.write_text(SWEEP.replace("max: 4", "max: 5"))
    assert main(sweep_args(tmp_path, path, "--resume")) == 2
    assert "no longer describes the trials" in capsys.readouterr().err


def test_a_halfwidth_of_zero_is_refused(tmp_path):
    with pytest.raises(UserError, match="seeds.until.halfwidth: must lie in"):
        load_sweep(write(tmp_path, SWEEP.replace("halfwidth: 0.02", "halfwidth: 0"), "zero.yaml"))


def test_the_searcher_speaks_ray_tunes_interface_and_its_saved_state_restores(tmp_path):
    from ray.tune.search import ConcurrencyLimiter, Searcher

    from k3lab.runner.tune.seeds import SeedSearcher

    def searcher():
        plan = SeedPlanner(["b", "v"], {"v": "b"}, [0, 1, 2, 3], 2, Design(1, 4, 2, halfwidth=1e-6))
        keys = {(name, seed): f"{name}_s{seed}" for name in ("b", "v") for seed in range(4)}
        return SeedSearcher(plan, keys, "val_loss", "min")

    def result(key):  # what a trial reports last: trained to the end, its metric
        return {"val_loss": 2.0 + 0.01 * int(key[-1]) + (0.003 if key.startswith("v") else 0.0) * int(key[-1]),
                "done_steps": 8, "total_steps": 8, "trial_status": "finished"}

    first = ConcurrencyLimiter(searcher(), max_concurrent=2)
    assert isinstance(first.searcher, Searcher)
    handed = {f"t{i}": first.suggest(f"t{i}") for i in range(3)}
    assert handed == {"t0": {"trial": "b_s0"}, "t1": {"trial": "v_s0"}, "t2": None}  # two at a time
    for trial_id in ("t0", "t1"):
        first.on_trial_complete(trial_id, result(handed[trial_id]["trial"]))
    handed |= {f"t{i}": first.suggest(f"t{i}") for i in (3, 4)}
    first.searcher.save(str(tmp_path / "searcher.json"))  # then the driver dies, t3 and t4 running
    second = searcher()
    second.restore(str(tmp_path / "searcher.json"))
    assert second.planner.suggested == [("b", 0), ("v", 0), ("b", 1), ("v", 1)]
    for trial_id in ("t3", "t4"):  # Tune restores the trials that were running; they end
        second.on_trial_complete(trial_id, result(handed[trial_id]["trial"]))
    order, n = [], 5
    while (suggestion := second.suggest(f"t{n}")) not in (None, Searcher.FINISHED):
        order.append(suggestion["trial"])
        second.on_trial_complete(f"t{n}", result(suggestion["trial"]))
        n += 1
    assert order == ["b_s2", "v_s2", "b_s3", "v_s3"]  # a halfwidth nobody reaches: up to max
    assert second.suggest("last") == Searcher.FINISHED and not second.unfinished()
    second.on_trial_complete("unknown", None, error=True)  # a trial it never handed out: ignored



def test_a_freed_process_gets_its_variants_next_seed_but_no_trial_of_a_later_stage():
    """next_trial(prefer=...) hands out the ended variant's next wanted seed before the others of
    the same stage (its process restarts that variant's trainer), and never an added seed ahead
    of a start seed; the searcher prefers the variants whose trials ended, first ended first."""
    from k3lab.runner.tune.seeds import SeedSearcher

    def planner():
        return SeedPlanner(["b", "v", "w"], {"v": "b", "w": "b"}, [0, 1, 2, 3], 2, Design(2, 4, 2, halfwidth=1e-6))

    plan = planner()
    assert [plan.next_trial(), plan.next_trial()] == [("b", 0), ("v", 0)]  # two at once: seed by seed
    plan.complete("v", 0, 2.0)
    assert plan.next_trial(prefer=["v"]) == ("v", 1)  # not ("w", 0), first in line
    assert plan.next_trial(prefer=["x"]) == ("w", 0)  # a variant with nothing wanted: the line's order
    for variant, seed in [("b", 0), ("v", 1), ("w", 0)]:
        plan.complete(variant, seed, 2.0 + 0.01 * seed + (0.02 if variant == "v" else 0.0))
    assert plan.next_trial(prefer=["b"]) == ("b", 1)
    plan.complete("b", 1, 2.01)  # b and v have their start seeds; v's third is wanted, w's second is not out
    assert plan.decision("v", 2) and ("v", 2) in plan.wanted() and plan.wanted()[0] == ("w", 1)
    assert plan.next_trial(prefer=["v"]) == ("w", 1)  # a start seed before any added one

    searcher = SeedSearcher(planner(), {(v, s): f"{v}_s{s}" for v in "bvw" for s in range(4)}, "val_loss", "min")
    last = {"val_loss": 2.0, "done_steps": 8, "total_steps": 8, "trial_status": "finished"}
    assert [searcher.suggest(t)["trial"] for t in ("t0", "t1", "t2")] == ["b_s0", "v_s0", "w_s0"]
    searcher.on_trial_complete("t2", last)
    searcher.on_trial_complete("t0", last)
    assert [searcher.suggest(t)["trial"] for t in ("t3", "t4")] == ["w_s1", "b_s1"]  # w ended first


def test_a_sweep_run_in_parts_spends_its_wall_budget_as_the_sum_of_the_parts(tmp_path):
    from ray.tune.search import Searcher

    from k3lab.runner.tune.seeds import SeedSearcher

    now = [0.0]

    def searcher():
        plan = SeedPlanner(["b", "v"], {"v": "b"}, list(range(8)), 2, Design(1, 8, 2, halfwidth=1e-6),
                           budget_wall_s=500.0, clock=lambda: now[0])
        keys = {(name, seed): f"{name}_s{seed}" for name in ("b", "v") for seed in range(8)}
        return SeedSearcher(plan, keys, "val_loss", "min")

    done = {"val_loss": 2.0, "done_steps": 8, "total_steps": 8, "trial_status": "finished"}
    first = searcher()
    assert first.suggest("t0") == {"trial": "b_s0"}  # part 1 starts at t = 0
    now[0] = 100.0
    first.on_trial_complete("t0", done)  # a 100 s trial; then nothing asks the searcher for 300 s
    now[0] = 400.0
    first.save(str(tmp_path / "searcher.json"))  # Tune's last save, as --stop-after stops part 1
    assert json.loads((tmp_path / "searcher.json").read_text())["planner"]["spent_s"] == 400.0

    now[0] = 10_000.0  # part 2, on another machine hours later
    second = searcher()
    second.restore(str(tmp_path / "searcher.json"))
    now[0] = 10_050.0
    assert second.suggest("t1") == Searcher.FINISHED  # 400 + 50 s spent and a 100 s median trial: over 500 s
    assert second.planner.spent_s == 450.0 and second.planner.budget_hit
