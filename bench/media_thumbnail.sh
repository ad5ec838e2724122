#!/usr/bin/env bash
# Speed figure: one thumbnail of a 12-megapixel JPEG (4000x3000, photo-like) to 800x600
# WebP. Atrium's figure is the first request for the thumbnail (admission, token, row,
# render on the render pool, durable write, response) minus a cached request for it;
# beside it, libvips' own `vipsthumbnail` producing the same size from the same file
# (process start included). Medians of RUNS (default 7) runs; asserts nothing.
#
#   bench/media_thumbnail.sh
#
# See bench/lib.sh for ATRIUM_BIN and the database.
set -euo pipefail
# shellcheck source=bench/media_common.sh
. "$(dirname "${BASH_SOURCE[0]}")/media_common.sh"

runs=${RUNS:-7}
media_bench_start
token=$(media_bench_token)
photo=$work/photo.jpg
media_bench_photo "$photo"
media_id=$(media_bench_upload "$token" "$photo" image/jpeg)
thumb_url="$url/_matrix/client/v1/media/thumbnail/$SERVER_NAME/$media_id?width=800&height=600&method=scale"

fetch_seconds() {
    curl -fsS -o "$work/thumb.webp" -w '%{time_total}' -H "Authorization: Bearer $token" "$thumb_url"
}

first=()
cached=()
for _ in $(seq "$runs"); do
    rm -rf "$store/thumbnails" # the next request renders again
    first+=("$(fetch_seconds)")
    cached+=("$(fetch_seconds)")
done
dims=$(vipsheader "$work/thumb.webp" | sed 's/^[^:]*: //')

vips_runs=()
for _ in $(seq "$runs"); do
    start=$(date +%s.%N)
    vipsthumbnail "$photo" -s 800x600 -o "$work/vips.webp[Q=80]"
    vips_runs+=("$(awk -v s="$start" -v e="$(date +%s.%N)" 'BEGIN { print e - s }')")
done
vips_dims=$(vipsheader "$work/vips.webp" | sed 's/^[^:]*: //')

f=$(median "${first[@]}")
c=$(median "${cached[@]}")
v=$(median "${vips_runs[@]}")
echo "thumbnail of a 12 MP JPEG ($(stat -c %s "$photo") bytes) to 800x600 WebP, median of $runs"
printf '%-44s %8.1f ms\n' "atrium first request (render + serve)" "$(awk -v x="$f" 'BEGIN { print x * 1000 }')"
printf '%-44s %8.1f ms\n' "atrium cached request" "$(awk -v x="$c" 'BEGIN { print x * 1000 }')"
printf '%-44s %8.1f ms\n' "atrium render (first - cached)" "$(awk -v a="$f" -v b="$c" 'BEGIN { print (a - b) * 1000 }')"
printf '%-44s %8.1f ms\n' "vipsthumbnail (process, same size)" "$(awk -v x="$v" 'BEGIN { print x * 1000 }')"
echo "atrium output: $dims"
echo "vipsthumbnail output: $vips_dims"
