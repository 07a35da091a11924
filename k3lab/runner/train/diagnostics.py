"""Diagnostics of the architecture itself (MoE load, AttnRes mixtures) and the device's peak FLOP/s
(its table: `k3lab.model.counting.peak_flops_of`)."""

from __future__ import annotations

import os
import platform
import sys

import torch

from k3lab.model.counting import peak_flops_of


def peak_flops(device: torch.device) -> float | None:
    """The device's dense bf16 peak, or None when unknown (CPUs, other GPUs): MFU is then not reported."""
    if device.type != "cuda":
        return None
    return peak_flops_of(torch.cuda.get_device_name(device))


def device_name(device: torch.device) -> str:
    """What a trial ran on, for reports: the GPU's name, or the CPU's architecture and core count."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"CPU ({platform.machine() or 'unknown'}, {os.cpu_count()} cores)"


COMPILE_CACHE_COUNTERS = {  # torch's counter -> the metric's name after its prefix
    ("aot_autograd", "autograd_cache_hit"): "aot_cache_hits",
    ("aot_autograd", "autograd_cache_miss"): "aot_cache_misses",
    ("inductor", "fxgraph_cache_hit"): "fxgraph_cache_hits",
    ("inductor", "fxgraph_cache_miss"): "fxgraph_cache_misses",
}


def compile_cache_snapshot() -> dict[str, float]:
    """torch.compile's cache hits and misses in this process so far, {fxgraph_cache_misses: n, ...};
    {} when nothing was compiled (torch._dynamo never imported)."""
    utils = sys.modules.get("torch._dynamo.utils")
    if utils is None:
        return {}
    return {name: float(utils.counters[group][key]) for (group, key), name in COMPILE_CACHE_COUNTERS.items()}


def compile_cache_counts(since: dict[str, float] | None = None, prefix: str = "startup") -> dict[str, float]:
    """The hits and misses since `since` (an earlier snapshot; default: the process's start) as
    metrics, {prefix_fxgraph_cache_misses: n, ...}: whether a trial loaded its compiled graphs
    (hits) or compiled them again (misses)."""
    since = since or {}
    return {f"{prefix}_{name}": count - since.get(name, 0.0) for name, count in compile_cache_snapshot().items()}


def moe_loads(window_loads: list[dict[int, torch.Tensor]]) -> dict[int, dict]:
    """Per MoE layer over a window of steps: {layer: {"load_max_min": max/min expert load ratio,
    "load_entropy": the load entropy normalised to [0, 1] (1 = perfectly balanced), "load": each
    expert's share of the routed tokens}}."""
    if not window_loads or not window_loads[0]:
        return {}
    out = {}
    layers = sorted(window_loads[0])
    mean_loads = torch.stack([torch.stack([loads[i] for i in layers]) for loads in window_loads]).mean(0).cpu()
    for layer, load in zip(layers, mean_loads):
        load = load / load.sum().clamp(min=1e-12)
        entropy = -(load * load.clamp(min=1e-12).log()).sum() / torch.log(torch.tensor(float(len(load))))
        out[layer] = {"load_max_min": (load.max() / load.min().clamp(min=1e-6)).item(),
                      "load_entropy": entropy.item(), "load": load.tolist()}
    return out


def attn_res_mixtures(model) -> dict[int, dict[str, list[float]]]:
    """The mean AttnRes mixture weight on each depth candidate from the last training forward:
    {layer: {"attn" | "ffn": [weight of c0 (the embedding), c1, ...]}}."""
    return {i: {site: weights.float().cpu().tolist() for site, weights in layer.attn_res_weights.items()}
            for i, layer in enumerate(model.layers) if getattr(layer, "attn_res_weights", None)}


def diagnostics(model, window_loads: list[dict[int, torch.Tensor]]) -> dict[str, dict]:
    """What a trial tracks of the architecture itself, per layer: {"moe": moe_loads, "attn_res":
    attn_res_mixtures}. A tracker names and logs them (`log_diagnostics`; k3lab.store.metrics
    for MLflow)."""
    return {"moe": moe_loads(window_loads), "attn_res": attn_res_mixtures(model)}


def log_diagnostics(tracker, values: dict[str, dict], step: int, table: bool = False) -> None:
    """Hand them to the tracker, if it takes them (table: also in full, as tables, at evaluations)."""
    method = getattr(tracker, "log_diagnostics", None)
    if method is not None:
        method(values, step, table=table)
