"""The KDA op (`k3lab.ops.kda`): the chunkwise reference against the token-by-token recurrence and
against FLA's own PyTorch references, which define what FLA's fused kernels compute (FLA's test
suite holds each kernel to them; they need fla-core installed, not a GPU). The fused layer on a GPU
against the chunkwise one: tests/test_gpu_fused.py."""

import pytest
import torch
import torch.nn.functional as F
from conftest import fla_reference

from k3lab.model.kda import decay_gate
from k3lab.ops.kda.naive import chunk_kda_reference, recurrent_kda


def kda_inputs(B=2, T=32, H=2, dk=8, dv=12, decay_scale=1.0):
    q = torch.randn(B, T, H, dk)
    k = F.normalize(torch.randn(B, T, H, dk), dim=-1)
    v = torch.randn(B, T, H, dv)
    g = F.logsigmoid(torch.randn(B, T, H, dk)) * decay_scale
    beta = torch.rand(B, T, H)
    return q, k, v, g, beta


@pytest.mark.parametrize("chunk_size", [1, 4, 8, 32])
def test_chunkwise_matches_token_by_token_recurrence(chunk_size):
    q, k, v, g, beta = kda_inputs()
    h0 = torch.randn(2, 2, 8, 12)
    o_ref, s_ref = recurrent_kda(q, k, v, g, beta, initial_state=h0, output_final_state=True)
    o, s = chunk_kda_reference(q, k, v, g, beta, chunk_size=chunk_size, initial_state=h0, output_final_state=True)
    torch.testing.assert_close(o, o_ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(s, s_ref, atol=1e-5, rtol=1e-5)


def test_chunkwise_is_stable_under_strong_decay_within_a_chunk():
    # cumulative decay over a 32-token chunk reaches about -160: exp(+160) would overflow fp32
    q, k, v, g, beta = kda_inputs(decay_scale=5.0)
    g = g.clamp(max=-4.0)
    o_ref, _ = recurrent_kda(q, k, v, g, beta)
    o, _ = chunk_kda_reference(q, k, v, g, beta, chunk_size=32)
    assert torch.isfinite(o).all()
    torch.testing.assert_close(o, o_ref, atol=1e-5, rtol=1e-5)


def test_final_state_continues_the_sequence():
    q, k, v, g, beta = kda_inputs(T=32)
    o_full, s_full = chunk_kda_reference(q, k, v, g, beta, chunk_size=8, output_final_state=True)
    first = [t[:, :16] for t in (q, k, v, g, beta)]
    second = [t[:, 16:] for t in (q, k, v, g, beta)]
    o1, s1 = chunk_kda_reference(*first, chunk_size=8, output_final_state=True)
    o2, s2 = chunk_kda_reference(*second, chunk_size=8, initial_state=s1, output_final_state=True)
    torch.testing.assert_close(torch.cat([o1, o2], dim=1), o_full, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(s2, s_full, atol=1e-5, rtol=1e-5)


def test_no_final_state_unless_asked():
    q, k, v, g, beta = kda_inputs(T=8)
    assert chunk_kda_reference(q, k, v, g, beta, chunk_size=8)[1] is None


def test_custom_scale_is_applied_to_queries():
    q, k, v, g, beta = kda_inputs(T=8)
    o_half, _ = chunk_kda_reference(q, k, v, g, beta, chunk_size=8, scale=0.5)
    o_one, _ = chunk_kda_reference(q, k, v, g, beta, chunk_size=8, scale=1.0)
    torch.testing.assert_close(o_half * 2, o_one)


def test_length_not_a_multiple_of_chunk_size_is_a_clear_error():
    q, k, v, g, beta = kda_inputs(T=30)
    with pytest.raises(ValueError, match="30 is not a multiple of chunk_size=8"):
        chunk_kda_reference(q, k, v, g, beta, chunk_size=8)


def test_gradients_match_the_recurrence():
    inputs = [t.requires_grad_() for t in kda_inputs(T=16)]
    o, _ = chunk_kda_reference(*inputs, chunk_size=8)
    grads = torch.autograd.grad(o.square().sum(), inputs)
    o_ref, _ = recurrent_kda(*inputs)
    grads_ref = torch.autograd.grad(o_ref.square().sum(), inputs)
    for grad, grad_ref in zip(grads, grads_ref):
        torch.testing.assert_close(grad, grad_ref, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("chunk_size", [8, 16])
def test_chunkwise_matches_fla_naive_references(chunk_size):
    """FLA's own PyTorch references (recurrent and chunked) define the semantics we must match."""
    naive = fla_reference("ops/kda/naive.py")
    q, k, v, g, beta = kda_inputs(T=32)
    h0 = torch.randn(2, 2, 8, 12)
    o, s = chunk_kda_reference(q, k, v, g, beta, chunk_size=chunk_size, initial_state=h0, output_final_state=True)
    for reference in (naive.naive_recurrent_kda(q, k, v, g, beta, initial_state=h0, output_final_state=True),
                      naive.naive_chunk_kda(q, k, v, g, beta, initial_state=h0, output_final_state=True,
                                            chunk_size=chunk_size)):
        torch.testing.assert_close(o, reference[0], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(s, reference[1], atol=1e-5, rtol=1e-5)


def test_fla_bounded_gate_formula_is_decay_gate():
    gate = pytest.importorskip("fla.ops.kda.gate")
    from k3lab.model.kda import decay_gate

    f, A_log, dt_bias = torch.randn(2, 8, 3, 4) * 5, torch.randn(3), torch.randn(12)
    fla_g = gate.naive_kda_lowerbound_gate(f, A_log, dt_bias, lower_bound=-5.0)
    torch.testing.assert_close(fla_g, decay_gate(f, A_log, dt_bias, lower_bound=-5.0))


def test_fla_recurrence_is_ours():
    naive = fla_reference("ops/kda/naive.py")
    from k3lab.ops.kda.naive import recurrent_kda

    B, T, H, d = 2, 12, 3, 8
    q, k = F.normalize(torch.randn(B, T, H, d), dim=-1), F.normalize(torch.randn(B, T, H, d), dim=-1)
    v, g, beta = torch.randn(B, T, H, d), F.logsigmoid(torch.randn(B, T, H, d)), torch.rand(B, T, H)
    o_fla, s_fla = naive.naive_recurrent_kda(q, k, v, g, beta, output_final_state=True)
    o, s = recurrent_kda(q, k, v, g, beta, output_final_state=True)
    torch.testing.assert_close(o, o_fla, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(s, s_fla, atol=1e-5, rtol=1e-5)
