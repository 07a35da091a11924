"""The plan a sweep file describes, as `k3lab variants`, `k3lab sweep --dry-run` and `k3lab sweep` print it:
the same profile and the same header everywhere, and defaults that never make a file invalid."""

import pytest
import torch
from conftest import mini_sweep

from k3lab.cli import main

pytestmark = pytest.mark.usefixtures("isolated_data")

# the file's top-level settings differ from both profiles, so a preview of the wrong one shows
SWEEP = mini_sweep("mini", "x").replace("seeds: [0]", "seeds: [0, 1, 2]") + """\
profiles:
  cpu: {seeds: [0], train: {steps: 4, eval_interval: 2}}
  gpu: {seeds: [0, 1], train: {steps: 6, eval_interval: 2}}
"""
AUTO = "gpu" if torch.cuda.is_available() else "cpu"


@pytest.fixture
def sweep_file(tmp_path):
    path = tmp_path / "mini.yaml"
    path.write_text(SWEEP)
    return path


def first_line(capsys) -> str:
    return capsys.readouterr().out.splitlines()[0]


def test_variants_and_dry_run_preview_the_profile_a_sweep_runs_with_the_same_header(tmp_path, sweep_file, capsys):
    assert main(["variants", str(sweep_file)]) == 0
    variants = first_line(capsys)
    assert main(["sweep", str(sweep_file), "--dry-run", "--storage", str(tmp_path / "runs")]) == 0
    dry_run = first_line(capsys)
    expected = {"cpu": "2 variants x 1 seeds = 2 trials, 4 steps", "gpu": "2 variants x 2 seeds = 4 trials, 6 steps"}
    assert variants == dry_run == f"mini ({AUTO} profile): {expected[AUTO]} of 64 tokens"


def test_profile_none_previews_the_top_level_settings_with_their_seed_count(sweep_file, capsys):
    assert main(["variants", str(sweep_file), "--profile", "none"]) == 0
    assert first_line(capsys) == "mini (top-level settings): 2 variants x 3 seeds = 6 trials, 8 steps of 64 tokens"


def test_sweep_prints_the_same_header_before_it_starts(tmp_path, sweep_file, monkeypatch, capsys):
    def stop(run, live, say):  # the header is printed; what the sweep then does is tested elsewhere
        raise KeyboardInterrupt

    monkeypatch.setattr("k3lab.runner.tune.driver.run_sweep", stop)
    assert main(["variants", str(sweep_file)]) == 0
    header = first_line(capsys)
    assert main(["sweep", str(sweep_file), "--storage", str(tmp_path / "runs")]) == 130
    assert first_line(capsys) == header


def short_sweep(tmp_path, train: str):
    path = tmp_path / "short.yaml"
    path.write_text(mini_sweep("short", "x").replace(
        "train: {steps: 8, batch_size: 2, seq_len: 32, warmup_steps: 1, eval_interval: 4, eval_batches: 1, "
        "log_interval: 2}", f"train: {train}"))
    return path


def test_default_warmup_longer_than_a_short_run_is_clipped_with_a_note(tmp_path, capsys):
    path = short_sweep(tmp_path, "{steps: 10, seq_len: 32}")
    assert main(["variants", str(path)]) == 0
    out = capsys.readouterr().out
    assert "note: train.warmup_steps: the default 20 is clipped to steps=10" in out
    assert "2 variants x 1 seeds = 2 trials, 10 steps" in out


def test_a_warmup_the_user_wrote_is_still_checked(tmp_path, capsys):
    path = short_sweep(tmp_path, "{steps: 10, seq_len: 32, warmup_steps: 20}")
    assert main(["variants", str(path)]) == 2
    err = capsys.readouterr().err
    assert "train.warmup_steps: must not exceed steps=10, got 20" in err and err.count("\n") == 1


def test_a_warmup_within_the_steps_needs_no_note(tmp_path, capsys):
    path = short_sweep(tmp_path, "{steps: 10, seq_len: 32, warmup_steps: 10}")
    assert main(["variants", str(path)]) == 0
    assert "note:" not in capsys.readouterr().out


def test_every_variant_the_plan_drops_is_named_with_the_reason_before_a_sweep_runs(tmp_path, monkeypatch, capsys):
    """A duplicate and a rejected variant: `k3lab variants`, `sweep --dry-run` and `sweep` itself name
    each in the plan, with the reason the variants table gives, before anything runs."""
    path = tmp_path / "dropped.yaml"
    path.write_text(mini_sweep("dropped", "x").replace("attn_res_block_size: [off, 1]", "attn_res_block_size: [1, 1]")
                    + "variants: [{name: wide_topk, num_experts_per_token: 100000}]\n")
    expected = ["dropped (top-level settings): 1 variants x 1 seeds = 1 trials, 8 steps of 64 tokens",
                "not run: attnres_bs1_2 (duplicate of attnres_bs1)",
                "not run: wide_topk (rejected: num_experts_per_token must be in [1, num_experts=8))"]
    assert main(["variants", str(path)]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[:3] == expected
    assert "duplicate of attnres_bs1" in out.split(expected[-1])[1]  # and the table still lists it
    assert main(["sweep", str(path), "--dry-run", "--storage", str(tmp_path / "runs")]) == 0
    assert capsys.readouterr().out.splitlines()[:3] == expected

    def stop(run, live, say):
        raise KeyboardInterrupt

    monkeypatch.setattr("k3lab.runner.tune.driver.run_sweep", stop)
    assert main(["sweep", str(path), "--storage", str(tmp_path / "runs")]) == 130
    assert capsys.readouterr().out.splitlines()[:3] == expected


def test_a_long_list_of_dropped_variants_is_cut_with_where_to_see_them_all(tmp_path, capsys):
    path = tmp_path / "many.yaml"
    path.write_text(mini_sweep("many", "x") + "variants: [" + ", ".join(
        f"{{name: k{k}, num_experts_per_token: {k}}}" for k in range(100, 112)) + "]\n")
    assert main(["variants", str(path)]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("not run:")]
    assert len(lines) == 11 and lines[0].startswith("not run: k100 (rejected: num_experts_per_token must be")
    assert lines[-1] == f"not run: 2 more (k3lab variants {path} lists every variant)"


def test_the_plan_says_when_the_last_evaluation_is_larger_than_the_others(tmp_path, capsys):
    path = short_sweep(tmp_path, "{steps: 12, seq_len: 32, warmup_steps: 1, eval_interval: 4, eval_batches: 2, "
                                 "final_eval_batches: 8}")
    assert main(["variants", str(path)]) == 0
    assert ("evaluations: 3 per trial (every 4 steps) on 2 validation batches, the last on 8 (the val_loss the "
            "verdicts compare)") in capsys.readouterr().out
    same = short_sweep(tmp_path, "{steps: 12, seq_len: 32, warmup_steps: 1, eval_interval: 4, eval_batches: 2}")
    assert main(["variants", str(same)]) == 0
    assert "evaluations:" not in capsys.readouterr().out


def test_the_plan_says_how_often_trials_checkpoint_and_what_a_crash_repeats(tmp_path, capsys):
    path = short_sweep(tmp_path, "{steps: 12, seq_len: 32, warmup_steps: 1, eval_interval: 2, checkpoint_every: 3}")
    assert main(["variants", str(path)]) == 0
    assert ("checkpoints: every 6 steps (every 3rd evaluation) and after the last; a crashed trial trains up to 6 "
            "steps again") in capsys.readouterr().out
    every = short_sweep(tmp_path, "{steps: 12, seq_len: 32, warmup_steps: 1, eval_interval: 2}")
    assert main(["variants", str(every)]) == 0
    assert "checkpoints:" not in capsys.readouterr().out


def test_checkpoint_every_must_be_positive(tmp_path, capsys):
    path = short_sweep(tmp_path, "{steps: 12, seq_len: 32, warmup_steps: 1, checkpoint_every: 0}")
    assert main(["variants", str(path)]) != 0
    err = capsys.readouterr().err
    assert "checkpoint_every" in err and "must be positive" in err and "Traceback" not in err
