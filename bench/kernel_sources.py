"""Which code launches the GPU kernels of a kind: their time a step by the op that launched them
and the function of k3lab (or bench/) that ran that op.

A CUDA-graph replay shows its kernels but not the code that launched them. An eager step of the
same model launches the same kernels outside the compiled blocks from Python, so under
torch.profiler with Python stacks each kernel can be traced to the aten op that launched it
(`FunctionEvent.kernels`) and the innermost function of our code around that op (the profiler
names a Python function by its file and first line, not the line running). An op that the
autograd engine runs in the backward has no frame of ours around it; it is named by its backward
node (`autograd::engine::evaluate_function: MulBackward0`) and placed at the forward op that
recorded that node, matched by sequence number, as PyTorch's profiler links the two. Where the
profiler records no Python function events, the stack it keeps on each op is read instead; where
it has neither (some torch builds record neither, compiled or not), every place reads "(no Python frame)" and the op or node names it.

    bench/bench_trial.py --rows small@64x1024:graph:compile:bf16res --top 15 --where eager,copies
"""

from __future__ import annotations

import re

BACKWARD_NODE = "autograd::engine::evaluate_function: "
PYTHON_FRAME = re.compile(r"\.py\(\d+\): ")  # a Python function event: 'k3lab/model/moe.py(123): forward'
OUR_CODE = ("k3lab/", "bench/")  # frames worth naming; torch's own frames are where, not why
NO_STACK = "(no Python frame)"


def source_frame(event) -> str:
    """The innermost function of our code among the Python function events that enclose `event`,
    as 'k3lab/model/moe.py(123): forward' (its def line), or else in the stack the profiler keeps on
    the op (`FunctionEvent.stack`, innermost first, where a profile has no Python function events);
    else the innermost Python function; else NO_STACK."""
    frames, stack = [], []
    while event is not None:
        if PYTHON_FRAME.search(event.name):
            frames.append(event.name)
        stack = stack or list(getattr(event, "stack", None) or ())
        event = event.cpu_parent
    frames = frames or stack
    for frame in frames:
        for root in OUR_CODE:
            at = frame.find(root)
            if at >= 0 and (at == 0 or frame[at - 1] in "/\\"):
                return frame[at:]
    return frames[0] if frames else NO_STACK


def backward_node(event):
    """The autograd engine's node that ran `event` (itself or an enclosing event), or None for an
    op of the forward or of the optimizer."""
    while event is not None:
        if event.name.startswith(BACKWARD_NODE):
            return event
        event = event.cpu_parent
    return None


def launch_sources(events, kinds: set[str], kind_of) -> list[tuple[str, float, int, str, str]]:
    """(kind, microseconds, kernels, op, where) for every GPU kernel whose `kind_of(name)` is in
    `kinds`, summed by kind, launching op and place; most time first. `events`: the profiler's
    FunctionEvents (`prof.events()` of a profile with `with_stack=True`)."""
    recorded_by = {}  # sequence number -> the forward op that recorded that autograd node
    for event in events:
        if event.sequence_nr >= 0 and backward_node(event) is None:
            recorded_by.setdefault(event.sequence_nr, event)
    totals: dict[tuple[str, str, str], list] = {}
    for event in events:
        for kernel in event.kernels:
            kind = kind_of(kernel.name)
            if kind not in kinds:
                continue
            node = backward_node(event)
            if node is None:
                op, where = event.name, source_frame(event)
            else:
                op = node.name[len(BACKWARD_NODE):]
                forward = recorded_by.get(node.sequence_nr)
                where = "backward of " + (source_frame(forward) if forward is not None else NO_STACK)
            total = totals.setdefault((kind, op, where), [0.0, 0])
            total[0] += kernel.duration
            total[1] += 1
    return sorted(((kind, us, n, op, where) for (kind, op, where), (us, n) in totals.items()), key=lambda t: -t[1])


def profile_sources(step, kinds: set[str], kind_of) -> list[tuple[str, float, int, str, str]]:
    """`launch_sources` of one call of `step` (an eager training step) under torch.profiler."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], with_stack=True) as prof:
        step()
        torch.cuda.synchronize()
    return launch_sources(prof.events(), kinds, kind_of)
