#!/usr/bin/env bash
# The soak (issue 21): the release rozd binary serving N sessions (default
# 1000) for SECONDS (default 600), each a turn a second with a client tool
# call (every fourth turn a host tool instead); RSS, open fds, threads and
# the store's size sampled every 10 s from /proc, printed as CSV, then what
# grew after warm-up; with ROUNDS > 1 the same daemon serves that many
# rounds of new sessions, sampled for 30 s after each round closed. See
# benches/harness/soak.rs and docs/robustness.md.
#   scripts/soak.sh [seconds] [sessions] [rounds]
set -euo pipefail
cd "$(dirname "$0")/.."
exec cargo bench --locked --bench rozd -- --soak "${1:-600}" --sessions "${2:-1000}" --rounds "${3:-1}"
