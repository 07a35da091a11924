"""Sweep files, presets, derived axes, variant expansion, matching and `k3lab variants`."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import attrs
import pytest

from k3lab.cli import main
from k3lab.errors import UserError
from k3lab.model.config import KimiK3Config, kimi_linear_schedule
from k3lab.registry import (
    MatchSpec, ResourceSpec, SchedulerSpec, TrainSpec, config_id, count, list_presets, load_preset, load_sweep,
)
from k3lab.registry.matching import MatchError, match_config

ROOT = Path(__file__).resolve().parents[1]
EXPERIMENTS = sorted((ROOT / "experiments").glob("*.yaml"))

MINIMAL = """
name: t
base: tiny
axes:
  attn_res_block_size: [off, 2]
"""


def write(tmp_path: Path, text: str, name: str = "sweep.yaml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(["variants", *argv])
    out, err = capsys.readouterr()
    return code, out, err


# -- structuring --------------------------------------------------------------------


def test_minimal_sweep_gets_defaults(tmp_path):
    sweep = load_sweep(write(tmp_path, MINIMAL))
    assert sweep.name == "t" and sweep.profile is None and sweep.seeds == (0,)
    assert sweep.train == TrainSpec() and sweep.resources == ResourceSpec() and sweep.match is None
    assert sweep.scheduler.kind == "none" and sweep.metric.name == "val_loss" and sweep.metric.mode == "min"
    assert [v.name for v in sweep.variants] == ["attnres_off", "attnres_bs2"]
    assert sweep.base == load_preset("tiny")


def test_full_sweep_structures_every_section(tmp_path):
    path = write(tmp_path, """
        name: full
        description: every section
        base: {preset: tiny, num_layers: 8}
        axes: {num_experts_per_token: [1, 2]}
        variants: [{name: dense, ffn: dense}]
        seeds: [3, 4]
        train: {steps: 50, batch_size: 4, seq_len: 64, lr: 1.0e-3, muon_lr: 0.01, schedule: constant,
                warmup_steps: 5, grad_clip: null, compile: true, dtype: bfloat16, autocast: bfloat16}
        metric: {name: val_bpb, mode: min}
        resources: {cpu: 0.5, gpu: 0.25, max_concurrent_trials: 3}
        scheduler: {kind: asha, time_attr: tokens, grace_period: 2}
        """)
    sweep = load_sweep(path)
    assert sweep.base.num_layers == 8 and sweep.seeds == (3, 4)
    assert sweep.train.grad_clip is None and sweep.train.compile and sweep.train.schedule == "constant"
    assert sweep.resources.tune_resources() == {"cpu": 0.5, "gpu": 0.25}
    assert sweep.scheduler.max_t == 50 * 4 * 64  # resolved from train: total tokens
    assert [v.name for v in sweep.variants] == ["top1", "top2", "dense"]
    assert [t.name for t in sweep.trials][:2] == ["top1_s3", "top1_s4"] and len(sweep.trials) == 6


def test_profile_merges_sections(tmp_path):
    path = write(tmp_path, """
        name: p
        base: {preset: tiny, num_layers: 8}
        axes: {attn_res_block_size: [off, 2], num_experts_per_token: [1, 2]}
        train: {steps: 300, batch_size: 8}
        scheduler: asha
        profiles:
          quick:
            base: {num_layers: 4}
            axes: {num_experts_per_token: null}
            train: {steps: 60}
            scheduler: {grace_period: 2}
            seeds: [0, 1]
          big:
            base: small
        """)
    quick = load_sweep(path, "quick")
    assert quick.train.steps == 60 and quick.train.batch_size == 8
    assert quick.base.num_layers == 4 and quick.base.hidden_size == load_preset("tiny").hidden_size
    assert [a.name for a in quick.axes] == ["attn_res_block_size"] and quick.seeds == (0, 1)
    assert quick.scheduler.kind == "asha" and quick.scheduler.grace_period == 2
    assert load_sweep(path, "big").base == load_preset("small")
    assert load_sweep(path).profiles == ("quick", "big")


def test_spec_classes_validate_on_construction():
    assert TrainSpec().tokens_per_step == 8 * 128
    for bad in (dict(steps=0), dict(lr=-1.0), dict(schedule="linear"), dict(warmup_steps=500, steps=100),
                dict(min_lr_ratio=2.0), dict(dtype="float64")):
        with pytest.raises(ValueError):
            TrainSpec(**bad)
    with pytest.raises(ValueError):
        ResourceSpec(gpu=1.5)
    with pytest.raises(ValueError):
        ResourceSpec(strategy="ddp")
    assert ResourceSpec(gpus_per_trial=2, strategy="ddp").tune_resources() == {"cpu": 1.0, "gpu": 2}
    with pytest.raises(ValueError, match="reuse_actors"):  # a DDP trial's Train job cannot pass to the next trial
        ResourceSpec(gpus_per_trial=2, strategy="ddp", reuse_actors=True)
    with pytest.raises(ValueError):
        SchedulerSpec(kind="asha", max_t=2, grace_period=3)
    assert SchedulerSpec(kind="asha").resolved(TrainSpec(steps=110, eval_interval=25)).max_t == 5
    with pytest.raises(ValueError):
        MatchSpec(adjust="hidden_size")


# -- errors -------------------------------------------------------------------------

ERRORS = {
    "yaml_syntax": ("name: t\naxes: [1, 2\n", ["invalid YAML", "line"]),
    "not_a_mapping": ("- 1\n- 2\n", ["expected a mapping"]),
    "unknown_top_key": (MINIMAL + "colour: blue\n", ["colour: unknown key"]),
    "unknown_nested_key": (MINIMAL + "train: {stepz: 3}\n", ["train.stepz: unknown key", "did you mean 'steps'"]),
    "missing_name": ("base: tiny\naxes: {num_layers: [4]}\n", ["name: required key missing"]),
    "wrong_type": (MINIMAL + "train: {steps: ten}\n", ["train.steps: expected an integer, got string 'ten'"]),
    "float_for_int": (MINIMAL + "train: {batch_size: 2.5}\n", ["train.batch_size: expected an integer"]),
    "bad_value": (MINIMAL + "train: {steps: -4}\n", ["train.steps: must be positive"]),
    "bad_seed": (MINIMAL + "seeds: [1, x]\n", ["seeds[1]: expected an integer"]),
    "unknown_axis": ("name: t\nbase: tiny\naxes: {hidden_sise: [64]}\n",
                     ["axes.hidden_sise: unknown axis", "did you mean 'hidden_size'"]),
    "empty_axis": ("name: t\nbase: tiny\naxes: {hidden_size: []}\n", ["axes.hidden_size: must list at least one value"]),
    "axis_not_list": ("name: t\nbase: tiny\naxes: {hidden_size: 64}\n", ["axes.hidden_size: expected a non-empty list"]),
    "axis_value_type": ("name: t\nbase: tiny\naxes:\n  attn_res_block_size: [off, 2, two]\n",
                        ["axes.attn_res_block_size[2]: expected a block size"]),
    "field_value_type": ("name: t\nbase: tiny\naxes: {hidden_size: [64, big]}\n",
                         ["axes.hidden_size[1]: expected an integer"]),
    "unquoted_ratio": ("name: t\nbase: tiny\naxes:\n  layer_schedule: [3:1]\n",
                       ["axes.layer_schedule[0]", "quote ratios"]),
    "bad_ratio": ("name: t\nbase: tiny\naxes:\n  layer_schedule: ['3:2']\n", ["axes.layer_schedule[0]", "n:1"]),
    "no_axes": ("name: t\nbase: tiny\n", ["axes: the sweep needs at least one axis"]),
    "conflicting_axes": ("name: t\nbase: tiny\naxes: {ffn: [moe], moe_latent_size: [16]}\n",
                         ["axes.moe_latent_size: sets moe_latent_size, which ffn also sets"]),
    "unknown_preset": ("name: t\nbase: tinny\naxes: {num_layers: [4]}\n", ["base: unknown preset 'tinny'"]),
    "missing_model_file": ("name: t\nbase: models/m.yaml\naxes: {num_layers: [4]}\n",
                           ["base: models/m.yaml: file not found"]),
    "base_unknown_field": ("name: t\nbase: {preset: tiny, hiden_size: 3}\naxes: {num_layers: [4]}\n",
                           ["base.hiden_size: not a KimiK3Config field"]),
    "invalid_base": ("name: t\nbase: {preset: tiny, num_dense_layers: 9}\naxes: {num_layers: [4]}\n",
                     ["base: invalid base model: num_dense_layers"]),
    "explicit_variant": ("name: t\nbase: tiny\nvariants: [{ffn: sparse}]\n", ["variants[0].ffn: expected one of"]),
    "match_conflict": ("name: t\nbase: tiny\naxes: {intermediate_size: [64]}\nmatch: {adjust: intermediate_size}\n",
                       ["match.adjust: intermediate_size is also set by the axis intermediate_size"]),
    "profile_key": (MINIMAL + "profiles: {cpu: {name: x}}\n", ["profiles.cpu.name: unknown key"]),
    "profile_value": (MINIMAL + "train: {steps: 100}\nprofiles: {cpu: {train: {steps: 0}}}\n",
                      ["profiles.cpu.train.steps: must be positive"]),
    "profile_axis": (MINIMAL + "profiles:\n  gpu:\n    axes: {attn_res_block_size: [4, huge]}\n",
                     ["profiles.gpu.axes.attn_res_block_size[1]: expected a block size"]),
    "all_invalid": ("name: t\nbase: tiny\naxes: {num_experts_per_token: [8, 9]}\n",
                    ["no valid variant: num_experts_per_token must be in [1, num_experts=8) (top8, top9)"]),
    # the rule that rejected every variant, with the swept value it names; not the baseline's name,
    # which no longer matches a variant once the axis is added (validity is checked first)
    "all_invalid_with_a_baseline": ("name: t\nbase: tiny\naxes:\n  attn_res_block_size: [off, 2, 4, 8, full]\n"
                                    "  num_experts_per_token: [100000]\nbaseline: attnres_off\n",
                                    ["no valid variant: num_experts_per_token=100000: num_experts_per_token must be "
                                     "in [1, num_experts=8) (attnres_off_top100000, attnres_bs2_top100000, "
                                     "attnres_bs4_top100000 and 2 more)"]),
    "unknown_baseline": (MINIMAL + "baseline: attnres_bs4\n",
                         ["baseline: no variant named 'attnres_bs4' (variants: attnres_off, attnres_bs2)"]),
    "profile_drops_baseline": (MINIMAL + "baseline: attnres_bs2\nprofiles: {cpu: {axes: {attn_res_block_size: [off, 4]}}}\n",
                               ["baseline: no variant named 'attnres_bs2' under profile cpu"]),
    "baseline_not_run": ("name: t\nbase: {preset: tiny, num_layers: 4}\naxes: {attn_res_block_size: [off, 4, 8]}\n"
                         "baseline: attnres_bs8\n",
                         ["baseline: variant attnres_bs8 is not run (duplicate: duplicate of attnres_bs4)"]),
    "name_too_long": ("name: " + "n" * 101 + "\nbase: tiny\naxes: {num_layers: [4]}\n",
                      ["name: must be at most 100 characters (it names files), got 101"]),
    "metric_last_beyond_the_evaluations": (
        "name: t\nbase: tiny\naxes: {num_layers: [4]}\ntrain: {steps: 40, eval_interval: 20}\nmetric: {last: 3}\n",
        ["metric.last: must be at most the 2 evaluation(s) a trial makes (train.steps 40, train.eval_interval 20), "
         "got 3"]),
    # a section written as a scalar: one line naming it (cattrs said "'str' object has no attribute 'keys'")
    "budget_scalar": (MINIMAL + "seeds: {start: 2}\nbudget: 30m\n", ["budget: expected a mapping, got string '30m'"]),
    "match_scalar": (MINIMAL + "match: 3\n", ["match: expected a mapping, got integer 3"]),
    "until_scalar": (MINIMAL + "seeds: {start: 2, until: 0.01}\n", ["seeds.until: expected decided, max or a mapping {halfwidth: H}, got number 0.01"]),
    "duplicate_key": ("name: t\nbase: tiny\naxes: {num_layers: [4]}\naxes: {num_layers: [2]}\n",
                      ["invalid YAML at line 4, column 1: key 'axes' written twice in one mapping (first at line 3)"]),
    "too_many": ("name: t\nbase: tiny\naxes: {hidden_size: " + str(list(range(8, 8 + 40))) + ", num_layers: "
                 + str(list(range(1, 31))) + "}\n", ["axes: 1,200 variants is more than 1,000"]),
}


@pytest.mark.parametrize("case", sorted(ERRORS))
def test_bad_input_is_one_line_user_error(case, tmp_path, capsys):
    text, expected = ERRORS[case]
    path = write(tmp_path, text)
    with pytest.raises(UserError) as raised:
        load_sweep(path)
    message = str(raised.value)
    assert message.startswith(f"{path}: ") and "\n" not in message
    for fragment in expected:
        assert fragment in message
    code, out, err = cli(capsys, str(path))
    assert code == 2 and out == ""
    assert err == f"error: {message}\n" and "Traceback" not in err


def test_missing_file_and_missing_profile(tmp_path, capsys):
    missing = tmp_path / "nope.yaml"
    code, out, err = cli(capsys, str(missing))
    assert code == 2 and out == "" and err == f"error: {missing}: file not found\n"
    path = write(tmp_path, MINIMAL + "profiles: {cpu: {seeds: [1]}}\n")
    code, out, err = cli(capsys, str(path), "--profile", "gpu", "--json")
    assert code == 2 and out == ""
    assert err.strip() == f"error: {path}: profiles: no profile named 'gpu' (profiles: cpu)"


@pytest.mark.parametrize("name, rule", [("a/b", "letters, digits"), ("../../evil", "letters, digits"),
                                        ("p" * 101, "at most 100 characters"), ("auto", "could never be picked"),
                                        ("none", "could never be picked")])
def test_a_profile_name_that_would_shape_paths_or_cannot_be_picked_is_refused(tmp_path, capsys, name, rule):
    """Profile names join the sweep's in folder and store paths (`a/b` made nested folders)."""
    path = write(tmp_path, MINIMAL + f"profiles: {{'{name}': {{seeds: [1]}}}}\n")
    code, out, err = cli(capsys, str(path))
    assert code == 2 and out == "" and err.startswith(f"error: {path}: profiles.") and rule in err
    assert err.count("\n") == 1


# -- derived axes -------------------------------------------------------------------


def _configs(tmp_path, axes: str, base: str = "{preset: tiny, num_layers: 8}") -> dict:
    sweep = load_sweep(write(tmp_path, f"name: t\nbase: {base}\naxes:\n{textwrap.indent(axes, '  ')}\n"))
    return {v.name: v for v in sweep.variants}


def test_layer_schedule_axis(tmp_path):
    variants = _configs(tmp_path, "layer_schedule: [all_kda, '3:1', '1:1', '0:1', '1:0', KKM, kkkmkkkm, KKKKKKKM]")
    types = {name: v.config.schedule for name, v in variants.items() if v.config is not None}
    assert types["sched_all_kda"] == "K" * 8 and types["sched_3to1"] == "KKKMKKKM"
    assert types["sched_1to1"] == "KMKMKMKM" and types["sched_0to1"] == "M" * 8
    assert variants["sched_1to0"].reason == "duplicate of sched_all_kda"
    assert variants["sched_KKKMKKKM"].reason == "duplicate of sched_3to1"
    assert types["sched_KKKKKKKM"] == "KKKKKKKM"
    assert variants["sched_KKM"].status == "rejected" and "does not fit num_layers=8" in variants["sched_KKM"].reason
    assert load_sweep(write(tmp_path, "name: t\nbase: {preset: tiny, num_layers: 6}\naxes: {layer_schedule: ['3:1']}\n")
                      ).variants[0].config.layer_types == kimi_linear_schedule(6, 3)


def test_attn_res_axis(tmp_path):
    variants = _configs(tmp_path, "attn_res_block_size: [off, full, 1, 2, 8, 16, null, false]")
    off, full = variants["attnres_off"].config, variants["attnres_full"].config
    assert not off.use_attn_res and off.attn_res_block_size == load_preset("tiny").attn_res_block_size
    assert full.use_attn_res and full.attn_res_block_size == 1
    assert variants["attnres_bs1"].reason == "duplicate of attnres_full"
    assert variants["attnres_bs2"].config.attn_res_block_size == 2
    assert variants["attnres_bs16"].reason == "duplicate of attnres_bs8"  # one block either way
    assert [v.reason for n, v in variants.items() if n.startswith("attnres_off_")] == ["duplicate of attnres_off"] * 2


def test_moe_axes(tmp_path):
    variants = _configs(tmp_path, "ffn: [dense, moe, latent_moe]\nnum_experts_per_token: [1, 2]")
    assert variants["ffn_dense_top1"].config.num_dense_layers == 8
    assert variants["ffn_dense_top2"].reason == "duplicate of ffn_dense_top1"  # MoE fields do not matter
    assert variants["ffn_moe_top1"].config.moe_latent_size is None
    assert variants["ffn_latent_moe_top2"].config == load_sweep(
        write(tmp_path, "name: b\nbase: {preset: tiny, num_layers: 8}\nvariants: [{}]\n")).variants[0].config
    dense = _configs(tmp_path, "num_dense_layers: [0, 2, all]\nmoe_latent_size: [null, 16]")
    assert dense["dense0_latent_none"].config.moe_latent_size is None
    assert dense["dense_all_latent_none"].config.num_dense_layers == 8
    assert dense["dense_all_latent16"].reason == "duplicate of dense_all_latent_none"


def test_invalid_combinations_are_rejected_with_the_config_message(tmp_path):
    variants = _configs(tmp_path, "num_experts: [2, 8]\nnum_experts_per_token: [2]")
    assert variants["experts2_top2"].status == "rejected"
    assert variants["experts2_top2"].reason.startswith("num_experts_per_token must be in [1, num_experts=2)")
    assert variants["experts8_top2"].ok
    seq = _configs(tmp_path, "max_seq_len: [64, 256]")  # train.seq_len defaults to 128
    assert seq["seq64"].reason == "train.seq_len=128 exceeds max_seq_len=64"


# -- ids and names ------------------------------------------------------------------


def test_ids_are_stable_and_distinct(tmp_path):
    tiny = load_preset("tiny")
    code = "from k3lab.registry import config_id, load_preset; print(config_id(load_preset('tiny')))"
    other_run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                               env={"PYTHONHASHSEED": "123", "PATH": ""}, cwd=ROOT).stdout.strip()
    assert config_id(tiny) == other_run and len(other_run) == 12
    assert config_id(tiny.replace(hidden_size=96)) != config_id(tiny)
    assert config_id(tiny.replace(layer_types=("kda",) * 4)) != config_id(tiny)
    first = load_sweep(write(tmp_path, MINIMAL)).variants
    assert [v.id for v in first] == [v.id for v in load_sweep(write(tmp_path, MINIMAL)).variants]


def test_generated_names_stay_unique(tmp_path):
    path = write(tmp_path, "name: t\nbase: tiny\nvariants: [{hidden_size: 96}, {hidden_size: 96}]\n")
    names = [v.name for v in load_sweep(path).variants]
    assert names[1] == names[0] + "_2"


def test_two_variants_given_the_same_name_are_refused_naming_both(tmp_path):
    path = write(tmp_path, "name: t\nbase: tiny\nvariants: [{name: a, hidden_size: 96}, {name: a, hidden_size: 128}]\n")
    with pytest.raises(UserError, match=r"variants\[1\]\.name: 'a' is already the name of variants\[0\]"):
        load_sweep(path)


def test_baseline_defaults_to_the_standard_residual_variant(tmp_path):
    sweep = load_sweep(write(tmp_path, "name: t\nbase: tiny\naxes:\n  attn_res_block_size: [2, off, 4]\n"))
    assert sweep.baseline == "attnres_off"  # not the first variant: the standard residual stream


def test_baseline_defaults_to_the_first_variant_without_attnres_axis(tmp_path):
    sweep = load_sweep(write(tmp_path, "name: t\nbase: tiny\naxes: {num_experts_per_token: [2, 1]}\n"))
    assert sweep.baseline == "top2"


def test_baseline_named_in_the_file_or_its_profile(tmp_path):
    path = write(tmp_path, MINIMAL + "baseline: attnres_bs2\nprofiles: {cpu: {baseline: attnres_off}}\n")
    assert load_sweep(path).baseline == "attnres_bs2"
    assert load_sweep(path, "cpu").baseline == "attnres_off"


# -- parameter matching --------------------------------------------------------------


def test_matching_brings_every_variant_within_tolerance(tmp_path):
    path = write(tmp_path, """
        name: m
        base: {preset: tiny, num_layers: 8}
        axes: {num_dense_layers: [0, 1, 2, 4, 8]}
        match: {by: active_params, tolerance: 0.02, adjust: moe_intermediate_size}
        """)
    sweep = load_sweep(path)
    target = count(sweep.base, sweep.train.seq_len).active
    by_name = {v.name: v for v in sweep.variants}
    for name in ("dense0", "dense1", "dense2", "dense4"):
        assert abs(count(by_name[name].config).active - target) <= 0.02 * target
    assert by_name["dense1"].matched == {}  # the base itself needs no change
    assert by_name["dense4"].matched["moe_intermediate_size"] % 8 == 0
    assert by_name["dense4"].config.moe_intermediate_size != sweep.base.moe_intermediate_size
    assert by_name["dense8"].status == "rejected" and "does not change active_params" in by_name["dense8"].reason


def test_match_config_directly():
    base = load_preset("tiny")
    target = count(base).total
    spec = MatchSpec(by="total_params", tolerance=0.03, adjust="moe_intermediate_size")
    matched = match_config(base.replace(num_experts=12), target, spec)
    assert abs(count(matched).total - target) <= 0.03 * target and matched.moe_intermediate_size % 8 == 0
    assert match_config(base, target, spec) is base
    with pytest.raises(MatchError, match="does not change"):
        match_config(base.replace(num_dense_layers=0, num_experts=16), target,
                     MatchSpec(by="total_params", adjust="intermediate_size"))
    with pytest.raises(MatchError, match="even moe_intermediate_size=8 gives"):
        match_config(base.replace(hidden_size=256), target, spec)
    with pytest.raises(MatchError, match="null in this variant"):
        match_config(base.replace(moe_latent_size=None, num_experts=32), target,
                     MatchSpec(by="total_params", adjust="moe_latent_size"))


# -- presets and shipped experiments ----------------------------------------------------


def test_presets():
    assert list_presets() == ["base", "small", "tiny"]
    ranges = {"tiny": (0.3e6, 1e6), "small": (20e6, 50e6), "base": (100e6, 300e6)}
    for name, (lo, hi) in ranges.items():
        config = load_preset(name)
        assert lo <= count(config).total <= hi, name
        assert config.layer_types == kimi_linear_schedule(config.num_layers, 3)
        assert config.vocab_size == 320 and config.use_attn_res
        assert 1 <= config.num_dense_layers < config.num_layers
    with pytest.raises(UserError, match="unknown preset"):
        load_preset("huge")


def test_model_yaml_path_works_like_a_preset(tmp_path):
    (tmp_path / "models").mkdir()
    write(tmp_path, "hidden_size: 192\nnum_layers: 4\nkda_chunk_size: 16\n", "models/m.yaml")
    sweep = load_sweep(write(tmp_path, "name: t\nbase: models/m.yaml\naxes: {num_layers: [4, 8]}\n"))
    assert sweep.base == KimiK3Config(hidden_size=192, num_layers=4, kda_chunk_size=16)
    assert sweep.variants[1].config.layer_types == kimi_linear_schedule(8)  # layer_types follows num_layers
    assert load_preset(str(tmp_path / "models/m.yaml")) == sweep.base


def test_numbers_written_with_an_exponent_and_no_dot_are_numbers(tmp_path):
    """PyYAML reads YAML 1.1, where `1e-3` is a string; researchers write learning rates that way."""
    sweep = load_sweep(write(tmp_path, "name: t\nbase: {preset: tiny, rms_norm_eps: 1e-5}\n"
                                       "axes: {init_std: [2e-2, 1E-2]}\ntrain: {lr: 1e-3, min_lr_ratio: 5e-2}\n"))
    assert (sweep.train.lr, sweep.train.min_lr_ratio, sweep.base.rms_norm_eps) == (1e-3, 5e-2, 1e-5)
    assert [v.config.init_std for v in sweep.variants] == [2e-2, 1e-2]


@pytest.mark.parametrize("path", EXPERIMENTS, ids=[p.stem for p in EXPERIMENTS])
def test_shipped_experiments_expand_under_every_profile(path):
    sweep = load_sweep(path)
    assert set(sweep.profiles) >= {"cpu", "gpu"}
    for profile in (None, *sweep.profiles):
        sweep = load_sweep(path, profile)
        assert sweep.variants and all(v.status == "ok" for v in sweep.variants), profile
        if profile == "cpu":
            assert 60 <= sweep.train.steps <= 200 and sweep.train.batch_size * sweep.train.seq_len <= 8 * 128
            assert count(sweep.base).total < 2e6 and sweep.resources.gpu == 0
        if profile == "gpu":  # one H200 at ~5 steps/s (64 x 1024 tokens), its corpus never repeated
            assert 0 < sweep.resources.gpu <= 1 and sweep.train.dataset == "packages"
            if sweep.adaptive:  # the start seeds fit well inside the wall budget of 30 minutes at most
                start = len(sweep.valid_variants) * sweep.seed_policy.start
                assert sweep.budget.wall_s <= 30 * 60 and start >= 6
                assert sweep.train.steps * start * sweep.resources.gpu <= 0.7 * 5 * sweep.budget.wall_s
            else:
                assert len(sweep.trials) >= 6
                assert sweep.train.steps * len(sweep.trials) * sweep.resources.gpu <= 2000
        if profile in ("gpu", "gpu2"):  # the small preset at its own depth, with the bf16 stream it was sized with
            small = load_preset("small")
            assert (sweep.base.num_layers, sweep.base.hidden_size) == (small.num_layers, small.hidden_size)
            assert sweep.base.residual_in_fp32 is False


def test_attnres_experiment_covers_the_ablation():
    sweep = load_sweep(ROOT / "experiments/attnres_block.yaml", "gpu")
    assert [v.name for v in sweep.variants] == ["attnres_off", "attnres_full", "attnres_bs2", "attnres_bs4",
                                                "attnres_bs8"]
    assert len(sweep.seeds) >= 2


# -- the command -----------------------------------------------------------------------


def test_variants_json(capsys):
    path = ROOT / "experiments/kda_mla_schedule.yaml"
    code, out, err = cli(capsys, str(path), "--profile", "cpu", "--json")
    assert code == 0 and err == ""
    data = json.loads(out)
    sweep = load_sweep(path, "cpu")
    assert [d["id"] for d in data] == [v.id for v in sweep.variants]
    first = data[0]
    assert {"id", "name", "status", "reason", "seeds", "config"} <= set(first)
    assert first["status"] == "ok" and first["reason"] is None and first["seeds"] == list(sweep.seeds)
    assert first["config"] == sweep.variants[0].config.to_dict()
    assert KimiK3Config(**{**first["config"], "layer_types": tuple(first["config"]["layer_types"])}) \
        == sweep.variants[0].config


def test_variants_table_shows_status_and_sizes(tmp_path, capsys):
    path = write(tmp_path, "name: t\nbase: tiny\naxes: {num_experts_per_token: [2, 8]}\n")
    code, out, err = cli(capsys, str(path))
    assert code == 0 and err == ""
    assert "top2" in out and "ok" in out and "rejected" in out and "KKKM" in out
    assert load_sweep(path).variants[0].id in out


def test_rejected_variants_in_json(tmp_path, capsys):
    path = write(tmp_path, "name: t\nbase: tiny\naxes: {num_experts_per_token: [2, 8]}\n")
    code, out, _ = cli(capsys, str(path), "--json")
    rejected = json.loads(out)[1]
    assert code == 0 and rejected["status"] == "rejected" and rejected["config"] is None
    assert rejected["reason"].startswith("num_experts_per_token")


def test_train_spec_is_plain_attrs():
    spec = TrainSpec(steps=10, warmup_steps=0)
    assert attrs.asdict(spec)["steps"] == 10 and attrs.evolve(spec, steps=20).steps == 20
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        spec.steps = 3


def test_a_field_added_later_keeps_the_ids_of_configs_that_leave_it_at_its_old_value():
    """Ids name trials for --resume: adding residual_in_fp32 (default true) kept the ids that
    sweeps started before it had; setting the field gives a new id."""
    small = load_preset("small")
    assert config_id(small) == "a2a3ef1e1fd9"  # the small preset's id before the field existed
    assert config_id(small.replace(residual_in_fp32=False)) != config_id(small)


def test_a_profile_base_merges_over_the_files_unless_it_names_another_preset(tmp_path):
    """The file's `num_layers: 8` was written for its tiny preset: a profile that switches to
    the small preset gets small's own depth, while a profile that keeps the preset merges."""
    path = write(tmp_path, "name: t\nbase: {preset: tiny, num_layers: 8}\naxes:\n  attn_res_block_size: [off, 4]\n"
                           "profiles:\n  gpu: {base: {preset: small, residual_in_fp32: false}}\n"
                           "  shallow: {base: {num_layers: 4}}\n")
    small = load_sweep(path, "gpu").base
    assert small == load_preset("small").replace(residual_in_fp32=False)
    shallow = load_sweep(path, "shallow").base
    assert shallow == load_preset("tiny").replace(num_layers=4, layer_types=None)


@pytest.mark.parametrize("preset", ["tiny", "small"])
def test_counts_of_a_config_equal_the_counts_of_its_built_model(preset):
    """`count` builds the model on meta with its initialisers skipped (`MetaShapesOnly`):
    every figure, per component too, must be what the real model gives."""
    from k3lab.model.counting import count_parameters
    from k3lab.model.model import KimiK3

    config = load_preset(preset)
    counts, built = count(config, 256), count_parameters(KimiK3(config), 256)
    assert (counts.total, counts.embedding, counts.non_embedding, counts.active, counts.flops_per_token) == \
        (built["total"], built["embedding"], built["non_embedding"], built["active"], built["flops_per_token"])
    assert counts.by_component == dict(built["by_component"])


def test_counting_a_config_does_not_import_torch_dynamo():
    """Initialisers on meta tensors run through PyTorch's Python references, whose first call
    imports torch._dynamo (1.6 s here, ~5 s on a GPU host): `k3lab variants`, a dry run and a
    sweep's driver count every variant and never compile."""
    code = ("import sys; from k3lab.registry import count, load_preset; "
            "count(load_preset('small'), 1024); print('torch._dynamo' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_a_merged_mapping_may_still_be_overridden_by_its_own_keys(tmp_path):
    text = MINIMAL + "train: &t {steps: 40, lr: 0.01}\nprofiles: {cpu: {train: {<<: *t, steps: 20}}}\n"
    sweep = load_sweep(write(tmp_path, text), "cpu")
    assert (sweep.train.steps, sweep.train.lr) == (20, 0.01)
