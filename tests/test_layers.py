"""SiTU-GLU, SwiGLU, the dense FFN, gated MLA and the KDA layer's fidelity switches."""

import torch
import torch.nn.functional as F

from k3lab.model.config import tiny_config
from k3lab.model.ffn import DenseFFN, situ_glu, swiglu
from k3lab.model.kda import KDAChunkwise, l2_normalize
from k3lab.model.mla import GatedMLA


def test_situ_glu_matches_its_formula():
    g, u = torch.randn(100) * 30, torch.randn(100) * 60
    expected = (4 * torch.tanh(g / 4) * torch.sigmoid(g)) * (25 * torch.tanh(u / 25))
    torch.testing.assert_close(situ_glu(g, u), expected)


def test_situ_glu_is_bounded_by_its_betas():
    g, u = torch.full((4,), 1e4), torch.full((4,), -1e4)
    out = situ_glu(g, u, beta=4.0, linear_beta=25.0)
    torch.testing.assert_close(out, torch.full((4,), -100.0))


def test_situ_glu_tends_to_swiglu_for_large_betas():
    g, u = torch.randn(100), torch.randn(100)
    torch.testing.assert_close(situ_glu(g, u, beta=1e4, linear_beta=1e4), F.silu(g) * u, atol=1e-5, rtol=1e-4)


def test_situ_glu_computes_in_fp32_and_returns_input_dtype():
    g, u = torch.randn(64, dtype=torch.bfloat16) * 8, torch.randn(64, dtype=torch.bfloat16) * 8
    out = situ_glu(g, u)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out, situ_glu(g.float(), u.float()).bfloat16())


def test_situ_glu_rejects_non_positive_beta():
    try:
        situ_glu(torch.zeros(1), torch.zeros(1), beta=0.0)
    except ValueError as error:
        assert "positive" in str(error)
    else:
        raise AssertionError("beta=0 was accepted")


def test_dense_ffn_is_down_of_situ_glu():
    ffn = DenseFFN(8, 16)
    x = torch.randn(3, 8)
    expected = ffn.down_proj(situ_glu(ffn.gate_proj(x), ffn.up_proj(x)))
    torch.testing.assert_close(ffn(x), expected)


def test_mla_is_causal():
    mla = GatedMLA(tiny_config())
    x = torch.randn(2, 12, 64)
    y = mla(x)
    x2 = x.clone()
    x2[:, 7:] += torch.randn(2, 5, 64)
    y2 = mla(x2)
    torch.testing.assert_close(y[:, :7], y2[:, :7])
    assert not torch.allclose(y[:, 7:], y2[:, 7:])


def test_mla_matches_explicit_softmax_attention_with_output_gate():
    config = tiny_config(mla_q_lora_rank=None)
    mla = GatedMLA(config)
    B, T, H, d = 1, 6, config.mla_num_heads, config.mla_qk_head_dim
    x = torch.randn(B, T, 64)
    q = mla.q_proj(x).view(B, T, H, d).transpose(1, 2)
    k, v = mla.kv_b_proj(mla.kv_norm(mla.kv_a_proj(x))).view(B, T, H, 2 * d).split(d, dim=-1)
    k, v = k.transpose(1, 2), v.transpose(1, 2)
    scores = (q @ k.transpose(-1, -2)) * d**-0.5
    scores = scores.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
    o = (scores.softmax(-1) @ v).transpose(1, 2).reshape(B, T, H * d)
    expected = mla.o_proj(o * torch.sigmoid(mla.g_proj(x)))
    torch.testing.assert_close(mla(x), expected, atol=1e-5, rtol=1e-5)


def explicit_attention(q, k, v):
    """Causal softmax attention written out: q, k (B, T, H, dq), v (B, T, H, dv) -> (B, T, H*dv)."""
    B, T, H, dq = q.shape
    scores = torch.einsum("bthd,bshd->bhts", q, k) * dq**-0.5
    scores = scores.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
    return torch.einsum("bhts,bshd->bthd", scores.softmax(-1), v).reshape(B, T, -1)


def test_mla_shared_key_part_is_one_key_for_every_head_outside_the_latent_norm():
    config = tiny_config(mla_shared_key_dim=8, mla_output_gate=False)
    mla = GatedMLA(config)
    B, T, H, d, r = 2, 6, config.mla_num_heads, config.mla_qk_head_dim, config.mla_kv_lora_rank
    x = torch.randn(B, T, 64)
    assert mla.kv_a_proj.weight.shape == (r + 8, 64) and mla.kv_norm.weight.shape == (r,)
    q = mla.q_proj(x).view(B, T, H, d + 8)
    a = mla.kv_a_proj(x)
    k_heads, v = mla.kv_b_proj(mla.kv_norm(a[..., :r])).view(B, T, H, 2 * d).split(d, dim=-1)
    shared = a[..., r:]  # (B, T, 8): not normalised
    k = torch.cat([k_heads, shared[:, :, None, :].expand(B, T, H, 8)], dim=-1)
    expected = mla.o_proj(explicit_attention(q, k, v))  # scale (d + 8)^-0.5
    torch.testing.assert_close(mla(x), expected, atol=1e-5, rtol=1e-5)


def test_mla_without_output_gate_has_no_gate_weights():
    mla = GatedMLA(tiny_config(mla_output_gate=False))
    assert mla.g_proj is None and not any(n.startswith("g_proj") for n, _ in mla.named_parameters())


def test_mla_latent_norms_use_their_own_eps():
    mla = GatedMLA(tiny_config(rms_norm_eps=1e-5, mla_latent_norm_eps=1e-3))
    assert mla.q_proj[1].eps == mla.kv_norm.eps == 1e-3


def test_old_checkpoints_load_into_the_renamed_kv_projections():
    mla = GatedMLA(tiny_config())
    old_names = {"kv_a_proj.": "kv_proj.0.", "kv_norm.": "kv_proj.1.", "kv_b_proj.": "kv_proj.2."}
    old = {}
    for key, value in mla.state_dict().items():
        for new_name, old_name in old_names.items():
            key = key.replace(new_name, old_name)
        old[key] = value
    assert "kv_proj.0.weight" in old
    fresh = GatedMLA(tiny_config())
    fresh.load_state_dict(old)
    x = torch.randn(1, 5, 64)
    torch.testing.assert_close(fresh(x), mla(x))


def test_swiglu_is_silu_gate_times_up_and_the_dense_ffn_can_use_it():
    g, u = torch.randn(50), torch.randn(50)
    torch.testing.assert_close(swiglu(g, u), F.silu(g) * u)
    ffn = DenseFFN(8, 16, activation="swiglu")
    x = torch.randn(3, 8)
    torch.testing.assert_close(ffn(x), ffn.down_proj(F.silu(ffn.gate_proj(x)) * ffn.up_proj(x)))


def test_fla_l2_norm_adds_eps_under_the_root():
    x = torch.tensor([[3.0, 4.0], [1e-4, 0.0]])
    torch.testing.assert_close(l2_normalize(x, "fla"), x / torch.sqrt((x * x).sum(-1, keepdim=True) + 1e-6))
    torch.testing.assert_close(l2_normalize(x, "normalize"), F.normalize(x, dim=-1))
    assert l2_normalize(x, "fla")[1, 0] < 0.1 < l2_normalize(x, "normalize")[1, 0]  # tiny vectors stay tiny


def test_kda_gate_rank_and_bias_shape_the_output_gate():
    def gate(**overrides):
        return KDAChunkwise(tiny_config(**overrides)).g_proj

    low = gate()  # the design default: rank kda_head_dim, bias on the last Linear
    assert [tuple(m.weight.shape) for m in low] == [(16, 64), (32, 16)] and low[1].bias is not None
    assert [tuple(m.weight.shape) for m in gate(kda_gate_rank=4)] == [(4, 64), (32, 4)]
    full = gate(kda_gate_rank="full", kda_gate_bias=False)
    assert isinstance(full, torch.nn.Linear) and full.weight.shape == (32, 64) and full.bias is None
    assert gate(kda_gate_bias=False)[1].bias is None


def test_kda_output_is_gated_by_the_full_rank_projection():
    kda = KDAChunkwise(tiny_config(kda_gate_rank="full", kda_gate_bias=False))
    x = torch.randn(1, 8, 64)
    o = torch.randn(1, 8, 2, 16)
    expected = kda.o_proj((kda.o_norm(o) * torch.sigmoid(kda.g_proj(x).view(1, 8, 2, 16))).reshape(1, 8, 32))
    torch.testing.assert_close(kda.gated_output(o, x), expected)
