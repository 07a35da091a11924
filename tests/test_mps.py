"""Trials that share a GPU run through an MPS daemon of the sweep's own (k3lab.runner.runtime.mps).

The daemon here is a shell script named nvidia-cuda-mps-control on PATH: with -f it records its
PID and environment, makes the control socket's file and waits for `quit` on a second call's stdin.
"""

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from k3lab.errors import UserError
from k3lab.runner.runtime.mps import CONTROL, gpu_sharing, sharing_off_because

FAKE_DAEMON = """#!/bin/sh
if [ "$1" = "-f" ]; then
  echo "daemon $$ pipe=$CUDA_MPS_PIPE_DIRECTORY log=$CUDA_MPS_LOG_DIRECTORY" >> {calls}
  {start}
  touch "$CUDA_MPS_PIPE_DIRECTORY/control"
  while [ ! -e "$CUDA_MPS_PIPE_DIRECTORY/quit" ]; do sleep 0.05; done
  exit 0
fi
read line; echo "client $line" >> {calls}; [ "$line" = quit ] && touch "$CUDA_MPS_PIPE_DIRECTORY/quit"
"""


@pytest.fixture
def daemon(tmp_path, monkeypatch):
    """A fake control daemon on PATH; returns the file its calls are written to."""
    return fake_daemon(tmp_path, monkeypatch)


def fake_daemon(tmp_path: Path, monkeypatch, start: str = "") -> Path:
    calls = tmp_path / "calls"
    fake = tmp_path / "bin" / CONTROL
    fake.parent.mkdir(exist_ok=True)
    fake.write_text(FAKE_DAEMON.format(calls=calls, start=start))
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake.parent}:/usr/bin:/bin")
    monkeypatch.delenv("CUDA_MPS_PIPE_DIRECTORY", raising=False)
    monkeypatch.delenv("CUDA_MPS_LOG_DIRECTORY", raising=False)
    return calls


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] if Path(f"/proc/{pid}").exists() else "X"
    return state not in ("Z", "X")


def test_trials_sharing_a_gpu_run_through_a_daemon_of_the_sweeps_own_told_to_quit_after(tmp_path, daemon):
    said = []
    with gpu_sharing(None, True, False, log_dir=tmp_path / "runs" / "x.mps", where="x.yaml", say=said.append) as how:
        assert how == "mps"
        pipe = Path(os.environ["CUDA_MPS_PIPE_DIRECTORY"])
        assert (pipe / "control").exists() and len(str(pipe / "control").encode()) <= 107  # a socket path's limit
        assert os.environ["CUDA_MPS_LOG_DIRECTORY"] == str(tmp_path / "runs" / "x.mps")
        started = daemon.read_text().split()
        assert started[0] == "daemon" and started[2] == f"pipe={pipe}"
        pid = int(started[1])
        assert alive(pid)
    assert daemon.read_text().splitlines()[-1] == "client quit"
    assert not alive(pid) and not pipe.exists()
    assert "CUDA_MPS_PIPE_DIRECTORY" not in os.environ and "CUDA_MPS_LOG_DIRECTORY" not in os.environ
    assert said == [f"GPU sharing: MPS (a control daemon of the sweep's own; its log: {tmp_path / 'runs' / 'x.mps'})"]


def test_without_the_daemon_program_trials_take_turns_and_the_sweep_says_why(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("CUDA_MPS_PIPE_DIRECTORY", raising=False)
    said = []
    with gpu_sharing(None, True, False, log_dir=tmp_path / "x.mps", where="x.yaml", say=said.append) as how:
        assert "CUDA_MPS_PIPE_DIRECTORY" not in os.environ
    assert how == f"time-slicing: {CONTROL} is not on PATH (it comes with the NVIDIA driver)"
    assert said == [f"GPU sharing: time-slicing ({CONTROL} is not on PATH (it comes with the NVIDIA driver))"]


def test_mps_true_where_no_daemon_can_run_is_one_line_naming_the_file_and_field(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("CUDA_MPS_PIPE_DIRECTORY", raising=False)
    with pytest.raises(UserError) as error:
        with gpu_sharing(True, True, False, log_dir=tmp_path / "x.mps", where="experiments/x.yaml"):
            pytest.fail("the sweep ran")
    assert str(error.value) == f"experiments/x.yaml: resources.mps: true, but {CONTROL} is not on PATH (it comes " \
                               "with the NVIDIA driver)"
    with pytest.raises(UserError, match="on a Ray cluster the sweep starts no daemon"):
        with gpu_sharing(True, True, True, log_dir=tmp_path / "x.mps", where="experiments/x.yaml"):
            pytest.fail("the sweep ran")


def test_a_daemon_that_does_not_start_leaves_trials_taking_turns_unless_mps_is_required(tmp_path, monkeypatch):
    fake_daemon(tmp_path, monkeypatch, start="echo cannot open the GPU; exit 3")
    log = tmp_path / "x.mps"
    with gpu_sharing(None, True, False, log_dir=log, where="x.yaml", say=lambda line: None) as how:
        assert "CUDA_MPS_PIPE_DIRECTORY" not in os.environ
    assert how == f"time-slicing: `{CONTROL} -f` did not start (exit 3; its log: {log})"
    assert "cannot open the GPU" in (log / "daemon.out").read_text()
    with pytest.raises(UserError, match=r"resources.mps: true, but `nvidia-cuda-mps-control -f` did not start"):
        with gpu_sharing(True, True, False, log_dir=log, where="x.yaml"):
            pytest.fail("the sweep ran")


def test_no_daemon_where_no_gpu_is_shared_on_a_cluster_or_when_told_not_to(tmp_path, daemon, monkeypatch):
    with gpu_sharing(None, False, False, log_dir=tmp_path / "x.mps", where="x.yaml", say=pytest.fail) as how:
        assert how is None
    assert sharing_off_because(False, False) == "resources.mps: false"
    assert sharing_off_because(None, True).startswith("on a Ray cluster the sweep starts no daemon")
    assert not daemon.exists()


def test_on_a_cluster_trials_use_their_nodes_daemon_not_the_drivers(tmp_path, daemon, monkeypatch):
    lines = []
    monkeypatch.setenv("CUDA_MPS_LOG_DIRECTORY", "/var/log/drivers-own")
    with gpu_sharing(None, True, True, log_dir=tmp_path / "x.mps", where="x.yaml", say=lines.append) as how:
        assert "CUDA_MPS_LOG_DIRECTORY" not in os.environ  # so the driver forwards none to the trials
    assert os.environ["CUDA_MPS_LOG_DIRECTORY"] == "/var/log/drivers-own"
    assert how.startswith("each node's own: on a Ray cluster the sweep starts no daemon")
    assert lines == [f"GPU sharing: each node's own ({how.split(': ', 1)[1]})"]
    assert not daemon.exists()
    with gpu_sharing(False, True, True, log_dir=tmp_path / "x.mps", where="x.yaml", say=lines.append) as how:
        pass
    assert how == "time-slicing: resources.mps: false"


def test_a_daemon_the_user_started_serves_the_trials_even_where_mps_is_required(tmp_path, daemon, monkeypatch):
    monkeypatch.setenv("CUDA_MPS_PIPE_DIRECTORY", "/tmp/nvidia-mps")  # exported by the user for their own daemon
    said = []
    for mps in (None, True):
        with gpu_sharing(mps, True, False, log_dir=tmp_path / "x.mps", where="x.yaml", say=said.append) as how:
            assert how == "mps: /tmp/nvidia-mps" and os.environ["CUDA_MPS_PIPE_DIRECTORY"] == "/tmp/nvidia-mps"
    assert said == ["GPU sharing: MPS (the daemon at CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps)"] * 2
    assert not daemon.exists()  # k3lab started none of its own
    with gpu_sharing(False, True, False, log_dir=tmp_path / "x.mps", where="x.yaml", say=said.append) as how:
        assert how == "time-slicing: resources.mps: false"
        assert "CUDA_MPS_PIPE_DIRECTORY" not in os.environ  # Ray and the trials do not inherit the user's daemon
    assert os.environ["CUDA_MPS_PIPE_DIRECTORY"] == "/tmp/nvidia-mps"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_driver_killed_with_sigkill_takes_its_daemon_with_it(tmp_path, daemon):
    driver = textwrap.dedent(f"""
        import os, signal, time
        from pathlib import Path
        from k3lab.runner.runtime.mps import gpu_sharing
        with gpu_sharing(None, True, False, log_dir=Path({str(tmp_path / 'x.mps')!r}), where="x.yaml"):
            os.kill(os.getpid(), signal.SIGKILL)
    """)
    result = subprocess.run([sys.executable, "-c", driver], env=os.environ, capture_output=True, text=True)
    assert result.returncode == -signal.SIGKILL, result.stderr
    pid = int(daemon.read_text().split()[1])
    deadline = time.monotonic() + 5
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(pid)


def test_mps_is_refused_for_trials_that_do_not_share_a_gpu(tmp_path):
    from conftest import mini_sweep

    from k3lab.registry import load_sweep

    for resources, message in [("gpu: 1, mps: true", "resources.mps: needs trials that share a GPU (gpu between 0 "
                                                     "and 1, no strategy), got gpu: 1"),
                               ("gpu: 0, mps: true", "got gpu: 0"),
                               ("gpu: 0.25, mps: 'yes'", "resources.mps")]:
        path = tmp_path / "mps.yaml"
        path.write_text(mini_sweep("mps", "x").replace("resources: {cpu: 1, gpu: 0}", f"resources: {{cpu: 1, {resources}}}"))
        with pytest.raises(UserError) as error:
            load_sweep(path)
        assert message in str(error.value) and str(path) in str(error.value)
    path.write_text(mini_sweep("mps", "x").replace("resources: {cpu: 1, gpu: 0}", "resources: {cpu: 1, gpu: 0.25, mps: false}"))
    assert load_sweep(path).resources.mps is False


def test_the_dry_run_says_how_the_trials_will_share_their_gpu(tmp_path, daemon, monkeypatch, capsys):
    from k3lab.cli import main

    flagship = str(Path(__file__).resolve().parent.parent / "experiments" / "attnres_block.yaml")
    dry_run = ["sweep", flagship, "--profile", "gpu", "--dry-run", "--storage", str(tmp_path / "runs")]
    monkeypatch.setattr("k3lab.runner.tune.driver.check_dry_run", lambda run: None)  # as on a GPU machine with FLA
    assert main(dry_run) == 0
    assert "trials on one GPU run side by side through an MPS daemon of the sweep's own" in capsys.readouterr().out
    assert not daemon.exists()  # a plan starts nothing
    monkeypatch.setenv("PATH", str(tmp_path))
    assert main(dry_run) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert f"trials on one GPU take turns on it ({CONTROL} is not on PATH" in out


STUCK_DAEMON = """#!/bin/sh
if [ "$1" = "-f" ]; then echo "daemon $$" >> {calls}; touch "$CUDA_MPS_PIPE_DIRECTORY/control"; exec sleep 600; fi
exec sleep 600
"""


def test_a_daemon_whose_server_does_not_quit_is_ended_within_quit_s_in_all(tmp_path, monkeypatch):
    """As the real one does while a client is left: `quit` waits, and the daemon stays."""
    calls = fake_daemon(tmp_path, monkeypatch)
    (tmp_path / "bin" / CONTROL).write_text(STUCK_DAEMON.format(calls=calls))
    monkeypatch.setattr("k3lab.runner.runtime.mps.QUIT_S", 2.0)
    with gpu_sharing(None, True, False, log_dir=tmp_path / "x.mps", where="x.yaml", say=lambda line: None):
        pid = int(calls.read_text().split()[1])
        told = time.monotonic()
    waited = time.monotonic() - told
    assert not alive(pid)
    assert waited < 3.5  # one QUIT_S and a SIGTERM, not the quit's QUIT_S and then the wait's


def test_a_sweeps_driver_counts_gpus_through_nvml_and_never_initialises_cuda(tmp_path, monkeypatch):
    """cuInit in the driver would make it a client of the trials' MPS server until it exits."""
    import torch

    from k3lab.registry.sweep_file import resolve_profile
    from k3lab.runner.runtime.preflight import check_gpus

    monkeypatch.setattr(torch.cuda, "is_available", lambda: pytest.fail("torch.cuda.is_available: cuInit"))
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    sweep = tmp_path / "x.yaml"
    sweep.write_text("name: x\nbase: {preset: tiny}\nprofiles:\n  gpu: {}\n  cpu: {}\n")
    assert resolve_profile(sweep, "auto") == "gpu"
    check_gpus(0.25, "x.yaml")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    assert resolve_profile(sweep, "auto") == "cpu"
    with pytest.raises(UserError, match="x.yaml: this machine has no CUDA GPU"):
        check_gpus(0.25, "x.yaml")
