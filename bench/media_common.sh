# shellcheck shell=bash
# What the media benchmarks share: a throwaway server with the media plugin (its store in
# the run's temporary folder), a user with an access token, uploads, a 12-megapixel test
# photo, /proc figures, and cleanup. Sourced by bench/media_*.sh; prints nothing itself.
#
# Uses ATRIUM_BIN if set, else build/core/atrium (building build/ in Release when it is
# missing). The database is ATRIUM_BENCH_PG_CONNINFO (a conninfo without dbname; a
# throwaway database is created in it and dropped) if set, else a private PostgreSQL in a
# temporary directory (tests/lib/pg.sh) that is removed afterwards.

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
# shellcheck source=tests/lib/deps.sh
. tests/lib/deps.sh

readonly PG_SH=$root/tests/lib/pg.sh
readonly HEALTH_TIMEOUT_S=30
readonly STOP_GRACE_S=30
readonly SERVER_NAME=bench.localhost

work=$(mktemp -d /tmp/atrium-media-bench.XXXXXX)
chmod 755 "$work" # the private cluster's owner (user atrium when we are root) must reach it
pg_dir=$work/pg
db=atrium_bench_$(od -An -tx1 -N4 /dev/urandom | tr -d ' \n')
own_pg=0
server_pid=
conninfo=
url=
store=$work/media_store
extra_cleanup=()

admin_psql() {
    PGCONNECT_TIMEOUT=10 psql -X -q -v ON_ERROR_STOP=1 -d "$conninfo dbname=postgres" "$@"
}

media_bench_cleanup() {
    local c
    for c in "${extra_cleanup[@]}"; do eval "$c" || true; done
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
trap media_bench_cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# status_field PID NAME: a field of /proc/PID/status (VmRSS, VmHWM, Threads).
status_field() {
    awk -v name="$2:" '$1 == name { $1 = ""; sub(/^ /, ""); print; exit }' "/proc/$1/status"
}

free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# media_bench_start [ENV=VALUE...]: starts the server (extra settings as ATRIUM__ overrides)
# and sets url and server_pid.
media_bench_start() {
    atrium_need_packages "${ATRIUM_RUNTIME_PACKAGES[@]}" "${ATRIUM_BENCH_PACKAGES[@]}"
    local bin=${ATRIUM_BIN:-$root/build/core/atrium}
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
        ATRIUM__LOG__LEVEL=warn ATRIUM__REGISTRATION__ENABLED=true \
        ATRIUM__PLUGINS__MEDIA__STORE_PATH="$store" "$@" \
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

# media_bench_token: registers a user and prints its access token.
media_bench_token() {
    local name=bench$RANDOM$RANDOM body session
    body="{\"username\": \"$name\", \"password\": \"bench password $name\"}"
    session=$(curl -sS -m 30 -X POST -d "$body" "$url/_matrix/client/v3/register" |
        python3 -c 'import json, sys; print(json.load(sys.stdin)["session"])')
    body="{\"username\": \"$name\", \"password\": \"bench password $name\", \"auth\": {\"type\": \"m.login.dummy\", \"session\": \"$session\"}}"
    curl -fsS -m 30 -X POST -d "$body" "$url/_matrix/client/v3/register" |
        python3 -c 'import json, sys; print(json.load(sys.stdin)["access_token"])'
}

# media_bench_upload TOKEN FILE TYPE: uploads and prints the media ID.
media_bench_upload() {
    curl -fsS -m 120 -X POST -H "Authorization: Bearer $1" -H "Content-Type: $3" \
        --data-binary "@$2" "$url/_matrix/media/v3/upload" |
        python3 -c 'import json, sys; print(json.load(sys.stdin)["content_uri"].rsplit("/", 1)[1])'
}

# media_bench_photo FILE: a 12-megapixel (4000x3000) photo-like JPEG (blurred colour noise).
media_bench_photo() {
    local d=$work/photo-build
    mkdir -p "$d"
    vips gaussnoise "$d/r.v" 4000 3000 --mean 128 --sigma 50
    vips gaussnoise "$d/g.v" 4000 3000 --mean 110 --sigma 50
    vips gaussnoise "$d/b.v" 4000 3000 --mean 90 --sigma 50
    vips bandjoin "$d/r.v $d/g.v $d/b.v" "$d/rgb.v"
    vips gaussblur "$d/rgb.v" "$d/blur.v" 4
    vips cast "$d/blur.v" "$d/u.v" uchar
    vips copy "$d/u.v" "$1[Q=90]"
    rm -rf "$d"
}

# median N...: the median of the numbers given.
median() {
    printf '%s\n' "$@" | sort -g | awk '{ v[NR] = $1 } END { if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}
