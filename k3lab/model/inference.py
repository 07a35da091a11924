"""Sampling from a KimiK3 model by recomputing the whole prefix each step (no KV cache)."""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F

from k3lab.model.model import KimiK3


def pad_multiple(model: KimiK3) -> int:
    """Chunkwise KDA needs T % chunk_size == 0; other layers take any length."""
    return model.config.seq_len_multiple


@torch.no_grad()
def generate(model: KimiK3, idx: torch.Tensor, max_new_tokens: int, temperature: float = 1.0,
             top_k: int | None = None) -> torch.Tensor:
    """Append `max_new_tokens` sampled tokens to idx (B, T0); returns (B, T0 + max_new_tokens).

    The context is cropped to the last max_seq_len tokens and right-padded to the KDA
    chunk size: exact, because the model is causal and we read the logits at the last
    real position. temperature 0 means greedy decoding.
    """
    if idx.ndim != 2 or idx.shape[1] == 0:
        raise ValueError("generate: idx must have shape (B, T) with T >= 1")
    was_training = model.training
    model.eval()
    with eager_if_compiled(model):
        idx = sample_tokens(model, idx, max_new_tokens, temperature, top_k)
    model.train(was_training)
    return idx


def eager_if_compiled(model: KimiK3):
    """Compiled blocks run eagerly here: compiled no-grad forwards of the fused model gave wrong
    losses on a GPU (see `Trainer.evaluate`)."""
    if any(getattr(layer, "_compiled_call_impl", None) is not None for layer in model.layers):
        return torch.compiler.set_stance("force_eager")
    return contextlib.nullcontext()


def sample_tokens(model: KimiK3, idx: torch.Tensor, max_new_tokens: int, temperature: float,
                  top_k: int | None) -> torch.Tensor:
    multiple, max_len = pad_multiple(model), model.config.max_seq_len
    max_len -= max_len % multiple  # the longest context that is still a multiple of the chunk size
    for _ in range(max_new_tokens):
        context = idx[:, -max_len:]
        T = context.shape[1]
        padded = F.pad(context, (0, (-T) % multiple))
        logits, _ = model(padded)
        logits = logits[:, T - 1, :].float()
        if temperature == 0:
            next_token = logits.argmax(dim=-1, keepdim=True)
        else:
            logits = logits / temperature
            if top_k is not None:
                kth = torch.topk(logits, min(top_k, logits.shape[-1]), dim=-1).values[:, -1:]
                logits = logits.masked_fill(logits < kth, float("-inf"))
            next_token = torch.multinomial(F.softmax(logits, dim=-1), num_samples=1)
        idx = torch.cat([idx, next_token], dim=1)
    return idx
