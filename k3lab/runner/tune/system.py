"""System metrics in the store: a trial's on its run, beside its loss; the sweep's GPUs on the parent run.

A trial's samples (`k3lab.runner.runtime.sysmetrics`) ride along with its own metrics: each
`log_metrics` call of the training loop adds the mean of the samples taken since the last one, at
that step, so they reach MLflow with the loss (flushed at its checkpoints, never logged twice by
a restored trial) and plot against the same steps. The driver logs its GPUs' busy share on the
parent run every interval (step: the sweep's seconds so far, over all its parts) and, at the end
of each part, `sweep_gpu_busy_pct`: the mean over that part's samples and GPUs.
"""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Callable

from k3lab.runner.runtime.sysmetrics import SystemSampler, interval_s, sweep_monitors, trial_monitors
from k3lab.store import runs

GPU_BUSY = "sweep_gpu_busy_pct"


class SampledTracker:
    """A trial's tracker whose `log_metrics` also logs the system samples taken since its last call."""

    def __init__(self, tracker, sampler: SystemSampler):
        self.tracker, self.sampler = tracker, sampler
        self.step = 0  # the last step logged
        self.at_step: set[str] = set()  # the system metrics logged at it

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        """`metrics` at `step`, with the samples since the last call where this step has none yet
        (a second call at one step, as an evaluation's, leaves them for the next step)."""
        if step > self.step:
            self.step, self.at_step = step, set()
        sample = self.sampler.take() if step == self.step and not self.at_step else {}
        self.at_step |= set(sample)
        self.tracker.log_metrics(metrics | sample, step)

    def finish(self, status: str) -> None:
        """Stop sampling and, for a finished trial, log a last sample (one shorter than the interval
        has one too; a failed one's unsent steps were dropped for its restart to log) of the metrics
        not logged at its last step yet (each once per step), then finish."""
        self.sampler.stop()
        if status == "FINISHED":
            self.sampler.sample()
            last = {key: value for key, value in self.sampler.take().items() if key not in self.at_step}
            if last:
                self.tracker.log_metrics(last, self.step)
        self.tracker.finish(status)

    def __getattr__(self, name):  # everything else is the tracker's
        return getattr(self.tracker, name)


def with_system_metrics(tracker, device=None):
    """`tracker` sampling the system while the trial runs on `device` (unchanged when sampling is off)."""
    every = interval_s()
    if tracker is None or not every:
        return tracker
    return SampledTracker(tracker, SystemSampler(trial_monitors(device), every).start())


class SweepSystemMetrics:
    """The driver's system samples on the parent run, on a thread with its own client, until `stop`."""

    def __init__(self, tracking_uri: str, run_id: str, seconds_so_far: Callable[[], float],
                 every: float | None = None):
        self.every = interval_s() if every is None else every
        self.run_id, self.seconds_so_far = run_id, seconds_so_far
        self.busy: list[float] = []
        self.step = -1  # the last step logged
        self.stopped = threading.Event()
        self.thread = None
        if self.every:
            self.client = runs.client(tracking_uri)
            self.sampler = SystemSampler(sweep_monitors(), self.every)
            self.thread = threading.Thread(target=self.loop, name="k3lab-sweep-system-metrics", daemon=True)
            self.thread.start()

    def loop(self) -> None:
        while not self.stopped.wait(self.every):
            self.log_sample()

    def log_sample(self) -> None:
        from mlflow.entities import Metric

        self.sampler.sample()
        now, step = int(time.time() * 1000), int(self.seconds_so_far())
        if step <= self.step:  # this second has its sample: the next one takes these too (once per step)
            return
        self.step, sample = step, self.sampler.take()
        self.busy += [v for k, v in sample.items() if k.startswith("system/gpu_") and k.endswith("_utilization_percentage")]
        with contextlib.suppress(Exception):  # the store busy: the next sample counts
            self.client.log_batch(self.run_id, metrics=[Metric(k, float(v), now, step) for k, v in sample.items()])

    def stop(self) -> dict[str, float]:
        """Stop sampling; {GPU_BUSY: the mean busy share of the samples} where there were GPUs."""
        self.stopped.set()
        if self.thread is not None:
            self.thread.join(timeout=5)
        return {GPU_BUSY: sum(self.busy) / len(self.busy)} if self.busy else {}
