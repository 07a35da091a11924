"""Preflight: what `k3lab sweep` and `k3lab train` need, checked before any work starts.

    dataset = run_preflight(Preflight(tracking_uri=..., train=..., models=...))

Both commands run it before they open an MLflow run or start Ray. In order: the
tracking server answers (within seconds), the folders k3lab will write are
writable (storage, MLflow store and artifacts, data cache), the GPUs and FLA
kernels the trials need are on this machine (not checked for a Ray cluster,
whose workers may differ), the data is prepared (tokenized here, once), and every
model fits the data. A problem is a one-line `UserError` naming what and where.
"""

from __future__ import annotations

import importlib.util
import os
import tempfile
import threading
from pathlib import Path

import attrs

from k3lab.data import Dataset
from k3lab.errors import UserError
from k3lab.model.config import KimiK3Config
from k3lab.registry.train_spec import TrainSpec
from k3lab.store.tracking import artifact_folder_for, sqlite_path

TRACKING_TIMEOUT_S = 3.0  # an MLflow server answers /health in milliseconds


@attrs.frozen
class Preflight:
    """What a command is about to use."""

    tracking_uri: str | None  # None: no tracking
    train: TrainSpec
    models: dict[str, KimiK3Config]  # message prefix ("x.yaml: variant y", or "") -> model
    folders: dict[str, Path] = attrs.Factory(dict)  # what ("storage folder") -> a folder k3lab writes to
    gpus: float = 0.0  # CUDA GPUs one trial uses
    gpus_from: str = ""  # where that number comes from, for messages ("--device cuda")
    local: bool = True  # the trials run on this machine (not on a Ray cluster)
    progress: bool = True  # a progress bar while the data is tokenized
    train_from: str = ""  # where the train spec comes from, for messages ("x.yaml: ", or "")


def run_preflight(plan: Preflight) -> Dataset:
    """Every check, in order; returns the prepared dataset."""
    run_checks(plan)
    dataset = prepared_dataset(plan.train, plan.progress)
    check_prepared(plan, dataset)
    return dataset


def run_preflight_overlapped(plan: Preflight) -> "PendingDataset":
    """`run_preflight`, except that a corpus still to be tokenized is tokenized on a thread, so
    that its time overlaps what the caller does
    next (a sweep starts Ray). Every check is made first (among them the models against the
    vocabulary the tokenizer spec gives, `check_inputs`); a `bpe:` tokenizer is trained, and its
    corpus prepared, here, as by `run_preflight`."""
    run_checks(plan)
    from k3lab.data import cache_root, load_dataset_info, prepare_dataset
    from k3lab.data.bpe import is_bpe

    train = plan.train
    dataset = load_dataset_info(train.dataset, train.tokenizer)
    if dataset is None:
        check_writable("data cache", cache_root())
        if not is_bpe(train.tokenizer):
            return PendingDataset(prepare_dataset, train.dataset, train.tokenizer, progress=plan.progress)
        dataset = prepare_dataset(train.dataset, train.tokenizer, progress=plan.progress)
    check_prepared(plan, dataset)  # a corpus prepared earlier is refused before Ray starts
    return PendingDataset(lambda: dataset)


class PendingDataset:
    """`prepare(*args, **kwargs)` on a daemon thread; `result()` waits for its dataset or raises
    its error. A process killed meanwhile leaves only a staging folder, which the next
    preparation removes (`k3lab.data.cache.staging`)."""

    def __init__(self, prepare, *args, **kwargs):
        self._done = threading.Event()
        self._value: Dataset | None = None
        self._error: BaseException | None = None
        threading.Thread(target=self._run, args=(prepare, args, kwargs), name="k3lab-data", daemon=True).start()

    def _run(self, prepare, args, kwargs) -> None:
        try:
            self._value = prepare(*args, **kwargs)
        except BaseException as error:  # handed to the caller of result()
            self._error = error
        finally:
            self._done.set()

    def ready(self) -> bool:
        return self._done.is_set()

    def result(self) -> Dataset:
        self._done.wait()
        if self._error is not None:
            raise self._error
        return self._value


def run_checks(plan: Preflight) -> None:
    """The checks that need no data: corpus and tokenizer names and the models (`check_inputs`), tracking
    server, folders, GPUs and FLA."""
    check_inputs(plan.train, plan.models, plan.train_from)
    check_tracking_server(plan.tracking_uri)
    for what, folder in (plan.folders | tracking_folders(plan.tracking_uri)).items():
        check_writable(what, folder)
    if plan.local:
        check_gpus(plan.gpus, plan.gpus_from)
        check_fla(plan.models, plan.gpus)
        check_cpu_memory(plan.models, plan.train, plan.gpus)


def check_inputs(train: TrainSpec, models: dict[str, KimiK3Config], where: str = "") -> None:
    """What the sweep file or command line alone decides, checked first and by `k3lab sweep --dry-run`:
    the corpus and tokenizer names, and every model against train.seq_len and the vocabulary the
    tokenizer spec gives (a bpe:4096 for a model of 320 ids was refused only after tokenizing)."""
    check_models(models, train, check_data_specs(train, where))


def check_data_specs(train: TrainSpec, where: str = "") -> int:
    """train.dataset names a corpus this machine has (or hf:NAME, read later) and train.tokenizer a
    tokenizer it can build, checked before anything starts (without it, a missing path failed
    with the source's message alone, naming neither the file nor the field). Nothing is downloaded
    or tokenized (a tokenizer file is read). Returns the tokenizer's vocabulary size (`tokenizer_vocab`)."""
    from k3lab.data.sources import get_source
    from k3lab.data.bpe import tokenizer_vocab

    checked = {}
    for field, check in (("dataset", get_source), ("tokenizer", tokenizer_vocab)):
        try:
            checked[field] = check(getattr(train, field))
        except UserError as error:
            raise UserError(f"{where}train.{field}: {error}") from None
    return checked["tokenizer"]


def check_tracking_server(uri: str | None) -> None:
    """An HTTP tracking server answers its /health page within TRACKING_TIMEOUT_S."""
    if not uri or not uri.startswith(("http://", "https://")):
        return
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(uri.rstrip("/") + "/health", timeout=TRACKING_TIMEOUT_S) as response:
            if response.status == 200:
                return
            problem = f"HTTP {response.status}"
    except (urllib.error.URLError, OSError, ValueError) as error:
        problem = str(getattr(error, "reason", error))
    named_by = "MLFLOW_TRACKING_URI" if os.environ.get("MLFLOW_TRACKING_URI") == uri else "--tracking-uri"
    raise UserError(f"{named_by} {uri}: the MLflow server does not answer ({problem})")


def tracking_folders(uri: str | None) -> dict[str, Path]:
    """The local folders a SQLite tracking store writes: the database's and `mlartifacts/`."""
    database = sqlite_path(uri)
    if database is None:
        return {}
    return {"MLflow store folder": database.parent, "MLflow artifact folder": artifact_folder_for(uri)}


def check_writable(what: str, folder: Path) -> None:
    """`folder` can be written, or created and written: probed with a temporary file in
    the nearest folder that exists, so a check never creates anything."""
    existing = Path(folder).absolute()
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        raise UserError(f"{what} {folder}: {existing} is a file, not a folder")
    try:
        with tempfile.NamedTemporaryFile(dir=existing, prefix=".k3lab-write-check-"):
            pass
    except OSError as error:
        raise UserError(f"{what} {folder}: cannot write in {existing} ({error.strerror})") from None


def check_gpus(gpus: float, source: str) -> None:
    """This machine has the CUDA GPUs one trial asks for."""
    if gpus <= 0:
        return
    available = cuda_gpus()
    if available == 0:
        raise UserError(f"{source}: this machine has no CUDA GPU (torch.cuda.device_count() is 0)")
    if gpus > available:
        raise UserError(f"{source}: {gpus:g} GPUs per trial, and this machine has {available}")


def cuda_gpus() -> int:
    """The CUDA GPUs this process may use, counted through NVML (`torch.cuda.device_count`), not
    CUDA itself: a sweep's driver that called cuInit would be a client of its trials' MPS server
    until it exits, and that server does not quit while it has a client (it held up the end of
    every GPU sweep)."""
    import torch

    return torch.cuda.device_count()


def check_fla(models: dict[str, KimiK3Config], gpus: float) -> None:
    """Models with kda_implementation=fused that run on a GPU need FLA (on CPU they fall back
    to the plain PyTorch path)."""
    if gpus <= 0:
        return
    missing = [name for name in ("fla", "triton") if importlib.util.find_spec(name) is None]
    fused = [label for label, config in models.items() if config.uses_fused_kda]
    if fused and missing:
        where = f"{fused[0]}: " if fused[0] else ""
        raise UserError(f"{where}kda_implementation=fused on a GPU needs the FLA kernels, and "
                        f"{' and '.join(missing)} is not installed (pip install -e '.[gpu]')")


def check_cpu_memory(models: dict[str, KimiK3Config], train: TrainSpec, gpus: float) -> None:
    """A trial on the CPU fits in this machine's memory at least by `step_memory_floor`: a step that
    cannot fit was killed by the OOM killer (train.batch_size 100000) or asked the allocator for
    terabytes (hidden_size 1e6, vocab_size 1e11), with no word of which field did it. The floor
    is well below what a step takes, so only what cannot run is refused. GPU trials are not
    checked here: their device would be initialised by the check, and CUDA names its own OOM."""
    if gpus > 0:
        return
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    for label, config in models.items():
        floor, parts = step_memory_floor(config, train)
        if floor > memory:
            raise UserError(f"{label + ': ' if label else ''}a training step needs at least {floor / 2**30:,.1f} GiB "
                            f"({parts}) and this machine has {memory / 2**30:,.1f} GiB: lower train.batch_size, "
                            f"train.seq_len or the model's size")


def step_memory_floor(config: KimiK3Config, train: TrainSpec) -> tuple[int, str]:
    """Bytes a training step cannot do without, and what they are: every parameter with its
    gradient and one optimizer state (3 x its dtype's size), and the input of each layer's two
    sub-layers, which their norms keep for the backward (in the autocast dtype, if any)."""
    from k3lab.registry.counts import count

    params = count(config, train.seq_len).total
    weight = 4 if train.dtype == "float32" else 2
    element = 2 if train.autocast else weight
    saved = train.batch_size * train.seq_len * config.hidden_size * 2 * config.num_layers * element
    return 3 * weight * params + saved, (f"{params:,} parameters x {3 * weight} bytes, and train.batch_size x "
                                         f"train.seq_len x hidden_size x 2 x num_layers x {element} bytes of "
                                         f"saved activations")


def prepared_dataset(train: TrainSpec, progress: bool) -> Dataset:
    """The train spec's dataset, tokenized into the data cache now if it is not there yet."""
    from k3lab.data import cache_root, load_dataset_info, prepare_dataset

    dataset = load_dataset_info(train.dataset, train.tokenizer)
    if dataset is not None:
        return dataset
    check_writable("data cache", cache_root())
    return prepare_dataset(train.dataset, train.tokenizer, progress=progress)


def check_prepared(plan: Preflight, dataset: Dataset) -> None:
    """The prepared corpus suits the trials: every model holds its vocabulary, and each split
    a window of train.seq_len + 1 tokens (from its manifest)."""
    from k3lab.runner.train.checks import check_splits

    check_models(plan.models, plan.train, dataset.vocab_size)
    try:
        check_splits(plan.train, dataset)
    except UserError as error:
        raise UserError(f"{plan.train_from}{error}") from None


def check_models(models: dict[str, KimiK3Config], train: TrainSpec, vocab_size: int | None = None) -> None:
    """Every model can train on this data: sequence length and KDA chunks, and the vocabulary
    where `vocab_size` is known."""
    from k3lab.runner.train.checks import check_seq_len, check_vocab

    for label, config in models.items():
        try:
            check_seq_len(config, train)
            if vocab_size is not None:
                check_vocab(config, vocab_size)
        except UserError as error:
            raise UserError(f"{label}: {error}" if label else str(error)) from None
