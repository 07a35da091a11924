"""Muon with every same-shape matrix orthogonalised in one batched Newton-Schulz.

`torch.optim.Muon` is the numerical reference: per matrix W with gradient G,

    B = mu B + (1 - mu) G                 momentum (lerp form)
    U = G + mu (B - G)   (nesterov)        i.e. lerp(G, B, mu)
    O = NS5(U)                             quintic Newton-Schulz, bf16, on the wide orientation
    W = W (1 - lr wd) - lr * 0.2 sqrt(max(rows, cols)) * O     ("match_rms_adamw")

but it runs that as a Python loop, a few dozen kernels per matrix, and takes only 2-D tensors.
Here the parameters of a group are bucketed by matrix shape (the last two dims); a
bucket's momentum is one multi-tensor (`torch._foreach_*`) update, its matrices are
stacked into one (S, rows, cols) tensor and orthogonalised together with batched
matmuls, and the decay and update are two more multi-tensor ops. A 3-D parameter
(E, rows, cols), such as the stacked MoE experts, is E matrices: each slice gets exactly
the update it would get as a 2-D parameter of its own.

The state is torch.optim.Muon's (`momentum_buffer` per parameter), so state dicts look
the same. The learning rate is read from the param group each step and never enters a
compiled function as a number: schedules cost no recompilation. It may be a device scalar, as
in a training step captured as a CUDA graph: then nothing in the step waits on the host.

A bucket's step is three functions: `stacked_updates` (momentum, Nesterov, the matrices stacked
in bf16), `newton_schulz` and `apply_update` (decay and update). Eagerly they are multi-tensor
ops, a concatenation and batched matmuls; `compile=True` compiles each once per bucket shape,
so Inductor fuses the elementwise passes: the momentum, the Nesterov lerp, the stacking and the
bf16 cast become one pass over the gradients and buffers, the decay and the update one pass over
the weights (with the learning rate as a device scalar, so a new rate is no new graph). The
compilation costs a machine time the first time it meets a model's bucket shapes, for a small
part of a step (the figures: docs/journal/kernel-headroom.md), so trials compile Muon only with
`train.compile_muon`.

On CUDA the buckets run on `streams` side streams, round robin. Each bucket is a chain of
short kernels (most of them the Newton-Schulz matmuls) that depend only on each other,
so the chains of different buckets overlap on the GPU instead of queueing one after the
other. The side streams start after the current stream's work and the current stream waits
for them at the end, so the step is ordered with the rest of training as before, and the
same kernels compute the same numbers. This also holds inside a captured CUDA graph: the
side streams join the capture (a fork and a join in the graph).
"""

from __future__ import annotations

import contextlib
import math

import torch

from k3lab.compiling import raise_recompile_limit

NS_COEFFICIENTS = (3.4445, -4.7750, 2.0315)  # torch.optim.Muon's quintic coefficients


def newton_schulz(G: torch.Tensor, coefficients=NS_COEFFICIENTS, steps: int = 5, eps: float = 1e-7) -> torch.Tensor:
    """Approximately orthogonalise each matrix of G (S, rows, cols) -> bf16 (S, rows, cols).

    The same iteration as torch.optim.Muon's, batched: each slice is scaled by its own
    Frobenius norm and iterated on its wide orientation (rows <= cols).
    """
    a, b, c = coefficients
    X = G.bfloat16()
    tall = G.size(-2) > G.size(-1)
    if tall:
        X = X.mT
    X = X / X.norm(dim=(-2, -1), keepdim=True).clamp(min=eps)
    for _ in range(steps):
        A = X @ X.mT  # (S, r, r)
        B = torch.baddbmm(A, A, A, beta=b, alpha=c)
        X = torch.baddbmm(X, B, X, beta=a)
    return X.mT if tall else X


def adjusted_lr(lr: float, adjust_lr_fn: str | None, rows: int, cols: int) -> float:
    """torch.optim.Muon's learning-rate adjustment for one (rows, cols) matrix."""
    if adjust_lr_fn == "match_rms_adamw":
        return lr * 0.2 * math.sqrt(max(rows, cols))
    if adjust_lr_fn in (None, "original"):
        return lr * math.sqrt(max(1.0, rows / cols))
    return lr


class Muon(torch.optim.Optimizer):
    """Muon over 2-D matrices and 3-D stacks of matrices, batched by shape (module docstring)."""

    def __init__(self, params, lr: float = 1e-3, weight_decay: float = 0.1, momentum: float = 0.95,
                 nesterov: bool = True, ns_coefficients=NS_COEFFICIENTS, ns_steps: int = 5, eps: float = 1e-7,
                 adjust_lr_fn: str | None = "match_rms_adamw", compile: bool = False, streams: int = 4):
        if lr < 0 or momentum < 0 or weight_decay < 0:
            raise ValueError(f"Muon: lr, momentum and weight_decay must be >= 0, got {lr}, {momentum}, {weight_decay}")
        if streams < 0:
            raise ValueError(f"Muon: streams must be >= 0 (0: the current stream only), got {streams}")
        if adjust_lr_fn not in (None, "original", "match_rms_adamw"):
            raise ValueError(f"Muon: adjust_lr_fn must be 'original' or 'match_rms_adamw', got {adjust_lr_fn!r}")
        defaults = dict(lr=lr, weight_decay=weight_decay, momentum=momentum, nesterov=nesterov,
                        ns_coefficients=tuple(ns_coefficients), ns_steps=ns_steps, eps=eps, adjust_lr_fn=adjust_lr_fn)
        super().__init__(params, defaults)
        for group in self.param_groups:
            for p in group["params"]:
                if p.ndim not in (2, 3):
                    raise ValueError(f"Muon takes matrices (2-D) and stacks of matrices (3-D), got shape {tuple(p.shape)}")
        self.streams = streams
        self.side_streams: dict[torch.device, list[torch.cuda.Stream]] = {}
        self.compiled = compile
        self.stack, self.orthogonalise, self.apply = stacked_updates, newton_schulz, apply_update
        if compile:
            # combo kernels (Triton only; ignored on CPU): Inductor puts the per-matrix kernels of a bucket's
            # lists side by side in one kernel (without them, a kernel per matrix: docs/journal/kernel-headroom.md)
            lists = dict(dynamic=False, fullgraph=True, options={"combo_kernels": True})
            self.stack = torch.compile(stacked_updates, **lists)
            self.orthogonalise = torch.compile(newton_schulz, dynamic=False, fullgraph=True)
            self.apply = torch.compile(apply_update, **lists)
            raise_recompile_limit(64)

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        buckets = [(params, group) for group in self.param_groups
                   for params in shape_buckets(p for p in group["params"] if p.grad is not None).values()]
        if not buckets:
            return loss
        streams = self.streams_for(buckets[0][0][0].device)
        current = torch.cuda.current_stream() if streams else None
        for stream in streams:
            stream.wait_stream(current)  # gradients and weights are ready
        for i, (params, group) in enumerate(buckets):
            # a bucket's tensors live and die on its stream
            with torch.cuda.stream(streams[i % len(streams)]) if streams else contextlib.nullcontext():
                self.update_bucket(params, group)
        for stream in streams:
            current.wait_stream(stream)
        return loss

    def streams_for(self, device: torch.device) -> list[torch.cuda.Stream]:
        """This optimizer's side streams on a CUDA device (made once, reused by every step and
        capture); none elsewhere or with streams=0."""
        if device.type != "cuda" or self.streams == 0:
            return []
        if device not in self.side_streams:
            self.side_streams[device] = [torch.cuda.Stream(device) for _ in range(self.streams)]
        return self.side_streams[device]

    def update_bucket(self, params: list[torch.Tensor], group: dict) -> None:
        """One Muon step for parameters whose matrices all have one (rows, cols) shape."""
        rows, cols = params[0].shape[-2:]
        grads = [p.grad for p in params]
        buffers = [self.momentum_buffer(p) for p in params]
        stacked = self.stack(grads, buffers, group["momentum"], group["nesterov"])  # (S, rows, cols) bf16
        ortho = self.orthogonalise(stacked, group["ns_coefficients"], group["ns_steps"], group["eps"])
        lr = group["lr"]  # a float, or a device scalar in a step captured as a CUDA graph (k3lab.runner.train.graphs)
        if self.compiled and not isinstance(lr, torch.Tensor):  # a number would be a constant of the graph
            lr = torch.full((), lr, device=ortho.device)  # a fill kernel: torch.tensor would copy and wait
        self.apply(params, ortho, lr, group["weight_decay"], group["adjust_lr_fn"])

    def momentum_buffer(self, p: torch.Tensor) -> torch.Tensor:
        state = self.state[p]
        if "momentum_buffer" not in state:
            state["momentum_buffer"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        return state["momentum_buffer"]


def stacked_updates(grads: list[torch.Tensor], buffers: list[torch.Tensor], momentum: float,
                    nesterov: bool) -> torch.Tensor:
    """Momentum into `buffers` (in place), then the update of each matrix, stacked in bf16:
    (S, rows, cols) for matrices (rows, cols) and stacks (E, rows, cols) of one shape."""
    rows, cols = grads[0].shape[-2:]
    torch._foreach_lerp_(buffers, grads, 1 - momentum)
    updates = torch._foreach_lerp(grads, buffers, momentum) if nesterov else buffers
    return torch.cat([u.reshape(-1, rows, cols) for u in updates]).bfloat16()


def apply_update(params: list[torch.Tensor], ortho: torch.Tensor, lr, weight_decay: float,
                 adjust_lr_fn: str | None) -> None:
    """W = W (1 - lr wd) - adjusted lr * O for each parameter and its slices of ortho (S, rows, cols);
    lr a number or a device scalar (foreach's alpha takes only numbers, so then O is scaled first)."""
    rows, cols = ortho.shape[-2:]
    ortho = ortho.to(params[0].dtype)
    step = -adjusted_lr(lr, adjust_lr_fn, rows, cols)
    if isinstance(lr, torch.Tensor):
        ortho, step = ortho.mul_(step), 1
    if weight_decay:
        torch._foreach_mul_(params, 1 - lr * weight_decay)
    ortho = ortho.split([p.numel() // (rows * cols) for p in params])
    torch._foreach_add_(params, [o.view_as(p) for o, p in zip(ortho, params)], alpha=step)


def shape_buckets(params) -> dict[tuple, list[torch.Tensor]]:
    """Parameters keyed by (matrix shape, dtype, device), in their original order."""
    buckets: dict[tuple, list[torch.Tensor]] = {}
    for p in params:
        buckets.setdefault((tuple(p.shape[-2:]), p.dtype, p.device), []).append(p)
    return buckets

