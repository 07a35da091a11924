"""`k3lab bundle OUT_DIR`: an offline install bundle for a machine with no package index.

The bundle holds k3lab's own wheel and the wheels of every dependency the target
machine lacks, for the target's Python and platform, plus `install.sh` (installs
them with `pip --no-index --no-deps`, optionally into a `--target` folder) and
`manifest.json` (files, sizes, sha256, the target, and what the target must already
have). Packages the target already has are named with `--exclude` and are neither
downloaded nor followed: their own dependencies are the target's business too.

The closure is resolved here, one `pip download --no-deps --only-binary=:all:
--python-version ... --platform ...` per round of new requirements: pip picks each
version, this module reads the wheel's metadata, evaluates the markers for the target
and follows the requirements. A version that a later requirement rules out is
constrained and the resolution restarts; a version that needs more of an excluded
package than the target has (when `--exclude` pins it, `torch==2.11.0`) is rejected
and the next one tried.

Two measures keep the bundle small enough to carry:
- substitution: `mlflow` is bundled as `mlflow-skinny` (the tracking client and the
  SQL store, with sqlalchemy and alembic added) unless `--full-mlflow`; k3lab only
  uses `MlflowClient`, the UI server is what needs the full package;
- slimming: ray's wheel is repacked without its Java jars, RLlib, Serve and the LLM
  library (RECORD and console scripts updated) and LZMA-compressed, which zip, the
  wheel format and pip all accept.

Excluded packages whose version on the target is unknown (not pinned) get a "spare":
their small wheel (up to --spare-max-size) in spares/, which install.sh installs only
where the target's own version does not satisfy what the bundle needs.
"""

from __future__ import annotations

import argparse
import base64
import csv
import email.parser
import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Sequence

from k3lab.errors import UserError

# What the default bundle repacks: distribution name -> paths inside the wheel to leave out.
SLIM_RULES: dict[str, tuple[str, ...]] = {
    "ray": ("ray/jars", "ray/rllib", "ray/llm", "ray/serve"),
}

# Distribution bundled in place of another, and what the substitute needs on top.
SUBSTITUTES: dict[str, tuple[str, tuple[str, ...]]] = {
    # mlflow-skinny has MlflowClient and the SQL tracking store; the store needs these two.
    "mlflow": ("mlflow-skinny", ("sqlalchemy>=1.4.0,<3", "alembic!=1.10.0,<2")),
}

# Modules install.sh imports after installing, when their distribution is in the bundle.
CHECK_IMPORTS: dict[str, tuple[str, ...]] = {
    "k3lab": ("k3lab.cli",),
    "ray": ("ray", "ray.tune"),
    "mlflow-skinny": ("mlflow.tracking",),
    "mlflow": ("mlflow.tracking",),
    "cattrs": ("cattrs",),
    "datasets": ("datasets",),
    "flash-linear-attention": ("fla",),
    "sqlalchemy": ("sqlalchemy",),
    "alembic": ("alembic",),
}

MANIFEST = "manifest.json"
INSTALL_SH = "install.sh"
WHEELS = "wheels"
SPARES = "spares"
MAX_RESTARTS = 60

_SIZE_UNITS = {"": 1, "b": 1, "k": 2**10, "kib": 2**10, "kb": 10**3, "m": 2**20, "mib": 2**20, "mb": 10**6,
               "g": 2**30, "gib": 2**30, "gb": 10**9}


def _packaging():
    """`packaging`'s pieces: the installed package, else the copy pip vendors."""
    try:
        from packaging import markers, requirements, specifiers, utils, version
    except ImportError:  # pragma: no cover - every environment with pip has the vendored copy
        from pip._vendor.packaging import markers, requirements, specifiers, utils, version
    return markers, requirements, specifiers, utils, version


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def parse_size(text: str) -> int:
    """'64MiB', '64M' (MiB), '500MB', '1.5GiB' or a number of bytes."""
    match = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([A-Za-z]*)\s*", str(text))
    if not match or match.group(2).lower() not in _SIZE_UNITS:
        raise UserError(f"cannot read the size {text!r}: use e.g. 64MiB, 500MB or 1.5GiB")
    return int(float(match.group(1)) * _SIZE_UNITS[match.group(2).lower()])


def human(size: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if size >= scale:
            return f"{size / scale:.1f} {unit}"
    return f"{size} B"


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


# --------------------------------------------------------------------------- target


@dataclass(frozen=True)
class Target:
    """The interpreter and platform the bundle is for."""

    python_version: str  # "3.12" or "3.12.3"
    platforms: tuple[str, ...] = ()  # pip platform tags; () = this machine's
    implementation: str = "cp"

    @property
    def python_minor(self) -> str:
        return ".".join(self.python_version.split(".")[:2])

    def marker_environment(self) -> dict[str, str]:
        """PEP 508 marker values for the target (platform read off the first platform tag)."""
        markers = _packaging()[0]
        env = dict(markers.default_environment())
        parts = self.python_version.split(".")
        env["python_version"] = self.python_minor
        env["python_full_version"] = self.python_version if len(parts) >= 3 else f"{self.python_minor}.0"
        if self.implementation == "cp":
            env["implementation_name"] = "cpython"
            env["platform_python_implementation"] = "CPython"
        if self.platforms:
            tag = self.platforms[0]
            if tag.startswith(("manylinux", "musllinux", "linux")):
                env.update(sys_platform="linux", platform_system="Linux", os_name="posix")
                env["platform_machine"] = re.sub(r"^(manylinux|musllinux)\d*(_\d+_\d+)?_|^linux_", "", tag)
            elif tag.startswith("macosx"):
                env.update(sys_platform="darwin", platform_system="Darwin", os_name="posix")
                env["platform_machine"] = tag.split("_", 3)[-1]
            elif tag.startswith("win"):
                env.update(sys_platform="win32", platform_system="Windows", os_name="nt",
                           platform_machine={"win_amd64": "AMD64", "win32": "x86"}.get(tag, "ARM64"))
        return env

    def pip_arguments(self) -> list[str]:
        args = ["--only-binary=:all:", "--python-version", self.python_version, "--implementation",
                self.implementation]
        for platform in self.platforms:
            args += ["--platform", platform]
        return args

    def as_json(self) -> dict:
        return {"python_version": self.python_version, "implementation": self.implementation,
                "platforms": list(self.platforms)}


# --------------------------------------------------------------------------- wheels


@dataclass
class WheelInfo:
    """What the resolver needs from one wheel file."""

    path: Path
    name: str  # canonical
    version: str
    requires: list[str]

    @classmethod
    def read(cls, path: Path) -> "WheelInfo":
        utils = _packaging()[3]
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


def slim_wheel(source: Path, dest: Path, drop: Sequence[str], compression: int = zipfile.ZIP_LZMA) -> SlimResult:
    """Repack the wheel `source` as `dest` without the paths under `drop`.

    RECORD loses the dropped files' lines, entry_points.txt loses the console scripts
    whose module was dropped, and every member is written with `compression` (LZMA by
    default: zip method 14, which Python's zipfile, and so pip, reads). The result is
    an ordinary wheel: `pip install` takes it, `pip uninstall` removes it.
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
        changed: dict[str, bytes] = {}
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
    return SlimResult(source.stat().st_size, dest.stat().st_size, dropped_files, dropped_bytes, dropped_scripts)


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


# --------------------------------------------------------------------------- resolution


class Fetcher:
    """`pip download --no-deps` for the target, many requirements per call, results cached."""

    def __init__(self, target: Target, workdir: Path, log=print):
        self.target = target
        self.workdir = workdir
        self.log = log
        self.calls = 0
        self._cache: dict[str, WheelInfo] = {}

    def fetch(self, requirements: dict[str, str], tolerant: bool = False) -> dict[str, WheelInfo]:
        """name -> specifier string  =>  name -> the wheel pip picks (a UserError for one it can't find,
        or, when `tolerant`, no entry for it)."""
        wanted = {name: spec for name, spec in requirements.items() if f"{name}{spec}" not in self._cache}
        if wanted:
            try:
                found = self._download(wanted)
            except UserError:
                if len(wanted) == 1 and not tolerant:
                    raise
                found = {}
                for name, spec in wanted.items():  # find the one that fails and say which it is
                    try:
                        found.update(self._download({name: spec}))
                    except UserError as error:
                        if not tolerant:
                            raise
                        self.log(f"  skipped: {error}")
            for name, spec in wanted.items():
                if name in found:
                    self._cache[f"{name}{spec}"] = found[name]
                elif not tolerant:
                    raise UserError(f"pip downloaded no wheel named {name} for {name}{spec}")
        return {name: self._cache[f"{name}{spec}"] for name, spec in requirements.items()
                if f"{name}{spec}" in self._cache}

    def _download(self, wanted: dict[str, str]) -> dict[str, WheelInfo]:
        self.calls += 1
        dest = self.workdir / f"download-{self.calls:03d}"
        dest.mkdir(parents=True)
        specs = [f"{name}{spec}" for name, spec in sorted(wanted.items())]
        command = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
                   *self.target.pip_arguments(), "-d", str(dest), *specs]
        self.log(f"  pip download {' '.join(specs)}")
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode != 0:
            errors = [line for line in done.stderr.splitlines() if line.startswith("ERROR")]
            reason = errors[-1].removeprefix("ERROR: ") if errors else done.stderr.strip()[-300:]
            raise UserError(f"no wheel of {', '.join(specs)} for Python {self.target.python_version} "
                            f"{'/'.join(self.target.platforms) or 'this platform'}: {reason}")
        found = {}
        for path in dest.glob("*.whl"):
            info = WheelInfo.read(path)
            found[info.name] = info
        return found


@dataclass
class Resolution:
    wheels: dict[str, WheelInfo]  # canonical name -> wheel, the root project excluded
    required_by: dict[str, list[str]]  # name -> ["k3lab 0.1.0", ...]
    from_target: dict[str, list[dict]]  # excluded name -> [{"specifier", "required_by"}]
    substituted: dict[str, str]
    restarts: int


class Resolver:
    def __init__(self, target: Target, fetcher: Fetcher, exclude: dict[str, str],
                 substitutes: dict[str, tuple[str, tuple[str, ...]]], log=print):
        self.target = target
        self.env = target.marker_environment()
        self.fetcher = fetcher
        self.exclude = exclude  # canonical name -> specifier ("" = any version)
        self.substitutes = {canonical(k): v for k, v in substitutes.items()}
        self.log = log
        _, requirements, specifiers, _, version = _packaging()
        self._Requirement, self._SpecifierSet, self._Version = (requirements.Requirement, specifiers.SpecifierSet,
                                                                version.Version)

    def _active(self, requirement, extras: Iterable[str]) -> bool:
        if requirement.marker is None:
            return True
        return any(requirement.marker.evaluate({**self.env, "extra": extra}) for extra in ("", *extras))

    def _requirements_of(self, wheel: WheelInfo, extras: set[str]) -> list:
        """The wheel's requirements active on the target for `extras` (and none)."""
        out = []
        for line in wheel.requires:
            requirement = self._Requirement(line)
            marker = requirement.marker
            if marker is None:
                out.append(requirement)
                continue
            if any(marker.evaluate({**self.env, "extra": extra}) for extra in ("", *sorted(extras))):
                out.append(requirement)
        return out

    def _pinned(self, name: str):
        spec = self.exclude.get(name, "")
        match = re.fullmatch(r"===?\s*([^,*\s]+)", spec.strip())
        return self._Version(match.group(1)) if match else None

    def resolve(self, root: WheelInfo, root_extras: set[str], extra_requirements: Sequence[str] = ()) -> Resolution:
        constraints: dict[str, set[str]] = defaultdict(set)
        for restart in range(MAX_RESTARTS):
            outcome = self._attempt(root, root_extras, extra_requirements, constraints)
            if isinstance(outcome, Resolution):
                outcome.restarts = restart
                return outcome
            name, clause, why = outcome
            if clause in constraints[name]:
                raise UserError(f"cannot resolve {name}: {why}")
            self.log(f"  constraint {name}{clause}: {why}")
            constraints[name].add(clause)
        raise UserError(f"the dependencies did not resolve in {MAX_RESTARTS} rounds")

    def _attempt(self, root, root_extras, extra_requirements, constraints):
        root_label = f"{root.name} {root.version}"
        chosen: dict[str, WheelInfo] = {}
        extras: dict[str, set[str]] = defaultdict(set)
        processed: set[tuple[str, str]] = set()
        required_by: dict[str, list[str]] = defaultdict(list)
        from_target: dict[str, list[dict]] = defaultdict(list)
        substituted: dict[str, str] = {}
        pending = [(req, root_label) for req in self._requirements_of(root, root_extras)]
        pending += [(self._Requirement(line), "--with") for line in extra_requirements]
        while pending:
            new: dict[str, list] = defaultdict(list)
            for requirement, parent in pending:
                name = canonical(requirement.name)
                if name in self.substitutes:
                    substitute, additions = self.substitutes[name]
                    substituted[name] = substitute
                    requirement = self._Requirement(f"{substitute}{requirement.specifier}")
                    pending_more = [(self._Requirement(line), f"{substitute} (for {name})") for line in additions]
                    pending.extend(pending_more)
                    name = canonical(substitute)
                if name in self.exclude:
                    from_target[name].append({"specifier": str(requirement.specifier), "required_by": parent})
                    pinned = self._pinned(name)
                    if pinned is not None and not requirement.specifier.contains(pinned, prereleases=True):
                        parent_name, _, parent_version = parent.partition(" ")
                        if parent_name == root.name or not re.fullmatch(r"[0-9][0-9A-Za-z.+!-]*", parent_version):
                            raise UserError(f"{parent} needs {name}{requirement.specifier}, but the target has "
                                            f"{name} {pinned} (--exclude {name}{self.exclude[name]})")
                        return (parent_name, f"!={parent_version}",
                                f"{parent} needs {name}{requirement.specifier}, the target has {pinned}")
                    continue
                if name == root.name:
                    continue
                required_by[name].append(parent)
                extras[name] |= {canonical(e) for e in requirement.extras}
                if name in chosen:
                    version = self._Version(chosen[name].version)
                    if not requirement.specifier.contains(version, prereleases=True):
                        return (name, str(requirement.specifier),
                                f"{parent} needs {name}{requirement.specifier}, not {version}")
                else:
                    new[name].append(str(requirement.specifier))
            if new:
                specs = {}
                for name, clauses in new.items():
                    spec = self._SpecifierSet(",".join(c for c in (*clauses, *sorted(constraints[name])) if c))
                    specs[name] = str(spec)
                chosen.update(self.fetcher.fetch(specs))
            pending = []
            for name, wheel in sorted(chosen.items()):
                for extra in ("", *sorted(extras[name])):
                    if (name, extra) in processed:
                        continue
                    processed.add((name, extra))
                    for requirement in self._requirements_of(wheel, {extra} if extra else set()):
                        if extra and self._active(requirement, ()):
                            continue  # a base requirement, already followed
                        pending.append((requirement, f"{name} {wheel.version}"))
        return Resolution(chosen, dict(required_by), dict(from_target), substituted, 0)


# --------------------------------------------------------------------------- the bundle


def parse_excludes(values: Iterable[str]) -> dict[str, str]:
    """'torch==2.11.0,triton' (repeatable, or @FILE with one a line) -> {name: specifier}."""
    requirements = _packaging()[1]
    out: dict[str, str] = {}
    for value in values:
        items: list[str] = []
        if value.startswith("@"):
            path = Path(value[1:])
            if not path.is_file():
                raise UserError(f"--exclude {value}: no such file")
            for line in path.read_text().splitlines():
                line = line.split("#", 1)[0].strip()
                items += [part for part in line.split(",") if part.strip()]
        else:
            items = value.split(",")
        for item in (i.strip() for i in items):
            if not item:
                continue
            try:
                requirement = requirements.Requirement(item)
            except Exception as error:
                raise UserError(f"--exclude: cannot read {item!r} as a requirement ({error})") from None
            out[canonical(requirement.name)] = str(requirement.specifier)
    return out


def project_root() -> Path:
    root = Path(__file__).resolve().parent.parent
    if not (root / "pyproject.toml").is_file():
        raise UserError(f"k3lab bundle builds k3lab's wheel from its source tree; none at {root} (use --project)")
    return root


def build_project_wheel(project: Path, dest: Path, log=print) -> Path:
    """`pip wheel --no-deps` of a clean copy of the project: its top-level files and the k3lab package,
    so the work tree's build/, caches and run folders stay out (and are not written to)."""
    source = dest / "source"
    source.mkdir(parents=True)
    for path in project.iterdir():
        if path.is_file() and (path.name in ("pyproject.toml", "setup.py", "setup.cfg", "MANIFEST.in")
                               or path.name.upper().startswith(("README", "LICENSE", "COPYING"))):
            shutil.copy2(path, source / path.name)
    shutil.copytree(project / "k3lab", source / "k3lab",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info"))
    out = dest / "project-wheel"
    log(f"  pip wheel --no-deps {project}")
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--disable-pip-version-check", "-q",
                           "-w", str(out), str(source)], capture_output=True, text=True)
    wheels = sorted(out.glob("*.whl"))
    if done.returncode != 0 or len(wheels) != 1:
        raise UserError(f"pip wheel of {project} failed: {done.stderr.strip().splitlines()[-1:] or done.returncode}")
    return wheels[0]


def _cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "k3lab" / "bundle"


def slim_cached(source: Path, dest: Path, drop: Sequence[str], use_cache: bool, log=print) -> tuple[SlimResult, bool]:
    """slim_wheel with a cache keyed by the source's sha256 and the drop list (LZMA takes minutes)."""
    key = hashlib.sha256((sha256_of(source) + "\n" + "\n".join(sorted(drop)) + "\nlzma-1").encode()).hexdigest()[:24]
    cached = _cache_dir() / "slim" / key / source.name
    meta = cached.with_name("slim.json")
    if use_cache and cached.is_file() and meta.is_file():
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(cached, dest)
        return SlimResult(**json.loads(meta.read_text())), True
    log(f"  slimming {source.name} (LZMA, a few minutes)")
    result = slim_wheel(source, dest, drop)
    if use_cache:
        try:
            cached.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(dest, cached)
            meta.write_text(json.dumps(result.__dict__))
        except OSError:
            pass
    return result, False


def prepare_out_dir(out: Path) -> None:
    if out.exists() and not out.is_dir():
        raise UserError(f"{out} exists and is not a folder")
    if out.is_dir() and any(out.iterdir()):
        if not (out / MANIFEST).is_file():
            raise UserError(f"{out} is not empty and holds no {MANIFEST}: not overwriting it")
        for name in (WHEELS, SPARES, INSTALL_SH, MANIFEST):
            path = out / name
            if path.is_dir():
                shutil.rmtree(path)
            elif path.exists():
                path.unlink()
    (out / WHEELS).mkdir(parents=True, exist_ok=True)


def check_size(files: dict[str, int], max_size: int | None) -> int:
    """The total of `files` (relative path -> bytes); a UserError when it is over `max_size`."""
    total = sum(files.values())
    if max_size is not None and total > max_size:
        largest = ", ".join(f"{Path(p).name} {human(s)}" for p, s in sorted(files.items(), key=lambda x: -x[1])[:3])
        raise UserError(f"the bundle is {human(total)} ({total} bytes), over --max-size {human(max_size)}; "
                        f"largest: {largest}")
    return total


def write_manifest(out: Path, manifest: dict) -> int:
    """Write manifest.json with `total_size` counting the manifest itself; returns that total."""
    base = sum(entry["size"] for entry in manifest["files"])
    manifest["total_size"] = base
    for _ in range(5):  # the manifest's own length changes with the number in it
        text = json.dumps(manifest, indent=2) + "\n"
        total = base + len(text.encode())
        if manifest["total_size"] == total:
            break
        manifest["total_size"] = total
    (out / MANIFEST).write_text(text)
    return manifest["total_size"]


def file_entry(out: Path, path: Path, **extra) -> dict:
    return {"path": path.relative_to(out).as_posix(), "size": path.stat().st_size, "sha256": sha256_of(path), **extra}


INSTALL_TEMPLATE = r'''#!/usr/bin/env bash
# Installs this offline bundle: @@TITLE@@
# Target: Python @@PYTHON@@ (@@IMPL@@) on @@PLATFORMS@@. No package index is used.
#
#   bash install.sh                    # into the environment of python3 (or --python PY / $PYTHON)
#   bash install.sh --target DIR       # into DIR (pip --target), leaving site-packages alone;
#                                      # then: export PYTHONPATH=DIR:$PYTHONPATH PATH=DIR/bin:$PATH
#   bash install.sh --no-check         # skip the checks after installing
#
# Every wheel is installed with --no-deps: the packages the target already has
# (@@EXCLUDED_COUNT@@ named at bundle time, e.g. @@EXCLUDED_SAMPLE@@) are not in the bundle,
# so pip's resolver is not asked about them. spares/ holds small wheels of some of them,
# installed only where the target's own version is older than the bundle needs. The check
# afterwards compares the target's versions with what the bundled packages require, and
# imports the main modules.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
python="${PYTHON:-python3}"
target=""
check=1
while [ $# -gt 0 ]; do
  case "$1" in
    --target) target="${2:?--target needs a folder}"; shift 2 ;;
    --target=*) target="${1#*=}"; shift ;;
    --python) python="${2:?--python needs an interpreter}"; shift 2 ;;
    --python=*) python="${1#*=}"; shift ;;
    --no-check) check=0; shift ;;
    -h|--help) awk 'NR > 1 && !/^#/ {exit} NR > 1' "$0"; exit 0 ;;
    *) echo "install.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
"$python" - <<'PY'
import sys
want = "@@PYTHON_MINOR@@"
have = "%d.%d" % sys.version_info[:2]
if have != want:
    sys.exit(f"install.sh: this bundle is for Python {want}; {sys.executable} is Python {have}")
try:
    import lzma  # noqa: F401  (slimmed wheels are LZMA-compressed zips)
except ImportError:
    sys.exit(f"install.sh: {sys.executable} has no lzma module, which the slimmed wheels need")
PY
# spares: wheels of packages the target should have, installed only where its version is too old
spares=()
if [ -d "$here/spares" ]; then
  while IFS= read -r line; do
    [ -n "$line" ] && spares+=("$here/$line")
  done < <("$python" - "$here/manifest.json" <<'PY'
import importlib.metadata as md, json, sys
try:
    from packaging.specifiers import SpecifierSet
except ImportError:
    from pip._vendor.packaging.specifiers import SpecifierSet
for entry in json.load(open(sys.argv[1]))["files"]:
    if "spare_for" not in entry:
        continue
    try:
        have = md.version(entry["name"])
    except md.PackageNotFoundError:
        have = None
    if have is None or not SpecifierSet(entry["spare_for"]).contains(have, prereleases=True):
        print(f"install.sh: {entry['name']} {have or '(missing)'} does not satisfy {entry['spare_for']}: "
              f"installing the bundled {entry['version']}", file=sys.stderr)
        print(entry["path"])
PY
)
fi
args=(--no-index --no-deps --no-compile --no-cache-dir --disable-pip-version-check --find-links "$here/wheels")
if [ -n "$target" ]; then
  mkdir -p "$target"
  target="$(cd "$target" && pwd)"
  args+=(--target "$target" --upgrade)
  export PYTHONPATH="$target${PYTHONPATH:+:$PYTHONPATH}"
fi
echo "install.sh: installing $(ls "$here"/wheels/*.whl | wc -l) wheels and ${#spares[@]} spares with $python${target:+ into $target}"
"$python" -m pip install "${args[@]}" "$here"/wheels/*.whl ${spares[@]+"${spares[@]}"}
if [ "$check" = 1 ]; then
  "$python" - "$here/manifest.json" <<'PY'
import importlib, importlib.metadata as md, json, sys
manifest = json.load(open(sys.argv[1]))
try:
    from packaging.specifiers import SpecifierSet
except ImportError:
    from pip._vendor.packaging.specifiers import SpecifierSet
warnings = []
for name, needs in sorted(manifest["target_requirements"].items()):
    try:
        have = md.version(name)
    except md.PackageNotFoundError:
        warnings.append(f"{name} is not installed; needed by " + ", ".join(n["required_by"] for n in needs))
        continue
    for need in needs:
        if need["specifier"] and not SpecifierSet(need["specifier"]).contains(have, prereleases=True):
            warnings.append(f"{name} {have} does not satisfy {need['specifier']} ({need['required_by']})")
for line in warnings:
    print("install.sh: warning:", line)
failed = []
for module in manifest["imports"]:
    try:
        importlib.import_module(module)
    except Exception as error:
        failed.append(f"{module}: {type(error).__name__}: {error}")
for line in failed:
    print("install.sh: import failed:", line)
if failed:
    sys.exit(1)
print(f"install.sh: imported {', '.join(manifest['imports'])}"
      f"{'' if not warnings else f'; {len(warnings)} version warning(s) above'}")
PY
fi
if [ -n "$target" ]; then
  echo "install.sh: done. Use it with: export PYTHONPATH=$target:\$PYTHONPATH PATH=$target/bin:\$PATH"
else
  echo "install.sh: done."
fi
'''


def install_script(manifest: dict) -> str:
    target = manifest["target"]
    excluded = sorted(manifest["excluded"])
    replacements = {
        "@@TITLE@@": f"{manifest['project']['name']} {manifest['project']['version']}"
                     + (f"[{','.join(manifest['project']['extras'])}]" if manifest["project"]["extras"] else ""),
        "@@PYTHON_MINOR@@": ".".join(target["python_version"].split(".")[:2]),
        "@@PYTHON@@": target["python_version"],
        "@@IMPL@@": target["implementation"],
        "@@PLATFORMS@@": ", ".join(target["platforms"]) or "the platform it was built on",
        "@@EXCLUDED_COUNT@@": str(len(excluded)),
        "@@EXCLUDED_SAMPLE@@": ", ".join(excluded[:4]) or "none",
    }
    text = INSTALL_TEMPLATE
    for key, value in replacements.items():
        text = text.replace(key, value)
    return text


@dataclass
class BundleOptions:
    out: Path
    target: Target
    exclude: dict[str, str] = field(default_factory=dict)
    extras: tuple[str, ...] = ("gpu",)
    with_requirements: tuple[str, ...] = ()
    max_size: int | None = 64 * 2**20
    substitutes: dict[str, tuple[str, tuple[str, ...]]] = field(default_factory=lambda: dict(SUBSTITUTES))
    slim: dict[str, tuple[str, ...]] = field(default_factory=lambda: dict(SLIM_RULES))
    project: Path | None = None
    project_wheel: Path | None = None  # a wheel of k3lab already built (else built from `project`)
    use_cache: bool = True
    spare_max: int = 2**20


def build_bundle(options: BundleOptions, log=print, fetcher: Fetcher | None = None) -> dict:
    """Build the bundle in options.out; returns the manifest. A UserError when it is over max_size
    (the bundle stays on disk for a look)."""
    started = time.time()
    out = options.out
    prepare_out_dir(out)
    with tempfile.TemporaryDirectory(prefix="k3lab-bundle-") as tmp:
        work = Path(tmp)
        if options.project_wheel is not None:
            project_wheel_path = options.project_wheel
        else:
            log("building the project wheel")
            project_wheel_path = build_project_wheel(options.project or project_root(), work, log)
        root = WheelInfo.read(project_wheel_path)
        log(f"resolving {root.name}{[*options.extras] if options.extras else ''} for Python "
            f"{options.target.python_version} {', '.join(options.target.platforms) or '(this platform)'}"
            f", {len(options.exclude)} packages excluded")
        fetcher = fetcher or Fetcher(options.target, work, log)
        resolver = Resolver(options.target, fetcher, options.exclude, options.substitutes, log)
        resolution = resolver.resolve(root, {canonical(e) for e in options.extras}, options.with_requirements)
        files: list[dict] = []
        shutil.copyfile(project_wheel_path, out / WHEELS / project_wheel_path.name)
        files.append(file_entry(out, out / WHEELS / project_wheel_path.name, name=root.name, version=root.version,
                                required_by=["(the project)"]))
        for name, wheel in sorted(resolution.wheels.items()):
            dest = out / WHEELS / wheel.path.name
            extra: dict = {}
            if name in options.slim:
                result, from_cache = slim_cached(wheel.path, dest, options.slim[name], options.use_cache, log)
                extra["slimmed"] = {"dropped": list(options.slim[name]), "source_size": result.source_size,
                                    "source_sha256": sha256_of(wheel.path), "dropped_files": result.dropped_files,
                                    "dropped_uncompressed": result.dropped_bytes,
                                    "dropped_console_scripts": result.dropped_scripts, "compression": "lzma"}
                log(f"  {wheel.path.name}: {human(result.source_size)} -> {human(result.size)}"
                    f"{' (cached)' if from_cache else ''}")
            else:
                shutil.copyfile(wheel.path, dest)
            files.append(file_entry(out, dest, name=name, version=wheel.version,
                                    required_by=sorted(set(resolution.required_by.get(name, []))), **extra))
        if options.spare_max:
            add_spares(out, options, resolution, fetcher, files, log)
        imports = []
        for entry in files:
            imports += [m for m in CHECK_IMPORTS.get(entry["name"], ()) if m not in imports]
        manifest = {
            "format": "k3lab-bundle/1",
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "project": {"name": root.name, "version": root.version, "extras": list(options.extras)},
            "target": options.target.as_json(),
            "excluded": dict(sorted(options.exclude.items())),
            "substituted": resolution.substituted,
            "with": list(options.with_requirements),
            "files": files,
            "target_requirements": {k: v for k, v in sorted(resolution.from_target.items())},
            "imports": imports,
            "install": "bash install.sh [--target DIR] [--python PY]",
        }
        script = out / INSTALL_SH
        script.write_text(install_script(manifest))
        script.chmod(0o755)
        manifest["files"].append(file_entry(out, script))
        total = write_manifest(out, manifest)
    sizes = {entry["path"]: entry["size"] for entry in manifest["files"]}
    sizes[MANIFEST] = (out / MANIFEST).stat().st_size
    log(format_report(manifest, sizes, time.time() - started, fetcher.calls, resolution.restarts))
    check_size(sizes, options.max_size)
    assert total == sum(sizes.values())
    return manifest


def tidy_specifier(spec: str) -> str:
    """The same set of versions, written short: one lower and one upper bound ('>=4.0,>=4.16' -> '>=4.16')."""
    _, _, specifiers, _, version = _packaging()
    lower = upper = None
    others = []
    for clause in specifiers.SpecifierSet(spec):
        if clause.operator in (">=", ">", "<", "<="):
            v = version.Version(clause.version)
            if clause.operator.startswith(">"):
                if lower is None or v > lower[1] or (v == lower[1] and clause.operator == ">"):
                    lower = (str(clause), v)
            elif upper is None or v < upper[1] or (v == upper[1] and clause.operator == "<"):
                upper = (str(clause), v)
        else:
            others.append(str(clause))
    return ",".join(sorted({*others, *(b[0] for b in (lower, upper) if b)}))


def spare_requirements(from_target: dict[str, list[dict]], exclude: dict[str, str]) -> dict[str, str]:
    """Excluded packages whose version on the target is unknown (not pinned in --exclude) and that the
    bundle needs at some version: name -> the combined specifier."""
    specifiers = _packaging()[2]
    out = {}
    for name, needs in sorted(from_target.items()):
        if re.fullmatch(r"===?\s*[^,*\s]+", exclude.get(name, "").strip()):
            continue  # pinned: checked while resolving
        combined = specifiers.SpecifierSet(",".join(n["specifier"] for n in needs if n["specifier"]))
        if str(combined):
            out[name] = tidy_specifier(str(combined))
    return out


def add_spares(out: Path, options: BundleOptions, resolution: Resolution, fetcher: Fetcher, files: list[dict],
               log=print) -> None:
    """Small wheels of excluded packages, for a target whose own version turns out too old.

    install.sh installs a spare only when the target's version does not satisfy what the
    bundle needs, so a target with recent enough packages keeps its own.
    """
    wanted = spare_requirements(resolution.from_target, options.exclude)
    if not wanted:
        return
    log(f"spares: small wheels of {len(wanted)} excluded packages, installed only where the target's are too old")
    for name, wheel in sorted(fetcher.fetch(wanted, tolerant=True).items()):
        size = wheel.path.stat().st_size
        if size > options.spare_max:
            log(f"  no spare of {name} {wheel.version}: {human(size)} is over {human(options.spare_max)}")
            continue
        dest = out / SPARES / wheel.path.name
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(wheel.path, dest)
        files.append(file_entry(out, dest, name=name, version=wheel.version, spare_for=wanted[name],
                                required_by=[n["required_by"] for n in resolution.from_target[name]]))


def format_report(manifest: dict, sizes: dict[str, int], seconds: float, pip_calls: int, restarts: int) -> str:
    lines = [f"{'file':64s} {'size':>10s}"]
    versions = {entry["path"]: entry for entry in manifest["files"]}
    for path, size in sorted(sizes.items(), key=lambda item: -item[1]):
        entry = versions.get(path, {})
        note = (" (slimmed)" if entry.get("slimmed") else
                f" (spare, for {entry['name']}{entry['spare_for']})" if entry.get("spare_for") else "")
        lines.append(f"{path:64s} {human(size):>10s}{note}")
    total = sum(sizes.values())
    lines.append(f"total: {human(total)} ({total} bytes) in {len(sizes)} files; "
                 f"{len(manifest['target_requirements'])} packages left to the target; "
                 f"{pip_calls} pip downloads, {restarts} restarts, {seconds:.0f} s")
    return "\n".join(lines)


# --------------------------------------------------------------------------- command


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "bundle", help="build an offline install bundle (wheels + install.sh) for a machine with no package index",
        description="Build OUT_DIR/wheels, OUT_DIR/install.sh and OUT_DIR/manifest.json: k3lab and every "
                    "dependency the target lacks, as wheels for the target's Python and platform.")
    parser.add_argument("out", metavar="OUT_DIR", help="the bundle folder (created; an old bundle there is replaced)")
    parser.add_argument("--python-version", default="%d.%d" % sys.version_info[:2],
                        help="the target's Python, e.g. 3.12 (default: this one)")
    parser.add_argument("--platform", action="append", default=[], metavar="TAG",
                        help="a pip platform tag the target accepts, e.g. manylinux_2_28_x86_64 (repeatable; "
                             "default: this machine's)")
    parser.add_argument("--exclude", action="append", default=[], metavar="NAMES",
                        help="packages the target already has, comma-separated, optionally pinned "
                             "(torch==2.11.0,numpy); @FILE reads one a line (repeatable)")
    parser.add_argument("--extras", default="gpu", help="k3lab's extras to bundle, comma-separated (default: gpu; "
                                                        "'' for none)")
    parser.add_argument("--with", dest="with_requirements", action="append", default=[], metavar="REQS",
                        help="more requirements to bundle, comma-separated (e.g. pytest,hypothesis)")
    parser.add_argument("--max-size", default="64MiB", help="fail when the bundle is larger (default: 64MiB; "
                                                            "'none' for no limit)")
    parser.add_argument("--full-mlflow", action="store_true",
                        help="bundle the full mlflow (with its UI) instead of mlflow-skinny + sqlalchemy + alembic")
    parser.add_argument("--no-slim", action="store_true", help="bundle ray's wheel as published (~79 MB)")
    parser.add_argument("--spare-max-size", default="1MiB",
                        help="bundle a spare wheel of an excluded package whose target version is unknown when the "
                             "wheel is at most this big; install.sh uses it only if the target's is too old "
                             "(default: 1MiB; 0 for no spares)")
    parser.add_argument("--project", type=Path, default=None, help="k3lab's source tree (default: this one's)")
    parser.add_argument("--no-cache", action="store_true", help="do not reuse or store slimmed wheels in "
                                                                 "~/.cache/k3lab/bundle")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if not re.fullmatch(r"3(\.\d+){1,2}", args.python_version):
        raise UserError(f"--python-version {args.python_version!r}: use e.g. 3.12")
    with_requirements = tuple(r.strip() for value in args.with_requirements for r in value.split(",") if r.strip())
    requirements = _packaging()[1]
    for line in with_requirements:
        try:
            requirements.Requirement(line)
        except Exception as error:
            raise UserError(f"--with: cannot read {line!r} ({error})") from None
    substitutes = {} if args.full_mlflow else dict(SUBSTITUTES)
    options = BundleOptions(
        out=Path(args.out),
        target=Target(args.python_version, tuple(args.platform)),
        exclude=parse_excludes(args.exclude),
        extras=tuple(e.strip() for e in args.extras.split(",") if e.strip()),
        with_requirements=with_requirements,
        max_size=None if str(args.max_size).lower() in ("none", "0", "") else parse_size(args.max_size),
        substitutes=substitutes,
        slim={} if args.no_slim else dict(SLIM_RULES),
        project=args.project,
        use_cache=not args.no_cache,
        spare_max=0 if str(args.spare_max_size).lower() in ("none", "0", "") else parse_size(args.spare_max_size),
    )
    build_bundle(options)
    out = options.out
    print(f"install it offline with: bash {out}/install.sh --target DIR && "
          f"export PYTHONPATH=DIR:$PYTHONPATH PATH=DIR/bin:$PATH")
    return 0
