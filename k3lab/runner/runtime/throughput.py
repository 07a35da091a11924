"""A GPU sweep's measured aggregate throughput, per GPU model: what the plan's worst-case time reads.

The tokens a sweep's trials trained over the wall time of all its parts (start-ups, evaluations and
the warm-up included) is what the next sweep of the same trials on the same GPU model will do, at
the same packing. Each part of a GPU sweep adds it to the kernel cache's record when it ends,
finished or stopped:

    <kernel cache>/triton/k3lab-throughput.json  {trials key: {GPU name: {"tokens_per_s", "trials_at_once", ...}}}
    k3lab/tunings/sweep-throughput.json           the same, shipped: a GPU session's record, as its sweeps left it

The trials key is that of the variants' memory keys (`k3lab.runner.runtime.memory.variant_key`: model and
shapes), so another seeds policy or budget of the same trials keeps it. A sweep file's
`budget.tokens_per_s` overrides it.
"""

from __future__ import annotations

import contextlib
from datetime import datetime, timezone
from pathlib import Path

from k3lab.registry.model_variants import short_hash
from k3lab.runner.runtime.memory import read_record, variant_keys
from k3lab.runner.runtime.tunings import write_json

RECORD_NAME = "k3lab-throughput.json"
SHIPPED_RECORD = Path(__file__).resolve().parents[2] / "tunings" / "sweep-throughput.json"


def trials_key(sweep) -> str:
    return short_hash(sorted(variant_keys(sweep).values()))


def record_path(cache: Path) -> Path:
    return Path(cache) / "triton" / RECORD_NAME


def add_throughput(cache: Path, sweep, gpu: str, tokens_per_s: float, trials_at_once: int | None) -> None:
    """The latest measurement of `sweep`'s trials on `gpu`, in the cache's record (a record that
    cannot be written costs the plan its time estimate only)."""
    path = record_path(cache)
    with contextlib.suppress(OSError):
        record = read_record(path)
        record.setdefault(trials_key(sweep), {})[gpu] = {
            "sweep": sweep.name if sweep.profile is None else f"{sweep.name}-{sweep.profile}",
            "tokens_per_s": round(tokens_per_s), "trials_at_once": trials_at_once,
            "measured_at": datetime.now(timezone.utc).isoformat(timespec="seconds")}
        write_json(path, record)


def measured_rates(sweep, cache: Path | None) -> dict[str, dict]:
    """{GPU name: entry} for `sweep`'s trials: the shipped record overlaid with this machine's."""
    key = trials_key(sweep)
    rates = dict(read_record(SHIPPED_RECORD).get(key, {}))
    if cache is not None:
        rates |= read_record(record_path(cache)).get(key, {})
    return rates
