"""Training slots: of the trials on one GPU (here: one CPU host), at most N train at once."""

import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from k3lab.tune.slots import TrainingSlot


def test_with_one_slot_a_second_trial_waits_until_the_first_frees_it(tmp_path):
    first, second = TrainingSlot(1, tmp_path), TrainingSlot(1, tmp_path, poll_s=0.02)
    assert first.acquire() < 1.0
    waited = []
    waiter = threading.Thread(target=lambda: waited.append(second.acquire()))
    waiter.start()
    time.sleep(0.5)
    assert waiter.is_alive() and second.held is None  # still waiting while the first holds the slot
    first.release()
    waiter.join(timeout=10)
    assert not waiter.is_alive() and waited[0] >= 0.4  # it waited for the release, and says how long
    second.release()


def test_n_slots_let_n_trials_train_and_the_next_one_wait(tmp_path):
    holders = [TrainingSlot(2, tmp_path) for _ in range(2)]
    for slot in holders:
        slot.acquire()
    assert TrainingSlot(2, tmp_path)._try_each_slot() is None
    holders[0].release()
    third = TrainingSlot(2, tmp_path)
    assert third.acquire() < 1.0
    for slot in (holders[1], third):
        slot.release()


def test_a_trial_killed_while_it_holds_a_slot_frees_it(tmp_path):
    """A crashed or killed trial does no clean-up: the kernel drops its lock with the process."""
    holder = subprocess.Popen([sys.executable, "-c", (
        "import sys, time; from pathlib import Path; from k3lab.tune.slots import TrainingSlot; "
        f"TrainingSlot(1, Path({str(tmp_path)!r})).acquire(); print('held', flush=True); time.sleep(600)")],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        assert TrainingSlot(1, tmp_path)._try_each_slot() is None
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait(timeout=30)
        assert TrainingSlot(1, tmp_path, poll_s=0.02).acquire() < 5.0
    finally:
        holder.kill()


@pytest.mark.parametrize("resources, message", [
    ({"max_concurrent_trials": 4, "training_slots": 4}, "resources.training_slots: must be fewer than "
                                                        "max_concurrent_trials (4), or no trial waits; got 4"),
    ({"gpus_per_trial": 2, "strategy": "ddp", "training_slots": 1},
     "resources.training_slots: must be unset with strategy: ddp"),
    ({"training_slots": 0}, "resources.training_slots: must be positive, got 0"),
])
def test_training_slots_that_cannot_work_are_refused_with_the_field(tmp_path, resources, message):
    from conftest import mini_sweep

    from k3lab.errors import UserError
    from k3lab.registry import load_sweep

    fields = ", ".join(f"{k}: {v}" for k, v in resources.items())
    path = tmp_path / "slots.yaml"
    path.write_text(mini_sweep("slots", "x").replace("resources: {cpu: 1, gpu: 0}", f"resources: {{cpu: 1, {fields}}}"))
    with pytest.raises(UserError, match="training_slots") as error:
        load_sweep(path)
    assert message in str(error.value)
