"""Corpus sources: where documents come from, and a fingerprint of their content.

Spec strings (`get_source` parses them):
- "stdlib" (the default): the running interpreter's standard-library `.py`
  files, one document per file, no network needed; "stdlib+tests" adds the
  test packages. The corpus differs between Python versions, and so does its
  fingerprint.
- "packages": the `.py`, `.md`, `.rst` and `.txt` files of every package
  installed in the environment, deduplicated (`k3lab.data.packages`): hundreds
  of MB offline, for trials that must not repeat data.
- a local path: a `.txt` file (one document per file), a `.jsonl` file (one
  document per line, field "text"), a `.parquet` file (one document per row,
  column "text"), or a directory searched recursively for those (sorted).
- "hf:NAME[:CONFIG][@SPLIT]": a Hugging Face dataset (column "text", split
  "train" by default), loaded with `datasets.load_dataset`; needs a network
  the first time.

A source yields `Document(id, text)` in a fixed order; ids are unique and
stable, since the train/validation split hashes them. `fingerprint()` changes
whenever the documents would.
"""

from __future__ import annotations

import hashlib
import json
import os
import sysconfig
from pathlib import Path
from typing import Iterator

from k3lab.data.document import Document
from k3lab.data.packages import PackagesSource
from k3lab.errors import UserError

FILE_SUFFIXES = (".txt", ".jsonl", ".parquet")
STDLIB_SKIP = {"site-packages", "dist-packages", "__pycache__"}
STDLIB_TEST_DIRS = {"test", "tests", "idle_test"}


def _hash_files(root: Path, files: list[Path]) -> str:
    """sha256 over (relative path, content sha256) of each file, in order."""
    outer = hashlib.sha256()
    for path in files:
        outer.update(path.relative_to(root).as_posix().encode() + b"\0")
        outer.update(hashlib.sha256(path.read_bytes()).digest())
    return outer.hexdigest()


def _read_text(path: Path) -> str:
    return path.read_bytes().decode("utf-8", errors="replace")


class StdlibSource:
    """The interpreter's own standard-library sources: megabytes of real Python text, offline."""

    def __init__(self, include_tests: bool = False):
        self.include_tests = include_tests
        self.spec = "stdlib+tests" if include_tests else "stdlib"
        self.root = Path(sysconfig.get_paths()["stdlib"])
        self._files: list[Path] | None = None

    def files(self) -> list[Path]:
        if self._files is None:
            skip = STDLIB_SKIP if self.include_tests else STDLIB_SKIP | STDLIB_TEST_DIRS
            found = []
            for dirpath, dirnames, filenames in os.walk(self.root):
                dirnames[:] = sorted(d for d in dirnames if d not in skip)
                found += [Path(dirpath, f) for f in filenames if f.endswith(".py")]
            self._files = sorted(found, key=lambda p: p.relative_to(self.root).as_posix())
        if not self._files:
            raise UserError(f"source '{self.spec}': no .py files under {self.root}")
        return self._files

    def fingerprint(self) -> str:
        return _hash_files(self.root, self.files())

    def count(self) -> int:
        return len(self.files())

    def documents(self) -> Iterator[Document]:
        for path in self.files():
            yield Document(path.relative_to(self.root).as_posix(), _read_text(path))


class LocalSource:
    """A .txt/.jsonl/.parquet file, or a directory of them searched recursively."""

    def __init__(self, path: str | Path):
        self.path = Path(path).expanduser().resolve()
        self.spec = str(self.path)
        if not self.path.exists():
            raise UserError(f"source '{path}': no such file or directory")
        if not (self.path.is_file() or self.path.is_dir()):  # a FIFO or /dev/zero was searched as a folder
            raise UserError(f"source '{path}': not a regular file or folder")
        if self.path.is_file() and self.path.suffix not in FILE_SUFFIXES:
            raise UserError(f"source '{path}': unsupported file type '{self.path.suffix}' "
                            f"(use {', '.join(FILE_SUFFIXES)} or a directory of them)")
        self.root = self.path if self.path.is_dir() else self.path.parent
        self._files: list[Path] | None = None

    def files(self) -> list[Path]:
        if self._files is None:
            if self.path.is_file():
                self._files = [self.path]
            else:
                found = [p for p in self.path.rglob("*") if p.suffix in FILE_SUFFIXES and p.is_file()]
                self._files = sorted(found, key=lambda p: p.relative_to(self.root).as_posix())
        if not self._files:
            raise UserError(f"source '{self.spec}': no {', '.join(FILE_SUFFIXES)} files in the directory")
        return self._files

    def fingerprint(self) -> str:
        return _hash_files(self.root, self.files())

    def count(self) -> int | None:
        """Documents, when cheap to know (.txt files and parquet row counts); else None."""
        total = 0
        for path in self.files():
            if path.suffix == ".txt":
                total += 1
            elif path.suffix == ".parquet":
                total += _parquet_file(path).metadata.num_rows
            else:
                return None
        return total

    def documents(self) -> Iterator[Document]:
        for path in self.files():
            rel = path.relative_to(self.root).as_posix()
            if path.suffix == ".txt":
                yield Document(rel, _read_text(path))
            elif path.suffix == ".jsonl":
                yield from _jsonl_documents(path, rel)
            else:
                yield from _parquet_documents(path, rel)


def _jsonl_documents(path: Path, rel: str) -> Iterator[Document]:
    with open(path, encoding="utf-8", errors="replace") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as error:
                raise UserError(f"source '{path}': line {lineno} is not JSON ({error.msg})") from None
            if not isinstance(record, dict) or not isinstance(record.get("text"), str):
                raise UserError(f"source '{path}': line {lineno} has no string field 'text'")
            yield Document(f"{rel}:{lineno}", _valid_unicode(record["text"]))


def _parquet_documents(path: Path, rel: str) -> Iterator[Document]:
    row = 0
    for texts in _parquet_texts(_parquet_file(path), path):
        for text in texts:
            yield Document(f"{rel}:{row}", text or "")
            row += 1


def _parquet_file(path: Path):
    """The open `pyarrow.parquet.ParquetFile`, checked to hold a string column 'text': `count()` and
    `documents()` both open it here (a file that is no parquet raised pyarrow's traceback from
    `count()`, and a column of numbers reached the tokenizer as ints)."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    try:
        file = pq.ParquetFile(path)
    except Exception as error:  # pyarrow raises ArrowInvalid/OSError for anything malformed
        raise UserError(f"source '{path}': not a parquet file ({_first_line(error)})") from None
    schema = file.schema_arrow
    if "text" not in schema.names:
        raise UserError(f"source '{path}': no column 'text' (columns: {', '.join(schema.names)})")
    kind = schema.field("text").type
    if not (pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_null(kind)):
        raise UserError(f"source '{path}': column 'text' must hold strings, got {kind}")
    return file


def _parquet_texts(file, path: Path) -> Iterator[list]:
    """The column 'text' in batches of rows; a page pyarrow cannot read (a damaged file whose
    footer is intact) is the file's one-line error, not pyarrow's traceback."""
    batches = file.iter_batches(columns=["text"], batch_size=1024)
    while True:
        try:
            batch = next(batches)
        except StopIteration:
            return
        except Exception as error:  # OSError/ArrowInvalid, as when opening it
            raise UserError(f"source '{path}': a damaged parquet file ({_first_line(error)})") from None
        yield batch.column(0).to_pylist()


def _first_line(error: Exception) -> str:
    return (str(error).strip().splitlines() or [type(error).__name__])[0]


def _valid_unicode(text: str) -> str:
    """Replace lone surrogates (JSON can escape them) so the text encodes as UTF-8."""
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return text.encode("utf-8", errors="replace").decode("utf-8")


class HFSource:
    """A Hugging Face dataset split with a "text" column, loaded on first use."""

    def __init__(self, spec: str):
        self.spec = spec
        body, at, split = spec[len("hf:"):].partition("@")
        name, colon, config = body.partition(":")
        empty = [part for part, missing in (("NAME", not name), ("CONFIG after ':'", colon and not config),
                                            ("SPLIT after '@'", at and not split)) if missing]
        if empty:  # an empty CONFIG or SPLIT after its separator was taken for the default
            raise UserError(f"source '{spec}': expected hf:NAME[:CONFIG][@SPLIT], and {empty[0]} is empty")
        self.name, self.config, self.split = name, config or None, split or "train"
        self._dataset = None

    def dataset(self):
        if self._dataset is None:
            self._dataset = self._load()
        return self._dataset

    def _load(self):
        try:
            import datasets
        except ImportError as error:
            raise UserError(f"source '{self.spec}': needs the `datasets` package") from error
        try:
            ds = datasets.load_dataset(self.name, self.config, split=self.split)
        except Exception as error:  # network, missing dataset, bad config or split: all the user's to fix
            raise UserError(f"source '{self.spec}': cannot load ({_first_line(error)})") from error
        if "text" not in ds.column_names:
            raise UserError(f"source '{self.spec}': no column 'text' (columns: {', '.join(ds.column_names)})")
        return ds

    def fingerprint(self) -> str:
        """`datasets`' own content fingerprint of the loaded split (changes with the data files)."""
        ds = self.dataset()
        return hashlib.sha256(f"{self.spec}\0{ds._fingerprint}".encode()).hexdigest()

    def count(self) -> int:
        return len(self.dataset())

    def documents(self) -> Iterator[Document]:
        ds = self.dataset().select_columns(["text"])
        index = 0
        for batch in ds.iter(batch_size=1024):
            for text in batch["text"]:
                yield Document(f"{self.split}:{index}", text or "")
                index += 1



Source = StdlibSource | LocalSource | HFSource | PackagesSource


def get_source(spec: str = "stdlib") -> Source:
    """Parse a source spec string (see the module docstring)."""
    if spec in ("stdlib", "stdlib+tests"):
        return StdlibSource(include_tests=spec == "stdlib+tests")
    if spec == "packages":
        return PackagesSource()
    if spec.startswith("hf:"):
        return HFSource(spec)
    if not spec:
        raise UserError("source '': empty source spec (use 'stdlib', a path, or hf:NAME)")
    return LocalSource(spec)
