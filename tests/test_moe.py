import pytest
import torch

from k3lab.model.config import tiny_config
from k3lab.model.ffn import situ_glu
from k3lab.model.moe import StableLatentMoE, balance_biases


def make_moe(**overrides):
    settings = dict(num_experts=8, num_experts_per_token=2, moe_bias_update_rate=0.05)
    settings.update(overrides)
    return StableLatentMoE(tiny_config(**settings))


def init(moe):
    for p in moe.parameters():
        if p.ndim >= 2:  # Linear weights and the experts' (E, out, in) stacks
            torch.nn.init.normal_(p, std=0.2)
    return moe


def test_every_token_gets_exactly_k_distinct_experts():
    moe = init(make_moe(num_experts_per_token=3))
    indices, weights = moe.route(torch.randn(50, 64))
    assert indices.shape == (50, 3)
    assert all(len(set(row.tolist())) == 3 for row in indices)


@pytest.mark.parametrize("k", [1, 2, 3, 8])
def test_selection_is_torch_topk_of_the_biased_scores_best_first(k):
    moe = make_moe(num_experts_per_token=k) if k < 8 else make_moe(num_experts=16, num_experts_per_token=k)
    torch.nn.init.normal_(moe.expert_bias, std=0.1)
    scores = torch.rand(500, moe.num_experts)
    assert torch.equal(moe.select(scores), torch.topk(scores + moe.expert_bias, k, dim=-1).indices)


def test_tied_scores_go_to_the_lower_expert():
    moe = make_moe(num_experts_per_token=3)
    scores = torch.tensor([[0.5, 0.9, 0.5, 0.9, 0.1, 0.5, 0.2, 0.0]])
    assert moe.select(scores).tolist() == [[1, 3, 0]]


def test_selection_follows_the_bias_but_weights_do_not():
    moe = init(make_moe())
    x = torch.randn(40, 64)
    _, weights_before = moe.route(x)
    moe.expert_bias[5] = 10.0  # expert 5 now always wins a slot
    indices, weights = moe.route(x)
    assert (indices == 5).any(dim=-1).all()
    scores = torch.sigmoid(x @ moe.router.weight.T)
    expected = scores.gather(-1, indices)
    torch.testing.assert_close(weights, expected / expected.sum(-1, keepdim=True))


def test_weights_are_renormalised_and_scaled():
    moe = init(make_moe(routed_scaling_factor=2.5))
    _, weights = moe.route(torch.randn(30, 64))
    torch.testing.assert_close(weights.sum(-1), torch.full((30,), 2.5))


def test_single_expert_weight_is_the_raw_sigmoid_score():
    moe = init(make_moe(num_experts_per_token=1))
    x = torch.randn(10, 64)
    indices, weights = moe.route(x)
    scores = torch.sigmoid(x @ moe.router.weight.T)
    torch.testing.assert_close(weights, scores.gather(-1, indices))


def test_bias_receives_no_gradient():
    moe = init(make_moe())
    moe(torch.randn(2, 5, 64)).sum().backward()
    assert not moe.expert_bias.requires_grad
    assert moe.router.weight.grad is not None


def test_forward_matches_a_per_token_loop():
    moe = init(make_moe())
    x = torch.randn(1, 12, 64)
    flat = x.view(12, 64)
    indices, weights = moe.route(flat)
    z = moe.down(flat)
    experts = moe.experts
    expected = []
    for t in range(12):
        y = torch.zeros(z.shape[1])
        for j in range(2):
            e = indices[t, j]
            h = situ_glu(z[t] @ experts.w_gate[e].T, z[t] @ experts.w_up[e].T)
            y = y + weights[t, j] * (h @ experts.w_down[e].T)
        expected.append(y)
    y = moe.up(moe.latent_norm(torch.stack(expected))) + moe.shared[0](flat)
    torch.testing.assert_close(moe(x).view(12, 64), y, atol=1e-5, rtol=1e-5)


def test_plain_moe_without_latent_projection():
    moe = init(make_moe(moe_latent_size=None))
    assert moe.down is None and moe.experts.w_gate[0].shape[1] == 64
    assert moe(torch.randn(2, 3, 64)).shape == (2, 3, 64)


def skewed_load_after_balancing(rule, rate, steps):
    torch.manual_seed(1)
    moe = init(make_moe(moe_balance=rule, moe_bias_update_rate=rate)).train()
    with torch.no_grad():
        moe.router.weight[0] += 0.5  # skew: expert 0 scores high for most tokens
        moe.router.weight[1] += 0.3
    x = torch.randn(512, 64).abs()
    moe.route(x)
    initial = balance_biases([moe])[0]
    for _ in range(steps):
        moe.route(x)
        final = balance_biases([moe])[0]
    return initial, final


def test_sign_rule_moves_load_toward_uniform():
    initial, final = skewed_load_after_balancing("sign", rate=0.02, steps=150)
    assert initial.max() > 0.3  # really skewed
    assert final.max() - final.min() < 0.5 * (initial.max() - initial.min())


def test_quantile_rule_moves_load_toward_uniform():
    initial, final = skewed_load_after_balancing("quantile", rate=0.5, steps=20)
    assert initial.max() > 0.3
    assert final.max() - final.min() < 0.5 * (initial.max() - initial.min())


def test_load_is_counted_only_in_training_mode():
    moe = init(make_moe()).eval()
    moe(torch.randn(1, 4, 64))
    assert moe.load_counts.sum() == 0
    moe.train()(torch.randn(1, 4, 64))
    assert moe.load_counts.sum() == 4 * 2
    torch.testing.assert_close(balance_biases([moe])[0].sum(), torch.tensor(1.0))  # the load fraction it balanced


@pytest.mark.parametrize("rule", ["sign", "quantile"])
def test_balancing_all_layers_at_once_moves_each_bias_as_one_layer_at_a_time(rule):
    """`balance_biases` over stacked layers: each layer's bias moves by its own load (a layer
    without load not at all), as the per-layer formula gives, and every count is reset."""
    torch.manual_seed(0)
    layers = [make_moe(moe_balance=rule, moe_bias_update_rate=0.3) for _ in range(3)]
    for i, layer in enumerate(layers):
        layer.load_counts.copy_(torch.rand(8) * 100 * (i != 1))  # layer 1 saw no tokens
        layer.score_quantiles.copy_(torch.randn(8))
        layer.expert_bias.copy_(torch.randn(8))
    want_loads, want_biases = [], []
    for layer in layers:  # the formulas of the module docstring, one layer at a time
        load = layer.load_counts / layer.load_counts.sum().clamp(min=1)
        if rule == "sign":
            step = 0.3 * torch.sign(load.mean() - load)
        else:
            step = 0.3 * (-(layer.score_quantiles - layer.score_quantiles.mean()) - layer.expert_bias)
        want_loads.append(load)
        want_biases.append(layer.expert_bias + step * (layer.load_counts.sum() > 0))
    loads = balance_biases(layers)
    for layer, load, want_load, want_bias in zip(layers, loads, want_loads, want_biases):
        torch.testing.assert_close(load, want_load)
        torch.testing.assert_close(layer.expert_bias, want_bias)
        assert not layer.load_counts.any()
    torch.testing.assert_close(layers[1].expert_bias, want_biases[1])  # unchanged: no load


def test_balancing_refuses_layers_of_different_rules():
    with pytest.raises(ValueError, match="one balancing rule"):
        balance_biases([make_moe(moe_balance="sign"), make_moe(moe_balance="quantile")])
