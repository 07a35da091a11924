"""Cross-entropy of a linear head, chunk by chunk over tokens, without the full logits.

`linear_cross_entropy(x, W, t)` equals `F.cross_entropy((x @ W.T).float(), t)` (mean over
targets != ignore_index). The (N, V) logits of a large vocabulary are never held at once:
each chunk of tokens forms its logits, its loss and -- in the same pass -- its gradients
(softmax - onehot) @ W and (softmax - onehot)^T @ x, so backward only scales the stored
dx (N, M) and dW (V, M, accumulated in fp32) and nothing is recomputed. Under autocast the
matmuls run in the autocast dtype, like the plain head; softmax and the loss are fp32.
Pure PyTorch, any device.
"""

from __future__ import annotations

import torch

LOGITS_PER_CHUNK = 1 << 26  # elements of one chunk's (tokens x V) logits: 256 MiB in fp32


def linear_cross_entropy(x: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                         chunk_size: int | None = None, ignore_index: int = -100) -> torch.Tensor:
    """x (N, M), weight (V, M), targets (N,) -> the mean cross-entropy, a scalar in fp32."""
    if chunk_size is None:
        chunk_size = max(1, LOGITS_PER_CHUNK // weight.shape[0])
    need_grad = torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad)
    return LinearCrossEntropy.apply(x, weight, targets, chunk_size, ignore_index, need_grad)


class LinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, targets, chunk_size, ignore_index, need_grad):
        valid = targets != ignore_index  # (N,)
        count = valid.sum().clamp(min=1).float()  # stays on the device: no host sync
        total = torch.zeros((), dtype=torch.float32, device=x.device)
        dx = torch.empty_like(x) if need_grad else None
        dw = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if need_grad else None
        grad_dtype = matmul_dtype(x)
        for start in range(0, x.shape[0], chunk_size):
            rows = slice(start, start + chunk_size)
            x_c, t_c, v_c = x[rows], targets[rows].clamp(min=0), valid[rows]
            logits = (x_c @ weight.T).float()  # (C, V)
            lse = logits.logsumexp(dim=-1)  # (C,)
            target_logit = logits.gather(1, t_c.unsqueeze(1)).squeeze(1)
            total = total + ((lse - target_logit) * v_c).sum()
            if need_grad:  # d(sum of losses)/d logits = softmax - onehot, zero on ignored rows
                grad = logits.sub_(lse.unsqueeze(1)).exp_()
                grad.scatter_add_(1, t_c.unsqueeze(1), -torch.ones_like(grad[:, :1]))
                grad = (grad * v_c.unsqueeze(1)).to(grad_dtype)
                dx[rows] = grad @ weight
                dw += grad.T @ x_c
        ctx.save_for_backward(dx, dw, count)
        ctx.weight_dtype = weight.dtype
        return total / count

    @staticmethod
    def backward(ctx, grad_loss):
        dx, dw, count = ctx.saved_tensors
        scale = grad_loss / count
        grad_x = (dx * scale).to(dx.dtype) if ctx.needs_input_grad[0] else None
        grad_w = (dw * scale).to(ctx.weight_dtype) if ctx.needs_input_grad[1] else None
        return grad_x, grad_w, None, None, None, None


def matmul_dtype(x: torch.Tensor) -> torch.dtype:
    """The dtype a matmul with x runs in here: the autocast dtype if autocast is on."""
    device = x.device.type
    return torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else x.dtype
