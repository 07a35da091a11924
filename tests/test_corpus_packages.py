"""The `packages` corpus (every installed package's source and docs, k3lab.data.packages), the
epochs a trial trains (data.epochs) and the plan's note on sweeps whose trials repeat data."""

import os
from pathlib import Path

import pytest
from conftest import mini_sweep

import k3lab.data.packages as packages
from k3lab.cli import main
from k3lab.data import prepare_dataset
from k3lab.data.epochs import train_split_tokens
from k3lab.data.sources import StdlibSource, get_source
from k3lab.data.split import assign
from k3lab.registry import load_sweep
from k3lab.registry.plan import plan_lines


@pytest.fixture
def site(tmp_path, monkeypatch):
    """A small site-packages folder standing in for the environment's."""
    root = tmp_path / "site-packages"
    files = {
        "alpha/__init__.py": "from alpha.core import run\n",
        "alpha/core.py": "def run():\n    return 42\n" * 20,
        "alpha/README.md": "# alpha\n\nRuns things.\n",
        "alpha/docs/guide.rst": "Guide\n=====\n\nUse it.\n",
        "alpha/LICENSE.txt": "MIT License\n\nPermission is hereby granted...\n",
        "beta/LICENSE.txt": "MIT License\n\nPermission is hereby granted...\n",  # the same text: one document
        "beta/vendored/core.py": "def run():\n    return 42\n" * 20,  # a vendored copy: one document
        "beta/tables.txt": "x" * 5000,  # over the size cap set below
        "beta/blob.txt": "text\0with a NUL byte",  # binary data with a text suffix
        "beta/beta.py": "print('beta')\n",
        "beta/data.json": "{}",  # not a text suffix
        "alpha/__pycache__/core.cpython-311.py": "cached",
        "alpha-1.0.dist-info/METADATA.txt": "Name: alpha",
    }
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    monkeypatch.setattr(packages, "site_packages", lambda: [root.resolve()])
    monkeypatch.setattr(packages, "MAX_DOCUMENT_BYTES", 4000)
    return root


def test_the_walk_lists_what_os_walk_finds_with_its_stats_sorted_by_path(site):
    (site / "linked.py").symlink_to(site / "beta" / "beta.py")  # a link to a file counts
    (site / "linked_dir").symlink_to(site / "alpha", target_is_directory=True)  # a link to a folder is not followed
    (site / "broken.py").symlink_to(site / "nowhere.py")
    expected = []
    for folder, dirnames, filenames in os.walk(site):  # the rule the walk keeps, os.walk's way
        dirnames[:] = [d for d in dirnames if d != "__pycache__" and not d.endswith(packages.METADATA_SUFFIXES)]
        for name in filenames:
            path = Path(folder, name)
            if name.endswith(packages.PACKAGE_SUFFIXES) and path.is_file():
                info = path.stat()
                expected.append((path.relative_to(site).as_posix(), info.st_size, info.st_mtime_ns))
    listed = packages.candidate_files(site)
    assert listed == sorted(expected)
    assert "linked.py" in [path for path, _, _ in listed] and not any(p.startswith("linked_dir/") for p, _, _ in listed)


def test_one_document_per_file_deduplicated_without_metadata_caches_or_binaries(site):
    source = get_source("packages")
    ids = [doc.id for doc in source.documents()]
    assert ids == ["alpha/LICENSE.txt", "alpha/README.md", "alpha/__init__.py", "alpha/core.py", "alpha/docs/guide.rst",
                   "beta/beta.py"]
    assert source.spec == "packages" and source.count() == 10  # candidates, before the duplicates go


def test_the_fingerprint_follows_installs(site):
    before = get_source("packages").fingerprint()
    assert get_source("packages").fingerprint() == before
    (site / "gamma.py").write_text("import alpha\n")
    assert get_source("packages").fingerprint() != before


def test_it_prepares_and_splits_by_the_hash_of_each_document_id(site, tmp_path):
    dataset = prepare_dataset("packages", cache_dir=tmp_path / "cache", val_fraction=0.3, progress=False)
    splits = dataset.manifest["splits"]
    assert splits["train"]["documents"] + splits["val"]["documents"] == 6
    ids = [doc.id for doc in get_source("packages").documents()]
    expected_val = sum(assign(i, 0.3) == "val" for i in ids)
    assert splits["val"]["documents"] in (expected_val, 1)  # 1: a split the rule left empty gets one
    assert dataset.manifest["source"] == "packages"
    tokens, exact = train_split_tokens("packages", cache_dir=tmp_path / "cache", val_fraction=0.3)
    assert exact and tokens == splits["train"]["tokens"] == len(dataset.train_tokens)


def test_the_environment_corpus_is_far_larger_than_the_standard_library():
    source = packages.PackagesSource()
    stdlib_bytes = sum(p.stat().st_size for p in StdlibSource().files())
    assert source.count() > 1000
    assert source.total_bytes() > 5 * stdlib_bytes  # torch, ray, mlflow: hundreds of MB here
    assert source.total_bytes() * 0.98 > 10_485_760  # one attnres_block gpu trial never sees a token twice


def test_the_plan_says_when_trials_would_repeat_data(tmp_path, isolated_data):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for i in range(20):
        (corpus / f"doc{i}.txt").write_text(f"document {i} " * 20)
    text = mini_sweep("rep", "x").replace("eval_batches: 1,", f"eval_batches: 1, dataset: {corpus},")
    path = tmp_path / "rep.yaml"
    path.write_text(text.replace("steps: 8,", "steps: 200,"))
    lines = plan_lines(load_sweep(path))  # not prepared yet: an estimate from the files
    assert any("about" in line and "epochs of" in line and "may repeat data" in line for line in lines)
    prepare_dataset(str(corpus), progress=False)
    lines = plan_lines(load_sweep(path))
    note = next(line for line in lines if "epochs of" in line)
    assert note.startswith("note: data: a trial trains 12,800 tokens, ") and "the trials repeat data" in note
    path.write_text(text)  # 8 steps: no repeat, no note
    assert not any("epochs of" in line for line in plan_lines(load_sweep(path)))


def test_data_epochs_of_a_trial(isolated_data):
    from k3lab.registry import TrainSpec
    from k3lab.runner.tune.trial import data_params

    class Trainer:  # what data_params reads of a trainer
        spec = TrainSpec(steps=10, batch_size=2, seq_len=32, warmup_steps=1)
        tokens_per_step = 64

        class dataset:
            train_tokens = [0] * 320

    assert data_params(Trainer()) == {"data.epochs": 2.0, "data.train_tokens": 320}


def test_data_info_lists_the_packages_source_in_its_help(capsys):
    with pytest.raises(SystemExit):
        main(["data", "prepare", "--help"])
    assert "'packages'" in capsys.readouterr().out


def test_a_bpe_tokenizer_trained_on_the_training_split_is_cached_beside_the_tokens(site, tmp_path):
    pytest.importorskip("tokenizers")
    from k3lab.data import find_datasets, load_dataset_info
    from k3lab.data.bpe import bpe_path

    cache = tmp_path / "cache"
    assert load_dataset_info("packages", "bpe:300", cache_dir=cache) is None  # not trained: not prepared
    dataset = prepare_dataset("packages", "bpe:300", cache_dir=cache, val_fraction=0.3, progress=False)
    path = bpe_path("bpe:300", get_source("packages"), 0.3, cache)
    assert path.exists() and path.parent.parent == cache / "tokenizers"
    assert dataset.vocab_size == 300 and dataset.eot_id == dataset.tokenizer.encode("<|endoftext|>")[0]
    text = "def run():\n    return 42\n"
    assert dataset.tokenizer.decode(dataset.tokenizer.encode(text)) == text
    assert len(dataset.tokenizer.encode(text)) < len(text.encode())  # merges learnt
    again = prepare_dataset("packages", "bpe:300", cache_dir=cache, val_fraction=0.3, progress=False)
    assert again.cached and again.path == dataset.path  # trained once, tokenized once
    assert [d.path for d in find_datasets("packages", "bpe:300", cache)] == [dataset.path]
    with pytest.raises(Exception, match="bpe:VOCAB with VOCAB >= 260"):
        prepare_dataset("packages", "bpe:12", cache_dir=cache, progress=False)
