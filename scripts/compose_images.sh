#!/usr/bin/env bash
# The images of the CPU compose cluster, built on this machine with nothing from an image
# registry: base images made from Debian's packages, then k3lab:cpu from this checkout.
#
#   scripts/compose_images.sh bases    k3lab-local/debian:bookworm (debootstrap), k3lab-local/python:3.11
#                                      (docker/python) and k3lab-local/postgres:15 (docker/postgres);
#                                      each only when it is not there yet (K3LAB_REBUILD_BASES=1: again)
#   scripts/compose_images.sh k3lab    k3lab:cpu from docker/Dockerfile.cpu on k3lab-local/python:3.11
#   scripts/compose_images.sh all      both (the default)
#
# Then put POSTGRES_IMAGE=k3lab-local/postgres:15 in .env and start the cluster as
# docs/cluster.md says (`docker compose -f docker-compose.yml -f docker-compose.cpu.yml up -d`,
# without --build: the images are there). Where a registry is reachable none of this is needed:
# `up -d --build` builds on python:3.11-slim and postgres:17.
#
# Needs: Docker with BuildKit (docker buildx, or a docker CLI before 23.0 such as Debian's
# docker.io 20.10, which has BuildKit built in), and for `bases` debootstrap (apt-get install
# debootstrap) run as root. Settings (environment variables, defaults in brackets):
#   DOCKER [found: a docker whose `build` runs BuildKit]
#   K3LAB_LOCAL_PREFIX [k3lab-local]   the base images' repository prefix
#   DEBIAN_SUITE [bookworm]  DEBIAN_MIRROR [debootstrap's default]  PG_MAJOR [15: bookworm's]
#   K3LAB_CPU_IMAGE [k3lab:cpu]  K3LAB_CPU_BASE_IMAGE [$K3LAB_LOCAL_PREFIX/python:3.11]
#   TORCH_INDEX_URL [PyTorch's CPU index]  TORCH_VERSION [">=2.9"]
#   PIP_INDEX_URL, PIP_EXTRA_INDEX_URL    a PyPI mirror, passed to the build (http(s) only)
#   PIP_CERT                             a CA bundle file pip trusts inside the build (build secret)
# A TORCH_INDEX_URL on 127.0.0.1/localhost (a local index) builds with --network host to reach it.
set -euo pipefail
cd "$(dirname "$0")/.."

PREFIX=${K3LAB_LOCAL_PREFIX:-k3lab-local}
SUITE=${DEBIAN_SUITE:-bookworm}
PG_MAJOR=${PG_MAJOR:-15}
DEBIAN_IMAGE=$PREFIX/debian:$SUITE
PYTHON_IMAGE=$PREFIX/python:3.11
POSTGRES_IMAGE=$PREFIX/postgres:$PG_MAJOR
CPU_IMAGE=${K3LAB_CPU_IMAGE:-k3lab:cpu}
CPU_BASE=${K3LAB_CPU_BASE_IMAGE:-$PYTHON_IMAGE}

log() { printf 'compose_images: %s\n' "$*" >&2; }
die() { log "$*"; exit 1; }

buildkit_docker() {  # a docker command whose `build` uses BuildKit
    if [ -n "${DOCKER:-}" ]; then echo "$DOCKER"; return; fi
    local candidate major
    for candidate in docker /usr/bin/docker; do
        command -v "$candidate" >/dev/null 2>&1 || continue
        if "$candidate" buildx version >/dev/null 2>&1; then echo "$candidate"; return; fi
        major=$("$candidate" version --format '{{.Client.Version}}' 2>/dev/null | cut -d. -f1 || true)
        if [ -n "$major" ] && [ "$major" -lt 23 ] 2>/dev/null; then echo "$candidate"; return; fi
    done
    die "no docker CLI that builds with BuildKit: install docker buildx, or Debian's docker.io (20.10)"
}
DOCKER=$(buildkit_docker)
export DOCKER_BUILDKIT=1

have() { "$DOCKER" image inspect "$1" >/dev/null 2>&1 && [ "${K3LAB_REBUILD_BASES:-0}" != 1 ]; }
timed() {  # timed LABEL COMMAND...: run it (its output to $K3LAB_BUILD_LOG) and say how long it took
    local label=$1 start=$SECONDS log_file=${K3LAB_BUILD_LOG:-/dev/null}
    shift
    if ! "$@" >>"$log_file" 2>&1; then
        [ "$log_file" != /dev/null ] && tail -40 "$log_file" >&2
        die "$label: failed (${*:1:2} ...)"
    fi
    log "$label: built in $((SECONDS - start)) s"
}

debian_image() {
    command -v debootstrap >/dev/null 2>&1 || die "debootstrap not found: apt-get install debootstrap"
    [ "$(id -u)" = 0 ] || die "debootstrap needs root"
    local root
    root=$(mktemp -d /tmp/k3lab-rootfs.XXXXXX)
    if ! debootstrap --variant=minbase "$SUITE" "$root" ${DEBIAN_MIRROR:+"$DEBIAN_MIRROR"} >"$root.log" 2>&1; then
        tail -20 "$root.log" >&2
        rm -rf "$root" "$root.log"
        die "debootstrap failed"
    fi
    rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*  # apt-get update comes first anyway
    tar -C "$root" -c . | "$DOCKER" import -c 'CMD ["bash"]' - "$DEBIAN_IMAGE" >/dev/null
    rm -rf "$root" "$root.log"
    log "$DEBIAN_IMAGE: made with debootstrap --variant=minbase $SUITE"
}

bases() {
    if have "$DEBIAN_IMAGE"; then log "$DEBIAN_IMAGE: present"; else timed "$DEBIAN_IMAGE" debian_image; fi
    if have "$PYTHON_IMAGE"; then log "$PYTHON_IMAGE: present"; else
        timed "$PYTHON_IMAGE" "$DOCKER" build --progress=plain --build-arg DEBIAN_IMAGE="$DEBIAN_IMAGE" \
            -t "$PYTHON_IMAGE" docker/python
    fi
    if have "$POSTGRES_IMAGE"; then log "$POSTGRES_IMAGE: present"; else
        timed "$POSTGRES_IMAGE" "$DOCKER" build --progress=plain --build-arg BASE_IMAGE="$DEBIAN_IMAGE" \
            --build-arg PG_MAJOR="$PG_MAJOR" -t "$POSTGRES_IMAGE" docker/postgres
    fi
}

k3lab_image() {
    local args=(--build-arg BASE_IMAGE="$CPU_BASE")
    [ -n "${TORCH_INDEX_URL:-}" ] && args+=(--build-arg TORCH_INDEX_URL="$TORCH_INDEX_URL")
    [ -n "${TORCH_VERSION:-}" ] && args+=(--build-arg TORCH_VERSION="$TORCH_VERSION")
    case "${PIP_INDEX_URL:-}" in http://*|https://*) args+=(--build-arg PIP_INDEX_URL="$PIP_INDEX_URL") ;; esac
    case "${PIP_EXTRA_INDEX_URL:-}" in http://*|https://*) args+=(--build-arg PIP_EXTRA_INDEX_URL="$PIP_EXTRA_INDEX_URL") ;; esac
    if [ -n "${PIP_CERT:-}" ]; then
        [ -s "$PIP_CERT" ] || die "PIP_CERT=$PIP_CERT is not a file"
        args+=(--secret "id=pip_cert,src=$PIP_CERT")
    fi
    case "${TORCH_INDEX_URL:-}" in http://127.0.0.1[:/]*|http://localhost[:/]*) args+=(--network host) ;; esac
    timed "$CPU_IMAGE" "$DOCKER" build --progress=plain -f docker/Dockerfile.cpu "${args[@]}" -t "$CPU_IMAGE" .
    log "$CPU_IMAGE: $("$DOCKER" image inspect --format '{{.Size}}' "$CPU_IMAGE" | awk '{printf "%.2f GB", $1 / 1e9}')"
}

case "${1:-all}" in
    bases) bases ;;
    k3lab) k3lab_image ;;
    all) bases; k3lab_image ;;
    *) die "usage: $0 [bases|k3lab|all]" ;;
esac
