"""Forward and backward of a training step as one CUDA graph.

A small trial launches thousands of kernels per step (FLA's Triton kernels, the MoE
dispatch, norms, the AttnRes stream), and launching them from Python costs more than
running them: at 16 x 512 tokens the GPU waits on the host most of the step. Captured
once and replayed, the whole forward+backward is one launch.

    graphed = GraphedForwardBackward(loss_fn)     # loss_fn(x, y) -> scalar loss
    loss = graphed(x, y)                         # first call captures, every call replays

What capture needs, and how the trainer provides it:
- static shapes and no host synchronisation inside the step (the grouped MoE dispatch and
  the chunked loss have none);
- kernels already compiled and autotuned: the trainer captures only after eager steps;
- gradients allocated by the captured backward (every `.grad` is None at capture), so each
  replay overwrites them: the caller must not set them to None afterwards;
- inputs copied into the graph's own input tensors before each replay.
The optimizer steps stay eager: their learning rates change every step.
"""

from __future__ import annotations

from typing import Callable

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


class GraphedForwardBackward:
    """`loss_fn(x, y)` and its backward, captured on the first call and replayed after."""

    def __init__(self, loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], parameters):
        self.loss_fn = loss_fn
        self.parameters = list(parameters)
        self.graph: torch.cuda.CUDAGraph | None = None

    def __call__(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """The loss of (x, y), with every parameter's .grad set; the returned tensor is
        overwritten by the next call (clone it to keep it)."""
        if self.graph is None:
            self.capture(x, y)
        self.x.copy_(x)
        self.y.copy_(y)
        self.graph.replay()
        return self.loss

    def capture(self, x: torch.Tensor, y: torch.Tensor) -> None:
        for p in self.parameters:
            p.grad = None  # the captured backward allocates them in the graph's memory pool
        self.x, self.y = x.clone(), y.clone()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            self.loss = self.loss_fn(self.x, self.y)
            self.loss.backward()
        self.graph = graph
