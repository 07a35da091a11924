"""Write constraints.txt: the versions of k3lab's dependencies (every extra) installed in this
environment, one `name==version` a line, for the laptop install, the offline GPU bundle and the
compose images to install from (`pip install -c constraints.txt ...`, `bundle.py build --constraint`).

    python scripts/lock_versions.py            # rewrite constraints.txt from this environment
    python scripts/lock_versions.py --check    # exit 1 when constraints.txt differs from it
    python scripts/lock_versions.py --floors FILE [--extras test]
                                               # the lowest versions pyproject's ranges allow (CI's floors job)

Left out: what each machine's platform supplies (torch and the CUDA libraries and Triton built
for it) and k3lab's Docker-side tools (the `compose` extra). Run it in an environment installed
with `pip install -e ".[test,hf,tokenizers]"` (add `flash-linear-attention` for the gpu extra).
"""

from __future__ import annotations

import argparse
import re
import sys
import tomllib
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement

REPO = Path(__file__).resolve().parents[1]
CONSTRAINTS = REPO / "constraints.txt"
PLATFORM = re.compile(r"^(torch|torchvision|torchaudio|triton|nvidia-.*|cuda-.*|pytorch-triton.*)$")
SKIP_EXTRAS = {"compose"}
HEADER = """\
# The one resolved set of versions k3lab installs everywhere, so a store written on one machine
# opens on every other (MLflow refuses a store from a newer MLflow):
#   laptop:         pip install -c constraints.txt -e .          (or -e ".[test]")
#   GPU bundle:     scripts/bundle/h200.sh                        (bundle.py build --constraint constraints.txt)
#   compose images: docker/Dockerfile, docker/Dockerfile.cpu      (pip install -c constraints.txt)
# torch, Triton and the CUDA libraries are left to each platform (the CPU build, the CUDA image).
# Written by `python scripts/lock_versions.py` from an environment that installed the ranges of
# pyproject.toml; `--check` compares. Packages a target machine already has (the GPU image's list in
# scripts/bundle/h200-preinstalled.txt) stay the target's.
"""


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def project_requirements() -> list[Requirement]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    lines = list(project["dependencies"])
    for extra, requirements in project.get("optional-dependencies", {}).items():
        if extra not in SKIP_EXTRAS:
            lines += requirements
    return [Requirement(line) for line in lines]


def installed_closure(roots: list[Requirement]) -> dict[str, str]:
    """canonical name -> installed version, for the roots and everything they need here."""
    found: dict[str, str] = {}
    seen: set[tuple[str, frozenset]] = set()
    pending = [(r, frozenset()) for r in roots]
    while pending:
        requirement, _ = pending.pop()
        name = canonical(requirement.name)
        key = (name, frozenset(requirement.extras))
        if key in seen:
            continue
        seen.add(key)
        if PLATFORM.match(name):
            continue  # the platform's, with what it needs
        try:
            distribution = metadata.distribution(requirement.name)
        except metadata.PackageNotFoundError:
            continue
        found[name] = distribution.version
        for line in distribution.requires or ():
            child = Requirement(line)
            marker = child.marker
            if marker is None or any(marker.evaluate({"extra": e}) for e in ("", *requirement.extras)):
                pending.append((child, frozenset()))
    return found


def floors(extras: set[str]) -> dict[str, str]:
    """canonical name -> the lowest version the project's own requirements (base and `extras`) allow;
    only requirements with a lower bound, the platform's left out."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    lines = list(project["dependencies"])
    for extra in sorted(extras):
        lines += project["optional-dependencies"][extra]
    out: dict[str, str] = {}
    for requirement in map(Requirement, lines):
        name = canonical(requirement.name)
        lows = [s.version for s in requirement.specifier if s.operator in (">=", "==", "~=")]
        if lows and not PLATFORM.match(name):
            out[name] = max(lows, key=lambda v: tuple(int(p) for p in re.findall(r"\d+", v)))
    return out


def render(versions: dict[str, str]) -> str:
    pins = [f"{name}=={version}" for name, version in sorted(versions.items())]
    return HEADER + "\n".join(pins) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare instead of writing")
    parser.add_argument("--floors", type=Path, metavar="FILE", help="write the floors of the ranges to FILE")
    parser.add_argument("--extras", default="", help="with --floors: the extras whose floors count too")
    parser.add_argument("--floor", metavar="NAME", help="print the lower bound pyproject gives NAME (torch: 2.9)")
    args = parser.parse_args(argv)
    if args.floor:
        found = [s.version for r in project_requirements() if canonical(r.name) == canonical(args.floor)
                 for s in r.specifier if s.operator in (">=", "==", "~=")]
        if not found:
            print(f"pyproject.toml gives {args.floor} no lower bound", file=sys.stderr)
            return 1
        print(found[0])
        return 0
    if args.floors:
        pins = floors({e for e in args.extras.split(",") if e})
        args.floors.write_text("".join(f"{name}=={version}\n" for name, version in sorted(pins.items())))
        print(f"{args.floors}: {len(pins)} floors")
        return 0
    text = render(installed_closure(project_requirements()))
    if args.check:
        if CONSTRAINTS.read_text() != text:
            print(f"{CONSTRAINTS}: differs from this environment (python scripts/lock_versions.py rewrites it)")
            return 1
        return 0
    CONSTRAINTS.write_text(text)
    print(f"{CONSTRAINTS}: {text.count('==')} versions")
    return 0


if __name__ == "__main__":
    sys.exit(main())
