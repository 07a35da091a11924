#!/usr/bin/env bash
# Build the offline bundle for the H200 machines (Python 3.12, x86_64, no package index) into
# OUT (default .carry/bundle, ignored by git; carried to the machine beside the checkout), in
# parts of at most 28 MiB: a lent machine takes 64 MiB a call, the checkout included (~32 MiB).
# k3lab itself is not in it: the machine runs the carried checkout. There, one call a part, in
# order, on the same machine (/tmp/site lasts as long as the machine does):
#   bash scripts/bundle/install.sh .carry/bundle/part-1 /tmp/site     (carry .carry/bundle/part-1)
#   bash scripts/bundle/install.sh .carry/bundle/part-2 /tmp/site     (carry .carry/bundle/part-2; it checks)
#   export PYTHONPATH=$PWD:/tmp/site:$PYTHONPATH PATH=/tmp/site/bin:$PATH
set -euo pipefail
cd "$(dirname "$0")/../.."
exec "${PYTHON:-python}" scripts/bundle/bundle.py build "${1:-.carry/bundle}" \
  --python-version 3.12 \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  --preinstalled scripts/bundle/h200-preinstalled.txt \
  --constraint constraints.txt \
  --extras gpu \
  --part-size 28MiB \
  --import ray.tune --import mlflow.tracking --import datasets --import cattrs --import fla \
  "${@:2}"
