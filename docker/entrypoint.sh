#!/bin/sh
# Entrypoint of the k3lab images (docker/Dockerfile, docker/Dockerfile.cpu).
#
#   k3lab-entrypoint ray start ...      a program on PATH (ray, mlflow, python, bash): run it
#   k3lab-entrypoint sweep FILE ...     anything else: a k3lab command, `k3lab sweep FILE ...`
#
# Either way it first refuses placeholder secrets, so a cluster never runs on the values
# copied unchanged from .env.example. `k3lab sweep` with RAY_ADDRESS set joins the cluster as
# a node without CPUs or GPUs for the duration of the sweep: a Ray driver has to run on a node
# of its cluster, and this one takes no trials.
set -eu

for var in RAY_AUTH_TOKEN POSTGRES_PASSWORD PGPASSWORD; do
    eval "value=\${$var:-}"
    case "$value" in
        change-me*|changeme*)
            echo "k3lab-entrypoint: $var is still the placeholder from .env.example;" \
                 "put a real secret in .env (python3 -c 'import secrets; print(secrets.token_hex(32))')" >&2
            exit 2 ;;
    esac
done

# K3LAB_MPS=1 (the GPU workers of docker-compose.yml): an NVIDIA MPS control daemon for this
# container's GPUs before the command, so trials that share a GPU run their kernels side by side
# instead of taking turns (k3lab.runner.runtime.mps; a sweep on one machine starts its own). Its pipe and
# log folders are exported, so Ray and every trial process it starts connect to it. Where it
# cannot run (no NVIDIA driver programs in the container) it says so in one line and goes on.
start_mps() {
    if ! command -v nvidia-cuda-mps-control >/dev/null 2>&1; then
        echo "k3lab-entrypoint: no MPS: nvidia-cuda-mps-control is not on PATH (no GPU reserved, or" \
             "NVIDIA_DRIVER_CAPABILITIES without compute); trials that share a GPU take turns" >&2
        return 0
    fi
    dir="${K3LAB_MPS_DIR:-/tmp/k3lab-mps}"
    export CUDA_MPS_PIPE_DIRECTORY="$dir/pipe" CUDA_MPS_LOG_DIRECTORY="$dir/log"
    if echo get_server_list | nvidia-cuda-mps-control >/dev/null 2>&1; then
        echo "k3lab-entrypoint: MPS: the daemon at $CUDA_MPS_PIPE_DIRECTORY is running" >&2
        return 0
    fi
    rm -rf "$dir"  # a restarted container's folders: their daemon ended with it
    mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
    if nvidia-cuda-mps-control -d; then
        echo "k3lab-entrypoint: MPS: control daemon started (CUDA_MPS_PIPE_DIRECTORY=$CUDA_MPS_PIPE_DIRECTORY)" >&2
    else
        status=$?
        unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
        echo "k3lab-entrypoint: no MPS: nvidia-cuda-mps-control -d exited $status (its log: $dir/log);" \
             "trials that share a GPU take turns" >&2
    fi
}
if [ "${K3LAB_MPS:-0}" = 1 ] && [ -z "${CUDA_MPS_PIPE_DIRECTORY:-}" ]; then
    start_mps
fi

if [ "$#" -gt 0 ] && command -v "$1" >/dev/null 2>&1; then
    exec "$@"
fi

if [ "${1:-}" = sweep ] && [ -n "${RAY_ADDRESS:-}" ] && [ "${K3LAB_JOIN_CLUSTER:-1}" = 1 ]; then
    ray start --address="$RAY_ADDRESS" --num-cpus=0 --num-gpus=0 \
        --object-store-memory="${K3LAB_DRIVER_OBJECT_STORE_BYTES:-268435456}" --disable-usage-stats
    status=0
    k3lab "$@" || status=$?
    ray stop --force >/dev/null 2>&1 || true  # this container's own Ray processes only
    exit "$status"
fi
exec k3lab "$@"
