#!/usr/bin/env bash
# The k3lab local cluster as plain processes, for machines without Docker: the topology of
# docker-compose.yml (PostgreSQL -> MLflow server with served artifacts, Ray head + Ray
# workers with token authentication, one shared folder) on this machine.
#
#   scripts/cluster_local.sh up              start everything (again: starts what is not running)
#   . .k3lab/cluster/env                     RAY_ADDRESS, MLFLOW_TRACKING_URI, the token, shared paths
#   k3lab sweep experiments/attnres_block.yaml --no-live
#   scripts/cluster_local.sh status
#   scripts/cluster_local.sh down [--purge]  stop everything (--purge: delete the data as well)
#
# Needs: k3lab installed (its `ray` and `mlflow` on PATH: activate the virtualenv), psycopg2
# (pip install psycopg2-binary, or ".[test]"), PostgreSQL's server binaries (Debian/Ubuntu:
# apt-get install postgresql; found in /usr/lib/postgresql/*/bin, on PATH, or in $PG_BIN), and
# Linux's setsid. As root, PostgreSQL runs as the OS user $K3LAB_PG_OS_USER (default postgres):
# initdb refuses root.
#
# Settings (environment variables, defaults in brackets):
#   K3LAB_CLUSTER_DIR [.k3lab/cluster]  state: data, logs, pids, secrets, the env file
#   K3LAB_PG_PORT [55432] K3LAB_MLFLOW_PORT [5000] K3LAB_RAY_PORT [6379]
#   K3LAB_DASHBOARD_PORT [8265] K3LAB_AGENT_PORT [52365]  (worker i's agent: K3LAB_AGENT_PORT+i)
#   K3LAB_WORKERS [1] K3LAB_WORKER_CPUS [all CPUs] K3LAB_WORKER_GPUS [detected]
#   K3LAB_HEAD_CPUS [0: trials run on the workers] K3LAB_MLFLOW_WORKERS [1]
#   K3LAB_OBJECT_STORE_BYTES [Ray's default] K3LAB_RAY_TEMP_DIR [/tmp/k3lab-ray-$K3LAB_RAY_PORT]
#   POSTGRES_USER [k3lab] POSTGRES_DB [mlflow]
#   POSTGRES_PASSWORD, RAY_AUTH_TOKEN  [generated on first `up`, kept in $K3LAB_CLUSTER_DIR/secrets]
set -euo pipefail

DIR=${K3LAB_CLUSTER_DIR:-.k3lab/cluster}
mkdir -p "$DIR"
DIR=$(cd "$DIR" && pwd)
PG_PORT=${K3LAB_PG_PORT:-55432}
MLFLOW_PORT=${K3LAB_MLFLOW_PORT:-5000}
RAY_PORT=${K3LAB_RAY_PORT:-6379}
DASHBOARD_PORT=${K3LAB_DASHBOARD_PORT:-8265}
AGENT_PORT=${K3LAB_AGENT_PORT:-52365}
WORKERS=${K3LAB_WORKERS:-1}
WORKER_CPUS=${K3LAB_WORKER_CPUS:-$(nproc)}
WORKER_GPUS=${K3LAB_WORKER_GPUS:-}
HEAD_CPUS=${K3LAB_HEAD_CPUS:-0}
MLFLOW_WORKERS=${K3LAB_MLFLOW_WORKERS:-1}
RAY_TEMP_DIR=${K3LAB_RAY_TEMP_DIR:-/tmp/k3lab-ray-$RAY_PORT}  # short: Ray's socket paths live here
PG_OS_USER=${K3LAB_PG_OS_USER:-postgres}
POSTGRES_USER=${POSTGRES_USER:-k3lab}
POSTGRES_DB=${POSTGRES_DB:-mlflow}
RAY_ADDRESS_LOCAL=127.0.0.1:$RAY_PORT
MLFLOW_URI=http://127.0.0.1:$MLFLOW_PORT

log() { printf 'cluster_local: %s\n' "$*" >&2; }
die() { log "$*"; exit 1; }

# -- helpers -------------------------------------------------------------------------------

secret() {  # secret NAME: $NAME from the environment, else kept in secrets/, else a new one
    local name=$1 file="$DIR/secrets/$1"
    if [ -n "${!name:-}" ]; then
        printf '%s' "${!name}"
    elif [ -s "$file" ]; then
        cat "$file"
    else
        (umask 077 && head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$file")
        cat "$file"
    fi
}

pg_bin() {
    if [ -n "${PG_BIN:-}" ]; then echo "$PG_BIN"; return; fi
    local candidate
    candidate=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1 || true)
    if [ -n "$candidate" ] && [ -x "$candidate/initdb" ]; then echo "$candidate"; return; fi
    if command -v initdb >/dev/null 2>&1; then dirname "$(command -v initdb)"; return; fi
    die "PostgreSQL server binaries not found (initdb, pg_ctl): apt-get install postgresql, or set PG_BIN"
}

as_pg() {  # run a PostgreSQL server command as a user it accepts
    if [ "$(id -u)" = 0 ]; then
        runuser -u "$PG_OS_USER" -- "$@"
    else
        "$@"
    fi
}

pg_root() {  # where the PostgreSQL cluster lives (owned by the user PostgreSQL runs as)
    if [ -f "$DIR/pg_root" ]; then cat "$DIR/pg_root"; return; fi
    local root="$DIR/postgres"
    if [ "$(id -u)" = 0 ]; then
        id -u "$PG_OS_USER" >/dev/null 2>&1 ||
            die "running as root: PostgreSQL refuses root and there is no OS user $PG_OS_USER (set K3LAB_PG_OS_USER)"
        mkdir -p "$root" && chown "$PG_OS_USER" "$root" && chmod 700 "$root"
        if ! runuser -u "$PG_OS_USER" -- test -w "$root"; then
            rmdir "$root"
            root=$(mktemp -d /tmp/k3lab-pg.XXXXXX)  # $DIR is not reachable for $PG_OS_USER
            chown "$PG_OS_USER" "$root"
            log "PostgreSQL data in $root ($DIR is not accessible to $PG_OS_USER)"
        fi
    else
        mkdir -p "$root" && chmod 700 "$root"
    fi
    echo "$root" > "$DIR/pg_root"
    echo "$root"
}

alive() {  # alive PIDFILE: the process group it names still has a process
    [ -s "$1" ] && kill -0 -- "-$(cat "$1")" 2>/dev/null
}

spawn() {  # spawn NAME CMD...: CMD in a session of its own, pid in pids/NAME, output in logs/NAME.log
    local name=$1; shift
    if alive "$DIR/pids/$name"; then
        log "$name is running (pid $(cat "$DIR/pids/$name"))"
        return
    fi
    setsid sh -c 'echo $$ > "$0"; exec "$@"' "$DIR/pids/$name" "$@" \
        > "$DIR/logs/$name.log" 2>&1 < /dev/null &
    local waited=0
    until [ -s "$DIR/pids/$name" ]; do sleep 0.1; waited=$((waited + 1)); [ $waited -lt 100 ] || die "$name did not start"; done
    log "$name started (pid $(cat "$DIR/pids/$name"), log $DIR/logs/$name.log)"
}

stop() {  # stop NAME: SIGTERM to its leader (ray start --block stops its node), then to the group, then SIGKILL
    local pidfile="$DIR/pids/$1"
    [ -s "$pidfile" ] || return 0
    local pid signal waited; pid=$(cat "$pidfile")
    if kill -0 -- "-$pid" 2>/dev/null; then
        kill -TERM "$pid" 2>/dev/null || true
        for signal in TERM KILL; do
            waited=0
            while kill -0 -- "-$pid" 2>/dev/null && [ $waited -lt 150 ]; do sleep 0.1; waited=$((waited + 1)); done
            kill -0 -- "-$pid" 2>/dev/null || break
            kill -"$signal" -- "-$pid" 2>/dev/null || true
        done
        log "$1 stopped"
    fi
    rm -f "$pidfile"
}

wait_for() {  # wait_for WHAT SECONDS CMD...: until CMD succeeds
    local what=$1 seconds=$2; shift 2
    local deadline=$((SECONDS + seconds))
    until "$@" >/dev/null 2>&1; do
        [ $SECONDS -lt $deadline ] || die "$what not ready after ${seconds}s (logs in $DIR/logs)"
        sleep 1
    done
}

http_ok() { python -c "import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=5)" "$1"; }

workers_joined() {  # workers_joined N: N nodes with the "worker" resource are alive
    python - "$RAY_ADDRESS_LOCAL" "$1" <<'PY'
import sys
import ray
ray.init(address=sys.argv[1], logging_level="ERROR", log_to_driver=False)
alive = [n for n in ray.nodes() if n["Alive"] and "worker" in n["Resources"]]
sys.exit(0 if len(alive) >= int(sys.argv[2]) else 1)
PY
}

ray_env() {
    export RAY_AUTH_MODE=token RAY_AUTH_TOKEN
    RAY_AUTH_TOKEN=$(secret RAY_AUTH_TOKEN)
    export RAY_USAGE_STATS_ENABLED=0
}

# -- commands ------------------------------------------------------------------------------

up() {
    command -v setsid >/dev/null || die "setsid not found (util-linux): this script runs on Linux"
    command -v ray >/dev/null && command -v mlflow >/dev/null ||
        die "ray and mlflow not on PATH: activate the virtualenv k3lab is installed in"
    python -c "import psycopg2" 2>/dev/null || die "psycopg2 missing: pip install psycopg2-binary"
    mkdir -p "$DIR/logs" "$DIR/pids" "$DIR/mlartifacts" "$DIR/shared/data" "$DIR/shared/runs" "$RAY_TEMP_DIR"
    (umask 077 && mkdir -p "$DIR/secrets")
    local bin root password
    bin=$(pg_bin)
    root=$(pg_root)
    password=$(secret POSTGRES_PASSWORD)

    # PostgreSQL: MLflow's backend store, on 127.0.0.1 only, password authentication
    if [ ! -f "$root/data/PG_VERSION" ]; then
        (umask 077 && printf '%s\n' "$password" > "$root/pwfile")
        [ "$(id -u)" != 0 ] || chown "$PG_OS_USER" "$root/pwfile"
        as_pg "$bin/initdb" -D "$root/data" -U "$POSTGRES_USER" --pwfile="$root/pwfile" \
            --auth=scram-sha-256 -E UTF8 > "$DIR/logs/initdb.log" 2>&1 ||
            { rm -f "$root/pwfile"; die "initdb failed: $DIR/logs/initdb.log"; }
        rm -f "$root/pwfile"
    fi
    if as_pg "$bin/pg_ctl" -D "$root/data" status >/dev/null 2>&1; then
        log "postgres is running"
    else
        as_pg "$bin/pg_ctl" -D "$root/data" -l "$root/postgres.log" -w -t 60 \
            -o "-p $PG_PORT -k $root -c listen_addresses=127.0.0.1" start >/dev/null ||
            die "PostgreSQL did not start: $root/postgres.log"
        log "postgres started on 127.0.0.1:$PG_PORT (data $root/data)"
    fi
    export PGPASSWORD=$password
    if [ -z "$("$bin/psql" -h 127.0.0.1 -p "$PG_PORT" -U "$POSTGRES_USER" -d postgres -tAc \
            "SELECT 1 FROM pg_database WHERE datname = '$POSTGRES_DB'")" ]; then
        "$bin/createdb" -h 127.0.0.1 -p "$PG_PORT" -U "$POSTGRES_USER" "$POSTGRES_DB"
    fi

    # MLflow server: runs in PostgreSQL, artifacts served from $DIR/mlartifacts through its HTTP API
    MLFLOW_SERVER_ENABLE_JOB_EXECUTION=false spawn mlflow mlflow server \
        --backend-store-uri "postgresql+psycopg2://$POSTGRES_USER@127.0.0.1:$PG_PORT/$POSTGRES_DB" \
        --serve-artifacts --artifacts-destination "$DIR/mlartifacts" \
        --host 127.0.0.1 --port "$MLFLOW_PORT" --workers "$MLFLOW_WORKERS" \
        --allowed-hosts "localhost,localhost:*,127.0.0.1,127.0.0.1:*"
    unset PGPASSWORD

    # Ray: the head (no trials unless K3LAB_HEAD_CPUS), then the workers, one token for all
    ray_env
    local store=()
    [ -z "${K3LAB_OBJECT_STORE_BYTES:-}" ] || store=(--object-store-memory "$K3LAB_OBJECT_STORE_BYTES")
    spawn ray-head ray start --head --block --port "$RAY_PORT" --num-cpus "$HEAD_CPUS" --num-gpus 0 \
        --dashboard-host 127.0.0.1 --dashboard-port "$DASHBOARD_PORT" --dashboard-agent-listen-port "$AGENT_PORT" \
        --temp-dir "$RAY_TEMP_DIR" --disable-usage-stats "${store[@]}"
    wait_for "the Ray head" 120 ray health-check --address "$RAY_ADDRESS_LOCAL"
    local i gpus=()
    [ -z "$WORKER_GPUS" ] || gpus=(--num-gpus "$WORKER_GPUS")
    for i in $(seq 1 "$WORKERS"); do
        spawn "ray-worker-$i" ray start --address "$RAY_ADDRESS_LOCAL" --block --num-cpus "$WORKER_CPUS" "${gpus[@]}" \
            --resources '{"worker": 1}' --dashboard-agent-listen-port $((AGENT_PORT + i)) \
            --temp-dir "$RAY_TEMP_DIR" --disable-usage-stats "${store[@]}"
    done
    wait_for "$WORKERS Ray worker(s)" 120 workers_joined "$WORKERS"
    wait_for "the MLflow server" 180 http_ok "$MLFLOW_URI/health"

    (umask 077 && cat > "$DIR/env" <<EOF
# k3lab local cluster ($0): source it, then run k3lab sweep ...
export RAY_ADDRESS=$RAY_ADDRESS_LOCAL
export RAY_AUTH_MODE=token
export RAY_AUTH_TOKEN=$RAY_AUTH_TOKEN
export MLFLOW_TRACKING_URI=$MLFLOW_URI
export K3LAB_DATA_DIR=$DIR/shared/data
export K3LAB_STORAGE=$DIR/shared/runs
EOF
)
    log "up: MLflow $MLFLOW_URI, Ray $RAY_ADDRESS_LOCAL (dashboard http://127.0.0.1:$DASHBOARD_PORT), $WORKERS worker(s)"
    log "next: . $DIR/env && k3lab sweep experiments/attnres_block.yaml --no-live"
}

down() {
    local name
    for name in $(ls "$DIR/pids" 2>/dev/null | grep '^ray-worker-' || true) ray-head mlflow; do
        stop "$name"
    done
    if [ -f "$DIR/pg_root" ]; then
        local root; root=$(cat "$DIR/pg_root")
        if [ -f "$root/data/PG_VERSION" ] && as_pg "$(pg_bin)/pg_ctl" -D "$root/data" status >/dev/null 2>&1; then
            as_pg "$(pg_bin)/pg_ctl" -D "$root/data" -m fast -w stop >/dev/null && log "postgres stopped"
        fi
    fi
    if [ "${1:-}" = --purge ]; then
        [ ! -f "$DIR/pg_root" ] || rm -rf "$(cat "$DIR/pg_root")"
        rm -rf "$RAY_TEMP_DIR" "$DIR"
        log "purged $DIR"
    fi
}

status() {
    local name state=0
    for name in mlflow ray-head $(ls "$DIR/pids" 2>/dev/null | grep '^ray-worker-' || true); do
        if alive "$DIR/pids/$name"; then log "$name: running (pid $(cat "$DIR/pids/$name"))"; else log "$name: stopped"; state=1; fi
    done
    if [ -f "$DIR/pg_root" ] && as_pg "$(pg_bin)/pg_ctl" -D "$(cat "$DIR/pg_root")/data" status >/dev/null 2>&1; then
        log "postgres: running"
    else
        log "postgres: stopped"; state=1
    fi
    http_ok "$MLFLOW_URI/health" 2>/dev/null && log "MLflow $MLFLOW_URI: healthy" || { log "MLflow: no answer"; state=1; }
    [ -s "$DIR/secrets/RAY_AUTH_TOKEN" ] || [ -n "${RAY_AUTH_TOKEN:-}" ] || { log "Ray: no token (never started)"; return 1; }
    ray_env
    ray health-check --address "$RAY_ADDRESS_LOCAL" >/dev/null 2>&1 && log "Ray $RAY_ADDRESS_LOCAL: healthy" ||
        { log "Ray: no answer"; state=1; }
    return $state
}

case "${1:-}" in
    up) up ;;
    down) shift; down "${1:-}" ;;
    status) status ;;
    env) cat "$DIR/env" ;;
    *) sed -n '2,28p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
esac
