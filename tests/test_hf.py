"""k3lab against transformers' KimiLinearForCausalLM, and the Hugging Face export.

Kimi Linear and K3 differ in AttnRes, SiTU-GLU, the latent MoE, the KDA output gate (full
rank) and decay gate (bounded) and the MLA output gate. These tests set k3lab to Kimi
Linear's choices -- the `kimi_linear` fidelity: no AttnRes, SwiGLU, plain MoE, low-rank
gate without bias, unbounded decay, no MLA output gate -- and map the weights with
`k3lab.model.hf`. The K3-only parts keep their closed-form tests (test_kimi_k3.py,
test_layers.py, test_moe.py).

Tolerance, fp32 on CPU: both sides compute the same functions with different algorithms
(KDA: k3lab's chunks of 8 with a triangular solve against transformers' chunks of 64 with
forward substitution; the MoE sums its experts in another order), so they agree to fp32
rounding, not bitwise. Measured max abs differences over these configs and three seeds:
KDA sublayer <= 2.6e-7, MLA and dense FFN 0 (bitwise), MoE <= 3e-9, logits <= 1.8e-6
(logits of order 1). SUBLAYER_TOL and LOGITS_TOL leave ~20x headroom over that; a real
mapping mistake (a swapped or transposed weight, another eps, a wrong routing rule, a
missing shared expert) moves outputs by 1e-3 or more.
"""

import re

import pytest
import torch

from k3lab.cli import main
from k3lab.errors import UserError
from k3lab.model import hf
from k3lab.model.config import KimiK3Config, tiny_config
from k3lab.model.fidelity import fidelity_fields
from k3lab.model.model import KimiK3
from k3lab.model.moe import StableLatentMoE
from k3lab.runner.train.checkpoint import load_checkpoint
from k3lab.export.hugging_face import config_from_params
from k3lab.store.tracking import flatten

transformers = pytest.importorskip("transformers", minversion="5.23")
transformers.logging.set_verbosity_error()  # the "falling back to the PyTorch implementation" notes

SUBLAYER_TOL = 5e-6
LOGITS_TOL = 3e-5


def kimi_linear_config(**overrides):
    """tiny_config (KKMK, a dense layer then MoE top-2 of 4 with a shared expert) with Kimi Linear's choices."""
    return tiny_config(**fidelity_fields("kimi_linear", mla_qk_head_dim=16) | overrides)


@torch.no_grad()
def randomised(model):
    """Norm gains, decay parameters and the routing bias away from their inits, so a mix-up shows."""
    for name, param in model.named_parameters():
        if param.ndim == 1:
            param.add_(0.2 * torch.randn_like(param))
    for module in model.modules():
        for name in ("expert_bias", "e_score_correction_bias"):
            if hasattr(module, name):
                getattr(module, name).normal_(0, 0.05)
    return model.eval()


def paired_models(config):
    """(ours, theirs): a random k3lab model and a KimiLinearForCausalLM holding the same weights."""
    ours = randomised(KimiK3(config))
    theirs = transformers.KimiLinearForCausalLM(transformers.KimiLinearConfig(**hf.hf_config(config))).eval()
    theirs.load_state_dict(hf.to_hf_state_dict(ours.state_dict(), config), strict=True)
    return ours, theirs


def max_diff(a, b):
    return (a - b).abs().max().item()


@torch.no_grad()
def sublayer_diffs(ours, theirs, idx):
    """Run transformers' model, record each sublayer's input and output, run ours on the same
    input: {(kind, layer): max abs diff}, kind in kda, mla, dense, moe."""
    seen = {}

    def record(key):
        def hook(module, args, kwargs, output):
            x = args[0] if args else kwargs["hidden_states"]
            seen[key] = (x, output[0] if isinstance(output, tuple) else output)
        return hook

    for i, layer in enumerate(theirs.model.layers):
        layer.self_attn.register_forward_hook(record(("attn", i)), with_kwargs=True)
        layer.mlp.register_forward_hook(record(("ffn", i)), with_kwargs=True)
    theirs(idx)
    diffs = {}
    for (site, i), (x, y) in seen.items():
        module = getattr(ours.layers[i], site)
        kind = ours.config.layer_types[i] if site == "attn" else \
            "moe" if isinstance(module, StableLatentMoE) else "dense"
        diffs[(kind, i)] = max_diff(module(x), y)
    return diffs


# -- equivalence ---------------------------------------------------------------------------


def test_every_sublayer_matches_kimi_linear_on_the_same_input():
    ours, theirs = paired_models(kimi_linear_config())
    diffs = sublayer_diffs(ours, theirs, torch.randint(0, 320, (2, 32)))
    assert {kind for kind, _ in diffs} == {"kda", "mla", "dense", "moe"}
    assert len(diffs) == 2 * ours.config.num_layers
    assert max(diffs.values()) < SUBLAYER_TOL, diffs


@pytest.mark.parametrize("overrides", [
    {},  # low-rank q, shared key part of 8, top-2 of 4, one shared expert, untied
    {"mla_q_lora_rank": None, "num_experts_per_token": 1, "num_shared_experts": 2, "tie_word_embeddings": True},
    {"num_shared_experts": 0, "mla_shared_key_dim": 0, "num_dense_layers": 0, "routed_scaling_factor": 2.5},
], ids=["kimi_linear", "fullq_top1_two_shared_tied", "no_shared_no_shared_key_scaled"])
def test_logits_match_kimi_linear(overrides):
    ours, theirs = paired_models(kimi_linear_config(**overrides))
    idx = torch.randint(0, 320, (2, 32))
    with torch.no_grad():
        logits = ours(idx)[0]
        assert max_diff(logits, theirs(idx).logits) < LOGITS_TOL
        assert logits.std() > 0.1  # not trivially small


def test_kimi_linear_weights_load_into_k3lab_and_give_the_same_logits():
    config = kimi_linear_config()
    theirs = randomised(transformers.KimiLinearForCausalLM(transformers.KimiLinearConfig(**hf.hf_config(config))))
    ours = KimiK3(config).eval()
    ours.load_state_dict(hf.from_hf_state_dict(theirs.state_dict(), config), strict=True)
    idx = torch.randint(0, 320, (1, 32))
    with torch.no_grad():
        assert max_diff(ours(idx)[0], theirs(idx).logits) < LOGITS_TOL


def test_state_dict_round_trip_is_exact():
    config = kimi_linear_config(num_shared_experts=2)
    state = randomised(KimiK3(config)).state_dict()
    back = hf.from_hf_state_dict(hf.to_hf_state_dict(state, config), config)
    balancing = {k for k in state if k.endswith(("load_counts", "score_quantiles"))}
    assert set(back) == set(state)
    assert all(torch.equal(back[k], state[k]) for k in set(state) - balancing)


def test_a_kimi_linear_state_dict_of_another_model_is_refused():
    config = kimi_linear_config()
    state = hf.to_hf_state_dict(KimiK3(config).state_dict(), config)
    with pytest.raises(ValueError, match="has model.layers.3.input_layernorm.weight, which this config does not"):
        hf.from_hf_state_dict(state, config.replace(num_layers=3, layer_types=("kda", "kda", "mla")))
    with pytest.raises(ValueError, match="tie_word_embeddings=true but the Kimi Linear head differs"):
        hf.from_hf_state_dict(state, config.replace(tie_word_embeddings=True))


def test_hf_weights_are_joined_as_documented():
    config = kimi_linear_config(num_shared_experts=2)
    state = randomised(KimiK3(config)).state_dict()
    theirs = hf.to_hf_state_dict(state, config)
    conv = theirs["model.layers.0.self_attn.conv1d.weight"]  # (3 H d, 1, W): q, k, v channels
    assert torch.equal(conv[32:64], state["layers.0.attn.k_conv.conv.weight"])
    gate_up = theirs["model.layers.1.mlp.experts.gate_up_proj"]  # (E, 2I, d): gate rows, then up rows
    assert torch.equal(gate_up[3, 32:], state["layers.1.ffn.experts.w_up"][3])
    shared_down = theirs["model.layers.1.mlp.shared_experts.down_proj.weight"]  # (M, 2I)
    assert torch.equal(shared_down[:, 32:], state["layers.1.ffn.shared.1.down_proj.weight"])
    assert theirs["model.layers.0.self_attn.forget_gate.A_log"].shape == (1, 1, 2, 1)


# -- what Kimi Linear cannot express ----------------------------------------------------------


def test_design_defaults_are_refused_for_every_k3_only_choice():
    problems = hf.export_problems(tiny_config())
    assert [p.split("=")[0] for p in problems] == [
        "use_attn_res", "ffn_activation", "moe_latent_size", "kda_gate_bias", "kda_gate_lower_bound",
        "kda_qk_l2norm", "mla_output_gate"]
    assert hf.export_problems(kimi_linear_config()) == []


@pytest.mark.parametrize("field, value", [
    ("use_attn_res", True), ("ffn_activation", "situ_glu"), ("moe_latent_size", 32), ("kda_gate_rank", "full"),
    ("kda_gate_rank", 8), ("kda_gate_bias", True), ("kda_gate_lower_bound", -5.0), ("kda_qk_l2norm", "normalize"),
    ("mla_output_gate", True), ("mla_latent_norm_eps", 1e-5),
])
def test_one_k3_only_choice_is_refused_naming_its_field(field, value):
    with pytest.raises(UserError, match=rf"^cannot export to Kimi Linear: {field}=\S+: Kimi Linear"):
        hf.hf_config(kimi_linear_config(**{field: value}))


def test_latent_size_is_no_problem_without_moe_layers():
    assert hf.export_problems(kimi_linear_config(moe_latent_size=32, num_dense_layers=4)) == []


# -- the export command ------------------------------------------------------------------------


def test_config_comes_back_from_the_logged_mlflow_params():
    for config in (kimi_linear_config(), tiny_config(**fidelity_fields("k3", 16)), tiny_config(kda_gate_rank=8)):
        params = {key: str(value) for key, value in flatten("model", config.to_dict()).items()}  # as MLflow stores them
        assert config_from_params(params) == config


@pytest.mark.usefixtures("isolated_data")
def test_trained_model_exports_by_run_id_and_transformers_gives_the_same_logits(tmp_path, capsys):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    assert main(["train", "tiny", "--fidelity", "kimi_linear", "--steps", "4", "--set", "train.batch_size=2",
                 "--set", "train.seq_len=32", "--tracking-uri", uri, "--save", str(tmp_path / "run")]) == 0
    run_id = re.search(r"MLflow run ([0-9a-f]{32})", capsys.readouterr().err)[1]
    assert main(["export", run_id, "--storage", str(tmp_path), "--hf", str(tmp_path / "hf")]) == 0

    theirs, info = transformers.KimiLinearForCausalLM.from_pretrained(tmp_path / "hf", output_loading_info=True)
    assert not any(info.values()), info  # no missing, unexpected or mismatched weights
    state = load_checkpoint(tmp_path / "run")
    assert state["step"] == 4
    ours = KimiK3(KimiK3Config(**state["config"]))
    ours.load_state_dict(state["model"])
    idx = torch.randint(0, 320, (2, 32))
    with torch.no_grad():
        assert max_diff(ours.eval()(idx)[0], theirs.eval()(idx).logits) < LOGITS_TOL


def test_export_of_a_k3_model_is_refused_in_one_line(tmp_path, capsys):
    model = KimiK3(tiny_config())
    torch.save({"step": 0, "config": model.config.to_dict(), "model": model.state_dict()}, tmp_path / "trainer.pt")
    assert main(["export", str(tmp_path), "--hf", str(tmp_path / "hf")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: cannot export to Kimi Linear: use_attn_res=true") and err.count("\n") == 1
    assert not (tmp_path / "hf").exists()


def test_export_names_a_source_that_is_neither_path_nor_run(tmp_path, capsys):
    assert main(["export", "no_such_run", "--hf", str(tmp_path / "hf")]) == 2
    assert "neither a checkpoint" in capsys.readouterr().err


def test_export_refuses_a_file_that_is_no_checkpoint_and_an_output_that_is_a_file_in_one_line(tmp_path, capsys):
    (tmp_path / "notes.pt").write_text("not a checkpoint")
    (tmp_path / "taken").write_text("")
    assert main(["export", str(tmp_path / "notes.pt"), "--hf", str(tmp_path / "hf")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {tmp_path / 'notes.pt'}: not a k3lab trainer checkpoint (") and err.count("\n") == 1
    assert main(["export", str(tmp_path / "notes.pt"), "--hf", str(tmp_path / "taken")]) == 2
    assert "is a file, not a folder" in capsys.readouterr().err
    assert not (tmp_path / "hf").exists() and (tmp_path / "taken").read_text() == ""


def test_export_refuses_a_non_empty_folder_that_holds_no_earlier_export_and_replaces_one_that_does(tmp_path, capsys):
    model = KimiK3(kimi_linear_config())
    torch.save({"step": 3, "config": model.config.to_dict(), "model": model.state_dict()}, tmp_path / "trainer.pt")
    other = tmp_path / "other"
    other.mkdir()
    (other / "config.json").write_text('{"model_type": "llama"}')
    (other / "model.safetensors").write_text("someone else's weights")
    assert main(["export", str(tmp_path / "trainer.pt"), "--hf", str(other)]) == 2
    err = capsys.readouterr().err
    assert err == (f"error: --hf {other}: not empty and holds no earlier export (a config.json of model_type "
                   "kimi_linear beside model.safetensors): not overwriting it\n")
    assert (other / "model.safetensors").read_text() == "someone else's weights"
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "todo.txt").write_text("x")
    assert main(["export", str(tmp_path / "trainer.pt"), "--hf", str(tmp_path / "notes")]) == 2
    assert "not overwriting it" in capsys.readouterr().err
    assert main(["export", str(tmp_path / "trainer.pt"), "--hf", str(tmp_path / "hf")]) == 0
    (tmp_path / "hf" / "tokenizer.json").write_text("{}")  # an earlier export, with what was added to it
    assert main(["export", str(tmp_path / "trainer.pt"), "--hf", str(tmp_path / "hf")]) == 0
    assert "wrote" in capsys.readouterr().out and (tmp_path / "hf" / "tokenizer.json").exists()
