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
- slimming: ray's wheel is repacked without its Java jars, RLlib, Serve, the LLM
  library and the dashboard's web client, its ELF files stripped of the symbols linking
  does not need (RECORD and console scripts updated), and LZMA-compressed, which zip,
  the wheel format and pip all accept.

Excluded packages whose version on the target is unknown (not pinned) get a "spare":
their small wheel (up to --spare-max-size) in spares/, which install.sh installs only
where the target's own version does not satisfy what the bundle needs.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from k3lab.bundle.install import (CHECK_IMPORTS, INSTALL_SH, MANIFEST, SPARES, WHEELS, file_entry,
                                  write_install_script, write_manifest)
from k3lab.bundle.parts import split_bundle
from k3lab.bundle.resolve import SUBSTITUTES, Fetcher, Resolution, Resolver, Target, parse_constraints, parse_excludes
from k3lab.bundle.sizes import check_size, human, parse_size
from k3lab.bundle.wheels import SLIM_RULES, SlimResult, WheelInfo, canonical, packaging_modules, sha256_of, slim_wheel
from k3lab.errors import UserError


def project_root() -> Path:
    root = Path(__file__).resolve().parents[2]  # the source tree of k3lab/bundle/build.py
    if not (root / "pyproject.toml").is_file():
        raise UserError(f"k3lab bundle builds k3lab's wheel from its source tree; none at {root} (use --project)")
    return root


def check_project(project: Path | None, extras: tuple[str, ...]) -> None:
    """--project is a k3lab source tree and every --extras name one of its extras, before anything is
    downloaded or written (an unknown extra resolved to nothing after the downloads)."""
    import tomllib

    root = project or project_root()
    if not (root / "pyproject.toml").is_file() or not (root / "k3lab").is_dir():
        raise UserError(f"--project {root}: not a k3lab source tree (no pyproject.toml and k3lab/ in it)")
    declared = tomllib.loads((root / "pyproject.toml").read_text()).get("project", {}).get("optional-dependencies", {})
    unknown = [extra for extra in extras if canonical(extra) not in {canonical(name) for name in declared}]
    if unknown:
        raise UserError(f"--extras {unknown[0]}: not an extra of k3lab (extras: {', '.join(sorted(declared))})")


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


def slim_cached(source: Path, dest: Path, drop: Sequence[str], use_cache: bool, log=print,
                strip: str | None = None) -> tuple[SlimResult, bool]:
    """slim_wheel with a cache keyed by the source's sha256, the drop list and whether ELF files are
    stripped (LZMA takes minutes)."""
    recipe = "\n".join(sorted(drop)) + "\nlzma-1" + ("\nstrip-unneeded" if strip else "")
    key = hashlib.sha256((sha256_of(source) + "\n" + recipe).encode()).hexdigest()[:24]
    cached = _cache_dir() / "slim" / key / source.name
    meta = cached.with_name("slim.json")
    if use_cache and cached.is_file() and meta.is_file():
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(cached, dest)
        return SlimResult(**json.loads(meta.read_text())), True
    log(f"  slimming {source.name} (LZMA{', ELF files stripped' if strip else ''}, a few minutes)")
    result = slim_wheel(source, dest, drop, strip=strip)
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
        remove_bundle_files(out)
    (out / WHEELS).mkdir(parents=True, exist_ok=True)


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
    strip: bool = True  # ELF files of the slimmed wheels, where binutils' strip is on PATH
    part_size: int | None = None  # split into parts of at most this size (`k3lab.bundle.parts`)
    include_project: bool = True  # False: the target runs k3lab from a checkout on PYTHONPATH
    constraints: dict[str, str] = field(default_factory=dict)  # --constraint files: canonical name -> specifier


def build_bundle(options: BundleOptions, log=print, fetcher: Fetcher | None = None) -> dict:
    """Build the bundle in options.out; returns the manifest. A UserError when it is over max_size
    (the bundle stays on disk for a look). A build that fails before its manifest is written
    (a download, the resolution, Ctrl-C) removes what it wrote, so the folder is as a first run
    finds it and a second run is not refused as "not empty"."""
    out = options.out
    existed = out.exists()
    prepare_out_dir(out)
    try:
        return _build_into(out, options, log, fetcher)
    except BaseException:
        if not (out / MANIFEST).is_file():
            remove_bundle_files(out)
            if not existed and not any(out.iterdir()):
                out.rmdir()
        raise


def remove_bundle_files(out: Path) -> None:
    """What a bundle build writes into `out` (its wheels, spares, parts, install.sh, manifest)."""
    for path in [out / name for name in (WHEELS, SPARES, INSTALL_SH, MANIFEST)] + sorted(out.glob("part-*")):
        if path.is_dir():
            shutil.rmtree(path)
        elif path.exists():
            path.unlink()


def _build_into(out: Path, options: BundleOptions, log, fetcher: Fetcher | None) -> dict:
    started = time.time()
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
        resolver = Resolver(options.target, fetcher, options.exclude, options.substitutes, log, options.constraints)
        log_constraints_left_to_target(options, log)
        resolution = resolver.resolve(root, {canonical(e) for e in options.extras}, options.with_requirements)
        strip = strip_program(options, log)
        files: list[dict] = []
        if options.include_project:
            shutil.copyfile(project_wheel_path, out / WHEELS / project_wheel_path.name)
            files.append(file_entry(out, out / WHEELS / project_wheel_path.name, name=root.name,
                                    version=root.version, required_by=["(the project)"]))
        for name, wheel in sorted(resolution.wheels.items()):
            dest = out / WHEELS / wheel.path.name
            extra: dict = {}
            if name in options.slim:
                result, from_cache = slim_cached(wheel.path, dest, options.slim[name], options.use_cache, log, strip)
                extra["slimmed"] = {"dropped": list(options.slim[name]), "source_size": result.source_size,
                                    "source_sha256": sha256_of(wheel.path), "dropped_files": result.dropped_files,
                                    "dropped_uncompressed": result.dropped_bytes,
                                    "dropped_console_scripts": result.dropped_scripts, "compression": "lzma",
                                    "stripped_files": result.stripped_files,
                                    "stripped_uncompressed": result.stripped_bytes}
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
            "constraints": {name: options.constraints[name] for name in sorted(resolution.wheels)
                            if name in options.constraints},
            "files": files,
            "target_requirements": {k: v for k, v in sorted(resolution.from_target.items())},
            "imports": imports,
            "install": "bash install.sh [--target DIR] [--python PY]",
        }
        write_install_script(out, manifest)
        total = write_manifest(out, manifest)
    sizes = {entry["path"]: entry["size"] for entry in manifest["files"]}
    sizes[MANIFEST] = (out / MANIFEST).stat().st_size
    log(format_report(manifest, sizes, time.time() - started, fetcher.calls, resolution.restarts))
    check_size(sizes, options.max_size)
    assert total == sum(sizes.values())
    if options.part_size is not None:
        manifest = split_bundle(out, manifest, options.part_size)
        for name in manifest["parts"]:
            entries = [e for e in manifest["files"] if e["path"].startswith(name + "/")]
            log(f"{name}: {human(sum(e['size'] for e in entries))} in {len(entries)} files")
    return manifest


def log_constraints_left_to_target(options: BundleOptions, log=print) -> None:
    """Constrained packages the target supplies (--exclude) keep the target's version: say how many, and
    which of them the target pins at another version."""
    left = sorted(name for name in options.constraints if name in options.exclude)
    if not left:
        return
    differ = [f"{name}{options.constraints[name]} (the target's {options.exclude[name]})" for name in left
              if options.exclude[name] and options.exclude[name].replace(" ", "") != options.constraints[name]]
    log(f"  constraints: {len(left)} constrained packages are the target's"
        + (f"; at other versions there: {', '.join(differ)}" if differ else ""))


def strip_program(options: BundleOptions, log=print) -> str | None:
    """binutils' strip for the slimmed wheels' ELF files; None (and a line saying so) where it is missing."""
    if not (options.strip and options.slim):
        return None
    found = shutil.which("strip")
    if found is None:
        log("  strip (binutils) is not on PATH: the slimmed wheels keep their ELF symbols")
    return found


def tidy_specifier(spec: str) -> str:
    """The same set of versions, written short: one lower and one upper bound ('>=4.0,>=4.16' -> '>=4.16')."""
    _, _, specifiers, _, version = packaging_modules()
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
    specifiers = packaging_modules()[2]
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
    wanted = spare_requirements(resolution.from_target, options.exclude)  # what the target must satisfy
    if not wanted:
        return
    log(f"spares: small wheels of {len(wanted)} excluded packages, installed only where the target's are too old")
    held = {name: tidy_specifier(",".join(c for c in (spec, options.constraints.get(name, "")) if c))
            for name, spec in wanted.items()}  # the spare itself at the constrained version
    for name, wheel in sorted(fetcher.fetch(held, tolerant=True).items()):
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


def run(args: argparse.Namespace) -> int:
    if not re.fullmatch(r"3(\.\d+){1,2}", args.python_version):
        raise UserError(f"--python-version {args.python_version!r}: use e.g. 3.12")
    with_requirements = tuple(r.strip() for value in args.with_requirements for r in value.split(",") if r.strip())
    requirements = packaging_modules()[1]
    for line in with_requirements:
        try:
            requirements.Requirement(line)
        except Exception as error:
            raise UserError(f"--with: cannot read {line!r} ({error})") from None
    substitutes = {} if args.full_mlflow else dict(SUBSTITUTES)
    extras = tuple(e.strip() for e in args.extras.split(",") if e.strip())
    check_project(args.project, extras)
    part_size = None if args.part_size is None else parse_size(args.part_size)
    if part_size is not None and part_size < 2**20:
        raise UserError(f"--part-size {args.part_size}: must be at least 1MiB")
    options = BundleOptions(
        out=Path(args.out),
        target=Target(args.python_version, tuple(args.platform)),
        exclude=parse_excludes(args.exclude),
        extras=extras,
        with_requirements=with_requirements,
        max_size=None if str(args.max_size).lower() in ("none", "0", "") else parse_size(args.max_size),
        substitutes=substitutes,
        slim={} if args.no_slim else dict(SLIM_RULES),
        project=args.project,
        use_cache=not args.no_cache,
        strip=not args.no_strip,
        spare_max=0 if str(args.spare_max_size).lower() in ("none", "0", "") else parse_size(args.spare_max_size),
        part_size=part_size,
        include_project=not args.without_project,
        constraints=parse_constraints(args.constraint),
    )
    manifest = build_bundle(options)
    out = options.out
    scripts = [f"{out}/{part}/install.sh" for part in manifest.get("parts", ())] or [f"{out}/install.sh"]
    print("install it offline with: " + " && ".join(f"bash {script} --target DIR" for script in scripts)
          + " && export PYTHONPATH=DIR:$PYTHONPATH PATH=DIR/bin:$PATH")
    return 0
