#!/usr/bin/env bash
# `make bench`: every benchmark, each beside the machine's own ceiling measured in the
# same run. Results land in bench/results/ (git-ignored).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${SLUICE_BENCH_BIN:-./target/release/sluice-bench}
mkdir -p bench/results
echo "== storage: partition log append path vs raw O_DIRECT write and fdatasync =="
"$BIN" storage --seconds "${BENCH_SECONDS:-3}" --dir bench/results/storage-data --report-dir bench/results
