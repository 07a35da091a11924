#!/usr/bin/env bash
# Build the offline bundle for the H200 machines (Python 3.12, x86_64, no package index)
# into .carry/bundle (ignored by git; carried to the machine with the working tree).
# There:  bash .carry/bundle/install.sh --target /tmp/site && export PYTHONPATH=$PWD:/tmp/site:$PYTHONPATH PATH=/tmp/site/bin:$PATH
set -euo pipefail
cd "$(dirname "$0")/../.."
python="${PYTHON:-python}"
exec "$python" -m k3lab.cli bundle "${1:-.carry/bundle}" \
  --python-version 3.12 \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  --exclude @scripts/bundle/h200-preinstalled.txt \
  --extras gpu \
  --max-size 60MiB
