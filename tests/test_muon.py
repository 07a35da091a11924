"""k3lab's batched Muon against torch.optim.Muon, expert stacks, and optimizer checkpoints."""

import copy

import pytest
import torch

from k3lab.errors import UserError
from k3lab.model.config import tiny_config
from k3lab.model.model import KimiK3
from k3lab.optim.muon import Muon, newton_schulz, shape_buckets
from k3lab.optim.assignment import build_optimizers, split_parameters
from k3lab.registry import TrainSpec
from k3lab.runner.train.trainer import Trainer

SHAPES = [(32, 64), (64, 32), (48, 48), (32, 64), (16, 80)]  # wide, tall, square, a repeat, odd


def matrices(shapes=SHAPES, seed=0):
    generator = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(*s, generator=generator) * 0.1) for s in shapes]


def run_steps(optimizer, params, steps=3, lrs=(0.02, 0.01, 0.005), seed=1):
    """`steps` updates with fixed random gradients and a changing learning rate."""
    generator = torch.Generator().manual_seed(seed)
    for step in range(steps):
        for p in params:
            p.grad = torch.randn(p.shape, generator=generator)
        for group in optimizer.param_groups:
            group["lr"] = lrs[step]
        optimizer.step()


@pytest.mark.parametrize("nesterov", [True, False])
@pytest.mark.parametrize("adjust_lr_fn", ["match_rms_adamw", "original"])
def test_two_d_updates_equal_torch_muon_within_bf16_tolerance(nesterov, adjust_lr_fn):
    ours, reference = matrices(), matrices()
    settings = dict(lr=0.02, weight_decay=0.1, momentum=0.95, nesterov=nesterov, adjust_lr_fn=adjust_lr_fn)
    run_steps(Muon(ours, **settings), ours)
    run_steps(torch.optim.Muon(reference, **settings), reference)
    start = matrices()
    for p, q, p0 in zip(ours, reference, start):
        update, expected = p.detach() - p0, q.detach() - p0
        # bf16 Newton-Schulz: the batched and the per-matrix products round differently
        torch.testing.assert_close(update, expected, atol=2e-3, rtol=2e-2)
        assert (update - expected).norm() < 0.02 * expected.norm()


def test_a_learning_rate_held_in_a_tensor_gives_the_updates_of_the_same_float():
    """A step captured as a CUDA graph reads its learning rate from a device scalar."""
    ours, reference = matrices(), matrices()
    settings = dict(lr=0.02, weight_decay=0.1, momentum=0.95)
    run_steps(Muon(ours, **settings), ours, lrs=[torch.tensor(lr) for lr in (0.02, 0.01, 0.005)])
    run_steps(Muon(reference, **settings), reference)
    start = matrices()
    for p, q, p0 in zip(ours, reference, start):
        torch.testing.assert_close(p.detach() - p0, q.detach() - p0, atol=1e-7, rtol=1e-5)
        assert not torch.equal(p, p0)


def test_each_expert_slice_gets_exactly_the_update_of_its_own_matrix():
    E, rows, cols = 6, 24, 40
    separate = matrices([(rows, cols)] * E)
    stack = torch.nn.Parameter(torch.stack([p.detach().clone() for p in separate]))
    settings = dict(lr=0.02, weight_decay=0.1)
    generator = torch.Generator().manual_seed(3)
    opt_stack, opt_separate = Muon([stack], **settings), Muon(separate, **settings)
    for _ in range(3):
        grads = torch.randn(E, rows, cols, generator=generator)
        stack.grad = grads.clone()
        for p, g in zip(separate, grads):
            p.grad = g.clone()
        opt_stack.step()
        opt_separate.step()
    for e, p in enumerate(separate):
        assert torch.equal(stack.detach()[e], p.detach())


def test_an_expert_slice_is_orthogonalised_alone_not_with_its_neighbours():
    G = torch.randn(3, 16, 32)
    G[1] *= 1000.0  # a huge neighbour would dominate a joint normalisation
    together = newton_schulz(G)
    for e in range(3):
        torch.testing.assert_close(together[e], newton_schulz(G[e:e + 1])[0])


def test_newton_schulz_output_is_nearly_orthogonal():
    X = newton_schulz(torch.randn(4, 32, 64)).float()
    singular_values = torch.linalg.svdvals(X)
    assert singular_values.min() > 0.5 and singular_values.max() < 1.5  # NS5's known band


def test_buckets_group_matrices_by_shape_in_order():
    params = matrices() + [torch.nn.Parameter(torch.zeros(5, 32, 64))]
    buckets = shape_buckets(params)
    assert [len(v) for v in buckets.values()] == [3, 1, 1, 1]  # (32, 64) x2 + the stack of five
    assert buckets[((32, 64), torch.float32, torch.device("cpu"))][2] is params[-1]


def test_muon_rejects_vectors():
    with pytest.raises(ValueError, match="matrices"):
        Muon([torch.nn.Parameter(torch.zeros(8))])


def test_muon_rejects_a_negative_number_of_streams_and_makes_none_off_cuda():
    with pytest.raises(ValueError, match="streams must be >= 0"):
        Muon(matrices(), streams=-1)
    params = matrices()
    optimizer = Muon(params, streams=4)
    run_steps(optimizer, params, steps=1)
    assert optimizer.side_streams == {}  # CPU: the buckets run where they are


def test_optimizer_state_round_trips_through_a_state_dict():
    params, copies = matrices(), matrices()
    optimizer = Muon(params, lr=0.02)
    run_steps(optimizer, params, steps=2)
    run_steps(Muon(copies, lr=0.02), copies, steps=2)
    restored = Muon(copies, lr=0.02)
    restored.load_state_dict(copy.deepcopy(optimizer.state_dict()))  # as through torch.save
    run_steps(optimizer, params, steps=1, seed=9)
    run_steps(restored, copies, steps=1, seed=9)
    for p, q in zip(params, copies):
        assert torch.equal(p, q)


def test_torch_muon_state_dicts_load_into_the_batched_muon():
    """Checkpoints written with torch.optim.Muon (before the batched step) continue here."""
    params, copies = matrices(), matrices()
    reference = torch.optim.Muon(params, lr=0.02, adjust_lr_fn="match_rms_adamw")
    run_steps(reference, params, steps=2)
    run_steps(torch.optim.Muon(copies, lr=0.02, adjust_lr_fn="match_rms_adamw"), copies, steps=2)
    ours = Muon(copies, lr=0.02)
    ours.load_state_dict(reference.state_dict())
    for p, q in zip(params, copies):
        assert torch.equal(ours.state[q]["momentum_buffer"], reference.state[p]["momentum_buffer"])


def test_model_experts_are_muon_stacks_and_everything_is_assigned_once():
    model = KimiK3(tiny_config())
    muon, adamw = split_parameters(model)
    stacks = [n for n, p in muon if p.ndim == 3]
    assert stacks and all(".experts.w_" in n for n in stacks)
    assert len(muon) + len(adamw) == len(list(model.parameters()))
    assert isinstance(build_optimizers(model)[0], Muon)


def per_expert_state_dict(model):
    """The model's state dict as k3lab wrote it before the experts were stacked."""
    state = {}
    for key, value in model.state_dict().items():
        if ".experts.w_" in key:
            state.update({f"{key}.{e}": value[e].clone() for e in range(value.shape[0])})
        else:
            state[key] = value
    return state


def test_weights_saved_with_one_matrix_per_expert_load_into_the_stacks():
    model, other = KimiK3(tiny_config()), KimiK3(tiny_config())
    other.load_state_dict(per_expert_state_dict(model))
    for (name, p), q in zip(model.state_dict().items(), other.state_dict().values()):
        assert torch.equal(p, q), name


def test_resuming_a_per_expert_moe_checkpoint_is_refused_with_a_clear_message(isolated_data):
    spec = TrainSpec(steps=2, batch_size=2, seq_len=32, warmup_steps=1)
    trainer = Trainer(tiny_config(), spec)
    state = trainer.state_dict()
    state.pop("format")
    state["model"] = per_expert_state_dict(trainer.model)
    with pytest.raises(UserError, match="one matrix per expert"):
        Trainer(tiny_config(), spec).load_state_dict(state)


def test_compiled_muon_gives_the_eager_updates_and_a_new_learning_rate_is_no_new_graph():
    """compile=True fuses each bucket's elementwise passes (Inductor rounds lerp its own way, and
    the bf16 Newton-Schulz carries that on, so not bit for bit); the learning rate enters the compiled update as a tensor, so a schedule
    compiles nothing after the first step."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()  # process-wide: earlier tests' graphs would otherwise count here
    shapes = [(32, 64), (64, 32), (32, 64)]  # two buckets, one wide, one tall
    eager, compiled = matrices(shapes), matrices(shapes)
    settings = dict(lr=0.02, weight_decay=0.1, momentum=0.95)
    eager_muon, compiled_muon = Muon(eager, **settings), Muon(compiled, compile=True, **settings)
    generator = torch.Generator().manual_seed(1)
    for step, lr in enumerate((0.02, 0.01, 0.005)):
        for p, q in zip(eager, compiled):
            p.grad = torch.randn(p.shape, generator=generator)
            q.grad = p.grad.clone()
        for optimizer in (eager_muon, compiled_muon):
            optimizer.param_groups[0]["lr"] = lr
            optimizer.step()
        if step == 0:
            graphs = counters["stats"]["unique_graphs"]
    assert graphs >= 6  # three stages for each of the two bucket shapes
    assert counters["stats"]["unique_graphs"] == graphs  # two more steps at new rates: no recompilation
    start = matrices(shapes)
    for p, q, p0 in zip(compiled, eager, start):
        update, expected = p.detach() - p0, q.detach() - p0
        # bf16 Newton-Schulz from inputs rounded otherwise: the tolerance of the torch.optim.Muon test
        torch.testing.assert_close(update, expected, atol=2e-3, rtol=2e-2)
        assert (update - expected).norm() < 0.02 * expected.norm()


@pytest.mark.parametrize("compile_muon", [False, True])
def test_a_trial_compiles_muon_only_when_its_train_section_asks(isolated_data, compile_muon):
    """`train.compile` compiles the blocks, `train.compile_muon` Muon's steps: a compiled Muon
    costs a new machine up to ~43 s per set of matrix shapes, so blocks alone must not bring it."""
    spec = TrainSpec(steps=2, batch_size=2, seq_len=32, warmup_steps=1, compile_muon=compile_muon)
    muon = Trainer(tiny_config(), spec).optimizers[0]
    assert isinstance(muon, Muon)
    assert muon.compiled is compile_muon
    assert (muon.orthogonalise is newton_schulz) is not compile_muon
