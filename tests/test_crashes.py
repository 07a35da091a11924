"""A trial whose process died of a signal says what killed it: the dead Ray worker's own log,
found by the pid in Tune's error, read into one line and kept with the trial's run."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
from mlflow import MlflowClient

from k3lab.runner.runtime.crashes import dead_worker_log, dead_worker_pid, fault_line, short_path
from k3lab.runner.tune.status import MLflowStatusCallback, crash_line, keep_worker_log

# Tune's error.txt for a trial whose worker died (Ray 2.x ActorDiedError), pid 9868
ACTOR_DIED = """Failure # 1 (occurred at 2026-12-01_14-39-56)
ray::ImplicitFunc.train() (pid=9868, ip=192.0.2.2, actor_id=47ccba54e3ea71ba, repr=func)
ray.exceptions.ActorDiedError: The actor died unexpectedly before finishing this task.
\tclass_name: ImplicitFunc
\tactor_id: 47ccba54e3ea71bac244c015d680e202
\tpid: 9868
\tnamespace: 18898403-dda0-485a-9c11-e9f94dffcbed
\tip: 192.0.2.2
The actor is dead because its worker process has died. Worker exit type: SYSTEM_ERROR Worker exit detail: Worker \
unexpectedly exits with a connection error code 2. End of file.
"""


def worker_stderr() -> str:
    """The worker log of a crash in the 2026-12-01 moe_ablation gpu sweep, as saved then."""
    saved = (Path(__file__).resolve().parents[1] / "docs/runs/moe_ablation-gpu-seeds-2026-12-01.crashes.txt").read_text()
    start = saved.index("## the Ray worker's stderr")
    return saved[saved.index("\n", start) + 1:saved.index("\n## ", start + 1)]


def ray_logs(tmp_path: Path, pid: int, text: str, old: bool = False) -> Path:
    logs = tmp_path / "logs"
    folder = logs / "old" if old else logs
    folder.mkdir(parents=True)
    (folder / f"worker-22dfcbd3-ffffffff-{pid}.err").write_text(text)
    (logs / "worker-afdb4eb4-ffffffff-9999.err").write_text("Fatal Python error: not this one\n")
    return logs


def test_a_dead_workers_pid_is_read_from_tunes_error_and_other_errors_name_none():
    assert dead_worker_pid(ACTOR_DIED) == 9868
    assert dead_worker_pid("torch.AcceleratorError: CUDA error: unspecified launch failure\n") is None


def test_a_segfault_in_a_graph_replay_reads_as_one_line_with_the_k3lab_frame_under_it():
    assert fault_line(worker_stderr()) == ("Segmentation fault in replay (torch/cuda/graphs.py:139), "
                                           "from k3lab/train/graphs.py:54 in __call__")  # as the saved log names it


def test_the_crashing_threads_stack_is_read_and_not_another_threads():
    log = ("Fatal Python error: Aborted\n\nThread 0x00007f01 (most recent call first):\n"
           '  File "/usr/lib/python3.12/threading.py", line 355 in wait\n\n'
           "Current thread 0x00007f02 (most recent call first):\n"
           '  File "/work/main/k3lab/runner/train/trainer.py", line 207 in train_step\n'
           '  File "/work/main/k3lab/runner/train/trainer.py", line 371 in fit\n')
    assert fault_line(log) == "Aborted in train_step (k3lab/runner/train/trainer.py:207)"


def test_a_signal_without_a_python_stack_is_still_named_and_a_clean_log_names_nothing():
    assert fault_line("*** SIGABRT received at time=1764600000 on cpu 3 ***\nPC: @ 0x7f (unknown) raise\n") == "SIGABRT"
    assert fault_line("(pid=9868) step 40: loss 3.1\n") is None


def test_frames_are_named_from_their_package_down():
    assert short_path("/opt/torch/.venv/lib/python3.12/site-packages/torch/cuda/graphs.py") == "torch/cuda/graphs.py"
    assert short_path("/work/main/k3lab/runner/train/graphs.py") == "k3lab/runner/train/graphs.py"


def test_the_dead_workers_log_is_found_in_rays_log_folder_or_its_old_folder(tmp_path):
    for old, where in ((False, tmp_path / "new"), (True, tmp_path / "moved")):
        logs = ray_logs(where, 9868, "line\n" * 500 + worker_stderr(), old=old)
        pid, tail = dead_worker_log(ACTOR_DIED, logs)
        assert pid == 9868 and tail.endswith(worker_stderr()) and len(tail.splitlines()) == 300
    assert dead_worker_log(ACTOR_DIED, tmp_path / "nowhere") is None  # a worker on another node
    assert dead_worker_log("ValueError: bad\n", tmp_path / "new" / "logs") is None


def test_a_crash_is_counted_with_its_fault_and_the_workers_log_kept_on_the_run(tmp_path, monkeypatch):
    import k3lab.runner.runtime.crashes as crashes

    logs = ray_logs(tmp_path, 9868, worker_stderr())
    monkeypatch.setattr(crashes, "ray_logs_dir", lambda: logs)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(uri)
    experiment = client.create_experiment("x", artifact_location=(tmp_path / "art").as_uri())
    run_id = client.create_run(experiment).info.run_id
    (tmp_path / "error.txt").write_text(ACTOR_DIED)
    trial = SimpleNamespace(trial_id="t1", last_result={"mlflow_run_id": run_id}, error_file=str(tmp_path / "error.txt"))
    assert crash_line(trial).startswith("Segmentation fault in replay")
    MLflowStatusCallback(uri).on_trial_recover(0, [], trial)
    tags = client.get_run(run_id).data.tags
    assert tags["k3lab.crashes"] == "1" and tags["k3lab.last_crash"] == crash_line(trial)
    kept = [a.path for a in client.list_artifacts(run_id, "crashes")]
    assert kept == ["crashes/1-worker-9868.err"]
    assert "cudaGraphLaunch" in Path(client.download_artifacts(run_id, kept[0], str(tmp_path / "dl"))).read_text()


def test_without_the_workers_log_the_crash_line_is_tunes_last_error_line(tmp_path, monkeypatch):
    import k3lab.runner.runtime.crashes as crashes

    monkeypatch.setattr(crashes, "ray_logs_dir", lambda: None)
    (tmp_path / "error.txt").write_text(ACTOR_DIED)
    trial = SimpleNamespace(error_file=str(tmp_path / "error.txt"))
    assert crash_line(trial).startswith("The actor is dead because its worker process has died.")


def test_only_the_last_of_a_trials_failures_is_read(tmp_path, monkeypatch):
    """Tune appends every failure of a trial to one error file: a later failure that is not a
    dead worker's must not be reported with an earlier crash's worker log, and the other way round."""
    import k3lab.runner.runtime.crashes as crashes

    monkeypatch.setattr(crashes, "ray_logs_dir", lambda: ray_logs(tmp_path, 9868, worker_stderr()))
    out_of_memory = "Failure # 2 (occurred at 2026-12-01_14-45-02)\ntorch.OutOfMemoryError: CUDA out of memory\n"
    (tmp_path / "after.txt").write_text(ACTOR_DIED + out_of_memory)
    (tmp_path / "before.txt").write_text(out_of_memory.replace("# 2", "# 1") + ACTOR_DIED.replace("# 1", "# 2"))
    assert crash_line(SimpleNamespace(error_file=str(tmp_path / "after.txt"))) == \
        "torch.OutOfMemoryError: CUDA out of memory"
    assert crash_line(SimpleNamespace(error_file=str(tmp_path / "before.txt"))).startswith("Segmentation fault")


def test_a_worker_log_the_store_cannot_take_costs_a_warning_not_the_sweep(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    MlflowClient(uri).create_experiment("x", artifact_location=(tmp_path / "art").as_uri())
    with pytest.warns(UserWarning, match="pid 9868.*was not kept with run no-such-run"):
        keep_worker_log(uri, "no-such-run", "1", (9868, "Fatal Python error: Segmentation fault\n"))
