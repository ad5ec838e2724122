#!/usr/bin/env bash
# The postgres:15 stand-in's entrypoint (tests/deploy/postgres/Dockerfile): on the first
# start makes the cluster in $PGDATA with the POSTGRES_* variables (user and password,
# database, initdb arguments; password authentication over TCP), then runs the server in
# the foreground on every address.
set -euo pipefail
bin=/usr/lib/postgresql/15/bin
: "${POSTGRES_USER:=postgres}" "${POSTGRES_DB:=$POSTGRES_USER}"
[ -n "${POSTGRES_PASSWORD:-}" ] || { echo "postgres-entrypoint: set POSTGRES_PASSWORD" >&2; exit 1; }
if [ ! -s "$PGDATA/PG_VERSION" ]; then
    pwfile=$(mktemp)
    printf '%s\n' "$POSTGRES_PASSWORD" >"$pwfile"
    # shellcheck disable=SC2086 # POSTGRES_INITDB_ARGS is a list of arguments
    "$bin/initdb" -D "$PGDATA" -U "$POSTGRES_USER" --pwfile="$pwfile" \
        --auth-local=trust --auth-host=scram-sha-256 ${POSTGRES_INITDB_ARGS:-} >/dev/null
    rm -f "$pwfile"
    echo "host all all all scram-sha-256" >>"$PGDATA/pg_hba.conf"
    if [ "$POSTGRES_DB" != postgres ]; then
        "$bin/pg_ctl" -D "$PGDATA" -w -o "-c listen_addresses=''" start >/dev/null
        "$bin/psql" -v ON_ERROR_STOP=1 -U "$POSTGRES_USER" -d postgres -q \
            -c "CREATE DATABASE \"$POSTGRES_DB\" OWNER \"$POSTGRES_USER\""
        "$bin/pg_ctl" -D "$PGDATA" -w stop >/dev/null
    fi
fi
exec "$bin/postgres" -D "$PGDATA" -c listen_addresses='*'
