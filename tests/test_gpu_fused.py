"""The fused GPU path of the model against the plain PyTorch reference (each op's own: tests/test_ops_*.py).

CPU tests (unmarked) check the logic every GPU path shares with its reference: the
fused KDA layer's parameters and CPU fallback, the padded grouped-GEMM MoE layout, the chunked linear cross-entropy, the MLA
head-dim padding and compile_blocks.

GPU tests (`gpu` marker; FLA required) compare the kernels in bf16 autocast with the
reference. Error metric, as FLA's tests: rms(out - ref) / rms(ref). Tolerance: the
fused result must be as close to the fp32 truth (the reference path in fp32) as the
reference path itself is in bf16 -- within 2x its error -- or within FLA's own
tolerances (5e-3 outputs, 8e-3 gradients); every measured error is printed (pytest -rP).
The bf16 reference's own error is the yardstick because it is far from zero: measured
with CPU autocast on these shapes, ~1e-2 for one KDA layer's output and gradients, and
~1e-1 for the whole 4-layer model's gradients (relative errors roughly double per
layer at initialisation), so the whole-model gradient check only catches gross errors;
the per-kernel tests carry the precision claims, and the model loss (~6e-4) is tight.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F
from conftest import assert_as_accurate, err_ratio, needs_fla, randomize_scorers

from k3lab.model.config import KimiK3Config, tiny_config
from k3lab.model.kda import KDAChunkwise, KDAFused
from k3lab.model.loss import linear_cross_entropy
from k3lab.model.mla import GatedMLA, causal_attention
from k3lab.model.model import KimiK3, compile_blocks
from k3lab.model.moe import GROUP_ALIGN, StableLatentMoE, balance_biases, grouped_layout, grouped_mm_reference


def shared_routing(*models) -> None:
    """Each MoE layer of every model sends a token to the experts the first run chose for it.

    Top-k over sigmoid scores flips for near-tied tokens under any rounding change
    upstream (bf16 vs fp32 moves a layer's input by ~1%), and a flipped token's output
    changes by O(1): comparisons of whole models would measure routing luck, not kernels.
    Mixture weights still come from each model's own scores, so router gradients flow.
    """
    recorded = {}
    for model in models:
        for layer, moe in model.moe_layers():
            def route(x, moe=moe, layer=layer):
                scores = moe.router_scores(x)
                indices = recorded.setdefault(layer, moe.select(scores))
                return indices, moe.mixture_weights(scores, indices)
            moe.route = route


# -- CPU: fused KDA layer ----------------------------------------------------------------

K3_GATE = {"kda_gate_rank": "full", "kda_gate_bias": False, "kda_qk_l2norm": "fla"}  # K3's KDA choices


def fused_tiny(**overrides):
    return tiny_config(kda_implementation="fused", kda_chunk_size=32, **overrides)


@pytest.mark.parametrize("k3_gate", [False, True], ids=["low_rank_gate", "k3_full_rank_gate"])
def test_fused_kda_has_exactly_the_chunkwise_parameters(k3_gate):
    config = fused_tiny(**K3_GATE if k3_gate else {})
    fused, chunkwise = KDAFused(config), KDAChunkwise(config)
    assert {k: v.shape for k, v in fused.state_dict().items()} == {k: v.shape for k, v in chunkwise.state_dict().items()}
    chunkwise.load_state_dict(fused.state_dict())  # strict


@pytest.mark.parametrize("gate", [{}, K3_GATE, {**K3_GATE, "kda_gate_bias": True}],
                         ids=["low_rank_gate", "k3_full_rank_gate", "full_rank_gate_with_bias"])
def test_fused_kda_input_projections_in_one_matmul_are_the_layers_own_linears(gate):
    """KDAFused reads x through one matmul of its Linears' weights, concatenated: the same q, k,
    v, decay input, beta logits and gate as each Linear alone, and the same gradients."""
    layer = KDAFused(fused_tiny(**gate))
    with torch.no_grad():
        for param in layer.parameters():
            param.normal_(std=0.5)
    x = torch.randn(2, 5, 64, requires_grad=True)
    got = layer.input_projections(x)
    want = (layer.q_proj(x), layer.k_proj(x), layer.v_proj(x), layer.f_proj(x), layer.b_proj(x), layer.g_proj(x))
    for name, a, b in zip(["q", "k", "v", "f", "beta", "gate"], got, want):
        torch.testing.assert_close(a, b, msg=name)
    weights = torch.randn(6)
    grads = [torch.autograd.grad(sum(w * t.square().sum() for w, t in zip(weights, outputs)), [x, *layer.parameters()],
                                 allow_unused=True) for outputs in (got, want)]
    for a, b in zip(*grads):
        assert (a is None) == (b is None)
        if a is not None:  # x's gradient: one matmul's sum against six, in another order
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)


def test_fused_model_checkpoints_load_into_the_chunkwise_model():
    fused = KimiK3(fused_tiny())
    assert all(isinstance(layer.attn, KDAFused) for layer in fused.layers if layer.layer_type == "kda")
    chunkwise = KimiK3(fused.config.replace(kda_implementation="chunkwise"))
    chunkwise.load_state_dict(fused.state_dict())


def test_fused_kda_cpu_fallback_is_the_reference_for_any_length():
    config = fused_tiny()
    fused = KDAFused(config)
    chunkwise = KDAChunkwise(config)
    chunkwise.load_state_dict(fused.state_dict())
    x = torch.randn(2, 45, 64)
    expected = chunkwise(F.pad(x, (0, 0, 0, 64 - 45)))[:, :45]  # causal: padding after the end changes nothing
    torch.testing.assert_close(fused(x), expected)


def test_fused_config_model_on_cpu_matches_the_chunkwise_model():
    fused = KimiK3(fused_tiny())
    randomize_scorers(fused)
    chunkwise = KimiK3(fused.config.replace(kda_implementation="chunkwise"))
    chunkwise.load_state_dict(fused.state_dict())
    idx = torch.randint(0, 320, (2, 20))
    logits, _ = fused(idx)
    expected, _ = chunkwise(F.pad(idx, (0, 12)))
    torch.testing.assert_close(logits, expected[:, :20], atol=1e-5, rtol=1e-5)


# -- CPU: FLA's own PyTorch references define what its kernels compute ---------------------
# (FLA's test-suite checks each kernel against these; they need FLA installed, not a GPU)

# -- CPU: grouped MoE dispatch ------------------------------------------------------------

def init_moe(moe, std: float | None = 0.2):
    """Random weight matrices (2-D, and the experts' 3-D stacks); std None: fan_in^-0.5,
    keeping activations O(1) at any width."""
    for p in moe.parameters():
        if p.ndim >= 2:
            torch.nn.init.normal_(p, std=p.shape[-1] ** -0.5 if std is None else std)
    return moe


def test_grouped_layout_groups_pairs_by_expert_on_aligned_offsets():
    flat_expert = torch.tensor([3, 0, 3, 1, 3, 0, 5, 3, 1, 0] * 7)
    E = 6
    pos, offs, R = grouped_layout(flat_expert, E)
    assert R % GROUP_ALIGN == 0 and R >= flat_expert.numel() + E * (GROUP_ALIGN - 1)
    assert offs.dtype == torch.int32 and offs[-1] == R
    assert (offs[:-1] % GROUP_ALIGN == 0).all() and (offs.diff() >= 0).all()
    assert len(set(pos.tolist())) == flat_expert.numel()  # distinct rows
    group_of_row = torch.searchsorted(offs, pos, right=True)
    assert torch.equal(group_of_row, flat_expert)
    for e in range(E):  # pairs keep their order inside their group, packed from the group start
        rows = pos[flat_expert == e]
        start = 0 if e == 0 else offs[e - 1].item()
        assert torch.equal(rows, torch.arange(start, start + rows.numel()))


@pytest.mark.parametrize("latent", [32, None])
def test_grouped_dispatch_matches_the_loop_with_gradients(latent):
    moe = init_moe(StableLatentMoE(tiny_config(num_experts=8, num_experts_per_token=3, moe_latent_size=latent)))
    x = torch.randn(2, 21, 64, requires_grad=True)
    results = {}
    for mode in ("loop", "grouped"):
        moe.dispatch_mode = mode
        moe.zero_grad()
        x.grad = None
        y = moe(x)
        (y * torch.linspace(-1, 1, y.numel()).view_as(y)).sum().backward()
        results[mode] = [y.detach(), x.grad.clone()] + [p.grad.clone() for p in moe.experts.parameters()]
    for loop, grouped in zip(results["loop"], results["grouped"]):
        torch.testing.assert_close(grouped, loop, atol=1e-5, rtol=1e-5)


def test_torch_grouped_mm_on_cpu_matches_the_reference_loop():
    a, b = torch.randn(48, 16), torch.randn(4, 16, 24)
    offs = torch.tensor([16, 16, 32, 48], dtype=torch.int32)  # one empty group
    try:
        out = torch._grouped_mm(a, b, offs=offs)
    except (RuntimeError, NotImplementedError) as error:
        pytest.skip(f"torch._grouped_mm has no CPU kernel in this torch: {error}")
    torch.testing.assert_close(out, grouped_mm_reference(a, b, offs))


def test_load_is_counted_without_bincount():
    moe = init_moe(StableLatentMoE(tiny_config(num_experts=8))).train()
    indices, _ = moe.route(torch.randn(30, 64))
    torch.testing.assert_close(moe.load_counts, torch.bincount(indices.flatten(), minlength=8).float())


# -- CPU: chunked linear cross-entropy ------------------------------------------------------

@pytest.mark.parametrize("chunk_size", [1, 7, 64, None])
def test_linear_cross_entropy_matches_cross_entropy_with_gradients(chunk_size):
    x = torch.randn(40, 16, requires_grad=True)
    w = torch.randn(50, 16, requires_grad=True)
    targets = torch.randint(0, 50, (40,))
    targets[[3, 17]] = -100  # ignored, as F.cross_entropy does
    loss = linear_cross_entropy(x, w, targets, chunk_size=chunk_size)
    (2.5 * loss).backward()
    x_ref, w_ref = x.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
    loss_ref = F.cross_entropy(x_ref @ w_ref.T, targets)
    (2.5 * loss_ref).backward()
    torch.testing.assert_close(loss, loss_ref)
    torch.testing.assert_close(x.grad, x_ref.grad)
    torch.testing.assert_close(w.grad, w_ref.grad)


def test_model_loss_without_logits_equals_the_default_loss():
    model = KimiK3(tiny_config())
    idx, targets = torch.randint(0, 320, (2, 16)), torch.randint(0, 320, (2, 16))
    _, loss = model(idx, targets)
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    logits, chunked = model(idx, targets, return_logits=False)
    chunked.backward()
    assert logits is None
    torch.testing.assert_close(chunked, loss)
    for name, p in model.named_parameters():
        torch.testing.assert_close(p.grad, grads[name], atol=1e-6, rtol=1e-5, msg=name)


# -- CPU: MLA head dims, compile_blocks ------------------------------------------------------

def test_padding_the_head_dims_is_exact():
    q, k = torch.randn(2, 3, 10, 24), torch.randn(2, 3, 10, 24)
    v = torch.randn(2, 3, 10, 16)
    expected = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    torch.testing.assert_close(causal_attention(q, k, v, pad_head_dims=True), expected)
    torch.testing.assert_close(causal_attention(v, v, q, pad_head_dims=True),
                               F.scaled_dot_product_attention(v, v, q, is_causal=True))


def test_compile_blocks_keeps_names_and_outputs():
    model = KimiK3(tiny_config())
    idx = torch.randint(0, 320, (1, 16))
    expected, _ = model(idx)
    keys = list(model.state_dict())
    compile_blocks(model, backend="eager")
    logits, _ = model(idx)
    assert list(model.state_dict()) == keys
    torch.testing.assert_close(logits, expected)


# == GPU ======================================================================================

gpu = pytest.mark.gpu


@pytest.fixture
def fresh_compiler():
    """Dynamo's caches emptied, as in a new trial process (`k3lab.runner.tune.trial` resets them between
    variants): compiled tests run earlier in this process leave guard entries on the blocks' shared
    code objects, and past the recompile limit dynamo runs a block eagerly instead of compiling it."""
    import torch._dynamo

    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def gpu_config(**overrides) -> KimiK3Config:
    """A small Kimi-shaped model with bench_gpu.py's widths (hidden 1024, 8 KDA heads x 128), so
    FLA's autotuned kernel configs (keyed by those widths) are shared with the benchmark."""
    settings = dict(
        vocab_size=1024, hidden_size=1024, num_layers=4, layer_types=("kda", "kda", "kda", "mla"),
        max_seq_len=512, num_dense_layers=1, intermediate_size=2048, attn_res_block_size=2,
        kda_num_heads=8, kda_head_dim=128, kda_chunk_size=64, mla_num_heads=8, mla_q_lora_rank=256,
        mla_kv_lora_rank=256, mla_qk_head_dim=128, mla_v_head_dim=128, num_experts=8, num_experts_per_token=2,
        moe_intermediate_size=256, moe_latent_size=256,
    )
    settings.update(overrides)
    return KimiK3Config(**settings)


def run(module, inputs, dout, bf16: bool):
    """Forward + backward of (out * dout).sum(); returns {name: tensor} of output and gradients."""
    module.zero_grad()
    inputs = [t.detach().clone().requires_grad_() for t in inputs]
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=bf16):
        out = module(*inputs)
    (out.float() * dout).sum().backward()
    result = {"out": out.detach().float()}
    result.update({f"d_input{i}": t.grad for i, t in enumerate(inputs)})
    result.update({f"d_{n}": p.grad for n, p in module.named_parameters() if p.grad is not None})
    return result


def test_fla_gluon_convolution_is_chosen_unless_the_user_set_fla_conv_gluon():
    code = "import os, k3lab.ops.kda.fused; print(os.environ['FLA_CONV_GLUON'])"
    env = {k: v for k, v in os.environ.items() if k != "FLA_CONV_GLUON"}
    for setting, expected in ((None, "1"), ("0", "0")):
        run_env = env if setting is None else env | {"FLA_CONV_GLUON": setting}
        out = subprocess.run([sys.executable, "-c", code], env=run_env, capture_output=True, text=True, check=True)
        assert out.stdout.strip() == expected


@gpu
@pytest.mark.parametrize("keep_states", [False, True], ids=["states_recomputed", "states_kept"])
@pytest.mark.parametrize("conv", ["0", "1"], ids=["triton_conv", "gluon_conv"])
@pytest.mark.parametrize("k3_gate", [False, True], ids=["low_rank_gate", "k3_full_rank_gate"])
def test_fused_kda_layer_matches_chunkwise(fp32_truth, k3_gate, conv, keep_states, monkeypatch):
    needs_fla()
    monkeypatch.setenv("FLA_CONV_GLUON", conv)  # FLA reads it at each call
    config = gpu_config(kda_implementation="fused", **K3_GATE if k3_gate else {})
    fused = KDAFused(config).cuda()
    fused.keep_states = keep_states  # chunk_kda's disable_recompute (train.kda_keep_states)
    chunkwise = KDAChunkwise(config).cuda()
    chunkwise.load_state_dict(fused.state_dict())
    x = torch.randn(2, 512, 1024, device="cuda")
    dout = torch.randn(2, 512, 1024, device="cuda")
    out = run(fused, [x], dout, bf16=True)
    ref16 = run(chunkwise, [x], dout, bf16=True)
    ref32 = run(chunkwise, [x], dout, bf16=False)
    assert out.keys() == ref32.keys()
    for name in ref32:
        assert_as_accurate(name, out[name], ref16[name], ref32[name], 5e-3 if name == "out" else 8e-3)


@gpu
def test_torch_grouped_mm_on_cuda_matches_the_reference_loop():
    sizes = [0, 48, 16, 0, 96, 32, 0, 64]  # multiples of GROUP_ALIGN, empty groups included
    offs = torch.tensor(sizes, device="cuda").cumsum(0).to(torch.int32)
    a = torch.randn(sum(sizes), 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    b = torch.randn(8, 128, 64, device="cuda", dtype=torch.bfloat16).transpose(1, 2).contiguous().transpose(1, 2)
    b.requires_grad_()
    dout = torch.randn(sum(sizes), 64, device="cuda", dtype=torch.bfloat16)
    out = torch._grouped_mm(a, b, offs=offs)
    da, db = torch.autograd.grad(out, (a, b), dout)
    ref = grouped_mm_reference(a.float(), b.float(), offs)
    da_ref, db_ref = torch.autograd.grad(ref, (a, b), dout.float())
    for name, x, y in (("out", out, ref), ("d_a", da, da_ref), ("d_b", db, db_ref)):
        print(f"{name:>28}: bf16 vs fp32 loop {err_ratio(x, y):.2e}")
        assert err_ratio(x, y) < 5e-3, name


@gpu
@pytest.mark.parametrize("latent", [256, None])
def test_grouped_moe_matches_the_loop(latent, fp32_truth):
    moe = init_moe(StableLatentMoE(gpu_config(moe_latent_size=latent)), std=None).cuda()
    x = torch.randn(4, 256, 1024, device="cuda")
    dout = torch.randn(4, 256, 1024, device="cuda")
    results = {}
    for mode, bf16 in (("grouped", True), ("loop", True), ("loop", False)):
        moe.dispatch_mode = mode
        results[mode, bf16] = run(moe, [x], dout, bf16)
    for name in results["loop", False]:
        assert_as_accurate(name, results["grouped", True][name], results["loop", True][name],
                           results["loop", False][name], 5e-3 if name == "out" else 8e-3)


@gpu
def test_grouped_moe_step_has_no_host_sync():
    moe = init_moe(StableLatentMoE(gpu_config(moe_balance="sign")), std=None).cuda().train()
    x = torch.randn(4, 256, 1024, device="cuda", requires_grad=True)

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            y = moe(x)
        y.float().sum().backward()

    step()  # lazy initialisation (cuBLAS handles, allocator) may synchronise once
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        step()
        balance_biases([moe])
    finally:
        torch.cuda.set_sync_debug_mode(0)


@gpu
def test_linear_cross_entropy_on_cuda_matches_cross_entropy(fp32_truth):
    N, M, V = 4096, 256, 32000
    x = torch.randn(N, M, device="cuda")
    w = torch.randn(V, M, device="cuda") * 0.05
    targets = torch.randint(0, V, (N,), device="cuda")

    def chunked(x, w):
        return linear_cross_entropy(x, w, targets, chunk_size=1000)

    def full(x, w):
        return F.cross_entropy((x @ w.T).float(), targets)

    def grads(fn, bf16):
        xs, ws = x.clone().requires_grad_(), w.clone().requires_grad_()
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=bf16):
            loss = fn(xs, ws)
        loss.backward()
        return {"loss": loss.detach(), "d_x": xs.grad, "d_w": ws.grad}

    out, ref16, ref32 = grads(chunked, True), grads(full, True), grads(full, False)
    for name in ref32:
        assert_as_accurate(name, out[name], ref16[name], ref32[name], 1e-4 if name == "loss" else 8e-3)


@gpu
def test_mla_runs_on_the_flash_backend_with_unequal_head_dims():
    from torch.nn.attention import SDPBackend, sdpa_kernel

    mla = GatedMLA(gpu_config(mla_qk_head_dim=128, mla_v_head_dim=64)).cuda()
    x = torch.randn(2, 256, 1024, device="cuda")
    with torch.autocast("cuda", dtype=torch.bfloat16), sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        out = mla(x)
    assert out.dtype == torch.bfloat16
    ref = mla(x)  # fp32, any backend
    print(f"{'mla flash bf16 vs fp32':>28}: {err_ratio(out, ref):.2e}")
    assert err_ratio(out, ref) < 1e-2


@gpu
def test_fused_model_matches_the_chunkwise_model(fp32_truth):
    needs_fla()
    torch.manual_seed(0)
    fused = KimiK3(gpu_config(kda_implementation="fused")).cuda()
    randomize_scorers(fused)
    chunkwise = KimiK3(fused.config.replace(kda_implementation="chunkwise")).cuda()
    chunkwise.load_state_dict(fused.state_dict())
    idx = torch.randint(0, 1024, (2, 512), device="cuda")
    targets = torch.roll(idx, -1, dims=1)
    x = fused.embed(idx)  # the paths the two forwards take: the fused kernels' endpoints and the reference's
    assert type(fused.no_endpoints(x)).__name__ == "EndpointTuple"
    assert type(chunkwise.no_endpoints(x)).__name__ == "StackedEndpoints"

    def loss_and_grads(model, bf16, return_logits=True):
        model.zero_grad()
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=bf16):
            _, loss = model(idx, targets, return_logits=return_logits)
        loss.backward()
        grads = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).flatten().float()
                           for p in model.parameters()])  # the loop skips experts that got no token
        return {"loss": loss.detach(), "grads": grads}

    shared_routing(chunkwise, fused)
    ref32 = loss_and_grads(chunkwise, False)  # first: its expert choices are replayed
    ref16, out = loss_and_grads(chunkwise, True), loss_and_grads(fused, True, return_logits=False)
    assert_as_accurate("model loss", out["loss"], ref16["loss"], ref32["loss"], 1e-3)
    assert_as_accurate("model gradients", out["grads"], ref16["grads"], ref32["grads"], 1e-2)


@gpu
def test_compiled_fused_model_matches_eager(fresh_compiler):
    needs_fla()
    model = KimiK3(gpu_config(kda_implementation="fused")).cuda()
    randomize_scorers(model)
    shared_routing(model)
    idx = torch.randint(0, 1024, (2, 256), device="cuda")
    grads = {}
    for compiled in (False, True):
        if compiled:
            compile_blocks(model)
        model.zero_grad()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            _, loss = model(idx, torch.roll(idx, -1, 1), return_logits=False)
        loss.backward()  # the compiled blocks' endpoints are summed by their readers too
        grads[compiled] = (loss.detach(), torch.cat([p.grad.flatten() for p in model.parameters()
                                                     if p.grad is not None]))
    (expected, eager_grads), (loss, compiled_grads) = grads[False], grads[True]
    print(f"{'compiled vs eager loss':>28}: {abs(loss.item() - expected.item()):.2e}")
    print(f"{'compiled vs eager gradients':>28}: {err_ratio(compiled_grads, eager_grads):.2e}")
    assert abs(loss.item() - expected.item()) <= 1e-3 * expected.item()
    # two bf16 runs of this model differ by ~1e-1 in their gradients (measured on an H200: 6.6e-2
    # compiled against eager), so this catches gross errors only, such as a reader's share lost
    assert err_ratio(compiled_grads, eager_grads) < 0.2


@gpu
def test_cuda_graph_training_steps_match_eager_steps(isolated_data, fresh_compiler, monkeypatch):
    """The captured step (forward, backward, clipping, Muon, AdamW, MoE biases) replays what the
    trainer's eager step computes, step after step: the same losses, weights and MoE biases."""
    needs_fla()
    from k3lab.registry import TrainSpec
    from k3lab.runner.train import trainer as trainer_module

    config = gpu_config(kda_implementation="fused", vocab_size=320)
    spec = TrainSpec(steps=8, batch_size=2, seq_len=256, warmup_steps=2)
    runs, trainers = {}, {}
    for graphed, eager_steps in ((False, 100), (True, trainer_module.EAGER_STEPS_BEFORE_CAPTURE)):
        monkeypatch.setattr(trainer_module, "EAGER_STEPS_BEFORE_CAPTURE", eager_steps)  # 100: never captures
        trainer = trainers[graphed] = trainer_module.Trainer(config, spec, seed=0)
        runs[graphed] = [trainer.train_step()["train_loss"].item() for _ in range(6)]
        assert trainer.cuda_graph == "on" and (trainer.graphed.graph is not None) == graphed
    print(f"{'graphed vs eager losses':>28}: {runs[True]} vs {runs[False]}")
    assert trainer_module.EAGER_STEPS_BEFORE_CAPTURE < 6  # replays were compared, not only eager steps
    torch.testing.assert_close(torch.tensor(runs[True]), torch.tensor(runs[False]), rtol=1e-5, atol=1e-5)
    for (name, a), b in zip(trainers[False].model.state_dict().items(), trainers[True].model.state_dict().values()):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-5, msg=name)  # weights, MoE biases and loads


@gpu
def test_a_captured_step_runs_both_optimizers_at_each_steps_learning_rate():
    """GraphedStep with clipping, Muon and capturable AdamW inside: each replay updates the
    weights as the same step run eagerly does at the learning rate the schedule set for that
    step (a rate of 0 leaves them as they were), and the param groups keep their float rates.

    The reference runs eagerly with the graph's device learning rates, as the trainer's eager
    steps do: with float rates the fp32 rounding of a rate differs by an ulp, which Adam's and
    Muon's normalisations amplify to ~4e-4 within two steps of this model (H200, 2026-12-03)."""
    from k3lab.optim.assignment import build_optimizers
    from k3lab.runner.train.graphs import GraphedStep

    rates = [1e-2, 2e-2, 5e-2, 0.0, 3e-2, 1e-3, 2e-2]
    x = torch.randn(len(rates), 16, 32, device="cuda")
    y = torch.randn(len(rates), 16, 8, device="cuda")
    weights = {}
    for graphed in (False, True):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 8)).cuda()
        optimizers = build_optimizers(model, lr=1e-2, weight_decay=0.1, capturable=True)
        assert [type(o).__name__ for o in optimizers] == ["Muon", "AdamW"]

        def step(xb, yb):
            loss = F.mse_loss(model(xb), yb)
            loss.backward()
            norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            for optimizer in optimizers:
                optimizer.step()
            return {"loss": loss.detach(), "grad_norm": norm}

        replayed = GraphedStep(step, model.parameters(), optimizers)
        history = []
        for i, rate in enumerate(rates):
            for optimizer in optimizers:
                for group in optimizer.param_groups:
                    group["lr"] = rate
            if graphed and i >= 2:  # two eager steps allocate the optimizers' state, as in a trial
                replayed(x[i], y[i])
            else:
                with replayed.device_learning_rates():
                    step(x[i], y[i])
                for optimizer in optimizers:
                    optimizer.zero_grad(set_to_none=True)
            history.append(torch.cat([p.detach().flatten() for p in model.parameters()]).clone())
        assert (replayed.graph is not None) == graphed
        assert all(type(g["lr"]) is float for o in optimizers for g in o.param_groups)
        weights[graphed] = history
    for eager, replay in zip(weights[False], weights[True]):
        torch.testing.assert_close(replay, eager, rtol=1e-5, atol=1e-7)
    assert torch.equal(weights[True][3], weights[True][2])  # the rate-0 step, replayed
    assert not torch.equal(weights[True][4], weights[True][3])


@gpu
@pytest.mark.parametrize("compile", [False, True])
def test_muon_buckets_on_side_streams_update_exactly_as_on_one_stream(compile):
    """The buckets' kernel chains overlap on side streams; each chain is the same kernels on
    the same inputs, so the weights and momenta match the one-stream step bit for bit (eager,
    and with each bucket's steps compiled)."""
    from k3lab.optim.muon import Muon

    shapes = [(64, 128), (128, 64), (96, 96), (64, 128), (8, 128), (4, 96, 96)]
    results = {}
    for streams in (0, 4):
        generator = torch.Generator(device="cuda").manual_seed(0)
        params = [torch.nn.Parameter(torch.randn(*s, device="cuda", generator=generator) * 0.1) for s in shapes]
        optimizer = Muon(params, lr=0.02, weight_decay=0.1, streams=streams, compile=compile)
        for _ in range(3):
            for p in params:
                p.grad = torch.randn(p.shape, device="cuda", generator=generator)
            optimizer.step()
        assert len(optimizer.side_streams.get(params[0].device, [])) == streams
        results[streams] = [p.detach().clone() for p in params] + [optimizer.state[p]["momentum_buffer"] for p in params]
    for one_stream, side_streams in zip(results[0], results[4]):
        assert torch.equal(side_streams, one_stream)


@gpu
@pytest.mark.parametrize("compile", [False, True])
def test_a_muon_step_with_a_float_learning_rate_never_waits_on_the_gpu(compile):
    """Outside a CUDA graph (gradient accumulation, DDP, a failed capture) the learning rate is a
    float; compiled, Muon hands it to its update as a device scalar, which must be filled by a
    kernel, not copied from the host (a copy waits for the stream: a stall per bucket)."""
    from k3lab.optim.muon import Muon

    params = [torch.nn.Parameter(torch.randn(*s, device="cuda") * 0.1) for s in [(64, 128), (96, 96), (4, 96, 96)]]
    optimizer = Muon(params, lr=0.02, weight_decay=0.1, compile=compile)
    for p in params:
        p.grad = torch.randn_like(p)
    optimizer.step()  # the first step compiles, which may wait
    optimizer.param_groups[0]["lr"] = 0.01
    torch.cuda.set_sync_debug_mode("error")
    try:
        optimizer.step()
    finally:
        torch.cuda.set_sync_debug_mode("default")


@gpu
def test_a_restarted_trainer_replays_its_graph_and_trains_as_a_new_trainer_of_its_seed(isolated_data, fresh_compiler):
    """Trainer.restart (a variant's next seed in a reused sweep process) keeps the compiled
    blocks and the captured CUDA graph, and trains and evaluates the new seed as a Trainer
    built for it does (which runs its first steps eagerly, then captures a graph of its own)."""
    needs_fla()
    from k3lab.registry import TrainSpec
    from k3lab.runner.train.trainer import Trainer

    config = gpu_config(kda_implementation="fused", vocab_size=320)
    spec = TrainSpec(steps=8, batch_size=2, seq_len=256, warmup_steps=2, compile=True, eval_batches=2)
    reused = Trainer(config, spec, seed=0)
    for _ in range(4):
        reused.train_step()
    graph = reused.graphed.graph
    assert graph is not None
    reused.restart(1)
    fresh = Trainer(config, spec, seed=1)
    runs = {name: [trainer.train_step()["train_loss"].item() for _ in range(6)] + [trainer.evaluate()["val_loss"]]
            for name, trainer in (("fresh", fresh), ("reused", reused))}
    print(f"{'restarted vs new losses':>28}: {runs['reused']} vs {runs['fresh']}")
    assert reused.graphed.graph is graph and reused.eager_steps == 2  # no step of the new seed ran eagerly
    torch.testing.assert_close(torch.tensor(runs["reused"]), torch.tensor(runs["fresh"]), rtol=2e-3, atol=2e-3)


@gpu
def test_a_deterministic_trainer_repeats_its_losses_to_the_last_bit(isolated_data, restores_determinism, fresh_compiler):
    """train.deterministic: two trainers of one seed (compiled blocks, CUDA graph) give the same
    losses bit for bit (without it, on an H200 at the gpu profile's shape, cuDNN's attention
    backward in the MLA layers differs from run to run: bench/determinism.py)."""
    needs_fla()
    from k3lab.registry import TrainSpec
    from k3lab.runner.train.trainer import Trainer

    config = gpu_config(kda_implementation="fused", vocab_size=320)
    spec = TrainSpec(steps=12, batch_size=2, seq_len=256, warmup_steps=2, compile=True, deterministic=True)
    runs = []
    for _ in range(2):
        trainer = Trainer(config, spec, seed=0)
        runs.append([trainer.train_step()["train_loss"].item() for _ in range(10)])
    assert runs[0] == runs[1]


@gpu
def test_evaluation_of_a_compiled_trainer_equals_eager_evaluation(isolated_data, fresh_compiler):
    """Compiled no-grad forwards of the fused model were wrong on an H200 (val 3.5 vs 1.0):
    evaluation runs the compiled blocks eagerly, and must give the eager trainer's value."""
    needs_fla()
    from k3lab.registry import TrainSpec
    from k3lab.runner.train.trainer import Trainer

    config = gpu_config(kda_implementation="fused", vocab_size=320)
    trainers = [Trainer(config, TrainSpec(steps=4, batch_size=2, seq_len=256, warmup_steps=1, compile=compiled,
                                          eval_batches=2), seed=0) for compiled in (False, True)]
    trainers[1].model.load_state_dict(trainers[0].model.state_dict())
    eager, compiled = (t.evaluate()["val_loss"] for t in trainers)
    assert abs(compiled - eager) < 1e-2 * eager
