import pytest

from k3lab.model.config import KimiK3Config, kimi_linear_schedule, tiny_config


def test_default_config_is_valid_and_uses_kimi_linear_schedule():
    config = KimiK3Config()
    assert config.layer_types == kimi_linear_schedule(config.num_layers)
    assert config.schedule == "KKKMKKKM"


def test_layer_types_are_normalised_to_a_tuple():
    config = tiny_config(layer_types=["kda", "mla", "kda", "mla"])
    assert config.layer_types == ("kda", "mla", "kda", "mla")


def test_tiny_config_exercises_every_component():
    config = tiny_config()
    assert {"kda", "mla"} <= set(config.layer_types)
    assert 0 < config.num_dense_layers < config.num_layers
    assert config.use_attn_res


@pytest.mark.parametrize(
    "overrides, field",
    [
        (dict(layer_types=("kda", "mla")), "layer_types"),
        (dict(layer_types=("kda", "gqa", "mla", "kda")), "layer_types[1]"),
        (dict(num_dense_layers=5), "num_dense_layers"),
        (dict(num_dense_layers=-1), "num_dense_layers"),
        (dict(attn_res_block_size=0), "attn_res_block_size"),
        (dict(hidden_size=0), "hidden_size"),
        (dict(kda_head_dim=-4), "kda_head_dim"),
        (dict(mla_kv_lora_rank=64), "mla_kv_lora_rank"),
        (dict(mla_q_lora_rank=100), "mla_q_lora_rank"),
        (dict(moe_latent_size=64), "moe_latent_size"),
        (dict(num_experts_per_token=4), "num_experts_per_token"),
        (dict(num_experts_per_token=0), "num_experts_per_token"),
        (dict(situ_beta=0.0), "situ_beta"),
        (dict(situ_linear_beta=-1.0), "situ_linear_beta"),
        (dict(kda_implementation="triton"), "kda_implementation"),
        (dict(kda_gate_lower_bound=0.5), "kda_gate_lower_bound"),
        (dict(moe_balance="aux_loss"), "moe_balance"),
        (dict(kda_gate_rank=0), "kda_gate_rank"),
        (dict(kda_gate_rank="low"), "kda_gate_rank"),
        (dict(kda_gate_rank=True), "kda_gate_rank"),
        (dict(kda_gate_bias=1), "kda_gate_bias"),
        (dict(kda_qk_l2norm="l1"), "kda_qk_l2norm"),
        (dict(mla_shared_key_dim=-1), "mla_shared_key_dim"),
        (dict(mla_output_gate="yes"), "mla_output_gate"),
        (dict(mla_latent_norm_eps=0.0), "mla_latent_norm_eps"),
        (dict(ffn_activation="gelu"), "ffn_activation"),
        (dict(router_init="xavier"), "router_init"),
        (dict(attn_res_proj_init="ones"), "attn_res_proj_init"),
        (dict(tie_word_embeddings=None), "tie_word_embeddings"),
    ],
)
def test_invalid_config_is_rejected_naming_the_field(overrides, field):
    with pytest.raises(ValueError) as error:
        tiny_config(**overrides)
    assert str(error.value).startswith(field + " ")


def test_top_k_must_be_below_number_of_experts():
    with pytest.raises(ValueError, match=r"num_experts_per_token must be in \[1, num_experts=4\)"):
        tiny_config(num_experts=4, num_experts_per_token=4)
    assert tiny_config(num_experts=4, num_experts_per_token=3).num_experts_per_token == 3


def test_fused_kda_requires_chunk_32_or_64_and_bounded_gate():
    with pytest.raises(ValueError, match="kda_chunk_size must be 32 or 64"):
        tiny_config(kda_implementation="fused", kda_chunk_size=16)
    with pytest.raises(ValueError, match=r"kda_gate_lower_bound must lie in \[-5, 0\)"):
        tiny_config(kda_implementation="fused", kda_chunk_size=64, kda_gate_lower_bound=-6.0)
    with pytest.raises(ValueError, match="kda_gate_lower_bound"):
        tiny_config(kda_implementation="fused", kda_chunk_size=64, kda_gate_lower_bound=None)
    assert tiny_config(kda_implementation="fused", kda_chunk_size=32).kda_chunk_size == 32


def test_chunkwise_kda_accepts_any_chunk_size_and_an_unbounded_gate():
    config = tiny_config(kda_chunk_size=16, kda_gate_lower_bound=None)
    assert config.kda_gate_lower_bound is None


def test_replace_validates_again():
    with pytest.raises(ValueError, match="num_layers"):
        tiny_config().replace(num_layers=3)


def test_kimi_linear_schedule_ends_with_mla():
    assert kimi_linear_schedule(8) == ("kda", "kda", "kda", "mla") * 2
    assert kimi_linear_schedule(6)[-1] == "mla"
    assert kimi_linear_schedule(3, kda_per_mla=0) == ("mla",) * 3


def test_auto_kda_is_fused_only_on_cuda_with_fla_and_a_kernel_friendly_config(monkeypatch):
    from k3lab.model import config as config_module

    auto = KimiK3Config()
    assert auto.kda_implementation == "auto"
    monkeypatch.setattr(config_module, "fla_installed", lambda: True)
    assert auto.resolve_kda(cuda=True).kda_implementation == "fused"
    assert auto.resolve_kda(cuda=False).kda_implementation == "chunkwise"
    assert auto.replace(kda_chunk_size=16).resolve_kda(cuda=True).kda_implementation == "chunkwise"
    assert auto.replace(kda_implementation="chunkwise").resolve_kda(cuda=True).kda_implementation == "chunkwise"
    monkeypatch.setattr(config_module, "fla_installed", lambda: False)
    assert auto.resolve_kda(cuda=True).kda_implementation == "chunkwise"
