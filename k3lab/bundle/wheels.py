"""Wheels: reading their metadata, and slimming one (paths left out, ELF files stripped, LZMA-compressed,
RECORD and console scripts updated), which zip, the wheel format and pip all accept."""

from __future__ import annotations

import base64
import csv
import email.parser
import hashlib
import io
import re
import subprocess
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

from k3lab.errors import UserError


# What the default bundle repacks: distribution name -> paths inside the wheel to leave out.
SLIM_RULES: dict[str, tuple[str, ...]] = {
    # the dashboard's web client too: k3lab starts Ray without the dashboard (its agent stays)
    "ray": ("ray/jars", "ray/rllib", "ray/llm", "ray/serve", "ray/dashboard/client/build"),
}


def packaging_modules():
    """`packaging`'s pieces: the installed package, else the copy pip vendors."""
    try:
        from packaging import markers, requirements, specifiers, utils, version
    except ImportError:  # pragma: no cover - every environment with pip has the vendored copy
        from pip._vendor.packaging import markers, requirements, specifiers, utils, version
    return markers, requirements, specifiers, utils, version


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


@dataclass
class WheelInfo:
    """What the resolver needs from one wheel file."""

    path: Path
    name: str  # canonical
    version: str
    requires: list[str]

    @classmethod
    def read(cls, path: Path) -> "WheelInfo":
        utils = packaging_modules()[3]
        name, version, _, _ = utils.parse_wheel_filename(path.name)
        with zipfile.ZipFile(path) as archive:
            names = archive.namelist()
            dist_info = _dist_info_dir(names, path)
            metadata = email.parser.Parser().parsestr(archive.read(f"{dist_info}/METADATA").decode("utf-8"))
        return cls(path, canonical(str(name)), str(version), metadata.get_all("Requires-Dist") or [])


def _dist_info_dir(names: Iterable[str], path: Path) -> str:
    dirs = sorted({n.split("/")[0] for n in names if n.split("/")[0].endswith(".dist-info") and "/" in n})
    if len(dirs) != 1:
        raise UserError(f"{path.name} is not a wheel: it has {len(dirs)} .dist-info folders")
    return dirs[0]


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


@dataclass
class SlimResult:
    source_size: int
    size: int
    dropped_files: int
    dropped_bytes: int  # uncompressed
    dropped_scripts: list[str]
    stripped_files: int = 0  # ELF files without their symbol tables (`strip --strip-unneeded`)
    stripped_bytes: int = 0  # what that took off, uncompressed


def slim_wheel(source: Path, dest: Path, drop: Sequence[str], compression: int = zipfile.ZIP_LZMA,
               strip: str | None = None) -> SlimResult:
    """Repack the wheel `source` as `dest` without the paths under `drop`.

    RECORD loses the dropped files' lines, entry_points.txt loses the console scripts
    whose module was dropped, and every member is written with `compression` (LZMA by
    default: zip method 14, which Python's zipfile, and so pip, reads). With `strip` (the
    path of binutils' strip), ELF libraries and programs lose the symbols that linking
    does not need (`--strip-unneeded`, as Linux distributions package them; ray's raylet,
    GCS server and _raylet.so ship with theirs), and RECORD gets their new hashes.
    The result is an ordinary wheel: `pip install` takes it, `pip uninstall` removes it.
    """
    prefixes = tuple(p.strip("/") for p in drop if p.strip("/"))

    def dropped(member: str) -> bool:
        return any(member == p or member.startswith(p + "/") for p in prefixes)

    dest.parent.mkdir(parents=True, exist_ok=True)
    dropped_files = dropped_bytes = 0
    dropped_scripts: list[str] = []
    with zipfile.ZipFile(source) as src:
        infos = src.infolist()
        dist_info = _dist_info_dir((i.filename for i in infos), source)
        record_name, entry_points_name = f"{dist_info}/RECORD", f"{dist_info}/entry_points.txt"
        kept = []
        for info in infos:
            if dropped(info.filename):
                if not info.is_dir():
                    dropped_files += 1
                    dropped_bytes += info.file_size
            else:
                kept.append(info)
        changed: dict[str, bytes] = stripped_members(src, kept, strip) if strip else {}
        stripped_bytes = sum(src.getinfo(name).file_size - len(data) for name, data in changed.items())
        stripped_files = len(changed)
        if entry_points_name in src.namelist():
            text, dropped_scripts = _drop_entry_points(src.read(entry_points_name).decode("utf-8"), dropped)
            changed[entry_points_name] = text.encode("utf-8")
        record_rows = []
        for row in csv.reader(io.StringIO(src.read(record_name).decode("utf-8"))):
            if not row or dropped(row[0]):
                continue
            if row[0] in changed:
                row = [row[0], _record_hash(changed[row[0]]), str(len(changed[row[0]]))]
            record_rows.append(row)
        record = io.StringIO()
        csv.writer(record, lineterminator="\n").writerows(record_rows)
        changed[record_name] = record.getvalue().encode("utf-8")
        tmp = dest.with_name(dest.name + ".part")
        with zipfile.ZipFile(tmp, "w", compression=compression) as out:
            # dist-info last and RECORD at the very end, as wheels are written
            kept.sort(key=lambda i: (i.filename.startswith(dist_info + "/"), i.filename == record_name))
            for info in kept:
                data = changed[info.filename] if info.filename in changed else src.read(info)
                new = zipfile.ZipInfo(info.filename, date_time=info.date_time)
                new.external_attr = info.external_attr
                new.compress_type = zipfile.ZIP_STORED if info.is_dir() else compression
                out.writestr(new, data)
    tmp.replace(dest)
    return SlimResult(source.stat().st_size, dest.stat().st_size, dropped_files, dropped_bytes, dropped_scripts,
                      stripped_files, stripped_bytes)


def stripped_members(archive: zipfile.ZipFile, members: Sequence[zipfile.ZipInfo], strip: str) -> dict[str, bytes]:
    """name -> the stripped bytes of every ELF file among `members` that strip made smaller."""
    stripped = {}
    with tempfile.TemporaryDirectory(prefix="k3lab-strip-") as tmp:
        work = Path(tmp) / "member"
        for info in members:
            if info.is_dir():
                continue
            with archive.open(info) as handle:
                if handle.read(4) != b"\x7fELF":
                    continue
            work.write_bytes(archive.read(info))
            done = subprocess.run([strip, "--strip-unneeded", str(work)], capture_output=True)
            if done.returncode == 0 and work.stat().st_size < info.file_size:
                stripped[info.filename] = work.read_bytes()
    return stripped


def _drop_entry_points(text: str, dropped) -> tuple[str, list[str]]:
    """entry_points.txt without the console/gui scripts that point into dropped modules."""
    lines, removed, section = [], [], ""
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("[") and stripped.endswith("]"):
            section = stripped[1:-1].strip()
        elif section in ("console_scripts", "gui_scripts") and "=" in stripped:
            script, target = (s.strip() for s in stripped.split("=", 1))
            module = target.split(":")[0].strip().replace(".", "/")
            if dropped(module) or dropped(module + ".py"):
                removed.append(script)
                continue
        lines.append(line)
    return "\n".join(lines) + "\n", removed
