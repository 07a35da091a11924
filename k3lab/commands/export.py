"""`k3lab export`: a trained model as a Hugging Face Kimi Linear checkpoint (see `k3lab.export.hugging_face`)."""

from __future__ import annotations

import argparse
from pathlib import Path

from k3lab.export.hugging_face import check_hf_folder, checkpoint_config, locate_checkpoint


def register(subparsers: argparse._SubParsersAction) -> None:
    export = subparsers.add_parser("export", help="a trained model as a Hugging Face Kimi Linear checkpoint")
    export.add_argument("source", metavar="RUN_OR_CHECKPOINT",
                        help="a checkpoint (trainer.pt or a folder holding one) or an MLflow run id")
    export.add_argument("--hf", required=True, metavar="DIR",
                        help="output folder for config.json and model.safetensors: a new or empty one, or an earlier "
                             "export's (replaced)")
    export.add_argument("--storage", help="where a run's checkpoints are (default: K3LAB_STORAGE or ./k3lab_runs)")
    export.add_argument("--tracking-uri", help="MLflow store, for checkpoints that hold no model config "
                                               "(default: MLFLOW_TRACKING_URI or ./mlflow.db)")
    export.set_defaults(func=run_export)


def run_export(args) -> int:
    from k3lab.model.hf import check_exportable, save_hf
    from k3lab.model.model import KimiK3
    from k3lab.errors import UserError
    from k3lab.store.state import default_storage
    from k3lab.runner.train.checkpoint import load_checkpoint
    from k3lab.runner.runtime.preflight import check_writable

    if not args.hf:
        raise UserError("--hf: names no folder")
    check_writable("--hf", Path(args.hf))  # a folder, or one that can be made, before the checkpoint is read
    check_hf_folder(Path(args.hf))
    path = locate_checkpoint(args.source, Path(args.storage) if args.storage else default_storage())
    try:
        state = load_checkpoint(path)
    except Exception as error:  # torch.load on a file that is no checkpoint raises many kinds (unpickling, struct, ...)
        first = (str(error).strip().splitlines() or [type(error).__name__])[0][:120]
        raise UserError(f"{path}: not a k3lab trainer checkpoint ({first})") from None
    if not isinstance(state, dict) or "model" not in state:
        raise UserError(f"{path}: not a k3lab trainer checkpoint (no model state in it)")
    config = checkpoint_config(state, path, args.tracking_uri)
    check_exportable(config)
    model = KimiK3(config)
    model.load_state_dict(state["model"])
    save_hf(model, args.hf)
    print(f"wrote {Path(args.hf) / 'config.json'} and model.safetensors: step {state['step']} of {path}")
    return 0
