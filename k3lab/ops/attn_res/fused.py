"""The GPU path of Attention Residuals: the mixture and the pre-norm after it in one kernel each way.

Both ways k3lab's Triton kernels (`kernel.py`): the forward reads each source once, the
backward sums every stored endpoint's gradient in one buffer. An endpoint is read by every mixture after it (up to
2 x layers of them), and autograd would give each reader's gradient its own buffer and add them
one eager add at a time (45 adds a step in a `small` trial: its three endpoints have 24, 16
and 8 readers). Here an endpoint is made by `as_endpoint`, whose autograd node
holds the sum (`Endpoint.summed`); each reader's backward adds its share there and hands
autograd nothing for it; the endpoint's own backward returns the sum. The scorers' and
norms' weight gradients are summed over rows in the backward kernel, a block of rows a program,
and the (2, G, D) partial sums finished by one torch.sum (`column_sums`); FLA's reduction kernel
walks all N rows on D / BD programs.

On CPU tensors the same autograd functions run the plain-PyTorch twins (`naive.reference_forward`,
`naive.dv_reference`), so CPU tests check the bookkeeping; the GPU tests hold the kernels to the twins
and to FLA's forward.

Imported only when the fused path runs (`KimiK3.no_endpoints`): its
`torch.compiler.disable` imports torch._dynamo, and with it Triton on CUDA builds of torch.
"""

from __future__ import annotations

import torch
from torch import nn

from k3lab.ops.attn_res.naive import dv_reference, reference_forward


@torch.compiler.disable
def fused_attn_res(candidates, norm: nn.RMSNorm, proj: nn.Linear, out_norm: nn.RMSNorm):
    """out_norm(apply_attn_res(...)); returns (h, mean weights (K,)).

    candidates: K tensors (B, T, M) -- the stored endpoints (from `as_endpoint`) then the live
    prefix. They are brought to the first candidate's dtype (the residual stream's), as FLA
    needs one dtype; h (B, T, M) comes back in that dtype, already normalised by out_norm.
    """
    dtype = candidates[0].dtype
    sources = [aligned(c.to(dtype)) for c in candidates]
    h, weights = AttnResMixture.apply(proj.weight.view(-1), norm.weight, out_norm.weight, norm.eps, *sources)
    return h, weights


@torch.compiler.disable
def as_endpoint(x: torch.Tensor) -> torch.Tensor:
    """x as a stored endpoint: the mixtures that read it sum its gradient in one buffer."""
    return Endpoint.apply(x) if torch.is_grad_enabled() and x.requires_grad else x


class Endpoint(torch.autograd.Function):
    """Identity whose node (`ctx`, which is also the output's grad_fn) keeps `summed`: the sum
    of the gradients its readers' backwards added in place. Readers give autograd nothing for
    it, so its backward gets no gradient (None) and returns the sum."""

    @staticmethod
    def forward(ctx, x):
        ctx.summed = None
        ctx.set_materialize_grads(False)
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        summed, ctx.summed = ctx.summed, None
        if grad is None:
            return summed
        return grad if summed is None else grad + summed


def endpoint_node(x: torch.Tensor) -> Endpoint | None:
    """The Endpoint node that made x, if it was made by `as_endpoint` (else None)."""
    node = x.grad_fn
    return node if node is not None and hasattr(node, "summed") else None


class AttnResMixture(torch.autograd.Function):
    """(q (D,), w (D,), ow (D,), eps, *sources K x (B, T, D)) -> (h (B, T, D), mean weights (K,))."""

    @staticmethod
    def forward(ctx, q, w, ow, eps, *sources):
        shape, D = sources[0].shape, sources[0].shape[-1]
        flat = [s.view(-1, D) for s in sources]
        forward = forward_kernel if flat[0].is_cuda else reference_forward
        o, rstd, logit, lse = forward(q, w, ow, flat, eps)
        ctx.save_for_backward(q, w, ow, rstd, logit, lse, *sources)
        ctx.eps = eps
        # stored endpoints only (the last source is the live prefix), as many as ACC has bits
        readers = [endpoint_node(s) for s in sources[:-1]] if len(sources) <= MAX_SOURCES else []
        ctx.nodes = readers + [None] * (len(sources) - len(readers))
        weights = (logit - lse).exp().mean(dim=1)  # (K,)
        ctx.mark_non_differentiable(weights)
        return o.view(shape), weights

    @staticmethod
    def backward(ctx, do, _):
        q, w, ow, rstd, logit, lse, *sources = ctx.saved_tensors
        D = do.shape[-1]
        targets, acc = [], 0
        for i, (source, node) in enumerate(zip(sources, ctx.nodes)):
            if node is not None and node.summed is not None:
                targets.append(node.summed)
                acc |= 1 << i
            else:
                targets.append(torch.empty_like(source))
                if node is not None:
                    node.summed = targets[-1]
        flat = lambda tensors: [t.view(-1, D) for t in tensors]  # noqa: E731
        backward = dv_kernel if do.is_cuda else dv_reference
        partials = backward(q, w, ow, flat(sources), rstd, logit, lse, do.contiguous().view(-1, D),
                            flat(targets), acc, ctx.eps)
        dq, dw, dow = column_sums(partials, q, w, ow)
        grads = [None if node is not None else target for node, target in zip(ctx.nodes, targets)]
        return (dq, dw, dow, None, *grads)


MAX_SOURCES = 31  # kernel.py's ACC bits, kept here so CPU runs never import Triton


def forward_kernel(*args):
    from k3lab.ops.attn_res.kernel import forward

    return forward(*args)


def dv_kernel(*args):
    from k3lab.ops.attn_res.kernel import dv_backward

    return dv_backward(*args)


def column_sums(partials: torch.Tensor, q: torch.Tensor, w: torch.Tensor, ow: torch.Tensor | None):
    """dq, dw, dow from the backward's (1 or 2, G, D) fp32 buffer of dqw and dow terms, summed
    over G in one reduction (partial sums over blocks of rows from the kernel, or per-row terms
    from the twin): the logit uses q * w, so dq = (sum dqw) * w and dw = (sum dqw) * q."""
    totals = partials.sum(dim=1)  # (1 or 2, D) fp32
    dq, dw = (totals[0] * w.float()).to(q.dtype), (totals[0] * q.float()).to(w.dtype)
    dow = totals[1].to(ow.dtype) if ow is not None else None
    return dq, dw, dow


def aligned(x: torch.Tensor) -> torch.Tensor:
    """x contiguous with a 16-byte aligned start, as FLA's attnres kernel asserts."""
    x = x.contiguous()
    return x if x.data_ptr() % 16 == 0 else x.clone()


# -- the model's AttnRes state on this path: the stored endpoints as a tuple of P (B, T, M) tensors ----

class EndpointTuple:
    """The completed block endpoints of a forward as a tuple of (B, T, M) tensors, so that no
    mixture re-concatenates them; `add` and `mix` as `naive.StackedEndpoints`, over the same
    candidates in the same order."""

    def __init__(self, tensors: tuple = ()):
        self.tensors = tensors  # P x (B, T, M), each made by `as_endpoint`

    def add(self, x: torch.Tensor) -> EndpointTuple:
        """These endpoints with x (B, T, M) stored after them, in the stream's dtype (the first endpoint's)."""
        endpoint = as_endpoint(x.to(self.tensors[0].dtype) if self.tensors else x)
        return EndpointTuple((*self.tensors, endpoint))

    def mix(self, prefix: torch.Tensor, norm, proj, out_norm):
        """out_norm(the mixture of [endpoints..., prefix]) (B, T, M) and the mean weights (K,), in one kernel."""
        return fused_attn_res((*self.tensors, prefix), norm, proj, out_norm)
