"""`--stop-after`: a timer that stops the sweep as Ctrl-C does, once its wall time has passed."""

from __future__ import annotations

import os
import signal
import threading

from k3lab.errors import UserError
from k3lab.registry.sections import duration_seconds


class StopTimer(threading.Timer):
    """Stops the sweep as Ctrl-C does (SIGINT to this process: Tune saves its state, running trials
    are checkpointed and end KILLED, `--resume` goes on) once `seconds` have passed; `fired` is set
    before the signal, so the handler that sees it knows it was the timer."""

    def __init__(self, seconds: float):
        self.fired = threading.Event()
        super().__init__(seconds, self.stop)
        self.daemon = True

    def stop(self) -> None:
        self.fired.set()
        os.kill(os.getpid(), signal.SIGINT)


def stop_timer(seconds: float | None) -> StopTimer | None:
    """A started StopTimer for --stop-after, or None without one."""
    if seconds is None:
        return None
    timer = StopTimer(seconds)
    timer.start()
    return timer


def stop_after_seconds(value: str | None) -> float | None:
    """--stop-after as seconds; a value that is not a positive duration is a one-line error."""
    if value is None:
        return None
    seconds = duration_seconds(value)
    if seconds is None or seconds <= 0:
        raise UserError(f"--stop-after {value}: not a duration (e.g. 10m, 1h30m, 90s)")
    return seconds
