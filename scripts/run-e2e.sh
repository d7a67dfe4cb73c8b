#!/usr/bin/env bash
# End-to-end tier: real `sluice serve` processes, real Kafka clients (tests/e2e).
set -euo pipefail
cd "$(dirname "$0")/.."
if ! ls tests/e2e/test_*.py >/dev/null 2>&1; then
  echo "e2e: no end-to-end tests yet"
  exit 0
fi
SLUICE_BIN="${SLUICE_BIN:-${CARGO_TARGET_DIR:-$PWD/target}/release/sluice}" python3 -m pytest -q tests/e2e "$@"
