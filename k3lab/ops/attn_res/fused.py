"""The GPU path of Attention Residuals: the endpoints in one preallocated buffer, and each mixture
with the pre-norm after it in one kernel each way.

`EndpointBuffer` is the model's AttnRes state on this path (`naive.StackedEndpoints` is the
reference's): one (S, B*T, M) buffer allocated at the start of a forward for its S block
endpoints, slot P written in place at the P-th block boundary (`add`), where the reference
concatenates every endpoint again at each boundary and each mixture. A mixture (`mix`) reads slots
0..P-1 and the live prefix as K = P+1 sources through k3lab's Triton kernels (`buffer_kernel.py`):
the candidates' RMSNorm, scorer, softmax, weighted sum and the sub-layer's pre-norm in one forward
kernel, all their gradients in one backward kernel, each reading every source once.

Gradients: an endpoint is read by every mixture after it (up to 2 x layers of them). Autograd
would give each reader's gradient its own buffer and add them one eager add at a time; here the
readers' backwards add slot l's gradient into one (S, B*T, M) gradient buffer (`SlotGrads`, zeros
until the first), and hand autograd nothing for it. A reader depends on the endpoints through a
token (`Store`'s output: an empty tensor chained from store to store), so each store's backward
runs after all its readers' and returns the slot's sum. The scorers' and norms' weight gradients
come back as (1 or 2, G, D) partial sums, finished by one torch.sum (`column_sums`).

On CPU tensors the same autograd functions run the plain-PyTorch twins (`naive.reference_forward`,
`naive.buffer_dv_reference`), so CPU tests check the bookkeeping; the kernels are held to the twins
through Triton's interpreter (tests/test_attn_res_kernel_interpreted.py) and on the GPU.

Imported only when the fused path runs (`KimiK3.uses_fused_attn_res`): its
`torch.compiler.disable` imports torch._dynamo, and with it Triton on CUDA builds of torch.

FLA API facts `fla_forward` relies on (checked against fla-core 0.6.0):
- `fla.ops.attnres.fused.fused_attnres_fwd(q (D,), residuals K x (N, D), res (residuals padded to
  a power of two >= 8), w, ow, eps, scale, checkpoint_level)` returns (o (N, D) in the sources'
  dtype, o_pre (None at checkpoint level 1), rstd (K, N), logit (K, N), lse (N,)), fp32 stats:
  softmax over sources of <RMSNorm(v_l), q>, sum of raw v_l, then the RMSNorm of weight `ow`
  (one eps for both norms). Sources must share a dtype and be 16-byte aligned.
"""

from __future__ import annotations

import torch
from torch import nn

from k3lab.ops.attn_res.naive import buffer_dv_reference, reference_forward

class SlotGrads:
    """The stored endpoints' gradients, one (S, N, M) buffer in the endpoints' dtype, each slot the
    sum over its readers' backwards; allocated (zeros) by the first backward, so a forward
    without one costs nothing."""

    def __init__(self):
        self.grads: torch.Tensor | None = None

    def buffer(self, values: torch.Tensor) -> torch.Tensor:
        if self.grads is None:
            self.grads = torch.zeros_like(values)
        return self.grads

    def take(self, slot: int) -> torch.Tensor | None:
        """Slot's summed gradient for its store's backward (None if no reader had a gradient)."""
        return None if self.grads is None else self.grads[slot]


class EndpointBuffer:
    """One forward's stored endpoints: `values` (S, B*T, M) preallocated, `count` of them written.
    `add` and `mix` are the block's two operations; `add` returns a new state on the same buffer, so
    a checkpointed layer recomputed in backward writes its slot again with the same values."""

    def __init__(self, values: torch.Tensor, count: int, token, grads: SlotGrads):
        self.values, self.count, self.token, self.grads = values, count, token, grads

    @classmethod
    def start(cls, x: torch.Tensor, capacity: int) -> EndpointBuffer:
        """Room for `capacity` endpoints of x (B, T, M), in x's dtype (the residual stream's)."""
        B, T, M = x.shape
        return cls(x.new_empty(capacity, B * T, M), 0, None, SlotGrads())

    def slots(self) -> list[torch.Tensor]:
        """The written endpoints, count x (N, M) views of the buffer."""
        return list(self.values[:self.count].unbind(0))

    @torch.compiler.disable
    def add(self, x: torch.Tensor) -> EndpointBuffer:
        """x (B, T, M) written in place into the next slot."""
        if self.count == len(self.values):
            raise IndexError(f"an endpoint past the {len(self.values)} this buffer was made for")
        token = Store.apply(x, self, self.token)
        return EndpointBuffer(self.values, self.count + 1, token, self.grads)

    @torch.compiler.disable
    def mix(self, prefix: torch.Tensor, norm: nn.RMSNorm, proj: nn.Linear, out_norm: nn.RMSNorm):
        """out_norm(the mixture of [endpoints..., prefix]) (B, T, M) in the stream's dtype, and the
        mean weights (K,), for logging."""
        prefix = aligned(prefix.to(self.values.dtype))
        return AttnResMixture.apply(proj.weight.view(-1), norm.weight, out_norm.weight, norm.eps, self,
                                    self.token, prefix)


class Store(torch.autograd.Function):
    """x (B, T, M) copied into its slot; returns the token readers depend on. Its backward returns
    the slot's gradient as its readers summed it (`SlotGrads`)."""

    @staticmethod
    def forward(ctx, x, endpoints: EndpointBuffer, _token):
        ctx.slot, ctx.grads, ctx.shape = endpoints.count, endpoints.grads, x.shape
        ctx.set_materialize_grads(False)
        endpoints.values[endpoints.count].copy_(x.reshape(endpoints.values.shape[1:]))
        return x.new_empty(0)

    @staticmethod
    def backward(ctx, _):
        grad = ctx.grads.take(ctx.slot)
        return None if grad is None else grad.view(ctx.shape), None, None


class AttnResMixture(torch.autograd.Function):
    """(q (D,), w (D,), ow (D,), eps, endpoints, token, prefix (B, T, D)) -> (h (B, T, D), mean weights (K,))."""

    @staticmethod
    def forward(ctx, q, w, ow, eps, endpoints: EndpointBuffer, _token, prefix):
        D = prefix.shape[-1]
        flat, count = prefix.view(-1, D), endpoints.count
        if prefix.is_cuda:
            o, rstd, logit, lse = buffer_forward(q, w, ow, endpoints.values, count, flat, eps)
        else:
            o, rstd, logit, lse = reference_forward(q, w, ow, [*endpoints.slots(), flat], eps)
        ctx.save_for_backward(q, w, ow, rstd, logit, lse, prefix)
        ctx.eps, ctx.endpoints, ctx.count = eps, endpoints, count
        weights = (logit - lse).exp().mean(dim=1)  # (K,)
        ctx.mark_non_differentiable(weights)
        return o.view(prefix.shape), weights

    @staticmethod
    def backward(ctx, do, _):
        q, w, ow, rstd, logit, lse, prefix = ctx.saved_tensors
        values, D = ctx.endpoints.values, do.shape[-1]
        grads, dprefix = ctx.endpoints.grads.buffer(values), torch.empty_like(prefix)
        flat = lambda t: t.contiguous().view(-1, D)  # noqa: E731
        if do.is_cuda:
            partials = buffer_backward(q, w, ow, values, ctx.count, flat(prefix), rstd, logit, lse, flat(do), grads,
                                       flat(dprefix), ctx.eps)
        else:
            partials = buffer_dv_reference(q, w, ow, values, ctx.count, flat(prefix), flat(do), grads, flat(dprefix),
                                           ctx.eps)
        dq, dw, dow = column_sums(partials, q, w, ow)
        return dq, dw, dow, None, None, None, dprefix


@torch.compiler.disable
def fused_attn_res(candidates, norm: nn.RMSNorm, proj: nn.Linear, out_norm: nn.RMSNorm):
    """out_norm(apply_attn_res(...)) over K candidates (B, T, M), the last the live prefix, the
    others stored first (the model stores them once each, at its block boundaries); returns
    (h, mean weights (K,)). Candidates are brought to the first one's dtype."""
    endpoints = EndpointBuffer.start(candidates[0], len(candidates) - 1)
    for c in candidates[:-1]:
        endpoints = endpoints.add(c)
    return endpoints.mix(candidates[-1], norm, proj, out_norm)


def mix_sources(q, sources, w, ow, eps: float):
    """`fused_attn_res` in the arguments of `naive.reference_attnres` (and FLA's `fused_attnres`):
    K sources (N, D), the weight vectors -> o (N, D)."""
    endpoints = EndpointBuffer.start(sources[0][None], len(sources) - 1)
    for s in sources[:-1]:
        endpoints = endpoints.add(s[None])
    return AttnResMixture.apply(q, w, ow, eps, endpoints, endpoints.token, aligned(sources[-1][None]))[0][0]


def fla_forward(q, w, ow, flat, eps):
    from fla.ops.attnres import fused as fla

    o, _, rstd, logit, lse = fla.fused_attnres_fwd(q=q, residuals=flat, res=fla._build_ptr_table(flat), w=w, ow=ow,
                                                   eps=eps, scale=1.0, checkpoint_level=1)
    return o, rstd, logit, lse


def buffer_forward(*args):
    from k3lab.ops.attn_res.buffer_kernel import forward

    return forward(*args)


def buffer_backward(*args):
    from k3lab.ops.attn_res.buffer_kernel import backward

    return backward(*args)


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
