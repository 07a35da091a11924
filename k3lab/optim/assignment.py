"""Optimizer assignment: Muon for hidden matrices, AdamW for everything else.

Muon orthogonalises each update, which only makes sense for weight matrices inside
the network: 2-D Linear weights and the MoE experts' stacked (E, out, in) weights,
one matrix per expert. Embeddings and the head (tied to them or not), norm gains, biases,
the KDA decay scalars, AttnRes scorer vectors and the short convolutions go to AdamW.
The tied embedding/head weight appears once.
"""

from __future__ import annotations

import torch
from torch import nn

from k3lab.model.moe import RoutedExperts
from k3lab.optim.muon import Muon


def split_parameters(model: nn.Module) -> tuple[list[tuple[str, nn.Parameter]], list[tuple[str, nn.Parameter]]]:
    """(muon, adamw) lists of (name, parameter); every trainable parameter in exactly one."""
    embedding_ids = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
    if getattr(model, "lm_head", None) is not None:  # an untied head is no hidden matrix either
        embedding_ids.add(id(model.lm_head.weight))
    expert_ids = {id(p) for m in model.modules() if isinstance(m, RoutedExperts) for p in m.parameters()}
    muon, adamw = [], []
    for name, param in model.named_parameters():  # named_parameters yields a shared tensor once
        if not param.requires_grad:
            continue
        is_matrix = param.ndim == 2 and id(param) not in embedding_ids and not name.endswith("res_proj.weight")
        is_hidden_matrix = (is_matrix or id(param) in expert_ids) and min(param.shape[-2:]) > 1
        (muon if is_hidden_matrix else adamw).append((name, param))
    return muon, adamw


def build_optimizers(model: nn.Module, lr: float = 3e-3, muon_lr: float | None = None, weight_decay: float = 0.1,
                     betas: tuple[float, float] = (0.9, 0.95), fused: bool | None = None,
                     capturable: bool = False, compile: bool = False) -> list[torch.optim.Optimizer]:
    """[Muon, AdamW] (Muon omitted when the model has no hidden matrices).

    Muon (k3lab's batched one, `k3lab.optim.muon`) uses `adjust_lr_fn="match_rms_adamw"`
    so its update RMS matches AdamW's, which lets one learning-rate schedule drive both;
    muon_lr defaults to lr. `capturable`: AdamW keeps its step counts on the device, so that
    both steps can be captured in a CUDA graph (k3lab's Muon always can). `compile`: Muon's
    per-bucket steps torch.compile'd (`k3lab.optim.muon`), as trials with `train.compile_muon` run it.
    """
    muon_params, adamw_params = split_parameters(model)
    decay = [p for n, p in adamw_params if p.ndim >= 2]
    no_decay = [p for n, p in adamw_params if p.ndim < 2]
    if fused is None:
        fused = all(p.is_cuda for _, p in adamw_params)
    optimizers = []
    if muon_params:
        optimizers.append(Muon([p for _, p in muon_params], lr=lr if muon_lr is None else muon_lr,
                               weight_decay=weight_decay, adjust_lr_fn="match_rms_adamw", compile=compile))
    optimizers.append(torch.optim.AdamW(
        [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=lr, betas=betas, fused=fused, capturable=capturable,
    ))
    return optimizers
