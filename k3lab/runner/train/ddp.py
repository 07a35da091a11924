"""How a trial's model is wrapped for data parallelism (one process per GPU, NCCL or gloo).

    forward = wrap_ddp(model, device, DDPOptions())

`bench/bench_ddp.py` measures these defaults against one GPU, against the settings the trainer
used before (an unused-parameter search every step, no gradient views, PyTorch's default buckets)
and against a static graph; the bucket size here is the one that scaled best there
(docs/benchmarks.md, "DDP"). Every parameter
gets a gradient in every step -- the MoE
experts are stacked (E, out, in) tensors, and an expert no token chose still gets a (zero)
slice of the stack's gradient -- so DDP need not search the autograd graph for unused
parameters, and the set of gradients is the same each step (a static graph).
"""

from __future__ import annotations

import attrs
import torch


@attrs.frozen
class DDPOptions:
    """`torch.nn.parallel.DistributedDataParallel` settings that change its speed, not its result."""

    bucket_cap_mb: float = 100.0  # gradients are all-reduced in buckets of this size, overlapping backward
    gradient_as_bucket_view: bool = True  # .grad are views into the buckets: no copy, less memory
    static_graph: bool = False  # the same parameters get gradients every step: DDP may cache its plan
    find_unused_parameters: bool = False  # walk the graph each step for parameters without a gradient

    def describe(self) -> str:
        """e.g. 'bucket 100 MB, grad views, static graph'."""
        parts = [f"bucket {self.bucket_cap_mb:g} MB"]
        parts += ["grad views"] if self.gradient_as_bucket_view else []
        parts += ["static graph"] if self.static_graph else []
        parts += ["find unused"] if self.find_unused_parameters else []
        return ", ".join(parts)


def wrap_ddp(model: torch.nn.Module, device: torch.device, options: DDPOptions) -> torch.nn.Module:
    """The model wrapped in DDP (the process group is set up by the launcher). MoE buffers stay
    in step through the trainer's all-reduces, not DDP's broadcasts."""
    device_ids = [device] if device.type == "cuda" else None
    return torch.nn.parallel.DistributedDataParallel(
        model, device_ids=device_ids, broadcast_buffers=False, bucket_cap_mb=options.bucket_cap_mb,
        gradient_as_bucket_view=options.gradient_as_bucket_view, static_graph=options.static_graph,
        find_unused_parameters=options.find_unused_parameters)
