"""System metrics sampled on a thread: CPU and memory (MLflow's own monitor), this process's CPU and
memory, and per GPU its busy share, memory and power (NVML) with this process's own GPU memory.

The names are MLflow's system-metric names (`gpu_0_utilization_percentage`, ...) under the
`system/` prefix, so the MLflow UI shows them on a run's "System metrics" tab. Sampling is a few
NVML and /proc reads every `interval_s` seconds (`K3LAB_SYSTEM_METRICS_S`, default 10; 0: off);
`take()` hands the mean of the samples since the last take to whoever logs them. Nothing here
writes the store (`k3lab.runner.tune.system` logs the samples).
"""

from __future__ import annotations

import os
import threading
from collections import defaultdict

PREFIX = "system/"
INTERVAL_S = 10.0
INTERVAL_ENV = "K3LAB_SYSTEM_METRICS_S"


def interval_s() -> float:
    """Seconds between samples (K3LAB_SYSTEM_METRICS_S; 0 turns sampling off)."""
    value = os.environ.get(INTERVAL_ENV, "")
    try:
        return max(0.0, float(value)) if value else INTERVAL_S
    except ValueError:
        return INTERVAL_S


class ProcessMonitor:
    """This process's CPU share (percent of one core, its threads summed) and resident memory."""

    def __init__(self):
        import psutil

        self.process = psutil.Process()
        self.process.cpu_percent()  # the first call starts the interval the next one measures

    def collect(self) -> dict[str, float]:
        return {"process_cpu_utilization_percentage": self.process.cpu_percent(),
                "process_memory_megabytes": self.process.memory_info().rss / 1e6}


class HostMonitor:
    """The machine's CPU utilisation and memory, as MLflow's CPUMonitor reads them."""

    def __init__(self):
        import psutil
        from mlflow.system_metrics.metrics.cpu_monitor import CPUMonitor

        psutil.cpu_percent()  # the first call starts the interval the next one measures (it returns 0)
        self.monitor = CPUMonitor()

    def collect(self) -> dict[str, float]:
        self.monitor.collect_metrics()
        sample = {name: values[-1] for name, values in self.monitor.metrics.items()}
        self.monitor.clear_metrics()
        return sample


class GPUMonitor:
    """Per GPU (NVML's index, the same in every process of the machine): its busy share, memory used
    and power; with `torch_device`, also the memory this process's allocator holds on it."""

    def __init__(self, handles: list, torch_device=None):
        import pynvml

        self.nvml, self.handles, self.torch_device = pynvml, handles, torch_device

    def collect(self) -> dict[str, float]:
        nvml, out = self.nvml, {}
        for handle in self.handles:
            i = nvml.nvmlDeviceGetIndex(handle)
            try:
                out[f"gpu_{i}_utilization_percentage"] = float(nvml.nvmlDeviceGetUtilizationRates(handle).gpu)
                out[f"gpu_{i}_memory_usage_megabytes"] = nvml.nvmlDeviceGetMemoryInfo(handle).used / 1e6
                out[f"gpu_{i}_power_usage_watts"] = nvml.nvmlDeviceGetPowerUsage(handle) / 1000
            except nvml.NVMLError:
                continue  # a query the device does not support (or MIG): the others still count
            if self.torch_device is not None:
                import torch

                out[f"gpu_{i}_process_memory_megabytes"] = torch.cuda.memory_reserved(self.torch_device) / 1e6
        return out


def nvml_handles(torch_device=None) -> list:
    """NVML handles of `torch_device` (a CUDA torch.device), or of every GPU this process may use
    (CUDA_VISIBLE_DEVICES, else all); [] without NVML or GPUs."""
    try:
        import pynvml

        pynvml.nvmlInit()
        if torch_device is not None:
            import torch

            uuid = str(torch.cuda.get_device_properties(torch_device).uuid)
            return [pynvml.nvmlDeviceGetHandleByUUID(uuid if uuid.startswith(("GPU-", "MIG-")) else f"GPU-{uuid}")]
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
        if visible is None:
            return handles
        wanted = [v.strip() for v in visible.split(",") if v.strip()]
        return [h for i, h in enumerate(handles) if str(i) in wanted or pynvml.nvmlDeviceGetUUID(h) in wanted]
    except Exception:  # no pynvml, no driver, no GPU: no GPU figures
        return []


def trial_monitors(torch_device=None) -> list:
    """What a trial samples: the machine, its own process and, on a CUDA device, that GPU."""
    monitors = [HostMonitor(), ProcessMonitor()]
    if torch_device is not None and getattr(torch_device, "type", "cpu") == "cuda":
        handles = nvml_handles(torch_device)
        if handles:
            monitors.append(GPUMonitor(handles, torch_device))
    return monitors


def sweep_monitors() -> list:
    """What a sweep's driver samples: the machine and every GPU it may use."""
    handles = nvml_handles()
    return [HostMonitor()] + ([GPUMonitor(handles)] if handles else [])


class SystemSampler:
    """Samples `monitors` every `interval` seconds on a daemon thread until `stop`; `take()` returns
    the mean of each metric (prefixed `system/`) over the samples since the last take ({} if none)."""

    def __init__(self, monitors: list, interval: float):
        self.monitors, self.interval = monitors, interval
        self._sums: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="k3lab-system-metrics", daemon=True)

    def start(self) -> "SystemSampler":
        self._thread.start()
        return self

    def sample(self) -> None:
        for monitor in self.monitors:
            try:
                values = monitor.collect()
            except Exception:  # a sample is not worth failing a trial for
                continue
            with self._lock:
                for name, value in values.items():
                    total = self._sums[PREFIX + name]
                    total[0] += value
                    total[1] += 1

    def _loop(self) -> None:
        while not self._stopped.wait(self.interval):
            self.sample()

    def take(self) -> dict[str, float]:
        with self._lock:
            sums, self._sums = self._sums, defaultdict(lambda: [0.0, 0])
        return {name: total / count for name, (total, count) in sums.items() if count}

    def stop(self) -> None:
        self._stopped.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
