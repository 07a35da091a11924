"""When a GPU sweep's trials crash: at their own start, or mid-run as another trial ends.

    python bench/crash_timing.py docs/runs/sweep_ceiling-2026-12-0[23]*fresh*.log --window 0.5

A sweep's log has a line when a trial starts, ends (`done at`) and crashes (the driver's clock:
when it heard of the crash). A crash within `--window` seconds of its trial's own start line is
one at the start; in a reused process that start comes as the process's previous trial ends, so
the trials that ended just before it are listed too. For the others (mid-run) the count of those
with another trial's end within the window before them is set against chance: a crash at a
moment with no tie to the ends falls in such a window with the probability that the windows
cover of its sweep's span (first to last event); the p-value is that of at least as many, each
crash with its own probability (a Poisson-binomial tail, computed exactly).
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import attrs

EVENT = re.compile(r"^\[\s*(?P<t>[\d.]+) s\]\s+\d+s\s+(?P<trial>\S+) (?P<kind>started|done at|crashed)")


@attrs.frozen
class Event:
    t: float  # seconds from the command's start
    trial: str
    kind: str  # "started", "done at" or "crashed"


@attrs.frozen
class Crash:
    log: str
    t: float
    trial: str
    since_start: float  # seconds from its trial's last start line (inf: none in the log)
    ends_before: tuple[tuple[str, float], ...]  # (other trial, seconds before the crash line)
    chance: float  # of an other trial's end within the window before a crash at a random moment
    window: float

    @property
    def at_start(self) -> bool:
        return self.since_start <= self.window


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
        starts = [e.t for e in found if e.kind == "started" and e.trial == crash.trial and e.t <= crash.t]
        since_start = crash.t - max(starts) if starts else float("inf")
        result.append(Crash(log, crash.t, crash.trial, round(since_start, 2), near, chance, window))
    return result


def tail_probability(chances: list[float], observed: int) -> float:
    """P(at least `observed` successes) for independent trials with these probabilities."""
    counts = [1.0]  # counts[k]: P(k successes so far)
    for p in chances:
        counts = [(counts[k] if k < len(counts) else 0.0) * (1 - p) + (counts[k - 1] * p if k else 0.0)
                  for k in range(len(counts) + 1)]
    return sum(counts[observed:])


def report(all_crashes: list[Crash], window: float) -> str:
    lines = [f"| log | crash line (s) | trial | from its start (s) | other trials ended within {window} s before |",
             "|---|---|---|---|---|"]
    for c in all_crashes:
        near = ", ".join(f"{trial} ({ago} s)" for trial, ago in c.ends_before) or "none"
        lines.append(f"| {c.log} | {c.t:.1f} | {c.trial} | {c.since_start:g} | {near} |")
    at_start = [c for c in all_crashes if c.at_start]
    mid_run = [c for c in all_crashes if not c.at_start]
    observed = sum(1 for c in mid_run if c.ends_before)
    p = tail_probability([c.chance for c in mid_run], observed)
    lines.append(f"\n{len(all_crashes)} crashes. {len(at_start)} within {window} s of their own start "
                 f"({sum(1 for c in at_start if c.ends_before)} of them as another trial ended: a reused process "
                 f"starting its next trial). {len(mid_run)} mid-run: {observed} within {window} s after another "
                 f"trial's end, {sum(c.chance for c in mid_run):.1f} expected by chance (p = {p:.2g}).")
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
