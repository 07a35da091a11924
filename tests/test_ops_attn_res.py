"""The AttnRes op (`k3lab.ops.attn_res`): the fused path against the reference.

CPU: FLA's PyTorch reference is the reference mixture then the pre-norm; the fused path's
autograd functions, on CPU running their plain-PyTorch twins (`naive.reference_forward`,
`naive.dv_reference`), keep the endpoints' bookkeeping of the reference path.
GPU (`gpu` marker): k3lab's Triton kernels (`kernel.py`) against the twins and FLA's forward.
Error metric, as FLA's tests: rms(out - ref) / rms(ref) (`conftest.err_ratio`).
"""

from __future__ import annotations

import pytest
import torch
from conftest import assert_as_accurate, err_ratio, fla_reference, needs_fla, randomize_scorers

from k3lab.model.config import tiny_config
from k3lab.model.model import KimiK3
from k3lab.model.norm import RMSNorm
from k3lab.ops.attn_res import fused as attn_res_fused, naive as attn_res_naive
from k3lab.ops.attn_res.naive import apply_attn_res, attn_res_mixture

gpu = pytest.mark.gpu


def test_fla_attnres_with_output_norm_is_apply_attn_res_then_the_prenorm():
    naive = fla_reference("ops/attnres/naive.py")
    BT, K, M = 10, 4, 32
    candidates = [torch.randn(BT, M) * (i + 1) for i in range(K)]
    norm, out_norm, proj = RMSNorm(M), RMSNorm(M), torch.nn.Linear(M, 1, bias=False)
    for w in (norm.weight, out_norm.weight, proj.weight):
        torch.nn.init.normal_(w, mean=1.0 if w.ndim == 1 else 0.0, std=0.3)
    expected = out_norm(apply_attn_res(torch.stack(candidates[:-1], dim=1), candidates[-1], norm, proj))
    fla_h = naive.naive_attnres(proj.weight, candidates, norm.weight, output_rms_weight=out_norm.weight, rms_eps=1e-6)
    torch.testing.assert_close(fla_h, expected, atol=1e-5, rtol=1e-5)


# -- CPU: the tuple-endpoint AttnRes state machine ------------------------------------

def standin_fused_attn_res(candidates, norm, proj, out_norm):
    """`attn_res_fused.fused_attn_res` in plain PyTorch, to run the fused block path on CPU."""
    B, T, M = candidates[-1].shape
    flat = [c.reshape(B * T, M) for c in candidates]
    h, weights = attn_res_mixture(torch.stack(flat[:-1], dim=1), flat[-1], norm, proj)
    return out_norm(h).view(B, T, M), weights.mean(dim=0)


@pytest.mark.parametrize("block_size", [1, 2, 3])
def test_fused_attn_res_state_machine_matches_the_reference(monkeypatch, block_size):
    model = KimiK3(tiny_config(num_layers=5, layer_types=("kda", "kda", "mla", "kda", "mla"),
                               attn_res_block_size=block_size))
    randomize_scorers(model, std=0.3)
    idx = torch.randint(0, 320, (2, 16))
    expected = model.final_hidden_states(idx)
    expected_weights = [dict(layer.attn_res_weights) for layer in model.layers]
    monkeypatch.setattr(attn_res_fused, "fused_attn_res", standin_fused_attn_res)
    monkeypatch.setattr(model, "no_endpoints", lambda x: attn_res_fused.EndpointTuple())
    torch.testing.assert_close(model.final_hidden_states(idx), expected, atol=1e-5, rtol=1e-5)
    for layer, weights in zip(model.layers, expected_weights):
        assert layer.attn_res_weights.keys() == weights.keys()
        for site in weights:
            torch.testing.assert_close(layer.attn_res_weights[site], weights[site], atol=1e-6, rtol=1e-5)


def mixture_chain(q, w, ow, leaves, fused: bool):
    """Three mixtures reading two endpoints, as three layers would: each output, plus one more
    of the leaves, is the next live prefix. Returns the sum of the outputs (a scalar to backprop)."""
    if fused:
        e0, e1 = attn_res_fused.as_endpoint(leaves[0] * 1.0), attn_res_fused.as_endpoint(leaves[1] * 1.0)
        mix = lambda cands: attn_res_fused.AttnResMixture.apply(q, w, ow, 1e-6, *cands)[0]  # noqa: E731
    else:
        e0, e1 = leaves[0] * 1.0, leaves[1] * 1.0
        mix = lambda cands: attn_res_naive.reference_attnres(q, cands, w, ow, 1e-6)  # noqa: E731
    h = mix([e0, leaves[2]])
    h2 = mix([e0, e1, h + leaves[3]])
    h3 = mix([e0, e1, h2 + leaves[4]])
    return (h * 0.5 + h2 * torch.linspace(-1, 1, h2.shape[-1]) + h3.square()).sum(), (e0, e1)


def test_endpoints_readers_sum_their_gradient_in_one_buffer_as_autograd_would():
    torch.manual_seed(0)
    N, D = 12, 16
    leaves = [torch.randn(N, D, dtype=torch.float64, requires_grad=True) for _ in range(5)]
    q, w, ow = (torch.randn(D, dtype=torch.float64, requires_grad=True) for _ in range(3))
    grads = {}
    for fused in (False, True):
        loss, endpoints = mixture_chain(q, w, ow, leaves, fused)
        handed = []  # what autograd hands each endpoint from its readers
        for e in endpoints:
            e.register_hook(lambda g: handed.append(g))
        grads[fused] = torch.autograd.grad(loss, [*leaves, q, w, ow])
        # fused: the readers add into Endpoint.summed and hand autograd nothing to add up
        assert [g is None for g in handed] == [fused, fused]
    for got, want in zip(grads[True], grads[False]):  # both in fp32 math, summed in other orders
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("checkpoint_layers", [False, True], ids=["stored", "checkpointed"])
@pytest.mark.parametrize("block_size", [1, 2, 3])
def test_fused_attn_res_path_with_its_twin_kernels_gives_the_references_gradients(monkeypatch, block_size,
                                                                                 checkpoint_layers):
    model = KimiK3(tiny_config(num_layers=5, layer_types=("kda", "kda", "mla", "kda", "mla"),
                               attn_res_block_size=block_size)).double()
    randomize_scorers(model, std=0.3)
    model.checkpoint_layers = checkpoint_layers
    idx = torch.randint(0, 320, (2, 16))
    states = {False: model.no_endpoints, True: lambda x: attn_res_fused.EndpointTuple()}
    results = {}
    for fused in (False, True):
        monkeypatch.setattr(model, "no_endpoints", states[fused])
        model.zero_grad()
        h = model.final_hidden_states(idx)
        (h * torch.linspace(-1, 1, h.numel(), dtype=h.dtype).view_as(h)).sum().backward()
        results[fused] = [h.detach()] + [p.grad.clone() for p in model.parameters() if p.grad is not None]
    assert len(results[True]) == len(results[False]) > 10
    for got, want in zip(results[True], results[False]):  # the mixtures' fp32 math, summed in other orders
        assert err_ratio(got, want) < 1e-4  # a reader's gradient left out would be ~1e-1


# == GPU ======================================================================================

@gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_attn_res_matches_apply_attn_res(dtype, fp32_truth):
    needs_fla()
    B, T, M, K = 2, 128, 1024, 4
    norm, out_norm = RMSNorm(M).cuda(), RMSNorm(M).cuda()
    proj = torch.nn.Linear(M, 1, bias=False).cuda()
    with torch.no_grad():
        proj.weight.normal_(std=0.1)
        norm.weight.uniform_(0.5, 1.5)
        out_norm.weight.uniform_(0.5, 1.5)
    modules = torch.nn.ModuleList([norm, proj, out_norm])
    candidates = [torch.randn(B, T, M, device="cuda") * (i + 1) for i in range(K)]
    dout = torch.randn(B, T, M, device="cuda")

    def reference(*cands):
        flat = torch.stack([c.reshape(B * T, M) for c in cands], dim=1)
        return out_norm(apply_attn_res(flat[:, :-1], flat[:, -1], norm, proj)).view(B, T, M)

    def grads(fn, dtype):
        modules.zero_grad()
        cands = [c.detach().to(dtype).requires_grad_() for c in candidates]
        out = fn(*cands)
        (out.float() * dout).sum().backward()
        return [out.float()] + [c.grad.float() for c in cands] + [p.grad.clone() for p in modules.parameters()]

    fused = grads(lambda *c: attn_res_fused.fused_attn_res(c, norm, proj, out_norm)[0], dtype)
    ref = grads(reference, dtype)
    names = ["out"] + [f"d_candidate{i}" for i in range(K)] + ["d_norm", "d_proj", "d_out_norm"]
    if dtype == torch.float32:
        for name, a, b in zip(names, fused, ref):
            print(f"{name:>28}: fp32 error {err_ratio(a, b):.2e}")
            assert err_ratio(a, b) < 1e-5, name
    else:
        ref32 = grads(reference, torch.float32)
        for name, a, b, c in zip(names, fused, ref, ref32):
            assert_as_accurate(name, a, b, c, 5e-3 if name == "out" else 8e-3)
    _, weights = attn_res_fused.fused_attn_res(candidates, norm, proj, out_norm)
    flat = torch.stack([c.reshape(B * T, M) for c in candidates], dim=1)
    _, ref_weights = attn_res_mixture(flat[:, :-1], flat[:, -1], norm, proj)
    torch.testing.assert_close(weights, ref_weights.mean(dim=0), atol=1e-5, rtol=1e-4)


def fla_forward(q, w, ow, flat, eps):
    """FLA's fused AttnRes forward, as k3lab's `kernel.forward` returns it: (o, rstd, logit, lse).

    FLA API facts this relies on (checked against fla-core 0.6.0):
    `fla.ops.attnres.fused.fused_attnres_fwd(q (D,), residuals K x (N, D), res (residuals padded to
    a power of two >= 8), w, ow, eps, scale, checkpoint_level)` returns (o (N, D) in the sources'
    dtype, o_pre (None at checkpoint level 1), rstd (K, N), logit (K, N), lse (N,)), fp32 stats:
    softmax over sources of <RMSNorm(v_l), q>, sum of raw v_l, then the RMSNorm of weight `ow`
    (one eps for both norms). Sources must share a dtype and be 16-byte aligned.
    """
    from fla.ops.attnres import fused as fla

    o, _, rstd, logit, lse = fla.fused_attnres_fwd(q=q, residuals=flat, res=fla._build_ptr_table(flat), w=w, ow=ow,
                                                   eps=eps, scale=1.0, checkpoint_level=1)
    return o, rstd, logit, lse


@gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("K", [2, 13])
def test_attn_res_forward_kernel_matches_its_twin_and_flas_forward(dtype, K):
    """k3lab's forward kernel against `reference_forward` and against FLA's forward, whose
    statistics (rstd, logit, lse) the backward reads: all four outputs, at a trial's D."""
    needs_fla()
    from k3lab.ops.attn_res.kernel import forward

    N, D = 4096, 512
    g = torch.Generator(device="cpu").manual_seed(K)
    residuals = [(torch.randn(N, D, generator=g) * (1 + i % 3)).cuda().to(dtype) for i in range(K)]
    q, w, ow = (0.05 * torch.randn(D, generator=g)).cuda(), *(1 + 0.1 * torch.randn(2, D, generator=g)).cuda()
    got = forward(q, w, ow, residuals, 1e-6)
    twin = attn_res_naive.reference_forward(q, w, ow, residuals, 1e-6)
    fla = fla_forward(q, w, ow, residuals, 1e-6)
    floor = 1e-5 if dtype == torch.float32 else 1e-2  # bf16: the output rounded once
    for name, a, b, c in zip(["o", "rstd", "logit", "lse"], got, twin, fla):
        bound = floor if name == "o" else 1e-5
        print(f"{name:>8}: twin {err_ratio(a, b):.2e}, FLA {err_ratio(a, c):.2e}")
        assert a.dtype == b.dtype and err_ratio(a, b) < bound and err_ratio(a, c) < bound, name


@gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("K", [2, 13])
@pytest.mark.parametrize("N", [4096, 65536])
def test_attn_res_backward_kernel_matches_its_twin_and_sums_in_place(dtype, K, N):
    """k3lab's backward kernel against `dv_twin`: stored where a bit of ACC is clear, added to
    what the buffer holds where it is set; dq/dw and the output norm's weight summed over rows
    in partial sums (65,536 rows, a `small` trial's step: sixteen rows a program at K = 2, one at
    K = 13)."""
    from k3lab.ops.attn_res.kernel import PARTIAL_ROWS, dv_backward, forward

    D = 512
    g = torch.Generator(device="cpu").manual_seed(K)
    residuals = [(torch.randn(N, D, generator=g) * (1 + i % 3)).cuda().to(dtype) for i in range(K)]
    q, w, ow = (0.05 * torch.randn(D, generator=g)).cuda(), *(1 + 0.1 * torch.randn(2, D, generator=g)).cuda()
    do = torch.randn(N, D, generator=g).cuda().to(dtype)
    _, rstd, logit, lse = forward(q, w, ow, residuals, 1e-6)
    held = [torch.randn(N, D, generator=g).cuda().to(dtype) for _ in range(K)]
    acc = 0b0101010101010 & ((1 << K) - 1)
    targets = [h.clone() for h in held]
    partials = dv_backward(q, w, ow, residuals, rstd, logit, lse, do, targets, acc, 1e-6)
    dvs, want_dqw, want_dow = attn_res_naive.dv_twin(q, w, ow, residuals, do, 1e-6)
    floor = 1e-5 if dtype == torch.float32 else 1e-2  # bf16: one rounding of the stored sum
    for i, (target, dv) in enumerate(zip(targets, dvs)):
        want = dv + held[i].float() if acc >> i & 1 else dv
        print(f"{f'd_source{i}':>28}: {err_ratio(target, want):.2e}")
        assert err_ratio(target, want) < floor, i
    blocks = min(N, PARTIAL_ROWS) if K == 2 else N  # K = 13: 16 slots, past LOOP_SLOTS: one row a program
    assert partials.shape == (2, blocks, D)  # partial sums over blocks of rows
    dqw, dow = partials.sum(1)
    assert err_ratio(dqw, want_dqw.sum(0)) < 1e-4 and err_ratio(dow, want_dow.sum(0)) < 1e-4
