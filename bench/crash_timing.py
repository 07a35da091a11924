"""When a GPU sweep's trials crash, against the other trials' ends: read from sweep logs.

    python bench/crash_timing.py docs/runs/sweep_ceiling-2026-12-0[23]*fresh*.log --window 0.5

A sweep's log has a line when a trial starts, ends (`done at`) and crashes (the driver's clock:
when it heard of the crash). For each crash this lists the other trials that ended within
`--window` seconds before it, and compares the count with chance: a crash at a moment with no
tie to other trials' ends falls in such a window with the probability that the windows cover of
its sweep's span (first to last event). The p-value is that of seeing at least as many crashes
in a window, each crash with its own probability (a Poisson-binomial tail, computed exactly).
"""

from __future__ import annotations

import argparse
import re
from dataclasses import dataclass
from pathlib import Path

EVENT = re.compile(r"^\[\s*(?P<t>[\d.]+) s\]\s+\d+s\s+(?P<trial>\S+) (?P<kind>started|done at|crashed)")


@dataclass(frozen=True)
class Event:
    t: float  # seconds from the command's start
    trial: str
    kind: str  # "started", "done at" or "crashed"


@dataclass(frozen=True)
class Crash:
    log: str
    t: float
    trial: str
    ends_before: tuple[tuple[str, float], ...]  # (other trial, seconds before the crash line)
    chance: float  # of an other trial's end within the window before a crash at a random moment


def events(text: str) -> list[Event]:
    return [Event(float(m["t"]), m["trial"], m["kind"]) for m in map(EVENT.match, text.splitlines()) if m]


def covered(starts: list[float], width: float, lo: float, hi: float) -> float:
    """Length of the union of [s, s + width] over starts, clipped to [lo, hi]."""
    total, reach = 0.0, lo
    for s in sorted(starts):
        a, b = max(s, reach), min(s + width, hi)
        if b > a:
            total += b - a
            reach = b
    return total


def parts(found: list[Event]) -> list[list[Event]]:
    """The events of each command in a log (a sweep resumed in parts starts its clock again)."""
    if not found:
        return []
    split = [i for i in range(1, len(found)) if found[i].t < found[i - 1].t]
    return [found[a:b] for a, b in zip([0, *split], [*split, len(found)])]


def crashes(log: str, text: str, window: float) -> list[Crash]:
    return [c for part in parts(events(text)) for c in crashes_in_part(log, part, window)]


def crashes_in_part(log: str, found: list[Event], window: float) -> list[Crash]:
    lo, hi = found[0].t, found[-1].t
    result = []
    for crash in (e for e in found if e.kind == "crashed"):
        ends = [e for e in found if e.kind == "done at" and e.trial != crash.trial]
        near = tuple((e.trial, round(crash.t - e.t, 2)) for e in ends if 0 <= crash.t - e.t <= window)
        chance = covered([e.t for e in ends], window, lo, hi) / (hi - lo) if hi > lo else 0.0
        result.append(Crash(log, crash.t, crash.trial, near, chance))
    return result


def tail_probability(chances: list[float], observed: int) -> float:
    """P(at least `observed` successes) for independent trials with these probabilities."""
    counts = [1.0]  # counts[k]: P(k successes so far)
    for p in chances:
        counts = [(counts[k] if k < len(counts) else 0.0) * (1 - p) + (counts[k - 1] * p if k else 0.0)
                  for k in range(len(counts) + 1)]
    return sum(counts[observed:])


def report(all_crashes: list[Crash], window: float) -> str:
    lines = [f"| log | crash line (s) | trial | other trials ended within {window} s before |",
             "|---|---|---|---|"]
    for c in all_crashes:
        near = ", ".join(f"{trial} ({ago} s)" for trial, ago in c.ends_before) or "none"
        lines.append(f"| {c.log} | {c.t:.1f} | {c.trial} | {near} |")
    observed = sum(1 for c in all_crashes if c.ends_before)
    expected = sum(c.chance for c in all_crashes)
    p = tail_probability([c.chance for c in all_crashes], observed)
    lines.append(f"\n{len(all_crashes)} crashes; {observed} within {window} s after another trial's end, "
                 f"{expected:.1f} expected by chance (p = {p:.2g}).")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("logs", nargs="+", help="sweep logs (k3lab sweep or bench/sweep_ceiling.py output)")
    parser.add_argument("--window", type=float, default=0.5, help="seconds before a crash line (default 0.5)")
    args = parser.parse_args(argv)
    found = [c for log in args.logs for c in crashes(Path(log).name, Path(log).read_text(errors="replace"), args.window)]
    print(report(found, args.window))


if __name__ == "__main__":
    main()
