#!/usr/bin/env bash
# Fuzzes request decoding (fuzz/fuzz_targets/decode_request.rs) with cargo-fuzz.
# Not part of `make test`. Needs the nightly toolchain; installs cargo-fuzz if missing.
#   FUZZ_SECONDS  how long to run (default 180)
set -euo pipefail
cd "$(dirname "$0")/.."
FUZZ_SECONDS="${FUZZ_SECONDS:-180}"
if ! rustup toolchain list | grep -q '^nightly'; then
  rustup toolchain install nightly --profile minimal
fi
if ! cargo fuzz --help >/dev/null 2>&1; then
  cargo install cargo-fuzz --locked
fi
mkdir -p fuzz/corpus/decode_request
python3 scripts/fuzz-seeds.py fuzz/corpus/decode_request
# -rss_limit_mb/-malloc_limit_mb: any single allocation over 1 GiB through malloc is a bug
# (huge reservations must go through sluice::alloc's mappings instead).
cargo +nightly fuzz run decode_request fuzz/corpus/decode_request -- \
  -max_total_time="$FUZZ_SECONDS" -max_len=65536 -rss_limit_mb=2048 -malloc_limit_mb=1024 -timeout=10
echo "fuzz: decode_request ran ${FUZZ_SECONDS}s clean"
