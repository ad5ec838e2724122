#!/usr/bin/env bash
# Speed figure: GET /_matrix/client/versions under wrk (64 connections, 2 threads, 10 s),
# with the server's idle memory and thread count measured before the load. Prints
# numbers, asserts nothing.
#
#   bench/versions.sh
#
# See bench/lib.sh for ATRIUM_BIN and the database.
# WRK_CONNECTIONS, WRK_THREADS and WRK_DURATION change the load.
set -euo pipefail

wrk_connections=${WRK_CONNECTIONS:-64}
wrk_threads=${WRK_THREADS:-2}
wrk_duration=${WRK_DURATION:-10s}

# shellcheck source=bench/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

bench_start
curl -fsS -m 5 -o /dev/null "$url/_matrix/client/versions" || atrium_die "/_matrix/client/versions does not answer 200"

sleep 1 # let start-up settle before measuring idle figures
idle_rss=$(status_field "$server_pid" VmRSS)
idle_threads=$(status_field "$server_pid" Threads)

wrk_out=$(wrk -c"$wrk_connections" -t"$wrk_threads" -d"$wrk_duration" --latency "$url/_matrix/client/versions")
loaded_rss=$(status_field "$server_pid" VmRSS)
loaded_threads=$(status_field "$server_pid" Threads)

rps=$(awk '/^Requests\/sec:/ { print $2 }' <<<"$wrk_out")
latency=$(awk '$1 == "Latency" { print $2 " avg, " $3 " stdev, " $4 " max"; exit }' <<<"$wrk_out")
p99=$(awk '$1 == "99%" { print $2; exit }' <<<"$wrk_out")
non2xx=$(awk '/Non-2xx or 3xx responses:/ { print $NF }' <<<"$wrk_out")
errors=$(grep -E '^ *Socket errors:' <<<"$wrk_out" | sed 's/^ *//' || true)

echo "$("$bin" --version 2>/dev/null | head -n 1): GET /_matrix/client/versions"
echo "load:            wrk -c$wrk_connections -t$wrk_threads -d$wrk_duration ($(nproc) CPUs)"
echo "requests/s:      ${rps:-?}"
echo "latency:         ${latency:-?}; p99 ${p99:-?}"
echo "non-2xx:         ${non2xx:-0}"
[ -z "$errors" ] || echo "wrk:             $errors"
echo "idle RSS:        $idle_rss"
echo "idle threads:    $idle_threads"
echo "RSS after load:  $loaded_rss"
echo "threads after:   $loaded_threads"
