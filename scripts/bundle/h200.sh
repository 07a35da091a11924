#!/usr/bin/env bash
# Build the offline bundle for the H200 machines (Python 3.12, x86_64, no package index)
# into .carry/bundle (ignored by git; carried to the machine with the working tree), in parts
# of at most 28 MiB: a lent machine takes 64 MiB a call, the checkout included (~32 MiB).
# k3lab's own wheel is left out: the machine runs the carried checkout. There, one call a
# part, in order, on the same machine (/tmp/site lasts as long as the machine does):
#   export PYTHONPATH=$PWD:$PYTHONPATH
#   bash .carry/bundle/part-1/install.sh --target /tmp/site      (carry .carry/bundle/part-1)
#   bash .carry/bundle/part-2/install.sh --target /tmp/site      (carry .carry/bundle/part-2: the last part checks)
#   export PYTHONPATH=$PWD:/tmp/site:$PYTHONPATH PATH=/tmp/site/bin:$PATH
set -euo pipefail
cd "$(dirname "$0")/../.."
python="${PYTHON:-python}"
exec "$python" -m k3lab.cli bundle "${1:-.carry/bundle}" \
  --python-version 3.12 \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  --exclude @scripts/bundle/h200-preinstalled.txt \
  --extras gpu \
  --constraint constraints.txt \
  --max-size none --part-size 28MiB --without-project
