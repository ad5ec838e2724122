#!/usr/bin/env bash
# Speed figures for media on an object store (plugins.media.storage: s3), against a
# throwaway RADOS Gateway started here (tests/lib/rgw.sh):
#
#  1. a cold 5 MB download: Atrium with the original only in the bucket (its local copy
#     removed before each run, so every run is a miss streamed from the store,
#     plugins/media/s3_stream.c) beside a GET of the same object straight from the
#     gateway (curl's own SigV4). Medians of RUNS (default 7) runs each, alternating; the
#     ratio is the gateway's total time over Atrium's (1.0: as fast as the store itself),
#     and time to first byte both ways;
#  2. THUMBNAILS (default 150) cold thumbnails (96x96 scale, 8 at a time) of distinct
#     640x480 PNGs whose originals are only in the bucket, beside as many others whose
#     originals are still in the
#     local folder, in the same server (both renders GET the thumbnail's key from the
#     bucket first and PUT it after: only the original's read-through differs).
#
#   bench/media_s3.sh
#   BASELINE_BIN=/path/to/other/build/core/atrium bench/media_s3.sh
#
# With BASELINE_BIN, a second Atrium of that build (its plugins from the folder beside its
# core/) runs on the same database, gateway and bucket with a local folder of its own, and
# the cold download is timed through both in the same loop (their order swapped each run,
# the direct GET between them): old and new builds side by side.
# Asserts nothing but that the bytes are right. See bench/lib.sh for ATRIUM_BIN and the
# database.
set -euo pipefail
# shellcheck source=bench/media_common.sh
. "$(dirname "${BASH_SOURCE[0]}")/media_common.sh"

runs=${RUNS:-7}
n=${THUMBNAILS:-150} # thumbnails per set
rgw=$root/tests/lib/rgw.sh
rgw_dir=$(mktemp -d /tmp/rgwb.XXXXXX)
stop_rgw() {
    bash "$rgw" stop "$rgw_dir" >/dev/null 2>&1 || true
    rm -rf "$rgw_dir"
}
extra_cleanup+=(stop_rgw)
bash "$rgw" packages >/dev/null
# shellcheck disable=SC2046
eval $(bash "$rgw" start "$rgw_dir" 2>/dev/null | grep -E '^[a-z_]+=')

s3_env=(ATRIUM__PLUGINS__MEDIA__STORAGE=s3
    ATRIUM__PLUGINS__MEDIA__S3_ENDPOINT="$endpoint" ATRIUM__PLUGINS__MEDIA__S3_REGION="$region"
    ATRIUM__PLUGINS__MEDIA__S3_BUCKET="$bucket" ATRIUM__PLUGINS__MEDIA__S3_PATH_STYLE=true
    ATRIUM__PLUGINS__MEDIA__S3_ACCESS_KEY_ID="$access_key"
    ATRIUM__PLUGINS__MEDIA__S3_SECRET_ACCESS_KEY="$secret_key")
media_bench_start "${s3_env[@]}"
token=$(media_bench_token)

local_file() { echo "${2:-$store}/local/${1:0:2}/${1:2:2}/$1"; }

# The baseline build beside the first: the same configuration file, its own port, plugins
# and local folder.
base_store=$work/media_store_baseline base_pid='' base_url=''
stop_baseline() { [ -z "$base_pid" ] || atrium_stop_pid "$base_pid" "$STOP_GRACE_S"; }
if [ -n "${BASELINE_BIN:-}" ]; then
    extra_cleanup+=(stop_baseline)
    base_port=$(free_port)
    env ATRIUM__SERVER__HTTP__PORT="$base_port" ATRIUM__RATELIMIT__ENABLED=false \
        ATRIUM__LOG__LEVEL=warn ATRIUM__PLUGIN_DIR="$(dirname "$(dirname "$BASELINE_BIN")")/plugins" \
        ATRIUM__REGISTRATION__ENABLED=true ATRIUM__PLUGINS__MEDIA__STORE_PATH="$base_store" \
        "${s3_env[@]}" "$BASELINE_BIN" --config "$work/homeserver.yaml" </dev/null \
        >"$work/baseline.log" 2>&1 &
    base_pid=$!
    base_url=http://127.0.0.1:$base_port
    deadline=$((SECONDS + HEALTH_TIMEOUT_S))
    until curl -fsS -m 2 -o /dev/null "$base_url/health" 2>/dev/null; do
        if ! kill -0 "$base_pid" 2>/dev/null || [ $SECONDS -ge $deadline ]; then
            cat "$work/baseline.log" >&2
            atrium_die "the baseline build did not start"
        fi
        sleep 0.1
    done
fi

# ---- 1. a cold 5 MB download --------------------------------------------------------------
head -c 5000000 /dev/urandom >"$work/large.bin"
want=$(sha256sum <"$work/large.bin" | cut -d' ' -f1)
large_id=$(media_bench_upload "$token" "$work/large.bin" application/octet-stream)
atrium_url="$url/_matrix/client/v1/media/download/$SERVER_NAME/$large_id"
direct_url="$endpoint/$bucket/originals/$large_id"

# prints "ttfb total" (seconds) and checks the bytes
timed_get() {
    local out
    out=$(curl -fsS -o "$work/got.bin" -w '%{time_starttransfer} %{time_total}' "$@")
    [ "$(sha256sum <"$work/got.bin" | cut -d' ' -f1)" = "$want" ] || atrium_die "wrong bytes from $*"
    echo "$out"
}

a_ttfb=() a_total=() d_ttfb=() d_total=() b_ttfb=() b_total=()
atrium_get() { # the cold download through ours (a) or the baseline build (b)
    local t1 t2
    if [ "$1" = a ]; then
        rm -f "$(local_file "$large_id")"
        read -r t1 t2 < <(timed_get -H "Authorization: Bearer $token" "$atrium_url")
        a_ttfb+=("$t1") a_total+=("$t2")
    else
        rm -f "$(local_file "$large_id" "$base_store")"
        read -r t1 t2 < <(timed_get -H "Authorization: Bearer $token" "${atrium_url/$url/$base_url}")
        b_ttfb+=("$t1") b_total+=("$t2")
    fi
}
for i in $(seq "$runs"); do
    first=a second=b
    [ $((i % 2)) = 0 ] && [ -n "$base_url" ] && first=b second=a
    atrium_get $first
    read -r t1 t2 < <(timed_get --aws-sigv4 "aws:amz:$region:s3" --user "$access_key:$secret_key" \
        -H 'x-amz-content-sha256: UNSIGNED-PAYLOAD' "$direct_url")
    d_ttfb+=("$t1") d_total+=("$t2")
    [ -z "$base_url" ] || atrium_get $second
done
dt=$(median "${d_total[@]}") df=$(median "${d_ttfb[@]}")
line() { # LABEL TOTAL_S FIRST_BYTE_S
    printf '  %-32s total %7.1f ms  first byte %6.1f ms  %7.1f MB/s\n' "$1" \
        "$(awk -v v="$2" 'BEGIN{print v*1000}')" "$(awk -v v="$3" 'BEGIN{print v*1000}')" \
        "$(awk -v v="$2" 'BEGIN{print 5/v}')"
}
printf '\ncold 5 MB download, medians of %d runs (load average %s):\n' "$runs" \
    "$(cut -d' ' -f1-3 /proc/loadavg)"
at=$(median "${a_total[@]}") af=$(median "${a_ttfb[@]}")
line "Atrium (miss, from the bucket)" "$at" "$af"
[ -z "$base_url" ] || line "Atrium, BASELINE_BIN" "$(median "${b_total[@]}")" "$(median "${b_ttfb[@]}")"
line "gateway GET, direct" "$dt" "$df"
printf '  ratio (direct time / Atrium time): %.2fx\n' "$(awk -v a="$at" -v d="$dt" 'BEGIN{print d/a}')"
[ -z "$base_url" ] || printf '  ratio, BASELINE_BIN: %.2fx\n' \
    "$(awk -v a="$(median "${b_total[@]}")" -v d="$dt" 'BEGIN{print d/a}')"

# ---- 2. 150 cold thumbnails -------------------------------------------------------------
atrium_say "making and uploading $((2 * n)) images"
python3 - "$work/img" "$((2 * n))" <<'EOF'
import os, struct, sys, zlib
out = sys.argv[1]
os.makedirs(out, exist_ok=True)
w, h = 640, 480
def chunk(kind, data):
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
base = bytes((x * 5) % 256 for x in range(w * 3))
for i in range(int(sys.argv[2])):
    first = os.urandom(w * 3)  # makes each image (and its thumbnail key) its own
    rows = b"\0" + first + (b"\0" + base) * (h - 1)
    png = (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0))
           + chunk(b"IDAT", zlib.compress(rows, 6)) + chunk(b"IEND", b""))
    with open(os.path.join(out, f"{i}.png"), "wb") as f:
        f.write(png)
EOF
upload_png() { media_bench_upload "$token" "$1" image/png; }
export -f media_bench_upload upload_png
export token url
printf '%s\n' "$work"/img/*.png | xargs -P 8 -I{} bash -c 'upload_png "$1"' _ {} >"$work/ids"
mapfile -t ids <"$work/ids"
[ ${#ids[@]} -eq $((2 * n)) ] || atrium_die "${#ids[@]} of $((2 * n)) uploads went through"
in_bucket=("${ids[@]:0:n}") local_set=("${ids[@]:n:n}")
for id in "${in_bucket[@]}"; do rm -f "$(local_file "$id")"; done

thumbs() { # ID...: wall seconds for their thumbnails, 8 at a time
    local start
    start=$(date +%s.%N)
    printf '%s\n' "$@" | xargs -P 8 -I{} curl -fsS -o /dev/null -H "Authorization: Bearer $token" \
        "$url/_matrix/client/v1/media/thumbnail/$SERVER_NAME/{}?width=96&height=96&method=scale"
    awk -v s="$start" -v e="$(date +%s.%N)" 'BEGIN { print e - s }'
}
atrium_say "thumbnails"
tl=$(thumbs "${local_set[@]}")
tb=$(thumbs "${in_bucket[@]}")
printf '\n%d cold thumbnails (96x96 scale, 8 at a time):\n' "$n"
printf '  %-32s %7.2f s  %6.1f thumbnails/s\n' "originals in the bucket only" "$tb" \
    "$(awk -v t="$tb" -v n="$n" 'BEGIN{print n/t}')"
printf '  %-32s %7.2f s  %6.1f thumbnails/s\n' "originals in the local folder" "$tl" \
    "$(awk -v t="$tl" -v n="$n" 'BEGIN{print n/t}')"
printf '  ratio (local / bucket time): %.2fx\n' "$(awk -v a="$tb" -v b="$tl" 'BEGIN{print b/a}')"
