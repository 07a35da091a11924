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
