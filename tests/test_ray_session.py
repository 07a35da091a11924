"""k3lab.tune.sweep.ray_session: Ray started for a sweep, with other start-up work done meanwhile."""

import threading
import time
from types import SimpleNamespace

import pytest

from k3lab.tune import sweep


@pytest.fixture
def ray_that_waits(monkeypatch):
    """ray_session without Ray: start_ray is `waits()` (set by the test), the fit check passes."""
    import ray

    calls = {"waits": lambda: None}
    monkeypatch.setattr(sweep, "start_ray", lambda run: calls["waits"]())
    monkeypatch.setattr(sweep, "check_cluster_fits", lambda *args: None)
    monkeypatch.setattr(ray, "cluster_resources", lambda: {"CPU": 1.0})
    return calls


def test_the_store_opens_while_ray_starts_and_is_open_before_the_sweep_begins(ray_that_waits):
    opening, done = threading.Event(), []
    ray_that_waits["waits"] = lambda: opening.wait(10) or pytest.fail("the store was not opened while Ray started")

    def open_store():
        opening.set()
        time.sleep(0.2)  # the rest of MLflow's table creation
        done.append("store open")

    with sweep.ray_session(SimpleNamespace(on_cluster=True, sweep=None), meanwhile=open_store):
        assert done == ["store open"]


def test_a_failure_meanwhile_is_left_to_the_sweep_that_would_meet_it_again(ray_that_waits):
    def broken():
        raise RuntimeError("database is locked")

    ran = []
    with sweep.ray_session(SimpleNamespace(on_cluster=True, sweep=None), meanwhile=broken):
        ran.append("block")
    assert ran == ["block"]
