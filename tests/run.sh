#!/usr/bin/env bash
# THE test command: everything the suite needs, from a fresh Debian 12 machine to a verdict.
#
#   tests/run.sh [CTEST ARGS...]      e.g. tests/run.sh -L unit, tests/run.sh -R media
#
# 1. installs the missing build, runtime and test packages (tests/lib/deps.sh);
# 2. configures and builds build-asan/ (ASan + UBSan), then build/ (RelWithDebInfo),
#    build-tsan/ (ThreadSanitizer) and build-fuzz/ (clang) in the background, at the
#    lowest priority, while the ASan tree's tests run;
# 3. starts one private PostgreSQL cluster for the whole run on a free port
#    (tests/lib/pg.sh), in memory (/dev/shm/atrium-test-pg-<hash of the checkout>, removed
#    at the end, its log kept as build/test-pg.log) when /dev/shm is a tmpfs with room,
#    else in build/test-pg, and exports ATRIUM_TEST_PG_CONNINFO (no dbname: every test
#    creates its own database) and ATRIUM_TEST_PG_DIR;
# 4. runs every test not labelled "plain" (unit, integration, conformance, end-to-end)
#    once, in build-asan/, with leak detection on and any sanitizer report fatal; then, in
#    build/, the unit tests again while the libFuzzer targets (tests/fuzz, label "fuzz")
#    run in build-fuzz/ (clang), each for ATRIUM_FUZZ_SECONDS seconds (default 4) from its
#    seed corpus; then, alone, the tests labelled "plain" (those whose bounds a sanitizer
#    or a busy CPU would distort: tests/integration/CMakeLists.txt); then the tests
#    labelled "tsan" (the runtime mechanisms, plugins, media delivery: tests/CMakeLists.txt)
#    in build-tsan/ with any data race fatal (library internals suppressed by
#    tests/tsan.supp), passing CTEST ARGS to every tree but the fuzzing one;
# 5. stops PostgreSQL (also on failure or Ctrl-C), prints a summary with each tree's time,
#    each step's time and how busy the CPUs were meanwhile,
#    the ten slowest tests and the server starts per tree, and exits non-zero if anything
#    failed.
# Why the integration tests run once, under the sanitizers: docs/adr/0007-tests-run-once-under-asan.md.
# CI (.ci/run) runs exactly this. A second run reuses the builds (and the cluster when it
# is in build/test-pg).
#
# Developer knobs (CI sets none): ATRIUM_TEST_SKIP_ASAN=1 skips both sanitizer trees and
# runs every test in build/ instead, ATRIUM_TEST_SKIP_TSAN=1 only the ThreadSanitizer
# one, ATRIUM_TEST_SKIP_FUZZ=1 the fuzzing tree, ATRIUM_FUZZ_SECONDS=N runs each fuzz target N seconds (default 4),
# ATRIUM_JOBS=N sets build parallelism (default: number of CPUs), ATRIUM_TEST_DEPLOY=1 also
# runs the deploy test (label deploy, podman) at the end.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
# shellcheck source=tests/lib/deps.sh
. tests/lib/deps.sh

readonly PG_SH=$root/tests/lib/pg.sh
# Each test creates its database from a migrated template and drops it after: about 600
# files copied and unlinked each time, some 400 times a run. On this VM's ext4 a create
# and drop cost about 200 ms of wall time and more of CPU (inode allocation in the
# kernel, and the checkpoint FILE_COPY makes), on tmpfs about 35 ms: so the run's cluster
# lives in memory when it can (a throwaway one, ATRIUM_PG_FAST; a few hundred MB).
readonly PG_MEM_MIN_FREE_KB=$((4 * 1024 * 1024))
pg_dir_for_run() {
    local shm=/dev/shm
    if [ "$(stat -f -c %T "$shm" 2>/dev/null)" = tmpfs ] &&
        [ "$(df -Pk "$shm" | awk 'NR == 2 {print $4}')" -ge "$PG_MEM_MIN_FREE_KB" ]; then
        printf '%s/atrium-test-pg-%s\n' "$shm" "$(printf '%s' "$root" | sha256sum | cut -c1-16)"
    else
        printf '%s\n' "$root/build/test-pg"
    fi
}
PG_DIR=$(pg_dir_for_run)
readonly PG_DIR
# Tests run side by side: the integration tests spend most of their time waiting on
# sockets, timers and other servers (a test keeps about a third of one CPU busy under
# ASan), so four at a time fill the 2 CPUs (docs/adr/0007-tests-run-once-under-asan.md).
readonly CTEST_JOBS=2         # build/: the unit tests, beside the fuzzers (-j2 as well)
readonly CTEST_JOBS_ASAN=4
readonly CTEST_JOBS_TSAN=3
readonly CTEST_DEFAULT_TIMEOUT_S=600   # for tests that set no TIMEOUT of their own
build_jobs=${ATRIUM_JOBS:-$(nproc)}

started=$(date +%s)
stage="setup"
pg_started=0
summary=()
step_marks=()
step_cpu=()
ctest_logs=()
declare -A tmp_emptied=()
build_times_file=$(mktemp)
others_pid=
fuzz_pid=
failed=0
total_passed=0
total_failed=0

# Bold, green and red only on a terminal; CI logs get plain text.
if [ -t 1 ]; then
    bold=$'\033[1m' green=$'\033[32m' red=$'\033[31m' plain=$'\033[0m'
else
    bold='' green='' red='' plain=''
fi

# step TEXT: a heading with the time since the start, so a slow CI log shows which step
# took the time.
step() {
    stage=$*
    local t=$(($(date +%s) - started))
    step_marks+=("$t $*")
    step_cpu+=("$(cpu_jiffies)")
    printf '\n%s==> [%dm%02ds] %s%s\n' "$bold" $((t / 60)) $((t % 60)) "$*" "$plain"
}

on_exit() {
    local rc=$?
    local pid
    for pid in $others_pid $fuzz_pid; do
        kill_tree "$pid"
        wait "$pid" 2>/dev/null || true
    done
    if [ "$pg_started" = 1 ]; then
        "$PG_SH" stop "$PG_DIR" >&2 || atrium_say "could not stop the test PostgreSQL in $PG_DIR"
        if [ "$PG_DIR" != "$root/build/test-pg" ] && ! "$PG_SH" status "$PG_DIR" 2>/dev/null; then
            cp "$PG_DIR/postgres.log" "$root/build/test-pg.log" 2>/dev/null || true
            rm -rf -- "$PG_DIR"
        fi
    fi
    local elapsed=$(($(date +%s) - started))
    printf '\n%s========== Atrium test summary (%dm%02ds) ==========%s\n' \
        "$bold" $((elapsed / 60)) $((elapsed % 60)) "$plain"
    local line
    for line in "${summary[@]}"; do printf '%s\n' "$line"; done
    [ ! -s "$build_times_file" ] || printf 'builds: %s\n' "$(paste -sd ' ' "$build_times_file")"
    if [ -n "${CMAKE_C_COMPILER_LAUNCHER:-}" ]; then
        printf 'ccache: %s\n' "$(ccache --print-stats 2>/dev/null |
            awk -F'\t' '$1 ~ /^(direct_cache_hit|preprocessed_cache_hit|cache_miss)$/ {printf "%s=%s ", $1, $2}')"
    fi
    rm -f "$build_times_file"
    step_times "$elapsed"
    slowest_tests
    server_starts
    if [ "$rc" -eq 0 ] && [ "$failed" -eq 0 ]; then
        printf '%sRESULT: PASSED%s\n' "$green" "$plain"
    else
        if [ ${#summary[@]} -eq 0 ] || [ "$failed" -eq 0 ]; then
            printf 'stopped during: %s\n' "$stage"
        fi
        printf '%sRESULT: FAILED%s\n' "$red" "$plain"
        [ "$rc" -ne 0 ] || rc=1
    fi
    # Both trees together, as the last line.
    printf 'tests: %d passed, %d failed\n' "$total_passed" "$total_failed"
    exit "$rc"
}
trap on_exit EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# kill_tree PID: SIGTERM to PID and everything under it (an interrupted background build).
kill_tree() {
    local child
    for child in $(pgrep -P "$1" || true); do kill_tree "$child"; done
    kill "$1" 2>/dev/null || true
}

# cpu_jiffies: "BUSY TOTAL", the whole machine's CPU time so far from /proc/stat (idle and
# iowait are not busy), so the summary can say how busy the CPUs were during each step.
cpu_jiffies() {
    awk '/^cpu / {t = 0; for (i = 2; i <= 9; i++) t += $i; print t - $5 - $6, t; exit}' \
        /proc/stat 2>/dev/null || echo "0 0"
}

# step_times END: how long each step took and how busy the machine's CPUs were meanwhile
# (anything else running on the machine counts too; a step at 100% is bound by CPU, so
# running more at once cannot shorten it), one line per step, from the marks step() left.
step_times() {
    local i t next name busy total next_busy next_total pct=0
    [ ${#step_marks[@]} -gt 0 ] || return 0
    printf 'steps (wall, CPUs busy):\n'
    step_cpu+=("$(cpu_jiffies)")
    for i in "${!step_marks[@]}"; do
        t=${step_marks[$i]%% *}
        name=${step_marks[$i]#* }
        next=$1
        [ $((i + 1)) -ge ${#step_marks[@]} ] || next=${step_marks[$((i + 1))]%% *}
        read -r busy total <<<"${step_cpu[$i]}"
        read -r next_busy next_total <<<"${step_cpu[$((i + 1))]}"
        pct=0
        [ "$next_total" -le "$total" ] || pct=$((100 * (next_busy - busy) / (next_total - total)))
        printf '    %4ds %3d%%  %s\n' $((next - t)) "$pct" "$name"
    done
}

# slowest_tests: the ten longest tests of the trees run so far, from ctest's own lines
# ("  3/90 Test  #12: integration.test_x ......   Passed   41.20 sec").
slowest_tests() {
    [ ${#ctest_logs[@]} -gt 0 ] || return 0
    printf 'slowest tests:\n'
    local log
    for log in "${ctest_logs[@]}"; do
        sed -nE "s|^ *[0-9]+/[0-9]+ Test +#[0-9]+: ([^ ]+) .* ([0-9.]+) sec$|\2 \1 ${log%%/*}|p" "$log"
    done | sort -rn | awk 'NR <= 10 {printf "    %7.1f s  %s (%s)\n", $1, $2, $3}'
}

# server_starts: how many atrium processes each tree's integration tests started, and the
# five test files that started most (tests/integration/harness.py notes each start).
server_starts() {
    local dir log
    for dir in build-asan build build-tsan; do
        log=$root/$dir/test-tmp/server-starts.log
        [ -s "$log" ] || continue
        printf 'server starts in %s: %d (most: %s)\n' "$dir" "$(wc -l <"$log")" \
            "$(sort "$log" | uniq -c | sort -rn | head -n 5 | awk '{printf "%s%s %d", (NR > 1 ? ", " : ""), $2, $1}')"
    done
}

# timed_build DIR [ARGS...]: builds a tree and notes how long that took for the summary.
timed_build() {
    local dir=$1 t0
    t0=$(date +%s)
    cmake --build "$@"
    echo "$dir/ $(($(date +%s) - t0))s" >>"$build_times_file"
}

# selected DIR CTEST ARGS: how many tests those arguments select in DIR.
selected() {
    local dir=$1
    shift
    ctest --test-dir "$dir" -N "$@" | grep -cE '^ *Test +#' || true
}

# ctest_jobs DIR: how many tests of that tree run side by side.
ctest_jobs() {
    case $1 in
        build-asan) echo "$CTEST_JOBS_ASAN" ;;
        build-tsan) echo "$CTEST_JOBS_TSAN" ;;
        *) echo "$CTEST_JOBS" ;;
    esac
}

# start_ctest DIR LOG [ENV=VALUE...] -- CTEST ARGS: runs one tree's ctest into LOG (and the
# terminal), leaving its exit status in LOG.rc; returns 1 when the arguments select none
# of that tree's tests (nothing is run then).
start_ctest() {
    local dir=$1 log=$2
    shift 2
    local env=()
    while [ $# -gt 0 ] && [ "$1" != -- ]; do env+=("$1"); shift; done
    shift
    [ "$(selected "$dir" "$@")" -gt 0 ] || return 1
    mkdir -p "$dir/Testing"
    # Where the harness puts each server's config and log (kept there when a test fails),
    # emptied before a tree's first run.
    [ -n "${tmp_emptied[$dir]:-}" ] || rm -rf "$dir/test-tmp"
    tmp_emptied[$dir]=1
    env+=("ATRIUM_TEST_TMPDIR=$root/$dir/test-tmp")
    set +e
    env "${env[@]}" ctest --test-dir "$dir" --output-on-failure -j"$(ctest_jobs "$dir")" \
        --timeout "$CTEST_DEFAULT_TIMEOUT_S" --no-tests=error \
        --output-junit "$root/${log%.log}.junit.xml" "$@" 2>&1 | tee "$log"
    echo "${PIPESTATUS[0]}" >"$log.rc"
    set -e
}

# record_ctest DIR LABEL LOG SECONDS: adds the verdict of a ctest run start_ctest made to
# the summary and the totals.
record_ctest() {
    local dir=$1 label=$2 log=$3 rc verdict
    label="$label ${4}s"
    rc=$(cat "$log.rc" 2>/dev/null || echo 1)
    verdict=$(grep -E '^[0-9]+% tests passed' "$log" | tail -n 1 || true)
    ctest_logs+=("$log")
    if [[ $verdict =~ ([0-9]+)\ tests?\ failed\ out\ of\ ([0-9]+) ]]; then
        total_failed=$((total_failed + BASH_REMATCH[1]))
        total_passed=$((total_passed + BASH_REMATCH[2] - BASH_REMATCH[1]))
    else
        verdict="ctest exited with $rc (see $log)"
    fi
    if [ "$rc" -eq 0 ]; then
        summary+=("$(printf '%-28s PASSED  %s' "$label" "$verdict")")
    else
        failed=1
        summary+=("$(printf '%-28s FAILED  %s' "$label" "$verdict")")
        while read -r line; do summary+=("    $line"); done \
            < <(sed -n '/^The following tests FAILED:/,/^[^ \t]/{/^[ \t]/p}' "$log")
    fi
    # Tests that skipped themselves say why ("SKIPPED: ..."): the summary repeats it, so a
    # run without, say, the Synapse peer says so at the end.
    local skipped
    while read -r skipped; do summary+=("    ${skipped/SKIPPED: /skipped: }"); done \
        < <(grep -ho "SKIPPED: [^'\"]*" "$dir/Testing/Temporary/LastTest.log" 2>/dev/null | sort -u)
}

# run_ctest DIR LABEL [LOG NAME] [ENV=VALUE...] -- CTEST ARGS: runs the suite of one tree
# and adds its verdict to the summary.
run_ctest() {
    local dir=$1 label=$2 name=atrium-run t0
    shift 2
    case ${1:-} in *=* | --) ;; *) name=$1; shift ;; esac
    local log=$dir/Testing/$name.log
    t0=$(date +%s)
    rm -f "$log.rc"
    if ! start_ctest "$dir" "$log" "$@"; then # a filter that picks none of this tree's tests
        summary+=("$(printf '%-28s none selected' "$label")")
        return 0
    fi
    record_ctest "$dir" "$label" "$log" $(($(date +%s) - t0))
}

# The fuzzers run with the whole suite, not with a ctest filter (tests/run.sh -R media has
# nothing to fuzz). One target alone: ctest --test-dir build-fuzz -R fuzz.router.
fuzz_enabled() {
    [ "${ATRIUM_TEST_SKIP_FUZZ:-0}" != 1 ] && [ $# -eq 0 ]
}

tsan_enabled() {
    [ "${ATRIUM_TEST_SKIP_ASAN:-0}" != 1 ] && [ "${ATRIUM_TEST_SKIP_TSAN:-0}" != 1 ]
}

step "Debian packages"
atrium_need_packages "${ATRIUM_BUILD_PACKAGES[@]}" "${ATRIUM_RUNTIME_PACKAGES[@]}" "${ATRIUM_TEST_PACKAGES[@]}"
# The S3 tests' throwaway Ceph cluster (tests/lib/rgw.sh): where the packages cannot be
# installed the run goes on and tests/integration/test_media_s3.py skips, saying why.
(atrium_need_packages "${ATRIUM_S3_TEST_PACKAGES[@]}") ||
    atrium_say "the Ceph packages could not be installed: test_media_s3 will be skipped"

# The federation interop tests use a real Synapse when shared/peers/synapse/ lies beside
# the repository (CI lays it there); they skip, saying so, when it does not.
synapse_peer=${ATRIUM_SYNAPSE_PEER_SH:-$(dirname "$root")/shared/peers/synapse/peer.sh}
if [ -f "$synapse_peer" ]; then
    step "Synapse test peer ($synapse_peer)"
    bash "$synapse_peer" install >&2 || atrium_die "could not install the Synapse test peer"
    # Installed once here, so the test classes skip their own `peer.sh install` (it checks
    # 33 Debian packages and hashes the bundle: about 2 CPU-seconds a class).
    export ATRIUM_SYNAPSE_PEER_SH=$synapse_peer ATRIUM_SYNAPSE_PEER_INSTALLED=1
fi

step "npm packages for the end-to-end tests (tests/e2e, matrix-js-sdk)"
# The machines come with Node.js 20; a machine without node gets Debian's.
command -v node >/dev/null 2>&1 || atrium_need_packages nodejs npm
# A clean clone has no node_modules: `npm ci` takes a minute or more of a run (most of it
# unpacking), so its result is kept per package-lock.json in the user's cache and copied
# into the next clone on this machine.
e2e_stamp=tests/e2e/node_modules/.atrium-lock
e2e_cache=${XDG_CACHE_HOME:-$HOME/.cache}/atrium/e2e-node_modules-$(sha256sum tests/e2e/package-lock.json | cut -c1-16)
if ! cmp -s tests/e2e/package-lock.json "$e2e_stamp" 2>/dev/null; then
    rm -rf tests/e2e/node_modules
    if cmp -s tests/e2e/package-lock.json "$e2e_cache/.atrium-lock" 2>/dev/null &&
        cp -a "$e2e_cache" tests/e2e/node_modules; then
        atrium_say "tests/e2e/node_modules copied from $e2e_cache"
    else
        rm -rf tests/e2e/node_modules
        npm ci --prefix tests/e2e --no-audit --no-fund --loglevel=error
        cp tests/e2e/package-lock.json "$e2e_stamp"
        # Best effort: a copy that cannot be kept only costs the next clone its npm ci.
        { mkdir -p "$(dirname "$e2e_cache")" && rm -rf "$e2e_cache.tmp" "$e2e_cache" &&
            cp -a tests/e2e/node_modules "$e2e_cache.tmp" && mv "$e2e_cache.tmp" "$e2e_cache"; } ||
            rm -rf "$e2e_cache.tmp"
    fi
fi

# The four trees compile through ccache: a run on a machine that has run the suite before
# (a second clone, CI after a developer's run) recompiles only the files that changed.
# Paths are taken relative to the clone, so clones in different folders share the cache;
# it lives in ccache's default folder (~/.cache/ccache) unless CCACHE_DIR says otherwise.
if command -v ccache >/dev/null 2>&1; then
    export CMAKE_C_COMPILER_LAUNCHER=ccache CCACHE_BASEDIR=$root CCACHE_NOHASHDIR=1
    ccache --zero-stats >/dev/null 2>&1 || true
fi

build_plain() {
    atrium_configure_tree "$root" build -DCMAKE_BUILD_TYPE=RelWithDebInfo -DATRIUM_SANITIZE=OFF
    timed_build build -j"$build_jobs"
}
build_tsan() {
    atrium_configure_tree "$root" build-tsan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DATRIUM_SANITIZE=thread
    timed_build build-tsan -j"$build_jobs"
}
build_fuzz() {
    atrium_configure_tree "$root" build-fuzz -DCMAKE_BUILD_TYPE=RelWithDebInfo \
        -DCMAKE_C_COMPILER=clang -DATRIUM_FUZZ=ON
    timed_build build-fuzz -j"$build_jobs" --target fuzz_all
}

if [ "${ATRIUM_TEST_SKIP_ASAN:-0}" != 1 ]; then
    step "build-asan/ (AddressSanitizer + UndefinedBehaviorSanitizer)"
    atrium_configure_tree "$root" build-asan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DATRIUM_SANITIZE=address
    timed_build build-asan -j"$build_jobs"
    # The other trees build while the ASan tree's tests run: those tests spend most of
    # their time waiting on sockets and timers, and the compilers, at the lowest priority,
    # take the CPU they leave idle. -Werror holds in every tree, so a warning still fails
    # the run (below, when the build is waited for).
    others_log=$root/build-asan/other-trees-build.log
    step "build/, build-tsan/, build-fuzz/ in the background (log: ${others_log#"$root"/})"
    (
        set -e
        renice -n 19 -p "$BASHPID" >/dev/null
        build_plain
        if tsan_enabled; then build_tsan; fi
        if fuzz_enabled "$@"; then build_fuzz; fi
    ) >"$others_log" 2>&1 &
    others_pid=$!
else
    step "build/ (RelWithDebInfo)"
    build_plain
    if fuzz_enabled "$@"; then
        step "build-fuzz/ (libFuzzer targets, clang)"
        build_fuzz
    fi
fi

step "PostgreSQL for the tests ($PG_DIR)"
pg_started=1
ATRIUM_PG_FAST=1 "$PG_SH" start "$PG_DIR" >&2
ATRIUM_TEST_PG_CONNINFO=$("$PG_SH" conninfo "$PG_DIR")
ATRIUM_TEST_PG_DIR=$PG_DIR
export ATRIUM_TEST_PG_CONNINFO ATRIUM_TEST_PG_DIR
# Databases left by a killed earlier run (the harness names them atrium_test_*).
leftovers=$("$PG_SH" psql "$PG_DIR" postgres -At -c \
    "SELECT datname FROM pg_database WHERE datname LIKE 'atrium\_test\_%'")
for db in $leftovers; do
    "$PG_SH" psql "$PG_DIR" postgres -q -c "DROP DATABASE IF EXISTS \"$db\" WITH (FORCE)"
done
[ -z "$leftovers" ] || atrium_say "dropped databases left by an earlier run: $(echo "$leftovers" | tr '\n' ' ')"

# Keep Python from writing __pycache__ into the source tree.
export PYTHONDONTWRITEBYTECODE=1

if [ "${ATRIUM_TEST_SKIP_ASAN:-0}" != 1 ]; then
    step "ctest in build-asan/"
    run_ctest build-asan "build-asan (ASan+UBSan)" \
        ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 \
        UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 -- -LE 'plain|deploy' "$@"
else
    summary+=("$(printf '%-28s SKIPPED (ATRIUM_TEST_SKIP_ASAN=1)' "build-asan (ASan+UBSan)")")
fi

if [ -n "$others_pid" ]; then
    step "waiting for the background builds"
    if ! wait "$others_pid"; then
        others_pid=
        tail -n 60 "$others_log"
        atrium_say "building build/, build-tsan/ or build-fuzz/ failed (whole log: $others_log)"
        failed=1
        summary+=("$(printf '%-28s FAILED (see %s)' "build/, build-tsan/, build-fuzz/" "$others_log")")
        exit 1
    fi
    others_pid=
fi

# The product's own build runs the unit tests again (with the sanitizer tree skipped,
# every test but the latency-bound ones) while the fuzzers run: those tests mostly wait on
# timers, the fuzzers keep the CPUs busy. Then the tests labelled "plain" (latency bounds
# a sanitizer's slowdown, or a fuzzer beside them, would distort) run alone.
if [ "${ATRIUM_TEST_SKIP_ASAN:-0}" != 1 ]; then
    unit_args=(-L unit "$@")
else
    unit_args=(-LE 'plain|deploy' "$@")
fi
fuzz_log=build-fuzz/Testing/atrium-run.log
if fuzz_enabled "$@"; then
    step "ctest in build/ (-L unit), beside ctest -L fuzz in build-fuzz/ (${ATRIUM_FUZZ_SECONDS:-4} s per target)"
    fuzz_started=$(date +%s)
    rm -f "$fuzz_log.rc"
    start_ctest build-fuzz "$fuzz_log" -- -L fuzz >/dev/null &
    fuzz_pid=$!
else
    step "ctest in build/ (-L unit)"
fi
run_ctest build "build (RelWithDebInfo)" unit -- "${unit_args[@]}"
if [ -n "$fuzz_pid" ]; then
    wait "$fuzz_pid" || true
    fuzz_pid=
    printf '\n--- build-fuzz (libFuzzer), run beside the unit tests above ---\n'
    cat "$fuzz_log"
    record_ctest build-fuzz "build-fuzz (libFuzzer)" "$fuzz_log" $(($(date +%s) - fuzz_started))
    # Executions and coverage each target reached (libFuzzer's last status line).
    for log in build-fuzz/tests/fuzz/work/*/last-run.log; do
        [ -f "$log" ] || continue
        t=$(basename "$(dirname "$log")")
        line=$(grep -E '^#[0-9]+' "$log" | tail -n 1 | awk '{print $1, $3, $4, $5, $6, $7, $8}')
        summary+=("$(printf '    fuzz %-14s %s' "$t" "$line")")
    done
else
    summary+=("$(printf '%-28s SKIPPED (ATRIUM_TEST_SKIP_FUZZ=1 or a ctest filter)' "build-fuzz (libFuzzer)")")
fi
step "ctest -L plain in build/ (latency bounds, nothing beside them)"
run_ctest build "build, -L plain" plain -- -L plain "$@"

if tsan_enabled; then
    step "ctest -L tsan in build-tsan/"
    run_ctest build-tsan "build-tsan (TSan subset)" \
        "TSAN_OPTIONS=halt_on_error=1:abort_on_error=1:second_deadlock_stack=1:ignore_noninstrumented_modules=1:suppressions=$root/tests/tsan.supp" \
        -- -L tsan "$@"
else
    summary+=("$(printf '%-28s SKIPPED (ATRIUM_TEST_SKIP_*SAN=1)' "build-tsan (TSan subset)")")
fi
# The deploy test (label deploy: the container images built and the Compose files run
# with podman, minutes even with its caches warm, half an hour on a new machine:
# docs/adr/0033-deploy-tested-with-podman.md) runs when asked, last and alone.
if [ "${ATRIUM_TEST_DEPLOY:-0}" = 1 ]; then
    step "ctest -L deploy in build/ (podman, docker-compose)"
    run_ctest build "deploy (podman)" -- -L deploy "$@"
else
    summary+=("$(printf '%-28s SKIPPED (run it with ATRIUM_TEST_DEPLOY=1)' "deploy (podman)")")
fi
stage="done"
