"""Fidelities: named sets of the choices where k3lab's design document and the published models differ.

    design       the design document's choices (KimiK3Config's defaults)
    k3           the official Kimi K3 (its modeling_kimi_linear.py and config.json): full-rank KDA
                 output gate without bias, a shared MLA key part, untied head, eps 1e-5, FLA's
                 q/k L2 norm, normal(init_std) AttnRes scorers, kaiming-uniform router
    kimi_linear  Kimi Linear as transformers' `KimiLinearForCausalLM` builds it: no AttnRes, SwiGLU,
                 plain MoE, low-rank gate without bias, unbounded decay gate, MLA without output
                 gate. Models with these choices export with `k3lab export --hf`.

A fidelity sets no sizes: apply it on top of a preset (`base: {preset: tiny, fidelity: k3}`, the
`fidelity` sweep axis, `k3lab train tiny --fidelity k3`). The one choice that scales with the model
is the shared key part: K3 shares 64 key dims next to 128 per head, so k3 and kimi_linear share
half of mla_qk_head_dim.
"""

from __future__ import annotations

from typing import Any

FIDELITIES = ("design", "k3", "kimi_linear")


def fidelity_fields(name: str, mla_qk_head_dim: int) -> dict[str, Any]:
    """The KimiK3Config fields that fidelity `name` sets, for a model with this MLA head dim."""
    if name not in FIDELITIES:
        raise ValueError(f"fidelity must be one of {FIDELITIES}, got {name!r}")
    shared_key_dim = mla_qk_head_dim // 2
    design = dict(
        use_attn_res=True, attn_res_proj_init="zeros",
        kda_gate_rank="head_dim", kda_gate_bias=True, kda_gate_lower_bound=-5.0, kda_qk_l2norm="normalize",
        mla_shared_key_dim=0, mla_output_gate=True, mla_latent_norm_eps=1e-6,
        router_init="normal", ffn_activation="situ_glu", tie_word_embeddings=True, rms_norm_eps=1e-6,
    )
    if name == "design":
        return design
    k3 = design | dict(
        attn_res_proj_init="normal", kda_gate_rank="full", kda_gate_bias=False, kda_qk_l2norm="fla",
        mla_shared_key_dim=shared_key_dim, router_init="kaiming_uniform", tie_word_embeddings=False,
        rms_norm_eps=1e-5,
    )
    if name == "k3":
        return k3
    return k3 | dict(  # kimi_linear: K3 without its K3-only parts
        use_attn_res=False, attn_res_proj_init="zeros", kda_gate_rank="head_dim", kda_gate_lower_bound=None,
        mla_output_gate=False, moe_latent_size=None, router_init="normal", ffn_activation="swiglu",
    )


def fidelity_field_names() -> frozenset[str]:
    """Every field some fidelity sets."""
    return frozenset().union(*(fidelity_fields(name, 2) for name in FIDELITIES))
