#!/usr/bin/env bash
# Speed figure: authenticated download of a 100 KB and a 5 MB original under wrk (64
# connections, 2 threads, 10 s), side by side with nginx (Debian's nginx-light, started
# here on loopback with sendfile) serving the same bytes as a static file. Prints
# requests/s, throughput and the Atrium/nginx ratio; asserts nothing. With BENCH_ROUNDS=N
# (default 1) each size is measured N times, Atrium and nginx alternating, and the medians
# are printed with the ratio of the medians (each round's ratio too): on a shared machine
# one round can be far off. The "us" columns are the server's CPU time per request
# (microseconds, all its threads or processes), steadier than requests/s there.
#
#   bench/media_download.sh
#
# Each Atrium request passes the delivery line, checks its token (in the token cache, else
# in PostgreSQL), reads the media row (in the row cache, plugins/media/rowcache.c, else in
# PostgreSQL), takes the file's descriptor (the open-file cache, plugins/media/fdcache.c)
# and sends the file corked with sendfile; nginx only sends the file. See
# bench/lib.sh for ATRIUM_BIN and the database. WRK_CONNECTIONS, WRK_THREADS and
# WRK_DURATION change the load.
set -euo pipefail
# shellcheck source=bench/media_common.sh
. "$(dirname "${BASH_SOURCE[0]}")/media_common.sh"

wrk_connections=${WRK_CONNECTIONS:-64}
wrk_threads=${WRK_THREADS:-2}
wrk_duration=${WRK_DURATION:-10s}
rounds=${BENCH_ROUNDS:-1}

# Both servers are set to the machine alike: nginx gets a worker per CPU and Atrium a
# request thread per CPU (its request threads never wait on anything slow, so more
# threads than CPUs only add switches; the default of 4 on 2 CPUs cost about 20% more CPU
# per 100 KB request: docs/performance.md). BENCH_REQUEST_THREADS overrides it.
request_threads=${BENCH_REQUEST_THREADS:-$(nproc)}
media_bench_start ATRIUM__PLUGINS__MEDIA__DELIVERY_SLOTS="$wrk_connections" \
    ATRIUM__SERVER__HTTP__REQUEST_THREADS="$request_threads"
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

# cpu_ticks PID...: user + system clock ticks the processes used so far (all threads).
cpu_ticks() {
    local pid total=0
    for pid in "$@"; do
        total=$((total + $(sed 's/^.*) //' "/proc/$pid/stat" | awk '{ print $12 + $13 }')))
    done
    echo "$total"
}
clk_tck=$(getconf CLK_TCK)

# run_wrk URL HEADER PID...: prints "requests/s transfer/s cpu-us-per-request non-2xx", the
# CPU being what the PIDs (the server's processes) used per request during the run: on a
# shared machine it moves less than requests/s do.
run_wrk() {
    local url=$1 header=$2 out before after
    shift 2
    before=$(cpu_ticks "$@")
    if [ -n "$header" ]; then
        out=$(wrk -c"$wrk_connections" -t"$wrk_threads" -d"$wrk_duration" -H "$header" "$url")
    else
        out=$(wrk -c"$wrk_connections" -t"$wrk_threads" -d"$wrk_duration" "$url")
    fi
    after=$(cpu_ticks "$@")
    local n
    n=$(awk '/ requests in / { print $1 }' <<<"$out")
    echo "$(awk '/^Requests\/sec:/ { print $2 }' <<<"$out") $(awk '/^Transfer\/sec:/ { print $2 }' <<<"$out") $(awk -v t=$((after - before)) -v hz="$clk_tck" -v n="${n:-0}" 'BEGIN { if (n > 0) printf "%.1f", t * 1e6 / hz / n; else print "?" }') $(awk '/Non-2xx or 3xx responses:/ { print $NF }' <<<"$out")"
}

echo "media download: Atrium (authenticated, delivery line, sendfile) vs nginx (static file)"
echo "load: wrk -c$wrk_connections -t$wrk_threads -d$wrk_duration on loopback ($(nproc) CPUs), $rounds round(s); Atrium $request_threads request threads, nginx $(nproc) workers"
printf '%-8s %14s %14s %10s %14s %14s %10s %8s\n' size "atrium req/s" "atrium MB/s" "atrium us" \
    "nginx req/s" "nginx MB/s" "nginx us" ratio
for pair in "100KB:small.bin:$small_id" "5MB:large.bin:$large_id"; do
    IFS=: read -r label file id <<<"$pair"
    a_all=() n_all=() ratios=() a_cpu=() n_cpu=()
    for ((round = 1; round <= rounds; round++)); do
        read -r a_rps a_tx a_us a_bad <<<"$(run_wrk "$url/_matrix/client/v1/media/download/$SERVER_NAME/$id" \
            "Authorization: Bearer $token" "$server_pid")"
        # shellcheck disable=SC2046 # the workers' PIDs, one word each
        read -r n_rps n_tx n_us n_bad <<<"$(run_wrk "http://127.0.0.1:$nginx_port/$file" "" \
            "$nginx_pid" $(pgrep -P "$nginx_pid"))"
        ratio=$(awk -v a="$a_rps" -v n="$n_rps" 'BEGIN { if (n > 0) printf "%.2f", a / n; else print "?" }')
        [ "$rounds" -eq 1 ] || label_r="$label#$round"
        printf '%-8s %14s %14s %10s %14s %14s %10s %8s\n' "${label_r:-$label}" "$a_rps" "$a_tx" \
            "$a_us" "$n_rps" "$n_tx" "$n_us" "$ratio"
        [ -z "$a_bad" ] || echo "  atrium non-2xx: $a_bad"
        [ -z "$n_bad" ] || echo "  nginx non-2xx: $n_bad"
        a_all+=("$a_rps") n_all+=("$n_rps") ratios+=("$ratio") a_cpu+=("$a_us") n_cpu+=("$n_us")
    done
    if [ "$rounds" -gt 1 ]; then
        a_med=$(median "${a_all[@]}") n_med=$(median "${n_all[@]}")
        printf '%-8s %14s %14s %10s %14s %14s %10s %8s\n' "$label" "$a_med" "(median)" \
            "$(median "${a_cpu[@]}")" "$n_med" "(median)" "$(median "${n_cpu[@]}")" \
            "$(awk -v a="$a_med" -v n="$n_med" 'BEGIN { if (n > 0) printf "%.2f", a / n; else print "?" }')"
        echo "  $label ratio per round: ${ratios[*]} (median $(median "${ratios[@]}"))"
    fi
done
echo "atrium RSS after load: $(status_field "$server_pid" VmRSS), threads $(status_field "$server_pid" Threads)"
