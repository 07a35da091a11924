import contextlib
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

from k3lab.model.config import tiny_config
from k3lab.model.counting import COMPONENTS, attn_res_candidates, count_config, count_parameters
from k3lab.model.ffn import DenseFFN
from k3lab.model.inference import generate
from k3lab.model.kda import KDAChunkwise
from k3lab.model.mla import GatedMLA
from k3lab.model.model import KimiK3
from k3lab.model.moe import StableLatentMoE
from k3lab.model.norm import RMSNorm
from k3lab.optim.assignment import build_optimizers, split_parameters
from k3lab.ops.attn_res import naive
from k3lab.ops.attn_res.naive import apply_attn_res


@pytest.fixture
def model():
    return KimiK3(tiny_config())


def tokens(B=2, T=16, vocab=320):
    return torch.randint(0, vocab, (B, T))


# -- the seed's verification list ------------------------------------------------------

def test_forward_returns_logits_and_mean_cross_entropy(model):
    idx, targets = tokens(), tokens()
    logits, loss = model(idx, targets)
    assert logits.shape == (2, 16, 320)
    torch.testing.assert_close(loss, F.cross_entropy(logits.view(-1, 320), targets.view(-1)))


def test_forward_without_targets_has_no_loss(model):
    logits, loss = model(tokens())
    assert logits.shape == (2, 16, 320) and loss is None


def test_sequence_longer_than_max_seq_len_is_rejected(model):
    with pytest.raises(ValueError, match="exceeds max_seq_len=64"):
        model(tokens(T=72))


def test_layer_schedule_picks_attention_and_ffn(model):
    config = model.config
    for i, layer in enumerate(model.layers):
        expected_attn = KDAChunkwise if config.layer_types[i] == "kda" else GatedMLA
        assert isinstance(layer.attn, expected_attn)
        assert isinstance(layer.ffn, DenseFFN if i < config.num_dense_layers else StableLatentMoE)


def test_embedding_and_head_share_one_parameter(model):
    assert model.lm_head.weight is model.embed_tokens.weight
    assert sum(p is model.embed_tokens.weight for p in model.parameters()) == 1


def test_every_parameter_gets_a_gradient(model):
    _, loss = model(tokens(), tokens())
    loss.backward()
    missing = [n for n, p in model.named_parameters() if p.grad is None or not torch.isfinite(p.grad).all()]
    assert missing == []


def test_a_small_update_lowers_the_loss_on_the_same_batch(model):
    idx, targets = tokens(), tokens()
    _, before = model(idx, targets)
    before.backward()
    with torch.no_grad():
        for p in model.parameters():
            p -= 0.05 * p.grad
    _, after = model(idx, targets)
    assert after < before


def test_model_is_causal(model):
    idx = tokens()
    logits, _ = model(idx)
    idx2 = idx.clone()
    idx2[:, 9:] = (idx2[:, 9:] + 1) % 320
    logits2, _ = model(idx2)
    torch.testing.assert_close(logits[:, :9], logits2[:, :9], atol=1e-5, rtol=1e-5)
    assert not torch.allclose(logits[:, 9:], logits2[:, 9:])


def test_no_state_survives_between_forward_calls(model):
    idx = tokens()
    first, _ = model(idx)
    model(tokens())
    second, _ = model(idx)
    torch.testing.assert_close(first, second)


# -- Attention Residuals ---------------------------------------------------------------

def test_apply_attn_res_matches_closed_form():
    BT, P, M = 5, 3, 8
    block_residual, prefix = torch.randn(BT, P, M), torch.randn(BT, M)
    norm, proj = RMSNorm(M), torch.nn.Linear(M, 1, bias=False)
    torch.nn.init.normal_(proj.weight)
    torch.nn.init.normal_(norm.weight)
    V = torch.cat([block_residual, prefix[:, None]], dim=1)
    rms = V * torch.rsqrt(V.pow(2).mean(-1, keepdim=True) + 1e-6) * norm.weight
    weights = torch.softmax((rms * proj.weight[0]).sum(-1), dim=-1)
    expected = (weights[..., None] * V).sum(1)
    torch.testing.assert_close(apply_attn_res(block_residual, prefix, norm, proj), expected)


def test_zero_initialised_scorer_gives_the_uniform_mixture():
    block_residual, prefix = torch.randn(4, 2, 8), torch.randn(4, 8)
    proj = torch.nn.Linear(8, 1, bias=False)
    torch.nn.init.zeros_(proj.weight)
    h = apply_attn_res(block_residual, prefix, RMSNorm(8), proj)
    torch.testing.assert_close(h, (block_residual.sum(1) + prefix) / 3)


def test_attn_res_scorers_start_at_zero(model):
    scorers = [p for n, p in model.named_parameters() if n.endswith("res_proj.weight")]
    assert len(scorers) == 2 * len(model.layers)  # layer 0's attention has no scorer
    assert all((p == 0).all() for p in scorers)


def test_four_layer_block_size_two_trace_matches_the_seed(monkeypatch):
    """Which depth candidates each AttnRes call sees, in order (the seed's worked example)."""
    model = KimiK3(tiny_config(num_layers=4, attn_res_block_size=2))
    for p in model.parameters():  # non-zero scorers so every mixture is distinct
        if p.ndim == 2 and p.shape[0] == 1:
            torch.nn.init.normal_(p)
    calls = []
    original = naive.attn_res_mixture

    def recording(block_residual, prefix_sum, norm, proj):
        calls.append(torch.cat([block_residual, prefix_sum.unsqueeze(1)], dim=1).detach())
        return original(block_residual, prefix_sum, norm, proj)

    monkeypatch.setattr(naive, "attn_res_mixture", recording)
    out = {}
    for i, layer in enumerate(model.layers):
        layer.attn.register_forward_hook(lambda m, a, o, i=i: out.__setitem__(f"a{i}", o.detach()))
        layer.ffn.register_forward_hook(lambda m, a, o, i=i: out.__setitem__(f"f{i}", o.detach()))
    idx = tokens(B=1, T=8)
    model(idx)
    flat = lambda t: t.reshape(8, -1)  # noqa: E731
    emb = flat(model.embed_tokens(idx).detach())
    a = [flat(out[f"a{i}"]) for i in range(4)]
    f = [flat(out[f"f{i}"]) for i in range(4)]
    block0 = a[0] + f[0] + a[1] + f[1]
    expected = [
        [emb, a[0]],                                     # layer 0 FFN (layer 0 attention: no endpoints yet)
        [emb, a[0] + f[0]],                              # layer 1 attention
        [emb, a[0] + f[0] + a[1]],                       # layer 1 FFN
        [emb, block0],                                   # layer 2 attention, before the boundary
        [emb, block0, a[2]],                             # layer 2 FFN, block-0 prefix now stored
        [emb, block0, a[2] + f[2]],                      # layer 3 attention
        [emb, block0, a[2] + f[2] + a[3]],               # layer 3 FFN
        [emb, block0, a[2] + f[2] + a[3] + f[3]],        # final model-level mixture
    ]
    assert len(calls) == len(expected)
    for call, candidates in zip(calls, expected):
        torch.testing.assert_close(call, torch.stack(candidates, dim=1), atol=1e-5, rtol=1e-5)


def test_attn_res_off_is_the_standard_prenorm_residual():
    model = KimiK3(tiny_config(use_attn_res=False))
    assert not any("res_" in n for n, _ in model.named_parameters())
    x = torch.randn(1, 8, 64)
    layer = model.layers[0]
    expected = x + layer.attn(layer.attn_norm(x))
    expected = expected + layer.ffn(layer.ffn_norm(expected))
    y, residual = layer(x, x.new_zeros(8, 0, 64))
    torch.testing.assert_close(y, expected)
    assert residual.shape[1] == 0


def test_attn_res_weights_are_recorded_per_layer(model):
    model(tokens())
    weights = model.layers[2].attn_res_weights
    assert set(weights) == {"attn", "ffn"}
    torch.testing.assert_close(weights["ffn"].sum(), torch.tensor(1.0))


# -- imports, counting, generation, optimizer --------------------------------------------

def test_chunkwise_model_imports_neither_fla_nor_triton():
    code = (
        "import sys, torch; before = set(sys.modules);"
        "from k3lab.model.config import tiny_config; from k3lab.model.model import KimiK3;"
        "m = KimiK3(tiny_config()); m(torch.zeros(1, 8, dtype=torch.long));"
        "new = set(sys.modules) - before;"
        "print(sorted(n for n in new if n.split('.')[0] in ('fla', 'triton')))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"


def test_parameter_counts_add_up(model):
    counts = count_parameters(model)
    unique_total = sum(p.numel() for p in model.parameters())
    assert counts["total"] == unique_total
    assert sum(counts["by_component"].values()) == unique_total
    assert set(COMPONENTS) <= set(counts["by_component"])
    assert counts["embedding"] == 320 * 64  # tied: counted once
    assert counts["non_embedding"] == unique_total - 320 * 64
    config = model.config
    routed = counts["by_component"]["moe_routed"]
    inactive = routed * (1 - config.num_experts_per_token / config.num_experts)
    assert counts["active"] == round(unique_total - inactive)
    assert counts["flops_per_token"] > 6 * counts["active_matmul"]


@pytest.mark.parametrize("block_size", [1, 2, 3])
def test_attn_res_mixing_is_counted_with_the_candidates_each_site_of_a_forward_mixes(block_size):
    """The FLOPs count charges 12 K M per mixing site; K per site is what a forward mixes (each
    block's logged mixture weights have one entry per candidate), and without AttnRes nothing."""
    
    config = tiny_config().replace(attn_res_block_size=block_size)
    built = KimiK3(config)
    built(tokens())
    mixed = [len(block.attn_res_weights[site]) for block in built.layers for site in ("attn", "ffn")
             if site in block.attn_res_weights]
    assert attn_res_candidates(config) == mixed and len(mixed) == 2 * config.num_layers - 1
    off = config.replace(use_attn_res=False)
    with_mixing, without = count_config(config), count_config(off)
    assert with_mixing["flops_per_token"] - 6 * with_mixing["active_matmul"] - (
        without["flops_per_token"] - 6 * without["active_matmul"]) == 12 * config.hidden_size * sum(mixed)


def test_count_config_matches_a_built_model(model):
    assert count_config(model.config) == count_parameters(model)


def test_generate_appends_tokens_for_any_prompt_length(model):
    for prompt_len in (1, 5, 8, 13):
        out = generate(model, tokens(B=2, T=prompt_len), max_new_tokens=3, top_k=5)
        assert out.shape == (2, prompt_len + 3)
        assert out.min() >= 0 and out.max() < 320


def test_generate_greedy_matches_the_full_forward(model):
    prompt = tokens(B=1, T=5)
    out = generate(model, prompt, max_new_tokens=1, temperature=0)
    padded = F.pad(prompt, (0, 3))
    logits, _ = model(padded)
    assert out[0, -1] == logits[0, 4].argmax()


def test_generate_crops_the_context_to_max_seq_len(model):
    out = generate(model, tokens(B=1, T=60), max_new_tokens=10)
    assert out.shape == (1, 70)  # the model would reject a 70-token input: generation cropped


def test_optimizer_assigns_every_parameter_exactly_once(model):
    muon, adamw = split_parameters(model)
    names = [n for n, _ in muon] + [n for n, _ in adamw]
    assert len(names) == len(set(names)) == len(list(model.parameters()))
    assert all(p.ndim == 2 or (p.ndim == 3 and ".experts.w_" in n) for n, p in muon)
    adamw_names = {n for n, _ in adamw}
    assert "embed_tokens.weight" in adamw_names
    assert {n for n in names if n.endswith("res_proj.weight")} <= adamw_names
    assert {n for n in names if n.endswith("A_log") or n.endswith("dt_bias") or "norm" in n} <= adamw_names
    assert any(".experts.w_gate" in n for n, _ in muon)


def test_a_few_optimizer_steps_lower_the_loss(model):
    idx = tokens(B=4, T=16)
    targets = torch.roll(idx, -1, dims=1)
    optimizers = build_optimizers(model, lr=3e-3)
    losses = []
    for _ in range(15):
        _, loss = model(idx, targets)
        loss.backward()
        for opt in optimizers:
            opt.step()
            opt.zero_grad(set_to_none=True)
        model.update_moe_biases()
        losses.append(loss.item())
    assert losses[-1] < losses[0] - 0.5


def test_attn_res_stream_stays_fp32_under_bf16_autocast(model):
    """AttnRes and the pre-norm baseline must accumulate the residual stream alike (fp32)."""
    for config in (model.config, model.config.replace(use_attn_res=False)):
        net = KimiK3(config)
        dtypes = []
        for layer in net.layers:
            layer.register_forward_hook(lambda m, a, out: dtypes.append(out[0].dtype))
        with torch.autocast("cpu", dtype=torch.bfloat16):
            net(tokens())
        assert dtypes == [torch.float32] * len(net.layers)


def test_residual_in_fp32_false_keeps_the_stream_in_bf16_under_autocast_only(model):
    """The FLA-style bf16 stream: every layer hands on bf16 under autocast, and without
    autocast the switch changes nothing (same weights, bitwise the same logits)."""
    for config in (model.config, model.config.replace(use_attn_res=False)):
        fp32_stream = KimiK3(config)
        bf16_stream = KimiK3(config.replace(residual_in_fp32=False))
        bf16_stream.load_state_dict(fp32_stream.state_dict())
        dtypes = []
        for layer in bf16_stream.layers:
            layer.register_forward_hook(lambda m, a, out: dtypes.append(out[0].dtype))
        idx = tokens()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            _, loss_bf16 = bf16_stream(idx, idx)
            _, loss_fp32 = fp32_stream(idx, idx)
        assert dtypes == [torch.bfloat16] * len(bf16_stream.layers)
        assert abs(loss_bf16.item() - loss_fp32.item()) < 0.02 * loss_fp32.item()
        assert torch.equal(bf16_stream(idx)[0], fp32_stream(idx)[0])


def test_moe_balancing_buffers_stay_fp32_in_a_bf16_model():
    model = KimiK3(tiny_config()).to(torch.bfloat16)
    moe = model.layers[1].ffn
    assert moe.router.weight.dtype == torch.bfloat16
    assert {getattr(moe, n).dtype for n in moe.BALANCING_BUFFERS} == {torch.float32}


def test_generation_with_compiled_blocks_runs_them_eagerly(model):
    """Compiled no-grad forwards were wrong on the GPU: generate() must not use them."""
    from k3lab.model.inference import eager_if_compiled
    from k3lab.model.model import compile_blocks

    idx = tokens(B=1, T=6)
    expected = generate(model, idx, max_new_tokens=4, temperature=0)
    assert isinstance(eager_if_compiled(model), contextlib.nullcontext)
    compile_blocks(model)
    stance = eager_if_compiled(model)  # torch.compiler.set_stance acts when called ...
    with stance:  # ... and restores the stance before it on leaving
        assert not isinstance(stance, contextlib.nullcontext)
    assert torch._dynamo.eval_frame._stance.stance == "default"  # later tests compile again
    assert torch.equal(generate(model, idx, max_new_tokens=4, temperature=0), expected)
