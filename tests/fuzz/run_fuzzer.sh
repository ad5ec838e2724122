#!/usr/bin/env bash
# Run one libFuzzer target for a bounded time from its seed corpus, then print what it
# reached. Usage: run_fuzzer.sh TARGET SEED_DIR WORK_DIR
#
# The seeds (in the repository) are copied into WORK_DIR/corpus, where libFuzzer adds what
# it finds, so a second run goes on from there; the seeds themselves are never written.
# ATRIUM_FUZZ_SECONDS (default 4) bounds the run. A crash, leak or sanitizer report fails
# the test, leaving the input as WORK_DIR/crash-* (named in the output).
set -euo pipefail
target=$1 seeds=$2 work=$3
seconds=${ATRIUM_FUZZ_SECONDS:-4}
mkdir -p "$work/corpus"
cp -n "$seeds"/* "$work/corpus/" 2>/dev/null || true
cd "$work"
log=$work/last-run.log
set +e
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    "$target" -max_total_time="$seconds" -print_final_stats=1 -timeout=10 -rss_limit_mb=2048 \
    -max_len=65536 "$work/corpus" >"$log" 2>&1
rc=$?
set -e
# The last status line (#N DONE cov: C ft: F corp: ...) and the final stats.
grep -E '^#[0-9]+' "$log" | tail -n 1 || true
grep -E '^stat::(number_of_executed_units|peak_rss_mb)' "$log" || true
if [ "$rc" -ne 0 ]; then
    tail -n 60 "$log"
    echo "fuzzer $(basename "$target") failed (exit $rc); inputs: $(ls "$work"/crash-* "$work"/leak-* "$work"/timeout-* 2>/dev/null | tr '\n' ' ')"
    exit 1
fi
