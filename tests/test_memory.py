"""GPU memory packing (k3lab.runner.runtime.memory): trials at once from measured peaks, the gate that
holds a trial off a full GPU, and an out-of-memory error that lowers the trials at once instead of
crashing into the same wall. A fake GPU of given memory stands in for the card."""

import contextlib
import json
import multiprocessing

import pytest
from conftest import mini_sweep, sweep_args
from mlflow.tracking import MlflowClient

from k3lab.errors import UserError
from k3lab.runner.runtime import gpu_gate, memory
from k3lab.runner.runtime.gpu_gate import Limits, MemoryGate, admits
from k3lab.runner.runtime.memory import GIB, DoesNotFit, GPUModel, plan_packing

H100 = GPUModel("NVIDIA H100 80GB HBM3", 80 * GIB)


def record_of(peaks_gib: dict[str, float], gpu: GPUModel = H100) -> dict:
    return {key: {gpu.name: {"variant": key, "peak_bytes": int(gib * GIB), "gpu_bytes": gpu.total_bytes}}
            for key, gib in peaks_gib.items()}


def test_trials_are_packed_so_their_measured_peaks_fit_the_card_with_headroom():
    packing = plan_packing({"off": "k1", "bs2": "k2"}, H100, ceiling=4, record=record_of({"k1": 20, "k2": 24}))
    assert packing.trials == 3  # 72 GiB of the card's 80, less 10% headroom: three of 24 GiB, not four
    assert packing.line() == "NVIDIA H100 80GB HBM3 (80 GiB): 3 trials at once, ~24 GiB each, 10% of the card kept free"
    assert packing.fraction == pytest.approx(1 / 3)


def test_the_sweep_files_gpu_share_is_a_ceiling_not_a_promise():
    small = plan_packing({"off": "k1"}, H100, ceiling=4, record=record_of({"k1": 5}))
    assert small.trials == 4 and "(the sweep file's ceiling)" in small.line()


def test_an_unmeasured_variant_is_named_and_runs_alone_first():
    packing = plan_packing({"off": "k1", "new": "k9"}, H100, ceiling=4, record=record_of({"k1": 20}))
    assert packing.trials == 3 and packing.unmeasured == ("new",) and "not measured: new" in packing.line()
    nothing = plan_packing({"new": "k9"}, H100, ceiling=4, record={})
    assert nothing.peak_bytes is None and "runs alone until it has measured its memory" in nothing.line()


def test_a_variant_that_cannot_fit_alone_is_refused_in_one_line(tmp_path, monkeypatch):
    with pytest.raises(DoesNotFit, match=r"variant big needs ~75.0 GiB .* lower train.batch_size"):
        plan_packing({"big": "k1"}, H100, ceiling=4, record=record_of({"k1": 75}))
    sweep_path = tmp_path / "mini.yaml"
    sweep_path.write_text(mini_sweep("mini", "x"))
    from k3lab.registry.sweep_file import load_sweep

    sweep = load_sweep(str(sweep_path))
    keys = {v.name: memory.variant_key(v.config, sweep.train_of(v)) for v in sweep.valid_variants}
    monkeypatch.setattr(memory, "SHIPPED_RECORD", tmp_path / "none.json")
    monkeypatch.setenv(memory.FAKE_GPU_VAR, "Fake GPU=8")
    memory.record_path(tmp_path / "kc").parent.mkdir(parents=True)
    memory.record_path(tmp_path / "kc").write_text(json.dumps(
        record_of({keys["attnres_bs1"]: 7.5}, GPUModel("Fake GPU", 8 * GIB))))
    with pytest.raises(UserError) as error:
        memory.host_packing(sweep, tmp_path / "kc")
    assert str(error.value).startswith(f"{sweep_path}: variant attnres_bs1 needs ~7.5 GiB")
    assert "\n" not in str(error.value)


def test_the_plan_prints_the_packing_of_every_gpu_model_measured(tmp_path, monkeypatch):
    sweep_path = tmp_path / "s.yaml"
    sweep_path.write_text(mini_sweep("s", "x").replace("gpu: 0}", "gpu: 0.25}"))
    from k3lab.registry.sweep_file import load_sweep

    sweep = load_sweep(str(sweep_path))
    keys = [memory.variant_key(v.config, sweep.train_of(v)) for v in sweep.valid_variants]
    h200 = GPUModel("NVIDIA H200", 140 * GIB)
    record = record_of({keys[0]: 22, keys[1]: 24}) | {}
    for key, gib in zip(keys, (22, 24)):
        record[key] |= record_of({key: gib}, h200)[key]
    monkeypatch.setattr(memory, "SHIPPED_RECORD", tmp_path / "shipped.json")
    (tmp_path / "shipped.json").write_text(json.dumps(record))
    monkeypatch.setattr(memory, "host_gpu", lambda: None)
    lines = memory.packing_lines(sweep, tmp_path / "empty-cache")
    assert lines == ["GPU memory: NVIDIA H100 80GB HBM3 (80 GiB): 3 trials at once, ~24 GiB each, 10% of the card kept free",
                     "GPU memory: NVIDIA H200 (140 GiB): 4 trials at once, ~24 GiB each (the sweep file's ceiling), "
                     "10% of the card kept free"]


def test_a_trials_measurement_raises_the_record_and_never_lowers_it(tmp_path):
    memory.add_measurement(tmp_path, "k1", "off", "G", 10 * GIB, 80 * GIB)
    memory.add_measurement(tmp_path, "k1", "off", "G", 8 * GIB, 80 * GIB)
    memory.add_measurement(tmp_path, "k1", "off", "G", 12 * GIB, 80 * GIB)
    assert memory.read_record(memory.record_path(tmp_path))["k1"]["G"]["peak_bytes"] == 12 * GIB


def test_the_gate_admits_a_trial_only_where_its_memory_fits_beside_the_others():
    limits = Limits(trials=3, budget_bytes=72)
    assert admits(limits, [], None)  # an empty GPU takes anyone
    assert admits(limits, [24, 24], 24) and not admits(limits, [24, 24], 25)
    assert not admits(limits, [10, 10, 10], 10)  # three at once at most
    assert not admits(limits, [24, None], 10)  # a holder still measuring: wait for its figure
    assert admits(limits, [24], None) and not admits(limits, [24, 30], None)  # unmeasured: as large as the largest


def hold_a_slot(folder, limits, used, ready, done):
    gate = MemoryGate(folder, limits, poll_s=0.05)
    gate.acquire(used, "holder")
    ready.set()
    done.wait(30)
    gate.release()


@contextlib.contextmanager
def another_trial_holding(folder, limits: Limits, used: int):
    """Another process holding a slot of the gate in `folder` with `used` bytes, until the block
    sets the event it yields (or ends); then gone."""
    context = multiprocessing.get_context("spawn")
    ready, done = context.Event(), context.Event()
    holder = context.Process(target=hold_a_slot, args=(folder, limits, used, ready, done))
    holder.start()
    try:
        assert ready.wait(30)
        yield done, holder
    finally:
        done.set()
        holder.join(10)


def test_a_trial_waits_at_the_gate_until_a_holder_has_gone(tmp_path):
    import threading

    limits = Limits(trials=2, budget_bytes=40, owner="sweep")
    with another_trial_holding(tmp_path, limits, 30) as (done, holder):
        threading.Timer(1.0, done.set).start()  # the holder ends after a second
        gate = MemoryGate(tmp_path, limits, poll_s=0.05)
        assert gate.acquire(20, "newcomer") >= 0.9  # 30 + 20 > 40: it waited for the holder
        holder.join(10)
        assert not holder.is_alive()


def test_an_out_of_memory_error_lowers_the_trials_at_once_below_those_holding_the_gpu(tmp_path):
    limits = Limits(trials=4, budget_bytes=100, owner="sweep")
    with another_trial_holding(tmp_path, limits, 30) as (done, holder):
        gate = MemoryGate(tmp_path, limits, poll_s=0.05)
        gate.acquire(30, "oom")
        assert gate.lower_after_oom() == 1  # two held the GPU: one at a time from now on
        assert gpu_gate.read_limits(tmp_path).trials == 1
        gate.release()
        MemoryGate(tmp_path, limits, poll_s=0.05)  # the same sweep: its lowered limits stand
        assert gpu_gate.read_limits(tmp_path).trials == 1
        done.set()
        holder.join(10)
    alone = MemoryGate(tmp_path, limits, poll_s=0.05)
    alone.acquire(30, "alone")
    assert alone.lower_after_oom() == 0  # alone on the GPU: it does not fit, nothing to lower


def test_a_new_sweep_starts_from_its_own_packing_not_a_lowered_one(tmp_path):
    MemoryGate(tmp_path, Limits(3, 90, owner="first"))
    gpu_gate.write_limits(tmp_path, Limits(1, 90, owner="first"))  # lowered after an out-of-memory error
    MemoryGate(tmp_path, Limits(3, 90, owner="first"))
    assert gpu_gate.read_limits(tmp_path).trials == 1
    MemoryGate(tmp_path, Limits(3, 90, owner="second"))
    assert gpu_gate.read_limits(tmp_path).trials == 3


@pytest.mark.slow
@pytest.mark.usefixtures("isolated_data")
def test_an_out_of_memory_trial_restarts_without_using_its_crash_budget_and_the_sweep_finishes(
        tmp_path, monkeypatch, capsys):
    """Two trials at once on a fake 8 GiB GPU whose record says each needs 3 GiB; one raises torch's
    out-of-memory error at its step-16 report (the other trial, 40 steps long, still
    training). With --max-failures 0 a crash would end it: instead the
    GPU takes one trial at a time from then on, the trial restarts from its checkpoint once the other
    has gone, and every trial finishes once, in one MLflow run each."""
    from k3lab.cli import main
    from k3lab.registry.sweep_file import load_sweep

    path = tmp_path / "mini.yaml"
    path.write_text(mini_sweep("mini", "two variants on a fake GPU", steps=40, eval_interval=8))
    sweep = load_sweep(str(path))
    record = record_of({memory.variant_key(v.config, sweep.train_of(v)): 3 for v in sweep.valid_variants},
                       GPUModel("Fake GPU", 8 * GIB))
    cache = tmp_path / "kc"
    memory.record_path(cache).parent.mkdir(parents=True)
    memory.record_path(cache).write_text(json.dumps(record))
    monkeypatch.setenv("K3LAB_KERNEL_CACHE", str(cache))
    monkeypatch.setenv(memory.FAKE_GPU_VAR, "Fake GPU=8")
    monkeypatch.setenv(gpu_gate.ENV_VAR, str(tmp_path / "gates"))
    monkeypatch.setenv("K3LAB_OOM_AT_STEP", "attnres_bs1-s0@16")
    assert main(sweep_args(tmp_path, path, "--max-failures", "0", "--max-concurrent", "2")) == 0
    out = capsys.readouterr().out
    assert "GPU memory: Fake GPU (8 GiB): 2 trials at once, ~3 GiB each" in out
    assert "attnres_bs1-s0 out of GPU memory: restarting from its last checkpoint" in out
    assert "restarts: 1 (out of memory 1)" in out
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    parent_id = json.loads((tmp_path / "runs" / "mini.k3lab.json").read_text())["parent_run_id"]
    runs = client.search_runs([client.get_run(parent_id).info.experiment_id], f"tags.mlflow.parentRunId = '{parent_id}'")
    assert sorted((r.data.tags["k3lab.variant_name"], r.info.status) for r in runs) == [
        ("attnres_bs1", "FINISHED"), ("attnres_off", "FINISHED")]
    by_name = {r.data.tags["k3lab.variant_name"]: r for r in runs}
    assert by_name["attnres_bs1"].data.tags["k3lab.restarts_oom"] == "1"
    assert "k3lab.crashes" not in by_name["attnres_bs1"].data.tags
    steps = [m.step for m in client.get_metric_history(by_name["attnres_bs1"].info.run_id, "train_loss")]
    assert sorted(steps) == list(range(1, 41))  # every step once: restarted from its step-8 checkpoint
    (gate,) = (tmp_path / "gates").iterdir()
    assert gpu_gate.read_limits(gate).trials == 1  # one at a time for the rest of the sweep
