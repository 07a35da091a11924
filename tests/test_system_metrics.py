"""A trial's system metrics (k3lab.runner.runtime.sysmetrics, k3lab.runner.tune.system): sampled on a thread, logged
with the trial's own metrics at their steps under MLflow's `system/` names; the sweep's on its parent run."""

import threading

import pytest
import torch

from k3lab.registry import TrainSpec, load_preset
from k3lab.runner.runtime.sysmetrics import SystemSampler, interval_s, trial_monitors
from k3lab.store.tracking import MLflowTracker
from trackers import MemoryTracker
from k3lab.runner.tune.system import GPU_BUSY, SampledTracker, SweepSystemMetrics, with_system_metrics

pytestmark = pytest.mark.usefixtures("isolated_data")


class Counting:
    """A monitor whose n-th sample is n (and a GPU's busy share of 10 n)."""

    def __init__(self):
        self.n = 0

    def collect(self):
        self.n += 1
        return {"cpu_utilization_percentage": float(self.n), "gpu_3_utilization_percentage": 10.0 * self.n}


class Broken:
    def collect(self):
        raise OSError("no /proc here")


def test_take_is_the_mean_of_the_samples_since_the_last_take_under_mlflows_system_prefix():
    sampler = SystemSampler([Counting(), Broken()], interval=3600)
    for _ in range(3):
        sampler.sample()
    assert sampler.take() == {"system/cpu_utilization_percentage": 2.0, "system/gpu_3_utilization_percentage": 20.0}
    assert sampler.take() == {}
    sampler.sample()
    assert sampler.take()["system/cpu_utilization_percentage"] == 4.0


def test_the_sampler_thread_samples_until_stopped():
    sampled = threading.Event()

    class Signals(Counting):
        def collect(self):
            sampled.set()
            return super().collect()

    sampler = SystemSampler([Signals()], interval=0.001).start()
    assert sampled.wait(30)
    sampler.stop()
    assert not sampler._thread.is_alive() and sampler.take()


def test_samples_ride_along_with_the_trials_metrics_at_their_step_and_a_last_one_at_finish():
    memory = MemoryTracker("r")
    sampler = SystemSampler([Counting()], interval=3600)
    tracker = SampledTracker(memory, sampler)
    tracker.log_metrics({"train_loss": 5.0}, step=1)
    sampler.sample()
    sampler.sample()
    tracker.log_metrics({"train_loss": 4.0}, step=2)  # the samples so far, at step 2
    tracker.log_metrics({"val_loss": 4.5}, step=2)  # nothing sampled since: the loss alone
    tracker.finish("FINISHED")  # a last sample, but step 2 has its system metrics: none twice
    assert memory.metrics["system/cpu_utilization_percentage"] == [(2, 1.5)]
    assert memory.metrics["train_loss"] == [(1, 5.0), (2, 4.0)] and memory.status == "FINISHED"
    assert tracker.run_id == "r"  # everything else is the tracker's


def test_a_trial_whose_last_step_has_no_sample_gets_one_at_finish_once():
    """Five `system/*` keys were logged twice at a trial's last step, 0.3 s apart."""
    memory = MemoryTracker("r")
    sampler = SystemSampler([Counting()], interval=3600)
    tracker = SampledTracker(memory, sampler)
    sampler.sample()
    tracker.log_metrics({"train_loss": 5.0}, step=1)
    tracker.log_metrics({"train_loss": 4.0}, step=2)  # nothing sampled since step 1
    tracker.finish("FINISHED")
    assert memory.metrics["system/cpu_utilization_percentage"] == [(1, 1.0), (2, 2.0)]


def test_sampling_off_leaves_the_tracker_as_it_is(monkeypatch):
    monkeypatch.setenv("K3LAB_SYSTEM_METRICS_S", "0")
    memory = MemoryTracker()
    assert interval_s() == 0 and with_system_metrics(memory, torch.device("cpu")) is memory


def test_a_cpu_trial_samples_the_machine_and_its_own_process_but_no_gpu():
    names = {name for monitor in trial_monitors(torch.device("cpu")) for name in monitor.collect()}
    assert {"cpu_utilization_percentage", "system_memory_usage_megabytes", "process_cpu_utilization_percentage",
            "process_memory_megabytes"} <= names
    assert not any(name.startswith("gpu_") for name in names)


def test_a_trial_run_holds_its_system_metrics_at_steps_of_its_training(tmp_path, monkeypatch):
    from k3lab.runner.tune.trial import TrialSpec, run_trial

    monkeypatch.setenv("K3LAB_SYSTEM_METRICS_S", "0.01")
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    train = TrainSpec(steps=6, batch_size=2, seq_len=32, warmup_steps=1, eval_interval=6, eval_batches=1,
                      log_interval=2)
    spec = TrialSpec(variant_id="v", variant_name="tiny", seed=0, config=load_preset("tiny"),
                     train=train, tracking_uri=uri, experiment="system")
    _, run_id = run_trial(spec, device="cpu")
    client = MLflowTracker(uri, run_id).client
    metrics = client.get_run(run_id).data.metrics
    for name in ("cpu_utilization_percentage", "system_memory_usage_megabytes", "process_memory_megabytes"):
        history = client.get_metric_history(run_id, f"system/{name}")
        assert history and all(0 <= m.step <= 6 for m in history), name
    assert metrics["system/process_memory_megabytes"] > 1


def test_the_sweeps_gpu_busy_share_goes_to_its_parent_run_with_the_mean_at_the_end(tmp_path, monkeypatch):
    import k3lab.runner.tune.system as system

    monkeypatch.setattr(system, "sweep_monitors", lambda: [Counting()])
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    parent = MLflowTracker.start(uri, "sweep", "sweep")
    seconds = iter(range(0, 1000, 10))
    logger = SweepSystemMetrics(uri, parent.run_id, lambda: next(seconds), every=3600)  # the thread sleeps
    logger.log_sample()
    logger.log_sample()
    assert logger.stop() == {GPU_BUSY: 15.0}
    history = parent.client.get_metric_history(parent.run_id, "system/gpu_3_utilization_percentage")
    assert sorted((m.step, m.value) for m in history) == [(0, 10.0), (10, 20.0)]
    assert SweepSystemMetrics(uri, parent.run_id, lambda: 0, every=0).stop() == {}


def test_the_sweeps_samples_within_one_second_go_to_that_seconds_step_once(tmp_path, monkeypatch):
    """Sampled faster than once a second, the parent's `system/*` points repeated at a step (12 at each)."""
    import k3lab.runner.tune.system as system

    monkeypatch.setattr(system, "sweep_monitors", lambda: [Counting()])
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    parent = MLflowTracker.start(uri, "sweep", "sweep")
    seconds = iter([0.1, 0.6, 1.2])
    logger = SweepSystemMetrics(uri, parent.run_id, lambda: next(seconds), every=3600)
    for _ in range(3):
        logger.log_sample()
    logger.stop()
    history = parent.client.get_metric_history(parent.run_id, "system/gpu_3_utilization_percentage")
    assert sorted((m.step, m.value) for m in history) == [(0, 10.0), (1, 25.0)]  # step 1: samples 2 and 3
