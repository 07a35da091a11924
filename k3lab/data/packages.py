"""The second offline corpus: the Python source and docs of every package installed in the environment.

`get_source("packages")`: every `*.py`, `*.md`, `*.rst` and `*.txt` file under the environment's
site-packages folders (sysconfig's purelib and platlib, `site.getsitepackages()`, the user site),
one document per file, in sorted path order. Skipped: `__pycache__`, package metadata
(`*.dist-info`, `*.egg-info`), files with NUL bytes (binary data with a text suffix) and files
over `MAX_DOCUMENT_BYTES` (generated tables). Files with the same content are one document (the
first by path): vendored copies and licence files would otherwise land in both splits.
Documents are split by the hash of their id (the path under its site-packages folder), as the
stdlib source's are.

On a machine with torch, Ray and MLflow installed this is hundreds of MB of real text (342 MB in
k3lab's test environment), against ~12 MB for the standard library: a gpu-sized trial (10.5M
tokens) never sees a token twice. The corpus is the environment's: its fingerprint (paths, sizes,
modification times of the files) changes when a package is installed, removed or upgraded, and a
new token cache is built then.
"""

from __future__ import annotations

import hashlib
import os
import site
import sysconfig
from pathlib import Path
from typing import Iterator

from k3lab.data.document import Document
from k3lab.errors import UserError

PACKAGE_SUFFIXES = (".py", ".md", ".rst", ".txt")
METADATA_SUFFIXES = (".dist-info", ".egg-info")
MAX_DOCUMENT_BYTES = 4_000_000
SPEC = "packages"


def site_packages() -> list[Path]:
    """The environment's site-packages folders that exist, each once, in a fixed order."""
    paths = sysconfig.get_paths()
    candidates = [paths.get("purelib"), paths.get("platlib"), *getattr(site, "getsitepackages", lambda: [])()]
    user = getattr(site, "getusersitepackages", lambda: None)()
    if user and site.ENABLE_USER_SITE:
        candidates.append(user)
    roots: list[Path] = []
    for candidate in candidates:
        if candidate and Path(candidate).is_dir() and Path(candidate).resolve() not in roots:
            roots.append(Path(candidate).resolve())
    return roots


class PackagesSource:
    """Every installed package's `.py`, `.md`, `.rst`, `.txt` files (see the module docstring).
    `roots` replaces the site-packages folders (tests)."""

    def __init__(self, roots: list[str | Path] | None = None):
        self.spec = SPEC
        self.roots = [Path(r).resolve() for r in roots] if roots is not None else site_packages()
        self._files: list[tuple[Path, Path]] | None = None

    def files(self) -> list[tuple[Path, Path]]:
        """(root, path) of every candidate file, sorted by root then relative path."""
        if self._files is None:
            found = []
            for root in self.roots:
                mine = []
                for dirpath, dirnames, filenames in os.walk(root):
                    dirnames[:] = sorted(d for d in dirnames
                                         if d != "__pycache__" and not d.endswith(METADATA_SUFFIXES))
                    for name in filenames:
                        path = Path(dirpath, name)
                        if name.endswith(PACKAGE_SUFFIXES) and path.is_file():
                            mine.append(path)
                found += [(root, p) for p in sorted(mine, key=lambda p: p.relative_to(root).as_posix())]
            self._files = found
        if not self._files:
            raise UserError(f"source '{self.spec}': no {', '.join(PACKAGE_SUFFIXES)} files under "
                            f"{', '.join(map(str, self.roots)) or 'any site-packages folder'}")
        return self._files

    def fingerprint(self) -> str:
        """sha256 over each file's root, relative path, size and modification time (cheap: the
        corpus is hundreds of MB; any install, removal or upgrade changes it)."""
        outer = hashlib.sha256()
        for root, path in self.files():
            info = path.stat()
            outer.update(f"{root}\0{path.relative_to(root).as_posix()}\0{info.st_size}\0{info.st_mtime_ns}\n".encode())
        return outer.hexdigest()

    def count(self) -> int:
        """Candidate files (an upper bound on documents: duplicates and binary files are dropped)."""
        return len(self.files())

    def total_bytes(self) -> int:
        """Bytes in the candidate files (before deduplication): for estimates."""
        return sum(min(path.stat().st_size, MAX_DOCUMENT_BYTES + 1) for _, path in self.files()
                   if path.stat().st_size <= MAX_DOCUMENT_BYTES)

    def documents(self) -> Iterator:
        seen_content: set[bytes] = set()
        seen_ids: set[str] = set()
        for index, (root, path) in enumerate(self.files()):
            if path.stat().st_size > MAX_DOCUMENT_BYTES:
                continue
            data = path.read_bytes()
            if b"\0" in data:
                continue
            digest = hashlib.sha256(data).digest()
            if digest in seen_content:
                continue
            seen_content.add(digest)
            doc_id = path.relative_to(root).as_posix()
            if doc_id in seen_ids:  # the same path under two site-packages folders
                doc_id = f"{self.roots.index(root)}:{doc_id}"
            seen_ids.add(doc_id)
            yield Document(doc_id, data.decode("utf-8", errors="replace"))
