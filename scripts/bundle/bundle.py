#!/usr/bin/env python3
"""The offline bundle: k3lab's dependencies as wheels, in parts, for a machine with no package index.

    python scripts/bundle/bundle.py build OUT --python-version 3.12 --platform TAG ... \\
        --preinstalled FILE --constraint constraints.txt --part-size 28MiB --import ray.tune ...
    python scripts/bundle/bundle.py check PART      (what scripts/bundle/install.sh runs after a part)

pip resolves and fetches: `pip install --dry-run --report` picks every version from the wheels'
metadata (no wheel is downloaded for it), `pip download --no-deps` fetches the chosen wheels, and
`pip install --no-index --no-deps --target` installs them on the target. What pip lacks is here:
- the target's own packages (--preinstalled, one `name` or `name==version` a line): the pinned
  ones enter the resolution as empty wheels at the target's version (`2.11.0+target`), so pip
  takes the target's torch as it is instead of following it into CUDA; no preinstalled package
  is bundled, nor a package that only preinstalled ones need; the small unpinned ones the bundle
  needs travel as spares (below SPARE_MAX), installed only where the target's is too old;
- mlflow is bundled as mlflow-skinny + sqlalchemy + alembic (the tracking client and the SQL
  store k3lab uses; the full package adds the UI server);
- ray's wheel is repacked without the parts k3lab never runs (SLIM), its ELF files stripped of
  the symbols linking does not need, LZMA-compressed (a wheel pip installs as any other);
- the wheels go into part-1, part-2, ... of at most --part-size each (a transfer's cap), each
  with a part.json; the last part's `check` runs `pip check`, installs the spares it asks for,
  and imports the main modules.
pip evaluates environment markers with the interpreter it runs on, not --python-version's: a
dependency only a newer Python needs is missed here and reported by `check` on the target.
"""

from __future__ import annotations

import argparse
import base64
import csv
import hashlib
import importlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import tomllib
import zipfile
from pathlib import Path

try:
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name as canonical
except ImportError:  # an interpreter without packaging: the copy pip vendors
    from pip._vendor.packaging.requirements import Requirement
    from pip._vendor.packaging.utils import canonicalize_name as canonical

# What the bundle leaves out of a wheel: distribution -> paths inside it. k3lab starts Ray without
# the dashboard (its agent stays) and uses Tune only.
SLIM = {"ray": ("ray/jars", "ray/rllib", "ray/llm", "ray/serve", "ray/dashboard/client/build")}

# A requirement bundled as others: mlflow's tracking client and SQL store, without its UI server.
SWAP = {"mlflow": ("mlflow-skinny", "sqlalchemy", "alembic")}

PART_FILE = "part.json"
SPARE_MAX = 2**20  # the largest wheel of a preinstalled package carried as a spare
PART_RESERVE = 64 * 2**10  # room in a part for its part.json
UNITS = {"b": 1, "kib": 2**10, "mib": 2**20, "gib": 2**30, "kb": 10**3, "mb": 10**6, "gb": 10**9}


class BundleError(Exception):
    """A one-line reason the bundle cannot be built or checked."""


def parse_size(text: str) -> int:
    """'28MiB', '500MB' or a number of bytes."""
    match = re.fullmatch(r"([0-9]+(?:\.[0-9]+)?)\s*([A-Za-z]*)", text.strip())
    if not match or match.group(2).lower() not in UNITS | {"": 1}:
        raise BundleError(f"--part-size {text!r}: write e.g. 28MiB or 500MB")
    return int(float(match.group(1)) * (UNITS | {"": 1})[match.group(2).lower()])


def read_names(path: Path, pinned_only: bool = False) -> dict[str, str]:
    """A list of packages, `name` or `name==version` a line (# comments): canonical name -> version or ''.
    pinned_only: a constraints file, every line `name==version`."""
    if not path.is_file():
        raise BundleError(f"{path}: no such file")
    out = {}
    for number, line in enumerate(path.read_text().splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        match = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:==\s*([^\s,;=]+))?", line)
        if line and (match is None or (pinned_only and not match.group(2))):
            rule = "name==version" if pinned_only else "a name or name==version"
            raise BundleError(f"{path}:{number}: {line!r}: write {rule}")
        if line:
            out[canonical(match.group(1))] = match.group(2) or ""
    return out


def project_requirements(pyproject: Path, extras: list[str]) -> list[str]:
    """The project's dependencies and those of `extras`, with SWAP applied."""
    project = tomllib.loads(pyproject.read_text())["project"]
    optional = project.get("optional-dependencies", {})
    for extra in extras:
        if extra not in optional:
            raise BundleError(f"{pyproject}: no extra {extra!r} (extras: {', '.join(sorted(optional))})")
    lines = [*project["dependencies"], *(r for extra in extras for r in optional[extra])]
    out = []
    for line in lines:
        name = re.match(r"[A-Za-z0-9._-]+", line).group(0)
        first, *others = SWAP.get(canonical(name), (name,))
        out += [first + line[len(name):], *others]  # mlflow>=3.17 -> mlflow-skinny>=3.17, sqlalchemy, alembic
    return out


def stub_wheel(folder: Path, name: str, version: str) -> Path:
    """An empty wheel of `name` at the target's `version` (local label +target) with no dependencies."""
    dist, version = canonical(name).replace("-", "_"), f"{version}+target"
    info = f"{dist}-{version}.dist-info"
    files = {f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
             f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: k3lab-bundle\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    files[f"{info}/RECORD"] = "".join(f"{path},,\n" for path in [*files, f"{info}/RECORD"])
    path = folder / f"{dist}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as archive:
        for member, text in files.items():
            archive.writestr(member, text)
    return path


def run_pip(args: list[str], what: str) -> None:
    done = subprocess.run([sys.executable, "-m", "pip", *args, "--disable-pip-version-check"])
    if done.returncode != 0:
        raise BundleError(f"{what} failed (pip exited {done.returncode}; its error is above)")


def resolve(work: Path, requirements: list[str], preinstalled: dict[str, str], constraints: dict[str, str],
            target: list[str]) -> dict:
    """pip's resolution for the target as its --report (JSON): the target's pinned packages as stubs and
    constraints, every other package held by the constraints file."""
    stubs = work / "stubs"
    stubs.mkdir()
    for name, version in preinstalled.items():
        if version:
            stub_wheel(stubs, name, version)
    pins = {name: version for name, version in preinstalled.items() if version}
    pins |= {name: version for name, version in constraints.items() if not preinstalled.get(name)}
    (work / "constraints.txt").write_text("".join(f"{name}=={version}\n" for name, version in sorted(pins.items())))
    (work / "requirements.txt").write_text("\n".join(requirements) + "\n")
    run_pip(["install", "--dry-run", "--ignore-installed", "--quiet", "--report", str(work / "report.json"),
             "--target", str(work / "unused"), *target, "--find-links", str(stubs),
             "-c", str(work / "constraints.txt"), "-r", str(work / "requirements.txt")], "pip's resolution")
    return json.loads((work / "report.json").read_text())


def bundled(report: dict, preinstalled: dict[str, str]) -> tuple[dict[str, str], dict[str, str]]:
    """name -> version of what the target lacks: the resolved packages reached from the requirements,
    with their extras, through packages the target does not have (a preinstalled package's own
    dependencies stay its own); and of the unpinned preinstalled packages they reach (the spares'
    candidates). Markers are read as pip read them, on this interpreter."""
    items = {canonical(item["metadata"]["name"]): item for item in report["install"]}
    pending = [(name, extra) for name, item in items.items() if item["requested"]
               for extra in ("", *item.get("requested_extras", []))]
    seen: set[tuple[str, str]] = set()
    spares = set()
    while pending:
        name, extra = pending.pop()
        if name in preinstalled and not preinstalled[name] and name in items:
            spares.add(name)
        if (name, extra) in seen or name in preinstalled or name not in items:
            continue
        seen.add((name, extra))
        for line in items[name]["metadata"].get("requires_dist", []):
            requirement = Requirement(line)
            if requirement.marker is None or requirement.marker.evaluate({"extra": extra}):
                pending += [(canonical(requirement.name), e) for e in ("", *requirement.extras)]
    version = {name: items[name]["metadata"]["version"] for name in items}
    return ({name: version[name] for name in sorted({name for name, _ in seen})},
            {name: version[name] for name in sorted(spares)})


def record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def stripped(archive: zipfile.ZipFile, members: list[zipfile.ZipInfo], strip: str) -> dict[str, bytes]:
    """name -> the bytes of each ELF member after `strip --strip-unneeded`, where that made it smaller."""
    out = {}
    with tempfile.TemporaryDirectory(prefix="bundle-strip-") as tmp:
        work = Path(tmp) / "member"
        for info in members:
            data = archive.read(info)
            if data[:4] != b"\x7fELF":
                continue
            work.write_bytes(data)
            done = subprocess.run([strip, "--strip-unneeded", str(work)], capture_output=True)
            if done.returncode == 0 and work.stat().st_size < len(data):
                out[info.filename] = work.read_bytes()
    return out


def without_scripts(text: str, dropped) -> str:
    """entry_points.txt without the console and GUI scripts whose module was dropped."""
    lines, section = [], ""
    for line in text.splitlines():
        if line.strip().startswith("["):
            section = line.strip()
        elif section in ("[console_scripts]", "[gui_scripts]") and "=" in line:
            module = line.split("=", 1)[1].split(":")[0].strip().replace(".", "/")
            if dropped(module) or dropped(module + ".py"):
                continue
        lines.append(line)
    return "\n".join(lines) + "\n"


def slim_wheel(source: Path, dest: Path, drop: tuple[str, ...], strip: str | None) -> None:
    """`source` repacked as `dest` without the paths under `drop`, ELF files stripped where `strip` is
    given, every member LZMA-compressed; RECORD and entry_points.txt follow."""
    def dropped(path: str) -> bool:
        return any(path == prefix or path.startswith(prefix + "/") for prefix in drop)

    with zipfile.ZipFile(source) as src:
        kept = [info for info in src.infolist() if not dropped(info.filename) and not info.is_dir()]
        (info_dir,) = {top for top in (info.filename.split("/")[0] for info in kept) if top.endswith(".dist-info")}
        record, entry_points = f"{info_dir}/RECORD", f"{info_dir}/entry_points.txt"
        changed = stripped(src, kept, strip) if strip else {}
        if entry_points in src.namelist():
            changed[entry_points] = without_scripts(src.read(entry_points).decode(), dropped).encode()
        rows = []
        for row in csv.reader(io.StringIO(src.read(record).decode())):
            if row and not dropped(row[0]):
                data = changed.get(row[0])
                rows.append(row if data is None else [row[0], record_hash(data), str(len(data))])
        text = io.StringIO()
        csv.writer(text, lineterminator="\n").writerows(rows)
        changed[record] = text.getvalue().encode()
        kept.sort(key=lambda info: (info.filename.startswith(info_dir + "/"), info.filename == record))
        with zipfile.ZipFile(dest, "w", compression=zipfile.ZIP_LZMA) as out:
            for info in kept:
                member = zipfile.ZipInfo(info.filename, date_time=info.date_time)
                member.external_attr, member.compress_type = info.external_attr, zipfile.ZIP_LZMA
                out.writestr(member, changed[info.filename] if info.filename in changed else src.read(info))


def plan_parts(sizes: dict[str, int], part_size: int) -> list[list[str]]:
    """File names in parts of at most `part_size` (each keeping PART_RESERVE for its part.json):
    largest first, each into the first part with room."""
    budget = part_size - PART_RESERVE
    parts: list[list[str]] = []
    for name in sorted(sizes, key=lambda n: (-sizes[n], n)):
        if sizes[name] > budget:
            raise BundleError(f"{name} is {sizes[name] / 2**20:.1f} MiB, over a part's room "
                              f"({budget / 2**20:.1f} MiB of --part-size)")
        room = next((part for part in parts if sum(sizes[n] for n in part) + sizes[name] <= budget), None)
        if room is None:
            parts.append(room := [])
        room.append(name)
    return parts


def write_parts(out: Path, work: Path, part_size: int, info: dict) -> None:
    """The wheels in work/wheels moved into out/part-1, part-2, ..., each with its part.json; the spares
    (work/spares) into spares/ of the part with the most room, numbered last: its check installs them."""
    sizes = {path.name: path.stat().st_size for path in (work / "wheels").glob("*.whl")}
    spares = {path.name: path.stat().st_size for path in (work / "spares").glob("*.whl")}
    parts = plan_parts(sizes, part_size)
    parts.sort(key=lambda part: -sum(sizes[n] for n in part))  # the one with the most room last
    if parts and sum(sizes[n] for n in parts[-1]) + sum(spares.values()) > part_size - PART_RESERVE:
        raise BundleError(f"no part has room for the spares ({sum(spares.values())} bytes): give a larger --part-size")
    for index, names in enumerate(parts, 1):
        folder = out / f"part-{index}"
        (folder / "spares").mkdir(parents=True)
        for name in names:
            shutil.move(work / "wheels" / name, folder / name)
        for name in spares if index == len(parts) else ():
            shutil.move(work / "spares" / name, folder / "spares" / name)
        part = info | {"part": index, "of": len(parts), "wheels": sorted(names),
                       "spares": sorted(spares) if index == len(parts) else []}
        (folder / PART_FILE).write_text(json.dumps(part, indent=1) + "\n")
        total = sum(path.stat().st_size for path in folder.rglob("*") if path.is_file())
        print(f"part-{index}: {len(names)} wheels{f', {len(spares)} spares' if part['spares'] else ''}, "
              f"{total / 2**20:.2f} MiB ({total} bytes)")
    print("install offline, in order, into one folder: "
          + "; ".join(f"bash scripts/bundle/install.sh {out}/part-{i} DIR" for i in range(1, len(parts) + 1)))


def prepare_out(out: Path) -> None:
    """An empty folder, or one that holds an earlier bundle's parts (removed)."""
    if out.exists() and not out.is_dir():
        raise BundleError(f"{out} is not a folder")
    old = sorted(out.glob("part-*")) if out.is_dir() else []
    if out.is_dir() and (set(out.iterdir()) != set(old) or not all((p / PART_FILE).is_file() for p in old)):
        raise BundleError(f"{out} holds files other than an earlier bundle's parts: not overwriting it "
                          "(remove it, or name another folder)")
    for part in old:
        shutil.rmtree(part)
    out.mkdir(parents=True, exist_ok=True)


def slim_all(folder: Path) -> None:
    """The wheels in `folder` that SLIM names, slimmed in place (ELF files stripped where strip is on PATH)."""
    strip = shutil.which("strip")
    for path in sorted(folder.glob("*.whl")):
        name = canonical(path.name.split("-")[0])
        if name in SLIM:
            print(f"slimming {path.name} (LZMA{', ELF files stripped' if strip else ', strip not on PATH'}; minutes)")
            slimmed = folder.parent / path.name
            slim_wheel(path, slimmed, SLIM[name], strip)
            print(f"  {path.stat().st_size / 2**20:.1f} MiB -> {slimmed.stat().st_size / 2**20:.1f} MiB")
            slimmed.replace(path)


def build(args: argparse.Namespace) -> None:
    preinstalled = {name: v for path in args.preinstalled for name, v in read_names(Path(path)).items()}
    constraints = {name: v for path in args.constraint for name, v in read_names(Path(path), True).items()}
    requirements = project_requirements(Path(args.project) / "pyproject.toml", args.extras)
    part_size = parse_size(args.part_size)
    target = ["--only-binary=:all:", "--python-version", args.python_version, "--implementation", "cp",
              *(arg for tag in args.platform for arg in ("--platform", tag)), *args.pip_arg]
    out = Path(args.out)
    prepare_out(out)
    with tempfile.TemporaryDirectory(prefix="bundle-") as tmp:
        work = Path(tmp)
        versions, spares = bundled(resolve(work, requirements, preinstalled, constraints, target), preinstalled)
        print(f"bundling {len(versions)} packages the target lacks: "
              + ", ".join(f"{n}=={v}" for n, v in versions.items()))
        for folder, wanted in (("wheels", versions), ("spares", spares)):
            (work / folder).mkdir()
            if wanted:
                run_pip(["download", "--no-deps", "--quiet", "-d", str(work / folder), *target,
                         *(f"{n}=={v}" for n, v in wanted.items())], f"pip download of the {folder}")
        large = [path for path in (work / "spares").glob("*.whl") if path.stat().st_size > SPARE_MAX]
        for path in large:
            path.unlink()
        print(f"spares, installed only where the target's own is too old: {len(spares) - len(large)} of {len(spares)} "
              f"preinstalled packages the bundle needs (the others' wheels are over {SPARE_MAX} bytes)")
        slim_all(work / "wheels")
        write_parts(out, work, part_size, {"bundled": versions, "imports": args.imports})


def pip_check_problems(output: str, names) -> list[str]:
    """The lines of `pip check` about the bundled distributions `names` (the target's own stay its own)."""
    return [line for line in output.splitlines() if line.split() and canonical(line.split()[0]) in names]


def pip_check(names) -> list[str]:
    done = subprocess.run([sys.executable, "-m", "pip", "check", "--disable-pip-version-check"],
                          capture_output=True, text=True)
    return pip_check_problems(done.stdout, names)


def install_spares(part: Path, target: str, problems: list[str]) -> None:
    """The part's spares of the packages `pip check` names (too old or missing), into `target`."""
    wanted = {canonical(m) for line in problems for m in re.findall(r"(?:requires|but you have) ([\w.-]+)", line)}
    wheels = [part / "spares" / f for f in os.listdir(part / "spares") if canonical(f.split("-")[0]) in wanted]
    if wheels:
        print(f"check: installing the bundled {', '.join(sorted(w.name.split('-')[0] for w in wheels))}"
              " in place of the target's")
        run_pip(["install", "--no-index", "--no-deps", "--quiet", "--upgrade", "--target", target,
                 *map(str, wheels)], "pip install of the spares")


def check(args: argparse.Namespace) -> None:
    """After a part: nothing until the last one; then `pip check` for the bundled packages (the spares
    it asks for installed, what is left a warning) and the imports (an error when one fails)."""
    path = Path(args.part) / PART_FILE
    if not path.is_file():
        raise BundleError(f"{path}: no such file (a part of the bundle holds one)")
    info = json.loads(path.read_text())
    if info["part"] < info["of"]:
        print(f"check: part {info['part']} of {info['of']} installed; part {info['of']} checks, once every part is in")
        return
    install_spares(Path(args.part), args.target, pip_check(set(info["bundled"])))
    problems = pip_check(set(info["bundled"]))
    for line in problems:
        print(f"check: warning: {line}")
    failed = []
    for module in info["imports"]:
        try:
            importlib.import_module(module)
        except Exception as error:  # any failure to import is what the check reports
            failed.append(f"{module} ({type(error).__name__}: {error})")
    if failed:
        raise BundleError(f"import failed: {'; '.join(failed)}")
    print(f"check: imported {', '.join(info['imports']) or 'nothing'}; {len(info['bundled'])} bundled packages, "
          f"{len(problems)} pip check warnings")


def parser() -> argparse.ArgumentParser:
    main = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = main.add_subparsers(dest="command", required=True)
    make = commands.add_parser("build", help="resolve, download, slim and split the bundle into OUT/part-*")
    make.add_argument("out", help="the bundle's folder (an earlier bundle there is replaced)")
    make.add_argument("--python-version", default="%d.%d" % sys.version_info[:2], help="the target's Python")
    make.add_argument("--platform", action="append", default=[], help="a platform tag the target takes (repeat)")
    make.add_argument("--preinstalled", action="append", default=[], help="a list of what the target has")
    make.add_argument("--constraint", action="append", default=[], help="a pip constraints file, name==version")
    make.add_argument("--extras", action="append", default=[], help="an extra of the project to bundle too")
    make.add_argument("--project", default=str(Path(__file__).resolve().parents[2]), help="where pyproject.toml is")
    make.add_argument("--part-size", default="28MiB", help="the most a part may hold (default 28MiB)")
    make.add_argument("--import", dest="imports", action="append", default=[], help="a module the check imports")
    make.add_argument("--pip-arg", action="append", default=[], help="an argument for pip's resolution and download")
    make.set_defaults(func=build)
    after = commands.add_parser("check", help="after installing a part: pip check and imports, at the last part")
    after.add_argument("part", help="the part's folder")
    after.add_argument("--target", required=True, help="the folder the parts were installed into")
    after.set_defaults(func=check)
    return main


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        args.func(args)
    except BundleError as error:
        print(f"bundle.py: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
