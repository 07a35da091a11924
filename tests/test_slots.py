"""Training slots: of the trials on one GPU (here: one CPU host), at most N train at once.

A slot is a lock of a process, so each trial here is a process of its own: `holder` starts one
that takes a slot, says so, and keeps it until it reads a line (or is killed)."""

import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from k3lab.runner.runtime.slots import TrainingSlot


def holder(folder, slots=1):
    process = subprocess.Popen([sys.executable, "-c", (
        "import sys; from pathlib import Path; from k3lab.runner.runtime.slots import TrainingSlot; "
        f"slot = TrainingSlot({slots}, Path({str(folder)!r})); slot.acquire(); print('held', flush=True); "
        "sys.stdin.readline(); slot.release(); print('released', flush=True); sys.stdin.readline()")],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert process.stdout.readline().strip() == "held"
    return process


def release(process):
    process.stdin.write("\n")
    process.stdin.flush()
    assert process.stdout.readline().strip() == "released"


@pytest.fixture
def holders():
    started = []
    yield lambda folder, slots=1: started.append(holder(folder, slots)) or started[-1]
    for process in started:
        process.kill()
        process.wait(timeout=30)


def test_with_one_slot_a_second_trial_waits_until_the_first_frees_it(tmp_path, holders):
    first = holders(tmp_path)
    second, waited = TrainingSlot(1, tmp_path, poll_s=0.02), []
    waiter = threading.Thread(target=lambda: waited.append(second.acquire()))
    waiter.start()
    time.sleep(0.5)
    assert waiter.is_alive() and second.held is None  # still waiting while the first holds the slot
    release(first)
    waiter.join(timeout=10)
    assert not waiter.is_alive() and waited[0] >= 0.4  # it waited for the release, and says how long
    second.release()


def test_n_slots_let_n_trials_train_and_the_next_one_wait(tmp_path, holders):
    first, _ = holders(tmp_path, slots=2), holders(tmp_path, slots=2)
    assert TrainingSlot(2, tmp_path)._try_each_slot() is None
    release(first)
    third = TrainingSlot(2, tmp_path)
    assert third.acquire() < 1.0
    third.release()


def test_a_trial_killed_while_it_holds_a_slot_frees_it(tmp_path, holders):
    """A crashed or killed trial does no clean-up: the kernel drops its lock with the process."""
    process = holders(tmp_path)
    assert TrainingSlot(1, tmp_path)._try_each_slot() is None
    os.kill(process.pid, signal.SIGKILL)
    process.wait(timeout=30)
    assert TrainingSlot(1, tmp_path, poll_s=0.02).acquire() < 5.0


def test_a_process_a_trial_forks_does_not_keep_its_slot(tmp_path):
    """Compile workers a trial forks must not hold its slot after the trial frees it."""
    slot = TrainingSlot(1, tmp_path)
    slot.acquire()
    child = os.fork()
    if child == 0:  # the forked worker: lives on after its parent releases the slot
        time.sleep(3)
        os._exit(0)
    try:
        slot.release()
        probe = subprocess.run([sys.executable, "-c", (
            "from pathlib import Path; from k3lab.runner.runtime.slots import TrainingSlot; "
            f"print(TrainingSlot(1, Path({str(tmp_path)!r}))._try_each_slot() is not None)")],
            capture_output=True, text=True, timeout=60)
        assert probe.stdout.strip() == "True"
    finally:
        os.waitpid(child, 0)


@pytest.mark.parametrize("resources, message", [
    ({"max_concurrent_trials": 4, "training_slots": 4}, "resources.training_slots: must be fewer than the 4 trials "
                                                        "that can share a GPU (max_concurrent_trials), or no trial "
                                                        "waits; got 4"),
    ({"gpu": 0.25, "max_concurrent_trials": 8, "training_slots": 4},  # two GPUs, four trials on each
     "resources.training_slots: must be fewer than the 4 trials that can share a GPU (gpu: 0.25), or no trial "
     "waits; got 4"),
    ({"gpu": 1, "training_slots": 1}, "resources.training_slots: needs trials that share a GPU (gpu below 1), "
                                      "got gpu: 1"),
    ({"gpus_per_trial": 2, "strategy": "ddp", "training_slots": 1},
     "resources.training_slots: must be unset with strategy: ddp"),
    ({"training_slots": 0}, "resources.training_slots: must be positive, got 0"),
])
def test_training_slots_that_cannot_work_are_refused_with_the_field(tmp_path, resources, message):
    from conftest import mini_sweep

    from k3lab.errors import UserError
    from k3lab.registry import load_sweep

    fields = ", ".join(f"{k}: {v}" for k, v in ({"gpu": 0} | resources).items())
    path = tmp_path / "slots.yaml"
    path.write_text(mini_sweep("slots", "x").replace("resources: {cpu: 1, gpu: 0}", f"resources: {{cpu: 1, {fields}}}"))
    with pytest.raises(UserError, match="training_slots") as error:
        load_sweep(path)
    assert message in str(error.value)


def test_slots_per_gpu_may_be_fewer_than_the_trials_one_gpu_holds_across_several_gpus(tmp_path):
    from conftest import mini_sweep

    from k3lab.registry import load_sweep

    path = tmp_path / "slots.yaml"
    path.write_text(mini_sweep("slots", "x").replace(
        "resources: {cpu: 1, gpu: 0}", "resources: {cpu: 1, gpu: 0.25, max_concurrent_trials: 8, training_slots: 2}"))
    assert load_sweep(path).resources.training_slots == 2
