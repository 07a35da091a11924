"""A compressed store (`*.db.xz`, as in docs/runs) unpacked to a folder of its own, for `k3lab ui`."""

from __future__ import annotations

import lzma
import os
import shutil
import tempfile
from pathlib import Path

from k3lab.errors import UserError


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
