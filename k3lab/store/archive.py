"""A compressed store (`*.db.xz`, as in docs/runs) unpacked to a folder of its own, for `k3lab ui`."""

from __future__ import annotations

import lzma
import os
import shutil
import tempfile
from pathlib import Path

from k3lab.errors import UserError

UI_CACHE = Path(os.environ.get("K3LAB_UI_DIR") or Path.home() / ".cache" / "k3lab" / "ui")  # unpacked stores


def store_tracking_uri(store: str, unpack_dir: str | None = None) -> str:
    """The tracking URI of a store named by path: an mlflow.db, its folder, or a *.db.xz (unpacked
    first, into `unpack_dir` or ~/.cache/k3lab/ui/<name>)."""
    path = Path(store)
    if path.is_dir():
        path = path / "mlflow.db"
    if not path.exists():
        raise UserError(f"{store}: no such store")
    if path.name.endswith(".xz"):
        name = path.name.removesuffix(".xz").removesuffix(".db")
        path = unpack(path, Path(unpack_dir) if unpack_dir else UI_CACHE / name)
    return f"sqlite:///{path.resolve()}"


def unpack(archive: Path, folder: Path, say=print) -> Path:
    """`folder`/mlflow.db from a compressed store, kept while it is newer than the archive (it
    then keeps what was added to it: rebuilt reports, views saved in the UI)."""
    database = folder / "mlflow.db"
    if database.exists() and database.stat().st_mtime >= archive.stat().st_mtime:
        return database
    if folder.exists() and not folder.is_dir():
        raise UserError(f"--unpack-dir {folder}: is a file, not a folder")
    created = not folder.exists()
    folder.mkdir(parents=True, exist_ok=True)
    try:
        with lzma.open(archive) as source, tempfile.NamedTemporaryFile(dir=folder, delete=False) as target:
            shutil.copyfileobj(source, target)
    except (lzma.LZMAError, EOFError) as error:  # nothing left behind: the partial file, the folder made for it
        Path(target.name).unlink(missing_ok=True)
        if created:
            shutil.rmtree(folder, ignore_errors=True)
        raise UserError(f"{archive}: not a complete .xz archive ({error})") from None
    os.replace(target.name, database)
    say(f"unpacked {archive} to {database}")
    return database
