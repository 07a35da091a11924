"""Paired initialisation (k3lab.runner.train.init): a seed's trials start alike wherever they share a module."""

import pytest
import torch

from k3lab.errors import FieldError
from k3lab.model.model import KimiK3
from k3lab.registry import TrainSpec, load_preset
from k3lab.runner.train.init import init_paired, module_seed


def built(config, seed, paired=True):
    torch.manual_seed(seed)
    model = KimiK3(config)
    if paired:
        init_paired(model, seed)
    return {name: param.detach() for name, param in model.named_parameters()}


def baseline_and_attnres():
    base = load_preset("tiny").replace(num_layers=4, use_attn_res=False)
    return base, base.replace(use_attn_res=True, attn_res_block_size=1)


def shared(a, b):
    return [name for name in a if name in b and a[name].shape == b[name].shape]


def test_paired_init_gives_a_seeds_trials_the_same_weights_in_every_module_they_share():
    base, variant = baseline_and_attnres()
    a, b = built(base, 3), built(variant, 3)
    names = shared(a, b)
    assert len(names) > 20 and len(b) > len(names)  # the variant adds AttnRes parameters
    assert [n for n in names if not torch.equal(a[n], b[n])] == []


def test_sequential_init_gives_the_shared_modules_other_weights_once_a_variant_adds_one():
    base, variant = baseline_and_attnres()
    a, b = built(base, 3, paired=False), built(variant, 3, paired=False)
    assert [n for n in shared(a, b) if not torch.equal(a[n], b[n])]  # what paired init removes


def test_paired_init_draws_each_parameter_as_the_model_itself_does():
    """Same distributions as the model's own init: constants stay the same constants, random
    tensors keep their spread (a lost rule, e.g. a router's Kaiming draw, changes it)."""
    config = load_preset("tiny")
    for seed in (0, 1):
        paired, own = built(config, seed), built(config, seed, paired=False)
        for name, value in own.items():
            if value.numel() < 2 or bool((value == value.flatten()[0]).all()):
                assert torch.equal(paired[name], value), name  # ones, zeros: untouched
                continue
            assert not torch.equal(paired[name], value), name  # redrawn
            if value.numel() >= 256:
                assert paired[name].std() == pytest.approx(value.std().item(), rel=0.15), name
                assert paired[name].abs().max() <= value.abs().max() * 1.5 + 1e-6, name


def test_paired_init_differs_between_seeds_and_leaves_the_global_generator_as_it_was():
    config = load_preset("tiny")
    torch.manual_seed(5)
    model = KimiK3(config)
    state = torch.get_rng_state()
    init_paired(model, 5)
    assert torch.equal(torch.get_rng_state(), state)
    a, b = built(config, 0), built(config, 1)
    assert not torch.equal(a["embed_tokens.weight"], b["embed_tokens.weight"])
    assert module_seed(0, "layers.0") != module_seed(1, "layers.0") != module_seed(0, "layers.1")


def test_a_train_section_names_its_init_or_is_told_the_choices():
    assert TrainSpec().init == "paired"
    assert TrainSpec(init="sequential").init == "sequential"
    with pytest.raises(FieldError, match="init"):
        TrainSpec(init="per-layer")
