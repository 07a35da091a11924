"""Sweep axes: KimiK3Config fields and derived axes.

An axis maps a name to values; each value turns into config field overrides.
Any KimiK3Config field is an axis. Derived axes make common ablations one line:

- `layer_schedule`: K/M letters (`KKKM`, tiled when shorter than num_layers and
  dividing it), a ratio `"3:1"` (three KDA layers per MLA layer, the last layer
  always MLA, via `kimi_linear_schedule`; `"1:0"` is all KDA, `"0:1"` all MLA),
  or `all_kda` / `all_mla`. Quote ratios in YAML: an unquoted 3:1 is the
  base-60 integer 181.
- `attn_res_block_size`: a block size in decoder layers (AttnRes on), `off`
  or null (use_attn_res=False, the standard residual baseline), or `full`:
  full-depth AttnRes at decoder-layer granularity, which is block size 1
  (every decoder layer closes its own block, so every layer's output is a
  candidate). The paper's Full AttnRes also splits attention and FFN
  sub-layers; k3lab's block size counts whole decoder layers.
- `num_dense_layers`: an integer or `all` (every layer dense: no MoE).
- `ffn`: `dense` (all layers dense), `moe` (plain MoE, experts at full
  width: moe_latent_size=null) or `latent_moe` (the base's latent width, or
  hidden_size // 2 when the base has none).
- `fidelity`: `design`, `k3` or `kimi_linear`: every choice where the design
  document and the published models differ, at once (`k3lab.model.fidelity`).

Values are checked for type when the sweep is loaded (a `SpecError` at e.g.
`axes.attn_res_block_size[2]`); whether a whole variant is a valid model is
decided later by KimiK3Config itself.
"""

from __future__ import annotations

import re
from typing import Any, Callable

import attrs

from k3lab.model.config import KimiK3Config, kimi_linear_schedule
from k3lab.model.fidelity import FIDELITIES, fidelity_field_names, fidelity_fields
from k3lab.registry.convert import describe
from k3lab.registry.fields import check_field, field_types, is_field, unknown_field
from k3lab.registry.keypath import Path, SpecError

Fields = dict[str, Any]

# short names for readable variant names: alias + value, e.g. top2, experts16, L12
ALIASES = {
    "hidden_size": "h", "num_layers": "L", "intermediate_size": "inter", "num_experts": "experts",
    "num_experts_per_token": "top", "num_shared_experts": "shared", "moe_intermediate_size": "moeinter",
    "moe_latent_size": "latent", "kda_chunk_size": "chunk", "kda_num_heads": "kdaheads",
    "kda_head_dim": "kdadim", "kda_gate_lower_bound": "lb", "kda_implementation": "kda",
    "mla_num_heads": "mlaheads", "mla_q_lora_rank": "qrank", "mla_kv_lora_rank": "kvrank",
    "max_seq_len": "seq", "use_attn_res": "attnres", "vocab_size": "vocab", "moe_balance": "balance",
    "routed_scaling_factor": "rscale", "moe_bias_update_rate": "biasrate", "init_std": "init",
    "kda_gate_rank": "kdagate", "kda_gate_bias": "kdagatebias", "kda_qk_l2norm": "l2norm",
    "mla_shared_key_dim": "sharedkey", "mla_output_gate": "mlagate", "mla_latent_norm_eps": "latenteps",
    "tie_word_embeddings": "tied", "rms_norm_eps": "eps", "attn_res_proj_init": "attnresinit",
    "router_init": "routerinit", "ffn_activation": "act", "residual_in_fp32": "fp32res",
}


@attrs.frozen
class AxisKind:
    """How one axis name parses its values, which fields it writes, and how a
    value reads in a variant name."""

    name: str
    writes: frozenset[str]
    parse: Callable[[Any, Path], Any]
    apply: Callable[[Any, Fields], Fields]
    label: Callable[[Any], str]


@attrs.frozen
class Axis:
    """One axis of a sweep with its parsed values."""

    name: str
    values: tuple


def current(fields: Fields, name: str) -> Any:
    """The value of config field `name` given overrides `fields` (else the default)."""
    if name in fields:
        return fields[name]
    return {f.name: f.default for f in attrs.fields(KimiK3Config)}[name]


# -- plain config fields ------------------------------------------------------------


def _plain(name: str) -> AxisKind:
    return AxisKind(
        name=name,
        writes=frozenset({name}),
        parse=lambda value, path: check_field(name, value, path),
        apply=lambda value, fields: {name: value},
        label=lambda value: _label(ALIASES.get(name, name), value),
    )


def _label(alias: str, value: Any) -> str:
    if value is None:
        return f"{alias}_none"
    if isinstance(value, bool):
        return f"{alias}_{'on' if value else 'off'}"
    if isinstance(value, (int, float)):
        return f"{alias}{value:g}" if len(alias) <= 2 or alias in ALIASES.values() else f"{alias}_{value:g}"
    if isinstance(value, (tuple, list)):
        return f"{alias}_{''.join(str(v)[0].upper() for v in value)}"
    return f"{alias}_{value}"


# -- layer_schedule -----------------------------------------------------------------

_RATIO = re.compile(r"^\s*(\d+)\s*:\s*(\d+)\s*$")
_LETTERS = re.compile(r"^[KMkm]+$")


def _parse_schedule(value: Any, path: Path) -> str:
    if isinstance(value, int) and not isinstance(value, bool) and value >= 60:
        raise SpecError(path, f"got the integer {value}; quote ratios such as '3:1' (YAML reads an unquoted "
                              "3:1 as a base-60 number)")
    if not isinstance(value, str):
        raise SpecError(path, f"expected K/M letters, a ratio such as '3:1', all_kda or all_mla, got {describe(value)}")
    if value in ("all_kda", "all_mla") or _LETTERS.match(value):
        return value if value.startswith("all_") else value.upper()
    match = _RATIO.match(value)
    if not match:
        raise SpecError(path, f"expected K/M letters, a ratio such as '3:1', all_kda or all_mla, got {value!r}")
    kda, mla = int(match[1]), int(match[2])
    if kda + mla == 0 or (kda and mla and kda % mla):
        raise SpecError(path, f"ratio {value!r} must reduce to n:1, 1:0 (all KDA) or 0:1 (all MLA)")
    return f"{kda}:{mla}"


def schedule_layer_types(value: str, num_layers: int) -> tuple[str, ...]:
    """The layer_types of a parsed layer_schedule value for `num_layers` layers."""
    if value in ("all_kda", "all_mla"):
        return (value[4:],) * num_layers
    if ":" in value:
        kda, mla = (int(part) for part in value.split(":"))
        if mla == 0:
            return ("kda",) * num_layers
        return kimi_linear_schedule(num_layers, kda // mla)
    if num_layers % len(value):
        raise ValueError(f"layer_schedule {value!r} does not fit num_layers={num_layers} "
                         "(its length must divide num_layers)")
    letters = value * (num_layers // len(value))
    return tuple("kda" if letter == "K" else "mla" for letter in letters)


def _schedule_label(value: str) -> str:
    return "sched_" + value.replace(":", "to")


LAYER_SCHEDULE = AxisKind(
    name="layer_schedule",
    writes=frozenset({"layer_types"}),
    parse=_parse_schedule,
    apply=lambda value, fields: {"layer_types": schedule_layer_types(value, current(fields, "num_layers"))},
    label=_schedule_label,
)


# -- attn_res_block_size ------------------------------------------------------------


def _parse_block_size(value: Any, path: Path) -> int | str:
    if value is None or value is False or value == "off":  # YAML reads a bare `off` as false
        return "off"
    if value == "full":
        return "full"
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    raise SpecError(path, f"expected a block size (decoder layers), off or full, got {describe(value)}")


def _apply_block_size(value: int | str, fields: Fields) -> Fields:
    if value == "off":
        return {"use_attn_res": False}
    return {"use_attn_res": True, "attn_res_block_size": 1 if value == "full" else value}


ATTN_RES_BLOCK_SIZE = AxisKind(
    name="attn_res_block_size",
    writes=frozenset({"use_attn_res", "attn_res_block_size"}),
    parse=_parse_block_size,
    apply=_apply_block_size,
    label=lambda value: f"attnres_{value}" if isinstance(value, str) else f"attnres_bs{value}",
)


# -- num_dense_layers and ffn -------------------------------------------------------


def _parse_dense_layers(value: Any, path: Path) -> int | str:
    if value == "all":
        return "all"
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    raise SpecError(path, f"expected an integer or all, got {describe(value)}")


NUM_DENSE_LAYERS = AxisKind(
    name="num_dense_layers",
    writes=frozenset({"num_dense_layers"}),
    parse=_parse_dense_layers,
    apply=lambda value, fields: {
        "num_dense_layers": current(fields, "num_layers") if value == "all" else value},
    label=lambda value: "dense_all" if value == "all" else f"dense{value}",
)

FFN_KINDS = ("dense", "moe", "latent_moe")


def _parse_ffn(value: Any, path: Path) -> str:
    if value not in FFN_KINDS:
        raise SpecError(path, f"expected one of {', '.join(FFN_KINDS)}, got {describe(value)}")
    return value


def _apply_ffn(value: str, fields: Fields) -> Fields:
    if value == "dense":
        return {"num_dense_layers": current(fields, "num_layers")}
    if value == "moe":
        return {"moe_latent_size": None}
    latent = current(fields, "moe_latent_size")
    return {"moe_latent_size": latent if latent is not None else current(fields, "hidden_size") // 2}


FFN = AxisKind(
    name="ffn",
    writes=frozenset({"num_dense_layers", "moe_latent_size"}),
    parse=_parse_ffn,
    apply=_apply_ffn,
    label=lambda value: f"ffn_{value}",
)

# -- fidelity -----------------------------------------------------------------------


def _parse_fidelity(value: Any, path: Path) -> str:
    if value not in FIDELITIES:
        raise SpecError(path, f"expected one of {', '.join(FIDELITIES)}, got {describe(value)}")
    return value


def apply_fidelity(value: str, fields: Fields) -> Fields:
    """The fields fidelity `value` sets, for the model `fields` describe (its MLA head dim)."""
    return fidelity_fields(value, current(fields, "mla_qk_head_dim"))


FIDELITY = AxisKind(
    name="fidelity",
    writes=fidelity_field_names(),
    parse=_parse_fidelity,
    apply=apply_fidelity,
    label=lambda value: f"fidelity_{value}",
)

DERIVED = {kind.name: kind for kind in (LAYER_SCHEDULE, ATTN_RES_BLOCK_SIZE, NUM_DENSE_LAYERS, FFN, FIDELITY)}


# -- lookup, parsing, application ---------------------------------------------------


def axis_names() -> tuple[str, ...]:
    """Every name an axis may have: the config fields and the derived axes."""
    return tuple(field_types()) + tuple(n for n in DERIVED if not is_field(n))


def axis_kind(name: Any, path: Path) -> AxisKind:
    """The kind of axis `name`; `SpecError` at `path` when it names nothing."""
    if isinstance(name, str) and name in DERIVED:
        return DERIVED[name]
    if isinstance(name, str) and is_field(name):
        return _plain(name)
    raise SpecError(path, f"unknown axis: {unknown_field(name, tuple(DERIVED))} nor a derived axis "
                          f"({', '.join(n for n in DERIVED if not is_field(n))})")


def parse_axes(raw: dict[str, Any], path: Path = ("axes",)) -> tuple[Axis, ...]:
    """The `axes` mapping as Axis objects, each value parsed."""
    axes = []
    for name, values in raw.items():
        kind = axis_kind(name, path + (name,))
        if not isinstance(values, list):
            raise SpecError(path + (name,), f"expected a non-empty list of values, got {describe(values)}")
        if not values:
            raise SpecError(path + (name,), "must list at least one value")
        axes.append(Axis(name, tuple(kind.parse(v, path + (name, i)) for i, v in enumerate(values))))
    check_no_conflicts([a.name for a in axes], path)
    return tuple(axes)


def check_no_conflicts(names: list[str], path: Path) -> None:
    """Two axes (or overrides) that write the same config field are an error."""
    seen: dict[str, str] = {}
    for name in names:
        for written in sorted(axis_kind(name, path).writes):
            if written in seen:
                raise SpecError(path + (name,), f"sets {written}, which {seen[written]} also sets")
            seen[written] = name


def apply_overrides(base_fields: Fields, overrides: dict[str, Any]) -> Fields:
    """Config fields for base + parsed axis values: config-field axes first, then
    the derived ones (which read num_layers, hidden_size, ... from the result)."""
    fields = dict(base_fields)
    kinds = {name: axis_kind(name, ()) for name in overrides}
    for name, value in overrides.items():
        if name not in DERIVED:
            fields.update(kinds[name].apply(value, fields))
    for name, value in overrides.items():
        if name in DERIVED:
            fields.update(kinds[name].apply(value, fields))
    return fields


def label(overrides: dict[str, Any]) -> str:
    """A readable name for one set of axis values, e.g. 'sched_3to1_dense2'."""
    parts = [axis_kind(name, ()).label(value) for name, value in overrides.items()]
    return re.sub(r"[^A-Za-z0-9_.-]", "_", "_".join(parts)) or "base"
