#!/usr/bin/env bash
# Speed figure: authenticated download of a 100 KB and a 5 MB original under wrk (64
# connections, 2 threads, 10 s), side by side with nginx (Debian's nginx-light, started
# here on loopback with sendfile) serving the same bytes as a static file. Prints
# requests/s, throughput and the Atrium/nginx ratio; asserts nothing.
#
#   bench/media_download.sh
#
# Each Atrium request passes the delivery line, checks its token (in the token cache, else
# in PostgreSQL), reads the media row (in the row cache, plugins/media/rowcache.c, else in
# PostgreSQL) and sends the file with sendfile; nginx only sends
# the file. See
# bench/lib.sh for ATRIUM_BIN and the database. WRK_CONNECTIONS, WRK_THREADS and
# WRK_DURATION change the load.
set -euo pipefail
# shellcheck source=bench/media_common.sh
. "$(dirname "${BASH_SOURCE[0]}")/media_common.sh"

wrk_connections=${WRK_CONNECTIONS:-64}
wrk_threads=${WRK_THREADS:-2}
wrk_duration=${WRK_DURATION:-10s}

media_bench_start ATRIUM__PLUGINS__MEDIA__DELIVERY_SLOTS="$wrk_connections"
token=$(media_bench_token)

www=$work/www
mkdir -p "$www" "$work/nginx/logs"
head -c 102400 /dev/urandom >"$www/small.bin"
head -c 5242880 /dev/urandom >"$www/large.bin"
small_id=$(media_bench_upload "$token" "$www/small.bin" application/octet-stream)
large_id=$(media_bench_upload "$token" "$www/large.bin" application/octet-stream)
for pair in "small.bin:$small_id" "large.bin:$large_id"; do
    got=$(curl -fsS -H "Authorization: Bearer $token" \
        "$url/_matrix/client/v1/media/download/$SERVER_NAME/${pair#*:}" | sha256sum | cut -d' ' -f1)
    [ "$got" = "$(sha256sum <"$www/${pair%%:*}" | cut -d' ' -f1)" ] ||
        atrium_die "the download of ${pair%%:*} does not match its upload"
done

nginx_port=$(free_port)
cat >"$work/nginx/nginx.conf" <<EOF
worker_processes $(nproc);
pid $work/nginx/nginx.pid;
error_log $work/nginx/logs/error.log warn;
events { worker_connections 1024; }
http {
    access_log off;
    sendfile on;
    tcp_nopush on;
    default_type application/octet-stream;
    client_body_temp_path $work/nginx/tmp;
    server {
        listen 127.0.0.1:$nginx_port;
        root $www;
    }
}
EOF
nginx -c "$work/nginx/nginx.conf" -p "$work/nginx" -g 'daemon off;' 2>"$work/nginx/logs/stderr" &
nginx_pid=$!
extra_cleanup+=("kill $nginx_pid 2>/dev/null; wait $nginx_pid 2>/dev/null")
until curl -fsS -m 2 -o /dev/null "http://127.0.0.1:$nginx_port/small.bin" 2>/dev/null; do
    kill -0 "$nginx_pid" 2>/dev/null || { cat "$work/nginx/logs/"* >&2; atrium_die "nginx did not start"; }
    sleep 0.1
done

# run_wrk URL [HEADER]: prints "requests/s transfer/s non-2xx".
run_wrk() {
    local out
    if [ $# -gt 1 ]; then
        out=$(wrk -c"$wrk_connections" -t"$wrk_threads" -d"$wrk_duration" -H "$2" "$1")
    else
        out=$(wrk -c"$wrk_connections" -t"$wrk_threads" -d"$wrk_duration" "$1")
    fi
    echo "$(awk '/^Requests\/sec:/ { print $2 }' <<<"$out") $(awk '/^Transfer\/sec:/ { print $2 }' <<<"$out") $(awk '/Non-2xx or 3xx responses:/ { print $NF }' <<<"$out")"
}

echo "media download: Atrium (authenticated, delivery line, sendfile) vs nginx (static file)"
echo "load: wrk -c$wrk_connections -t$wrk_threads -d$wrk_duration on loopback ($(nproc) CPUs)"
printf '%-8s %14s %14s %14s %14s %8s\n' size "atrium req/s" "atrium MB/s" "nginx req/s" "nginx MB/s" ratio
for pair in "100KB:small.bin:$small_id" "5MB:large.bin:$large_id"; do
    IFS=: read -r label file id <<<"$pair"
    read -r a_rps a_tx a_bad <<<"$(run_wrk "$url/_matrix/client/v1/media/download/$SERVER_NAME/$id" \
        "Authorization: Bearer $token")"
    read -r n_rps n_tx n_bad <<<"$(run_wrk "http://127.0.0.1:$nginx_port/$file")"
    ratio=$(awk -v a="$a_rps" -v n="$n_rps" 'BEGIN { if (n > 0) printf "%.2f", a / n; else print "?" }')
    printf '%-8s %14s %14s %14s %14s %8s\n' "$label" "$a_rps" "$a_tx" "$n_rps" "$n_tx" "$ratio"
    [ -z "$a_bad" ] || echo "  atrium non-2xx: $a_bad"
    [ -z "$n_bad" ] || echo "  nginx non-2xx: $n_bad"
done
echo "atrium RSS after load: $(status_field "$server_pid" VmRSS), threads $(status_field "$server_pid" Threads)"
