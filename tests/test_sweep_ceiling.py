"""bench/sweep_ceiling.py: the sweep files its phases run (the GPU runs themselves are benchmarks)."""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.sweep_ceiling import parse_args, sweep_file_for  # noqa: E402
from k3lab.registry.sweep_cli import load_sweep_for  # noqa: E402

FLAGSHIP = str(ROOT / "experiments/attnres_block.yaml")


def ceiling_args(file: str, *options: str):
    """The bench's arguments as its command line parses them (the profile `gpu` by default)."""
    return parse_args([file, "--work", "WORK", *options])


def test_the_slots_phase_runs_the_warm_phases_trials_with_training_slots(tmp_path):
    args = ceiling_args(FLAGSHIP, "--seeds", "0,1")
    warm, slots = (load_sweep_for(sweep_file_for(args, tmp_path, phase), "gpu") for phase in ("warm", "slots"))
    assert [t.id for t in warm.trials] == [t.id for t in slots.trials] and len(warm.trials) == 10  # 5 variants x 2
    assert not warm.adaptive and warm.budget is None
    assert warm.resources.training_slots is None and slots.resources.training_slots == 2
    assert slots.resources.max_concurrent_trials == warm.resources.max_concurrent_trials == 4


def test_without_seeds_the_warm_phase_runs_the_file_itself(tmp_path):
    args = ceiling_args("experiments/attnres_block.yaml")
    assert sweep_file_for(args, tmp_path, "warm") == "experiments/attnres_block.yaml"


def test_trials_runs_the_profiles_seeds_policy_stopped_after_that_many_trials(tmp_path):
    """--trials N: the profile's own policy (its searcher's order) with budget.trials N, no wall
    budget; the command says so."""
    from bench.sweep_ceiling import commands_for

    args = ceiling_args(FLAGSHIP, "--trials", "30")
    sweep = load_sweep_for(sweep_file_for(args, tmp_path, "fresh"), "gpu")
    assert sweep.adaptive and (sweep.budget.trials, sweep.budget.wall) == (30, None)
    assert sweep.seed_policy.start * len(sweep.valid_variants) == 30  # its first stage: the first look's seeds
    assert commands_for(args, {"fresh": {}}).startswith(
        f"python bench/sweep_ceiling.py {args.file} --profile gpu --work WORK --trials 30 --phase fresh")


def test_the_first_steps_time_is_split_at_the_drivers_and_the_trials_milestones():
    from bench.sweep_ceiling import timeline_steps

    phase = {"first_step_s": 76.0, "timeline": {"warmup_began_s": 28.8, "warmup_ended_s": 36.8,
                                                 "first_trial_began_s": 45.5, "first_trial_build_s": 16.5}}
    steps = timeline_steps(phase)
    assert [round(x, 1) for x in steps] == [28.8, 8.0, 8.7, 16.5, 14.0] and abs(sum(steps) - 76.0) < 1e-9
    cpu = {"first_step_s": 20.0, "timeline": {"first_trial_began_s": 12.0, "first_trial_build_s": 3.0}}
    assert timeline_steps(cpu) == [None, None, None, 3.0, 5.0]  # no kernel warm-up without a GPU


def test_each_number_of_training_slots_is_a_row_of_its_own_with_its_command():
    from bench.sweep_ceiling import commands_for, sweep_phases

    results = {"fresh": {}, "warm": {}, "alone": {}, "slots-2": {}, "slots-1": {}}
    assert sweep_phases(results) == ["fresh", "warm", "slots-1", "slots-2"]
    args = ceiling_args("f.yaml", "--seeds", "0,1")
    base = "python bench/sweep_ceiling.py f.yaml --profile gpu --work WORK --seeds 0,1"
    assert commands_for(args, results) == (f"{base} --phase fresh --phase warm --phase alone`, then `{base} --phase "
                                           f"slots --training-slots 1`, then `{base} --phase slots --training-slots 2"
                                           "`, then the same with `--write")


def test_the_trial_build_cell_names_its_parts_where_the_trial_logged_them():
    from bench.sweep_ceiling import timeline_table

    timeline = {"warmup_began_s": 28.8, "warmup_ended_s": 36.8, "first_trial_began_s": 45.5,
                "first_trial_build_s": 16.5}
    parts = {"startup_data_s": 1.2, "startup_model_s": 9.0, "startup_tracking_s": 4.1}
    results = {"warm": {"first_step_s": 76.0, "timeline": timeline},
               "slots-2": {"first_step_s": 76.0, "timeline": timeline | {"first_trial_build_parts": parts}}}
    rows = timeline_table(results).splitlines()[-2:]
    assert rows == ["| warm | 28.8 | 8.0 | 8.7 | 16.5 | 14.0 | 76.0 |",
                    "| slots-2 | 28.8 | 8.0 | 8.7 | 16.5 (corpus 1.2, model and optimizers 9.0, MLflow run 4.1) | 14.0 | 76.0 |"]


def test_another_checkouts_phase_is_a_row_beside_its_own_with_its_command():
    from bench.sweep_ceiling import commands_for, phase_key, sweep_phases

    args = ceiling_args("f.yaml", "--seeds", "0,1", "--tree", "/tmp/before", "--label", "before")
    assert phase_key(args, "warm") == "warm-before" and phase_key(args, "slots") == "slots-2-before"
    results = {"warm-before": {}, "fresh": {}, "warm": {}, "alone": {}}
    assert sweep_phases(results) == ["fresh", "warm", "warm-before"]
    base = "python bench/sweep_ceiling.py f.yaml --profile gpu --work WORK --seeds 0,1"
    assert commands_for(args, results) == (f"{base} --phase fresh --phase warm --phase alone`, then `{base} --phase "
                                           "warm --tree OTHER_CHECKOUT --label before`, then the same with `--write")
    assert commands_for(args, {"slots-2-before": {}}) == (f"{base} --phase slots --training-slots 2 --tree "
                                                         "OTHER_CHECKOUT --label before`, then the same with `--write")


def test_the_ceiling_is_the_sweeps_own_trials_run_alone_one_at_a_time():
    from bench.sweep_ceiling import ceiling_tokens_per_s

    alone = {"trials": [{"variant": "off", "tokens_per_s_last_window": 600_000.0},
                        {"variant": "full", "tokens_per_s_last_window": 300_000.0}]}
    sweep = {"tokens_by_variant": {"off": 6e6, "full": 6e6}}
    # 6M tokens at 600k/s (10 s) and 6M at 300k/s (20 s): 12M tokens in 30 s, not the fastest trial's 600k
    assert ceiling_tokens_per_s(sweep, alone) == 400_000.0
    assert ceiling_tokens_per_s({"tokens_by_variant": {"off": 6e6, "bs4": 6e6}}, alone) is None  # bs4 never ran alone
    assert ceiling_tokens_per_s({}, alone) is None  # a results.json from before tokens_by_variant


ALONE_OFF_AND_FULL = {"steps": 60, "trials": [  # an alone phase: the baseline twice as fast as full AttnRes
    {"trial": "off-s0", "variant": "off", "status": "FINISHED", "tokens_per_s_last_window": 600_000.0,
     "tokens_per_s_run_average": 500_000.0},
    {"trial": "full-s0", "variant": "full", "status": "FINISHED", "tokens_per_s_last_window": 300_000.0,
     "tokens_per_s_run_average": 250_000.0}]}


def two_variant_sweep(**figures) -> dict:
    """A sweep phase's figures: 6M tokens of each of the two variants, and `figures`."""
    return {"exit": 0, "finished": 2, "trials": 2, "command_wall_s": 40.0, "first_step_s": 9.0,
            "kernel_warmup_s": 0.0, "trial_startup_s_mean": 5.0, "trial_startup_s_max": 6.0,
            "sweep_mfu": None, "tokens_by_variant": {"off": 6e6, "full": 6e6}} | figures


def test_the_table_sets_each_sweep_against_the_first_trial_alone_and_against_its_own_trials_alone():
    from bench.sweep_ceiling import table

    sweep = two_variant_sweep(sweep_tokens_per_s=320_000.0)
    alone = ALONE_OFF_AND_FULL
    text = table({"warm": sweep, "alone": alone})
    assert "off-s0 (FINISHED) 600,000, 500,000; full-s0 (FINISHED) 300,000, 250,000" in text
    assert "The warm sweep's tokens/s against off-s0 alone: 53%." in text
    assert "Against its own trials run alone one at a time (400,000 tokens/s): 80%." in text
    old = {"trial": "off-s0", "status": "FINISHED", "tokens_per_s_last_window": 640_000.0,
           "tokens_per_s_run_average": 500_000.0}  # results.json before 2026-12-02: one trial, no variant
    text = table({"warm": sweep, "alone": old})
    assert "against off-s0 alone: 50%." in text and "one at a time" not in text


def test_the_command_names_the_alone_phases_steps():
    from bench.sweep_ceiling import commands_for

    args = ceiling_args("f.yaml", "--seeds", "0,1")
    assert commands_for(args, {"warm": {}, "alone": {"steps": 60, "trials": []}}).startswith(
        "python bench/sweep_ceiling.py f.yaml --profile gpu --work WORK --seeds 0,1 --phase warm --phase alone "
        "--alone-steps 60`")


def test_the_rate_after_the_first_step_leaves_out_the_start_no_trial_trains_through():
    from bench.sweep_ceiling import after_first_step

    # 12M tokens in a 40 s sweep whose first step ended 10 s in: 400k/s after it, 300k/s over the sweep
    assert after_first_step(12e6, 40.0, 10.0) == 400_000.0
    assert after_first_step(12e6, 40.0, None) is None  # no trial reached its first step
    assert after_first_step(12e6, 10.0, 10.0) is None
    assert after_first_step(None, 40.0, 10.0) is None  # a parent run without sweep metrics


def test_the_table_sets_the_rate_after_the_first_step_against_the_ceiling():
    from bench.sweep_ceiling import table

    sweep = two_variant_sweep(sweep_tokens_per_s=300_000.0, first_step_in_sweep_s=10.0,
                              tokens_per_s_after_first_step=360_000.0)
    alone = ALONE_OFF_AND_FULL
    text = table({"fresh": sweep, "alone": alone})
    assert "Against its own trials run alone one at a time (400,000 tokens/s): 75%." in text
    assert "From its first training step (10.0 s into the sweep) to its end: 360,000 tokens/s, 90% of that." in text
    del sweep["tokens_per_s_after_first_step"]  # a results.json from before the figure
    assert "From its first training step" not in table({"fresh": sweep, "alone": alone})


def test_figures_from_a_copied_store_need_the_phase_and_the_file(tmp_path):
    import pytest

    from bench.sweep_ceiling import refresh_figures

    with pytest.raises(SystemExit, match="results.json has no phase 'warm'"):
        refresh_figures({"fresh": {}}, "warm", tmp_path / "mlflow.db")
    with pytest.raises(SystemExit, match="no such file"):
        refresh_figures({"fresh": {}}, "fresh", tmp_path / "mlflow.db")


def test_trials_at_once_runs_the_same_trials_with_that_many_sharing_the_gpu(tmp_path):
    from bench.sweep_ceiling import commands_for, phase_key, sweep_phases, table

    args = ceiling_args(FLAGSHIP, "--seeds", "0,1", "--trials-at-once", "5")
    plain = ceiling_args(FLAGSHIP, "--seeds", "0,1")
    five, four = (load_sweep_for(sweep_file_for(a, tmp_path, "fresh"), "gpu") for a in (args, plain))
    assert [t.id for t in five.trials] == [t.id for t in four.trials] and len(five.trials) == 10
    assert (five.resources.max_concurrent_trials, five.resources.gpu) == (5, 0.2)
    assert (four.resources.max_concurrent_trials, four.resources.gpu) == (4, 0.25)
    assert five.resources.reuse_actors and five.resources.cpu == four.resources.cpu  # nothing else changes
    assert phase_key(args, "fresh") == "fresh-5-at-once"
    results = {"fresh-5-at-once": {}, "fresh": {}}
    assert sweep_phases(results) == ["fresh", "fresh-5-at-once"]
    base = "python bench/sweep_ceiling.py f.yaml --profile gpu --work WORK --seeds 0,1"
    assert commands_for(ceiling_args("f.yaml", "--seeds", "0,1"), results) == (
        f"{base} --phase fresh`, then `{base} --phase fresh --trials-at-once 5`, then the same with `--write")
    row = {"exit": 0, "finished": 10, "trials": 10, "command_wall_s": 300.0, "first_step_s": 45.0,
           "kernel_warmup_s": 1.0, "trial_startup_s_mean": 18.0, "trial_startup_s_max": 40.0,
           "sweep_tokens_per_s": 400_000.0, "sweep_mfu": 0.08}
    assert "| fresh, 5 trials at once | 0 | 10/10 |" in table({"fresh-5-at-once": row})


def test_the_overlap_counts_how_long_each_number_of_trials_trained_at_once_and_at_what_rate():
    from bench.sweep_ceiling import overlap_table, training_overlap

    one = [(0.0, 10.0, 300_000.0)]  # trains alone for 10 s, then evaluates, then trains with the other
    two = [(5.0, 15.0, 200_000.0)]
    one.append((12.0, 15.0, 250_000.0))
    overlap = training_overlap([one, two])
    # 0-5 s one trial; 5-10 s both; 10-12 s only the second; 12-15 s both
    assert overlap == {1: [7.0, (5 * 300_000 + 2 * 200_000) / 7], 2: [8.0, (5 * 500_000 + 3 * 450_000) / 8]}
    assert training_overlap([[(0.0, 2.0, 1.0)], [(4.0, 5.0, 1.0)]])[0] == [2.0, 0.0]  # a gap: none trained
    text = overlap_table({"fresh": {"training_overlap": {str(n): v for n, v in overlap.items()}}, "alone": {}})
    assert text.splitlines()[-3:] == ["| phase | 0 training | 1 training | 2 training |", "|---|---|---|---|",
                                      "| fresh | - | 47%, 271,429 | 53%, 481,250 |"]
    assert overlap_table({"fresh": {"exit": 0}}) == ""  # a results.json from before the figure


def test_each_sweep_row_says_how_often_its_trials_crashed():
    """A crash costs a restart and the steps since the last checkpoint: a row's rate is read
    beside it. A results.json from before the column shows -."""
    from bench.sweep_ceiling import table

    text = table({"fresh": two_variant_sweep(sweep_tokens_per_s=3e5, crashes=2.0),
                  "warm": two_variant_sweep(sweep_tokens_per_s=3e5)})
    rows = [line for line in text.splitlines() if line.startswith(("| fresh ", "| warm "))]
    assert "| crashes |" in text
    assert [row.split(" | ")[3] for row in rows] == ["2", "-"]


def test_time_slicing_and_fresh_processes_are_rows_of_their_own_with_their_commands(tmp_path):
    from bench.sweep_ceiling import commands_for, phase_key, sweep_phases

    args = ceiling_args(FLAGSHIP, "--seeds", "0,1", "--no-reuse-actors", "--no-mps")
    assert phase_key(args, "fresh") == "fresh-noreuse-nomps"
    fresh = load_sweep_for(sweep_file_for(args, tmp_path, "fresh"), "gpu")
    assert fresh.resources.reuse_actors is False and fresh.resources.mps is False and len(fresh.trials) == 10
    results = {"fresh": {}, "fresh-nomps": {}, "fresh-noreuse": {}, "slots-2-nomps": {}}
    assert sweep_phases(results) == ["fresh", "fresh-nomps", "fresh-noreuse", "slots-2-nomps"]
    base = f"python bench/sweep_ceiling.py {FLAGSHIP} --profile gpu --work WORK --seeds 0,1"
    assert commands_for(args, results) == (
        f"{base} --phase fresh`, then `{base} --phase fresh --no-mps`, then `{base} --phase fresh --no-reuse-actors`, "
        f"then `{base} --phase slots --training-slots 2 --no-mps`, then the same with `--write")


def test_the_flagships_gpu_profile_reuses_processes_unless_told_not_to(tmp_path):
    args = ceiling_args(FLAGSHIP, "--seeds", "0,1")
    assert load_sweep_for(sweep_file_for(args, tmp_path, "fresh"), "gpu").resources.reuse_actors is True


def test_the_compiled_graphs_table_sums_the_trials_cache_hits_and_misses_first_attempt_and_whole_trial():
    """A fresh sweep whose trials compile graphs did not find them in the shipped tunings: the
    first steps' misses come from each trial's first attempt, the whole trials' from its largest count."""
    from types import SimpleNamespace as NS

    from bench.sweep_ceiling import compiled_graphs, compiled_table

    def history(*points):  # (timestamp ms, value)
        return [NS(timestamp=t, value=v) for t, v in points]

    logged = {  # trial a crashed once: its second attempt logged again, later, with more misses
        ("a", "startup_fxgraph_cache_misses"): history((2000, 7.0), (1000, 3.0)),
        ("a", "startup_fxgraph_cache_hits"): history((1000, 10.0), (2000, 0.0)),
        ("a", "compile_fxgraph_cache_misses"): history((1500, 4.0), (3000, 9.0)),
        ("b", "startup_fxgraph_cache_misses"): history((1000, 1.0)),
        ("b", "compile_fxgraph_cache_misses"): history((1500, 2.0)),
    }
    client = NS(get_metric_history=lambda run_id, key: logged.get((run_id, key), []))
    sums = compiled_graphs(client, [NS(info=NS(run_id="a")), NS(info=NS(run_id="b")), NS(info=NS(run_id="c"))])
    assert sums["first_step_fxgraph_cache_misses"] == 4.0  # a's first attempt (3) and b's (1)
    assert sums["first_step_fxgraph_cache_hits"] == 10.0
    assert sums["trial_fxgraph_cache_misses"] == 11.0  # a's largest (9) and b's (2)
    assert sums["trial_aot_cache_misses"] == 0.0
    text = compiled_table({"fresh": {"compiled_graphs": sums}, "warm": {"exit": 0}})
    assert text.splitlines()[-1] == "| fresh | 10 / 4 | 0 / 11 | 0 / 0 | 0 / 0 |"
    assert compiled_table({"warm": {"exit": 0}}) == ""  # a results.json from before the figure
