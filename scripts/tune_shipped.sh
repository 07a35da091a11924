#!/usr/bin/env bash
# Measure the kernel tunings k3lab ships (k3lab/tunings/), on a GPU machine with the `gpu` extra's
# versions, as two archives:
#   GPU-attnres_block.tar.xz  the flagship sweep's gpu profile warmed in a cache of its own, then
#                             run as a short sweep (seed 0, four steps a trial) in that cache, and
#                             exported with its compiled kernels (megabytes: one sweep only); its trials'
#                             peak GPU memory merged into gpu-memory.json (k3lab.runner.runtime.memory)
#   GPU.tar.xz                autotune results only: every experiment's gpu profiles warmed
#                                     (`k3lab kernels warm`), the GPU tests run, each preset trained for
#                                     two steps (`k3lab train`)
#   bash scripts/tune_shipped.sh            both
#   bash scripts/tune_shipped.sh compiled   the first only
# GPU is the machine's GPU model as nvidia-smi names it, in lower case, its first two words
# (nvidia-h100, nvidia-h200): a GPU model's archives are re-made on that model.
# The flagship starts from the autotune archive already shipped (a GPU process imports it), so only
# what is new is tuned; the second starts from both.
set -uo pipefail
cd "$(dirname "$0")/.."
tunings=k3lab/tunings
k3lab="${K3LAB:-python -m k3lab.cli}"
failed=0
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1 | awk '{print tolower($1 "-" $2)}')
[ -n "$gpu" ] || { echo "tune_shipped.sh: no GPU named by nvidia-smi" >&2; exit 1; }
warm_profiles() {  # every gpu* profile of one sweep file
    for profile in $(python -c "import sys, yaml; print(' '.join(p for p in (yaml.safe_load(open(sys.argv[1])).get('profiles') or {}) if p.startswith('gpu')))" "$1"); do
        echo "== k3lab kernels warm $1 --profile $profile"
        $k3lab kernels warm "$1" --profile "$profile" || failed=1
    done
}
first_steps() {  # the sweep's own trials, seed 0, four steps each (two eager, the CUDA-graph capture, one
    # replay): a trial's process keys its torch.compile graphs otherwise than the plain process of
    # `kernels warm` does (same graphs, other AOTAutograd and FX-graph cache keys), so a fresh
    # machine's trials find only what trials wrote
    local work; work=$(mktemp -d)
    python scripts/first_steps_sweep.py "$1" "$work/first_steps.yaml" || return 1
    $k3lab sweep "$work/first_steps.yaml" --profile gpu --storage "$work/runs" \
        --tracking-uri "sqlite:///$work/first_steps.db" --no-live
}
flagship=$(mktemp -d)
# Re-measured below, and its old kernels are not carried on: the old archive is moved aside while the flagship is
# tuned, and put back if the run fails or is killed before the new one is written.
archive="$tunings/$gpu-attnres_block.tar.xz"
aside=$(mktemp -d)
[ -e "$archive" ] && mv "$archive" "$aside/"
restore_archive() { rm -f "$tunings/.$(basename "$archive").partial"; [ -e "$archive" ] || [ ! -e "$aside/$(basename "$archive")" ] || mv "$aside/$(basename "$archive")" "$archive"; }
trap restore_archive EXIT
trap 'exit 143' TERM INT
echo "== k3lab kernels warm experiments/attnres_block.yaml --profile gpu (compiled, cache $flagship)"
K3LAB_KERNEL_CACHE="$flagship" $k3lab kernels warm experiments/attnres_block.yaml --profile gpu || exit 1
echo "== the same trials' first steps as a sweep (cache $flagship)"
K3LAB_KERNEL_CACHE="$flagship" first_steps experiments/attnres_block.yaml || exit 1
K3LAB_KERNEL_CACHE="$flagship" $k3lab kernels export --compiled "$archive" || exit 1
python -c "import sys; from pathlib import Path; from k3lab.runner.runtime.memory import ship_measurements; \
print(f'gpu-memory.json: {ship_measurements(Path(sys.argv[1]))} measurements merged')" "$flagship"
[ "${1:-}" = compiled ] && exit 0
warm_profiles experiments/attnres_block.yaml   # the flagship first, then the GPU tests: what a first hour runs
echo "== GPU tests"
python -m pytest -q tests/test_gpu_fused.py || failed=1
for file in experiments/*.yaml; do
    [ "$file" = experiments/attnres_block.yaml ] || warm_profiles "$file"
done
for preset in tiny small base; do
    echo "== k3lab train $preset --steps 2"
    $k3lab train "$preset" --steps 2 --no-tracking || failed=1
done
$k3lab kernels export "$tunings/$gpu.tar.xz" || exit 1
exit $failed
