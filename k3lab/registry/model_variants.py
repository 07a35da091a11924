"""Expanding axes into model variants: validation, normalisation, matching, ids.

Each point of the axes' product (and each explicit variant) becomes a
KimiK3Config through the config's own validation; a rejected variant keeps
the ValueError text. Before hashing, fields that cannot matter are reset to
the base's values (see `normalise`), so configs that build the same model
collapse: the later one is a "duplicate of <name>". A variant's id is the
first 12 hex digits of the sha256 of its config's canonical JSON (sorted
keys), stable across runs and machines.
"""

from __future__ import annotations

import hashlib
import itertools
import json
from typing import Any

import attrs

from k3lab.model.config import KimiK3Config
from k3lab.registry.axes import Axis, apply_overrides, axis_kind, check_no_conflicts, label
from k3lab.registry.convert import describe
from k3lab.registry.keypath import Path, SpecError
from k3lab.registry.matching import match_config
from k3lab.registry.sections import NAME_PATTERN, MatchSpec
from k3lab.registry.train_spec import TrainSpec

OK, REJECTED, DUPLICATE = "ok", "rejected", "duplicate"

MOE_FIELDS = ("num_experts", "num_experts_per_token", "num_shared_experts", "moe_intermediate_size",
              "moe_latent_size", "routed_scaling_factor", "moe_balance", "moe_bias_update_rate", "router_init")
KDA_FIELDS = ("kda_implementation", "kda_num_heads", "kda_head_dim", "kda_chunk_size", "kda_gate_lower_bound",
              "kda_conv_size", "kda_gate_rank", "kda_gate_bias", "kda_qk_l2norm")
MLA_FIELDS = ("mla_num_heads", "mla_q_lora_rank", "mla_kv_lora_rank", "mla_qk_head_dim", "mla_v_head_dim",
              "mla_shared_key_dim", "mla_output_gate", "mla_latent_norm_eps")


@attrs.frozen
class Point:
    """One requested variant before validation: axis values and an optional name."""

    overrides: dict[str, Any]
    name: str | None = None


@attrs.frozen
class Variant:
    """One model variant of a sweep. `config` is None when rejected; `matched`
    holds fields that parameter matching resized. A point of a baseline's compute curve
    (`compute: {scales: [...]}`) is the baseline `stretches` trained at `compute_scale` times the
    token budget: the same model, more (or fewer) steps, and no comparison of its own."""

    id: str
    name: str
    status: str
    overrides: dict[str, Any]
    seeds: tuple[int, ...]
    config: KimiK3Config | None = None
    reason: str | None = None
    matched: dict[str, int] = attrs.field(factory=dict)
    compute_scale: float = 1.0
    stretches: str | None = None

    @property
    def ok(self) -> bool:
        return self.status == OK

    def stretched(self, scale: float) -> "Variant":
        """This variant as a point of its compute curve: `<name>_x<scale>`, trained `scale` times as long."""
        return attrs.evolve(self, id=f"{self.id}x{scale:g}", name=f"{self.name}_x{scale:g}", compute_scale=scale,
                            stretches=self.name)

    def to_json(self) -> dict[str, Any]:
        """The JSON form `k3lab variants --json` prints."""
        return {
            "id": self.id, "name": self.name, "status": self.status, "reason": self.reason,
            "seeds": list(self.seeds), "overrides": _jsonable(self.overrides), "matched": dict(self.matched),
            "config": self.config.to_dict() if self.config is not None else None,
        } | ({"compute_scale": self.compute_scale, "stretches": self.stretches} if self.stretches else {})


def points(axes: tuple[Axis, ...], explicit: tuple[Point, ...] = ()) -> tuple[Point, ...]:
    """The product of the axes' values (none when there are no axes), then the explicit variants."""
    product = ()
    if axes:
        product = tuple(Point(dict(zip([a.name for a in axes], values)))
                        for values in itertools.product(*(a.values for a in axes)))
    return product + tuple(explicit)


def expand(base: KimiK3Config, base_fields: dict[str, Any], requested: tuple[Point, ...], seeds: tuple[int, ...],
           train: TrainSpec = TrainSpec(), match: MatchSpec | None = None) -> tuple[Variant, ...]:
    """Every requested point as a Variant (ok, rejected or duplicate), in order."""
    from k3lab.registry.counts import count  # torch: imported on first use

    target = count(base, train.seq_len).get(match.by) if match else None
    variants, seen_ids = [], {}
    for point, name in zip(requested, point_names(requested)):
        variant = attrs.evolve(_build(point, base, base_fields, seeds, train, match, target), name=name)
        if variant.ok and variant.id in seen_ids:
            variant = attrs.evolve(variant, status=DUPLICATE, reason=f"duplicate of {seen_ids[variant.id]}")
        elif variant.ok:
            seen_ids[variant.id] = variant.name
        variants.append(variant)
    return tuple(variants)


def point_names(requested: tuple[Point, ...]) -> list[str]:
    """The variant name of each point: its own name or its label, made unique with `_2`, `_3`, ..."""
    names: list[str] = []
    for point in requested:
        name = wanted = point.name or label(point.overrides)
        k = 2
        while name in names:
            name, k = f"{wanted}_{k}", k + 1
        names.append(name)
    return names


def _build(point: Point, base: KimiK3Config, base_fields: dict[str, Any], seeds: tuple[int, ...],
           train: TrainSpec, match: MatchSpec | None, target: int | None) -> Variant:
    name = point.name or label(point.overrides)
    try:
        config = normalise(KimiK3Config(**apply_overrides(base_fields, point.overrides)), base)
        check_trainable(config, train)
        unmatched = config
        if match is not None:
            config = match_config(config, target, match, train.seq_len)
    except ValueError as error:
        return Variant(id=short_hash({"rejected": _jsonable(point.overrides)}), name=name, status=REJECTED,
                       overrides=point.overrides, seeds=seeds, reason=str(error))
    matched = {match.adjust: getattr(config, match.adjust)} if config != unmatched else {}
    return Variant(id=config_id(config), name=name, status=OK, overrides=point.overrides, seeds=seeds,
                   config=config, matched=matched)


def inactive_fields(config: KimiK3Config) -> tuple[str, ...]:
    """The fields of a feature the model has switched off (AttnRes off; every layer dense; no KDA or
    no MLA layer): they do not shape it, their values are only the defaults."""
    fields = ["attn_res_block_size", "attn_res_proj_init"] if not config.use_attn_res else []
    unused = ((config.num_dense_layers == config.num_layers, MOE_FIELDS),
              ("kda" not in config.layer_types, KDA_FIELDS),
              ("mla" not in config.layer_types, MLA_FIELDS))
    for is_unused, names in unused:
        if is_unused:
            fields += names
    return tuple(fields)


def normalise(config: KimiK3Config, base: KimiK3Config) -> KimiK3Config:
    """`config` with fields that cannot change the model (`inactive_fields`) reset to the base's,
    and any block size >= num_layers (all keep only the embedding as an endpoint) set to
    num_layers. Kept as is when the reset would not validate."""
    resets: dict[str, Any] = {name: getattr(base, name) for name in inactive_fields(config)}
    if config.use_attn_res and config.attn_res_block_size > config.num_layers > 0:
        resets["attn_res_block_size"] = config.num_layers
    try:
        return config.replace(**resets)
    except ValueError:
        return config


def check_trainable(config: KimiK3Config, train: TrainSpec) -> None:
    """ValueError when the model cannot train on `train.seq_len` tokens."""
    if train.seq_len > config.max_seq_len:
        raise ValueError(f"train.seq_len={train.seq_len} exceeds max_seq_len={config.max_seq_len}")
    if train.seq_len % config.seq_len_multiple:
        raise ValueError(f"train.seq_len={train.seq_len} is not a multiple of kda_chunk_size={config.kda_chunk_size}")


# fields added after sweeps were run, with the value every config had before: left out of the
# id at that value, so a sweep started before a field existed still resumes (same ids)
ADDED_FIELDS = {"residual_in_fp32": True}


def config_id(config: KimiK3Config) -> str:
    """The stable id of a config: sha256 of its canonical JSON, 12 hex digits."""
    fields = {k: v for k, v in config.to_dict().items() if not (k in ADDED_FIELDS and v == ADDED_FIELDS[k])}
    return short_hash(fields)


def short_hash(data: Any) -> str:
    text = json.dumps(data, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def _jsonable(overrides: dict[str, Any]) -> dict[str, Any]:
    return {k: list(v) if isinstance(v, tuple) else v for k, v in overrides.items()}


def parse_explicit(raw: list[Any], path: Path = ("variants",)) -> tuple[Point, ...]:
    """The `variants` list: mappings of axis names to single values, with an
    optional `name`."""
    explicit, named = [], {}
    for i, entry in enumerate(raw):
        where = path + (i,)
        if not isinstance(entry, dict):
            raise SpecError(where, f"expected a mapping of axis names to values, got {describe(entry)}")
        overrides = {k: v for k, v in entry.items() if k != "name"}
        name = entry.get("name")
        if name is not None and not (isinstance(name, str) and NAME_PATTERN.match(name)):
            raise SpecError(where + ("name",), f"expected a name of letters, digits, '_', '.' or '-', got {describe(name)}")
        if name in named:
            raise SpecError(where + ("name",), f"{name!r} is already the name of variants[{named[name]}]; "
                                               f"a variant's name must be unique (it names its runs and results)")
        if name is not None:
            named[name] = i
        parsed = {key: axis_kind(key, where + (key,)).parse(value, where + (key,)) for key, value in overrides.items()}
        check_no_conflicts(list(parsed), where)
        explicit.append(Point(parsed, name))
    return tuple(explicit)
