"""Exporting a trained model as a Hugging Face Kimi Linear checkpoint: finding it, and its model config.

(`k3lab export`, in `k3lab.commands.export`):
    k3lab export CHECKPOINT --hf DIR   a trainer checkpoint: trainer.pt, a folder holding one
                                       (`k3lab train --save DIR`, a Ray checkpoint), or a trial
                                       folder (its newest checkpoint)
    k3lab export RUN_ID --hf DIR       an MLflow run id: that trial's newest checkpoint under
                                       --storage (every trial checkpoint carries its run id)

DIR receives config.json and model.safetensors, which
`transformers.KimiLinearForCausalLM.from_pretrained(DIR)` loads and which give the same
logits (tests/test_hf.py). The model config comes from the checkpoint, or, for checkpoints
written before k3lab stored it there, from the run's `model.*` params in MLflow. A model
Kimi Linear cannot express (AttnRes, SiTU-GLU, latent MoE, ...) is refused in one line
naming the field: train with `--fidelity kimi_linear` (or `fidelity: kimi_linear`) to export.
"""

from __future__ import annotations

import json
import re
import typing
from pathlib import Path

from k3lab.errors import UserError

RUN_ID = re.compile(r"^[0-9a-f]{32}$")  # MLflow run ids


# -- finding the checkpoint ---------------------------------------------------------------


def locate_checkpoint(source: str, storage: Path) -> Path:
    """The trainer.pt that `source` (a path or an MLflow run id) names."""
    from k3lab.runner.train.checkpoint import CHECKPOINT_FILE

    path = Path(source)
    if path.is_file():
        return path
    if path.is_dir():
        found = sorted(path.rglob(CHECKPOINT_FILE))
        if not found:
            raise UserError(f"{source}: no {CHECKPOINT_FILE} in this folder")
        return newest(found)
    if not RUN_ID.match(source):
        raise UserError(f"{source}: neither a checkpoint (no such file or folder) nor an MLflow run id")
    found = [p for p in storage.rglob(CHECKPOINT_FILE) if checkpoint_summary(p)[1] == source]
    if not found:
        raise UserError(f"run {source}: no checkpoint of it under {storage} (pass --storage, or the checkpoint path)")
    return newest(found)


def checkpoint_summary(path: Path) -> tuple[int, str | None]:
    """(step, MLflow run id) of a checkpoint, memory-mapped: the weights are not read."""
    import torch

    from k3lab.store.runs import RUN_ID_KEY

    state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    return state["step"], (state.get("extra") or {}).get(RUN_ID_KEY)


def newest(paths: list[Path]) -> Path:
    """The checkpoint with the most training steps."""
    return max(paths, key=lambda p: checkpoint_summary(p)[0])


# -- the output folder --------------------------------------------------------------------


def check_hf_folder(folder: Path) -> None:
    """--hf is missing, empty or an earlier export, which is replaced: the files of any other
    folder are not overwritten (its config.json and model.safetensors were, without a word)."""
    if folder.is_dir() and any(folder.iterdir()) and not is_earlier_export(folder):
        raise UserError(f"--hf {folder}: not empty and holds no earlier export (a config.json of model_type "
                        "kimi_linear beside model.safetensors): not overwriting it")


def is_earlier_export(folder: Path) -> bool:
    """`folder` holds what `save_hf` writes: model.safetensors, and a config.json of Kimi Linear's
    model type (a downloaded Kimi Linear model, its weights in shards, has no model.safetensors)."""
    try:
        config = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError):
        return False
    kimi_linear = isinstance(config, dict) and config.get("model_type") == "kimi_linear"
    return kimi_linear and (folder / "model.safetensors").is_file()


# -- the model config ---------------------------------------------------------------------


def checkpoint_config(state: dict, path: Path, tracking_uri: str | None):
    """The KimiK3Config of a checkpoint: stored in it, else its MLflow run's `model.*` params."""
    from k3lab.model.config import KimiK3Config
    from k3lab.store.runs import RUN_ID_KEY

    if "config" in state:
        return KimiK3Config(**state["config"])
    run_id = (state.get("extra") or {}).get(RUN_ID_KEY)
    if not run_id:
        raise UserError(f"{path}: the checkpoint holds no model config and names no MLflow run to read it from")
    from k3lab.store.runs import get_run
    from k3lab.store.state import tracking_uri_or_default

    return config_from_params(get_run(tracking_uri_or_default(tracking_uri), run_id).data.params)


def config_from_params(params: dict[str, str]):
    """A KimiK3Config from MLflow params as `trial_params` logs them (`model.hidden_size` = "256", ...)."""
    from k3lab.model.config import KimiK3Config
    from k3lab.registry.fields import field_types

    fields = {name: parse_param(params[f"model.{name}"], type_)
              for name, type_ in field_types().items() if f"model.{name}" in params}
    return KimiK3Config(**fields)


def parse_param(text: str, type_) -> typing.Any:
    """One logged value back in its field's type: "None", "True", "64", "1e-05", "kda,mla", "full"."""
    members = typing.get_args(type_) or (type_,)
    if text == "None" and type(None) in members:
        return None
    if any(typing.get_origin(m) is tuple for m in members):
        return tuple(text.split(","))
    if bool in members:
        return text == "True"
    for kind in (int, float):
        if kind in members:
            try:
                return kind(text)
            except ValueError:
                pass
    return text
