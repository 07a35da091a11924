"""k3lab.data: sources, tokenizers, cached Arrow shards, split, sampler, CLI."""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import threading
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from k3lab.data import (BatchSampler, ByteTokenizer, Dataset, get_source, get_tokenizer, list_datasets,
                        load_dataset_info, prepare_dataset)
from k3lab.data import prepare as prepare_module
from k3lab.commands.data import register
from k3lab.errors import UserError


def _doc(i: int) -> str:
    return f"document {i}: " + " ".join(f"w{(i * 7 + j) % 97}" for j in range(5 + i % 13)) + " ünïcødé ✓\n"


@pytest.fixture
def corpus(tmp_path):
    """60 unique documents: 20 .txt files, a 30-line .jsonl, a 10-row .parquet, plus an ignored file."""
    root = tmp_path / "corpus"
    (root / "sub").mkdir(parents=True)
    for i in range(20):
        (root / "sub" / f"{i:02d}.txt").write_text(_doc(i))
    with open(root / "a.jsonl", "w") as f:
        for i in range(20, 50):
            f.write(json.dumps({"text": _doc(i), "meta": i}) + "\n")
    pq.write_table(pa.table({"text": [_doc(i) for i in range(50, 60)]}), root / "b.parquet")
    (root / "README.md").write_text("not part of the corpus")
    return root


@pytest.fixture
def cache(tmp_path):
    return tmp_path / "cache"


def split_documents(ds: Dataset, split: str) -> list[str]:
    """Decode a split back into its documents (the end-of-document id separates them)."""
    tokens = ds.tokens(split)
    ends = np.flatnonzero(tokens == ds.eot_id)
    starts = np.concatenate([[0], ends[:-1] + 1])
    return [bytes(tokens[s:e].astype(np.uint8)).decode() for s, e in zip(starts, ends)]


# ---------------------------------------------------------------- tokenizers


def test_byte_tokenizer_round_trip():
    tok = get_tokenizer("byte")
    assert (tok.vocab_size, tok.eot_id) == (257, 256)
    for text in ["", "hello", "ünïcødé ✓ 🙂", "tabs\tand\nnewlines\r\n", "\x00\x7f"]:
        ids = tok.encode(text)
        assert all(0 <= i < 256 for i in ids)
        assert len(ids) == len(text.encode("utf-8"))
        assert tok.decode(ids) == text
        assert tok.encode_batch([text])[0].tolist() == ids
    assert tok.decode(tok.encode("a") + [tok.eot_id] + tok.encode("b")) == "a<|endoftext|>b"
    with pytest.raises(ValueError):
        tok.decode([257])


def _train_bpe(path, special_tokens):
    pytest.importorskip("tokenizers")  # an optional extra: k3lab[tokenizers]
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=special_tokens,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([_doc(i) for i in range(60)], trainer)
    tok.save(str(path))
    return path


def test_file_tokenizer_round_trip_and_eot(tmp_path):
    with_eot = get_tokenizer(f"tokenizer:{_train_bpe(tmp_path / 'a.json', ['<|endoftext|>'])}")
    text = _doc(3) + "unseen wörds 🙂"
    assert with_eot.decode(with_eot.encode(text)) == text
    assert with_eot.eot_id == 0 and with_eot.vocab_size == 300  # the trainer puts specials first
    assert with_eot.eot_id not in with_eot.encode(text)
    without = get_tokenizer(f"tokenizer:{_train_bpe(tmp_path / 'b.json', [])}")
    assert without.eot_id == without.vocab_size - 1  # appended after the file's vocabulary
    assert [a.tolist() for a in without.encode_batch([text, "x"])] == [without.encode(text), without.encode("x")]
    assert with_eot.fingerprint != without.fingerprint


def test_dataset_with_file_tokenizer(corpus, cache, tmp_path):
    spec = f"tokenizer:{_train_bpe(tmp_path / 'tok.json', ['<|endoftext|>'])}"
    ds = prepare_dataset(str(corpus), spec, cache_dir=cache, val_fraction=0.2, progress=False)
    assert ds.manifest["dtype"] == "uint16" and ds.train_tokens.dtype == np.uint16
    assert ds.train_tokens.max() < ds.vocab_size
    (tmp_path / "tok.json").unlink()  # the dataset keeps its own copy
    reopened = Dataset.open(ds.path)
    tokens = reopened.val_tokens
    first_doc = tokens[: np.flatnonzero(tokens == reopened.eot_id)[0]]
    assert reopened.tokenizer.decode(first_doc.tolist()).startswith("document ")
    assert ds.bytes_per_token("train") > 1.5  # BPE merges: more than one byte per token


@given(st.text())  # any Unicode text (hypothesis leaves out lone surrogates, which UTF-8 cannot hold)
def test_byte_tokenizer_round_trip_any_text(text):
    tok = ByteTokenizer()
    assert tok.decode(tok.encode(text)) == text


def test_bad_tokenizer_spec():
    for spec in ["bytes", "tokenizer:", "tokenizer:/no/such/tokenizer.json"]:
        with pytest.raises(UserError, match="tokenizer"):
            get_tokenizer(spec)


def _no_training(*args):
    raise AssertionError("a bpe tokenizer was trained")


@pytest.mark.parametrize("spec", ["bpe:1048577", "bpe:99999999999"])
def test_a_bpe_vocabulary_above_2_to_the_20_is_refused_before_training(tmp_path, cache, monkeypatch, spec):
    from k3lab.data import bpe

    monkeypatch.setattr(bpe, "train_bpe", _no_training)  # the real one aborted the process in Rust
    with pytest.raises(UserError, match=rf"tokenizer '{spec}': expected bpe:VOCAB with VOCAB >= 260 and "
                                        r"<= 1,048,576 \(2\*\*20\)"):
        prepare_dataset(str(_two_documents(tmp_path)), spec, cache_dir=cache, progress=False)
    assert not cache.exists()


def test_a_bpe_tokenizer_of_a_one_document_source_is_refused_before_it_is_trained(tmp_path, cache, monkeypatch):
    from k3lab.data import bpe

    (tmp_path / "one.txt").write_text("a\nb\n")
    monkeypatch.setattr(bpe, "train_bpe", _no_training)
    with pytest.raises(UserError, match="one.txt': 1 non-empty document.*needs at least 2"):
        prepare_dataset(str(tmp_path / "one.txt"), "bpe:300", cache_dir=cache, progress=False)
    assert not cache.exists()  # no tokenizer cached, no folder made


def test_a_bpe_training_that_fails_or_is_interrupted_leaves_no_temporary_folder(tmp_path, cache, monkeypatch):
    from k3lab.data import bpe

    def interrupted(source, vocab, val_fraction, out):
        out.write_text("half a tokenizer")
        raise KeyboardInterrupt

    monkeypatch.setattr(bpe, "train_bpe", interrupted)
    with pytest.raises(KeyboardInterrupt):
        prepare_dataset(str(_two_documents(tmp_path)), "bpe:300", cache_dir=cache, progress=False)
    assert [p.name for p in (cache / "tokenizers").iterdir() if not p.name.endswith(".lock")] == []


def _two_documents(tmp_path):
    (tmp_path / "two").mkdir()
    for name in ("a", "b"):
        (tmp_path / "two" / f"{name}.txt").write_text(f"text of {name}")
    return tmp_path / "two"


# ---------------------------------------------------------------- sources


def test_local_source_documents_and_order(corpus):
    src = get_source(str(corpus))
    docs = list(src.documents())
    assert [d.text for d in docs] == [_doc(i) for i in range(20, 60)] + [_doc(i) for i in range(20)]
    assert docs[0].id == "a.jsonl:1" and docs[30].id == "b.parquet:0" and docs[40].id == "sub/00.txt"
    assert len({d.id for d in docs}) == 60
    assert src.count() is None  # a .jsonl makes the count unknown without reading it
    assert get_source(str(corpus / "b.parquet")).count() == 10


def test_fingerprint_follows_content(corpus):
    before = get_source(str(corpus)).fingerprint()
    assert get_source(str(corpus)).fingerprint() == before
    (corpus / "sub" / "05.txt").write_text(_doc(5) + "changed")
    assert get_source(str(corpus)).fingerprint() != before


@pytest.mark.parametrize("make, problem", [
    (lambda d: d / "missing", "no such file"),
    (lambda d: (d / "x.csv").write_text("a") and d / "x.csv", "unsupported file type"),
    (lambda d: (d / "empty").mkdir() or d / "empty", "no .txt"),
    (lambda d: (d / "x.jsonl").write_text('{"body": "a"}\n') and d / "x.jsonl", "no string field 'text'"),
    (lambda d: (d / "x.jsonl").write_text('{"text": "a"}\n{oops\n') and d / "x.jsonl", "line 2 is not JSON"),
    (lambda d: pq.write_table(pa.table({"body": ["a"]}), d / "x.parquet") or d / "x.parquet", "no column 'text'"),
    (lambda d: (d / "one.txt").write_text("only one document") and d / "one.txt", "at least 2"),
])
def test_bad_source_is_user_error(tmp_path, cache, make, problem):
    path = make(tmp_path)
    with pytest.raises(UserError, match=problem) as info:
        prepare_dataset(str(path), cache_dir=cache, progress=False)
    assert str(path.name) in str(info.value) and "\n" not in str(info.value)


def _damaged_parquet(path):
    """A parquet file whose footer is intact and whose first data page is overwritten."""
    pq.write_table(pa.table({"text": ["hello world " * 100] * 1000}), path)
    data = bytearray(path.read_bytes())
    data[100:400] = b"U" * 300
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("make, problem", [
    (lambda d: (d / "x.parquet").write_text("junk\n") and d / "x.parquet", "not a parquet file ("),
    (lambda d: pq.write_table(pa.table({"text": [1, 2, 3]}), d / "x.parquet") or d / "x.parquet",
     "column 'text' must hold strings, got int64"),
    (lambda d: _damaged_parquet(d / "x.parquet") or d / "x.parquet", "a damaged parquet file ("),
])
@pytest.mark.parametrize("in_folder", [False, True])
def test_a_parquet_file_that_is_not_parquet_or_not_text_is_one_line_naming_it(tmp_path, cache, make, problem,
                                                                              in_folder):
    (tmp_path / "corpus").mkdir()
    path = make(tmp_path / "corpus")
    (tmp_path / "corpus" / "a.txt").write_text("a document beside it")
    with pytest.raises(UserError) as info:
        prepare_dataset(str(path.parent if in_folder else path), cache_dir=cache, progress=False)
    assert str(info.value).startswith(f"source '{path}': {problem}") and "\n" not in str(info.value)
    assert [p for p in cache.iterdir() if not p.name.endswith(".lock")] == []


def test_bad_settings_are_user_errors(corpus, cache):
    for fraction in (0.0, 1.0, -0.1):
        with pytest.raises(UserError, match="val_fraction"):
            prepare_dataset(str(corpus), cache_dir=cache, val_fraction=fraction, progress=False)
    with pytest.raises(UserError, match="hf:NAME"):
        get_source("hf:")


@pytest.mark.parametrize("make", [lambda d: os.mkfifo(d / "fifo") or d / "fifo", lambda d: Path("/dev/zero")])
def test_a_fifo_or_device_as_source_is_not_a_regular_file_or_folder(tmp_path, make):
    path = make(tmp_path)
    with pytest.raises(UserError, match=rf"^source '{path}': not a regular file or folder$"):
        get_source(str(path))


@pytest.mark.parametrize("spec, empty", [("hf:", "NAME"), ("hf:@test", "NAME"),
                                         ("hf:org/corpus@", "SPLIT after '@'"),
                                         ("hf:org/corpus:@test", "CONFIG after ':'")])
def test_an_hf_source_with_an_empty_part_is_refused_naming_the_form(spec, empty):
    with pytest.raises(UserError, match=re.escape(f"source '{spec}': expected hf:NAME[:CONFIG][@SPLIT], and "
                                                  f"{empty} is empty")):
        get_source(spec)


def test_hf_source_through_datasets(monkeypatch, cache):
    import datasets
    calls = []

    def fake_load(name, config, split):
        calls.append((name, config, split))
        if name == "missing/dataset":
            raise FileNotFoundError("Couldn't find a dataset script or data file")
        return datasets.Dataset.from_dict({"text": [_doc(i) for i in range(12)], "id": list(range(12))})

    monkeypatch.setattr(datasets, "load_dataset", fake_load)
    ds = prepare_dataset("hf:org/corpus:cfg@validation", cache_dir=cache, val_fraction=0.3, progress=False)
    assert calls[0] == ("org/corpus", "cfg", "validation")
    assert sorted(split_documents(ds, "train") + split_documents(ds, "val")) == sorted(_doc(i) for i in range(12))
    with pytest.raises(UserError, match="hf:missing/dataset.*cannot load"):
        prepare_dataset("hf:missing/dataset", cache_dir=cache, progress=False)


# ---------------------------------------------------------------- shards, cache, split


def test_second_prepare_is_cached_noop(corpus, cache, monkeypatch):
    first = prepare_dataset(str(corpus), cache_dir=cache, val_fraction=0.2, progress=False)
    assert not first.cached
    mtimes = {p.name: p.stat().st_mtime_ns for p in first.path.iterdir()}

    def fail(*args, **kwargs):
        raise AssertionError("tokenized again")

    monkeypatch.setattr(prepare_module, "_tokenize", fail)
    second = prepare_dataset(str(corpus), cache_dir=cache, val_fraction=0.2, progress=False)
    assert second.cached and second.path == first.path
    assert {p.name: p.stat().st_mtime_ns for p in second.path.iterdir()} == mtimes
    np.testing.assert_array_equal(second.train_tokens, first.train_tokens)


def test_cache_key_follows_content_and_settings(corpus, cache):
    a = prepare_dataset(str(corpus), cache_dir=cache, val_fraction=0.2, progress=False)
    b = prepare_dataset(str(corpus), cache_dir=cache, val_fraction=0.3, progress=False)
    (corpus / "sub" / "00.txt").write_text("new text")
    c = prepare_dataset(str(corpus), cache_dir=cache, val_fraction=0.2, progress=False)
    assert len({a.path, b.path, c.path}) == 3 and not c.cached


def test_cache_dir_from_environment(corpus, tmp_path, monkeypatch):
    monkeypatch.setenv("K3LAB_DATA_DIR", str(tmp_path / "env-cache"))
    ds = prepare_dataset(str(corpus), val_fraction=0.2, progress=False)
    assert ds.path.parent == tmp_path / "env-cache"


def test_split_by_document_is_deterministic_and_disjoint(corpus, tmp_path):
    a = prepare_dataset(str(corpus), cache_dir=tmp_path / "c1", val_fraction=0.2, progress=False)
    b = prepare_dataset(str(corpus), cache_dir=tmp_path / "c2", val_fraction=0.2, progress=False)
    np.testing.assert_array_equal(a.train_tokens, b.train_tokens)
    np.testing.assert_array_equal(a.val_tokens, b.val_tokens)
    train, val = split_documents(a, "train"), split_documents(a, "val")
    assert train and val and not set(train) & set(val)
    assert sorted(train + val) == sorted(_doc(i) for i in range(60))  # whole documents, none lost
    bigger = prepare_dataset(str(corpus), cache_dir=tmp_path / "c3", val_fraction=0.4, progress=False)
    assert set(val) < set(split_documents(bigger, "val"))  # a larger fraction only adds documents


def test_manifest_counts(corpus, cache):
    ds = prepare_dataset(str(corpus), cache_dir=cache, val_fraction=0.2, progress=False)
    on_disk = json.loads((ds.path / "manifest.json").read_text())
    assert on_disk == ds.manifest and on_disk["fingerprint"] == get_source(str(corpus)).fingerprint()
    for split in ("train", "val"):
        info, docs = on_disk["splits"][split], split_documents(ds, split)
        assert info["tokens"] == len(ds.tokens(split)) == sum(s["tokens"] for s in info["shards"])
        assert info["documents"] == len(docs) == int((ds.tokens(split) == ds.eot_id).sum())
        assert info["bytes"] == sum(len(d.encode()) for d in docs)
    assert ds.train_tokens.dtype == np.uint16 and ds.train_tokens[-1] == ds.eot_id


def test_tokens_are_memory_mapped_read_only(corpus, cache):
    tokens = prepare_dataset(str(corpus), cache_dir=cache, val_fraction=0.2, progress=False).train_tokens
    assert not tokens.flags.owndata and not tokens.flags.writeable
    with pytest.raises(ValueError):
        tokens[0] = 1


def test_many_shards_read_as_one_array(corpus, tmp_path):
    one = prepare_dataset(str(corpus), cache_dir=tmp_path / "c1", val_fraction=0.2, progress=False)
    many = prepare_dataset(str(corpus), cache_dir=tmp_path / "c2", val_fraction=0.2, progress=False,
                           shard_tokens=200)
    assert len(many.manifest["splits"]["train"]["shards"]) > 3
    assert len(list(many.path.glob("train-*.arrow"))) == len(many.manifest["splits"]["train"]["shards"])
    np.testing.assert_array_equal(many.train_tokens, one.train_tokens)


def test_tiny_corpus_gets_one_document_per_split(tmp_path, cache):
    (tmp_path / "two").mkdir()
    for name in ("a", "b"):
        (tmp_path / "two" / f"{name}.txt").write_text(f"text of {name}")
    ds = prepare_dataset(str(tmp_path / "two"), cache_dir=cache, val_fraction=0.01, progress=False)
    assert {s: ds.manifest["splits"][s]["documents"] for s in ("train", "val")} == {"train": 1, "val": 1}
    assert sorted(split_documents(ds, "train") + split_documents(ds, "val")) == ["text of a", "text of b"]


@pytest.mark.parametrize("error", [RuntimeError, KeyboardInterrupt])
def test_failure_midway_leaves_nothing(corpus, cache, monkeypatch, error):
    original, calls = ByteTokenizer.encode_batch, []

    def flaky(self, texts):
        calls.append(len(texts))
        if len(calls) == 2:
            raise error("boom")
        return original(self, texts)

    monkeypatch.setattr(prepare_module, "BATCH_DOCUMENTS", 8)  # several batches, so it fails midway
    monkeypatch.setattr(ByteTokenizer, "encode_batch", flaky)
    with pytest.raises(error):
        prepare_dataset(str(corpus), cache_dir=cache, val_fraction=0.2, progress=False)
    assert len(calls) == 2
    assert [p for p in cache.iterdir() if not p.name.endswith(".lock")] == []
    monkeypatch.setattr(ByteTokenizer, "encode_batch", original)
    assert not prepare_dataset(str(corpus), cache_dir=cache, val_fraction=0.2, progress=False).cached


def test_stale_temp_dir_is_cleaned(corpus, cache):
    ds = prepare_dataset(str(corpus), cache_dir=cache, val_fraction=0.2, progress=False)
    name = ds.path.name
    stale = cache / f".tmp-{name}-999-dead"
    stale.mkdir()
    (stale / "train-00000.arrow").write_bytes(b"half")
    for p in ds.path.iterdir():
        p.unlink()
    ds.path.rmdir()
    prepare_dataset(str(corpus), cache_dir=cache, val_fraction=0.2, progress=False)
    assert not stale.exists()


def test_concurrent_prepares_build_once(corpus, cache, monkeypatch):
    original, batches = ByteTokenizer.encode_batch, []

    def slow(self, texts):  # long enough that the three calls overlap
        batches.append(len(texts))
        time.sleep(0.02)
        return original(self, texts)

    monkeypatch.setattr(prepare_module, "BATCH_DOCUMENTS", 8)
    monkeypatch.setattr(ByteTokenizer, "encode_batch", slow)
    results = []
    threads = [threading.Thread(target=lambda: results.append(
        prepare_dataset(str(corpus), cache_dir=cache, val_fraction=0.2, progress=False))) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(r.cached for r in results) == [False, True, True]
    assert sum(batches) == 60  # the corpus was tokenized once


def test_info_and_listing(corpus, cache):
    assert load_dataset_info(str(corpus), cache_dir=cache, val_fraction=0.2) is None
    ds = prepare_dataset(str(corpus), cache_dir=cache, val_fraction=0.2, progress=False)
    assert load_dataset_info(str(corpus), cache_dir=cache, val_fraction=0.2).path == ds.path
    assert [d.path for d in list_datasets(cache)] == [ds.path]


def test_bits_per_byte(corpus, cache):
    ds = prepare_dataset(str(corpus), cache_dir=cache, val_fraction=0.2, progress=False)
    val = ds.manifest["splits"]["val"]
    assert ds.bits_per_byte(1.0) == pytest.approx(1.0 / math.log(2) * val["tokens"] / val["bytes"])
    assert val["tokens"] == val["bytes"] + val["documents"]  # byte tokenizer: one id per byte + eot


def test_stdlib_corpus(tmp_path):
    src = get_source("stdlib")
    assert src.fingerprint() == get_source("stdlib").fingerprint()
    ids = [path.relative_to(src.root).as_posix() for path in src.files()]
    assert "os.py" in ids and not any("site-packages" in i for i in ids)
    assert not any(part in ("test", "tests") for i in ids for part in i.split("/")[:-1])
    ds = prepare_dataset("stdlib", cache_dir=tmp_path, progress=False)
    assert ds.manifest["splits"]["train"]["bytes"] > 5_000_000
    assert ds.manifest["splits"]["val"]["documents"] >= 1
    x, y = BatchSampler(ds.train_tokens, 4, 256, seed=0).next_batch()
    assert x.shape == (4, 256) and int(x.max()) <= 256


# ---------------------------------------------------------------- sampler


@pytest.fixture
def tokens():
    return np.random.default_rng(0).integers(0, 257, size=50_000).astype(np.uint16)


def test_sampler_batches_are_shifted_windows(tokens):
    sampler = BatchSampler(tokens, batch_size=8, seq_len=64, seed=3)
    starts = sampler.starts(0)
    x, y = sampler.next_batch()
    assert x.dtype == torch.int64 and x.shape == y.shape == (8, 64) and x.is_contiguous()
    for row, start in enumerate(starts):
        np.testing.assert_array_equal(x[row].numpy(), tokens[start:start + 64])
        np.testing.assert_array_equal(y[row].numpy(), tokens[start + 1:start + 65])


def test_sampler_is_seeded(tokens):
    a, b, c = (BatchSampler(tokens, 4, 32, seed=s) for s in (1, 1, 2))
    for _ in range(3):
        xa, xb, xc = a.next_batch()[0], b.next_batch()[0], c.next_batch()[0]
        assert torch.equal(xa, xb) and not torch.equal(xa, xc)


def test_sampler_resume_continues_identically(tokens):
    original = BatchSampler(tokens, 4, 32, seed=7)
    for _ in range(5):
        original.next_batch()
    state = json.loads(json.dumps(original.state_dict()))  # survives a checkpoint round trip
    expected = [original.next_batch() for _ in range(3)]
    restored = BatchSampler(tokens, 4, 32, seed=0)
    restored.load_state_dict(state)
    for (x, y), (ex, ey) in zip((restored.next_batch() for _ in range(3)), expected):
        assert torch.equal(x, ex) and torch.equal(y, ey)
    with pytest.raises(ValueError, match="batch_size"):
        BatchSampler(tokens, 8, 32).load_state_dict(state)


def test_ranks_get_disjoint_slices_of_the_global_batch(tokens):
    ranks = [BatchSampler(tokens, 4, 32, seed=5, rank=r, world_size=2) for r in range(2)]
    single = BatchSampler(tokens, 8, 32, seed=5)
    for step in range(20):
        r0, r1 = ranks[0].starts(step), ranks[1].starts(step)
        assert not set(r0.tolist()) & set(r1.tolist())
        np.testing.assert_array_equal(np.concatenate([r0, r1]), single.starts(step))


def test_eval_batches_fixed_and_spread(tokens):
    a = BatchSampler(tokens, 4, 32, seed=1)
    b = BatchSampler(tokens, 4, 32, seed=2)
    a.next_batch()
    first, again, other = list(a.eval_batches(3)), list(a.eval_batches(3)), list(b.eval_batches(3))
    assert len(first) == 3
    for (x1, y1), (x2, y2), (x3, y3) in zip(first, again, other):
        assert torch.equal(x1, x2) and torch.equal(x1, x3) and torch.equal(y1, y3)
    np.testing.assert_array_equal(first[0][0][0].numpy(), tokens[:32])  # first window at the start
    np.testing.assert_array_equal(first[-1][1][-1].numpy(), tokens[-32:])  # last window at the end
    halves = [list(BatchSampler(tokens, 2, 32, rank=r, world_size=2).eval_batches(3)) for r in range(2)]
    for step in range(3):  # ranks split each global eval batch between them
        assert torch.equal(torch.cat([halves[0][step][0], halves[1][step][0]]), first[step][0])


def test_sampler_rejects_short_split():
    with pytest.raises(UserError, match="fewer than seq_len"):
        BatchSampler(np.zeros(10, dtype=np.uint16), 2, 16)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_next_batch_to_cuda(tokens):
    x, y = BatchSampler(tokens, 4, 32, seed=0).next_batch("cuda")
    assert x.is_cuda and torch.equal(x.cpu(), BatchSampler(tokens, 4, 32, seed=0).next_batch()[0])


# ---------------------------------------------------------------- CLI


def _cli(argv):
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.func(args)


def test_cli_prepare_and_info(corpus, cache, capsys):
    common = ["--cache-dir", str(cache), "--val-fraction", "0.2"]
    assert _cli(["data", "prepare", str(corpus), "--no-progress", *common]) == 0
    assert "prepared" in capsys.readouterr().out
    assert _cli(["data", "info", str(corpus), *common]) == 0
    out = capsys.readouterr().out
    train = load_dataset_info(str(corpus), cache_dir=cache, val_fraction=0.2).manifest["splits"]["train"]
    assert f"{train['tokens']:,}" in out and "fingerprint" in out
    assert _cli(["data", "info", str(corpus), "--cache-dir", str(cache)]) == 0  # any val fraction
    assert f"{train['tokens']:,}" in capsys.readouterr().out
    assert _cli(["data", "info", "--cache-dir", str(cache)]) == 0
    with pytest.raises(UserError, match="not prepared with val fraction 0.3"):
        _cli(["data", "info", str(corpus), "--cache-dir", str(cache), "--val-fraction", "0.3"])


@pytest.mark.parametrize("options, message", [
    (["--val-fraction", "5", "--tokenizer", "bpe:abc"], "val_fraction 5.0: must lie strictly between 0 and 1"),
    (["--tokenizer", "bpe:abc"], "tokenizer 'bpe:abc': expected bpe:VOCAB"),
    (["--tokenizer", "tokenizer:/no/such.json"], "tokenizer 'tokenizer:/no/such.json': no such file"),
])
@pytest.mark.parametrize("source", [[], ["stdlib"]])
def test_data_info_refuses_the_options_data_prepare_refuses(cache, options, message, source):
    with pytest.raises(UserError, match="^" + message) as prepare:
        _cli(["data", "prepare", *source, "--cache-dir", str(cache), *options])
    with pytest.raises(UserError, match="^" + message) as info:
        _cli(["data", "info", *source, "--cache-dir", str(cache), *options])
    assert str(info.value) == str(prepare.value) and not cache.exists()


@pytest.mark.parametrize("command", [["info"], ["info", "stdlib"], ["prepare", "stdlib"]])
@pytest.mark.parametrize("below", [False, True])
def test_a_cache_dir_that_is_a_file_is_one_line_naming_the_flag_or_the_variable(tmp_path, monkeypatch, command,
                                                                                 below):
    (tmp_path / "afile").write_text("")
    root = tmp_path / "afile" / "sub" if below else tmp_path / "afile"
    with pytest.raises(UserError) as flag:
        _cli(["data", *command, "--cache-dir", str(root)])
    assert str(flag.value) == f"--cache-dir {root}: {tmp_path / 'afile'} is a file, not a folder"
    monkeypatch.setenv("K3LAB_DATA_DIR", str(root))
    with pytest.raises(UserError) as variable:
        _cli(["data", *command])
    assert str(variable.value) == f"K3LAB_DATA_DIR {root}: {tmp_path / 'afile'} is a file, not a folder"
