"""bench/kernel_sources.py: GPU kernels traced to the op and the function of k3lab that launched them.

A CPU profile has no GPU kernels, so the tests profile k3lab's own SiTU-GLU forward and backward
on the CPU (real events, real Python frames, real autograd nodes) and hang a named kernel on the
ops a GPU would have launched one from, as torch.profiler does with `FunctionEvent.append_kernel`.
"""

from __future__ import annotations

import inspect

import pytest
import torch
from conftest import bench_script
from torch.profiler import ProfilerActivity, profile

from k3lab.model import ffn

sources = bench_script("kernel_sources")
SITU_GLU = f"k3lab/model/ffn.py({inspect.getsourcelines(ffn.situ_glu)[1]}): situ_glu"  # as the profiler names it


@pytest.fixture(scope="module")
def situ_glu_events():
    gate = torch.randn(4, 8, requires_grad=True)
    up = torch.randn(4, 8, requires_grad=True)
    with profile(activities=[ProfilerActivity.CPU], with_stack=True) as prof:
        ffn.situ_glu(gate, up).sum().backward()
    events = prof.events()
    forward_muls = [e for e in events if e.name == "aten::mul" and sources.backward_node(e) is None]
    backward_muls = [e for e in events if e.name == "aten::mul" and sources.backward_node(e) is not None]
    assert forward_muls and backward_muls
    for event in forward_muls + backward_muls:
        event.append_kernel("void at::native::vectorized_elementwise_kernel<4, mul>", 0, 10)
    forward_muls[0].append_kernel("Memcpy DtoD (Device -> Device)", 0, 7)
    return events


def kind_of(name: str) -> str:
    return "copies" if name.startswith("Memcpy") else "eager" if "elementwise_kernel" in name else "other"


def test_a_forward_kernel_is_placed_at_the_function_of_k3lab_that_ran_its_op(situ_glu_events):
    found = sources.launch_sources(situ_glu_events, {"copies"}, kind_of)
    assert found == [("copies", 7.0, 1, "aten::mul", SITU_GLU)]


def test_a_backward_kernel_is_placed_at_the_forward_op_that_recorded_its_node(situ_glu_events):
    found = sources.launch_sources(situ_glu_events, {"eager"}, kind_of)
    backward = [row for row in found if row[4].startswith("backward of ")]
    forward = [row for row in found if not row[4].startswith("backward of ")]
    assert backward and forward
    assert {row[3] for row in backward} == {"MulBackward0"}
    assert {row[3] for row in forward} == {"aten::mul"}
    assert {row[4] for row in backward} == {f"backward of {SITU_GLU}"}
    assert {row[4] for row in forward} == {SITU_GLU}
    assert sum(row[1] for row in found) == 10 * sum(row[2] for row in found)  # each kernel counted once
    assert [row[1] for row in found] == sorted((row[1] for row in found), reverse=True)


class StackedOp:
    """An op as a profile without Python function events gives it: its stack on the event itself."""

    def __init__(self, name, stack, parent=None):
        self.name, self.stack, self.cpu_parent = name, stack, parent


def test_without_python_function_events_the_ops_own_stack_names_the_place():
    stack = ["torch/nn/functional.py(2100): silu", "k3lab/model/ffn.py(40): situ_glu", "k3lab/model/ffn.py(80): forward"]
    assert sources.source_frame(StackedOp("aten::mul", stack)) == "k3lab/model/ffn.py(40): situ_glu"
    assert sources.source_frame(StackedOp("aten::mul", None, StackedOp("aten::silu", stack))) == \
        "k3lab/model/ffn.py(40): situ_glu"  # an inner op without a stack: its enclosing op's
    assert sources.source_frame(StackedOp("aten::mul", stack[:1])) == stack[0]  # none of ours: the innermost
    assert sources.source_frame(StackedOp("aten::mul", [])) == sources.NO_STACK


def test_kinds_not_asked_for_are_left_out(situ_glu_events):
    assert sources.launch_sources(situ_glu_events, {"other"}, kind_of) == []


def test_bench_trial_where_names_kinds_by_their_first_word():
    bench_trial = bench_script("bench_trial")
    assert bench_trial.traced_kinds("eager, copies") == {"eager elementwise", "copies and memsets"}
    assert bench_trial.traced_kinds("") == set()
    with pytest.raises(SystemExit, match="--where 'memcpy': not a kind of kernel"):
        bench_trial.traced_kinds("memcpy")

