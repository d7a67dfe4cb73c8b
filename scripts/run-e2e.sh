#!/usr/bin/env bash
# End-to-end tier: real `sluice serve` processes, real Kafka clients (tests/e2e).
# The brokers are the binary `make unit` tested (profile `unit`; SLUICE_BIN overrides).
# Writes target/e2e-junit.xml (per-test times, for scripts/slowest-tests.py).
set -euo pipefail
cd "$(dirname "$0")/.."
if ! ls tests/e2e/test_*.py >/dev/null 2>&1; then
  echo "e2e: no test files under tests/e2e" >&2
  exit 1
fi
TARGET="${CARGO_TARGET_DIR:-$PWD/target}"
export SLUICE_BIN="${SLUICE_BIN:-$TARGET/unit/sluice}"
if [ ! -x "$SLUICE_BIN" ]; then
  echo "e2e: no broker binary at $SLUICE_BIN (cargo build --profile unit --bins)" >&2
  exit 1
fi
# Three pytest-xdist workers: most of a test's time is a broker, a client or a timeout
# waiting, so three share 2 cores well (10 min in one worker, 3.5 min in three). Each
# worker hands out ports from its own slice (conftest.free_port). E2E_WORKERS=0 runs
# in this process, one test at a time.
WORKERS="${E2E_WORKERS:-3}"
# pytest exits 5 when it collects no test: that fails here too (set -e).
python3 -m pytest -q tests/e2e -p no:cacheprovider -n "$WORKERS" --dist worksteal \
  --junitxml="$TARGET/e2e-junit.xml" "$@"
