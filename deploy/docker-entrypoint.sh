#!/usr/bin/env bash
# Container entrypoint: make sure a config exists, then become the server.
#
# On first start (no $ATRIUM_DATA_DIR/homeserver.yaml) it generates the config with
# `atrium --generate-config`: server_name from ATRIUM_SERVER_NAME and the database from
# ATRIUM_DATABASE_CONNINFO (both required then), plugins from ATRIUM_PLUGIN_DIR, and every
# listener bound to 0.0.0.0 (a container's loopback is unreachable from outside). Later
# starts use the config as it is; edit it in the volume to change settings. ATRIUM__*
# variables override config keys as usual (ATRIUM__LOG__LEVEL=debug).
#
# Then it execs `atrium --config ... [ARGS]`, so the server is PID 1's child (or PID 1)
# and receives SIGTERM from `docker stop` directly. Arguments that do not start with "-"
# run instead of the server (`docker run IMAGE bash`).
#
# Several replicas may share one data volume (deploy/docker-compose.scale.yml): the first
# start is serialized by a lock file there, so one config is generated and the others use
# it (and the server itself makes sure they sign with one key).
#
# Paths can be moved with ATRIUM_BIN, ATRIUM_DATA_DIR and ATRIUM_PLUGIN_DIR, which is how
# tests/integration/test_entrypoint.sh runs this outside a container.
set -euo pipefail

ATRIUM_BIN=${ATRIUM_BIN:-/usr/local/bin/atrium}
ATRIUM_DATA_DIR=${ATRIUM_DATA_DIR:-/data}
ATRIUM_PLUGIN_DIR=${ATRIUM_PLUGIN_DIR:-/usr/lib/atrium/plugins}
config=$ATRIUM_DATA_DIR/homeserver.yaml

say() { printf 'docker-entrypoint: %s\n' "$*" >&2; }
die() { say "ERROR: $*"; exit 1; }

if [ $# -gt 0 ] && [ "${1#-}" = "$1" ]; then
    exec "$@"
fi

[ -x "$ATRIUM_BIN" ] || die "no atrium executable at $ATRIUM_BIN (set ATRIUM_BIN)"

generate_config() {
    [ -n "${ATRIUM_SERVER_NAME:-}" ] ||
        die "$config does not exist and ATRIUM_SERVER_NAME is not set. Set ATRIUM_SERVER_NAME to the server's name (as in @alice:example.org; it cannot change once users exist) and ATRIUM_DATABASE_CONNINFO to a libpq connection string to generate a config, or put your own config at $config."
    [ -n "${ATRIUM_DATABASE_CONNINFO:-}" ] ||
        die "$config does not exist and ATRIUM_DATABASE_CONNINFO is not set. Set it to a libpq connection string, e.g. 'host=postgres user=atrium password=... dbname=atrium'."
    if ! { [ -d "$ATRIUM_DATA_DIR" ] && [ -w "$ATRIUM_DATA_DIR" ]; }; then
        die "$ATRIUM_DATA_DIR is not a writable directory for user $(id -un) (uid $(id -u)); mount a volume there that this user may write"
    fi
    # Replicas sharing the volume start at once: one generates, the others wait for it
    # and use its config (the lock is released when this shell execs the server).
    exec 9>>"$ATRIUM_DATA_DIR/.atrium-init.lock" || die "cannot open $ATRIUM_DATA_DIR/.atrium-init.lock"
    flock 9 || die "cannot lock $ATRIUM_DATA_DIR/.atrium-init.lock"
    if [ -f "$config" ]; then
        say "another replica generated $config meanwhile; using it"
        return 0
    fi

    local tmp=$config.new.$$
    rm -f "$tmp"
    (umask 077 && "$ATRIUM_BIN" --generate-config "$tmp" \
        --server-name "$ATRIUM_SERVER_NAME" \
        --database-conninfo "$ATRIUM_DATABASE_CONNINFO" \
        --plugin-dir "$ATRIUM_PLUGIN_DIR") || { rm -f "$tmp"; die "atrium --generate-config failed"; }
    # Every `bind_address: <value>` becomes 0.0.0.0, keeping indentation and comments.
    sed -i -E 's/^([[:space:]]*bind_address:[[:space:]]*)("[^"]*"|'"'"'[^'"'"']*'"'"'|[^[:space:]#]+)/\1"0.0.0.0"/' "$tmp"
    if ! grep -Eq '^[[:space:]]*bind_address:[[:space:]]*"0\.0\.0\.0"' "$tmp"; then
        rm -f "$tmp"
        die "found no bind_address in the generated config to set to 0.0.0.0; this entrypoint needs updating for the config format"
    fi
    chmod 600 "$tmp"
    mv "$tmp" "$config"
    say "generated $config for server_name $ATRIUM_SERVER_NAME, listening on 0.0.0.0"
}

[ -f "$config" ] || generate_config

# Relative paths in the config (a media store, say) land in the data directory.
cd "$ATRIUM_DATA_DIR"
exec 9>&- # the first-start lock, if taken, is not the server's to hold
exec "$ATRIUM_BIN" --config "$config" "$@"
