"""The KDA layer around the op (`k3lab.model.kda`): its decay gate, initialisation and causality; the op itself: tests/test_ops_kda.py."""

import torch
import torch.nn.functional as F

from k3lab.model.config import tiny_config
from k3lab.model.kda import KDAChunkwise, decay_gate


def test_bounded_gate_stays_within_its_lower_bound():
    f = torch.randn(2, 8, 3, 4) * 10
    A_log, dt_bias = torch.randn(3), torch.randn(12)
    g = decay_gate(f, A_log, dt_bias, lower_bound=-5.0)
    assert (g >= -5.0).all() and (g < 0).all()
    expected = -5.0 * torch.sigmoid(A_log.exp().view(3, 1) * (f + dt_bias.view(3, 4)))
    torch.testing.assert_close(g, expected)


def test_unbounded_gate_is_minus_exp_a_times_softplus():
    f = torch.randn(2, 8, 3, 4)
    A_log, dt_bias = torch.randn(3), torch.randn(12)
    g = decay_gate(f, A_log, dt_bias, lower_bound=None)
    torch.testing.assert_close(g, -A_log.exp().view(3, 1) * F.softplus(f + dt_bias.view(3, 4)))


def test_kda_layer_initialises_decay_parameters_in_their_documented_ranges():
    layer = KDAChunkwise(tiny_config(kda_num_heads=64))
    assert (layer.A_log.exp() >= 1).all() and (layer.A_log.exp() <= 16).all()
    dt = F.softplus(layer.dt_bias)
    assert (dt >= 1e-3 * 0.999).all() and (dt <= 0.1 * 1.001).all()


def test_kda_layer_is_causal():
    layer = KDAChunkwise(tiny_config())
    x = torch.randn(1, 16, 64)
    y = layer(x)
    x2 = x.clone()
    x2[:, 10:] = torch.randn(1, 6, 64)
    y2 = layer(x2)
    torch.testing.assert_close(y[:, :10], y2[:, :10])
    assert not torch.allclose(y[:, 10:], y2[:, 10:])
