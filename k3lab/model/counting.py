"""Parameter and FLOP counting, for comparing variants and for MFU.

FLOPs per token (forward + backward, training):

    6 * N_active_matmul                                   every weight matrix a token multiplies
  + sum over MLA layers  6 * H * (d_qk + d_v) * T         QK^T and AV over a context of T
  + sum over KDA layers  6 * H * (C * (3 dk + 2 dv) + 3 dk dv)   chunkwise KDA, chunk size C
  + sum over AttnRes sites  12 * K_site * M                  AttnRes's depth mixing, K_site candidates

N_active_matmul counts routed experts at top_k / num_experts, the tied embedding/head
once (as the head's matmul; the embedding lookup is free; an untied embedding is not a
matmul, its head is), and leaves out norm gains, biases, convolutions and scorer
vectors. The MLA term follows PaLM's MFU convention (full T, no causal halving); with
a shared key part of s dims (mla_shared_key_dim) its d_qk is the query-key width d_qk + s.
The KDA term counts, per token and head, the intra-chunk score matrices (q.k and k.k
over C positions, dk each), the triangular solve and the intra-chunk output (about
C * (dk + dv) + C * dv), and the three state products with the dk x dv state (read-out
for w and q, and the update). It is an estimate of the work the chunk algorithm does,
not a measurement.

AttnRes mixes K candidates of width M at each site (each layer's attention input but layer 0's,
and every FFN input; `attn_res_candidates`): its scorer is a (1 x M) vector applied to all K
candidates, and its output a weighted sum over K, two matmul-like products of 2 K M FLOPs
forward each; as for a matmul, training is 3x the forward, 12 K M per site. Its RMSNorm and
softmax are elementwise, left out like every norm.
"""

from __future__ import annotations

import torch
from torch import nn

from k3lab.model.config import KimiK3Config

COMPONENTS = ("embedding", "kda", "mla", "dense_ffn", "moe_routed", "moe_latent", "moe_shared", "router",
              "attn_res", "norms")


def component_of(name: str, layer_types: tuple[str, ...]) -> str:
    """Which component (see COMPONENTS) the parameter `name` of a KimiK3 belongs to."""
    parts = name.split(".")
    if parts[0] in ("embed_tokens", "lm_head"):
        return "embedding"
    if "res_proj" in name or "res_norm" in name:
        return "attn_res"
    if parts[0] == "norm" or parts[2] in ("attn_norm", "ffn_norm"):
        return "norms"
    if parts[2] == "attn":
        return layer_types[int(parts[1])]
    ffn_part = {"experts": "moe_routed", "router": "router", "shared": "moe_shared", "down": "moe_latent",
                "up": "moe_latent", "latent_norm": "moe_latent"}
    if parts[2] == "ffn":
        return ffn_part.get(parts[3], "dense_ffn")
    raise ValueError(f"parameter {name} belongs to no known component")


def is_matmul_weight(name: str, param: nn.Parameter) -> bool:
    """Weights a token is multiplied by: Linear matrices, the stacked expert matrices
    (E, out, in) and the (tied) head."""
    if ".experts." in name:
        return True
    return param.ndim == 2 and "res_proj" not in name


def is_lookup_only(name: str, config: KimiK3Config) -> bool:
    """An untied embedding: read by index, never multiplied (the head has its own matrix)."""
    return name == "embed_tokens.weight" and not config.tie_word_embeddings


def count_parameters(model: nn.Module, seq_len: int | None = None) -> dict:
    """Parameter counts and training FLOPs per token of a KimiK3 (see the module docstring).

    Keys: total, embedding, non_embedding, active, active_matmul, by_component,
    flops_per_token (at seq_len, default max_seq_len). A tied weight counts once; an
    untied head counts under embedding.
    """
    config: KimiK3Config = model.config
    routed_share = config.num_experts_per_token / config.num_experts
    by_component = dict.fromkeys(COMPONENTS, 0)
    active = active_matmul = 0.0
    for name, param in model.named_parameters():  # yields the tied embedding/head once
        n = param.numel()
        component = component_of(name, config.layer_types)
        by_component[component] += n
        share = routed_share if component == "moe_routed" else 1.0
        active += n * share
        if is_matmul_weight(name, param) and not is_lookup_only(name, config):
            active_matmul += n * share
    total = sum(by_component.values())
    return {
        "total": total,
        "embedding": by_component["embedding"],
        "non_embedding": total - by_component["embedding"],
        "active": int(round(active)),
        "active_matmul": int(round(active_matmul)),
        "by_component": by_component,
        "flops_per_token": flops_per_token(config, int(round(active_matmul)), seq_len or config.max_seq_len),
    }


def flops_per_token(config: KimiK3Config, active_matmul: int, seq_len: int) -> int:
    """Training FLOPs per token: 6 N_active_matmul plus the MLA and KDA sequence terms."""
    mla_layers = config.layer_types.count("mla")
    kda_layers = config.layer_types.count("kda")
    qk_dim = config.mla_qk_head_dim + config.mla_shared_key_dim
    mla = 6 * config.mla_num_heads * (qk_dim + config.mla_v_head_dim) * seq_len
    kda = kda_flops_per_token(config.kda_num_heads, config.kda_head_dim, config.kda_chunk_size, seq_len)
    return 6 * active_matmul + mla_layers * mla + kda_layers * kda + attn_res_flops_per_token(config)


def attn_res_candidates(config: KimiK3Config) -> list[int]:
    """The number of depth candidates K at each AttnRes mixing site, in forward order (none without
    AttnRes): layer i's attention input mixes the stored block endpoints and the live prefix (not at
    layer 0, whose input is the embedding); a layer that starts a block (i % S == 0) then stores
    its incoming prefix as an endpoint; its FFN input mixes the endpoints and the new prefix."""
    if not config.use_attn_res:
        return []
    sites, endpoints = [], 0
    for layer in range(config.num_layers):
        if endpoints > 0:
            sites.append(endpoints + 1)
        if layer % config.attn_res_block_size == 0:
            endpoints += 1
        sites.append(endpoints + 1)
    return sites


def attn_res_flops_per_token(config: KimiK3Config) -> int:
    """AttnRes's mixing, training FLOPs per token: 12 K M per site (see the module docstring)."""
    return 12 * config.hidden_size * sum(attn_res_candidates(config))


def kda_flops_per_token(num_heads: int, head_dim: int, chunk_size: int, seq_len: int) -> int:
    """One KDA layer's chunk term (see the module docstring), dk = dv = head_dim."""
    C, d = min(chunk_size, seq_len), head_dim
    return 6 * num_heads * (C * (3 * d + 2 * d) + 3 * d * d)


def count_config(config: KimiK3Config, seq_len: int | None = None) -> dict:
    """`count_parameters` for a config, without allocating weights (built on the meta device)."""
    from k3lab.model.model import KimiK3

    with torch.device("meta"):
        model = KimiK3(config)
    return count_parameters(model, seq_len)


# dense bf16 tensor-core peaks (FLOP/s), by device-name substring; first match wins
PEAK_BF16_FLOPS = (
    ("H200", 989e12),
    ("H100 PCIe", 756e12),
    ("H100", 989e12),
    ("A100", 312e12),
)


def peak_flops_of(device_name: str | None) -> float | None:
    """Dense bf16 peak FLOP/s of a GPU by name (first matching key), or None when unknown."""
    if not device_name:
        return None
    return next((peak for key, peak in PEAK_BF16_FLOPS if key in device_name), None)
