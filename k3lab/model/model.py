"""KimiK3: the composition layer.

Each decoder block picks its attention (KDA or gated MLA) and its FFN (dense SiTU-GLU
for the first `num_dense_layers`, Stable LatentMoE after), and Attention Residuals
(AttnRes) replace the plain residual stream: every sub-layer reads a learned softmax
mixture over depth candidates -- the stored block endpoints and the live prefix.

State carried between blocks (never between forward calls):
    hidden_states   (B, T, M)      the live prefix of the current AttnRes block
    endpoints                      the completed block endpoints so far

One block forward runs both AttnRes paths: the endpoints object a forward starts with
(`KimiK3.no_endpoints`) carries its own `add` and `mix`. The reference path's
(`naive.StackedEndpoints`) stacks them as one (B*T, P, M) tensor; with kda_implementation="fused"
on CUDA the fused path's (`fused.EndpointTuple`) keeps a tuple of P (B, T, M) tensors, each
mixture and the pre-norm after it one kernel each way. The candidates and their order are the
same on both.
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
from k3lab.model.kda import KDAChunkwise, KDAFused
from k3lab.model.loss import linear_cross_entropy
from k3lab.model.mla import GatedMLA
from k3lab.model.moe import StableLatentMoE, balance_biases
from k3lab.model.norm import RMSNorm
from k3lab.ops.attn_res.naive import StackedEndpoints


def build_kda(config: KimiK3Config) -> nn.Module:
    """The KDA layer for this config; FLA (and Triton) are imported only when a fused layer runs on CUDA."""
    return KDAFused(config) if config.uses_fused_kda else KDAChunkwise(config)


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
        self.mixes_attn_input = layer_idx > 0  # layer 0's attention input is the embedding: nothing to mix
        if self.use_attn_res:  # separate scorers for the attention and FFN inputs
            if self.mixes_attn_input:
                self.attn_res_norm = RMSNorm(M, eps)
                self.attn_res_proj = nn.Linear(M, 1, bias=False)
            self.mlp_res_norm = RMSNorm(M, eps)
            self.mlp_res_proj = nn.Linear(M, 1, bias=False)
        # mean AttnRes weight per depth candidate from the last forward, for logging
        self.attn_res_weights: dict[str, torch.Tensor] = {}

    def forward(self, hidden_states: torch.Tensor, endpoints):
        """(B, T, M) live prefix and the endpoints (`KimiK3.no_endpoints`) -> both after this
        layer. Each mixture comes back through the pre-norm after it."""
        if not self.use_attn_res:
            return self.forward_prenorm(hidden_states), endpoints
        prefix_sum = hidden_states
        stream = prefix_sum.dtype  # the residual stream keeps the embedding's dtype (see KimiK3.embed)

        # attention input: a mixture over completed endpoints and the incoming prefix
        if self.mixes_attn_input:
            h, self.attn_res_weights["attn"] = endpoints.mix(
                prefix_sum, self.attn_res_norm, self.attn_res_proj, self.attn_norm)

        # at a block boundary the incoming prefix (not the mixed input) becomes an endpoint
        if self.starts_block:
            endpoints = endpoints.add(prefix_sum)
            prefix_sum = None
        if not self.mixes_attn_input:  # after the endpoint: the order autograd sums the embedding's gradient in
            h = self.attn_norm(hidden_states)

        attn_output = self.attn(h).to(stream)
        prefix_sum = attn_output if prefix_sum is None else prefix_sum + attn_output

        h, self.attn_res_weights["ffn"] = endpoints.mix(
            prefix_sum, self.mlp_res_norm, self.mlp_res_proj, self.ffn_norm)
        prefix_sum = prefix_sum + self.ffn(h).to(stream)
        return prefix_sum, endpoints

    def forward_prenorm(self, x: torch.Tensor) -> torch.Tensor:
        """The standard pre-norm residual stream: the AttnRes ablation baseline."""
        x = x + self.attn(self.attn_norm(x))
        return x + self.ffn(self.ffn_norm(x))


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
        endpoints = self.no_endpoints(hidden_states)
        for layer in self.layers:
            hidden_states, endpoints = self.run_layer(layer, hidden_states, endpoints)
        if not self.config.use_attn_res:
            return self.norm(hidden_states)
        return endpoints.mix(hidden_states, self.final_res_norm, self.final_res_proj, self.norm)[0]

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

    def run_layer(self, layer: KimiK3DecoderBlock, hidden_states: torch.Tensor, endpoints):
        """One decoder layer; with `checkpoint_layers` in training, its activations are
        recomputed in backward instead of stored. (The MoE load it records is then counted
        twice, which leaves the load fractions that balancing uses unchanged.)"""
        if self.checkpoint_layers and self.training and torch.is_grad_enabled():
            return checkpoint(layer, hidden_states, endpoints, use_reentrant=False)
        return layer(hidden_states, endpoints)

    def no_endpoints(self, x: torch.Tensor):
        """The AttnRes state before the first layer, for x (B, T, M): the fused kernels' where the
        config says so (`KimiK3Config.uses_fused_attn_res`) and x is on CUDA, else the reference's.

        The fused module is imported here, at call time, so the plain model never imports it: its
        `torch.compiler.disable` imports torch._dynamo, and with it Triton on CUDA builds of torch.
        """
        if self.config.uses_fused_attn_res and x.is_cuda:
            from k3lab.ops.attn_res.fused import EndpointTuple

            return EndpointTuple()
        return StackedEndpoints.empty(x)

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
