#!/usr/bin/env bash
# Load figure: a gallery of 150, then 1000, distinct 12-megapixel JPEGs whose thumbnails
# (320x240 scale) are all requested at the same moment, one connection each. Prints wall
# time, the server's CPU time per thumbnail, how many arrived as WebP, and the server's
# peak RSS and peak open descriptors (sampled every 20 ms); asserts nothing. Beside each
# gallery, measured in the same run on the same files: the decode floor, `djpeg -scale 1/8`
# (libjpeg-turbo-progs) over the originals, one worker per CPU, to /dev/null, and Atrium's
# ratio to it in wall and in CPU time (docs/performance.md). Renders are bounded by render_threads (default:
# cores) and delivery by delivery_slots, so memory and descriptors should stay flat while
# wall time grows with the number of renders.
#
#   bench/media_gallery.sh            GALLERY_COUNTS=150,1000 by default
#
# The delivery line is widened for this run (one client asks for everything at once and
# the last renders finish long after the default 30 s wait): delivery_queue 4096,
# delivery_queue_per_client 4096, delivery_wait_ms 600000, render_wait_ms 600000.
# Needs about 1.6 GB of disk for 1000 copies. See bench/lib.sh for ATRIUM_BIN and
# the database.
set -euo pipefail
# shellcheck source=bench/media_common.sh
. "$(dirname "${BASH_SOURCE[0]}")/media_common.sh"

counts=${GALLERY_COUNTS:-150,1000}
media_bench_start ATRIUM__PLUGINS__MEDIA__DELIVERY_QUEUE=4096 \
    ATRIUM__PLUGINS__MEDIA__DELIVERY_QUEUE_PER_CLIENT=4096 \
    ATRIUM__PLUGINS__MEDIA__DELIVERY_WAIT_MS=600000 \
    ATRIUM__PLUGINS__MEDIA__RENDER_WAIT_MS=600000
token=$(media_bench_token)
photo=$work/photo.jpg
media_bench_photo "$photo"
echo "gallery of distinct 12 MP JPEGs, thumbnails 320x240 scale, all requested at once ($(nproc) CPUs)"
python3 "$root/bench/media_gallery.py" --port "${url##*:}" --token "$token" \
    --server-name "$SERVER_NAME" --photo "$photo" --pid "$server_pid" --store "$store" \
    --counts "$counts"
echo "server: RSS now $(status_field "$server_pid" VmRSS), peak since start $(status_field "$server_pid" VmHWM), threads $(status_field "$server_pid" Threads)"
