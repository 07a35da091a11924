"""k3lab models as Hugging Face Kimi Linear checkpoints, and back.

transformers (>= 5.23) ships Kimi Linear as `KimiLinearForCausalLM`. A k3lab model
that makes Kimi Linear's choices (the `kimi_linear` fidelity, `k3lab.model.fidelity`)
maps onto it weight for weight:

    hf_config(config)                  -> the config.json of the same model
    to_hf_state_dict(state, config)    k3lab state dict -> Kimi Linear state dict
    from_hf_state_dict(state, config)  Kimi Linear state dict -> k3lab state dict
    save_hf(model, directory)          config.json + model.safetensors

Both directions read one table of `Rule`s (`rules(config)`). Most weights only change
name; a few are joined or split:

    k3lab                                   Kimi Linear
    attn.{q,k,v}_conv.conv.weight (D,1,W)   self_attn.conv1d.weight (3D,1,W)     concatenated
    attn.A_log (H,)                         self_attn.forget_gate.A_log (1,1,H,1)
    ffn.experts.w_gate, w_up (E,I,d)        mlp.experts.gate_up_proj (E,2I,d)     concatenated
    ffn.shared.j.* (n MLPs of width I)      mlp.shared_experts.* (one of width nI) concatenated
    lm_head.weight (tied or not)            lm_head.weight (always written, tie_word_embeddings false)

What Kimi Linear cannot express is refused by `check_exportable`, naming the field.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

import attrs
import torch

from k3lab.errors import UserError
from k3lab.model.config import KimiK3Config

HF_LATENT_NORM_EPS = 1e-6  # Kimi Linear's q_a_layernorm and kv_a_layernorm: KimiLinearRMSNorm's default
MOE_BALANCING_BUFFERS = ("load_counts", "score_quantiles")  # k3lab training state, not part of the model


# -- what Kimi Linear can express ---------------------------------------------------------


def export_problems(config: KimiK3Config) -> list[str]:
    """One line per field whose value Kimi Linear cannot express (empty: exportable)."""
    problems = []

    def need(ok: bool, field: str, rule: str) -> None:
        if not ok:
            value = getattr(config, field)
            shown = "null" if value is None else str(value).lower() if isinstance(value, bool) else value
            problems.append(f"{field}={shown}: {rule}")

    need(not config.use_attn_res, "use_attn_res", "Kimi Linear has no Attention Residuals (needs false)")
    need(config.ffn_activation == "swiglu", "ffn_activation",
         "Kimi Linear's FFNs and experts are SwiGLU (needs swiglu)")
    has_moe = config.num_dense_layers < config.num_layers
    need(config.moe_latent_size is None or not has_moe, "moe_latent_size",
         "Kimi Linear's experts run at full width: no latent MoE (needs null)")
    need(config.kda_gate_low_rank == config.kda_head_dim, "kda_gate_rank",
         "Kimi Linear's KDA output gate is low rank kda_head_dim (needs head_dim)")
    need(not config.kda_gate_bias, "kda_gate_bias", "Kimi Linear's KDA output gate has no bias (needs false)")
    need(config.kda_gate_lower_bound is None, "kda_gate_lower_bound",
         "Kimi Linear's KDA decay gate is unbounded (needs null)")
    need(config.kda_qk_l2norm == "fla", "kda_qk_l2norm", "Kimi Linear normalises q and k as FLA does (needs fla)")
    need(not config.mla_output_gate, "mla_output_gate", "Kimi Linear's MLA has no output gate (needs false)")
    need(config.mla_latent_norm_eps == HF_LATENT_NORM_EPS, "mla_latent_norm_eps",
         f"Kimi Linear fixes the MLA latent norms' eps at {HF_LATENT_NORM_EPS:g}")
    return problems


def check_exportable(config: KimiK3Config) -> None:
    """A one-line `UserError` naming the first field Kimi Linear cannot express."""
    problems = export_problems(config)
    if problems:
        more = f" (and {len(problems) - 1} more; the kimi_linear fidelity sets them all)" if len(problems) > 1 else ""
        raise UserError(f"cannot export to Kimi Linear: {problems[0]}{more}")


def hf_config(config: KimiK3Config, dtype: torch.dtype = torch.float32) -> dict:
    """The config.json of `KimiLinearForCausalLM` for this (exportable) k3lab config."""
    check_exportable(config)
    return {
        "architectures": ["KimiLinearForCausalLM"],
        "model_type": "kimi_linear",
        "dtype": str(dtype).removeprefix("torch."),
        "vocab_size": config.vocab_size,
        "hidden_size": config.hidden_size,
        "num_hidden_layers": config.num_layers,
        "max_position_embeddings": config.max_seq_len,
        "layer_types": ["linear_attention" if t == "kda" else "full_attention" for t in config.layer_types],
        "mlp_layer_types": ["dense" if i < config.num_dense_layers else "sparse" for i in range(config.num_layers)],
        "intermediate_size": config.intermediate_size,
        "hidden_act": "silu",
        "rms_norm_eps": config.rms_norm_eps,
        "initializer_range": config.init_std,
        "tie_word_embeddings": False,  # a tied k3lab head is written out as its own copy
        "pad_token_id": None, "bos_token_id": None, "eos_token_id": None,
        # KDA
        "linear_num_heads": config.kda_num_heads,
        "linear_head_dim": config.kda_head_dim,
        "linear_conv_kernel_dim": config.kda_conv_size,
        # MLA: the shared key part is DeepSeek's rotary part, which Kimi Linear uses without rotation
        "num_attention_heads": config.mla_num_heads,
        "num_key_value_heads": config.mla_num_heads,
        "q_lora_rank": config.mla_q_lora_rank,
        "kv_lora_rank": config.mla_kv_lora_rank,
        "qk_nope_head_dim": config.mla_qk_head_dim,
        "qk_rope_head_dim": config.mla_shared_key_dim,
        "v_head_dim": config.mla_v_head_dim,
        # MoE: sigmoid router, one expert group, k3lab renormalises only when top_k > 1
        "num_local_experts": config.num_experts,
        "num_experts_per_tok": config.num_experts_per_token,
        "n_shared_experts": config.num_shared_experts,
        "moe_intermediate_size": config.moe_intermediate_size,
        "routed_scaling_factor": config.routed_scaling_factor,
        "norm_topk_prob": config.num_experts_per_token > 1,
        "n_group": 1,
        "topk_group": 1,
    }


# -- the weight table ---------------------------------------------------------------------


def _same(tensors: list[torch.Tensor]) -> torch.Tensor:
    return tensors[0]


def _whole(tensor: torch.Tensor) -> list[torch.Tensor]:
    return [tensor]


@attrs.frozen
class Rule:
    """k3lab weights `ours` <-> the Kimi Linear weight `theirs`: `join` makes theirs from ours,
    `split` ours from theirs (by default one weight, renamed)."""

    ours: tuple[str, ...]
    theirs: str
    join: Callable[[list[torch.Tensor]], torch.Tensor] = _same
    split: Callable[[torch.Tensor], list[torch.Tensor]] = _whole

    def under(self, ours_prefix: str, theirs_prefix: str) -> "Rule":
        return attrs.evolve(self, ours=tuple(ours_prefix + name for name in self.ours), theirs=theirs_prefix + self.theirs)


def renamed(ours: str, theirs: str | None = None) -> Rule:
    return Rule((ours,), theirs or ours)


def concatenated(ours: list[str], theirs: str, dim: int, sizes: list[int]) -> Rule:
    """Several k3lab weights side by side along `dim` in one Kimi Linear weight."""
    return Rule(tuple(ours), theirs, join=lambda ts: torch.cat(ts, dim=dim),
                split=lambda t: list(t.split(sizes, dim=dim)))


def kda_rules(config: KimiK3Config) -> list[Rule]:
    H, D = config.kda_num_heads, config.kda_num_heads * config.kda_head_dim
    return [
        *(renamed(f"{name}.weight") for name in ("q_proj", "k_proj", "v_proj", "b_proj", "o_proj", "o_norm")),
        concatenated([f"{x}_conv.conv.weight" for x in "qkv"], "conv1d.weight", dim=0, sizes=[D] * 3),
        renamed("f_proj.0.weight", "forget_gate.f_a_proj.weight"),
        renamed("f_proj.1.weight", "forget_gate.f_b_proj.weight"),
        renamed("dt_bias", "forget_gate.dt_bias"),
        Rule(("A_log",), "forget_gate.A_log", join=lambda ts: ts[0].view(1, 1, H, 1), split=lambda t: [t.view(H)]),
        renamed("g_proj.0.weight", "g_a_proj.weight"),
        renamed("g_proj.1.weight", "g_b_proj.weight"),
    ]


def mla_rules(config: KimiK3Config) -> list[Rule]:
    if config.mla_q_lora_rank is None:
        q = [renamed("q_proj.weight")]
    else:
        q = [renamed("q_proj.0.weight", "q_a_proj.weight"), renamed("q_proj.1.weight", "q_a_layernorm.weight"),
             renamed("q_proj.2.weight", "q_b_proj.weight")]
    return q + [
        renamed("kv_a_proj.weight", "kv_a_proj_with_mqa.weight"),
        renamed("kv_norm.weight", "kv_a_layernorm.weight"),
        renamed("kv_b_proj.weight"),
        renamed("o_proj.weight"),
    ]


def dense_rules() -> list[Rule]:
    return [renamed(f"{name}.weight") for name in ("gate_proj", "up_proj", "down_proj")]


def moe_rules(config: KimiK3Config) -> list[Rule]:
    I, n = config.moe_intermediate_size, config.num_shared_experts
    rules = [
        renamed("router.weight", "gate.weight"),
        renamed("expert_bias", "gate.e_score_correction_bias"),
        concatenated(["experts.w_gate", "experts.w_up"], "experts.gate_up_proj", dim=1, sizes=[I, I]),
        renamed("experts.w_down", "experts.down_proj"),
    ]
    if n == 0:  # Kimi Linear still builds a shared MLP, of width 0
        empty = {"gate_proj": (0, config.hidden_size), "up_proj": (0, config.hidden_size),
                 "down_proj": (config.hidden_size, 0)}
        return rules + [Rule((), f"shared_experts.{name}.weight", join=lambda ts, s=shape: torch.zeros(s),
                             split=lambda t: []) for name, shape in empty.items()]
    shared = [f"shared.{j}" for j in range(n)]
    return rules + [
        concatenated([f"{s}.gate_proj.weight" for s in shared], "shared_experts.gate_proj.weight", 0, [I] * n),
        concatenated([f"{s}.up_proj.weight" for s in shared], "shared_experts.up_proj.weight", 0, [I] * n),
        concatenated([f"{s}.down_proj.weight" for s in shared], "shared_experts.down_proj.weight", 1, [I] * n),
    ]


def rules(config: KimiK3Config) -> list[Rule]:
    """Every weight of the model, k3lab names <-> Kimi Linear names."""
    table = [renamed("embed_tokens.weight", "model.embed_tokens.weight"), renamed("norm.weight", "model.norm.weight"),
             renamed("lm_head.weight")]
    for i, kind in enumerate(config.layer_types):
        ours, theirs = f"layers.{i}.", f"model.layers.{i}."
        table += [renamed(ours + "attn_norm.weight", theirs + "input_layernorm.weight"),
                  renamed(ours + "ffn_norm.weight", theirs + "post_attention_layernorm.weight")]
        attn = kda_rules(config) if kind == "kda" else mla_rules(config)
        ffn = dense_rules() if i < config.num_dense_layers else moe_rules(config)
        table += [r.under(ours + "attn.", theirs + "self_attn.") for r in attn]
        table += [r.under(ours + "ffn.", theirs + "mlp.") for r in ffn]
    return table


# -- conversion ---------------------------------------------------------------------------


def to_hf_state_dict(state: dict[str, torch.Tensor], config: KimiK3Config) -> dict[str, torch.Tensor]:
    """A k3lab state dict (`KimiK3.state_dict()`) as `KimiLinearForCausalLM`'s."""
    check_exportable(config)
    state = dict(state)
    state.setdefault("lm_head.weight", state["embed_tokens.weight"])  # tied: the head is the embedding
    table = rules(config)
    used = {name for rule in table for name in rule.ours}
    unmapped = sorted(k for k in state if k not in used and k.rsplit(".", 1)[-1] not in MOE_BALANCING_BUFFERS)
    if unmapped:
        raise ValueError(f"to_hf_state_dict: no Kimi Linear weight for {unmapped[0]} (and {len(unmapped) - 1} more)")
    return {rule.theirs: rule.join([state[name] for name in rule.ours]) for rule in table}


def from_hf_state_dict(state: dict[str, torch.Tensor], config: KimiK3Config) -> dict[str, torch.Tensor]:
    """A `KimiLinearForCausalLM` state dict as k3lab's, for a KimiK3 built from `config`
    (the MoE balancing statistics start at zero)."""
    check_exportable(config)
    table = rules(config)
    theirs = {rule.theirs for rule in table}
    missing, unexpected = sorted(theirs - set(state)), sorted(set(state) - theirs)
    if missing or unexpected:
        problem = f"has no {missing[0]}" if missing else f"has {unexpected[0]}, which this config does not"
        raise ValueError(f"from_hf_state_dict: the Kimi Linear state dict {problem}")
    ours = {}
    for rule in table:
        ours.update(zip(rule.ours, rule.split(state[rule.theirs]), strict=True))
    if config.tie_word_embeddings and not torch.equal(ours["embed_tokens.weight"], ours["lm_head.weight"]):
        raise ValueError("from_hf_state_dict: tie_word_embeddings=true but the Kimi Linear head differs "
                         "from its embedding")
    for i in range(config.num_dense_layers, config.num_layers):
        for name in MOE_BALANCING_BUFFERS:
            ours[f"layers.{i}.ffn.{name}"] = torch.zeros(config.num_experts)
    return ours


def save_hf(model: torch.nn.Module, directory: str | Path) -> Path:
    """Write `model` (a KimiK3) as a Hugging Face checkpoint: config.json and model.safetensors."""
    try:
        from safetensors.torch import save_file
    except ImportError:
        raise UserError("export needs the safetensors package: pip install 'k3lab[hf]'") from None
    config = model.config
    dtype = model.embed_tokens.weight.dtype
    tensors = to_hf_state_dict(model.state_dict(), config)
    tensors = {name: t.detach().to("cpu").clone().contiguous() for name, t in tensors.items()}  # no shared storage
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    save_file(tensors, directory / "model.safetensors", metadata={"format": "pt"})
    (directory / "config.json").write_text(json.dumps(hf_config(config, dtype), indent=2) + "\n")
    return directory
