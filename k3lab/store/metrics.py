"""The names under which a trial's metrics reach MLflow's run page, its per-layer diagnostics, and their tables.

MLflow's run page makes one chart section of every metric name's part before its last "/", sorts
the named sections alphabetically and puts the unnamed "Model metrics" section (train_loss,
val_loss, ...) after all of them. So that a trial's page opens on its loss, then its throughput,
then its diagnostics, the loss and throughput are also logged under `loss/` and `perf/`
(`with_page_sections`; the plain names stay what sweeps, reports and views read), and the
diagnostics sit under `probe/`, which sorts after both.

The training loop hands its diagnostics over as numbers per layer (`k3lab.runner.train.diagnostics.diagnostics`);
here they get their names: all under one prefix, one summary series per layer, zero-padded layer
numbers (L00 = model.layers[0]) so that layers sort in order:

    probe/attnres_entropy/L03  the AttnRes mixture's entropy over its depth candidates, normalised
                               (1 = uniform, 0 = one candidate), mean of the layer's two sites
                               (before attention, before the FFN)
    probe/moe_balance/L01      the MoE layer's expert load entropy, normalised (1 = balanced),
                               over a logging window

The name ends in the layer so that these give two sections ("probe/attnres_entropy",
"probe/moe_balance") with a chart per layer, in order, instead of a section per layer and site.

At each evaluation the full picture goes into table artifacts (MLflow's `log_table` layout,
{"columns", "data"}):

    probe/attnres_mixture/step_000080.json  layer, site, c0, c1, ... (c0 = the embedding, the last
                                            = the live prefix)
    probe/moe_load/step_000080.json         layer, load_entropy, load_max_min, e0, e1, ... (each
                                            expert's share of the routed tokens)

Stores written before had the diagnostics under `diag/` (and before that `moe/L{i}/...`,
`attnres/L{i}/{site}/c{k}`), which sort before the loss; nothing k3lab reports reads them, and
`regroup_diagnostics` moves them under `probe/` (`k3lab ui` on such a store).
"""

from __future__ import annotations

import math

PROBE = "probe"
ATTN_RES, MOE = PROBE + "/attnres_entropy", PROBE + "/moe_balance"
MIXTURE_TABLE = PROBE + "/attnres_mixture/step_{step:06d}.json"
LOAD_TABLE = PROBE + "/moe_load/step_{step:06d}.json"
PAGE_SECTIONS = {"train_loss": "loss/train_loss", "val_loss": "loss/val_loss",  # loss < perf < probe
                 "tokens_per_s": "perf/tokens_per_s", "mfu": "perf/mfu"}


OLDER_DIAGNOSTICS = ("diag/", "moe/", "attnres/")  # where older stores kept the diagnostics now under probe/


def regroup_diagnostics(database, run_ids: list[str]) -> int:
    """Rename the runs' diagnostics under an older store's sections (OLDER_DIAGNOSTICS: `diag/X`,
    `moe/...`, `attnres/...`) to `probe/X`, in the SQLite `database` (MLflow has no API to rename a
    metric), so that their page opens on the loss; other sections (MLflow's `system/` metrics) stay.
    Returns the metric names renamed."""
    import sqlite3

    renamed = 0
    with sqlite3.connect(database) as connection:
        for run_id in run_ids:
            keys = [key for (key,) in connection.execute(
                "SELECT DISTINCT key FROM latest_metrics WHERE run_uuid = ?", (run_id,))]
            for key in keys:
                if key.startswith(OLDER_DIAGNOSTICS):
                    new = f"{PROBE}/{key.removeprefix('diag/')}"
                    for table in ("metrics", "latest_metrics"):
                        connection.execute(f"UPDATE {table} SET key = ? WHERE run_uuid = ? AND key = ?",
                                           (new, run_id, key))
                    renamed += 1
    return renamed


def with_page_sections(metrics: dict[str, float]) -> dict[str, float]:
    """`metrics` and, for the loss and throughput, their copies under the run page's first sections."""
    return metrics | {PAGE_SECTIONS[k]: v for k, v in metrics.items() if k in PAGE_SECTIONS}


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
    """{metric name: value} of one logging window's diagnostics: one per layer."""
    out = {}
    for layer, values in sorted(diagnostics.get("moe", {}).items()):
        out[f"{MOE}/{layer_label(layer)}"] = values["load_entropy"]
    for layer, sites in sorted(diagnostics.get("attn_res", {}).items()):
        entropies = [e for e in map(normalised_entropy, sites.values()) if e is not None]
        if entropies:
            out[f"{ATTN_RES}/{layer_label(layer)}"] = sum(entropies) / len(entropies)
    return out


def padded(values: list, width: int) -> list:
    return [*values, *[None] * (width - len(values))]


def diagnostic_tables(diagnostics: dict[str, dict], step: int) -> dict[str, dict]:
    """{artifact file: table} of the AttnRes mixtures (one row per layer and site) and the MoE
    loads (one row per layer) at `step`; those the model has."""
    tables = {}
    mixtures = diagnostics.get("attn_res", {})
    if mixtures:
        width = max(len(w) for sites in mixtures.values() for w in sites.values())
        rows = [[layer_label(layer), site, *padded(weights, width)]
                for layer, sites in sorted(mixtures.items()) for site, weights in sites.items()]
        tables[MIXTURE_TABLE.format(step=step)] = {"columns": ["layer", "site", *(f"c{k}" for k in range(width))],
                                                   "data": rows}
    loads = diagnostics.get("moe", {})
    if loads:
        width = max(len(v.get("load", [])) for v in loads.values())
        rows = [[layer_label(layer), v["load_entropy"], v["load_max_min"], *padded(v.get("load", []), width)]
                for layer, v in sorted(loads.items())]
        tables[LOAD_TABLE.format(step=step)] = {
            "columns": ["layer", "load_entropy", "load_max_min", *(f"e{k}" for k in range(width))], "data": rows}
    return tables
