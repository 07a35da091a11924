"""KimiK3Config: the whole architecture as validated data.

Every field has a default, so `KimiK3Config()` is a valid (small) model. The
constructor rejects structurally impossible models with a `ValueError` that
names the field and the rule, before any module is built.
"""

from __future__ import annotations

import attrs

LAYER_TYPES = ("kda", "mla")
KDA_IMPLEMENTATIONS = ("auto", "chunkwise", "fused")
KDA_GATE_RANKS = ("head_dim", "full")  # or a positive integer rank
KDA_QK_L2NORMS = ("normalize", "fla")
FFN_ACTIVATIONS = ("situ_glu", "swiglu")
MOE_BALANCE_RULES = ("quantile", "sign")
ROUTER_INITS = ("normal", "kaiming_uniform")
ATTN_RES_PROJ_INITS = ("zeros", "normal")
FUSED_KDA_CHUNK_SIZES = (32, 64)  # what FLA's chunk_kda takes


def kimi_linear_schedule(num_layers: int, kda_per_mla: int = 3) -> tuple[str, ...]:
    """The Kimi Linear layer pattern: `kda_per_mla` KDA layers, then one MLA layer,
    repeated, with the last layer always MLA. kda_per_mla=0 gives all MLA."""
    period = kda_per_mla + 1
    return tuple(
        "mla" if (i + 1) % period == 0 or i == num_layers - 1 else "kda" for i in range(num_layers)
    )


@attrs.frozen
class KimiK3Config:
    # vocabulary and trunk
    vocab_size: int = 320  # 256 bytes + specials, rounded up to a multiple of 64
    hidden_size: int = 256
    num_layers: int = 8
    layer_types: tuple[str, ...] | None = None  # None -> kimi_linear_schedule(num_layers)
    max_seq_len: int = 1024
    num_dense_layers: int = 1  # layers [0, num_dense_layers) use DenseFFN, the rest MoE
    intermediate_size: int = 768  # DenseFFN width

    # Attention Residuals (block size counts decoder layers)
    use_attn_res: bool = True
    attn_res_block_size: int = 2
    attn_res_proj_init: str = "zeros"  # "zeros": the first mixture is uniform; "normal": init_std (K3)

    # KDA
    kda_implementation: str = "auto"  # auto: fused (FLA) on CUDA when FLA is installed, else chunkwise
    kda_num_heads: int = 4
    kda_head_dim: int = 64
    kda_chunk_size: int = 64
    kda_gate_lower_bound: float | None = -5.0  # None -> unbounded decay gate
    kda_conv_size: int = 4
    # output gate sigmoid(g_proj(x)): "head_dim" = low rank kda_head_dim (FLA, Kimi Linear),
    # "full" = one Linear(M, H*d) (K3), or an integer rank
    kda_gate_rank: int | str = "head_dim"
    kda_gate_bias: bool = True  # a bias on the gate's last Linear (FLA's layer); K3 and Kimi Linear have none
    # q, k L2 norm: "normalize" = F.normalize, x / max(|x|, 1e-12); "fla" = x / sqrt(|x|^2 + 1e-6)
    # (FLA's kernels, the Kimi code and the fused path)
    kda_qk_l2norm: str = "normalize"

    # gated MLA
    mla_num_heads: int = 4
    mla_q_lora_rank: int | None = 128  # None -> full-rank q projection
    mla_kv_lora_rank: int = 128
    mla_qk_head_dim: int = 64
    mla_v_head_dim: int = 64
    mla_shared_key_dim: int = 0  # K3's qk_rope_head_dim: a key part shared by all heads (0: none)
    mla_output_gate: bool = True  # attn_out * sigmoid(g_proj(x)); Kimi Linear has no gate
    mla_latent_norm_eps: float = 1e-6  # eps of the q and kv latent RMSNorms (fixed 1e-6 in K3)

    # Stable LatentMoE
    num_experts: int = 8
    num_experts_per_token: int = 2
    num_shared_experts: int = 1
    moe_intermediate_size: int = 256
    moe_latent_size: int | None = 128  # None -> experts at full width (plain MoE)
    routed_scaling_factor: float = 1.0
    moe_balance: str = "sign"
    moe_bias_update_rate: float = 1e-3
    router_init: str = "normal"  # "normal": init_std; "kaiming_uniform": nn.Linear's default (K3)

    # FFN activation (dense FFNs, shared and routed experts): SiTU-GLU (K3) or SwiGLU (Kimi Linear)
    ffn_activation: str = "situ_glu"
    situ_beta: float = 4.0
    situ_linear_beta: float = 25.0

    # head, numerics
    tie_word_embeddings: bool = True  # one matrix for the embedding and the head (K3: untied)
    # the residual stream (and every AttnRes source) in fp32 under autocast; false keeps it in the
    # autocast dtype (bf16), as FLA's models do: half the bytes in the stored AttnRes sources and
    # in FLA's fused mixture (which still sums in fp32, as the plain path does)
    residual_in_fp32: bool = True
    rms_norm_eps: float = 1e-6  # every RMSNorm but the MLA latent norms (K3: 1e-5)
    init_std: float = 0.02

    def __attrs_post_init__(self) -> None:
        layer_types = self.layer_types
        if layer_types is None:
            layer_types = kimi_linear_schedule(self.num_layers) if self.num_layers > 0 else ()
        object.__setattr__(self, "layer_types", tuple(layer_types))
        self._validate_sizes_and_schedule()
        self._validate_settings()

    # -- validation ---------------------------------------------------------------

    def _validate_sizes_and_schedule(self) -> None:
        for name in (
            "vocab_size", "hidden_size", "num_layers", "max_seq_len", "intermediate_size",
            "kda_num_heads", "kda_head_dim", "kda_chunk_size", "kda_conv_size",
            "mla_num_heads", "mla_kv_lora_rank", "mla_qk_head_dim", "mla_v_head_dim",
            "num_experts", "moe_intermediate_size",
        ):
            _require(_is_int(getattr(self, name)) and getattr(self, name) > 0, name, "must be a positive integer")
        for name in ("mla_q_lora_rank", "moe_latent_size"):
            value = getattr(self, name)
            _require(value is None or (_is_int(value) and value > 0), name, "must be a positive integer or null")

        _require(len(self.layer_types) == self.num_layers, "layer_types",
                 f"must have num_layers={self.num_layers} entries, got {len(self.layer_types)}")
        for i, kind in enumerate(self.layer_types):
            _require(kind in LAYER_TYPES, f"layer_types[{i}]", f"must be one of {LAYER_TYPES}, got {kind!r}")
        _require(_is_int(self.num_dense_layers) and 0 <= self.num_dense_layers <= self.num_layers,
                 "num_dense_layers", f"must lie in [0, num_layers={self.num_layers}]")
        for name in ("use_attn_res", "kda_gate_bias", "mla_output_gate", "tie_word_embeddings", "residual_in_fp32"):
            _require(isinstance(getattr(self, name), bool), name, "must be true or false")
        _require(_is_int(self.attn_res_block_size) and self.attn_res_block_size > 0,
                 "attn_res_block_size", "must be a positive integer")

    def _validate_settings(self) -> None:
        """Latent widths, the MoE's and the numerics' values, and the choices among named options."""
        for name in ("mla_q_lora_rank", "mla_kv_lora_rank", "moe_latent_size"):
            value = getattr(self, name)
            _require(value is None or value < self.hidden_size, name,
                     f"must be below hidden_size={self.hidden_size}")

        _require(_is_int(self.num_experts_per_token) and 1 <= self.num_experts_per_token < self.num_experts,
                 "num_experts_per_token", f"must be in [1, num_experts={self.num_experts})")
        _require(_is_int(self.num_shared_experts) and self.num_shared_experts >= 0,
                 "num_shared_experts", "must be a non-negative integer")
        _require(self.routed_scaling_factor > 0, "routed_scaling_factor", "must be positive")
        _require(self.moe_balance in MOE_BALANCE_RULES, "moe_balance", f"must be one of {MOE_BALANCE_RULES}")
        _require(self.moe_bias_update_rate >= 0, "moe_bias_update_rate", "must be non-negative")

        _require(self.situ_beta > 0, "situ_beta", "must be positive")
        _require(self.situ_linear_beta > 0, "situ_linear_beta", "must be positive")
        _require(self.rms_norm_eps > 0, "rms_norm_eps", "must be positive")
        _require(self.mla_latent_norm_eps > 0, "mla_latent_norm_eps", "must be positive")
        _require(self.init_std > 0, "init_std", "must be positive")

        for name, choices in (("kda_qk_l2norm", KDA_QK_L2NORMS), ("ffn_activation", FFN_ACTIVATIONS),
                              ("router_init", ROUTER_INITS), ("attn_res_proj_init", ATTN_RES_PROJ_INITS)):
            _require(getattr(self, name) in choices, name, f"must be one of {choices}")
        rank = self.kda_gate_rank
        _require(rank in KDA_GATE_RANKS or (_is_int(rank) and rank > 0), "kda_gate_rank",
                 f"must be a positive integer or one of {KDA_GATE_RANKS}")
        _require(_is_int(self.mla_shared_key_dim) and self.mla_shared_key_dim >= 0, "mla_shared_key_dim",
                 "must be a non-negative integer")

        lb = self.kda_gate_lower_bound
        _require(lb is None or lb < 0, "kda_gate_lower_bound", "must be negative or null (unbounded)")
        _require(self.kda_implementation in KDA_IMPLEMENTATIONS, "kda_implementation",
                 f"must be one of {KDA_IMPLEMENTATIONS}")
        if self.kda_implementation == "fused":
            for field_name, rule in self.fused_kda_problems():
                _require(False, field_name, rule)

    # -- conveniences -------------------------------------------------------------

    def resolve_kda(self, cuda: bool) -> "KimiK3Config":
        """`kda_implementation: auto` made concrete for a device: "fused" (FLA's kernels) on
        CUDA when FLA is installed and the KDA settings are ones its kernel takes, else
        "chunkwise". Other values are returned unchanged."""
        if self.kda_implementation != "auto":
            return self
        fused_ok = not self.fused_kda_problems()
        return self.replace(kda_implementation="fused" if cuda and fused_ok and fla_installed() else "chunkwise")

    def fused_kda_problems(self) -> list[tuple[str, str]]:
        """(field, rule) for each KDA setting FLA's fused kernel cannot take (safe_gate needs a
        lower bound in [-5, 0)); empty when the fused path can run this config."""
        lb = self.kda_gate_lower_bound
        problems = []
        if self.kda_chunk_size not in FUSED_KDA_CHUNK_SIZES:
            problems.append(("kda_chunk_size", "must be 32 or 64 with kda_implementation='fused'"))
        if not (lb is not None and -5 <= lb < 0):
            problems.append(("kda_gate_lower_bound", "must lie in [-5, 0) with kda_implementation='fused'"))
        return problems

    # -- the implementation, as resolved (`resolve_kda`); read by the model, trainer and checks --

    @property
    def uses_fused_kda(self) -> bool:
        """KDA layers run FLA's kernels (`KDAFused`; on a CPU tensor it falls back to the
        padded reference). "auto" counts as not fused until resolved."""
        return self.kda_implementation == "fused"

    @property
    def uses_fused_attn_res(self) -> bool:
        """AttnRes mixtures run the fused kernels (`k3lab.ops.attn_res.fused`, on CUDA tensors): with the fused KDA path."""
        return self.use_attn_res and self.uses_fused_kda

    @property
    def seq_len_multiple(self) -> int:
        """What every sequence length must be a multiple of: the chunk size where chunkwise KDA
        runs (or may run: "auto"), else 1 (fused KDA pads, other layers take any length)."""
        return self.kda_chunk_size if "kda" in self.layer_types and not self.uses_fused_kda else 1

    def replace(self, **changes) -> "KimiK3Config":
        """A copy with some fields changed, validated again."""
        return attrs.evolve(self, **changes)

    def to_dict(self) -> dict:
        """Every field by name, in declaration order; layer_types as a list, as YAML and JSON hold it."""
        return attrs.asdict(self) | {"layer_types": list(self.layer_types)}

    @property
    def kda_gate_low_rank(self) -> int | None:
        """The rank of the KDA output gate's two Linears, or None for one full-rank Linear."""
        if self.kda_gate_rank == "full":
            return None
        return self.kda_head_dim if self.kda_gate_rank == "head_dim" else self.kda_gate_rank

    @property
    def schedule(self) -> str:
        """The layer schedule as letters, K for KDA and M for MLA, e.g. 'KKKMKKKM'."""
        return "".join("K" if t == "kda" else "M" for t in self.layer_types)


def fla_installed() -> bool:
    """Whether FLA (flash-linear-attention) can be imported, without importing it."""
    import importlib.util

    return importlib.util.find_spec("fla") is not None


def config_fields() -> tuple[str, ...]:
    return tuple(f.name for f in attrs.fields(KimiK3Config))


def tiny_config(**overrides) -> KimiK3Config:
    """A CPU-sized config (a few hundred thousand parameters) that exercises every
    component: KDA and MLA layers, dense and MoE layers, AttnRes with two blocks."""
    settings = dict(
        vocab_size=320,
        hidden_size=64,
        num_layers=4,
        layer_types=("kda", "kda", "mla", "kda"),
        max_seq_len=64,
        num_dense_layers=1,
        intermediate_size=128,
        attn_res_block_size=2,
        kda_num_heads=2,
        kda_head_dim=16,
        kda_chunk_size=8,
        mla_num_heads=2,
        mla_q_lora_rank=32,
        mla_kv_lora_rank=32,
        mla_qk_head_dim=16,
        mla_v_head_dim=16,
        num_experts=4,
        num_experts_per_token=2,
        num_shared_experts=1,
        moe_intermediate_size=32,
        moe_latent_size=32,
    )
    settings.update(overrides)
    return KimiK3Config(**settings)


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _require(ok: bool, field_name: str, rule: str) -> None:
    if not ok:
        raise ValueError(f"{field_name} {rule}")
