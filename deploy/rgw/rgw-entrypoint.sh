#!/usr/bin/env bash
# Entrypoint of the throwaway S3 service (deploy/rgw/Dockerfile): starts a one-node Ceph
# cluster on the `memstore` backend and the RADOS Gateway in the foreground, makes the S3
# user and the bucket, then waits; SIGTERM stops the three daemons. The settings are
# those of tests/lib/rgw.sh (why each is there: docs/adr/0011-media-on-an-object-store.md),
# with the gateway on 0.0.0.0:8000 for the other containers and fixed ports inside.
#
# Environment: ATRIUM_S3_ACCESS_KEY (default atrium), ATRIUM_S3_SECRET_KEY (required),
# ATRIUM_S3_BUCKET (default atrium-media), ATRIUM_S3_MEMORY_BYTES (what the OSD may hold
# in memory, default 1 GiB). The healthcheck passes once $dir/ready exists.
set -euo pipefail

dir=/var/lib/atrium-s3
access_key=${ATRIUM_S3_ACCESS_KEY:-atrium}
secret_key=${ATRIUM_S3_SECRET_KEY:-}
bucket=${ATRIUM_S3_BUCKET:-atrium-media}
memory_bytes=${ATRIUM_S3_MEMORY_BYTES:-1073741824}
readonly mon_port=16789 gateway_port=8000 step_timeout_s=60

say() { printf 'rgw-entrypoint: %s\n' "$*" >&2; }
die() {
    say "ERROR: $*"
    tail -n 20 "$dir"/log/*.log >&2 2>/dev/null || true
    exit 1
}

[ -n "$secret_key" ] || die "set ATRIUM_S3_SECRET_KEY to the S3 secret key the gateway's user gets"

pids=()
stop_all() {
    local pid
    # The gateway first, the monitor last (the others ask it on the way down).
    for ((i = ${#pids[@]} - 1; i >= 0; i--)); do kill -TERM "${pids[i]}" 2>/dev/null || true; done
    for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
}
trap 'stop_all; exit 0' TERM INT

wait_for() {
    local what=$1 deadline=$((SECONDS + step_timeout_s))
    shift
    until "$@" >/dev/null 2>&1; do
        [ "$SECONDS" -lt "$deadline" ] || die "$what did not happen within ${step_timeout_s}s"
        sleep 0.2
    done
}

# Nothing survives a restart (the OSD kept everything in memory): start from nothing.
rm -rf "${dir:?}"/*
mkdir -p "$dir/run" "$dir/log" "$dir/mon/a" "$dir/rgw"
fsid=$(cat /proc/sys/kernel/random/uuid)
osd_uuid=$(cat /proc/sys/kernel/random/uuid)
conf=$dir/ceph.conf
cat >"$conf" <<EOF
[global]
fsid = $fsid
mon host = v2:127.0.0.1:$mon_port
mon initial members = a
public addr = 127.0.0.1
cluster addr = 127.0.0.1
ms bind msgr1 = false
ms bind ipv6 = false
ms bind port min = 16800
ms bind port max = 16815
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
memstore device bytes = $memory_bytes
run dir = $dir/run
pid file = $dir/run/\$name.pid
admin socket = $dir/run/\$name.asok
log file = $dir/log/\$name.log
keyring = $dir/keyring
mon data = $dir/mon/\$id
osd data = $dir/osd/\$id

[client.rgw.a]
rgw frontends = beast endpoint=0.0.0.0:$gateway_port
rgw data = $dir/rgw
rgw thread pool size = 32
EOF

started=$SECONDS
ceph-authtool "$dir/keyring" --create-keyring --gen-key -n mon. --cap mon 'allow *' >/dev/null
ceph-authtool "$dir/keyring" --gen-key -n client.admin --cap mon 'allow *' \
    --cap osd 'allow *' --cap mgr 'allow *' >/dev/null
monmaptool --create --fsid "$fsid" --add a "v2:127.0.0.1:$mon_port" "$dir/monmap" >/dev/null
ceph-mon -c "$conf" --mkfs -i a --monmap "$dir/monmap" --keyring "$dir/keyring"
ceph-mon -c "$conf" -i a -f &
pids+=($!)
osd_id=$(timeout "$step_timeout_s" ceph -c "$conf" osd new "$osd_uuid") || die "the monitor did not answer"
mkdir -p "$dir/osd/$osd_id"
ceph-osd -c "$conf" -i "$osd_id" --mkfs --osd-uuid "$osd_uuid" >/dev/null
ceph-osd -c "$conf" -i "$osd_id" -f &
pids+=($!)
# shellcheck disable=SC2317 # called through wait_for
osd_up() { ceph -c "$conf" osd dump | grep -q "^osd\\.$osd_id up"; }
wait_for "the OSD coming up" osd_up
radosgw -c "$conf" -n client.rgw.a -f &
pids+=($!)
endpoint=http://127.0.0.1:$gateway_port
wait_for "the gateway answering HTTP" curl -s --max-time 2 -o /dev/null "$endpoint/"
timeout "$step_timeout_s" radosgw-admin -c "$conf" user create --uid=atrium --display-name=atrium \
    --access-key="$access_key" --secret-key="$secret_key" >/dev/null ||
    die "radosgw-admin could not create the user"
# curl signs with SigV4; the gateway wants the payload hash header as well.
code=$(curl -sS --max-time 10 --aws-sigv4 "aws:amz:us-east-1:s3" --user "$access_key:$secret_key" \
    -H 'x-amz-content-sha256: UNSIGNED-PAYLOAD' -o /dev/null -w '%{http_code}' \
    -X PUT "$endpoint/$bucket") || code=000
[ "$code" = 200 ] || die "creating bucket $bucket answered HTTP $code"
touch "$dir/ready"
say "bucket $bucket ready on port $gateway_port after $((SECONDS - started))s (memstore: nothing survives a restart)"

# Any daemon exiting ends the container (Compose's restart policy starts it afresh).
set +e
wait -n "${pids[@]}"
rc=$?
say "a Ceph daemon exited ($rc); stopping"
stop_all
exit 1
