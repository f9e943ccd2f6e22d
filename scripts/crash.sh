#!/usr/bin/env bash
# The long crash-consistency run (issue 21): the release rozd binary killed
# with SIGKILL at random moments, N times (default 100), checked after every
# restart (see tests/integration/crash.rs). The test suite runs 10 kills of
# the debug binary. ROZD_CRASH_SEED=<n> replays a run.
#   scripts/crash.sh [kills]
set -euo pipefail
cd "$(dirname "$0")/.."
export ROZD_CRASH_KILLS="${1:-100}"
exec cargo test --locked --release --test integration crash::kill_9 -- --nocapture --test-threads 1
