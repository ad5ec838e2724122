# shellcheck shell=bash
# What the media benchmarks share beyond bench/lib.sh: the media store in the run's
# temporary folder, a user with an access token, uploads, a 12-megapixel test photo and a
# median. Sourced by bench/media_*.sh; prints nothing itself.

# shellcheck source=bench/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

store=$work/media_store

# media_bench_start [ENV=VALUE...]: bench_start with registration on and the store above.
media_bench_start() {
    bench_start ATRIUM__REGISTRATION__ENABLED=true ATRIUM__PLUGINS__MEDIA__STORE_PATH="$store" "$@"
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
