"""Tokenizers: byte-level by default, or a Hugging Face `tokenizers` file.

Spec strings (what `get_tokenizer` takes and manifests record):
- "byte": ids 0..255 are the UTF-8 bytes, 256 is the end-of-document token.
- "tokenizer:PATH": a local `tokenizer.json` loaded with the `tokenizers` library.
- "bpe:VOCAB": a byte-level BPE trained on the dataset's own training split and cached
  beside its tokens (`k3lab.data.bpe`; it needs the corpus, so `prepare_dataset` resolves it).

Every tokenizer has `name` (human readable), `fingerprint` (identity for cache
keys: changes whenever the ids would change), `vocab_size`, `eot_id`,
`encode(str) -> list[int]`, `decode(list[int]) -> str` and
`encode_batch(list[str]) -> list[np.ndarray]` (the fast path shards use).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np

from k3lab.errors import UserError

EOT_TEXT = "<|endoftext|>"
# Special tokens that mark a document end in common tokenizer.json files, in order of preference.
EOT_CANDIDATES = (EOT_TEXT, "<|end_of_text|>", "</s>", "<eos>", "<|eot_id|>", "[SEP]")


class ByteTokenizer:
    """UTF-8 bytes as ids 0..255 plus one end-of-document id 256 (vocab 257).

    `decode(encode(s)) == s` for every string; `decode` shows the end-of-document
    id as "<|endoftext|>" so samples show where documents break.
    """

    name = "byte"
    fingerprint = "byte"
    vocab_size = 257
    eot_id = 256

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def encode_batch(self, texts: list[str]) -> list[np.ndarray]:
        return [np.frombuffer(text.encode("utf-8"), dtype=np.uint8) for text in texts]

    def decode(self, ids) -> str:
        pieces, run = [], bytearray()
        for i in ids:
            i = int(i)
            if i == self.eot_id:
                pieces += [run.decode("utf-8", errors="replace"), EOT_TEXT]
                run = bytearray()
            elif 0 <= i < 256:
                run.append(i)
            else:
                raise ValueError(f"id {i} is outside the byte vocabulary 0..{self.eot_id}")
        pieces.append(run.decode("utf-8", errors="replace"))
        return "".join(pieces)


class FileTokenizer:
    """A `tokenizers.Tokenizer` read from a local tokenizer.json.

    The end-of-document id is the first special token of `EOT_CANDIDATES` in the
    vocabulary; without one, a new id `vocab_size` is appended (vocab grows by 1).
    Special tokens such as BOS are never added by `encode`: documents are
    separated by the end-of-document id alone, as with the byte tokenizer.
    """

    def __init__(self, path: str | Path):
        path = Path(path).expanduser()
        if not path.is_file():
            raise UserError(f"tokenizer 'tokenizer:{path}': no such file")
        try:
            from tokenizers import Tokenizer
        except ImportError as error:
            raise UserError("tokenizer specs 'tokenizer:PATH' need the `tokenizers` package "
                            "(pip install 'k3lab[tokenizers]')") from error
        data = path.read_bytes()
        try:
            self._tok = Tokenizer.from_str(data.decode("utf-8"))
        except Exception as error:  # the Rust side raises plain Exceptions for any malformed file
            raise UserError(f"tokenizer 'tokenizer:{path}': cannot load: {str(error).splitlines()[0]}") from error
        self.path = path.resolve()
        self.name = f"tokenizer:{self.path}"
        self.fingerprint = "tokenizer:" + hashlib.sha256(data).hexdigest()
        base = self._tok.get_vocab_size(with_added_tokens=True)
        vocab = self._tok.get_vocab(with_added_tokens=True)
        found = next((vocab[t] for t in EOT_CANDIDATES if t in vocab), None)
        self.eot_id = base if found is None else found
        self.vocab_size = base + 1 if found is None else base

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: list[str]) -> list[np.ndarray]:
        """Encode in parallel (the Rust library uses all cores)."""
        encodings = self._tok.encode_batch(texts, add_special_tokens=False)
        return [np.asarray(e.ids, dtype=np.int64) for e in encodings]

    def decode(self, ids) -> str:
        pieces, run = [], []
        for i in map(int, ids):
            if i == self.eot_id:
                pieces += [self._tok.decode(run, skip_special_tokens=False), EOT_TEXT]
                run = []
            else:
                run.append(i)
        pieces.append(self._tok.decode(run, skip_special_tokens=False))
        return "".join(pieces)


def get_tokenizer(spec: str = "byte") -> ByteTokenizer | FileTokenizer:
    """Build the tokenizer a spec string names ("byte" or "tokenizer:PATH")."""
    if spec == "byte":
        return ByteTokenizer()
    if spec.startswith("tokenizer:") and len(spec) > len("tokenizer:"):
        return FileTokenizer(spec[len("tokenizer:"):])
    if spec.startswith("bpe:"):
        raise UserError(f"tokenizer '{spec}': a bpe tokenizer is trained on a dataset; prepare the dataset with it")
    raise UserError(f"tokenizer '{spec}': unknown spec (use 'byte', 'tokenizer:PATH/tokenizer.json' or bpe:VOCAB)")
