"""Fault injection for the crash-recovery tests, in every Python process they start: tests/conftest.py
puts this folder on PYTHONPATH, so Ray's workers (which inherit the sweep driver's environment) import
this file at start-up. k3lab itself ships no hook: once `k3lab.runner.tune.ray_reports` is imported,
`TrialReporter.send` is wrapped so that, before a report reaches Tune (a crash after the metrics
are sent: the hardest place),

- with K3LAB_FAIL_AT_STEP=N, a trial that was not restored from a checkpoint raises at its first
  report at or after step N;
- with K3LAB_OOM_AT_STEP=TRIAL@N (TRIAL as `attnres_off-s0`), that trial raises torch's
  out-of-memory error there instead.

The environment is read at each report, so a test may set it after a process started.
"""

import importlib.abc
import os
import sys

MODULE = "k3lab.runner.tune.ray_reports"


def inject_failure(step: int, restored: bool, trial: str = "") -> None:
    fail_at = int(os.environ.get("K3LAB_FAIL_AT_STEP", "0"))
    if fail_at and not restored and step >= fail_at:
        raise RuntimeError(f"K3LAB_FAIL_AT_STEP: injected failure at step {step}")
    oom_trial, _, oom_at = os.environ.get("K3LAB_OOM_AT_STEP", "").rpartition("@")
    if oom_trial and oom_trial == trial and not restored and step >= int(oom_at):
        import torch

        raise torch.OutOfMemoryError(f"CUDA out of memory (K3LAB_OOM_AT_STEP: injected at step {step})")


def wrap(module) -> None:
    """`TrialReporter.send`, failing first where the environment asks (once per module)."""
    reporter = module.TrialReporter
    if getattr(reporter.send, "injects_failures", False):
        return
    send = reporter.send

    def failing_send(self, metrics: dict, checkpoint) -> None:
        inject_failure(metrics["done_steps"], restored=self.restored, trial=self.spec.name)
        send(self, metrics, checkpoint)

    failing_send.injects_failures = True
    reporter.send = failing_send


class WrapOnImport(importlib.abc.MetaPathFinder):
    """Finds nothing itself: when MODULE is imported, asks the other finders for it and has its
    loader wrap it once it has run (the k3lab of the process's own path, whichever that is)."""

    def find_spec(self, name, path, target=None):
        if name != MODULE:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None and spec.loader is not None:
                run = spec.loader.exec_module

                def exec_module(module, run=run):
                    run(module)
                    wrap(module)

                spec.loader.exec_module = exec_module
                return spec
        return None


if MODULE in sys.modules:
    wrap(sys.modules[MODULE])
else:
    sys.meta_path.insert(0, WrapOnImport())
