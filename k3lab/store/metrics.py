"""The names under which a trial's per-layer diagnostics reach MLflow, and their tables.

The training loop hands its diagnostics over as numbers per layer (`k3lab.train.metrics.diagnostics`);
here they get their names, all under one prefix so that the loss and throughput metrics come
first in every list of a run's metrics, with zero-padded layer numbers (L00 = model.layers[0])
so that layers sort in order:

    diag/moe/L01/load_max_min    max/min expert load over a logging window, per MoE layer
    diag/moe/L01/load_entropy    expert load entropy, 1 = balanced
    diag/attnres/L03/mix_entropy the AttnRes mixture's entropy over its depth candidates,
                                 normalised (1 = uniform, 0 = one candidate), mean of the layer's
                                 two sites (before attention, before the FFN)

and at each evaluation the full AttnRes mixtures as one table artifact:

    diag/attnres_mixture/step_000080.json   {"columns": [layer, site, c0, c1, ...], "data": rows}

(c0 = the embedding, the last = the live prefix; MLflow's `log_table` layout). Stores written
before k3lab 0.1's UI work have `moe/L{i}/...` and `attnres/L{i}/{site}/c{k}` instead; nothing
k3lab reports reads them.
"""

from __future__ import annotations

import math

DIAG = "diag"
MIXTURE_TABLE = DIAG + "/attnres_mixture/step_{step:06d}.json"


def layer_label(index: int) -> str:
    return f"L{index:02d}"


def normalised_entropy(weights: list[float]) -> float | None:
    """Entropy / log(K) of a mixture over K > 1 candidates; None for a single candidate."""
    if len(weights) < 2:
        return None
    total = sum(weights) or 1.0
    entropy = -sum(w / total * math.log(w / total) for w in weights if w > 0)
    return entropy / math.log(len(weights))


def diagnostic_metrics(diagnostics: dict[str, dict]) -> dict[str, float]:
    """{metric name: value} of one logging window's diagnostics."""
    out = {}
    for layer, values in sorted(diagnostics.get("moe", {}).items()):
        for name, value in values.items():
            out[f"{DIAG}/moe/{layer_label(layer)}/{name}"] = value
    for layer, sites in sorted(diagnostics.get("attn_res", {}).items()):
        entropies = [e for e in map(normalised_entropy, sites.values()) if e is not None]
        if entropies:
            out[f"{DIAG}/attnres/{layer_label(layer)}/mix_entropy"] = sum(entropies) / len(entropies)
    return out


def mixture_table(diagnostics: dict[str, dict]) -> dict | None:
    """The AttnRes mixtures as a table (one row per layer and site), or None without AttnRes."""
    mixtures = diagnostics.get("attn_res", {})
    if not mixtures:
        return None
    width = max(len(w) for sites in mixtures.values() for w in sites.values())
    rows = [[layer_label(layer), site, *weights, *[None] * (width - len(weights))]
            for layer, sites in sorted(mixtures.items()) for site, weights in sites.items()]
    return {"columns": ["layer", "site", *(f"c{k}" for k in range(width))], "data": rows}
