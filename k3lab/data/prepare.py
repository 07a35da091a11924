"""`prepare_dataset`: tokenize a source once into cached Arrow shards, split by document.

Tokens of each document are followed by the tokenizer's end-of-document id.
The dataset directory holds `manifest.json` (source, fingerprint, tokenizer,
per split: documents, tokens, UTF-8 bytes, shard files), the shards, and for
file tokenizers a copy of tokenizer.json. A second call with the same source
content, tokenizer and settings finds the directory and returns at once.
"""

from __future__ import annotations

import datetime
import itertools
import json
import platform
import shutil
from pathlib import Path
from typing import Iterable, Iterator

import numpy as np

import k3lab
from k3lab.data.bpe import bpe_tokenizer, is_bpe, tokenizer_vocab
from k3lab.data.cache import cache_root, dataset_name, locked, staging
from k3lab.data.dataset import MANIFEST, TOKENIZER_FILE, Dataset
from k3lab.data.tokenizing_progress import progress_bar
from k3lab.data.shards import DEFAULT_SHARD_TOKENS, ShardWriter, token_dtype
from k3lab.data.sources import Document, Source, get_source
from k3lab.data.split import DEFAULT_VAL_FRACTION, SPLITS, SplitTracker, assign, check_documents
from k3lab.data.tokenizer import FileTokenizer, get_tokenizer
from k3lab.errors import UserError

FORMAT_VERSION = 1
BATCH_DOCUMENTS = 256  # documents per encode_batch call


def prepare_dataset(source: str = "stdlib", tokenizer: str = "byte", cache_dir: str | Path | None = None,
                    val_fraction: float = DEFAULT_VAL_FRACTION, progress: bool = True,
                    shard_tokens: int = DEFAULT_SHARD_TOKENS) -> Dataset:
    """Tokenize `source` with `tokenizer` into the cache (once) and open the result.

    `shard_tokens` only sets the file layout (tokens per shard), not the tokens,
    so it is not part of the cache key. Returns a `Dataset` whose `cached` is
    True when nothing had to be written.
    """
    check_options(tokenizer, val_fraction)
    src = get_source(source)
    tok = _tokenizer(tokenizer, src, cache_dir, val_fraction, train=True)
    root, name, identity = _locate(src, tok, cache_dir, val_fraction)
    if (root / name / MANIFEST).exists():
        return Dataset.open(root / name, cached=True)
    with locked(root, name):
        if (root / name / MANIFEST).exists():  # another process built it while we waited
            return Dataset.open(root / name, cached=True)
        with staging(root, name) as tmp:
            _build(src, tok, tmp, identity, progress, shard_tokens)
    return Dataset.open(root / name, cached=False)


def load_dataset_info(source: str = "stdlib", tokenizer: str = "byte", cache_dir: str | Path | None = None,
                      val_fraction: float = DEFAULT_VAL_FRACTION) -> Dataset | None:
    """The prepared dataset for these arguments, or None when it has not been prepared."""
    check_options(tokenizer, val_fraction)
    src = get_source(source)
    tok = _tokenizer(tokenizer, src, cache_dir, val_fraction, train=False)
    if tok is None:  # bpe:VOCAB not trained yet: nothing prepared with it either
        return None
    root, name, _ = _locate(src, tok, cache_dir, val_fraction)
    return Dataset.open(root / name) if (root / name / MANIFEST).exists() else None


def find_datasets(source: str = "stdlib", tokenizer: str = "byte", cache_dir: str | Path | None = None,
                  val_fraction: float | None = None) -> list[Dataset]:
    """Prepared datasets of this source content and tokenizer, of any validation fraction
    unless one is given."""
    check_options(tokenizer, val_fraction)
    src = get_source(source)
    if is_bpe(tokenizer):  # a trained tokenizer is per validation share: look for each prepared one
        found = []
        for share in {ds.manifest["val_fraction"] for ds in list_datasets(cache_dir)}:
            if val_fraction in (None, share) and (tok := _tokenizer(tokenizer, src, cache_dir, share, False)):
                found += [ds for ds in list_datasets(cache_dir) if ds.manifest["val_fraction"] == share
                          and ds.manifest["tokenizer_fingerprint"] == tok.fingerprint
                          and ds.manifest["fingerprint"] == src.fingerprint()]
        return found
    tok = get_tokenizer(tokenizer)
    fingerprint = src.fingerprint()
    return [ds for ds in list_datasets(cache_dir)
            if ds.manifest["fingerprint"] == fingerprint and ds.manifest["tokenizer_fingerprint"] == tok.fingerprint
            and val_fraction in (None, ds.manifest["val_fraction"])]


def list_datasets(cache_dir: str | Path | None = None) -> list[Dataset]:
    """Every prepared dataset in the cache, sorted by directory name."""
    root = cache_root(cache_dir)
    paths = sorted(p.parent for p in root.glob(f"*/{MANIFEST}") if not p.parent.name.startswith("."))
    return [Dataset.open(p) for p in paths]


def check_options(tokenizer: str, val_fraction: float | None) -> None:
    """The tokenizer spec and the validation share (None: any, as `data info` takes it), checked
    before the source is read, by `data prepare` and `data info` alike (info ignored both, and
    prepare hashed the whole corpus before it looked at the share)."""
    if val_fraction is not None and not 0.0 < val_fraction < 1.0:
        raise UserError(f"val_fraction {val_fraction}: must lie strictly between 0 and 1")
    tokenizer_vocab(tokenizer)


def _tokenizer(spec: str, src: Source, cache_dir, val_fraction: float, train: bool):
    """The tokenizer a spec names; `bpe:VOCAB` is trained on `src` (see k3lab.data.bpe)."""
    if is_bpe(spec):
        return bpe_tokenizer(spec, src, val_fraction, cache_dir, train=train)
    return get_tokenizer(spec)


def _locate(src: Source, tok, cache_dir, val_fraction: float) -> tuple[Path, str, dict]:
    identity = {"format": FORMAT_VERSION, "source": src.spec, "fingerprint": src.fingerprint(),
                "tokenizer": tok.fingerprint, "val_fraction": val_fraction}
    return cache_root(cache_dir), dataset_name(src.spec, tok.name, identity), identity


def _build(src: Source, tok, directory: Path, identity: dict, progress: bool, shard_tokens: int) -> dict:
    """Write shards and manifest.json into `directory`; a second pass runs only when the
    split rule left a split empty (tiny corpora)."""
    splits, tracker = _tokenize(src, tok, directory, identity["val_fraction"], {}, progress, shard_tokens)
    check_documents(src.spec, sum(tracker.counts.values()))
    if forced := tracker.forced():
        for shard in directory.iterdir():
            shard.unlink()
        splits, _ = _tokenize(src, tok, directory, identity["val_fraction"], forced, progress, shard_tokens)
    if isinstance(tok, FileTokenizer):
        shutil.copyfile(tok.path, directory / TOKENIZER_FILE)
    manifest = {**identity, "tokenizer": tok.name, "tokenizer_fingerprint": tok.fingerprint, "vocab_size": tok.vocab_size,
                "eot_id": tok.eot_id, "dtype": token_dtype(tok.vocab_size).name, "splits": splits,
                "python": platform.python_version(), "k3lab": k3lab.__version__,
                "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
    (directory / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


def _tokenize(src: Source, tok, directory: Path, val_fraction: float, forced: dict[str, str],
              progress: bool, shard_tokens: int) -> tuple[dict, SplitTracker]:
    """One pass over the documents: encode in batches, route each by the split rule, write shards."""
    dtype = token_dtype(tok.vocab_size)
    writers = {s: ShardWriter(directory, s, dtype, shard_tokens) for s in SPLITS}
    stats = {s: {"documents": 0, "tokens": 0, "bytes": 0} for s in SPLITS}
    tracker = SplitTracker()
    with progress_bar(progress, f"tokenizing {src.spec}", src.count()) as advance:
        for batch in _batches(src.documents(), BATCH_DOCUMENTS):
            encoded = tok.encode_batch([doc.text for doc in batch])
            batch_tokens = 0
            for doc, ids in zip(batch, encoded):
                if not doc.text:
                    continue
                split = assign(doc.id, val_fraction, forced)
                tracker.add(doc.id, split)
                tokens = np.empty(len(ids) + 1, dtype=dtype)
                tokens[:-1], tokens[-1] = ids, tok.eot_id
                writers[split].append(tokens)
                info = stats[split]
                info["documents"] += 1
                info["tokens"] += len(tokens)
                info["bytes"] += len(doc.text.encode("utf-8"))
                batch_tokens += len(tokens)
            advance(len(batch), batch_tokens)
    return {s: {**stats[s], "shards": writers[s].finish()} for s in SPLITS}, tracker


def _batches(documents: Iterable[Document], size: int) -> Iterator[list[Document]]:
    iterator = iter(documents)
    while batch := list(itertools.islice(iterator, size)):
        yield batch
