"""Stable LatentMoE: sigmoid routing with a selection-only bias, SiTU-GLU experts in a latent width.

    s = sigmoid(x W_r^T)                         (N, E), fp32
    selected = top-k(s + b)                      b: per-expert bias, never trained by gradients
    p = s[selected] / sum(s[selected]) * rsf     unbiased weights (renormalised when k > 1)
    z = down(x)                                  (N, l), latent width l < M
    y = up(RMSNorm(sum_i p_i E_i(z))) + sum_j Shared_j(x)

Routed tokens are dispatched by sorting (token, expert) pairs by expert and running each
expert on its contiguous group. Two ways, same result:
- loop (CPU, reference): a Python loop over experts; `counts.tolist()` syncs with the device.
- grouped (CUDA with bf16 compute): the pairs go into a buffer whose expert groups are
  padded to multiples of GROUP_ALIGN rows, and each expert matrix is one grouped GEMM
  over all experts (`torch._grouped_mm`, offsets = cumulative group ends, int32). Every
  shape is static and nothing is read back to the host.
The bias b is moved outside autograd by `balance_biases` to balance load.
"""

from __future__ import annotations

import torch
from torch import nn

from k3lab.model.config import KimiK3Config
from k3lab.model.ffn import DenseFFN, glu
from k3lab.model.norm import RMSNorm

# Expert groups start at multiples of this many rows: 16-byte aligned bf16 rows for the
# grouped GEMM's TMA loads (torchtitan pads bf16 groups to 8; PyTorch's tests use 16).
GROUP_ALIGN = 16
DISPATCH_MODES = ("auto", "loop", "grouped")


def grouped_mm(a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    """Rows of group g of a (R, K) times b[g] (K, N) -> (R, N); group g ends at row offs[g].

    CUDA: `torch._grouped_mm` (bf16, SM90+). Elsewhere: `grouped_mm_reference`.
    """
    if a.is_cuda:
        return torch._grouped_mm(a, b, offs=offs)
    return grouped_mm_reference(a, b, offs)


def grouped_mm_reference(a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    """`torch._grouped_mm(a, b, offs)` as a loop of plain matmuls (reads offs on the host)."""
    ends = offs.tolist()
    starts = [0] + ends[:-1]
    return torch.cat([a[s:e] @ b[g] for g, (s, e) in enumerate(zip(starts, ends))])


def grouped_layout(flat_expert: torch.Tensor, num_experts: int, align: int = GROUP_ALIGN):
    """Where each (token, expert) pair goes in a buffer grouped by expert, without host syncs.

    flat_expert (P,) expert of each pair. Returns
      pos  (P,)  row of each pair; pairs keep their order within a group,
      offs (E,)  int32 cumulative group ends; every group starts at a multiple of align,
                 and the last group is stretched to end at R,
      R          the static buffer length, P + E*(align-1) rounded up to align.
    Rows not named by pos are padding.
    """
    P, E = flat_expert.numel(), num_experts
    counts = torch.zeros(E, dtype=torch.long, device=flat_expert.device)
    counts.scatter_add_(0, flat_expert, torch.ones_like(flat_expert))  # bincount would sync on CUDA
    padded = (counts + align - 1) // align * align
    group_start = padded.cumsum(0) - padded  # (E,)
    narrow = torch.uint8 if E <= 256 else torch.int32  # a radix sort makes one pass per key byte: 1 or 4, not 8
    order = torch.argsort(flat_expert.to(narrow), stable=True)  # stable: the same order whatever the key type
    sorted_expert = flat_expert[order]
    rank = torch.arange(P, device=flat_expert.device) - (counts.cumsum(0) - counts)[sorted_expert]
    pos = torch.empty_like(order)
    pos[order] = group_start[sorted_expert] + rank
    R = -(-(P + E * (align - 1)) // align) * align
    ends = (group_start + padded)[:-1]  # the last group is stretched to R below
    offs = torch.cat([ends, ends.new_full((1,), R)]).to(torch.int32)  # no item assignment: it would sync
    return pos, offs, R


class RoutedExperts(nn.Module):
    """E SiTU-GLU (or SwiGLU) experts of width d -> I -> d, stored stacked: one 3-D weight per projection.

    w_gate, w_up (E, I, d) and w_down (E, d, I): expert e's matrices are slices [e]. The
    grouped GEMM takes the stacks as they are (no per-step re-stacking), and Muon still
    orthogonalises each expert's matrix on its own (`k3lab.optim.muon`).
    """

    def __init__(self, num_experts: int, dim: int, intermediate: int, beta: float, linear_beta: float,
                 activation: str = "situ_glu"):
        super().__init__()
        self.w_gate = nn.Parameter(torch.empty(num_experts, intermediate, dim))
        self.w_up = nn.Parameter(torch.empty(num_experts, intermediate, dim))
        self.w_down = nn.Parameter(torch.empty(num_experts, dim, intermediate))
        self.beta, self.linear_beta, self.activation = beta, linear_beta, activation

    def forward(self, x_sorted: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        """x_sorted (n, d): token copies grouped by expert; counts (E,): group sizes. -> (n, d)."""
        outputs = []
        for e, x_e in enumerate(torch.split(x_sorted, counts.tolist())):
            if x_e.shape[0] == 0:
                continue
            h = glu(x_e @ self.w_gate[e].T, x_e @ self.w_up[e].T, self.activation, self.beta, self.linear_beta)
            outputs.append(h @ self.w_down[e].T)
        return torch.cat(outputs) if outputs else x_sorted.new_zeros(0, x_sorted.shape[1])

    def forward_grouped(self, x: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
        """x (R, d) rows grouped by expert, groups ending at offs (E,) -> (R, d), in x's dtype."""
        dtype = x.dtype
        gate = grouped_mm(x, self.w_gate.to(dtype).transpose(1, 2), offs)  # (R, I)
        up = grouped_mm(x, self.w_up.to(dtype).transpose(1, 2), offs)  # (R, I)
        h = glu(gate, up, self.activation, self.beta, self.linear_beta)
        return grouped_mm(h, self.w_down.to(dtype).transpose(1, 2), offs)  # (R, d)

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        """Checkpoints from before the stacking hold one 2-D matrix per expert
        (`w_gate.0`, `w_gate.1`, ...): stack them into the 3-D weights."""
        for name in ("w_gate", "w_up", "w_down"):
            per_expert = sorted((k for k in state_dict if k.startswith(f"{prefix}{name}.")),
                                key=lambda k: int(k.rsplit(".", 1)[1]))
            if per_expert and f"{prefix}{name}" not in state_dict:
                state_dict[f"{prefix}{name}"] = torch.stack([state_dict.pop(k) for k in per_expert])
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)


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
                                     config.situ_beta, config.situ_linear_beta, config.ffn_activation)
        self.shared = nn.ModuleList(
            DenseFFN(M, config.moe_intermediate_size, config.situ_beta, config.situ_linear_beta, config.ffn_activation)
            for _ in range(config.num_shared_experts)
        )
        # selection bias and load statistics: buffers, so they checkpoint but never get gradients
        self.register_buffer("expert_bias", torch.zeros(E))
        self.register_buffer("load_counts", torch.zeros(E))  # selections since the last bias update
        self.register_buffer("score_quantiles", torch.zeros(E))  # quantile rule's running statistic
        self.dispatch_mode = "auto"  # "auto": grouped on CUDA with bf16 compute, else loop

    BALANCING_BUFFERS = ("expert_bias", "load_counts", "score_quantiles")

    def _apply(self, fn, recurse=True):
        """`.to(bfloat16)` and friends move the balancing buffers but keep them fp32: a bias
        step of 1e-3 vanishes in bf16 once |b| > 0.25, and bf16 counts round above 256."""
        super()._apply(fn, recurse)
        for name in self.BALANCING_BUFFERS:
            self._buffers[name] = self._buffers[name].float()
        return self

    def route(self, x: torch.Tensor):
        """x (N, M) -> expert indices (N, k) and mixture weights (N, k) in fp32."""
        scores = self.router_scores(x)
        indices = self.select(scores)
        if self.training:
            self.record_load(scores.detach(), indices)
        return indices, self.mixture_weights(scores, indices)

    def router_scores(self, x: torch.Tensor) -> torch.Tensor:
        """s = sigmoid(x W_r^T) in fp32: (N, M) -> (N, E)."""
        with torch.autocast(x.device.type, enabled=False):
            return torch.sigmoid(x.float() @ self.router.weight.float().T)

    def select(self, scores: torch.Tensor) -> torch.Tensor:
        """top-k of s + b, best first, ties to the lower expert: (N, E) -> expert indices (N, k).

        k rounds of argmax, each masking the expert just picked: torch.compile fuses them and the
        bias add into one kernel, where torch.topk is a library kernel of its own
        (docs/journal/kernel-headroom.md).
        """
        biased = scores + self.expert_bias
        experts = torch.arange(biased.shape[-1], device=biased.device)
        picks = []
        for _ in range(self.top_k):
            pick = biased.argmax(dim=-1, keepdim=True)  # (N, 1)
            picks.append(pick)
            biased = biased.masked_fill(experts == pick, float("-inf"))
        return torch.cat(picks, dim=-1)

    def mixture_weights(self, scores: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
        """The selected unbiased scores, renormalised (k > 1), times the scaling factor: (N, k)."""
        weights = scores.gather(-1, indices)
        if self.top_k > 1:
            weights = weights / weights.sum(-1, keepdim=True)
        return weights * self.routed_scaling_factor

    @torch.no_grad()
    def record_load(self, scores: torch.Tensor, indices: torch.Tensor) -> None:
        flat = indices.flatten()
        self.load_counts.scatter_add_(0, flat, torch.ones_like(flat, dtype=self.load_counts.dtype))
        if self.balance_rule == "quantile":
            q = 1.0 - self.top_k / self.num_experts
            self.score_quantiles.copy_(torch.quantile(scores, q, dim=0))

    def dispatch(self, z: torch.Tensor, indices: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """sum_i p_i E_i(z) for each token: z (N, d), indices/weights (N, k) -> (N, d)."""
        if self.uses_grouped(z):
            return self.dispatch_grouped(z, indices, weights)
        return self.dispatch_loop(z, indices, weights)

    def uses_grouped(self, z: torch.Tensor) -> bool:
        if self.dispatch_mode not in DISPATCH_MODES:
            raise ValueError(f"dispatch_mode must be one of {DISPATCH_MODES}, got {self.dispatch_mode!r}")
        if self.dispatch_mode != "auto":
            return self.dispatch_mode == "grouped"
        return z.is_cuda and compute_dtype(z) == torch.bfloat16

    def dispatch_loop(self, z: torch.Tensor, indices: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """Sort (token, expert) pairs by expert, run each expert once, scatter back: (N, d) -> (N, d)."""
        N, k = indices.shape
        flat_expert = indices.flatten()  # (N*k,)
        order = torch.argsort(flat_expert, stable=True)
        token_of_pair = order // k
        counts = torch.bincount(flat_expert, minlength=self.num_experts)
        expert_out = self.experts(z[token_of_pair], counts)  # (N*k, d), grouped by expert
        weighted = expert_out * weights.flatten()[order].unsqueeze(-1).to(expert_out.dtype)
        return torch.zeros_like(z).index_add_(0, token_of_pair, weighted.to(z.dtype))  # autocast: bf16 into fp32 z

    def dispatch_grouped(self, z: torch.Tensor, indices: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """`dispatch_loop` as grouped GEMMs over a padded, expert-grouped buffer: (N, d) -> (N, d)."""
        N, k = indices.shape
        d = z.shape[1]
        pos, offs, R = grouped_layout(indices.flatten(), self.num_experts)
        row_token = torch.full((R,), N, dtype=torch.long, device=z.device)  # N: the zero row
        row_token[pos] = torch.arange(N * k, device=z.device) // k
        dtype = compute_dtype(z)
        z_padded = torch.cat([z.to(dtype), z.new_zeros(1, d, dtype=dtype)])[row_token]  # (R, d)
        out = self.experts.forward_grouped(z_padded, offs)[pos].view(N, k, d)  # back in (token, slot) order
        return (out.float() * weights.unsqueeze(-1)).sum(dim=1).to(z.dtype)

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


@torch.no_grad()
def balance_biases(layers: list[StableLatentMoE]) -> torch.Tensor:
    """Move every layer's selection bias toward balanced load; returns the load fractions used (L, E).

    "sign" (DeepSeek-V3): b_i += rate * sign(mean_load - load_i).
    "quantile" (k3lab's reading of quantile balancing): set b so that every expert's
    (1 - k/E) score quantile -- the score it needs to win its fair share of tokens --
    sits at the same level, b_i = -(q_i - mean(q)), moved there at `rate` per update
    (rate 1 jumps there at once).
    All layers in one set of stacked ops (layers of one rule and rate, as a model's are): the
    same arithmetic per layer as one at a time, in one set of kernel launches instead of one per
    layer, which a GPU step waits on the host for.
    """
    rules = {(layer.balance_rule, layer.bias_update_rate) for layer in layers}
    if len(rules) != 1:
        raise ValueError(f"balance_biases: layers of one balancing rule and rate, got {sorted(rules)}")
    rule, rate = rules.pop()
    counts = torch.stack([layer.load_counts for layer in layers])  # (L, E)
    totals = counts.sum(dim=1, keepdim=True)
    load = counts / totals.clamp(min=1)
    if rule == "sign":
        step = rate * torch.sign(load.mean(dim=1, keepdim=True) - load)
    else:
        quantiles = torch.stack([layer.score_quantiles for layer in layers])
        target = -(quantiles - quantiles.mean(dim=1, keepdim=True))
        step = min(1.0, rate) * (target - torch.stack([layer.expert_bias for layer in layers]))
    step = step * (totals > 0)  # no update without load; no host sync
    torch._foreach_add_([layer.expert_bias for layer in layers], list(step.unbind(0)))
    torch._foreach_zero_([layer.load_counts for layer in layers])
    return load


def compute_dtype(x: torch.Tensor) -> torch.dtype:
    """The dtype matmuls with x run in: the autocast dtype when autocast is on."""
    device = x.device.type
    return torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else x.dtype
