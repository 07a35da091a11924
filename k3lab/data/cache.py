"""Where prepared datasets live, how they are named, and how they are written safely.

A prepared dataset is the directory `<cache root>/<name>`, where the name ends
in a key hashed from everything that decides its tokens (source fingerprint,
tokenizer fingerprint, settings). It is built in a hidden `.tmp-*` directory
and renamed into place in one step, so the final directory either exists whole
or not at all; a failure or Ctrl-C removes the temporary one. A per-name lock
file makes concurrent trials wait for one writer instead of all tokenizing.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import secrets
import shutil
from pathlib import Path
from typing import Iterator

from k3lab.errors import UserError

ENV_VAR = "K3LAB_DATA_DIR"
DEFAULT_ROOT = Path("~/.cache/k3lab/data")


def cache_root(cache_dir: str | Path | None = None) -> Path:
    """The cache root: the argument (--cache-dir), else $K3LAB_DATA_DIR, else ~/.cache/k3lab/data."""
    if cache_dir:
        return _folder(cache_dir, "--cache-dir")
    if os.environ.get(ENV_VAR):
        return _folder(os.environ[ENV_VAR], ENV_VAR)
    return _folder(DEFAULT_ROOT, "data cache")


def _folder(root: str | Path, named_by: str) -> Path:
    """`root`, refused naming `named_by` when it is, or lies below, a file (`data info` called
    such a cache empty, and `data prepare` said only that it cannot create it)."""
    root = Path(root).expanduser()
    existing = root.absolute()
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        raise UserError(f"{named_by} {root}: {existing} is a file, not a folder")
    return root


def dataset_name(source_spec: str, tokenizer_name: str, identity: dict) -> str:
    """`<source>-<tokenizer>-<16 hex key>`; the key hashes `identity` (a JSON-able dict)."""
    key = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:16]
    return f"{_slug(Path(source_spec).name or source_spec)}-{_slug(Path(tokenizer_name).name)}-{key}"


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.+]+", "_", text).strip("_.")[:40] or "x"


@contextlib.contextmanager
def locked(root: Path, name: str) -> Iterator[None]:
    """Hold an exclusive lock on `name` in `root` (blocks while another process holds it)."""
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise UserError(f"cache directory '{root}': cannot create ({error.strerror})") from None
    with open(root / f".{name}.lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


@contextlib.contextmanager
def staging(root: Path, name: str) -> Iterator[Path]:
    """Yield an empty temporary directory that becomes `root/name` when the block succeeds.

    Call under `locked(root, name)`: leftovers of earlier killed writers of the
    same name are removed first. On any exception, KeyboardInterrupt included,
    the temporary directory is removed and the exception propagates.
    """
    for stale in root.glob(f".tmp-{name}-*"):
        shutil.rmtree(stale, ignore_errors=True)
    tmp = root / f".tmp-{name}-{os.getpid()}-{secrets.token_hex(4)}"
    tmp.mkdir()
    try:
        yield tmp
        _publish(tmp, root / name)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # a no-op after a successful rename


def _publish(tmp: Path, final: Path) -> None:
    """Rename `tmp` to `final` in one step. If a writer that did not honour the lock (another
    host on a shared disk) got there first, keep its copy: the key says it holds the same tokens."""
    try:
        os.rename(tmp, final)
    except OSError:
        if not (final / "manifest.json").is_file():
            raise
