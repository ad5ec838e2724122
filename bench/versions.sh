#!/usr/bin/env bash
# Speed figure: GET /_matrix/client/versions under wrk (64 connections, 2 threads, 10 s),
# with the server's idle memory and thread count measured before the load. Prints
# numbers, asserts nothing.
#
#   bench/versions.sh
#
# Uses ATRIUM_BIN if set, else build/core/atrium (building build/ in Release when it is
# missing). The database is ATRIUM_BENCH_PG_CONNINFO (a conninfo without dbname; a
# throwaway database is created in it and dropped) if set, else a private PostgreSQL in a
# temporary directory (tests/lib/pg.sh) that is removed afterwards.
# WRK_CONNECTIONS, WRK_THREADS and WRK_DURATION change the load.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
# shellcheck source=tests/lib/deps.sh
. tests/lib/deps.sh

readonly PG_SH=$root/tests/lib/pg.sh
readonly HEALTH_TIMEOUT_S=30
readonly STOP_GRACE_S=30
wrk_connections=${WRK_CONNECTIONS:-64}
wrk_threads=${WRK_THREADS:-2}
wrk_duration=${WRK_DURATION:-10s}

work=$(mktemp -d /tmp/atrium-bench.XXXXXX)
# The private cluster's owner (user atrium when we are root) must reach it.
chmod 755 "$work"
pg_dir=$work/pg
db=atrium_bench_$(od -An -tx1 -N4 /dev/urandom | tr -d ' \n')
own_pg=0
server_pid=
conninfo=

# psql as the cluster's superuser on database postgres.
admin_psql() {
    PGCONNECT_TIMEOUT=10 psql -X -q -v ON_ERROR_STOP=1 -d "$conninfo dbname=postgres" "$@"
}

cleanup() {
    if [ -n "$server_pid" ] && kill -0 "$server_pid" 2>/dev/null; then
        kill -TERM "$server_pid" 2>/dev/null || true
        local waited=0
        while kill -0 "$server_pid" 2>/dev/null && [ "$waited" -lt $((STOP_GRACE_S * 10)) ]; do
            sleep 0.1
            waited=$((waited + 1))
        done
        kill -KILL "$server_pid" 2>/dev/null || true
        wait "$server_pid" 2>/dev/null || true
    fi
    if [ -n "$conninfo" ]; then
        admin_psql -c "DROP DATABASE IF EXISTS \"$db\" WITH (FORCE)" >/dev/null 2>&1 || true
    fi
    if [ "$own_pg" = 1 ]; then
        "$PG_SH" stop "$pg_dir" >/dev/null || true
    fi
    rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# status_field PID NAME: a field of /proc/PID/status (VmRSS, Threads).
status_field() {
    awk -v name="$2:" '$1 == name { $1 = ""; sub(/^ /, ""); print; exit }' "/proc/$1/status"
}

atrium_need_packages "${ATRIUM_RUNTIME_PACKAGES[@]}" "${ATRIUM_BENCH_PACKAGES[@]}"

bin=${ATRIUM_BIN:-$root/build/core/atrium}
if [ ! -x "$bin" ]; then
    atrium_say "no $bin: building build/ (Release)"
    atrium_need_packages "${ATRIUM_BUILD_PACKAGES[@]}"
    atrium_configure_tree "$root" build -DCMAKE_BUILD_TYPE=Release
    cmake --build build -j"$(nproc)"
fi
plugin_dir=${ATRIUM_PLUGIN_DIR:-$(dirname "$(dirname "$bin")")/plugins}

if [ -n "${ATRIUM_BENCH_PG_CONNINFO:-}" ]; then
    conninfo=$ATRIUM_BENCH_PG_CONNINFO
else
    own_pg=1
    ATRIUM_PG_FAST=1 "$PG_SH" start "$pg_dir" >/dev/null
    conninfo=$("$PG_SH" conninfo "$pg_dir")
fi
admin_psql -c "CREATE DATABASE \"$db\""

port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])' 2>/dev/null ||
    echo $((20000 + RANDOM % 10000)))
config=$work/homeserver.yaml
generate_out=$("$bin" --generate-config "$config" --server-name bench.localhost \
    --database-conninfo "$conninfo dbname=$db" --plugin-dir "$plugin_dir" 2>&1) ||
    atrium_die "atrium --generate-config failed: $generate_out"
ATRIUM__SERVER__HTTP__PORT=$port ATRIUM__RATELIMIT__ENABLED=false ATRIUM__LOG__LEVEL=warn \
    "$bin" --config "$config" </dev/null >"$work/server.log" 2>&1 &
server_pid=$!

url=http://127.0.0.1:$port
deadline=$((SECONDS + HEALTH_TIMEOUT_S))
until curl -fsS -m 2 -o /dev/null "$url/health" 2>/dev/null; do
    if ! kill -0 "$server_pid" 2>/dev/null || [ $SECONDS -ge $deadline ]; then
        cat "$work/server.log" >&2
        atrium_die "the server did not become ready (log above)"
    fi
    sleep 0.1
done
curl -fsS -m 5 -o /dev/null "$url/_matrix/client/versions" || atrium_die "/_matrix/client/versions does not answer 200"

sleep 1 # let start-up settle before measuring idle figures
idle_rss=$(status_field "$server_pid" VmRSS)
idle_threads=$(status_field "$server_pid" Threads)

wrk_out=$(wrk -c"$wrk_connections" -t"$wrk_threads" -d"$wrk_duration" --latency "$url/_matrix/client/versions")
loaded_rss=$(status_field "$server_pid" VmRSS)
loaded_threads=$(status_field "$server_pid" Threads)

rps=$(awk '/^Requests\/sec:/ { print $2 }' <<<"$wrk_out")
latency=$(awk '$1 == "Latency" { print $2 " avg, " $3 " stdev, " $4 " max"; exit }' <<<"$wrk_out")
p99=$(awk '$1 == "99%" { print $2; exit }' <<<"$wrk_out")
non2xx=$(awk '/Non-2xx or 3xx responses:/ { print $NF }' <<<"$wrk_out")
errors=$(grep -E '^ *Socket errors:' <<<"$wrk_out" | sed 's/^ *//' || true)

echo "$("$bin" --version 2>/dev/null | head -n 1): GET /_matrix/client/versions"
echo "load:            wrk -c$wrk_connections -t$wrk_threads -d$wrk_duration ($(nproc) CPUs)"
echo "requests/s:      ${rps:-?}"
echo "latency:         ${latency:-?}; p99 ${p99:-?}"
echo "non-2xx:         ${non2xx:-0}"
[ -z "$errors" ] || echo "wrk:             $errors"
echo "idle RSS:        $idle_rss"
echo "idle threads:    $idle_threads"
echo "RSS after load:  $loaded_rss"
echo "threads after:   $loaded_threads"
