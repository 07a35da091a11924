"""A byte-level BPE tokenizer trained locally on a corpus' training split, cached beside its tokens.

`train.tokenizer: bpe:VOCAB` (e.g. `bpe:4096`; 260 <= VOCAB <= 2**20) names the tokenizer that the
`tokenizers` library's byte-level BPE trainer learns from the training documents of `train.dataset`
(never the validation ones: validation text stays unseen), with `<|endoftext|>` as its
end-of-document token. A source of fewer than 2 documents is refused before training. It is
trained once and kept in the token cache, `<cache root>/tokenizers/<source>-bpe<VOCAB>-<key>/
tokenizer.json` (the key hashes the source's fingerprint, the vocabulary size and the validation
share); the dataset tokenized with it then lives beside it, under its own name, as for any
`tokenizer:PATH`. The model's `vocab_size` must hold VOCAB tokens (`base: {vocab_size: ...}`).
Needs the `tokenizers` package (the test extra has it).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import re
from pathlib import Path

from k3lab.data.cache import cache_root, locked, staging
from k3lab.data.split import TRAIN, assign, check_documents
from k3lab.data.tokenizer import EOT_TEXT, FileTokenizer, get_tokenizer
from k3lab.errors import UserError

SPEC = re.compile(r"^bpe:(\d+)$")
MIN_VOCAB = 260  # 256 bytes, the end-of-document token and a few merges
MAX_VOCAB = 1 << 20  # 1,048,576; the trainer allocates by VOCAB (bpe:99999999999 aborted in Rust)
FORMAT = 1


def is_bpe(spec: str) -> bool:
    return spec.startswith("bpe:")


def tokenizer_vocab(spec: str) -> int:
    """The vocabulary size of the tokenizer `spec` names, known before any corpus is read (`bpe:VOCAB`:
    at most VOCAB, the 256 bytes and the end-of-document token included), so that a model too small
    for it is refused before a corpus is tokenized (bpe:4096 was trained and used first); a bad spec
    raises UserError."""
    return vocab_of(spec) if is_bpe(spec) else get_tokenizer(spec).vocab_size


def vocab_of(spec: str) -> int:
    match = SPEC.match(spec)
    if match is None or not MIN_VOCAB <= int(match.group(1)) <= MAX_VOCAB:
        raise UserError(f"tokenizer '{spec}': expected bpe:VOCAB with VOCAB >= {MIN_VOCAB} and <= {MAX_VOCAB:,} "
                        "(2**20), e.g. bpe:4096")
    return int(match.group(1))


def bpe_path(spec: str, source, val_fraction: float, cache_dir=None) -> Path:
    """Where the tokenizer `spec` trained on `source` lives (trained or not)."""
    vocab = vocab_of(spec)
    identity = {"format": FORMAT, "source": source.spec, "fingerprint": source.fingerprint(), "vocab": vocab,
                "val_fraction": val_fraction}
    key = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:16]
    slug = re.sub(r"[^A-Za-z0-9_.+]+", "_", Path(source.spec).name or source.spec).strip("_.")[:40] or "x"
    return cache_root(cache_dir) / "tokenizers" / f"{slug}-bpe{vocab}-{key}" / "tokenizer.json"


def bpe_tokenizer(spec: str, source, val_fraction: float, cache_dir=None, train: bool = True) -> FileTokenizer | None:
    """The trained tokenizer (trained now when missing and `train`; else None when missing)."""
    path = bpe_path(spec, source, val_fraction, cache_dir)
    if not path.exists():
        if not train:
            return None
        check_documents(source.spec, non_empty_documents(source, 2))
        folder = path.parent
        folder.parent.mkdir(parents=True, exist_ok=True)
        with locked(folder.parent, folder.name):
            if not path.exists():
                with staging(folder.parent, folder.name) as tmp:
                    train_bpe(source, vocab_of(spec), val_fraction, tmp / "tokenizer.json")
    return FileTokenizer(path)


def non_empty_documents(source, most: int) -> int:
    """The source's non-empty documents, counted up to `most` (reads only as far as that)."""
    return sum(1 for _ in itertools.islice((doc for doc in source.documents() if doc.text), most))


def train_bpe(source, vocab: int, val_fraction: float, out: Path) -> Path:
    """Train a byte-level BPE of `vocab` tokens on the training split's documents into `out`."""
    try:
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    except ImportError as error:
        raise UserError("tokenizer 'bpe:...' needs the `tokenizers` package (pip install 'k3lab[tokenizers]')") \
            from error
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=[EOT_TEXT], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    texts = (doc.text for doc in source.documents() if doc.text and assign(doc.id, val_fraction) == TRAIN)
    tokenizer.train_from_iterator(texts, trainer=trainer)
    tokenizer.save(str(out))
    return out
