"""A trial's corpus as an MLflow dataset input: which corpus and tokenizer the run trained on.

MLflow's dataset tracking (`log_inputs`) lists it on the run's page and lets the runs table filter
by it (`dataset.name = 'stdlib-byte'`, `dataset.digest = '...'`). The digest is over what fixes the
shards (the source's fingerprint, the tokenizer's, the split and every shard's name and token
count, from the prepared corpus's manifest.json): two runs with one digest read the same tokens.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

CONTEXT = "mlflow.data.context"  # MLflow's input tag: what the run used the dataset for
TRAINING = "training"
SCHEMA = {"mlflow_colspec": [{"type": "long", "name": "token_id", "required": True}]}  # one token id a row


def corpus_name(manifest: dict) -> str:
    """'stdlib-byte': the source and the tokenizer (a tokenizer file's fingerprint, short)."""
    tokenizer = manifest["tokenizer"]
    if tokenizer != "byte":
        tokenizer = f"{Path(str(tokenizer)).stem}-{str(manifest.get('tokenizer_fingerprint', ''))[:8]}".rstrip("-")
    return f"{Path(str(manifest['source'])).name}-{tokenizer}"


def corpus_digest(manifest: dict) -> str:
    fixed = {key: manifest.get(key) for key in ("fingerprint", "tokenizer_fingerprint", "val_fraction", "dtype")}
    fixed["splits"] = {name: [(s["file"], s["tokens"]) for s in split["shards"]]
                       for name, split in sorted(manifest["splits"].items())}
    return hashlib.sha256(json.dumps(fixed, sort_keys=True).encode()).hexdigest()[:16]


def corpus_profile(manifest: dict) -> dict:
    profile = {f"{name}_{key}": split[key] for name, split in sorted(manifest["splits"].items())
               for key in ("tokens", "documents", "bytes") if key in split}
    return profile | {"tokenizer": str(manifest["tokenizer"]), "vocab_size": manifest["vocab_size"],
                      "source": str(manifest["source"])}


def corpus_input(path: str | Path, manifest: dict):
    """The prepared corpus at `path` (its manifest) as an MLflow DatasetInput of context training."""
    from mlflow.entities import Dataset, DatasetInput, InputTag

    dataset = Dataset(name=corpus_name(manifest), digest=corpus_digest(manifest), source_type="local",
                      source=json.dumps({"uri": str(Path(path).resolve())}), schema=json.dumps(SCHEMA),
                      profile=json.dumps(corpus_profile(manifest)))
    return DatasetInput(dataset=dataset, tags=[InputTag(key=CONTEXT, value=TRAINING)])


def log_corpus(client, run_id: str, path: str | Path, manifest: dict) -> None:
    """The corpus as the run's input (once: a reopened run that lists it already is left as it is).

    Trials of one experiment start together and each logs the same dataset. MLflow looks the dataset
    up, then inserts it, so a trial beside another can lose that race on the (experiment, name,
    digest) key. It then retries once: the second call finds the row the other trial wrote.
    """
    from mlflow.exceptions import MlflowException

    wanted = corpus_input(path, manifest)
    for attempt in range(2):
        listed = client.get_run(run_id).inputs.dataset_inputs
        if any(i.dataset.digest == wanted.dataset.digest and i.dataset.name == wanted.dataset.name for i in listed):
            return
        try:
            client.log_inputs(run_id, datasets=[wanted])
            return
        except MlflowException:
            if attempt == 1:
                raise
