#!/usr/bin/env bash
# shellcheck disable=SC2086 # $B and $T are lists of flags, split on purpose
# Issue 44's benchmark, part of `make bench` (BENCH_PART=tiered runs it alone): tiered
# storage's cost on this machine. One broker (--cores $TIER_CORES) with
# --remote-storage on a folder of the same disk (file://; an S3 store adds its network
# round trips, not measured here), and an acks=all producer of 100 B records at
# $TIER_RATE records/s over 8 partitions for $BENCH_SECONDS:
#   (t0) into a topic without remote storage,
#   (t1) into a topic with remote.storage.enable=true, 1 MiB segments and a local
#        window of 2 MiB per partition: closed segments are uploaded during the load;
# then, once (t1)'s uploads caught up, every record of each topic read from offset 0
# as fast as the consumer goes:
#   (t2) (t0)'s topic, from the local log,
#   (t3) (t1)'s topic, most of it from the store (chunked ranged reads, cached).
# Reports: $OUT/tier-t{0,1}-*-report.json (sluice-bench produce),
# $OUT/tier-t{2,3}-*-report.json (sluice-bench consume) and $OUT/tier-facts.json (what
# was remote when (t3) read); bench_summary.py puts (t1) beside (t0) and (t3) beside
# (t2). Every process it starts is stopped on any exit.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/bench-lib.sh
bench_bins
OUT=${OUT:-bench/results}
SECS=${BENCH_SECONDS:-10}
RATE=${TIER_RATE:-100000}
CORES=${TIER_CORES:-1}
mkdir -p "$OUT"
rm -f "$OUT"/tier-*.json

bench_pick_port BENCH_TIER_PORT 19600 0 552
P=$BENCH_TIER_PORT
DATA="$OUT/tier-data"
REMOTE="$(cd "$OUT" && pwd)/tier-remote"
rm -rf "$DATA" "$REMOTE"
tier_cleanup() { rm -rf "$DATA" "$REMOTE"; }
bench_on_cleanup tier_cleanup
bench_require_free_ports "the tiered benchmark's broker" "$P" $((P + 552))
bench_spawn "$SLUICE" serve --listen "127.0.0.1:$P" --data-dir "$DATA" --cores "$CORES" \
  --remote-storage "file://$REMOTE" --remote-log-manager-task-interval-ms 200 \
  --log-retention-check-interval-ms 500 >"$OUT/tier-broker.log" 2>&1
BROKER=$BENCH_PID
bench_wait_broker "$BROKER" "$OUT/tier-broker.log" 30 "$P" $((P + 552))

B="--bootstrap 127.0.0.1:$P --report-dir $OUT"
T="--topic-config remote.storage.enable=true --topic-config segment.bytes=1048576 --topic-config local.retention.bytes=2097152"
bench() { bench_run "$BENCH_BIN" "$@"; }
load() { # name topic [flags]
  bench produce $B --cpu-pid "$BROKER" --name "$1" --topic "$2" --partitions 8 --record-size 100 --acks -1 \
    --rate "$RATE" --linger-ms 1 --batch-bytes 32768 --duration "$SECS" "${@:3}"
}

echo "== (t0) acks=all 100 B at $RATE records/s, 8 partitions, no remote storage =="
load tier-t0-local bench-tier-local --topic-config segment.bytes=1048576
echo "== (t1) the same with remote.storage.enable=true (uploads during the load) =="
load tier-t1-remote bench-tier-remote $T

# Until the uploads caught up: the local files hold about the window per partition.
remote_bytes() { du -sb "$REMOTE" 2>/dev/null | cut -f1; }
local_bytes() { du -sb "$DATA"/bench-tier-remote-* 2>/dev/null | awk '{s += $1} END {print s + 0}'; }
deadline=$((SECONDS + 120))
while [ "$(local_bytes)" -gt $((8 * 5 * 1048576)) ] && [ $SECONDS -lt $deadline ]; do sleep 0.5; done
echo "remote: $(remote_bytes) bytes; local: $(local_bytes) bytes"
printf '{"remote_bytes": %s, "local_bytes": %s, "rate": %s, "seconds": %s}\n' \
  "$(remote_bytes)" "$(local_bytes)" "$RATE" "$SECS" >"$OUT/tier-facts.json"

echo "== (t2) read (t0)'s topic from offset 0: local =="
bench consume $B --name tier-t2-local --topic bench-tier-local --record-size 100
echo "== (t3) read (t1)'s topic from offset 0: mostly from the store =="
bench consume $B --name tier-t3-remote --topic bench-tier-remote --record-size 100
bench_stop "$BROKER"
