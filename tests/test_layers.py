"""SiTU-GLU, the dense FFN and gated MLA."""

import torch
import torch.nn.functional as F

from k3lab.model.config import tiny_config
from k3lab.model.ffn import DenseFFN, situ_glu
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
    k, v = mla.kv_proj(x).view(B, T, H, 2 * d).split(d, dim=-1)
    k, v = k.transpose(1, 2), v.transpose(1, 2)
    scores = (q @ k.transpose(-1, -2)) * d**-0.5
    scores = scores.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
    o = (scores.softmax(-1) @ v).transpose(1, 2).reshape(B, T, H * d)
    expected = mla.o_proj(o * torch.sigmoid(mla.g_proj(x)))
    torch.testing.assert_close(mla(x), expected, atol=1e-5, rtol=1e-5)
