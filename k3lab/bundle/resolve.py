"""Resolving the bundle's closure for the target: `Target`, the `Fetcher` (one `pip download
--no-deps` per wheel) and the `Resolver` (markers, constraints, restarts; see `k3lab.bundle`)."""

from __future__ import annotations

import re
import subprocess
import sys
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

from k3lab.bundle.wheels import WheelInfo, canonical, packaging_modules
from k3lab.errors import UserError


# Distribution bundled in place of another, and what the substitute needs on top.
SUBSTITUTES: dict[str, tuple[str, tuple[str, ...]]] = {
    # mlflow-skinny has MlflowClient and the SQL tracking store; the store needs these two.
    "mlflow": ("mlflow-skinny", ("sqlalchemy>=1.4.0,<3", "alembic!=1.10.0,<2")),
}


MAX_RESTARTS = 60


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
        markers = packaging_modules()[0]
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
    """`pins` (canonical name -> specifier, from `--constraint` files) narrow the versions of the
    packages the bundle holds, as pip's `-c` does; they never add a package."""

    def __init__(self, target: Target, fetcher: Fetcher, exclude: dict[str, str],
                 substitutes: dict[str, tuple[str, tuple[str, ...]]], log=print, pins: dict[str, str] | None = None):
        self.target = target
        self.pins = {canonical(name): spec for name, spec in (pins or {}).items()}
        self.env = target.marker_environment()
        self.fetcher = fetcher
        self.exclude = exclude  # canonical name -> specifier ("" = any version)
        self.substitutes = {canonical(k): v for k, v in substitutes.items()}
        for name, (substitute, _) in self.substitutes.items():  # mlflow==X pins mlflow-skinny==X too
            if name in self.pins:
                self.pins.setdefault(canonical(substitute), self.pins[name])
        self.log = log
        _, requirements, specifiers, _, version = packaging_modules()
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
                self._check_pin(name, requirement.specifier, parent)
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
                    pinned = self.pins.get(name, "")
                    spec = self._SpecifierSet(",".join(c for c in (*clauses, *sorted(constraints[name]), pinned) if c))
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

    def _check_pin(self, name: str, specifier, parent: str) -> None:
        """A requirement no pinned version meets is one line naming both (not a failed download)."""
        pin = self.pins.get(name, "")
        match = re.fullmatch(r"===?\s*([^,*\s]+)", pin.strip())
        if match and not specifier.contains(self._Version(match.group(1)), prereleases=True):
            raise UserError(f"{parent} needs {name}{specifier}, but the constraints pin {name}{pin}")


def read_requirement(text: str, where: str, what: str):
    """`text` as a packaging Requirement; a UserError naming `where` it came from otherwise."""
    try:
        return packaging_modules()[1].Requirement(text)
    except Exception as error:
        raise UserError(f"{where}: cannot read {text!r} as {what} ({error})") from None


def parse_constraints(paths: Iterable[Path | str]) -> dict[str, str]:
    """pip constraints files ('name==1.2', comments, blank lines) -> {canonical name: specifier}."""
    out: dict[str, str] = {}
    for value in paths:
        path = Path(value)
        if not path.is_file():
            raise UserError(f"--constraint {path}: no such file")
        for number, line in enumerate(path.read_text().splitlines(), 1):
            line = line.split("#", 1)[0].strip()
            if not line:
                continue
            requirement = read_requirement(line, f"{path}:{number}", "a constraint")
            if requirement.extras or requirement.url:
                raise UserError(f"{path}:{number}: {line!r}: a constraint names a version range only")
            name = canonical(requirement.name)
            out[name] = ",".join(c for c in (out.get(name, ""), str(requirement.specifier)) if c)
    return out


def parse_excludes(values: Iterable[str]) -> dict[str, str]:
    """'torch==2.11.0,triton' (repeatable, or @FILE with one a line) -> {name: specifier}."""
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
            requirement = read_requirement(item, "--exclude", "a requirement")
            out[canonical(requirement.name)] = str(requirement.specifier)
    return out
