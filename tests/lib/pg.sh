#!/usr/bin/env bash
# A private PostgreSQL cluster for development and tests, kept in a directory you name.
#
# Used by deploy/run-local.sh (the cluster behind the generated config), tests/run.sh (one
# cluster for the whole test run) and bench/. It never touches the system's clusters.
#
#   pg.sh start DIR [PORT]     initdb on first use, then start (idempotent); prints
#                              progress and, as its last line, the conninfo
#   pg.sh stop DIR             fast shutdown; succeeds when nothing runs
#   pg.sh status DIR           exit 0 when the cluster runs
#   pg.sh conninfo DIR [DB]    host=127.0.0.1 port=.. user=atrium password=.. [dbname=DB]
#   pg.sh createdb DIR NAME    create database NAME unless it exists
#   pg.sh psql DIR [DB [ARG..]] psql on the cluster as its superuser (DB defaults to
#                              postgres; ARGs go to psql, e.g. -At -c 'SELECT 1')
#   pg.sh datadir DIR          the directory that really holds the cluster (see below)
#
# PostgreSQL refuses to run as root. As root this script runs the cluster as the system
# user `atrium` (created on first use) through runuser; as anyone else, as yourself.
# The database superuser is `atrium`, with a generated password (scram-sha-256) kept in
# the cluster directory as atrium.password. The server listens on 127.0.0.1 only, on the
# PORT given, else on the port it used last time if that is free, else on a free one;
# its unix socket is in the cluster directory when the path is short enough for a socket
# (107 bytes), and disabled otherwise (clients use TCP anyway).
#
# When root asks for a DIR that user `atrium` cannot reach (under /root, mode 700, say),
# the script does not loosen any directory's permissions: the cluster lives in
# /var/lib/atrium-dev/<hash of DIR> instead, DIR holds a file ATRIUM_CLUSTER_LOCATION
# naming it, and every command follows that file. Deleting DIR forgets that cluster: the
# next start discards it and creates a fresh one.
#
# ATRIUM_PG_FAST=1 turns off fsync and friends (for throwaway test clusters only; a crash
# of the machine may then corrupt the cluster) and stores the superuser's password as a
# SCRAM-SHA-256 verifier of one iteration instead of 4096: every client still logs in
# with SCRAM, but the client's share of a login (4096 HMACs; 23-28 ms of CPU in an
# ASan-built atrium, which logs in about 5 times per start) drops to about 5 ms.
# Both are applied at every start (a start without it restores the default verifier).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=tests/lib/deps.sh
. "$here/deps.sh"

readonly OS_USER=atrium          # the unprivileged OS user when we are root
readonly DB_SUPERUSER=atrium     # the cluster's superuser
readonly FALLBACK_ROOT=/var/lib/atrium-dev
readonly MARKER=ATRIUM_CLUSTER_LOCATION
readonly PASSWORD_FILE=atrium.password
readonly SETTINGS_FILE=atrium.conf
readonly SERVER_LOG=postgres.log
# sun_path holds 107 bytes; the socket is "<dir>/.s.PGSQL.<port>" (up to 15 more).
readonly SOCKET_DIR_MAX_LEN=90
readonly START_TIMEOUT_S=60
readonly STOP_TIMEOUT_S=60

say() { printf '[pg.sh] %s\n' "$*"; }
die() { printf '[pg.sh] ERROR: %s\n' "$*" >&2; exit 1; }

usage() {
    sed -n '/^#   pg.sh/,/^#$/p' "${BASH_SOURCE[0]}" | sed -e '/^#$/d' -e 's/^#   /  /' >&2
    exit 2
}

am_root() { [ "$(id -u)" -eq 0 ]; }

# The newest installed PostgreSQL's bin directory; installs PostgreSQL if there is none.
find_pg_bin() {
    local found
    found=$(find_newest_pg_bin)
    if [ -z "$found" ]; then
        atrium_need_packages postgresql postgresql-client
        found=$(find_newest_pg_bin)
    fi
    [ -n "$found" ] || die "no PostgreSQL server binaries under /usr/lib/postgresql/*/bin"
    PG_BIN=$found
}

find_newest_pg_bin() {
    local d
    for d in /usr/lib/postgresql/*/bin; do
        [ -x "$d/pg_ctl" ] && [ -x "$d/initdb" ] && printf '%s\n' "$d"
    done | sort -V | tail -n 1
}

# Runs a command as the cluster's owner, from / (the caller's working directory may be
# one the owner cannot read, and initdb/pg_ctl look at it).
# fd 9 (the lock of lock_dir) is closed so the postmaster does not inherit the lock.
as_owner() {
    if am_root; then
        (cd / && runuser -u "$OS_USER" -- "$@" 9>&-)
    else
        (cd / && "$@" 9>&-)
    fi
}

ensure_os_user() {
    am_root || return 0
    getent passwd "$OS_USER" >/dev/null && return 0
    say "creating system user '$OS_USER' to run PostgreSQL (it refuses to run as root)"
    useradd --system --user-group --no-create-home --home-dir "$FALLBACK_ROOT" \
        --shell /usr/sbin/nologin --comment "Atrium development PostgreSQL" "$OS_USER" ||
        die "useradd $OS_USER failed"
}

# Gives a file or directory we created as root to the cluster's owner.
give_to_owner() {
    if am_root; then chown "$OS_USER:" "$@"; fi
}

# resolve DIR: sets REQ (DIR, absolute), ALT (its fallback location) and CLUSTER (where
# the cluster is or will be, as far as can be told without creating anything).
resolve() {
    [ -n "$1" ] || die "empty directory name"
    REQ=$(realpath -m -- "$1")
    local hash
    hash=$(printf '%s' "$REQ" | sha256sum | cut -c1-16)
    ALT=$FALLBACK_ROOT/$hash
    CLUSTER=$REQ
    if [ -f "$REQ/$MARKER" ]; then
        CLUSTER=$(head -n 1 "$REQ/$MARKER")
        case "$CLUSTER" in
            "$FALLBACK_ROOT"/?*) ;;
            *) die "$REQ/$MARKER names '$CLUSTER', which is not under $FALLBACK_ROOT; remove the file" ;;
        esac
    fi
}

initialized() { [ -f "$CLUSTER/PG_VERSION" ]; }

require_initialized() {
    initialized || die "no cluster in $REQ (run: $0 start $REQ)"
}

# The postmaster's PID when the cluster in $1 (default $CLUSTER) runs. A postmaster.pid
# left by a killed run names a process that is gone, or (PIDs are reused) some other
# process: only a live `postgres` whose working directory is the cluster counts.
running_pid() {
    local dir=${1:-$CLUSTER} pid cwd
    [ -f "$dir/postmaster.pid" ] || return 1
    pid=$(head -n 1 "$dir/postmaster.pid" 2>/dev/null) || return 1
    [[ $pid =~ ^[0-9]+$ ]] || return 1
    [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = postgres ] || return 1
    if cwd=$(readlink "/proc/$pid/cwd" 2>/dev/null); then
        [ "$cwd" = "$(realpath -m -- "$dir")" ] || return 1
    fi
    printf '%s\n' "$pid"
}

# Removes the lock files of a postmaster that is gone, so they cannot block a start.
clear_stale_lock() {
    local dir=${1:-$CLUSTER}
    if [ -f "$dir/postmaster.pid" ] && ! running_pid "$dir" >/dev/null; then
        say "removing stale postmaster.pid left by a stopped or killed server"
        rm -f "$dir/postmaster.pid" "$dir"/.s.PGSQL.*.lock
    fi
}

port_in_use() {
    (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
}

random_port() {
    local p i
    for i in $(seq 1 50); do
        p=$((15000 + RANDOM % 17000))
        port_in_use "$p" || { printf '%s\n' "$p"; return 0; }
    done
    die "found no free TCP port after $i tries"
}

configured_port() {
    [ -f "$CLUSTER/$SETTINGS_FILE" ] || return 0
    sed -n "s/^port = \([0-9][0-9]*\)$/\1/p" "$CLUSTER/$SETTINGS_FILE" | tail -n 1
}

# Writes the settings this script owns; postgresql.conf includes the file.
write_settings() {
    local port=$1 sockdir=$CLUSTER
    if [ ${#CLUSTER} -gt $SOCKET_DIR_MAX_LEN ]; then
        sockdir=
    fi
    {
        echo "# Written by tests/lib/pg.sh at every start: edit that script, not this file."
        echo "listen_addresses = '127.0.0.1'"
        echo "port = $port"
        echo "unix_socket_directories = '${sockdir//\'/\'\'}'"
        echo "max_connections = 300"
        echo "password_encryption = 'scram-sha-256'"
        if [ "${ATRIUM_PG_FAST:-0}" = 1 ]; then
            echo "# ATRIUM_PG_FAST=1: a throwaway cluster, durability traded for speed."
            echo "fsync = off"
            echo "synchronous_commit = off"
            echo "full_page_writes = off"
        fi
    } >"$CLUSTER/$SETTINGS_FILE"
    give_to_owner "$CLUSTER/$SETTINGS_FILE"
}

# Decides where a new cluster for $REQ lives and creates that directory, empty, owned by
# the cluster's owner with mode 700.
place_new_cluster() {
    if [ -f "$REQ/$MARKER" ]; then
        # The fallback location was chosen before; its cluster is gone: start afresh.
        (umask 022 && mkdir -p "$CLUSTER")
    elif ! am_root; then
        mkdir -p "$REQ" || die "cannot create $REQ"
        CLUSTER=$REQ
    else
        (umask 022 && mkdir -p "$REQ") || die "cannot create $REQ"
        if runuser -u "$OS_USER" -- test -x "$(dirname "$REQ")" 2>/dev/null; then
            CLUSTER=$REQ
        else
            CLUSTER=$ALT
            say "user '$OS_USER' cannot reach $REQ (a parent directory is private); not changing any permissions"
            say "the cluster lives in $CLUSTER instead (recorded in $REQ/$MARKER)"
            if [ -e "$ALT" ]; then
                say "discarding an old cluster in $ALT whose $REQ was deleted"
                stop_cluster_in "$ALT"
                rm -rf -- "$ALT"
            fi
            (umask 022 && mkdir -p "$ALT")
            printf '%s\n' "$ALT" >"$REQ/$MARKER"
        fi
    fi
    if [ -n "$(ls -A "$CLUSTER")" ]; then
        die "$CLUSTER exists, is not empty and holds no PostgreSQL cluster; choose another directory or empty it"
    fi
    give_to_owner "$CLUSTER"
    chmod 700 "$CLUSTER"
}

init_cluster() {
    place_new_cluster
    say "creating a PostgreSQL $(basename "$(dirname "$PG_BIN")") cluster in $CLUSTER"
    local password pwfile out
    password=$(od -An -tx1 -N24 /dev/urandom | tr -d ' \n')
    pwfile=$(mktemp /tmp/atrium-pg-pw.XXXXXX)
    printf '%s\n' "$password" >"$pwfile"
    give_to_owner "$pwfile"
    local args=(-D "$CLUSTER" -U "$DB_SUPERUSER" --pwfile="$pwfile" --auth=scram-sha-256
        --encoding=UTF8 --no-locale)
    [ "${ATRIUM_PG_FAST:-0}" = 1 ] && args+=(--no-sync)
    if ! out=$(as_owner "$PG_BIN/initdb" "${args[@]}" 2>&1); then
        rm -f "$pwfile"
        printf '%s\n' "$out" >&2
        die "initdb failed in $CLUSTER"
    fi
    rm -f "$pwfile"
    (umask 077 && printf '%s\n' "$password" >"$CLUSTER/$PASSWORD_FILE")
    give_to_owner "$CLUSTER/$PASSWORD_FILE"
    printf "\n# Settings of tests/lib/pg.sh (port, addresses, speed).\ninclude_if_exists = '%s'\n" \
        "$SETTINGS_FILE" >>"$CLUSTER/postgresql.conf"
}

# Fast shutdown of the cluster in $1 if it runs, falling back to immediate.
stop_cluster_in() {
    local dir=$1
    if running_pid "$dir" >/dev/null; then
        if ! as_owner "$PG_BIN/pg_ctl" stop -D "$dir" -m fast -w -t "$STOP_TIMEOUT_S" -s; then
            say "fast shutdown did not finish in ${STOP_TIMEOUT_S}s; using immediate shutdown"
            as_owner "$PG_BIN/pg_ctl" stop -D "$dir" -m immediate -w -t "$STOP_TIMEOUT_S" -s ||
                die "could not stop the PostgreSQL server in $dir"
        fi
        say "stopped PostgreSQL in $dir"
    else
        clear_stale_lock "$dir"
    fi
}

# Serializes start/stop on one DIR (two test runs started at once, say).
lock_dir() {
    local hash lock
    hash=$(printf '%s' "$REQ" | sha256sum | cut -c1-16)
    lock=${TMPDIR:-/tmp}/atrium-pg-$(id -u)-$hash.lock
    exec 9>"$lock"
    flock -w $((START_TIMEOUT_S + STOP_TIMEOUT_S)) 9 || die "another pg.sh holds $lock"
}

cluster_password() {
    head -n 1 "$CLUSTER/$PASSWORD_FILE" || die "cannot read $CLUSTER/$PASSWORD_FILE"
}

# The conninfo without the password (for psql, which gets it through PGPASSWORD so it
# does not show in the process list).
conninfo_without_password() {
    local db=${1:-} port
    port=$(configured_port)
    [ -n "$port" ] || die "no port in $CLUSTER/$SETTINGS_FILE; start the cluster once with: $0 start $REQ"
    printf 'host=127.0.0.1 port=%s user=%s' "$port" "$DB_SUPERUSER"
    if [ -n "$db" ]; then printf ' dbname=%s' "$db"; fi
}

print_conninfo() {
    local without password
    without=$(conninfo_without_password "${1:-}")
    password=$(cluster_password)
    # password= goes before dbname=, as in "host=.. port=.. user=.. password=.. dbname=..".
    case "$without" in
        *" dbname="*) printf '%s password=%s dbname=%s\n' "${without% dbname=*}" "$password" "${without##* dbname=}" ;;
        *) printf '%s password=%s\n' "$without" "$password" ;;
    esac
}

# The superuser's password as PostgreSQL stores it for SCRAM-SHA-256 logins with
# $1 iterations (RFC 5802 and RFC 7677: the salted password, then the stored key and the
# server key), on standard output; ALTER ROLE takes such a verifier as it is.
scram_verifier() {
    python3 - "$1" "$CLUSTER/$PASSWORD_FILE" <<'PY'
import base64, hashlib, hmac, os, sys
iterations, password = int(sys.argv[1]), open(sys.argv[2]).readline().strip().encode()
salt = os.urandom(16)
salted = hashlib.pbkdf2_hmac("sha256", password, salt, iterations)
client_key = hmac.new(salted, b"Client Key", "sha256").digest()
server_key = hmac.new(salted, b"Server Key", "sha256").digest()
b64 = lambda data: base64.b64encode(data).decode()
print(f"SCRAM-SHA-256${iterations}:{b64(salt)}${b64(hashlib.sha256(client_key).digest())}:{b64(server_key)}")
PY
}

# Sets the superuser's password verifier for this start (see ATRIUM_PG_FAST above): one
# iteration for a fast cluster, PostgreSQL's own (4096) otherwise. Without python3 a fast
# cluster keeps the verifier it has. Any other cluster (the private one deploy/run-local.sh
# starts for an operator) is left as it is unless an earlier fast start left the
# one-iteration verifier.
set_password_verifier() {
    local secret
    if [ "${ATRIUM_PG_FAST:-0}" = 1 ]; then
        command -v python3 >/dev/null || return 0
        secret=$(scram_verifier 1) || die "cannot compute the password verifier"
    else
        [ "$(cluster_psql postgres -At -c "SELECT rolpassword LIKE 'SCRAM-SHA-256\$1:%'
            FROM pg_authid WHERE rolname = '$DB_SUPERUSER'")" = t ] || return 0
        secret=$(cluster_password)
    fi
    # On standard input, not the command line: the process list shows no password.
    cluster_psql postgres -q -v ON_ERROR_STOP=1 <<<"ALTER ROLE $DB_SUPERUSER PASSWORD '$secret'" ||
        die "cannot set the password of $DB_SUPERUSER"
}

# psql as the superuser on database $1 of the running cluster, further args after it.
cluster_psql() {
    local db=$1 password
    shift
    password=$(cluster_password)
    PGPASSWORD=$password PGCONNECT_TIMEOUT=10 "$PG_BIN/psql" -X -d "$(conninfo_without_password "$db")" "$@"
}

cmd_start() {
    local wanted_port=${2:-}
    if [ -n "$wanted_port" ] && ! [[ $wanted_port =~ ^[0-9]+$ && $wanted_port -ge 1 && $wanted_port -le 65535 ]]; then
        die "PORT must be a number from 1 to 65535, not '$wanted_port'"
    fi
    find_pg_bin
    ensure_os_user
    resolve "$1"
    lock_dir

    if initialized && running_pid >/dev/null; then
        local current
        current=$(configured_port)
        if [ -n "$wanted_port" ] && [ "$wanted_port" != "$current" ]; then
            die "the cluster in $CLUSTER already runs on port $current, not $wanted_port; stop it first"
        fi
        say "PostgreSQL already runs in $CLUSTER on 127.0.0.1:$current"
        print_conninfo
        return 0
    fi
    if initialized; then
        clear_stale_lock
    else
        init_cluster
    fi

    local port attempt
    for attempt in 1 2 3 4 5; do
        if [ -n "$wanted_port" ]; then
            port=$wanted_port
            ! port_in_use "$port" || die "port $port on 127.0.0.1 is already in use"
        else
            port=$(configured_port)
            if [ -z "$port" ] || port_in_use "$port"; then
                port=$(random_port)
            fi
        fi
        write_settings "$port"
        if as_owner setsid -w "$PG_BIN/pg_ctl" start -D "$CLUSTER" -l "$CLUSTER/$SERVER_LOG" \
            -w -t "$START_TIMEOUT_S" -s >/dev/null; then
            say "PostgreSQL runs in $CLUSTER on 127.0.0.1:$port (log: $CLUSTER/$SERVER_LOG)"
            set_password_verifier
            print_conninfo
            return 0
        fi
        # Another process may have taken the port between the check and the bind.
        if [ -z "$wanted_port" ] && port_in_use "$port" && ! running_pid >/dev/null; then
            say "port $port was taken meanwhile; trying another (attempt $attempt)"
            continue
        fi
        break
    done
    tail -n 20 "$CLUSTER/$SERVER_LOG" >&2 || true
    die "PostgreSQL did not start in $CLUSTER (log above: $CLUSTER/$SERVER_LOG)"
}

cmd_stop() {
    find_pg_bin
    resolve "$1"
    if ! initialized; then
        say "no cluster in $REQ; nothing to stop"
        return 0
    fi
    lock_dir
    if running_pid >/dev/null; then
        stop_cluster_in "$CLUSTER"
    else
        clear_stale_lock
        say "PostgreSQL in $CLUSTER is not running"
    fi
}

cmd_status() {
    resolve "$1"
    require_initialized
    if running_pid >/dev/null; then
        say "PostgreSQL in $CLUSTER runs on 127.0.0.1:$(configured_port)"
    else
        say "PostgreSQL in $CLUSTER is not running"
        return 3
    fi
}

cmd_conninfo() {
    resolve "$1"
    require_initialized
    print_conninfo "${2:-}"
}

cmd_createdb() {
    local name=${2:-}
    [[ $name =~ ^[A-Za-z_][A-Za-z0-9_]*$ ]] ||
        die "database name must be letters, digits and underscores, not '$name'"
    find_pg_bin
    resolve "$1"
    require_initialized
    running_pid >/dev/null || die "PostgreSQL in $CLUSTER is not running (run: $0 start $REQ)"
    local exists
    exists=$(cluster_psql postgres -q -At -v ON_ERROR_STOP=1 \
        -c "SELECT 1 FROM pg_database WHERE datname = '$name'") ||
        die "cannot query the cluster in $CLUSTER"
    if [ "$exists" = 1 ]; then
        say "database $name exists"
    else
        cluster_psql postgres -q -v ON_ERROR_STOP=1 -c "CREATE DATABASE \"$name\"" ||
            die "CREATE DATABASE $name failed"
        say "created database $name"
    fi
}

cmd_psql() {
    find_pg_bin
    resolve "$1"
    require_initialized
    shift
    local db=${1:-postgres}
    [ $# -eq 0 ] || shift
    cluster_psql "$db" "$@"
}

cmd_datadir() {
    resolve "$1"
    printf '%s\n' "$CLUSTER"
}

main() {
    [ $# -ge 2 ] || usage
    local cmd=$1
    shift
    case "$cmd" in
        start) [ $# -le 2 ] || usage; cmd_start "$@" ;;
        stop) [ $# -eq 1 ] || usage; cmd_stop "$@" ;;
        status) [ $# -eq 1 ] || usage; cmd_status "$@" ;;
        conninfo) [ $# -le 2 ] || usage; cmd_conninfo "$@" ;;
        createdb) [ $# -eq 2 ] || usage; cmd_createdb "$@" ;;
        psql) cmd_psql "$@" ;;
        datadir) [ $# -eq 1 ] || usage; cmd_datadir "$@" ;;
        *) usage ;;
    esac
}

main "$@"
