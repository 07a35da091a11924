"""The fidelity switches (official Kimi K3 / Kimi Linear choices) and the fidelity sets:
their parameters and counts, their inits, and their use as sweep axes and base settings."""

import math

import pytest
import torch

from k3lab.errors import UserError
from k3lab.model.config import KimiK3Config, tiny_config
from k3lab.model.counting import count_parameters
from k3lab.model.fidelity import FIDELITIES, fidelity_fields
from k3lab.model.model import KimiK3
from k3lab.optim.assignment import split_parameters
from k3lab.registry import load_sweep


def counts(**overrides):
    return count_parameters(KimiK3(tiny_config(**overrides)))


# -- the sets ------------------------------------------------------------------------------


def test_design_fidelity_is_exactly_the_defaults():
    assert KimiK3Config(**fidelity_fields("design", 64)) == KimiK3Config()


def test_k3_fidelity_sets_the_official_choices():
    k3 = tiny_config(**fidelity_fields("k3", 32))
    assert (k3.kda_gate_low_rank, k3.kda_gate_bias, k3.kda_gate_lower_bound) == (None, False, -5.0)
    assert (k3.mla_shared_key_dim, k3.mla_output_gate, k3.mla_latent_norm_eps) == (16, True, 1e-6)
    assert (k3.tie_word_embeddings, k3.rms_norm_eps, k3.kda_qk_l2norm) == (False, 1e-5, "fla")
    assert (k3.attn_res_proj_init, k3.router_init, k3.ffn_activation, k3.use_attn_res) == \
        ("normal", "kaiming_uniform", "situ_glu", True)


def test_every_fidelity_builds_and_runs():
    for name in FIDELITIES:
        model = KimiK3(tiny_config(**fidelity_fields(name, 16)))
        logits, loss = model(torch.randint(0, 320, (1, 16)), torch.randint(0, 320, (1, 16)))
        assert torch.isfinite(loss), name


def test_unknown_fidelity_is_refused():
    with pytest.raises(ValueError, match="fidelity must be one of"):
        fidelity_fields("k2", 64)


# -- parameters and counts -------------------------------------------------------------------


def test_full_rank_gate_without_bias_counts_one_matrix_per_kda_layer():
    M, Hd, r, kda_layers = 64, 32, 16, 3  # tiny_config: hidden 64, 2 KDA heads of 16, layers KKMK
    low = counts()["by_component"]["kda"]
    full = counts(kda_gate_rank="full", kda_gate_bias=False)["by_component"]["kda"]
    assert low - full == kda_layers * (M * r + r * Hd + Hd - M * Hd)
    assert counts(kda_gate_bias=False)["by_component"]["kda"] == low - kda_layers * Hd


def test_shared_key_part_widens_kv_a_and_q_and_the_attention_flops():
    s, M, H, q_rank, T = 8, 64, 2, 32, 64  # one MLA layer in tiny_config
    before, after = counts(), counts(mla_shared_key_dim=s)
    assert after["by_component"]["mla"] - before["by_component"]["mla"] == s * M + q_rank * H * s
    extra_matmul = after["active_matmul"] - before["active_matmul"]
    assert after["flops_per_token"] - before["flops_per_token"] == 6 * extra_matmul + 6 * H * s * T


def test_mla_without_output_gate_drops_the_gate_matrix():
    M, H, dv, mla_layers = 64, 2, 16, 1
    assert counts()["by_component"]["mla"] - counts(mla_output_gate=False)["by_component"]["mla"] \
        == mla_layers * M * H * dv


def test_untied_head_is_a_second_embedding_sized_matrix_but_no_extra_flops():
    tied, untied = counts(), counts(tie_word_embeddings=False)
    assert untied["total"] - tied["total"] == 320 * 64
    assert untied["embedding"] == 2 * 320 * 64
    assert untied["flops_per_token"] == tied["flops_per_token"]  # the lookup is free, the head counts once


def test_untied_head_is_its_own_parameter_and_trained_by_adamw():
    model = KimiK3(tiny_config(tie_word_embeddings=False))
    assert model.lm_head.weight is not model.embed_tokens.weight
    muon, adamw = split_parameters(model)
    assert {"embed_tokens.weight", "lm_head.weight"} <= {n for n, _ in adamw}


# -- inits ---------------------------------------------------------------------------------------


def test_attn_res_scorers_start_normal_with_the_normal_init():
    model = KimiK3(tiny_config(num_layers=8, layer_types=None, attn_res_proj_init="normal"))
    scorers = torch.cat([p.flatten() for n, p in model.named_parameters() if n.endswith("res_proj.weight")])
    assert scorers.std().item() == pytest.approx(0.02, rel=0.15)


def test_router_starts_kaiming_uniform_with_that_init():
    model = KimiK3(tiny_config(num_layers=8, layer_types=None, router_init="kaiming_uniform"))
    weights = torch.cat([moe.router.weight.flatten() for _, moe in model.moe_layers()])
    bound = 1 / math.sqrt(64)  # kaiming_uniform(a=sqrt(5)) on fan_in 64, nn.Linear's default
    assert weights.abs().max() <= bound and weights.std().item() == pytest.approx(bound / math.sqrt(3), rel=0.1)


# -- sweep axes and bases -----------------------------------------------------------------------


def write(tmp_path, text):
    path = tmp_path / "sweep.yaml"
    path.write_text(text)
    return path


def test_switches_are_sweep_axes_with_readable_names(tmp_path):
    sweep = load_sweep(write(tmp_path, "name: t\nbase: tiny\naxes:\n  kda_gate_rank: [head_dim, full, 8]\n"
                                       "  tie_word_embeddings: [true, false]\n"))
    assert [v.name for v in sweep.variants][:3] == ["kdagate_head_dim_tied_on", "kdagate_head_dim_tied_off",
                                                   "kdagate_full_tied_on"]
    assert {v.config.kda_gate_rank for v in sweep.variants} == {"head_dim", "full", 8}


def test_fidelity_axis_scales_the_shared_key_part_with_the_head_dim(tmp_path):
    sweep = load_sweep(write(tmp_path, "name: t\nbase: {preset: tiny, mla_qk_head_dim: 48}\n"
                                       "axes: {fidelity: [design, k3, kimi_linear]}\n"))
    assert [v.config.mla_shared_key_dim for v in sweep.variants] == [0, 24, 24]
    assert [v.config.use_attn_res for v in sweep.variants] == [True, True, False]


def test_base_fidelity_comes_before_the_base_overrides(tmp_path):
    sweep = load_sweep(write(tmp_path, "name: t\nbase: {preset: tiny, fidelity: k3, rms_norm_eps: 1.0e-6}\n"
                                       "axes: {num_layers: [4]}\n"))
    assert sweep.base.rms_norm_eps == 1e-6 and sweep.base.kda_gate_rank == "full"


@pytest.mark.parametrize("text, message", [
    ("base: {preset: tiny, fidelity: k2}\naxes: {num_layers: [4]}", "base.fidelity: must be one of"),
    ("base: tiny\naxes: {fidelity: [k3], tie_word_embeddings: [true]}", "sets tie_word_embeddings, which fidelity"),
    ("base: tiny\naxes: {kda_gate_rank: [2.5]}", "kda_gate_rank[0]: expected an integer or a string, got number"),
])
def test_bad_fidelity_settings_are_one_line_errors(tmp_path, text, message):
    with pytest.raises(UserError, match=".*" + message.replace("[", r"\[").replace("]", r"\]")):
        load_sweep(write(tmp_path, "name: t\n" + text + "\n"))


def test_a_switch_of_a_layer_kind_the_model_lacks_makes_a_duplicate(tmp_path):
    sweep = load_sweep(write(tmp_path, "name: t\nbase: {preset: tiny, layer_types: [mla, mla, mla, mla]}\n"
                                       "axes: {kda_gate_rank: [head_dim, full]}\n"))
    assert [v.status for v in sweep.variants] == ["ok", "duplicate"]
