"""What the bundle carries besides its wheels: `install.sh` and `manifest.json`."""

from __future__ import annotations

import json
from pathlib import Path

from k3lab.bundle.wheels import sha256_of


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
args=(--no-index --no-deps --no-cache-dir --disable-pip-version-check --find-links "$here/wheels")
if [ -n "$target" ]; then
  mkdir -p "$target"
  target="$(cd "$target" && pwd)"
  args+=(--target "$target" --upgrade --no-compile)  # compiled below, on every core
  export PYTHONPATH="$target${PYTHONPATH:+:$PYTHONPATH}"
fi
shopt -s nullglob
wheels=("$here"/wheels/*.whl)
shopt -u nullglob
echo "install.sh: installing ${#wheels[@]} wheels and ${#spares[@]} spares with $python${target:+ into $target}"
"$python" -m pip install "${args[@]}" ${wheels[@]+"${wheels[@]}"} ${spares[@]+"${spares[@]}"}
if [ -n "$target" ]; then
  # Bytecode now: where PYTHONDONTWRITEBYTECODE=1 (common in images) no process writes it, so
  # each would compile every module it imports from source, every time it starts.
  "$python" -m compileall -q -j 0 "$target" > /dev/null || echo "install.sh: warning: some modules did not compile to bytecode"
fi
if [ "$check" = 1 ]; then
  "$python" - "$here/manifest.json" <<'PY'
import importlib, importlib.metadata as md, json, sys
manifest = json.load(open(sys.argv[1]))
part = manifest.get("part")
if part and part["index"] < part["of"]:
    sys.exit(print(f"install.sh: part {part['index']} of {part['of']} installed; part {part['of']} checks the versions "
                   "and imports, once every part is in"))
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


def write_install_script(folder: Path, manifest: dict) -> None:
    """`folder`/install.sh for `manifest`, executable, and its entry added to the manifest's files."""
    script = folder / INSTALL_SH
    script.write_text(install_script(manifest))
    script.chmod(0o755)
    manifest["files"].append(file_entry(folder, script))


def install_script(manifest: dict) -> str:
    target = manifest["target"]
    excluded = sorted(manifest["excluded"])
    part = manifest.get("part")
    replacements = {
        "@@TITLE@@": f"{manifest['project']['name']} {manifest['project']['version']}"
                     + (f"[{','.join(manifest['project']['extras'])}]" if manifest["project"]["extras"] else "")
                     + (f", part {part['index']} of {part['of']} (install the parts in order, into one target)"
                        if part else ""),
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
