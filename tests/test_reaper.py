"""No Ray process outlives a sweep (`k3lab.runner.runtime.reaper`), without Ray: a stand-in driver whose
'Ray' children ignore SIGTERM, killed with SIGKILL; and the leftovers a next sweep ends.
The end-to-end test with a real sweep and Ray is in tests/test_sweep.py."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from k3lab.errors import UserError
from k3lab.runner.runtime import reaper

pytestmark = pytest.mark.skipif(not reaper.supported(), reason="needs /proc (Linux)")

REPO = Path(__file__).resolve().parents[1]
STUBBORN = "import signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(120)"

# A driver as `k3lab sweep` is one: a child it had before (not Ray's), the watchdog, then "Ray":
# a process of the ray package (named by its path in the command line) that starts a worker,
# both deaf to SIGTERM as Ray's agents are, and a child that is not Ray's. It prints their PIDs.
DRIVER = f"""
import json, subprocess, sys, time
from pathlib import Path
import ray
from k3lab.runner.runtime.reaper import Watchdog
stubborn = {STUBBORN!r}
before = subprocess.Popen([sys.executable, "-c", stubborn])
watchdog = Watchdog.start(Path(sys.argv[1]))
ray_dir = str(Path(ray.__file__).resolve().parent)
head = subprocess.Popen([sys.executable, "-c", "import subprocess, sys; "
                         "subprocess.Popen([sys.executable, '-c', {STUBBORN!r}]); " + stubborn, ray_dir + "/raylet"])
other = subprocess.Popen([sys.executable, "-c", stubborn, "not ray"])
print(json.dumps({{"before": before.pid, "head": head.pid, "other": other.pid}}), flush=True)
time.sleep(120)
"""


def alive(processes: dict[int, int]) -> list[int]:
    return [pid for pid, started in processes.items() if reaper.is_alive(pid, started)]


def wait_until(condition, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.1)
    return condition()


def end_by_pid(processes: dict[int, int]) -> None:
    for pid in alive(processes):
        os.kill(pid, signal.SIGKILL)


def test_a_driver_killed_with_sigkill_takes_its_ray_processes_and_only_those(tmp_path):
    record = tmp_path / "runs" / "x.ray.json"
    env = os.environ | {"PYTHONPATH": str(REPO)}
    driver = subprocess.Popen([sys.executable, "-c", DRIVER, str(record)], stdout=subprocess.PIPE, text=True, env=env)
    kept = {}
    try:
        pids = json.loads(driver.stdout.readline())
        kept = {pid: reaper.start_time(pid) for pid in (pids["before"], pids["other"])}
        assert wait_until(lambda: len(reaper.descendants(pids["head"])) == 1, 10)  # the 'Ray' process's worker
        head = reaper.descendants(pids["head"]) | {pids["head"]: reaper.start_time(pids["head"])}
        assert wait_until(lambda: set(map(str, head)) <= set((reaper.read_record(record) or {}).get("processes", {})),
                          10)  # the watchdog has recorded both, and nothing else of the driver's
        assert not set(map(str, kept)) & set(reaper.read_record(record)["processes"])
        driver.kill()  # SIGKILL: no ray.shutdown(), no finally
        driver.wait()
        assert wait_until(lambda: not alive(head), 3 * reaper.GRACE_S + 10), alive(head)
        assert wait_until(lambda: not record.exists(), 5)
        assert alive(kept) == list(kept)  # the driver's other children are not the watchdog's to end
    finally:
        if driver.poll() is None:
            driver.kill()
        end_by_pid(kept)


def stubborn_process() -> tuple[subprocess.Popen, int]:
    process = subprocess.Popen([sys.executable, "-c", STUBBORN])
    assert wait_until(lambda: reaper.start_time(process.pid) is not None, 5)
    time.sleep(0.3)  # its SIGTERM handler is in place
    return process, reaper.start_time(process.pid)


def gone_driver() -> dict:
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    started = reaper.start_time(process.pid) or 1
    process.wait()
    return {"pid": process.pid, "start": started}


def write_record(path: Path, processes: dict, driver: dict) -> None:
    path.write_text(json.dumps({"driver": driver, "watchdog": gone_driver(), "session_dir": "/tmp/ray/session_x",
                                "processes": {str(pid): {"start": start, "name": "ray::DashboardAgent"}
                                              for pid, start in processes.items()}}))


def test_the_next_sweep_ends_what_an_earlier_killed_run_left_and_says_so_in_one_line(tmp_path):
    leftover, started = stubborn_process()
    innocent, innocent_start = stubborn_process()  # its PID, with another start time: a new process
    record = tmp_path / "x.ray.json"
    driver = gone_driver()
    write_record(record, {leftover.pid: started, innocent.pid: innocent_start + 1}, driver)
    said = []
    try:
        assert reaper.end_leftovers(record, say=said.append, grace_s=0.5) == [leftover.pid]
        assert leftover.wait(timeout=5) == -signal.SIGKILL  # it ignored SIGTERM
        assert said == [f"ray: ended 1 process left by an earlier run of this sweep (driver PID {driver['pid']} gone, "
                        f"Ray instance /tmp/ray/session_x): {leftover.pid} ray::DashboardAgent"]
        assert innocent.poll() is None and not record.exists()
        assert reaper.end_leftovers(record, say=said.append) == [] and len(said) == 1  # nothing left: nothing said
    finally:
        for process in (leftover, innocent):
            if process.poll() is None:
                process.kill()
                process.wait()


def test_a_sweep_of_the_same_experiment_that_still_runs_is_not_a_leftover(tmp_path):
    worker, started = stubborn_process()
    driver, driver_start = stubborn_process()  # another process's sweep, still running
    record = tmp_path / "x.ray.json"
    write_record(record, {worker.pid: started}, {"pid": driver.pid, "start": driver_start})
    try:
        with pytest.raises(UserError, match=f"a sweep of this experiment is running \\(driver PID {driver.pid}\\)"):
            reaper.end_leftovers(record, say=print)
        assert worker.poll() is None and record.exists()
    finally:
        for process in (worker, driver):
            process.kill()
            process.wait()


def test_an_earlier_sweep_of_this_same_process_is_over_its_leftovers_are_ended(tmp_path):
    """Sweeps run one after another in one process (a notebook, the tests): a record naming this
    process is what its earlier sweep left, not a sweep that runs."""
    leftover, started = stubborn_process()
    record = tmp_path / "x.ray.json"
    write_record(record, {leftover.pid: started}, {"pid": os.getpid(), "start": reaper.start_time(os.getpid())})
    said = []
    try:
        assert reaper.end_leftovers(record, say=said.append, grace_s=0.5) == [leftover.pid]
        assert "(an earlier sweep of this process, Ray instance /tmp/ray/session_x)" in said[0]
    finally:
        if leftover.poll() is None:
            leftover.kill()
        leftover.wait()
