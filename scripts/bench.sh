#!/usr/bin/env bash
# `make bench`: the canonical scenarios against a local broker, each beside the
# machine's own ceiling measured in the same run. Results land in bench/results/
# (git-ignored); the summary table is bench/results/summary.md, and with
# UPDATE_DOCS=1 it also replaces the figures in docs/architecture.md.
set -euo pipefail
cd "$(dirname "$0")/.."
SLUICE=${SLUICE_BIN:-./target/release/sluice}
BENCH_BIN=${SLUICE_BENCH_BIN:-./target/release/sluice-bench}
OUT=bench/results
SECS=${BENCH_SECONDS:-10}
PORT=${BENCH_PORT:-19392}
CORES=${BROKER_CORES:-1}
RATE=${BENCH_RATE:-1000000}
# The machine is shared: run the broker and the load generator at a raised CPU
# priority when allowed, so that unrelated jobs disturb the latency tail less.
NICE=()
if [ "$(id -u)" = 0 ] && [ "${BENCH_NICE:-1}" = 1 ]; then NICE=(nice -n -10); fi
mkdir -p "$OUT"
rm -f "$OUT"/*.json "$OUT"/*.hgrm "$OUT"/*.svg

echo "== machine ceilings =="
"$BENCH_BIN" ceiling --seconds 3 --dir "$OUT/ceiling-data" --report-dir "$OUT"

echo "== storage: partition log append path vs raw O_DIRECT write and fdatasync =="
"$BENCH_BIN" storage --seconds "${STORAGE_SECONDS:-3}" --dir "$OUT/storage-data" --report-dir "$OUT"

bench() { "${NICE[@]}" "$BENCH_BIN" "$@"; }

DATA="$OUT/broker-data"
rm -rf "$DATA"
"${NICE[@]}" "$SLUICE" serve --listen "127.0.0.1:$PORT" --data-dir "$DATA" --cores "$CORES" >"$OUT/broker.log" 2>&1 &
BROKER=$!
trap 'kill -TERM $BROKER 2>/dev/null || true; wait $BROKER 2>/dev/null || true' EXIT
deadline=$((SECONDS + 30))
until (exec 3<>/dev/tcp/127.0.0.1/$PORT) 2>/dev/null; do
  [ $SECONDS -lt $deadline ] || { echo "broker did not start"; cat "$OUT/broker.log"; exit 1; }
  sleep 0.2
done
B="--bootstrap 127.0.0.1:$PORT --report-dir $OUT"

echo "== (a) 100-byte records, acks=1, 8 partitions, maximum throughput =="
bench produce $B --name a-max-throughput --topic bench-a --partitions 8 --record-size 100 --acks 1 --duration "$SECS"

echo "== (b) 100-byte records, acks=1, 8 partitions, fixed $RATE records/s (open loop) =="
bench produce $B --name b-fixed-rate --topic bench-b --partitions 8 --record-size 100 --acks 1 --rate "$RATE" --linger-ms 1 --batch-bytes 32768 --duration "$SECS"

echo "== (c) 1 KiB records, acks=all =="
bench produce $B --name c-1k-acks-all --topic bench-c --partitions 8 --record-size 1024 --acks -1 --duration "$SECS"

echo "== (d) consume throughput (topic of scenario a) =="
bench consume $B --name d-consume --topic bench-a --record-size 100

echo "== e2e: 100-byte records at 100,000 records/s, produce and consume at once =="
bench e2e $B --name e2e --topic bench-e2e --partitions 8 --record-size 100 --acks -1 --rate 100000 --linger-ms 1 --duration "$SECS"

echo "== consumer groups: 1,000 lightweight members join one group over 1,000 partitions =="
bench group --bootstrap "127.0.0.1:$PORT" --report-dir "$OUT" --members 1000 --partitions 1000

if [ "${CROSS_CHECK:-1}" = 1 ] && python3 -c 'import confluent_kafka' 2>/dev/null; then
  echo "== cross-check: scenario (a) driven by librdkafka (confluent-kafka) =="
  python3 scripts/bench_librdkafka.py --bootstrap "127.0.0.1:$PORT" --topic bench-a-rdkafka --seconds "$SECS" --out "$OUT/librdkafka-report.json"
fi

kill -TERM $BROKER; wait $BROKER 2>/dev/null || true; trap - EXIT
UPDATE_DOCS=${UPDATE_DOCS:-1} python3 scripts/bench_summary.py "$OUT" "$CORES"
