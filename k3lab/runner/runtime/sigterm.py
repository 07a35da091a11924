"""SIGTERM stops a sweep as Ctrl-C does.

A job scheduler (SLURM, Kubernetes, systemd) ends a job with SIGTERM; left to Ray's handler
the driver died with a C-level crash dump, its parent run left RUNNING and no resume hint.
While `stop_on_sigterm` is active, SIGTERM sends this process a SIGINT instead: Tune saves its
state, running trials end KILLED, and the command exits 143 (128 + SIGTERM) with the same
`--resume` hint as after Ctrl-C. `ray.init` installs a SIGTERM handler of its own, so
`keep_sigterm_handler` puts ours back once Ray has started.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading

EXIT_CODE = 128 + signal.SIGTERM  # what a shell reports for a process SIGTERM ended

received = threading.Event()  # set by the handler: the KeyboardInterrupt that follows was SIGTERM's


def on_sigterm(signum, frame) -> None:
    """Stop as Ctrl-C does (Tune's SIGINT handler saves its state); a second SIGTERM (a scheduler
    repeating itself) does not interrupt the saving the first one started."""
    if received.is_set():
        return
    received.set()
    if callable(signal.getsignal(signal.SIGINT)):  # Tune's handler, or Python's KeyboardInterrupt
        os.kill(os.getpid(), signal.SIGINT)
    else:  # SIGINT ignored (a job a non-interactive shell started with &): the SIGINT would be lost
        raise KeyboardInterrupt


def _main_thread() -> bool:
    """signal.signal works in the main thread only (a sweep run from another thread keeps Ray's)."""
    return threading.current_thread() is threading.main_thread()


@contextlib.contextmanager
def stop_on_sigterm():
    """`on_sigterm` as the SIGTERM handler for the block; the handler before it afterwards."""
    if not _main_thread():
        yield
        return
    received.clear()
    previous = signal.signal(signal.SIGTERM, on_sigterm)
    try:
        with sigint_kept():
            yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextlib.contextmanager
def sigint_kept():
    """The SIGINT handler as it was, after the block: Tune's `fit` installs one it never takes back
    after a run that ends normally, which swallowed the next Ctrl-C (or SIGTERM) unseen."""
    if not _main_thread():
        yield
        return
    previous = signal.getsignal(signal.SIGINT)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


@contextlib.contextmanager
def keep_sigterm_handler():
    """Around `ray.init`, which replaces the SIGTERM handler with its own (a crash dump and exit 1):
    where ours was installed before, it is installed again after."""
    ours = _main_thread() and signal.getsignal(signal.SIGTERM) is on_sigterm
    try:
        yield
    finally:
        if ours:
            signal.signal(signal.SIGTERM, on_sigterm)
