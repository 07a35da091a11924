"""How well a sweep used its hardware, from what its trials logged.

    sweep MFU = sum over trials (tokens trained x FLOPs per token) / (wall time x GPUs x peak)

Wall time is the sweep's own, start-up and kernel warm-up included: the figure says what
fraction of the GPUs' bf16 peak the whole sweep turned into training FLOPs. (nvidia-smi's
"utilisation" only says some kernel was running.) GPU count and peak come from the
cluster the sweep ran on; without GPUs the MFU is not reported.

`time_shares` says where the trials' time went (wall time x trials at once): training,
evaluating, starting up: where a sweep's tokens/s falls short of one trial alone's (the shares
of measured sweeps: docs/benchmarks.md, "Sweep sizing").
"""

from __future__ import annotations

from k3lab.store.runs import client, crash_count, oom_restart_count
from k3lab.model.counting import peak_flops_of


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


def figures_of(runs) -> list[dict]:
    """tokens, flops_per_token and startup_s of each MLflow run, as `sweep_efficiency` takes them."""
    return [{key: run.data.metrics.get(key) for key in ("tokens", "flops_per_token", "startup_s")} for run in runs]


SHARES = ("training", "evaluating", "starting")  # sweep_share_<name>: parent metrics, fractions of the trials' time
SHARE_LABELS = {"starting": "starting up"}


def time_shares(tracking_uri: str, trials: list, wall_s: float, slots: int | None = None) -> dict[str, float]:
    """Where the trials' time went: fractions of wall_s x `slots` (default: the most trials that
    ran at once) spent training, evaluating (with each evaluation's checkpoint and report) and
    starting up (every attempt's process start, build, compile, CUDA-graph capture and first
    step). The rest is slots left empty, the steps a crashed attempt trained past its last
    checkpoint, and trials' closes. Empty when no trial logged a start-up (a sweep from before
    these metrics)."""
    store = client(tracking_uri)
    training = evaluating = starting = 0.0
    spans = []
    for trial in trials:
        startups = sorted(store.get_metric_history(trial.info.run_id, "startup_s"), key=lambda m: m.timestamp)
        if not startups:
            continue
        starting += sum(m.value for m in startups)
        spans.append((startups[0].timestamp / 1000 - startups[0].value, (trial.info.end_time or 0) / 1000))
        trained, evaluated = trial_work(store, trial, startups)
        training, evaluating = training + trained, evaluating + evaluated
    slots = slots or most_at_once(spans)
    if not spans or not slots or wall_s <= 0:
        return {}
    total = wall_s * slots
    return {f"sweep_share_{name}": value / total
            for name, value in zip(SHARES, (training, evaluating, starting))} | {"sweep_slots": float(slots)}


def trial_work(store, trial, startups: list) -> tuple[float, float]:
    """(training, evaluating) seconds of one trial, over its attempts (`startups`: each attempt's
    `startup_s`, logged at its first step, in order).

    Attempt i trained from its first step to the step before attempt i+1's first (the step after
    the checkpoint it restarted from); the last one to the end. Each attempt's training is its
    steps' tokens over the trial's mean training rate (`avg_tokens_per_s`, the last attempt's),
    less its first step (compile and all), which `startup_s` already counts as starting up. The
    last attempt's evaluating is its loop's time (`train_wall_s`) less its training; an earlier
    attempt evaluated as much per second trained. Steps trained after the last checkpoint of a
    crashed attempt are in neither. (0, 0) for a trial with no finished loop."""
    metrics = trial.data.metrics
    if not all(key in metrics for key in ("tokens", "avg_tokens_per_s", "train_wall_s")):
        return 0.0, 0.0
    final_step = max(m.step for m in store.get_metric_history(trial.info.run_id, "tokens"))
    seconds_per_step = metrics["tokens"] / final_step / metrics["avg_tokens_per_s"]
    ends = [m.step for m in startups[1:]] + [final_step + 1]
    seconds = [(end - start.step) * seconds_per_step for start, end in zip(startups, ends)]
    evaluating_per_second = max(0.0, metrics["train_wall_s"] - seconds[-1]) / seconds[-1] if seconds[-1] > 0 else 0.0
    first_steps = first_steps_in_loop(store, trial.info.run_id, startups)
    training = sum(max(0.0, s - first) for s, first in zip(seconds, first_steps))
    return training, sum(seconds) * evaluating_per_second


def first_steps_in_loop(store, run_id: str, startups: list) -> list[float]:
    """Per attempt, the part of its `startup_s` that ran inside its training loop (its first
    step): `startup_s` less that attempt's build (`startup_build_s`: the last one logged before
    it, and after the attempt before; an attempt that trained no step logs a build and no
    `startup_s`); 0 for attempts that did not log a build."""
    builds = sorted(store.get_metric_history(run_id, "startup_build_s"), key=lambda m: m.timestamp)
    matched, after = [], 0
    for start in startups:
        build = next((b for b in reversed(builds) if after <= b.timestamp <= start.timestamp), None)
        matched.append(max(0.0, start.value - build.value) if build else 0.0)
        after = start.timestamp + 1
    return matched


def most_at_once(spans: list[tuple[float, float]]) -> int:
    """The most (start, end) spans open at one moment."""
    events = sorted([(start, 1) for start, end in spans if end > start] +
                    [(end, -1) for start, end in spans if end > start])
    most = open_now = 0
    for _, change in events:
        open_now += change
        most = max(most, open_now)
    return most


def crashes(trials: list) -> dict[str, float]:
    """`sweep_crashes`: how often the sweep's trials crashed (a segfault, a lost worker) and went
    on from their last checkpoint, over every part of the sweep (each trial's `k3lab.crashes`);
    `sweep_restarts_oom`: how often they ran out of GPU memory and went on so. Each cost a process
    start and build, and the steps since that checkpoint."""
    return {"sweep_crashes": float(sum(crash_count(trial.data.tags) for trial in trials)),
            "sweep_restarts_oom": float(sum(oom_restart_count(trial.data.tags) for trial in trials))}


def efficiency_line(e: dict) -> str:
    """The sweep's hardware use in one line, from its sweep_* figures (those of this module)."""
    mfu = f"sweep MFU {e['sweep_mfu']:.1%}" if "sweep_mfu" in e else "sweep MFU n/a (no known GPU)"
    times = [f"kernel warm-up {e['kernel_warmup_s']:.1f} s"] if e.get("kernel_warmup_s") else []
    if "trial_startup_s_max" in e:
        times.append(f"trial start-up up to {e['trial_startup_s_max']:.1f} s")
    parts = parts_note(e.get("sweep_parts", 1))
    return (f"sweep: {e['sweep_tokens']:,.0f} tokens in {e['sweep_wall_s']:.0f} s{parts} = {e['sweep_tokens_per_s']:,.0f} "
            f"tokens/s, {mfu}" + (f"; {', '.join(times)}" if times else "") + shares_clause(e) + crashes_clause(e))


def parts_note(parts: float) -> str:
    """What follows a wall time that sums a sweep's parts (a first run and its resumes)."""
    return f" (the sum of {int(parts)} parts)" if parts > 1 else ""


def crashes_clause(e: dict) -> str:
    """The trials' restarts from a checkpoint by cause (`crashes`): '; restarts: 0' or
    '; restarts: 3 (out of memory 2, crashed 1)'; nothing for a report without the counts (an older store)."""
    if "sweep_crashes" not in e:
        return ""
    oom, crashed = int(e.get("sweep_restarts_oom") or 0), int(e.get("sweep_crashes") or 0)
    causes = [f"{label} {n}" for label, n in (("out of memory", oom), ("crashed", crashed)) if n]
    return f"; restarts: {oom + crashed}" + (f" ({', '.join(causes)})" if causes else "")


def shares_clause(e: dict) -> str:
    """Where the trials' time went (`time_shares`), where it is known."""
    if "sweep_slots" not in e:
        return ""
    shares = ", ".join(f"{e[f'sweep_share_{name}']:.0%} {SHARE_LABELS.get(name, name)}" for name in SHARES)
    return f"; {e['sweep_slots']:.0f} trials at once spent {shares}"
