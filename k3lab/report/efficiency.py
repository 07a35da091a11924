"""How well a sweep used its hardware, from what its trials logged.

    sweep MFU = sum over trials (tokens trained x FLOPs per token) / (wall time x GPUs x peak)

Wall time is the sweep's own, start-up and kernel warm-up included: the figure says what
fraction of the GPUs' bf16 peak the whole sweep turned into training FLOPs. (nvidia-smi's
"utilisation" only says some kernel was running.) GPU count and peak come from the
cluster the sweep ran on; without GPUs the MFU is not reported.
"""

from __future__ import annotations

from k3lab.store.runs import trial_runs
from k3lab.train.metrics import peak_flops_of


def wall_to_the_end(start_ms: int | None, end_ms: int | None, trial_end_ms: list[int | None]) -> float | None:
    """Seconds from a sweep's start to its end. A sweep whose parent run never closed (its
    driver was stopped) ends with its last trial, once every trial has ended; else None."""
    if end_ms is None and trial_end_ms and all(trial_end_ms):
        end_ms = max(trial_end_ms)
    if not start_ms or not end_ms or end_ms <= start_ms:
        return None
    return (end_ms - start_ms) / 1000


def sweep_efficiency(trials: list[dict], wall_s: float, gpus: float, device_name: str | None,
                     warmup_s: float = 0.0) -> dict[str, float]:
    """trials: dicts with "tokens", "flops_per_token" and optionally "startup_s" (None when
    not logged). Returns the parent run's sweep_* metrics."""
    tokens = sum(t.get("tokens") or 0 for t in trials)
    flops = sum((t.get("tokens") or 0) * (t.get("flops_per_token") or 0) for t in trials)
    startups = [t["startup_s"] for t in trials if t.get("startup_s") is not None]
    out = {"sweep_tokens": float(tokens), "sweep_tokens_per_s": tokens / wall_s if wall_s > 0 else 0.0,
           "sweep_wall_s": wall_s, "kernel_warmup_s": warmup_s}
    if startups:
        out |= {"trial_startup_s_max": max(startups), "trial_startup_s_mean": sum(startups) / len(startups)}
    if gpus > 0:
        out["sweep_gpus"] = float(gpus)
    peak = peak_flops_of(device_name)
    if peak and gpus > 0 and wall_s > 0:
        out["sweep_mfu"] = flops / (wall_s * gpus * peak)
    return out


def trial_figures(tracking_uri: str, parent_run_id: str) -> list[dict]:
    """tokens, flops_per_token and startup_s of every trial run under the sweep's parent run."""
    return figures_of(trial_runs(tracking_uri, parent_run_id))


def figures_of(runs) -> list[dict]:
    """tokens, flops_per_token and startup_s of each MLflow run, as `sweep_efficiency` takes them."""
    return [{key: run.data.metrics.get(key) for key in ("tokens", "flops_per_token", "startup_s")} for run in runs]
