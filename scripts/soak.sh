#!/usr/bin/env bash
# The soak (issue 21): the release rozd binary serving N sessions (default
# 1000) for SECONDS (default 600), each a turn a second with a client tool
# call (every fourth turn a host tool instead); RSS, open fds, threads and
# the store's size sampled every 10 s from /proc, printed as CSV, then what
# grew after warm-up. See benches/harness/soak.rs and docs/robustness.md.
#   scripts/soak.sh [seconds] [sessions]
set -euo pipefail
cd "$(dirname "$0")/.."
exec cargo bench --locked --bench rozd -- --soak "${1:-600}" --sessions "${2:-1000}"
