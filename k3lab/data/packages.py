"""The second offline corpus: the Python source and docs of every package installed in the environment.

`get_source("packages")`: every `*.py`, `*.md`, `*.rst` and `*.txt` file under the environment's
site-packages folders (sysconfig's purelib and platlib, `site.getsitepackages()`, the user site),
one document per file, in sorted path order. Skipped: `__pycache__`, package metadata
(`*.dist-info`, `*.egg-info`), files with NUL bytes (binary data with a text suffix) and files
over `MAX_DOCUMENT_BYTES` (generated tables). Files with the same content are one document (the
first by path): vendored copies and licence files would otherwise land in both splits.
Documents are split by the hash of their id (the path under its site-packages folder), as the
stdlib source's are.

On a machine with torch, Ray and MLflow installed this is hundreds of MB of real text, far more
than the standard library: a gpu-sized trial never sees a token twice. The corpus is the environment's: its fingerprint (paths, sizes,
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
        self._files: list[tuple[Path, str, int, int]] | None = None

    def files(self) -> list[tuple[Path, Path]]:
        """(root, path) of every candidate file, sorted by root then relative path."""
        return [(root, root / relative) for root, relative, _, _ in self.listing()]

    def listing(self) -> list[tuple[Path, str, int, int]]:
        """(root, relative posix path, size, mtime_ns) of every candidate file, in `files`'s
        order; walked once, with the stats the walk already made (21k files on a torch install)."""
        if self._files is None:
            self._files = [(root, *entry) for root in self.roots for entry in candidate_files(root)]
        if not self._files:
            raise UserError(f"source '{self.spec}': no {', '.join(PACKAGE_SUFFIXES)} files under "
                            f"{', '.join(map(str, self.roots)) or 'any site-packages folder'}")
        return self._files

    def fingerprint(self) -> str:
        """sha256 over each file's root, relative path, size and modification time (cheap: the
        corpus is hundreds of MB; any install, removal or upgrade changes it)."""
        outer = hashlib.sha256()
        for root, relative, size, mtime_ns in self.listing():
            outer.update(f"{root}\0{relative}\0{size}\0{mtime_ns}\n".encode())
        return outer.hexdigest()

    def count(self) -> int:
        """Candidate files (an upper bound on documents: duplicates and binary files are dropped)."""
        return len(self.listing())

    def total_bytes(self) -> int:
        """Bytes in the candidate files (before deduplication): for estimates."""
        return sum(size for _, _, size, _ in self.listing() if size <= MAX_DOCUMENT_BYTES)

    def documents(self) -> Iterator:
        seen_content: set[bytes] = set()
        seen_ids: set[str] = set()
        for root, relative, size, _ in self.listing():
            if size > MAX_DOCUMENT_BYTES:
                continue
            data = (root / relative).read_bytes()
            if b"\0" in data:
                continue
            digest = hashlib.sha256(data).digest()
            if digest in seen_content:
                continue
            seen_content.add(digest)
            doc_id = relative
            if doc_id in seen_ids:  # the same path under two site-packages folders
                doc_id = f"{self.roots.index(root)}:{doc_id}"
            seen_ids.add(doc_id)
            yield Document(doc_id, data.decode("utf-8", errors="replace"))


def candidate_files(root: Path) -> list[tuple[str, int, int]]:
    """(relative posix path, size, mtime_ns) of the candidate files under root, sorted by path.
    Symbolic links to files count, links to folders are not followed (as os.walk), and
    folders that cannot be read are skipped."""
    found, folders = [], [""]
    while folders:
        folder = folders.pop()
        try:
            entries = list(os.scandir(os.path.join(root, folder)))
        except OSError:
            continue
        for entry in entries:
            relative = f"{folder}/{entry.name}" if folder else entry.name
            try:
                if entry.is_dir(follow_symlinks=False):
                    if entry.name != "__pycache__" and not entry.name.endswith(METADATA_SUFFIXES):
                        folders.append(relative)
                elif entry.name.endswith(PACKAGE_SUFFIXES) and entry.is_file():
                    info = entry.stat()
                    found.append((relative, info.st_size, info.st_mtime_ns))
            except OSError:  # removed while walking, or a broken link
                continue
    return sorted(found)
