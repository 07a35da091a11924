#!/usr/bin/env bash
# Install one part of the offline bundle (scripts/bundle/bundle.py build) into a folder, offline:
#   bash scripts/bundle/install.sh PART TARGET      e.g. .carry/bundle/part-1 /tmp/site
# Install the parts in order into one TARGET; after the last one, bundle.py's check runs pip check
# for the bundled packages, installs the spares of the target's packages it finds too old, and
# imports the main modules. Then:
#   export PYTHONPATH=$PWD:TARGET:$PYTHONPATH PATH=TARGET/bin:$PATH
# PYTHON picks the interpreter (default python3).
set -euo pipefail
part="${1:?usage: install.sh PART TARGET}"
target="${2:?usage: install.sh PART TARGET}"
python="${PYTHON:-python3}"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
[ -f "$part/part.json" ] || { echo "install.sh: $part/part.json: no such file (not a part of the bundle)" >&2; exit 2; }
mkdir -p "$target"
target="$(cd "$target" && pwd)"
"$python" -m pip install --no-index --no-deps --no-cache-dir --disable-pip-version-check --quiet \
  --upgrade --no-compile --target "$target" "$part"/*.whl
# bytecode now, on every core: where PYTHONDONTWRITEBYTECODE=1 (common in images) no process writes it
"$python" -m compileall -q -j 0 "$target" > /dev/null || echo "install.sh: warning: some modules did not compile"
PYTHONPATH="$target${PYTHONPATH:+:$PYTHONPATH}" "$python" "$here/bundle.py" check "$part" --target "$target"
