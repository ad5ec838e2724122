#!/usr/bin/env bash
# The container entrypoint (deploy/docker-entrypoint.sh), run outside a container with
# ATRIUM_BIN/ATRIUM_DATA_DIR pointed at the build and a temporary directory:
#   - without a config and without ATRIUM_SERVER_NAME it refuses, clearly, and writes nothing;
#   - with them it generates a config (given server_name and database, bound to 0.0.0.0,
#     private to its owner), becomes the server (exec: same PID), /health answers, and
#     SIGTERM stops it with status 0;
#   - a second start uses the existing config as it is, without ATRIUM_SERVER_NAME;
#   - two replicas starting at once on one empty data directory (the scaled Compose
#     file) generate one config between them and sign with one key.
# Environment (from ctest): ATRIUM_BIN, ATRIUM_PLUGIN_DIR, ATRIUM_TEST_PG_CONNINFO, and
# ATRIUM_TEST_TMPDIR (where the temporary directory goes; /tmp if unset).
#
# The generated config binds 0.0.0.0, as a container needs; this test overrides the
# address with ATRIUM__SERVER__HTTP__BIND_ADDRESS so its servers listen on a loopback
# address of their own (tests stay on 127.0.0.0/8), and /health counts only once this
# server's log says it listens there: an answer on a port another test took meanwhile
# is not this server's.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
entrypoint=$here/../../deploy/docker-entrypoint.sh
: "${ATRIUM_BIN:?set ATRIUM_BIN to the atrium executable}"
: "${ATRIUM_TEST_PG_CONNINFO:?set ATRIUM_TEST_PG_CONNINFO (tests/run.sh does)}"
readonly HEALTH_TIMEOUT_S=30
readonly STOP_TIMEOUT_S=30
readonly BIND=127.0.0.161

mkdir -p "${ATRIUM_TEST_TMPDIR:-/tmp}"
tmp=$(mktemp -d "${ATRIUM_TEST_TMPDIR:-/tmp}/atrium-entrypoint-test.XXXXXX")
data=$tmp/data
log=$tmp/server.log
db=atrium_test_$(od -An -tx1 -N6 /dev/urandom | tr -d ' \n')
server_pid=
ok=0

psql_admin() {
    PGCONNECT_TIMEOUT=10 psql -X -q -v ON_ERROR_STOP=1 -d "$ATRIUM_TEST_PG_CONNINFO dbname=postgres" "$@"
}

cleanup() {
    if [ -n "$server_pid" ] && kill -0 "$server_pid" 2>/dev/null; then
        kill -KILL "$server_pid" 2>/dev/null || true
        wait "$server_pid" 2>/dev/null || true
    fi
    psql_admin -c "DROP DATABASE IF EXISTS \"$db\" WITH (FORCE)" >/dev/null 2>&1 || true
    if [ "$ok" = 1 ]; then
        rm -rf "$tmp"
    else
        echo "kept $tmp for inspection" >&2
    fi
}
trap cleanup EXIT

fail() {
    echo "FAIL: $*" >&2
    if [ -s "$log" ]; then
        echo "----- server log tail ($log) -----" >&2
        tail -n 60 "$log" >&2
    fi
    exit 1
}

pass() { echo "ok - $*"; }

free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("'"$BIND"'", 0)); print(s.getsockname()[1])'
}

no_sanitizer_report() {
    if grep -E 'ERROR: AddressSanitizer|runtime error:|ERROR: LeakSanitizer|WARNING: ThreadSanitizer' "$log" >&2; then
        fail "sanitizer report in the server log"
    fi
}

# start_entrypoint [VAR=VALUE...]: runs the entrypoint in the background with a clean
# ATRIUM_* environment plus the given variables.
start_entrypoint() {
    : >"$log"
    env -u ATRIUM_SERVER_NAME -u ATRIUM_DATABASE_CONNINFO \
        ATRIUM_BIN="$ATRIUM_BIN" ATRIUM_DATA_DIR="$data" \
        ATRIUM_PLUGIN_DIR="${ATRIUM_PLUGIN_DIR:-}" \
        ATRIUM__SERVER__HTTP__PORT="$port" ATRIUM__SERVER__HTTP__BIND_ADDRESS="$BIND" \
        "$@" bash "$entrypoint" </dev/null >"$log" 2>&1 &
    server_pid=$!
}

wait_healthy() {
    local deadline=$((SECONDS + HEALTH_TIMEOUT_S)) body
    while [ $SECONDS -lt $deadline ]; do
        if ! kill -0 "$server_pid" 2>/dev/null; then
            local rc=0
            wait "$server_pid" || rc=$?
            server_pid=
            fail "the entrypoint exited with status $rc before /health answered"
        fi
        if grep -Fq "listening on http://$BIND:$port " "$log" &&
            body=$(curl -fsS -m 2 "http://$BIND:$port/health" 2>/dev/null); then
            [ "$(tr -d ' \n' <<<"$body")" = '{"status":"ok","database":"ok"}' ] || fail "/health answered '$body'"
            return 0
        fi
        sleep 0.1
    done
    fail "/health did not answer within ${HEALTH_TIMEOUT_S}s"
}

stop_server() {
    kill -TERM "$server_pid"
    local waited=0 rc=0
    while kill -0 "$server_pid" 2>/dev/null; do
        [ $waited -lt $((STOP_TIMEOUT_S * 10)) ] || fail "the server did not stop within ${STOP_TIMEOUT_S}s of SIGTERM"
        sleep 0.1
        waited=$((waited + 1))
    done
    wait "$server_pid" || rc=$?
    server_pid=
    [ "$rc" -eq 0 ] || fail "the server exited with status $rc on SIGTERM (expected 0)"
}

mkdir -p "$data"
port=$(free_port)

# 1. No config and no ATRIUM_SERVER_NAME: a clear refusal, non-zero, nothing written.
rc=0
timeout 20 env -u ATRIUM_SERVER_NAME ATRIUM_BIN="$ATRIUM_BIN" ATRIUM_DATA_DIR="$data" \
    ATRIUM_DATABASE_CONNINFO="$ATRIUM_TEST_PG_CONNINFO dbname=$db" \
    bash "$entrypoint" </dev/null >"$log" 2>&1 || rc=$?
[ "$rc" -ne 0 ] || fail "the entrypoint started without ATRIUM_SERVER_NAME and without a config"
[ "$rc" -ne 124 ] || fail "the entrypoint hung instead of refusing to start without ATRIUM_SERVER_NAME"
grep -q 'ATRIUM_SERVER_NAME is not set' "$log" || fail "the refusal does not name ATRIUM_SERVER_NAME"
[ -z "$(ls -A "$data")" ] || fail "the refusal left files in $data: $(ls -A "$data")"
pass "refuses to start without ATRIUM_SERVER_NAME when no config exists (status $rc)"

# 2. First start: generates the config and serves.
psql_admin -c "CREATE DATABASE \"$db\"" >/dev/null
start_entrypoint ATRIUM_SERVER_NAME=entrypoint.test \
    ATRIUM_DATABASE_CONNINFO="$ATRIUM_TEST_PG_CONNINFO dbname=$db"
wait_healthy
config=$data/homeserver.yaml
[ -f "$config" ] || fail "no $config after the first start"
grep -Eq '^server_name:[[:space:]]*"?entrypoint\.test"?' "$config" || fail "the config lacks server_name entrypoint.test"
grep -Fq "dbname=$db" "$config" || fail "the config lacks the database from ATRIUM_DATABASE_CONNINFO"
grep -Eq '^[[:space:]]*bind_address:[[:space:]]*"?0\.0\.0\.0"?' "$config" || fail "the config does not bind 0.0.0.0"
if grep -Eq '^[[:space:]]*bind_address:[[:space:]]*"?127\.' "$config"; then
    fail "a listener in the generated config is still bound to loopback"
fi
[ "$(stat -c %a "$config")" = 600 ] || fail "the config (it holds the database password) is mode $(stat -c %a "$config"), not 600"
[ -z "$(find "$data" -name 'homeserver.yaml.new.*')" ] || fail "a temporary config was left behind"
[ "$(readlink -f "/proc/$server_pid/exe")" = "$(readlink -f "$ATRIUM_BIN")" ] ||
    fail "the entrypoint did not exec the server (pid $server_pid is $(readlink -f "/proc/$server_pid/exe"))"
pass "first start generates $config and serves /health as the entrypoint's own process"
stop_server
no_sanitizer_report
pass "SIGTERM stops the server with status 0"

# 3. Second start: the existing config is used as it is, no ATRIUM_SERVER_NAME needed.
before=$(sha256sum "$config")
start_entrypoint
wait_healthy
[ "$(sha256sum "$config")" = "$before" ] || fail "the second start changed $config"
grep -q 'generated' "$log" && fail "the second start generated a config again"
stop_server
no_sanitizer_report
pass "second start uses the existing config without ATRIUM_SERVER_NAME"

# 4. Two replicas at once on a fresh data directory: one config, one signing key.
data2=$tmp/data2
mkdir -p "$data2"
port_b=$(free_port)
logs=()
pids=()
for p in "$port" "$port_b"; do
    env -u ATRIUM_SERVER_NAME -u ATRIUM_DATABASE_CONNINFO \
        ATRIUM_BIN="$ATRIUM_BIN" ATRIUM_DATA_DIR="$data2" ATRIUM_PLUGIN_DIR="${ATRIUM_PLUGIN_DIR:-}" \
        ATRIUM__SERVER__HTTP__PORT="$p" ATRIUM__SERVER__HTTP__BIND_ADDRESS="$BIND" \
        ATRIUM__SERVER__FEDERATION__PORT=0 \
        ATRIUM_SERVER_NAME=replicas.test ATRIUM_DATABASE_CONNINFO="$ATRIUM_TEST_PG_CONNINFO dbname=$db" \
        bash "$entrypoint" </dev/null >"$tmp/replica-$p.log" 2>&1 &
    pids+=($!)
    logs+=("$tmp/replica-$p.log")
done
for i in 0 1; do
    server_pid=${pids[$i]}
    log=${logs[$i]}
    p=$port
    [ "$i" = 1 ] && p=$port_b
    port=$p wait_healthy
done
generated=$(cat "${logs[@]}" | grep -c 'docker-entrypoint: generated' || true)
[ "$generated" = 1 ] || fail "two replicas starting at once generated $generated configs (expected 1)"
keys=$(cat "${logs[@]}" | grep -o 'signing key ed25519:[A-Za-z0-9_]* from' | sort -u | wc -l)
[ "$keys" = 1 ] || fail "two replicas starting at once sign with $keys different keys"
for i in 0 1; do
    server_pid=${pids[$i]}
    log=${logs[$i]}
    stop_server
    no_sanitizer_report
done
pass "two replicas starting at once on one data directory share one config and one signing key"

ok=1
echo "all entrypoint checks passed"
