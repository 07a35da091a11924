"""Stable LatentMoE: sigmoid routing with a selection-only bias, SiTU-GLU experts in a latent width.

    s = sigmoid(x W_r^T)                         (N, E), fp32
    selected = top-k(s + b)                      b: per-expert bias, never trained by gradients
    p = s[selected] / sum(s[selected]) * rsf     unbiased weights (renormalised when k > 1)
    z = down(x)                                  (N, l), latent width l < M
    y = up(RMSNorm(sum_i p_i E_i(z))) + sum_j Shared_j(x)

Routed tokens are dispatched by sorting (token, expert) pairs by expert and running each
expert on its contiguous group: the Python loop is over experts, never over tokens.
The bias b is moved outside autograd by `update_bias()` to balance load.
"""

from __future__ import annotations

import torch
from torch import nn

from k3lab.model.config import KimiK3Config
from k3lab.model.ffn import DenseFFN, situ_glu
from k3lab.model.norm import RMSNorm


class RoutedExperts(nn.Module):
    """E SiTU-GLU experts of width d -> I -> d, one 2-D matrix each (so Muon can take them)."""

    def __init__(self, num_experts: int, dim: int, intermediate: int, beta: float, linear_beta: float):
        super().__init__()
        self.w_gate = nn.ParameterList(nn.Parameter(torch.empty(intermediate, dim)) for _ in range(num_experts))
        self.w_up = nn.ParameterList(nn.Parameter(torch.empty(intermediate, dim)) for _ in range(num_experts))
        self.w_down = nn.ParameterList(nn.Parameter(torch.empty(dim, intermediate)) for _ in range(num_experts))
        self.beta, self.linear_beta = beta, linear_beta

    def forward(self, x_sorted: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        """x_sorted (n, d): token copies grouped by expert; counts (E,): group sizes. -> (n, d)."""
        outputs = []
        for e, x_e in enumerate(torch.split(x_sorted, counts.tolist())):
            if x_e.shape[0] == 0:
                continue
            h = situ_glu(x_e @ self.w_gate[e].T, x_e @ self.w_up[e].T, self.beta, self.linear_beta)
            outputs.append(h @ self.w_down[e].T)
        return torch.cat(outputs) if outputs else x_sorted.new_zeros(0, x_sorted.shape[1])


class StableLatentMoE(nn.Module):
    """(B, T, M) -> (B, T, M). See the module docstring for the equations."""

    def __init__(self, config: KimiK3Config):
        super().__init__()
        M, E = config.hidden_size, config.num_experts
        self.num_experts, self.top_k = E, config.num_experts_per_token
        self.routed_scaling_factor = config.routed_scaling_factor
        self.balance_rule, self.bias_update_rate = config.moe_balance, config.moe_bias_update_rate
        self.router = nn.Linear(M, E, bias=False)
        latent = config.moe_latent_size
        if latent is None:  # plain MoE: experts at full width
            self.down = self.up = self.latent_norm = None
            expert_dim = M
        else:
            self.down = nn.Linear(M, latent, bias=False)
            self.latent_norm = RMSNorm(latent, config.rms_norm_eps)
            self.up = nn.Linear(latent, M, bias=False)
            expert_dim = latent
        self.experts = RoutedExperts(E, expert_dim, config.moe_intermediate_size,
                                     config.situ_beta, config.situ_linear_beta)
        self.shared = nn.ModuleList(
            DenseFFN(M, config.moe_intermediate_size, config.situ_beta, config.situ_linear_beta)
            for _ in range(config.num_shared_experts)
        )
        # selection bias and load statistics: buffers, so they checkpoint but never get gradients
        self.register_buffer("expert_bias", torch.zeros(E))
        self.register_buffer("load_counts", torch.zeros(E))  # selections since the last bias update
        self.register_buffer("score_quantiles", torch.zeros(E))  # quantile rule's running statistic

    def route(self, x: torch.Tensor):
        """x (N, M) -> expert indices (N, k) and mixture weights (N, k) in fp32."""
        with torch.autocast(x.device.type, enabled=False):
            scores = torch.sigmoid(x.float() @ self.router.weight.float().T)  # (N, E)
        _, indices = torch.topk(scores + self.expert_bias, self.top_k, dim=-1)
        weights = scores.gather(-1, indices)
        if self.top_k > 1:
            weights = weights / weights.sum(-1, keepdim=True)
        if self.training:
            self.record_load(scores.detach(), indices)
        return indices, weights * self.routed_scaling_factor

    @torch.no_grad()
    def record_load(self, scores: torch.Tensor, indices: torch.Tensor) -> None:
        self.load_counts += torch.bincount(indices.flatten(), minlength=self.num_experts).float()
        if self.balance_rule == "quantile":
            q = 1.0 - self.top_k / self.num_experts
            self.score_quantiles.copy_(torch.quantile(scores, q, dim=0))

    def dispatch(self, z: torch.Tensor, indices: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """Sort (token, expert) pairs by expert, run each expert once, scatter back: (N, d) -> (N, d)."""
        N, k = indices.shape
        flat_expert = indices.flatten()  # (N*k,)
        order = torch.argsort(flat_expert, stable=True)
        token_of_pair = order // k
        counts = torch.bincount(flat_expert, minlength=self.num_experts)
        expert_out = self.experts(z[token_of_pair], counts)  # (N*k, d), grouped by expert
        weighted = expert_out * weights.flatten()[order].unsqueeze(-1).to(expert_out.dtype)
        return torch.zeros_like(z).index_add_(0, token_of_pair, weighted)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, M = x.shape
        flat = x.reshape(B * T, M)
        indices, weights = self.route(flat)
        z = flat if self.down is None else self.down(flat)
        y = self.dispatch(z, indices, weights)
        if self.up is not None:
            y = self.up(self.latent_norm(y))
        for expert in self.shared:
            y = y + expert(flat)
        return y.view(B, T, M)

    # -- load balancing, outside autograd --------------------------------------------

    def load_fraction(self) -> torch.Tensor:
        """Share of routed selections per expert since the last update: (E,), sums to 1."""
        return self.load_counts / self.load_counts.sum().clamp(min=1)

    @torch.no_grad()
    def update_bias(self) -> torch.Tensor:
        """Move the selection bias toward balanced load; returns the load fraction it used.

        "sign" (DeepSeek-V3): b_i += rate * sign(mean_load - load_i).
        "quantile" (k3lab's reading of quantile balancing): set b so that every expert's
        (1 - k/E) score quantile -- the score it needs to win its fair share of tokens --
        sits at the same level, b_i = -(q_i - mean(q)), moved there at `rate` per update
        (rate 1 jumps there at once).
        """
        load = self.load_fraction()
        if self.load_counts.sum() > 0:
            if self.balance_rule == "sign":
                self.expert_bias += self.bias_update_rate * torch.sign(load.mean() - load)
            else:
                target = -(self.score_quantiles - self.score_quantiles.mean())
                self.expert_bias += min(1.0, self.bias_update_rate) * (target - self.expert_bias)
        self.load_counts.zero_()
        return load
