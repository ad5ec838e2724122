#!/usr/bin/env bash
# A throwaway S3 server for tests: a one-node Ceph cluster (one monitor, one OSD on the
# test-only `memstore` backend, so every object lives in the OSD's memory) and one RADOS
# Gateway (radosgw), all on 127.0.0.1, all kept in a directory you name.
#
#   rgw.sh start DIR    create and start the cluster and the gateway, a user with fixed
#                       keys and the bucket `atrium-media`; prints progress on stderr and,
#                       on stdout, the lines endpoint=, region=, bucket=, access_key=,
#                       secret_key= (also kept in DIR/s3.env)
#   rgw.sh stop DIR     stop the daemons started for DIR (TERM, KILL after 1 s) and delete DIR's
#                       data; succeeds when nothing runs
#   rgw.sh packages     install the Debian packages it needs (tests/lib/deps.sh)
#
# Nothing here is for production: authentication between the daemons is off and the
# objects vanish with the OSD. The ports are taken below the kernel's ephemeral range
# (32768-60999), where an outgoing connection cannot hold them: a block of 20 from 16100
# up, claimed with a lock directory under /tmp/atrium-rgw-ports so parallel test runs
# never share one. DIR should be short (the daemons' admin sockets live in DIR/run, and a
# socket path holds at most 107 bytes). Why each setting is there: docs/adr/0011-media-on-an-object-store.md.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=tests/lib/deps.sh
. "$here/deps.sh"

readonly PORT_LOCKS=/tmp/atrium-rgw-ports
readonly PORT_FIRST=16100 PORT_LAST=16980 PORT_BLOCK=20
readonly ACCESS_KEY=ATRIUMTESTACCESSKEY0
readonly SECRET_KEY=atrium-test-secret-key-not-for-production
readonly BUCKET=atrium-media
readonly REGION=us-east-1
readonly STEP_TIMEOUT_S=30

say() { printf '[rgw.sh] %s\n' "$*" >&2; }
die() { printf '[rgw.sh] ERROR: %s\n' "$*" >&2; exit 1; }

usage() {
    sed -n '/^#   rgw.sh/,/^#$/p' "${BASH_SOURCE[0]}" | sed -e '/^#$/d' -e 's/^#   /  /' >&2
    exit 2
}

# Claims a free block of ports; prints its first port. A block whose lock names a dead
# cluster's folder, or none for a minute, is taken over.
claim_ports() {
    mkdir -p "$PORT_LOCKS"
    local base lock owner
    for ((base = PORT_FIRST; base <= PORT_LAST; base += PORT_BLOCK)); do
        lock=$PORT_LOCKS/$base
        if ! mkdir "$lock" 2>/dev/null; then
            owner=$(cat "$lock/owner" 2>/dev/null || true)
            [ -n "$owner" ] && [ -d "$owner" ] && continue
            # No owner yet: another start made the lock a moment ago and writes it next
            # (taking it over then gave two clusters one block of ports).
            [ -z "$owner" ] && [ -n "$(find "$lock" -maxdepth 0 -newermt '-60 seconds' 2>/dev/null)" ] &&
                continue
            rm -rf "$lock"
            mkdir "$lock" 2>/dev/null || continue
        fi
        if ss -Htln "sport >= :$base and sport < :$((base + PORT_BLOCK))" 2>/dev/null | grep -q .; then
            rm -rf "$lock"
            continue
        fi
        printf '%s\n' "$1" >"$lock/owner"
        echo "$base"
        return 0
    done
    die "no free block of ports between $PORT_FIRST and $PORT_LAST"
}

write_conf() {
    local dir=$1 base=$2 fsid=$3
    cat >"$dir/ceph.conf" <<EOF
[global]
fsid = $fsid
mon host = v2:127.0.0.1:$base
mon initial members = a
public addr = 127.0.0.1
cluster addr = 127.0.0.1
ms bind msgr1 = false
ms bind ipv6 = false
ms bind port min = $((base + 1))
ms bind port max = $((base + 15))
auth cluster required = none
auth service required = none
auth client required = none
ms mon client mode = crc
ms client mode = crc
ms cluster mode = crc
ms service mode = crc
osd pool default size = 1
osd pool default min size = 1
mon allow pool size one = true
osd crush chooseleaf type = 0
mon warn on pool no redundancy = false
osd pool default pg num = 1
osd pool default pgp num = 1
osd pool default pg autoscale mode = off
rgw rados pool pg num min = 1
paxos propose interval = 0.05
mon data avail crit = 0
osd op num shards = 1
osd op num threads per shard = 2
osd objectstore = memstore
memstore device bytes = 1073741824
run dir = $dir/run
pid file = $dir/run/\$name.pid
admin socket = $dir/run/\$name.asok
log file = $dir/log/\$name.log
keyring = $dir/keyring
mon data = $dir/mon/\$id
osd data = $dir/osd/\$id

[client.rgw.a]
rgw frontends = beast endpoint=127.0.0.1:$((base + 19))
rgw data = $dir/rgw
rgw thread pool size = 32
EOF
}

# Waits (at most STEP_TIMEOUT_S) until the command succeeds.
wait_for() {
    local what=$1 deadline=$((SECONDS + STEP_TIMEOUT_S))
    shift
    until "$@" >/dev/null 2>&1; do
        [ "$SECONDS" -lt "$deadline" ] || die "$what did not happen within ${STEP_TIMEOUT_S}s (logs in the cluster directory's log/)"
        sleep 0.1
    done
}

osd_up() { ceph -c "$1/ceph.conf" osd dump 2>/dev/null | grep -q "^osd\\.$2 up"; }

s3_curl() {
    curl -sS --max-time 10 --aws-sigv4 "aws:amz:$REGION:s3" --user "$ACCESS_KEY:$SECRET_KEY" \
        -H 'x-amz-content-sha256: UNSIGNED-PAYLOAD' "$@"
}

start() {
    local dir=$1
    command -v radosgw >/dev/null 2>&1 || die "radosgw is not installed: run 'tests/lib/rgw.sh packages' (Debian: ${ATRIUM_S3_TEST_PACKAGES[*]})"
    [ -f "$dir/s3.env" ] && die "$dir already holds a cluster: stop it first"
    mkdir -p "$dir"
    dir=$(cd "$dir" && pwd)
    mkdir -p "$dir/run" "$dir/log" "$dir/mon/a" "$dir/rgw"
    local started=$SECONDS base fsid osd_uuid osd_id conf
    base=$(claim_ports "$dir")
    printf '%s\n' "$base" >"$dir/ports"
    fsid=$(cat /proc/sys/kernel/random/uuid)
    osd_uuid=$(cat /proc/sys/kernel/random/uuid)
    write_conf "$dir" "$base" "$fsid"
    conf=$dir/ceph.conf
    say "monitor on 127.0.0.1:$base, gateway on 127.0.0.1:$((base + 19)), data in $dir"
    # Anything failing from here stops what started and frees the ports.
    # shellcheck disable=SC2064 # expanded now on purpose: $dir is local to this function
    trap "stop '$dir'" ERR EXIT
    ceph-authtool "$dir/keyring" --create-keyring --gen-key -n mon. --cap mon 'allow *' >/dev/null
    ceph-authtool "$dir/keyring" --gen-key -n client.admin --cap mon 'allow *' \
        --cap osd 'allow *' --cap mgr 'allow *' >/dev/null
    monmaptool --create --fsid "$fsid" --add a "v2:127.0.0.1:$base" "$dir/monmap" >/dev/null
    ceph-mon -c "$conf" --mkfs -i a --monmap "$dir/monmap" --keyring "$dir/keyring" 2>>"$dir/log/start.log"
    ceph-mon -c "$conf" -i a 2>>"$dir/log/start.log"
    osd_id=$(timeout "$STEP_TIMEOUT_S" ceph -c "$conf" osd new "$osd_uuid" 2>>"$dir/log/start.log") ||
        die "the monitor did not answer (see $dir/log/)"
    mkdir -p "$dir/osd/$osd_id"
    ceph-osd -c "$conf" -i "$osd_id" --mkfs --osd-uuid "$osd_uuid" 2>>"$dir/log/start.log" >/dev/null
    ceph-osd -c "$conf" -i "$osd_id" 2>>"$dir/log/start.log"
    wait_for "the OSD coming up" osd_up "$dir" "$osd_id"
    # A wrong messenger or auth setting makes the gateway hang rather than fail.
    timeout "$STEP_TIMEOUT_S" radosgw -c "$conf" -n client.rgw.a 2>>"$dir/log/start.log" ||
        die "radosgw did not start (see $dir/log/)"
    local endpoint=http://127.0.0.1:$((base + 19))
    wait_for "the gateway answering HTTP" curl -s --max-time 2 -o /dev/null "$endpoint/"
    timeout "$STEP_TIMEOUT_S" radosgw-admin -c "$conf" user create --uid=atrium \
        --display-name=atrium --access-key="$ACCESS_KEY" --secret-key="$SECRET_KEY" \
        >/dev/null 2>>"$dir/log/start.log" || die "radosgw-admin could not create the user"
    local code
    code=$(s3_curl -o /dev/null -w '%{http_code}' -X PUT "$endpoint/$BUCKET") || code=000
    [ "$code" = 200 ] || die "creating bucket $BUCKET answered HTTP $code"
    {
        echo "endpoint=$endpoint"
        echo "region=$REGION"
        echo "bucket=$BUCKET"
        echo "access_key=$ACCESS_KEY"
        echo "secret_key=$SECRET_KEY"
    } >"$dir/s3.env"
    trap - ERR EXIT
    say "ready in $((SECONDS - started))s"
    cat "$dir/s3.env"
}

stop() {
    local dir=$1 pidfile pid waited
    [ -d "$dir" ] || return 0
    dir=$(cd "$dir" && pwd)
    # The gateway first, the monitor last (the others ask it on the way down).
    for pidfile in "$dir"/run/client.rgw.a.pid "$dir"/run/osd.*.pid "$dir"/run/mon.a.pid; do
        [ -f "$pidfile" ] || continue
        pid=$(cat "$pidfile")
        kill -TERM "$pid" 2>/dev/null || continue
        waited=0
        while kill -0 "$pid" 2>/dev/null && [ "$waited" -lt 10 ]; do
            sleep 0.1
            waited=$((waited + 1))
        done
        kill -KILL "$pid" 2>/dev/null || true
    done
    if [ -f "$dir/ports" ]; then
        rm -rf "${PORT_LOCKS:?}/$(cat "$dir/ports")"
    fi
    rm -rf "$dir/mon" "$dir/osd" "$dir/rgw" "$dir/run" "$dir/s3.env" "$dir/ports"
}

case "${1:-}" in
start) [ $# -eq 2 ] || usage; start "$2" ;;
stop) [ $# -eq 2 ] || usage; stop "$2" ;;
packages) atrium_need_packages "${ATRIUM_S3_TEST_PACKAGES[@]}" ;;
*) usage ;;
esac
