#!/bin/sh
# Entrypoint of docker/postgres/Dockerfile: on the first start (an empty PGDATA) create the
# cluster with the superuser POSTGRES_USER (password POSTGRES_PASSWORD, required) and the
# database POSTGRES_DB, as the official postgres image does; then run the server, listening on
# every interface of the container with password authentication (scram-sha-256) from any host.
set -eu

if [ "${1:-}" = postgres ]; then
    shift
    if [ ! -s "$PGDATA/PG_VERSION" ]; then
        : "${POSTGRES_PASSWORD:?set POSTGRES_PASSWORD}"
        user=${POSTGRES_USER:-postgres}
        db=${POSTGRES_DB:-$user}
        pwfile=$(mktemp)
        printf '%s\n' "$POSTGRES_PASSWORD" > "$pwfile"
        initdb -D "$PGDATA" --username="$user" --pwfile="$pwfile" --auth-local=trust \
            --auth-host=scram-sha-256 --encoding=UTF8 --locale=C.UTF-8 >/dev/null
        rm -f "$pwfile"
        printf 'host all all all scram-sha-256\n' >> "$PGDATA/pg_hba.conf"
        if [ "$db" != postgres ]; then
            # single-user mode: no server (and no port) before the database exists
            printf 'CREATE DATABASE "%s";\n' "$db" | postgres --single -D "$PGDATA" -j postgres >/dev/null
        fi
        echo "postgres-entrypoint: created the cluster in $PGDATA (user $user, database $db)"
    fi
    exec postgres -D "$PGDATA" -c listen_addresses='*' "$@"
fi
exec "$@"
