"""A whole training step as one CUDA graph.

A small trial launches thousands of kernels per step (FLA's Triton kernels, the MoE
dispatch, norms, the AttnRes stream, then clipping and two optimizers), and launching
them from Python costs more than running them: at 16 x 512 tokens the GPU waits on the
host most of the step. Captured once and replayed, the step is one launch.

    graphed = GraphedStep(step_fn, model.parameters(), optimizers)  # step_fn(x, y) -> {name: tensor}
    values = graphed(x, y)        # first call captures, every call replays

What capture needs, and how the trainer provides it:
- static shapes and no host synchronisation inside the step (the grouped MoE dispatch, the
  chunked loss, foreach clipping, fused AdamW with `capturable=True` and k3lab's Muon have none);
- kernels already compiled and autotuned, optimizer state already allocated: the trainer
  captures only after eager steps;
- gradients allocated by the captured backward (every `.grad` is None at capture), so each
  replay overwrites them: the caller must not set them to None afterwards;
- inputs copied into the graph's own input tensors before each replay;
- learning rates that change every step: while a step runs (`device_learning_rates`), each
  optimizer param group's `lr` is a device scalar filled with the group's float `lr`, which
  the schedulers keep setting as usual; the captured kernels read it from there. The trainer's
  eager steps run with the same scalars, so a step computes the same before and after capture;
- optimizer state that stays where it was captured: reset it in place, never replace it.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Callable, Iterator

import torch


def cuda_graph_blocker(device: torch.device, grad_accum: int, distributed: bool) -> str | None:
    """Why a trial cannot capture its step, or None when it can."""
    if device.type != "cuda":
        return "CUDA graphs need a CUDA device"
    if grad_accum > 1:
        return "gradient accumulation (grad_accum > 1) adds into gradients a captured backward overwrites"
    if distributed:
        return "DDP's gradient all-reduce hooks are not captured"
    return None


class GraphedStep:
    """`step_fn(x, y)` (forward, backward and whatever follows: clipping, `optimizers`' steps),
    captured on the first call and replayed after."""

    def __init__(self, step_fn: Callable[[torch.Tensor, torch.Tensor], dict[str, torch.Tensor]], parameters,
                 optimizers=()):
        self.step_fn = step_fn
        self.parameters = list(parameters)
        self.optimizers = list(optimizers)
        self.graph: torch.cuda.CUDAGraph | None = None
        self.lrs: list[torch.Tensor] | None = None  # one device scalar per param group

    def __call__(self, x: torch.Tensor, y: torch.Tensor) -> dict[str, torch.Tensor]:
        """step_fn's values for (x, y), with every parameter's .grad set; the returned tensors are
        overwritten by the next call (clone them to keep them)."""
        with self.device_learning_rates():
            if self.graph is None:
                self.capture(x, y)
            self.x.copy_(x)
            self.y.copy_(y)
            self.graph.replay()
        return self.values

    def param_groups(self) -> list[dict]:
        return [group for optimizer in self.optimizers for group in optimizer.param_groups]

    @contextmanager
    def device_learning_rates(self) -> Iterator[None]:
        """Within: every param group's `lr` is this graph's device scalar (fp32, what fused AdamW
        reads), filled with the group's float `lr`; after: the float again."""
        groups = self.param_groups()
        rates = [group["lr"] for group in groups]
        if self.lrs is None:
            self.lrs = [torch.zeros((), device=self.parameters[0].device) for _ in groups]
        for group, lr, rate in zip(groups, self.lrs, rates):
            lr.fill_(rate)
            group["lr"] = lr
        try:
            yield
        finally:
            for group, rate in zip(groups, rates):
                group["lr"] = rate

    def capture(self, x: torch.Tensor, y: torch.Tensor) -> None:
        for p in self.parameters:
            p.grad = None  # the captured backward allocates them in the graph's memory pool
        self.x, self.y = x.clone(), y.clone()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            self.values = self.step_fn(self.x, self.y)
        self.graph = graph
