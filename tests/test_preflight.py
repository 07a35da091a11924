"""What `k3lab sweep` and `k3lab train` check before any work starts, and the sweep's parent
MLflow run never left RUNNING, driven through the command line as a user runs it."""

import contextlib
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import attrs
import pytest
import torch
from conftest import sweep_args
from mlflow.tracking import MlflowClient

from k3lab.cli import main
from k3lab.registry import load_preset
from k3lab.registry.train_spec import TrainSpec
from k3lab.store import runs

pytestmark = pytest.mark.usefixtures("isolated_data")

REPO = Path(__file__).resolve().parents[1]


def unwritable_folder(tmp_path) -> Path:
    """A folder this process cannot write in: read-only permissions, or /sys for root (who ignores them)."""
    if os.geteuid() != 0:
        folder = tmp_path / "read-only"
        folder.mkdir()
        folder.chmod(0o555)
        return folder
    try:
        with tempfile.NamedTemporaryFile(dir="/sys"):
            pass
    except OSError:
        return Path("/sys")
    pytest.skip("no folder here that this process cannot write")


def one_line_error(capsys) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err


def test_train_with_an_unreachable_tracking_server_fails_in_seconds_in_one_line(tmp_path):
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "k3lab.cli", "train", "tiny", "--steps", "5",
                           "--tracking-uri", "http://127.0.0.1:9"], cwd=tmp_path, capture_output=True, text=True,
                          env=os.environ | {"PYTHONPATH": str(REPO)}, timeout=120)
    elapsed = time.monotonic() - started
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and "the MLflow server does not answer" in done.stderr
    assert elapsed < 20, f"took {elapsed:.1f} s"  # it sat for minutes retrying before the preflight
    assert not (tmp_path / "mlflow.db").exists()


@pytest.mark.parametrize("uri, message", [
    ("{tmp}/mlflow.db", "expected an MLflow server (http://host:5000) or a database (sqlite:///mlflow.db, "
                        "postgresql://user@host/db); for a SQLite file: sqlite:///{tmp}/mlflow.db"),
    ("file://{tmp}/mlruns", "expected an MLflow server"),
    ("sqlite://", "names no database file"),
    ("sqlite:///{tmp}", "{tmp} is a folder, not a database file"),
    ("sqlite:///{tmp}/notes.txt", "{tmp}/notes.txt is not an SQLite database"),
    ("mysql+nosuchdriver://u@h/db", "not a database URL SQLAlchemy reads"),
])
def test_a_tracking_uri_mlflow_cannot_use_is_refused_in_one_line_before_anything_is_written(
        tmp_path, sweep_file, capsys, uri, message):
    (tmp_path / "notes.txt").write_text("not a database")
    uri, message = uri.format(tmp=tmp_path), message.format(tmp=tmp_path)
    assert main(sweep_args(tmp_path, sweep_file, "--tracking-uri", uri)) == 2
    err = one_line_error(capsys)
    assert err.startswith(f"error: --tracking-uri {uri}: ") and message in err
    assert not {"runs", "mlflow.db", "mlartifacts"} & {p.name for p in tmp_path.iterdir()}  # nothing written


@pytest.mark.parametrize("setting, message", [
    ("dataset: no_such_corpus", "train.dataset: source 'no_such_corpus': no such file or directory"),
    ("tokenizer: 'bpe:3'", "train.tokenizer: tokenizer 'bpe:3': expected bpe:VOCAB with VOCAB >= 260"),
    ("tokenizer: 'tokenizer:/no/such.json'", "train.tokenizer: tokenizer 'tokenizer:/no/such.json': no such file"),
])
@pytest.mark.parametrize("dry_run", [True, False])
def test_a_corpus_or_tokenizer_this_machine_lacks_is_named_with_its_file_and_field_before_anything_starts(
        tmp_path, capsys, setting, message, dry_run):
    from conftest import mini_sweep

    path = tmp_path / "mini.yaml"
    path.write_text(mini_sweep("mini", "x").replace("eval_batches: 1,", f"eval_batches: 1, {setting},"))
    assert main(sweep_args(tmp_path, path, *(["--dry-run"] if dry_run else []))) == 2
    assert one_line_error(capsys).startswith(f"error: {path}: {message}")
    assert not (tmp_path / "runs").exists() and not (tmp_path / "mlflow.db").exists()


def small_corpus(tmp_path) -> Path:
    """50 one-line documents: 2% of them (1) for validation, 24 tokens, fewer than seq_len 32 + 1."""
    corpus = tmp_path / "small"
    corpus.mkdir()
    for i in range(1, 51):
        (corpus / f"d{i}.txt").write_text(f"doc {i} some words here\n")
    return corpus


VAL_TOO_SHORT = "its val split has 24 tokens, fewer than train.seq_len + 1 = 33 (a larger corpus or a shorter seq_len)"


def test_a_prepared_corpus_whose_split_is_shorter_than_seq_len_stops_the_sweep_before_it_starts(tmp_path, capsys):
    from conftest import mini_sweep

    from k3lab.data import prepare_dataset

    corpus = small_corpus(tmp_path)
    prepare_dataset(str(corpus), progress=False)
    path = tmp_path / "mini.yaml"
    path.write_text(mini_sweep("mini", "x").replace("eval_batches: 1,", f"eval_batches: 1, dataset: '{corpus}',"))
    assert main(sweep_args(tmp_path, path)) == 2
    assert one_line_error(capsys) == f"error: {path}: train.dataset {corpus}: {VAL_TOO_SHORT}\n"
    assert not (tmp_path / "runs").exists() and not (tmp_path / "mlflow.db").exists()


def test_train_on_a_corpus_whose_split_is_shorter_than_seq_len_is_refused_before_training(tmp_path, capsys):
    corpus = small_corpus(tmp_path)
    assert main(["train", "tiny", "--steps", "2", "--no-tracking", "--device", "cpu",
                 "--set", f"train.dataset={corpus}", "--set", "train.seq_len=32"]) == 2
    err = capsys.readouterr().err  # the corpus' tokenizing progress, then the error
    assert err.splitlines()[-1] == f"error: train.dataset {corpus}: {VAL_TOO_SHORT}" and "Traceback" not in err


BPE_TOO_LARGE = r"variant \S+: vocab_size: the tokenizer has 4096 ids, more than the model's vocab_size=320$"


@pytest.mark.parametrize("dry_run", [True, False])
def test_a_bpe_vocabulary_larger_than_the_models_stops_a_sweep_before_any_data_work(tmp_path, monkeypatch, capsys,
                                                                                     dry_run):
    from conftest import mini_sweep

    monkeypatch.setenv("K3LAB_DATA_DIR", str(tmp_path / "data"))
    path = tmp_path / "mini.yaml"
    path.write_text(mini_sweep("mini", "x").replace("eval_batches: 1,", "eval_batches: 1, tokenizer: 'bpe:4096',"))
    assert main(sweep_args(tmp_path, path, *(["--dry-run"] if dry_run else []))) == 2
    assert re.match(f"error: {re.escape(str(path))}: {BPE_TOO_LARGE}", one_line_error(capsys))
    assert not (tmp_path / "data").exists() and not (tmp_path / "runs").exists()


def test_train_with_a_bpe_vocabulary_larger_than_the_models_stops_before_any_data_work(tmp_path, monkeypatch,
                                                                                        capsys):
    monkeypatch.setenv("K3LAB_DATA_DIR", str(tmp_path / "data"))
    assert main(["train", "tiny", "--steps", "2", "--no-tracking", "--device", "cpu",
                 "--set", "train.tokenizer=bpe:4096"]) == 2
    assert one_line_error(capsys) == "error: vocab_size: the tokenizer has 4096 ids, more than the model's " \
                                     "vocab_size=320\n"
    assert not (tmp_path / "data").exists()


def test_the_tracking_uri_in_the_environment_is_checked_and_named(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", str(tmp_path / "mlflow.db"))
    assert main(["train", "tiny", "--steps", "2"]) == 2
    assert one_line_error(capsys).startswith(f"error: MLFLOW_TRACKING_URI {tmp_path / 'mlflow.db'}: expected")


def test_sweep_into_an_unwritable_storage_folder_stops_before_any_mlflow_run(tmp_path, sweep_file, capsys):
    storage = unwritable_folder(tmp_path) / "k3lab_runs"
    assert main(sweep_args(tmp_path, sweep_file, storage=storage)) == 2
    err = one_line_error(capsys)
    assert f"storage folder {storage}: cannot write" in err
    assert not (tmp_path / "mlflow.db").exists()  # no parent run opened, so none left RUNNING


def test_sweep_storage_below_a_file_is_reported_in_one_line(tmp_path, sweep_file, capsys):
    (tmp_path / "file").write_text("")
    assert main(sweep_args(tmp_path, sweep_file, storage=tmp_path / "file" / "runs")) == 2
    assert "is a file, not a folder" in one_line_error(capsys)
    assert not (tmp_path / "mlflow.db").exists()


def test_train_into_an_unwritable_mlflow_folder_is_reported_before_training(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)  # k3lab train writes its log below the working folder
    store = unwritable_folder(tmp_path) / "store"
    assert main(["train", "tiny", "--steps", "2", "--tracking-uri", f"sqlite:///{store / 'mlflow.db'}"]) == 2
    assert f"MLflow store folder {store}: cannot write" in one_line_error(capsys)


def test_unprepared_data_in_an_unwritable_cache_is_reported_in_one_line(tmp_path, sweep_file, monkeypatch, capsys):
    cache = unwritable_folder(tmp_path) / "data"
    monkeypatch.setenv("K3LAB_DATA_DIR", str(cache))
    assert main(sweep_args(tmp_path, sweep_file)) == 2
    assert f"data cache {cache}: cannot write" in one_line_error(capsys)
    assert not (tmp_path / "mlflow.db").exists() and not (tmp_path / "runs").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks a machine without CUDA")
def test_gpu_profile_on_a_machine_without_cuda_is_reported_before_anything_starts(tmp_path, sweep_file, capsys):
    sweep_file.write_text(sweep_file.read_text() + "profiles:\n  gpu: {resources: {cpu: 1, gpu: 0.5}}\n")
    assert main(sweep_args(tmp_path, sweep_file, "--profile", "gpu")) == 2
    err = one_line_error(capsys)
    assert f"{sweep_file}: profile gpu: resources.gpu=0.5: this machine has no CUDA GPU" in err
    assert not (tmp_path / "mlflow.db").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks a machine without CUDA")
def test_train_on_cuda_without_a_gpu_is_reported_in_one_line(capsys):
    assert main(["train", "tiny", "--steps", "2", "--no-tracking", "--device", "cuda"]) == 2
    assert "--device cuda: this machine has no CUDA GPU" in one_line_error(capsys)


@pytest.mark.parametrize("device", ["meta", "mps", "xpu", "nosuch"])
def test_a_device_k3lab_does_not_train_on_is_one_line_naming_the_choices(capsys, device):
    assert main(["train", "tiny", "--steps", "2", "--no-tracking", "--device", device]) == 2
    assert f"--device {device}: expected cpu, cuda or cuda:N" in one_line_error(capsys)


def test_an_unanswered_server_from_mlflow_tracking_uri_is_named_by_the_variable(monkeypatch, capsys):
    """The server check named --tracking-uri for a URI the user never typed as a flag."""
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://")
    assert main(["train", "tiny", "--steps", "2"]) == 2
    assert one_line_error(capsys).startswith("error: MLFLOW_TRACKING_URI http://: the MLflow server does not answer")


@pytest.mark.parametrize("setting", ["train.batch_size=10000000", "hidden_size=100000000", "vocab_size=100000000000"])
def test_a_cpu_step_that_cannot_fit_in_memory_is_refused_before_training(capsys, setting):
    """Such steps were killed by the OOM killer (rc 137) or asked the allocator for 25.6 TB (floors of
    2.4, 7 and 70 TiB: beyond any machine the tests run on)."""
    assert main(["train", "tiny", "--steps", "2", "--no-tracking", "--device", "cpu", "--set", setting]) == 2
    err = one_line_error(capsys)
    assert "a training step needs at least" in err and "lower train.batch_size, train.seq_len or the model's size" in err


@pytest.mark.parametrize("dry_run", [True, False])
def test_a_sweep_whose_cpu_step_cannot_fit_is_refused_naming_the_variant_dry_run_or_not(tmp_path, capsys, dry_run):
    from conftest import mini_sweep

    path = tmp_path / "mini.yaml"
    path.write_text(mini_sweep("mini", "x").replace("batch_size: 2,", "batch_size: 100000000,"))
    assert main(sweep_args(tmp_path, path, *(["--dry-run"] if dry_run else []))) == 2
    err = one_line_error(capsys)
    assert err.startswith(f"error: {path}: variant ") and "a training step needs at least" in err
    assert not (tmp_path / "runs").exists() and not (tmp_path / "mlflow.db").exists()


def test_the_memory_floor_counts_weights_and_each_layers_saved_inputs():
    from k3lab.registry.counts import count
    from k3lab.runner.runtime.preflight import step_memory_floor

    config = load_preset("tiny")
    spec = TrainSpec(batch_size=8, seq_len=128)
    floor, _ = step_memory_floor(config, spec)
    activations = 8 * 128 * config.hidden_size * 2 * config.num_layers * 4
    assert floor == 12 * count(config, 128).total + activations
    assert step_memory_floor(config, attrs.evolve(spec, autocast="bfloat16"))[0] == floor - activations // 2


def parent_run(tmp_path):
    state = json.loads((tmp_path / "runs" / "mini.k3lab.json").read_text())
    return MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}").get_run(state["parent_run_id"])


def no_ray(monkeypatch):
    """Ray neither started nor asked for its resources: the sweep goes straight to its trials."""
    monkeypatch.setattr("k3lab.runner.tune.driver.ray_session", lambda run: contextlib.nullcontext())


def test_sweep_that_breaks_after_its_parent_run_opened_ends_it_failed(tmp_path, sweep_file, monkeypatch):
    def broken_ray(run, specs, callbacks, searcher=None):
        raise RuntimeError("Ray would not start")

    no_ray(monkeypatch)
    monkeypatch.setattr("k3lab.runner.tune.driver.make_tuner", broken_ray)
    with pytest.raises(RuntimeError, match="Ray would not start"):  # a bug keeps its traceback
        main(sweep_args(tmp_path, sweep_file))
    parent = parent_run(tmp_path)
    assert parent.info.status == "FAILED"
    assert parent.data.metrics["sweep_wall_s"] >= 0


def test_ctrl_c_after_the_parent_run_opened_ends_it_killed(tmp_path, sweep_file, monkeypatch, capsys):
    def interrupted(run, specs, callbacks, searcher=None):
        raise KeyboardInterrupt

    no_ray(monkeypatch)
    monkeypatch.setattr("k3lab.runner.tune.driver.make_tuner", interrupted)
    assert main(sweep_args(tmp_path, sweep_file)) == 130
    assert "interrupted" in capsys.readouterr().err
    assert parent_run(tmp_path).info.status == "KILLED"


def test_ctrl_c_that_tune_catches_ends_the_parent_stopped_not_failed(tmp_path, sweep_file, monkeypatch, capsys):
    class StoppedTuner:  # Tune catches the first Ctrl-C, saves its state and returns: no trial got to its end
        def __init__(self, run):
            run.tune_dir.mkdir(parents=True)  # where Tune keeps that state

        def fit(self):
            return []

    no_ray(monkeypatch)
    monkeypatch.setattr("k3lab.runner.tune.driver.make_tuner",
                        lambda run, specs, callbacks, searcher=None: StoppedTuner(run))
    assert main([*sweep_args(tmp_path, sweep_file), "--overwrite"]) == 130
    parent = parent_run(tmp_path)  # resumable, not failed: MLflow shows it FINISHED, k3lab reads it stopped
    assert parent.info.status == "FINISHED" and parent.data.tags[runs.STATUS] == runs.STOPPED
    hint = next(line for line in capsys.readouterr().err.splitlines() if line.startswith("sweep stopped"))
    assert hint.endswith(" --resume`") and "--overwrite" not in hint and str(sweep_file) in hint


def test_ctrl_c_ends_the_trial_runs_it_left_running_killed(tmp_path, sweep_file, monkeypatch):
    from k3lab.store.tracking import MLflowTracker

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    started = {}

    class StoppedTuner:  # a trial had opened its run when Ctrl-C stopped the sweep (Ray kills it)
        def __init__(self, specs):
            spec = next(iter(specs.values()))
            started["trial"] = MLflowTracker.start(uri, spec.experiment, spec.name, parent_run_id=spec.parent_run_id)

        def fit(self):
            return []

    no_ray(monkeypatch)
    monkeypatch.setattr("k3lab.runner.tune.driver.make_tuner",
                        lambda run, specs, callbacks, searcher=None: StoppedTuner(specs))
    assert main(sweep_args(tmp_path, sweep_file)) == 130
    assert MlflowClient(uri).get_run(started["trial"].run_id).info.status == "KILLED"
    assert parent_run(tmp_path).info.status == "KILLED"


def test_sweep_whose_trial_needs_more_than_the_ray_cluster_has_stops_before_any_run(tmp_path, sweep_file, capsys):
    """Ray would keep such a trial pending for ever; the check runs once Ray is up, before MLflow."""
    sweep_file.write_text(sweep_file.read_text().replace("resources: {cpu: 1", "resources: {cpu: 4096"))
    assert main(sweep_args(tmp_path, sweep_file)) == 2
    err = one_line_error(capsys)
    assert f"{sweep_file}: resources.cpu: one trial needs 4096 CPUs and the Ray cluster has" in err
    assert not (tmp_path / "mlflow.db").exists()


def test_a_sweep_tokenizes_its_corpus_on_a_thread_after_every_check_has_passed(monkeypatch, tmp_path):
    import threading

    import k3lab.data
    from k3lab.errors import UserError
    from k3lab.registry.presets import load_preset
    from k3lab.registry.train_spec import TrainSpec
    from k3lab.runner.runtime.preflight import Preflight, run_preflight_overlapped

    release, started = threading.Event(), []

    def slow_prepare(source, tokenizer, progress):
        started.append(threading.current_thread().name)
        release.wait(10)
        return f"prepared {source}"

    monkeypatch.setenv("K3LAB_DATA_DIR", str(tmp_path / "empty"))  # the corpus is not prepared yet
    monkeypatch.setattr(k3lab.data, "prepare_dataset", slow_prepare)
    tiny, spec = load_preset("tiny"), TrainSpec(seq_len=64)
    too_small = tiny.replace(vocab_size=200)  # the byte tokenizer has 257 ids
    with pytest.raises(UserError, match=r"variant v: vocab_size: the tokenizer has 257 ids"):
        run_preflight_overlapped(Preflight(tracking_uri=None, train=spec, models={"variant v": too_small}))
    assert started == []  # a model that cannot train stops it before any tokenizing
    pending = run_preflight_overlapped(Preflight(tracking_uri=None, train=spec, models={"": tiny}, progress=False))
    assert not pending.ready()  # returned while the corpus is being tokenized
    release.set()
    assert pending.result() == "prepared stdlib" and started == ["k3lab-data"]


def test_an_error_while_tokenizing_on_the_thread_reaches_the_sweep(monkeypatch, tmp_path):
    import k3lab.data
    from k3lab.errors import UserError
    from k3lab.registry.presets import load_preset
    from k3lab.registry.train_spec import TrainSpec
    from k3lab.runner.runtime.preflight import Preflight, run_preflight_overlapped

    def failing_prepare(source, tokenizer, progress):
        raise UserError("source 'stdlib': 1 non-empty document(s)")

    monkeypatch.setenv("K3LAB_DATA_DIR", str(tmp_path / "empty"))
    monkeypatch.setattr(k3lab.data, "prepare_dataset", failing_prepare)
    pending = run_preflight_overlapped(Preflight(tracking_uri=None, train=TrainSpec(seq_len=64),
                                                 models={"": load_preset("tiny")}, progress=False))
    with pytest.raises(UserError, match="1 non-empty document"):
        pending.result()


def damaged_store(path: Path, how: str) -> bytes:
    """An SQLite file of ~100 pages, cut short (a copy that stopped) or with pages overwritten."""
    import sqlite3

    with contextlib.closing(sqlite3.connect(path)) as db:
        db.execute("CREATE TABLE runs (id INTEGER PRIMARY KEY, name TEXT)")
        db.executemany("INSERT INTO runs (name) VALUES (?)", [("x" * 200,)] * 2000)
        db.execute("CREATE INDEX by_name ON runs (name)")
        db.commit()
    data = path.read_bytes()
    data = data[:len(data) // 2] if how == "truncated" else data[:8192] + b"\xff" * 16384 + data[8192 + 16384:]
    path.write_bytes(data)
    return data


@pytest.mark.parametrize("how", ["truncated", "overwritten"])
@pytest.mark.parametrize("command", [["report"], ["sweep", "--resume"]])
def test_a_malformed_sqlite_store_is_one_line_naming_the_file_and_is_left_as_it_was(tmp_path, sweep_file, capsys,
                                                                                   how, command):
    """MLflow failed on a damaged store with a SQLAlchemy traceback ("database disk image is malformed")."""
    store = tmp_path / "mlflow.db"
    data = damaged_store(store, how)
    args = [command[0], str(sweep_file), "--storage", str(tmp_path / "runs"), "--tracking-uri", f"sqlite:///{store}",
            *command[1:]]
    assert main(args) == 2
    err = one_line_error(capsys)
    assert err.startswith(f"error: --tracking-uri sqlite:///{store}: {store} is not a readable SQLite database (")
    assert "malformed" in err
    assert store.read_bytes() == data and sorted(p.name for p in tmp_path.iterdir()) == ["mini.yaml", "mlflow.db"]


def test_the_sqlite_store_check_reads_a_healthy_store_quickly_and_writes_nothing(tmp_path):
    import sqlite3

    from k3lab.store.tracking import sqlite_damage

    store = tmp_path / "mlflow.db"
    with contextlib.closing(sqlite3.connect(store)) as db:
        db.execute("CREATE TABLE runs (id INTEGER PRIMARY KEY, name TEXT)")
        db.executemany("INSERT INTO runs (name) VALUES (?)", [("x" * 200,)] * 50000)
        db.commit()
    before, started = store.read_bytes(), time.monotonic()
    assert sqlite_damage(store) is None
    assert time.monotonic() - started < 1
    assert store.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ["mlflow.db"]


def test_report_on_an_empty_store_file_is_one_line_and_leaves_the_file_empty(tmp_path, sweep_file, capsys):
    """MLflow created its tables in a 0-byte file ("Creating initial MLflow database tables...")
    before the report said the run was not there."""
    store = tmp_path / "mlflow.db"
    store.touch()
    args = ["report", str(sweep_file), "--storage", str(tmp_path / "runs"), "--tracking-uri", f"sqlite:///{store}"]
    assert main(args) == 2
    assert one_line_error(capsys) == (f"error: {sweep_file}: {store} holds no MLflow store (--tracking-uri "
                                      f"sqlite:///{store}), and no run of mini under {tmp_path / 'runs'}\n")
    assert store.stat().st_size == 0 and sorted(p.name for p in tmp_path.iterdir()) == ["mini.yaml", "mlflow.db"]
