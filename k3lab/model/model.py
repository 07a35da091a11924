"""KimiK3: the composition layer.

Each decoder block picks its attention (KDA or gated MLA) and its FFN (dense SiTU-GLU
for the first `num_dense_layers`, Stable LatentMoE after), and Attention Residuals
(AttnRes) replace the plain residual stream: every sub-layer reads a learned softmax
mixture over depth candidates -- the stored block endpoints and the live prefix.

State carried between blocks (never between forward calls):
    hidden_states   (B, T, M)      the live prefix of the current AttnRes block
    block_residual  (B*T, P, M)    the P completed block endpoints so far

GPU path: with kda_implementation="fused" on CUDA the same state machine runs with the
endpoints as a tuple of P (B, T, M) tensors and every mixture (with the pre-norm that
follows it) in one fused kernel each way (`k3lab.ops.attn_res.fused`). The tuple
avoids re-concatenating the endpoints; the candidates and their order are identical.
Endpoints are made by `as_endpoint`, so that their readers sum their gradient in one buffer.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from k3lab.compiling import raise_recompile_limit
from k3lab.model.config import KimiK3Config
from k3lab.model.ffn import DenseFFN
from k3lab.model.loss import linear_cross_entropy
from k3lab.model.mla import GatedMLA
from k3lab.model.moe import StableLatentMoE, balance_biases
from k3lab.model.norm import RMSNorm
from k3lab.ops.attn_res import naive
from k3lab.ops.attn_res.naive import apply_attn_res, attn_res_mixture  # noqa: F401  (importable from here)



def build_kda(config: KimiK3Config) -> nn.Module:
    """The KDA layer for this config; FLA (and Triton) are imported only for "fused"."""
    if config.uses_fused_kda:
        from k3lab.model.kda import KDAFused

        return KDAFused(config)
    from k3lab.model.kda import KDAChunkwise

    return KDAChunkwise(config)


def fused_attn_res(candidates, norm, proj, out_norm):
    """out_norm(AttnRes mixture of candidates) in the fused kernels: see `k3lab.ops.attn_res.fused`
    (whose `fused_attn_res` is the compiler-disabled one).

    Imported here, at call time, so the plain model never imports the fused module; and no
    `torch.compiler` decorator at import time, which would import torch._dynamo and with it
    Triton on CUDA builds of torch.
    """
    from k3lab.ops.attn_res import fused

    return fused.fused_attn_res(candidates, norm, proj, out_norm)


def as_endpoint(x):
    """x kept as a block endpoint on the fused path: see `k3lab.ops.attn_res.fused.as_endpoint`."""
    from k3lab.ops.attn_res import fused

    return fused.as_endpoint(x)


class KimiK3DecoderBlock(nn.Module):
    def __init__(self, config: KimiK3Config, layer_idx: int):
        super().__init__()
        self.layer_idx = layer_idx
        self.layer_type = config.layer_types[layer_idx]
        self.use_attn_res = config.use_attn_res
        # a bool, not layer_idx % S in forward: torch.compile then guards on two values, not on every index
        self.starts_block = layer_idx % config.attn_res_block_size == 0
        M, eps = config.hidden_size, config.rms_norm_eps
        if self.layer_type == "kda":
            self.attn = build_kda(config)
        elif self.layer_type == "mla":
            self.attn = GatedMLA(config)
        else:
            raise ValueError(f"unknown layer type {self.layer_type!r} at layer {layer_idx}")
        if layer_idx < config.num_dense_layers:
            self.ffn = DenseFFN(M, config.intermediate_size, config.situ_beta, config.situ_linear_beta,
                                config.ffn_activation)
        else:
            self.ffn = StableLatentMoE(config)
        self.attn_norm = RMSNorm(M, eps)
        self.ffn_norm = RMSNorm(M, eps)
        if self.use_attn_res:  # separate scorers for the attention and FFN inputs
            if layer_idx > 0:  # layer 0's attention input is the embedding: nothing to mix
                self.attn_res_norm = RMSNorm(M, eps)
                self.attn_res_proj = nn.Linear(M, 1, bias=False)
            self.mlp_res_norm = RMSNorm(M, eps)
            self.mlp_res_proj = nn.Linear(M, 1, bias=False)
        # mean AttnRes weight per depth candidate from the last forward, for logging
        self.attn_res_weights: dict[str, torch.Tensor] = {}

    def forward(self, hidden_states: torch.Tensor, block_residual):
        if not self.use_attn_res:
            return self.forward_prenorm(hidden_states), block_residual
        if isinstance(block_residual, tuple):
            return self.forward_fused(hidden_states, block_residual)
        B, T, C = hidden_states.shape
        prefix_sum = hidden_states
        stream = prefix_sum.dtype  # the residual stream keeps the embedding's dtype (see KimiK3.embed)

        # attention input: a mixture over completed endpoints and the incoming prefix
        if block_residual.shape[1] > 0:
            hidden_states = self.mix("attn", block_residual, prefix_sum, self.attn_res_norm, self.attn_res_proj)

        # at a block boundary the incoming prefix (not the mixed input) becomes an endpoint
        if self.starts_block:
            block_residual = torch.cat([block_residual, prefix_sum.reshape(B * T, 1, C)], dim=1)
            prefix_sum = None

        attn_output = self.attn(self.attn_norm(hidden_states)).to(stream)
        prefix_sum = attn_output if prefix_sum is None else prefix_sum + attn_output

        hidden_states = self.mix("ffn", block_residual, prefix_sum, self.mlp_res_norm, self.mlp_res_proj)
        prefix_sum = prefix_sum + self.ffn(self.ffn_norm(hidden_states)).to(stream)
        return prefix_sum, block_residual

    def forward_fused(self, hidden_states: torch.Tensor, endpoints: tuple):
        """`forward` with the fused AttnRes kernels (`k3lab.ops.attn_res.fused`): endpoints is a tuple of P (B, T, M) tensors.

        Each mixture comes back already through the pre-norm that follows it
        (attn_norm / ffn_norm), which the kernel fuses.
        """
        prefix_sum = hidden_states
        if endpoints:
            h, self.attn_res_weights["attn"] = fused_attn_res(
                (*endpoints, prefix_sum), self.attn_res_norm, self.attn_res_proj, self.attn_norm)
        else:
            h = self.attn_norm(prefix_sum)
        if self.starts_block:
            stream_dtype = endpoints[0].dtype if endpoints else prefix_sum.dtype
            endpoints = (*endpoints, as_endpoint(prefix_sum.to(stream_dtype)))
            prefix_sum = None

        stream = hidden_states.dtype  # as in `forward`: the stream stays in the embedding's dtype
        attn_output = self.attn(h).to(stream)
        prefix_sum = attn_output if prefix_sum is None else prefix_sum + attn_output

        h, self.attn_res_weights["ffn"] = fused_attn_res(
            (*endpoints, prefix_sum), self.mlp_res_norm, self.mlp_res_proj, self.ffn_norm)
        prefix_sum = prefix_sum + self.ffn(h).to(stream)
        return prefix_sum, endpoints

    def forward_prenorm(self, x: torch.Tensor) -> torch.Tensor:
        """The standard pre-norm residual stream: the AttnRes ablation baseline."""
        x = x + self.attn(self.attn_norm(x))
        return x + self.ffn(self.ffn_norm(x))

    def mix(self, site, block_residual, prefix_sum, norm, proj):
        B, T, C = prefix_sum.shape
        h, weights = naive.attn_res_mixture(block_residual, prefix_sum.reshape(B * T, C), norm, proj)
        self.attn_res_weights[site] = weights.detach().mean(dim=0)  # (K,)
        return h.view(B, T, C)


class KimiK3(nn.Module):
    """idx (B, T) -> logits (B, T, V) and, with targets (B, T), the mean cross-entropy.

    `forward(idx, targets, return_logits=False)` returns (None, loss) and computes the
    loss chunk by chunk (`loss.linear_cross_entropy`) without ever holding the full
    (B*T, V) logits; training uses it.
    """

    def __init__(self, config: KimiK3Config):
        super().__init__()
        config = config.resolve_kda(cuda=torch.cuda.is_available())  # build on CPU to train on CPU: resolve first
        self.config = config
        M = config.hidden_size
        self.embed_tokens = nn.Embedding(config.vocab_size, M)
        self.layers = nn.ModuleList(KimiK3DecoderBlock(config, i) for i in range(config.num_layers))
        if config.use_attn_res:
            self.final_res_norm = RMSNorm(M, config.rms_norm_eps)
            self.final_res_proj = nn.Linear(M, 1, bias=False)
        self.norm = RMSNorm(M, config.rms_norm_eps)
        self.lm_head = nn.Linear(M, config.vocab_size, bias=False)
        self.checkpoint_layers = False  # recompute each layer in backward (activation checkpointing)
        if not self.lm_head.weight.is_meta:  # meta tensors (for counting) hold no values to initialise
            self.apply(self._init_weights)
            self._init_special()
        if config.tie_word_embeddings:  # the design document's choice for efficiency; K3 unties them
            self.lm_head.weight = self.embed_tokens.weight

    def _init_weights(self, module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=self.config.init_std)
            if getattr(module, "bias", None) is not None:
                nn.init.zeros_(module.bias)

    @torch.no_grad()
    def _init_special(self) -> None:
        config = self.config
        for name, param in self.named_parameters():
            if name.endswith("res_proj.weight") and config.attn_res_proj_init == "zeros":
                param.zero_()  # AttnRes scorers start uniform (else normal, as every Linear)
            elif name.endswith("ffn.router.weight") and config.router_init == "kaiming_uniform":
                nn.init.kaiming_uniform_(param, a=math.sqrt(5))  # nn.Linear's own default, as K3
            elif ".experts.w_" in name:
                nn.init.normal_(param, mean=0.0, std=config.init_std)
        for module in self.modules():
            if hasattr(module, "reset_decay_parameters"):
                module.reset_decay_parameters()

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None, return_logits: bool = True):
        hidden_states = self.final_hidden_states(idx)  # (B, T, M), after the final norm
        if targets is not None and not return_logits:
            M = hidden_states.shape[-1]
            return None, linear_cross_entropy(hidden_states.reshape(-1, M), self.lm_head.weight, targets.reshape(-1))
        logits = self.lm_head(hidden_states)
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.view(-1, logits.shape[-1]).float(), targets.reshape(-1))
        return logits, loss

    def final_hidden_states(self, idx: torch.Tensor) -> torch.Tensor:
        """The decoder stack, the final AttnRes mixture and the final norm: (B, T) -> (B, T, M)."""
        B, T = idx.shape
        if T > self.config.max_seq_len:
            raise ValueError(f"sequence length {T} exceeds max_seq_len={self.config.max_seq_len}")
        hidden_states = self.embed(idx)  # (B, T, M)
        if self.uses_fused_attn_res(idx):
            endpoints = ()
            for layer in self.layers:
                hidden_states, endpoints = self.run_layer(layer, hidden_states, endpoints)
            h, _ = fused_attn_res((*endpoints, hidden_states), self.final_res_norm, self.final_res_proj, self.norm)
            return h
        block_residual = hidden_states.new_zeros(B * T, 0, self.config.hidden_size)
        for layer in self.layers:
            hidden_states, block_residual = self.run_layer(layer, hidden_states, block_residual)
        if self.config.use_attn_res:
            hidden_states = naive.apply_attn_res(
                block_residual, hidden_states.reshape(B * T, -1), self.final_res_norm, self.final_res_proj
            ).view(B, T, -1)
        return self.norm(hidden_states)

    def embed(self, idx: torch.Tensor) -> torch.Tensor:
        """(B, T) -> (B, T, M): the start of the residual stream, whose dtype the stream keeps.

        Under autocast the embedding is fp32; with `residual_in_fp32` false the stream starts
        in the autocast dtype instead (bf16), as FLA's models keep it.
        """
        x = self.embed_tokens(idx)
        device = idx.device.type
        if not self.config.residual_in_fp32 and torch.is_autocast_enabled(device):
            x = x.to(torch.get_autocast_dtype(device))
        return x

    def run_layer(self, layer: KimiK3DecoderBlock, hidden_states: torch.Tensor, state):
        """One decoder layer; with `checkpoint_layers` in training, its activations are
        recomputed in backward instead of stored. (The MoE load it records is then counted
        twice, which leaves the load fractions that balancing uses unchanged.)"""
        if self.checkpoint_layers and self.training and torch.is_grad_enabled():
            return checkpoint(layer, hidden_states, state, use_reentrant=False)
        return layer(hidden_states, state)

    def uses_fused_attn_res(self, idx: torch.Tensor) -> bool:
        """The fused AttnRes kernels: where the config says so (`KimiK3Config.uses_fused_attn_res`), on CUDA."""
        return self.config.uses_fused_attn_res and idx.is_cuda

    def moe_layers(self) -> list[tuple[int, StableLatentMoE]]:
        return [(i, layer.ffn) for i, layer in enumerate(self.layers) if isinstance(layer.ffn, StableLatentMoE)]

    @torch.no_grad()
    def update_moe_biases(self) -> dict[int, torch.Tensor]:
        """Balance every MoE layer's selection bias; returns {layer: load fraction (E,)} used."""
        layers = self.moe_layers()
        if not layers:
            return {}
        loads = balance_biases([moe for _, moe in layers])
        return {i: load for (i, _), load in zip(layers, loads.unbind(0))}


def compile_blocks(model: KimiK3, **options) -> KimiK3:
    """torch.compile each decoder block in place (fullgraph=False by default).

    `nn.Module.compile` keeps module names, so state_dict keys and optimizer
    assignment are unchanged. FLA calls are `torch.compiler.disable`d: graph breaks.
    """
    options.setdefault("fullgraph", False)
    # blocks share one forward: each distinct block kind (attention, FFN, boundary) is one
    # more compiled graph of that code object; keep them all under the recompile limit
    raise_recompile_limit(2 * len(model.layers))
    for layer in model.layers:
        layer.compile(**options)
    return model
