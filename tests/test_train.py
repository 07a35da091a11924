import math
import time
import shutil

import pytest
import torch
from mlflow.tracking import MlflowClient

from k3lab.cli import main
from k3lab.registry import TrainSpec, load_preset
from k3lab.runner.train.checkpoint import load_checkpoint
from k3lab.runner.train.loop import train
from k3lab.runner.train.trainer import (DIVERGED, FINISHED, Trainer, keep_states_where_kda_is_fused, lr_factor,
                                 save_trainer)
from k3lab.store.tracking import MLflowTracker
from trackers import MemoryTracker

pytestmark = pytest.mark.usefixtures("isolated_data")


def tiny_spec(**overrides):
    settings = dict(steps=12, batch_size=4, seq_len=32, warmup_steps=2, eval_interval=6, eval_batches=2,
                    log_interval=3, lr=3e-3)
    return TrainSpec(**(settings | overrides))


def test_loss_goes_down_on_the_builtin_corpus():
    tracker = MemoryTracker()
    result = train(load_preset("tiny"), tiny_spec(steps=40, eval_interval=40, batch_size=8, seq_len=64),
                   tracker=tracker)
    losses = [v for _, v in tracker.metrics["train_loss"]]
    assert result.status == FINISHED and result.step == 40
    assert sum(losses[-5:]) / 5 < losses[0] - 1.5  # from ~5.8 (uniform over 320 ids) to well below
    assert result.val_loss < losses[0] - 1.5
    assert result.val_bpb == pytest.approx(result.val_loss / math.log(2), rel=0.2)  # byte tokens: ~1 byte each


def test_every_step_is_logged_once_with_window_metrics():
    tracker = MemoryTracker()
    train(load_preset("tiny"), tiny_spec(), tracker=tracker)
    assert [s for s, _ in tracker.metrics["train_loss"]] == list(range(1, 13))
    assert [s for s, _ in tracker.metrics["val_loss"]] == [6, 12]
    assert all(v > 0 for _, v in tracker.metrics["tokens_per_s"])
    diag = sorted(k for k in tracker.metrics if k.startswith("probe/"))
    assert not [k for k in tracker.metrics if not k.startswith("probe/") and "/" in k]  # all under one prefix
    # tiny: one series per MoE layer (3) and per AttnRes layer (4), two chart sections in the UI
    assert diag == [f"probe/attnres_entropy/L0{i}" for i in range(4)] + [f"probe/moe_balance/L0{i}" for i in (1, 2, 3)]
    assert [s for s, _ in tracker.metrics["probe/attnres_entropy/L03"]] == [3, 6, 9, 12]
    assert sorted(tracker.tables) == ["probe/attnres_mixture/step_000006.json", "probe/attnres_mixture/step_000012.json",
                                      "probe/moe_load/step_000006.json", "probe/moe_load/step_000012.json"]
    table = tracker.tables["probe/attnres_mixture/step_000012.json"]
    assert table["columns"][:3] == ["layer", "site", "c0"] and table["data"][0][0] == "L00"
    assert {row[1] for row in table["data"]} == {"attn", "ffn"}
    assert all(sum(w for w in row[2:] if w is not None) == pytest.approx(1, abs=1e-4) for row in table["data"])
    loads = tracker.tables["probe/moe_load/step_000012.json"]
    assert loads["columns"][:4] == ["layer", "load_entropy", "load_max_min", "e0"] and len(loads["data"]) == 3
    assert all(sum(row[3:]) == pytest.approx(1, abs=1e-4) for row in loads["data"])


def test_a_trial_waits_for_its_training_slot_once_warmed_up_and_the_wait_is_not_training_time():
    """`wait_to_train` (a training slot): called once, after the step that compiled the model
    (on a CPU, with no CUDA graph, the first); its seconds are logged, and left out of the first
    window's throughput."""
    import time

    tracker, calls = MemoryTracker(), []

    def wait_to_train():
        calls.append(trainer.step)
        time.sleep(12.0)
        return 12.0

    trainer = Trainer(load_preset("tiny"), tiny_spec(steps=6, log_interval=2))
    train(None, tiny_spec(steps=6, log_interval=2), tracker=tracker, trainer=trainer, wait_to_train=wait_to_train)
    assert calls == [1] and tracker.metrics["slot_wait_s"] == [(1, 12.0)]
    first_window_ms = tracker.metrics["step_time_ms"][0][1]
    # with the wait counted it would be above 6,000 (12 s over two steps); a tiny step takes well under
    # a second alone, a few on a machine whose two cores run other tests too
    assert first_window_ms < 6000


def test_nan_loss_stops_the_trial_with_a_clear_status():
    config, spec = load_preset("tiny"), tiny_spec()
    trainer = Trainer(config, spec)
    calls = {"n": 0}
    original = trainer.forward

    def poisoned(x, y, **kwargs):
        calls["n"] += 1
        logits, loss = original(x, y, **kwargs)
        return logits, loss * (float("nan") if calls["n"] >= 5 else 1.0)

    trainer.forward = poisoned
    result = train(config, spec, trainer=trainer)
    assert result.status == DIVERGED
    assert result.step == 5 and "step 5" in result.error
    assert trainer.step < spec.steps  # stopped, did not train on to the end


def test_a_non_finite_validation_loss_stops_the_trial_as_diverged():
    """A finite training loss can still evaluate to nan (lr 1e9 did): the trial must not finish as if it had
    a value to compare."""
    config, spec = load_preset("tiny"), tiny_spec()
    trainer = Trainer(config, spec)
    original = trainer.evaluate
    trainer.evaluate = lambda *a, **k: original(*a, **k) | {"val_loss": float("nan")}
    result = train(config, spec, trainer=trainer)
    assert result.status == DIVERGED
    assert result.error == f"non-finite validation loss at step {spec.eval_interval}"
    assert trainer.step == spec.eval_interval < spec.steps


def test_resumed_run_continues_bitwise_identically(tmp_path):
    config, spec = load_preset("tiny"), tiny_spec()
    straight_tracker = MemoryTracker()
    straight = Trainer(config, spec)
    train(config, spec, tracker=straight_tracker, trainer=straight)

    first = Trainer(config, tiny_spec())
    first_tracker = MemoryTracker()
    train(config, tiny_spec(steps=6), tracker=first_tracker, trainer=first)
    save_trainer(first, tmp_path / "ckpt", extra={"note": "x"})
    state = load_checkpoint(tmp_path / "ckpt")
    assert state["step"] == 6 and state["extra"] == {"note": "x"}

    resumed_tracker = MemoryTracker()
    resumed = Trainer(config, spec)
    train(config, spec, tracker=resumed_tracker, checkpoint=tmp_path / "ckpt", trainer=resumed)
    steps = [s for s, _ in first_tracker.metrics["train_loss"] + resumed_tracker.metrics["train_loss"]]
    assert steps == list(range(1, 13))  # same step numbers, no repeats
    losses = [v for _, v in first_tracker.metrics["train_loss"] + resumed_tracker.metrics["train_loss"]]
    assert losses == [v for _, v in straight_tracker.metrics["train_loss"]]
    for (name, a), b in zip(straight.model.state_dict().items(), resumed.model.state_dict().values()):
        assert torch.equal(a, b), name


def optimizer_state_values(trainer) -> list[torch.Tensor]:
    return [value for optimizer in trainer.optimizers for state in optimizer.state.values()
            for value in state.values()]


def optimizer_state_ids(trainer) -> list[int]:
    return [id(value) for value in optimizer_state_values(trainer)]


@pytest.mark.parametrize("init", ["paired", "sequential"])
def test_a_restarted_trainer_trains_exactly_as_a_new_trainer_of_its_seed(init):
    """Trainer.restart(seed) (the next seed of a variant in a reused process) gives the weights,
    losses, evaluations and optimizer state of a Trainer built for that seed, and leaves the
    global generator where that build leaves it."""
    config, spec = load_preset("tiny"), tiny_spec(steps=6, eval_interval=6, init=init)
    reused = Trainer(config, spec, seed=0)
    train(config, spec, trainer=reused)
    model_tensors = [id(p) for p in reused.model.parameters()]
    state_tensors = optimizer_state_ids(reused)
    assert state_tensors  # trained: the optimizers hold state
    reused.restart(1)
    reused_rng = torch.get_rng_state()
    fresh = Trainer(config, spec, seed=1)
    assert torch.equal(reused_rng, torch.get_rng_state())
    for (name, a), b in zip(fresh.model.state_dict().items(), reused.model.state_dict().values()):
        assert torch.equal(a, b), name
    runs = {}
    for name, trainer in (("fresh", fresh), ("reused", reused)):
        tracker = MemoryTracker()
        result = train(config, spec, tracker=tracker, trainer=trainer)
        runs[name] = ([v for _, v in tracker.metrics["train_loss"]], result.val_loss)
    assert runs["reused"] == runs["fresh"] and reused.step == 6
    assert [id(p) for p in reused.model.parameters()] == model_tensors  # its own tensors, written over
    assert optimizer_state_ids(reused) == state_tensors  # where a captured CUDA graph updates them
    for (name, a), b in zip(fresh.model.state_dict().items(), reused.model.state_dict().values()):
        assert torch.equal(a, b), name
    for a, b in zip(optimizer_state_values(fresh), optimizer_state_values(reused), strict=True):
        assert torch.equal(a, b)
    assert reused.execution()["trainer"] == "restarted" and fresh.execution()["trainer"] == "built"


def test_loading_a_checkpoint_drops_a_captured_graph_whose_optimizer_state_it_replaced():
    """Optimizer.load_state_dict puts new state tensors in place; a graph captured before would
    go on updating the old ones, so the trainer captures again after its eager steps."""
    from k3lab.runner.train.graphs import GraphedStep

    config, spec = load_preset("tiny"), tiny_spec(steps=4)
    trainer = Trainer(config, spec, seed=0)
    train(config, spec, trainer=trainer)
    captured = trainer.graphed = GraphedStep(trainer.graph_step, trainer.model.parameters(), trainer.optimizers)
    captured.graph, trainer.eager_steps = object(), 5  # as after a capture on a GPU
    trainer.load_state_dict(trainer.state_dict())
    assert trainer.graphed is not captured and trainer.eager_steps == 0


def test_a_deterministic_trial_turns_on_torchs_deterministic_algorithms_and_trains(restores_determinism):
    import torch.utils.deterministic

    torch.use_deterministic_algorithms(False)
    Trainer(load_preset("tiny"), tiny_spec())
    assert not torch.are_deterministic_algorithms_enabled()  # the default leaves the process alone
    trainer = Trainer(load_preset("tiny"), tiny_spec(deterministic=True))
    assert torch.are_deterministic_algorithms_enabled() and not torch.utils.deterministic.fill_uninitialized_memory
    assert train(load_preset("tiny"), tiny_spec(deterministic=True, steps=4), trainer=trainer).status == FINISHED


def test_lr_schedule_warms_up_then_decays_to_the_floor():
    spec = tiny_spec(steps=100, warmup_steps=10, min_lr_ratio=0.1)
    assert lr_factor(0, spec) == pytest.approx(0.1)
    assert lr_factor(9, spec) == pytest.approx(1.0)
    assert lr_factor(55, spec) == pytest.approx(0.55)
    assert lr_factor(100, spec) == pytest.approx(0.1)
    assert lr_factor(50, tiny_spec(steps=100, warmup_steps=10, schedule="constant")) == 1.0


def test_gradient_accumulation_matches_the_bigger_batch():
    config = load_preset("tiny")
    big = Trainer(config, tiny_spec(batch_size=4, grad_accum=1))
    small = Trainer(config, tiny_spec(batch_size=2, grad_accum=2))
    x, y = big.sampler.next_batch()
    big.sampler.step = 0
    batches = iter([(x[:2], y[:2]), (x[2:], y[2:])])
    small.sampler.next_batch = lambda device=None: next(batches)
    small.model.load_state_dict(big.model.state_dict())
    big_step, small_step = big.train_step(), small.train_step()
    torch.testing.assert_close(small_step["train_loss"], big_step["train_loss"], atol=1e-5, rtol=1e-5)
    # the gradient norm (before clipping) is scale-sensitive, unlike Muon's and AdamW's updates
    torch.testing.assert_close(small_step["grad_norm"], big_step["grad_norm"], atol=1e-5, rtol=1e-4)


def test_mlflow_tracker_sends_metrics_in_batches(tmp_path, monkeypatch):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    tracker = MLflowTracker.start(uri, "batching", "run", flush_every=50)
    calls = []
    original = tracker.client.log_batch
    monkeypatch.setattr(tracker.client, "log_batch", lambda *a, **k: (calls.append(k), original(*a, **k))[1])
    for step in range(1, 121):
        tracker.log_metrics({"train_loss": 1.0 / step, "lr": 0.1}, step)
    tracker.finish("FINISHED")
    assert len(calls) == 3  # steps 50, 100, and the rest at finish: not one call per value
    history = tracker.client.get_metric_history(tracker.run_id, "train_loss")
    assert sorted(m.step for m in history) == list(range(1, 121))
    assert tracker.client.get_run(tracker.run_id).info.status == "FINISHED"


def test_train_command_runs_without_tracking(capsys):
    assert main(["train", "tiny", "--steps", "4", "--no-tracking", "--set", "train.batch_size=2",
                 "--set", "train.seq_len=32"]) == 0
    assert "finished: 4 steps" in capsys.readouterr().err


@pytest.mark.parametrize("flag, message", [
    ("hidden_sizee=3", "--set hidden_sizee: not a KimiK3Config field"),
    ("num_experts_per_token=99", "num_experts_per_token must be in"),
    ("train.stepz=3", "--set train.stepz: not a train field"),
    ("train.seq_len=40", "train.seq_len: 40 is not a multiple of kda_chunk_size=16"),
    ("hidden_size", "expected FIELD=VALUE"),
    ("train.kda_keep_states=maybe", "--set train.kda_keep_states: expected true or false, got string 'maybe'"),
    ("train.compile=1", "--set train.compile: expected true or false, got integer 1"),
    ("train.lr=fast", "--set train.lr: expected a number, got string 'fast'"),
    ("rms_norm_eps=x", "--set rms_norm_eps: expected a number, got string 'x'"),
])
def test_train_command_rejects_bad_settings_in_one_line(flag, message, capsys):
    assert main(["train", "tiny", "--steps", "2", "--no-tracking", "--set", flag]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and "Traceback" not in err


def test_train_set_num_layers_builds_the_same_model_as_a_sweep_base_with_it(tmp_path):
    """`--set num_layers=8` on tiny failed with "layer_types must have num_layers=8 entries, got 4": the
    preset's resolved schedule was carried over. It now reads the preset as written, as a sweep's base does."""
    from k3lab.cli import build_parser
    from k3lab.registry.train_inputs import build_train_inputs
    from k3lab.registry import load_sweep

    args = build_parser().parse_args(["train", "tiny", "--fidelity", "k3", "--set", "num_layers=8"])
    config, _ = build_train_inputs(args)
    sweep = tmp_path / "s.yaml"
    sweep.write_text("name: s\nbase: {preset: tiny, fidelity: k3, num_layers: 8}\nvariants: [{name: v}]\n")
    assert config.num_layers == 8 and config == load_sweep(sweep).variants[0].config


def test_train_command_checks_its_save_folder_before_training(tmp_path, capsys):
    (tmp_path / "a_file").write_text("")
    assert main(["train", "tiny", "--steps", "2", "--no-tracking", "--save", str(tmp_path / "a_file")]) == 2
    assert capsys.readouterr().err == f"error: --save {tmp_path / 'a_file'}: {tmp_path / 'a_file'} is a file, not a folder\n"
    assert main(["train", "tiny", "--steps", "2", "--no-tracking", "--set", "train.batch_size=2",
                 "--set", "train.seq_len=32", "--save", str(tmp_path / "out" / "last.pt")]) == 0  # a .pt: the file
    assert (tmp_path / "out" / "last.pt").is_file()


@pytest.mark.parametrize("seed", ["-1", "99999999999999999999"])
def test_train_command_refuses_a_seed_torch_and_numpy_cannot_take(seed, capsys):
    assert main(["train", "tiny", "--steps", "2", "--no-tracking", "--seed", seed]) == 2
    assert capsys.readouterr().err == f"error: --seed: must be 0 .. 2147483647, got {seed}\n"


def test_train_command_reads_a_learning_rate_with_an_exponent_as_a_number():
    from k3lab.registry.train_inputs import parse_overrides

    assert parse_overrides(["train.lr=1e-3", "rms_norm_eps=1E-5", "train.dataset=1e3x"]) == (
        {"rms_norm_eps": 1e-5}, {"lr": 1e-3, "dataset": "1e3x"})


def test_train_command_rejects_steps_that_are_not_a_number_in_one_line(capsys):
    assert main(["train", "tiny", "--no-tracking", "--set", "train.steps=abc"]) == 2
    err = capsys.readouterr().err
    assert "--set train.steps: expected an integer, got string 'abc'" in err and err.count("\n") == 1
    assert main(["train", "tiny", "--no-tracking", "--steps", "-1"]) == 2
    assert capsys.readouterr().err == "error: --steps: must be positive, got -1\n"


def test_cuda_graph_is_off_with_the_reason_where_it_cannot_run():
    trainer = Trainer(load_preset("tiny"), tiny_spec())  # auto on a CPU: eager, no warning
    assert trainer.graphed is None and trainer.cuda_graph == "off: CUDA graphs need a CUDA device"
    with pytest.warns(UserWarning, match="running eagerly: CUDA graphs need a CUDA device"):
        Trainer(load_preset("tiny"), tiny_spec(cuda_graph=True), device="cpu")
    assert Trainer(load_preset("tiny"), tiny_spec(cuda_graph=False)).cuda_graph == "off: cuda_graph: false"


def test_cuda_graph_blockers_name_accumulation_and_ddp():
    from k3lab.runner.train.graphs import cuda_graph_blocker

    cuda = torch.device("cuda")
    assert cuda_graph_blocker(cuda, grad_accum=1, distributed=False) is None
    assert "grad_accum" in cuda_graph_blocker(cuda, grad_accum=2, distributed=False)
    assert "DDP" in cuda_graph_blocker(cuda, grad_accum=1, distributed=True)


def test_activation_checkpointing_gives_the_same_loss_and_gradients():
    config = load_preset("tiny")
    plain, checkpointed = Trainer(config, tiny_spec()), Trainer(config, tiny_spec(activation_checkpointing=True))
    assert checkpointed.model.checkpoint_layers and not plain.model.checkpoint_layers
    checkpointed.model.load_state_dict(plain.model.state_dict())
    x, y = plain.sampler.next_batch()
    for trainer in (plain, checkpointed):
        trainer.micro_batch_loss(x, y).backward()
    for (name, p), q in zip(plain.model.named_parameters(), checkpointed.model.parameters()):
        if p.grad is not None:
            torch.testing.assert_close(q.grad, p.grad, msg=name)


def test_kda_keep_states_reaches_every_fused_kda_layer_of_the_trial():
    from k3lab.model.kda import KDAFused

    config = load_preset("tiny").replace(kda_implementation="fused", kda_chunk_size=32)  # run by the CPU reference here
    for keep in (False, True):
        trainer = Trainer(config, tiny_spec(kda_keep_states=keep))
        layers = [m for m in trainer.model.modules() if isinstance(m, KDAFused)]
        assert len(layers) == config.layer_types.count("kda") and {layer.keep_states for layer in layers} == {keep}
        assert trainer.execution()["kda_keep_states"] == "False"  # on CPU the reference runs: nothing is kept
    cuda = torch.device("cuda")  # what a GPU trial would log (only the device's type is read)
    assert keep_states_where_kda_is_fused(trainer.model, True, cuda)
    assert not keep_states_where_kda_is_fused(trainer.model, False, cuda)
    chunkwise = Trainer(load_preset("tiny").replace(kda_implementation="chunkwise"), tiny_spec()).model
    assert not keep_states_where_kda_is_fused(chunkwise, True, cuda)


def test_trial_run_records_how_it_ran(tmp_path):
    from k3lab.runner.tune.trial import TrialSpec, run_trial

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    spec = TrialSpec(variant_id="v", variant_name="tiny", seed=0, config=load_preset("tiny"),
                     train=tiny_spec(steps=2, eval_interval=2), tracking_uri=uri, experiment="execution")
    assert spec.config.kda_implementation == "auto"
    _, run_id = run_trial(spec, device="cpu")
    run = MLflowTracker(uri, run_id).client.get_run(run_id)
    assert run.data.tags["k3lab.kda_implementation"] == "chunkwise"  # auto, resolved for the CPU
    assert run.data.params["run.kda_implementation"] == "chunkwise"
    assert run.data.tags["k3lab.cuda_graph"].startswith("off: CUDA graphs need a CUDA device")


def test_a_sweeps_trials_train_on_the_corpus_its_driver_prepared_without_finding_it_again(monkeypatch):
    import k3lab.runner.train.trainer as trainer_module
    from k3lab.data import prepare_dataset
    from k3lab.runner.tune.trial import TrialSpec, run_trial

    prepared = prepare_dataset(tiny_spec().dataset, tiny_spec().tokenizer, progress=False)  # as the driver does

    def no_second_search(*args, **kwargs):
        raise AssertionError("the trial looked for the corpus again")

    monkeypatch.setattr(trainer_module, "prepare_dataset", no_second_search)
    spec = TrialSpec(variant_id="v", variant_name="tiny", seed=0, config=load_preset("tiny"),
                     train=tiny_spec(steps=2, eval_interval=2), tracking_uri=None, experiment="data",
                     dataset_dir=str(prepared.path))
    result, _ = run_trial(spec, device="cpu")
    assert result.status == "finished" and result.tokens > 0


def test_a_trial_that_cannot_see_the_drivers_corpus_prepares_its_own(tmp_path):
    from k3lab.runner.tune.trial import prepared_by_driver

    assert prepared_by_driver(None) is None
    assert prepared_by_driver(str(tmp_path / "on-the-head-node-only")) is None  # a worker without the volume


def test_moved_sqlite_store_writes_artifacts_beside_itself(tmp_path):
    from k3lab.store.tracking import relocate_artifacts

    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir()
    tracker = MLflowTracker.start(f"sqlite:///{first / 'mlflow.db'}", "moved", "run")
    (tmp_path / "note.txt").write_text("hello")
    tracker.log_artifact(tmp_path / "note.txt")
    tracker.finish("FINISHED")
    shutil.copytree(first, second)
    shutil.rmtree(first)  # the first machine is gone
    uri = f"sqlite:///{second / 'mlflow.db'}"
    assert relocate_artifacts(uri, "moved") == 1
    assert relocate_artifacts(uri, "moved") == 0  # already in place
    client = MlflowClient(uri)
    assert client.get_run(tracker.run_id).info.artifact_uri.startswith((second / "mlartifacts" / "moved").as_uri())
    assert [a.path for a in client.list_artifacts(tracker.run_id)] == ["note.txt"]
    MLflowTracker(uri, tracker.run_id).log_artifact(tmp_path / "note.txt", "again")
    assert (second / "mlartifacts" / "moved" / tracker.run_id / "artifacts" / "again" / "note.txt").exists()
    assert not first.exists()
    new_run = MLflowTracker.start(uri, "moved", "later")  # new runs of the experiment land there too
    assert client.get_run(new_run.run_id).info.artifact_uri.startswith(second.as_uri())


def test_relocation_leaves_other_artifact_locations_alone(tmp_path):
    from k3lab.store.tracking import relocate_artifacts

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(uri)
    client.create_experiment("elsewhere", artifact_location=(tmp_path / "custom").as_uri())
    assert relocate_artifacts(uri, "elsewhere") == 0 and relocate_artifacts(uri, "absent") == 0
    assert client.get_experiment_by_name("elsewhere").artifact_location == (tmp_path / "custom").as_uri()
    assert relocate_artifacts("http://127.0.0.1:5000", "elsewhere") == 0  # a server keeps its own


def test_train_final_line_shows_the_run_average_tokens_per_s_not_the_last_windows(monkeypatch, capsys):
    import types

    from k3lab.runner.train import loop as loop_module
    from k3lab.runner.train import trainer as train_module

    clock = {"now": 0.0}  # a fake clock: five slow steps, then five fast ones
    monkeypatch.setattr(loop_module, "time", types.SimpleNamespace(perf_counter=lambda: clock["now"],
                                                                   time=loop_module.time.time))
    original = train_module.Trainer.train_step

    def timed_step(self):
        values = original(self)
        clock["now"] += 1.0 if self.step <= 5 else 0.01
        return values

    monkeypatch.setattr(train_module.Trainer, "train_step", timed_step)
    assert main(["train", "tiny", "--steps", "10", "--no-tracking", "--set", "train.batch_size=2",
                 "--set", "train.seq_len=32", "--set", "train.log_interval=5"]) == 0
    final = capsys.readouterr().err.replace("\n", " ")
    # 10 x 64 tokens in 5.05 s of steps = 127 tokens/s; the last window alone ran at 320 / 0.05 = 6,400
    assert "127 tokens/s (run average)" in final


@pytest.mark.parametrize("preset", ["tiny", "small"])
def test_every_parameter_gets_a_gradient_even_from_experts_no_token_chose(preset):
    """DDP runs without find_unused_parameters and may use a static graph (train/ddp.py):
    that holds only while every parameter gets a gradient in every step."""
    from k3lab.model.model import KimiK3

    config = load_preset(preset).replace(kda_implementation="chunkwise", kda_chunk_size=8)
    model = KimiK3(config)
    idx = torch.randint(0, config.vocab_size, (1, 8))  # 8 tokens x top-k: most experts get none
    _, loss = model(idx, torch.roll(idx, -1, 1), return_logits=False)
    loss.backward()
    missing = [name for name, p in model.named_parameters() if p.grad is None]
    assert not missing, missing
    unchosen = [(name, moe) for name, moe in model.moe_layers() if (moe.load_counts == 0).any()]
    assert unchosen, "no expert went unchosen: the case this test is for did not happen"


def test_a_trial_sends_its_metrics_before_each_report_a_scheduler_may_stop_it_at(tmp_path, monkeypatch):
    """Ray ends a stopped trial's process without waiting for its thread: what the trial has not
    sent to MLflow when it reports is lost. So every report finds the run already holding the
    steps it covers, and the last report finds the run closed, with its final metrics."""
    from ray import tune

    from k3lab.runner.tune.trial import RUN_ID_KEY, TrialSpec, tune_trainable

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    spec = TrialSpec(variant_id="v", variant_name="tiny", seed=0, config=load_preset("tiny"),
                     train=tiny_spec(), tracking_uri=uri, experiment="reports")
    client = MlflowClient(uri)
    seen = []

    def report(result, checkpoint=None):
        run = client.get_run(result[RUN_ID_KEY])
        losses = [m.step for m in client.get_metric_history(run.info.run_id, "train_loss")]
        seen.append((result["done_steps"], max(losses), run.info.status, "final_val_loss" in run.data.metrics,
                     checkpoint is not None))
        if result["done_steps"] == spec.train.steps:
            raise SystemExit(0)  # as Tune does when ASHA stops the trial at max_t

    monkeypatch.setattr(tune, "report", report)
    monkeypatch.setattr(tune, "get_checkpoint", lambda: None)
    with pytest.raises(SystemExit):
        tune_trainable({"trial": "t"}, {"t": spec})
    assert seen == [(6, 6, "RUNNING", False, True), (12, 12, "FINISHED", True, True)]  # the final model kept


def test_a_trial_logs_its_own_torch_compile_cache_hits_and_misses_not_its_process_earlier_ones(monkeypatch):
    import torch._dynamo.utils as dynamo_utils

    from k3lab.runner.train.diagnostics import compile_cache_counts

    dynamo_utils.counters.clear()
    dynamo_utils.counters["inductor"]["fxgraph_cache_hit"] += 3  # an earlier trial of this (reused) process
    dynamo_utils.counters["aot_autograd"]["autograd_cache_miss"] += 1
    assert compile_cache_counts() == {"startup_aot_cache_hits": 0.0, "startup_aot_cache_misses": 1.0,
                                      "startup_fxgraph_cache_hits": 3.0, "startup_fxgraph_cache_misses": 0.0}
    step = Trainer.train_step

    def compiling_step(self):  # this trial compiles 2 graphs in its first step, 1 more in its third
        dynamo_utils.counters["inductor"]["fxgraph_cache_miss"] += {0: 2, 2: 1}.get(self.step, 0)
        return step(self)

    monkeypatch.setattr(Trainer, "train_step", compiling_step)
    tracker = MemoryTracker()
    train(load_preset("tiny"), tiny_spec(steps=4, eval_interval=2), tracker=tracker, started_at=time.time())
    assert tracker.metrics["startup_fxgraph_cache_misses"] == [(1, 2.0)]  # logged with startup_s, at step 1
    assert tracker.metrics["startup_fxgraph_cache_hits"] == [(1, 0.0)]
    assert tracker.metrics["startup_aot_cache_misses"] == [(1, 0.0)]
    assert tracker.metrics["compile_fxgraph_cache_misses"] == [(2, 2.0), (4, 3.0)]  # at each evaluation
    dynamo_utils.counters.clear()


def test_the_last_evaluation_uses_final_eval_batches_and_the_others_eval_batches(monkeypatch):
    """final_eval_batches: the verdict's val_loss from more validation batches than the curve's
    points; its value is the mean loss over that many fixed windows."""
    trainer = Trainer(load_preset("tiny"), tiny_spec(final_eval_batches=5), seed=0)
    drawn = []
    original = type(trainer.val_sampler).eval_batches
    monkeypatch.setattr(type(trainer.val_sampler), "eval_batches",
                        lambda self, n, device=None: (drawn.append(n), original(self, n, device))[1])
    trainer.step = 6
    midway = trainer.evaluate()["val_loss"]
    trainer.step = 12
    final = trainer.evaluate()["val_loss"]
    assert drawn == [2, 5]
    with torch.no_grad():
        losses = [trainer.model(x, y, return_logits=False)[1] for x, y in original(trainer.val_sampler, 5)]
    assert final == pytest.approx(torch.stack(losses).mean().item(), rel=1e-5) and final != midway
    assert tiny_spec().eval_batches_at(12) == 2  # unset: every evaluation has eval_batches


def test_final_eval_batches_must_be_positive():
    with pytest.raises(Exception, match="final_eval_batches must be positive, got 0"):
        tiny_spec(final_eval_batches=0)


def test_a_corpus_whose_split_is_shorter_than_seq_len_is_refused_naming_the_corpus_split_and_field(tmp_path):
    from k3lab.errors import UserError

    (tmp_path / "two").mkdir()
    for name in ("a", "b"):  # one short document per split
        (tmp_path / "two" / f"{name}.txt").write_text(f"text of {name}")
    with pytest.raises(UserError, match=rf"^train.dataset {tmp_path / 'two'}: its train split has 10 tokens, "
                                        r"fewer than train.seq_len \+ 1 = 33 \(a larger corpus or a shorter seq_len\)$"):
        Trainer(load_preset("tiny"), tiny_spec(dataset=str(tmp_path / "two")), device="cpu")
