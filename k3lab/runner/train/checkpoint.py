"""Trial checkpoints: one `torch.save` file of tensors and plain values, loaded with weights_only=True.

The file is written to a temporary name and renamed, so a crash mid-write never
leaves a truncated checkpoint where a resume would find it.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

CHECKPOINT_FILE = "trainer.pt"


def save_checkpoint(state: dict, path: str | Path) -> Path:
    path = Path(path)
    if path.suffix != ".pt":
        path = path / CHECKPOINT_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".pt.tmp")
    torch.save(state, tmp)
    os.replace(tmp, path)
    return path


def load_checkpoint(path: str | Path) -> dict:
    path = Path(path)
    if path.is_dir():
        path = path / CHECKPOINT_FILE
    return torch.load(path, map_location="cpu", weights_only=True)


def rng_state() -> dict:
    state = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
