#!/usr/bin/env bash
# The fuzz targets (issue 21): builds fuzz/ (its own workspace; cargo-fuzz on
# nightly: `rustup toolchain install nightly`, `cargo install cargo-fuzz
# --locked`) and runs every target, one after the other, until it has run
# FUZZ_RUNS inputs (default 10 000 000) or for SECONDS (default 1800),
# whichever comes first — the issue's "10 million executions or 30 minutes" —
# in one process with one worker, under `nice -n 19`. Each target starts
# from its hand-written seeds (corpus/<target>/seed-*) and the coverage set
# of the last full run (coverage-corpus.tar.gz: libFuzzer's set-cover merge
# of the corpus that run grew, unpacked into corpus/ once).
# Prints each target's executions and crashes. The corpus grows in
# fuzz/corpus/<target> (only the seed-* files are committed), crashes land in
# fuzz/artifacts/<target> (not committed; see docs/robustness.md for what
# to do with one).
#   scripts/fuzz.sh [seconds] [target...]
# FUZZ_SANITIZER=address runs with AddressSanitizer (default: none — rozd
# is #![forbid(unsafe_code)]; the targets look for panics, overflows, stack
# overflows, hangs and runaway memory, and run several times faster without).
set -uo pipefail
cd "$(dirname "$0")/../fuzz"
seconds="${1:-1800}"
runs="${FUZZ_RUNS:-10000000}"
shift || true
sanitizer="${FUZZ_SANITIZER:-none}"
if [ "$#" -gt 0 ]; then
    targets=("$@")
else
    mapfile -t targets < <(sed -n 's/^name = "\(.*\)"$/\1/p' Cargo.toml | grep -v '^rozd-fuzz$')
fi
# FUZZ_SKIP_BUILD=1 runs the binaries already in fuzz/target as they are.
if [ -z "${FUZZ_SKIP_BUILD:-}" ]; then
    nice -n 19 cargo +nightly fuzz build --sanitizer "$sanitizer" || exit 1
fi
bin="target/$(rustc +nightly -vV | sed -n 's/^host: //p')/release"
# The committed coverage set, unpacked beside the seeds (never over a file
# a run already wrote).
if [ -f coverage-corpus.tar.gz ]; then
    mkdir -p corpus
    tar -xzf coverage-corpus.tar.gz -C corpus --skip-old-files || exit 1
fi
mkdir -p logs
printf '%-20s %14s %10s %8s %s\n' target executions exec/s crashes corpus
status=0
for target in "${targets[@]}"; do
    mkdir -p "corpus/$target" "artifacts/$target"
    before=$(find "artifacts/$target" -type f | wc -l)
    log="logs/$target.log"
    # The binary cargo fuzz built (as `cargo fuzz run` would run it).
    # -timeout: one input taking 10 s is a hang; -rss_limit_mb: runaway memory.
    nice -n 19 "$bin/$target" "corpus/$target" -artifact_prefix="artifacts/$target/" \
        -max_total_time="$seconds" -runs="$runs" -timeout=10 -rss_limit_mb=2048 \
        -print_final_stats=1 >"$log" 2>&1
    code=$?
    execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' | tail -1)
    rate=$(grep -o 'stat::average_exec_per_sec: *[0-9]*' "$log" | grep -o '[0-9]*$' | tail -1)
    after=$(find "artifacts/$target" -type f | wc -l)
    corpus=$(find "corpus/$target" -type f | wc -l)
    printf '%-20s %14s %10s %8s %s\n' "$target" "${execs:-?}" "${rate:-?}" "$((after - before))" "$corpus"
    if [ "$code" -ne 0 ] || [ "$after" -gt "$before" ]; then
        echo "  $target: exit $code; see fuzz/$log and fuzz/artifacts/$target/" >&2
        status=1
    fi
done
exit "$status"
