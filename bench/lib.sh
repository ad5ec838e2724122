# shellcheck shell=bash
# What every bench/ script shares: a throwaway server (a private PostgreSQL in the run's
# temporary folder unless one is given), /proc figures, a free port, and cleanup on any
# exit. Sourced by bench/*.sh; prints nothing itself.
#
# Uses ATRIUM_BIN if set, else build/core/atrium (building build/ in Release when it is
# missing). The database is ATRIUM_BENCH_PG_CONNINFO (a conninfo without dbname; a
# throwaway database is created in it and dropped) if set, else a private PostgreSQL in a
# temporary directory (tests/lib/pg.sh) that is removed afterwards.
# A script adds its own teardown as a command string to extra_cleanup.

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
# shellcheck source=tests/lib/deps.sh
. tests/lib/deps.sh

readonly PG_SH=$root/tests/lib/pg.sh
readonly HEALTH_TIMEOUT_S=30
readonly STOP_GRACE_S=30
readonly SERVER_NAME=bench.localhost

work=$(mktemp -d /tmp/atrium-bench.XXXXXX)
chmod 755 "$work" # the private cluster's owner (user atrium when we are root) must reach it
pg_dir=$work/pg
db=atrium_bench_$(od -An -tx1 -N4 /dev/urandom | tr -d ' \n')
own_pg=0
server_pid=
conninfo=
url=
extra_cleanup=()

admin_psql() {
    PGCONNECT_TIMEOUT=10 psql -X -q -v ON_ERROR_STOP=1 -d "$conninfo dbname=postgres" "$@"
}

bench_cleanup() {
    local c
    for c in "${extra_cleanup[@]}"; do eval "$c" || true; done
    [ -z "$server_pid" ] || atrium_stop_pid "$server_pid" "$STOP_GRACE_S" || true
    if [ -n "$conninfo" ]; then
        admin_psql -c "DROP DATABASE IF EXISTS \"$db\" WITH (FORCE)" >/dev/null 2>&1 || true
    fi
    if [ "$own_pg" = 1 ]; then
        "$PG_SH" stop "$pg_dir" >/dev/null || true
    fi
    rm -rf "$work"
}
trap bench_cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# status_field PID NAME: a field of /proc/PID/status (VmRSS, VmHWM, Threads).
status_field() {
    awk -v name="$2:" '$1 == name { $1 = ""; sub(/^ /, ""); print; exit }' "/proc/$1/status"
}

free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# bench_start [ENV=VALUE...]: starts the server (extra settings as ATRIUM__ overrides) and
# sets bin, url and server_pid once /health answers.
bench_start() {
    atrium_need_packages "${ATRIUM_RUNTIME_PACKAGES[@]}" "${ATRIUM_BENCH_PACKAGES[@]}"
    bin=${ATRIUM_BIN:-$root/build/core/atrium}
    if [ ! -x "$bin" ]; then
        atrium_say "no $bin: building build/ (Release)"
        atrium_need_packages "${ATRIUM_BUILD_PACKAGES[@]}"
        atrium_configure_tree "$root" build -DCMAKE_BUILD_TYPE=Release
        cmake --build build -j"$(nproc)"
    fi
    local plugin_dir=${ATRIUM_PLUGIN_DIR:-$(dirname "$(dirname "$bin")")/plugins}
    if [ -n "${ATRIUM_BENCH_PG_CONNINFO:-}" ]; then
        conninfo=$ATRIUM_BENCH_PG_CONNINFO
    else
        own_pg=1
        ATRIUM_PG_FAST=1 "$PG_SH" start "$pg_dir" >/dev/null
        conninfo=$("$PG_SH" conninfo "$pg_dir")
    fi
    admin_psql -c "CREATE DATABASE \"$db\""
    local port config out
    port=$(free_port)
    config=$work/homeserver.yaml
    out=$("$bin" --generate-config "$config" --server-name "$SERVER_NAME" \
        --database-conninfo "$conninfo dbname=$db" --plugin-dir "$plugin_dir" 2>&1) ||
        atrium_die "atrium --generate-config failed: $out"
    env ATRIUM__SERVER__HTTP__PORT="$port" ATRIUM__RATELIMIT__ENABLED=false \
        ATRIUM__LOG__LEVEL=warn "$@" \
        "$bin" --config "$config" </dev/null >"$work/server.log" 2>&1 &
    server_pid=$!
    url=http://127.0.0.1:$port
    local deadline=$((SECONDS + HEALTH_TIMEOUT_S))
    until curl -fsS -m 2 -o /dev/null "$url/health" 2>/dev/null; do
        if ! kill -0 "$server_pid" 2>/dev/null || [ $SECONDS -ge $deadline ]; then
            cat "$work/server.log" >&2
            atrium_die "the server did not become ready (log above)"
        fi
        sleep 0.1
    done
}

