"""Paired initialisation: each module's starting weights drawn from (seed, the module's name).

A sweep compares each variant with its baseline paired by seed, and the seed already fixes the
batches (`k3lab.data.sampler`). With one global generator it does not fix the weights: the
modules a variant adds (an AttnRes projection, another layer type) take draws from the stream,
so every module built after them starts from other numbers than in the baseline. Drawn per
module instead, two trials of one seed start from the same weights in every module they
share (same name and shape) and differ only in what the variant changes. That is common
random numbers: each trial's weights are still draws from the same distributions, so a
paired difference estimates the same thing, with less of the seed's noise in it.

    init_paired(model, seed)   # after KimiK3(config), before it is moved, wrapped or compiled
"""

from __future__ import annotations

import hashlib
from types import SimpleNamespace

import torch
from torch import nn

from k3lab.model.model import KimiK3


def module_seed(seed: int, name: str) -> int:
    """A 63-bit seed for one module of one trial, the same on every machine and Python."""
    digest = hashlib.blake2b(f"{seed}/{name}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & (2**63 - 1)


@torch.no_grad()
def init_paired(model: KimiK3, seed: int) -> None:
    """Re-draw every module's own parameters, one module at a time, each from a generator
    seeded by `module_seed(seed, name)`, with the model's own rules; the global generator is
    left as it was."""
    with torch.random.fork_rng(devices=[]):
        for name, module in model.named_modules():
            torch.manual_seed(module_seed(seed, name))
            init_module(model, name, module)


def init_module(model: KimiK3, name: str, module: nn.Module) -> None:
    """The draws `KimiK3.__init__` makes for the parameters `module` holds itself: a
    convolution's own default, `_init_weights` (Linear, Embedding) and `_init_special`
    (AttnRes scorers, routers, experts, KDA decays)."""
    if isinstance(module, nn.Conv1d):  # the one layer whose own default init the model keeps
        module.reset_parameters()
    model._init_weights(module)
    prefix = f"{name}." if name else ""
    own = [(prefix + key, param) for key, param in module.named_parameters(recurse=False)]
    # _init_special reads `config`, `named_parameters()` and `modules()`: given this module's alone
    KimiK3._init_special(SimpleNamespace(config=model.config, named_parameters=lambda: iter(own),
                                         modules=lambda: iter([module])))
